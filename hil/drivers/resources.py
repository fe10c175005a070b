"""The rig's own labgrid resources (attrs classes registered with ``reg_resource``).

- ``LocalGateway``: gatewayd on this host from a configuration file, in a network
  namespace and on a size-limited tmpfs the rig makes (both need root; without root,
  ``netns: false`` and ``disk_size: ""`` run it on loopback with network and disk faults
  unsupported).
- ``GatewayImage``: the appliance image booted by ``image/qemu``.
- ``GatewayService``: the ports and credentials of a gateway on a real board.
"""

from __future__ import annotations

from typing import Any

import attr
from labgrid.factory import target_factory
from labgrid.resource.common import Resource

_str = attr.validators.instance_of(str)
_opt_str = attr.validators.optional(attr.validators.instance_of(str))


@target_factory.reg_resource
@attr.s(eq=False)
class LocalGateway(Resource):
    # the TOML configuration file, relative to the environment file
    config: str | None = attr.ib(default=None, validator=_opt_str)
    command: str = attr.ib(default="", validator=_str)  # default: this Python's gatewayd
    netns: bool = attr.ib(default=True, validator=attr.validators.instance_of(bool))
    disk_size: str = attr.ib(default="256M", validator=_str)  # tmpfs for data_dir; "" = none
    restart_delay: float = attr.ib(default=1.0, validator=attr.validators.instance_of(float))
    environment: dict[str, Any] = attr.ib(factory=dict, validator=attr.validators.instance_of(dict))


@target_factory.reg_resource
@attr.s(eq=False)
class GatewayImage(Resource):
    image: str = attr.ib(validator=_str)  # edge-gateway-V-amd64.img (copied per run)
    script: str = attr.ib(default="image/qemu", validator=_str)
    boot_timeout: float = attr.ib(default=600.0, validator=attr.validators.instance_of(float))
    # the [api] token provisioned into the image (image/provision --config); without it
    # the rig reaches /status only, and rss_max has no samples
    api_token: str | None = attr.ib(default=None, validator=_opt_str)


@target_factory.reg_resource
@attr.s(eq=False)
class GatewayService(Resource):
    address: str = attr.ib(validator=_str)
    mqtt_port: int = attr.ib(default=1883, validator=attr.validators.instance_of(int))
    mqtts_port: int = attr.ib(default=8883, validator=attr.validators.instance_of(int))
    ws_port: int = attr.ib(default=8083, validator=attr.validators.instance_of(int))
    wss_port: int = attr.ib(default=8084, validator=attr.validators.instance_of(int))
    mqttsn_port: int = attr.ib(default=1884, validator=attr.validators.instance_of(int))
    coap_port: int = attr.ib(default=5683, validator=attr.validators.instance_of(int))
    lwm2m_port: int = attr.ib(default=5783, validator=attr.validators.instance_of(int))
    api_port: int = attr.ib(default=18083, validator=attr.validators.instance_of(int))
    api_token: str | None = attr.ib(default=None, validator=_opt_str)
    ca_file: str | None = attr.ib(default=None, validator=_opt_str)
    rig_address: str = attr.ib(default="", validator=_str)  # our address as the board sees it
