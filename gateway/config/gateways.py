"""The datagram front-ends' sections: ``[gateway.mqttsn]``, ``[gateway.coap]``,
``[gateway.lwm2m]`` and their UDP and DTLS listeners."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    field_validator,
    model_validator,
)

from gateway.config.listeners import (
    KeyPassword,
    OcspCheck,
    PeerCertField,
    TlsVerify,
    _no_peer_keys,
)
from gateway.config.values import (
    Bind,
    Duration,
    Network,
    _lower,
    _Section,
    _split_commas,
    parse_bind,
)

# ------------------------------------------------------------------ protocol gateways


def _check_topic_name(value: str) -> str:
    if not value or "+" in value or "#" in value:
        raise ValueError("expected a topic name without wildcards")
    return value


class MqttSnPredefined(_Section):
    """One predefined topic: the same id means the same topic on both sides."""

    id: int = Field(ge=1, le=0xFFFE)
    topic: Annotated[str, AfterValidator(_check_topic_name)]


class UdpListener(_Section):
    enable: bool = True
    bind: Bind = "0.0.0.0:1884"
    max_connections: int = Field(default=1_024_000, ge=1)  # peers (addresses) at once
    allow: Annotated[list[Network], BeforeValidator(_split_commas)] = Field(default_factory=list)
    deny: Annotated[list[Network], BeforeValidator(_split_commas)] = Field(default_factory=list)

    @property
    def host(self) -> str:
        return parse_bind(self.bind)[0]

    @property
    def port(self) -> int:
        return parse_bind(self.bind)[1]


def _default_udp_listeners() -> dict[str, UdpListener]:
    return {"default": UdpListener()}


class MqttSnListeners(_Section):
    udp: dict[str, UdpListener] = Field(default_factory=_default_udp_listeners)


class MqttSnConfig(_Section):
    """``[gateway.mqttsn]`` (EMQX's shape): MQTT-SN 1.2 over UDP. The table's presence
    enables the gateway (``enable = false`` keeps it configured but off).

    ``broadcast`` sends ADVERTISE to ``broadcast_address``:``broadcast_port`` every
    ``advertise_interval``; ``enable_qos3`` accepts QoS -1 publishes without a connection;
    ``retry_interval``/``max_retries`` govern retransmission of unacknowledged messages;
    ``max_sleep_buffer`` bounds the QoS 0 messages kept for a sleeping client.
    """

    enable: bool = True
    gateway_id: int = Field(default=1, ge=0, le=255)
    broadcast: bool = False
    broadcast_address: str = "255.255.255.255"
    broadcast_port: int = Field(default=0, ge=0, le=65535)  # 0: the listener's port
    advertise_interval: Annotated[Duration, Field(gt=0, le=65535)] = 900.0
    enable_qos3: bool = True
    mountpoint: str = ""
    predefined: list[MqttSnPredefined] = Field(default_factory=list)
    idle_timeout: Annotated[Duration, Field(gt=0)] = 30.0
    retry_interval: Annotated[Duration, Field(gt=0)] = 10.0
    max_retries: int = Field(default=4, ge=0)
    max_sleep_buffer: int = Field(default=1000, ge=0)
    listeners: MqttSnListeners = Field(default_factory=MqttSnListeners)

    @field_validator("predefined")
    @classmethod
    def _unique_ids(cls, value: list[MqttSnPredefined]) -> list[MqttSnPredefined]:
        seen: set[int] = set()
        for p in value:
            if p.id in seen:
                raise ValueError(f"predefined topic id {p.id} given twice")
            seen.add(p.id)
        return value


def _default_coap_udp() -> dict[str, UdpListener]:
    return {"default": UdpListener(bind="0.0.0.0:5683")}


class DtlsListener(UdpListener, KeyPassword):
    """A UDP listener with DTLS 1.2: pre-shared keys (``psk_file``: ``identity:secret``
    lines, EMQX's PSK file format), certificates (``certfile``/``keyfile``, and
    ``cacertfile`` with ``verify = "verify_peer"`` for client certificates; EMQX's key
    names and meanings, as on ``[listeners.ssl.<name>]``; an encrypted ``keyfile`` with
    ``password`` or ``password_file``), or both on one listener.

    Identity: ``peer_cert_as_clientid``/``peer_cert_as_username`` (``cn``, ``dn``, ``san``)
    take the client id/username from a verified client certificate;
    ``psk_identity_as_clientid``/``psk_identity_as_username`` from the PSK identity. The
    peer may then name no other (CoAP: a different ``clientid``/``username`` in the query
    is refused 4.03; LwM2M: the client id is the endpoint name, so the registration's
    ``ep`` must equal it). Files are checked and loaded by the loader, relative paths
    resolved against the configuration file's directory.
    """

    bind: Bind = "0.0.0.0:5684"
    psk_file: Path | None = None
    certfile: Path | None = None
    keyfile: Path | None = None
    cacertfile: Path | None = None
    verify: Annotated[TlsVerify, BeforeValidator(_lower)] = "verify_none"
    fail_if_no_peer_cert: bool = False
    peer_cert_as_clientid: Annotated[PeerCertField, BeforeValidator(_lower)] = "none"
    peer_cert_as_username: Annotated[PeerCertField, BeforeValidator(_lower)] = "none"
    psk_identity_as_clientid: bool = False
    psk_identity_as_username: bool = False
    handshake_timeout: Annotated[Duration, Field(gt=0)] = 30.0
    # CRLs of cacertfile's CA: a revoked client certificate is refused right after the
    # handshake; re-read on change and on SIGHUP (docs/security.md "Revocation");
    # enable_crl_check and ocsp_check as on [listeners.ssl.<name>]
    crlfile: Annotated[list[Path], BeforeValidator(_split_commas)] = Field(default_factory=list)
    enable_crl_check: bool = False
    ocsp_check: OcspCheck = Field(default_factory=OcspCheck)

    @model_validator(mode="after")
    def _consistent_dtls(self) -> DtlsListener:
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("certfile and keyfile go together")
        if (self.password is not None or self.password_file is not None) and not self.keyfile:
            raise ValueError("password/password_file open an encrypted keyfile: set keyfile")
        if self.enable and self.psk_file is None and self.certfile is None:
            raise ValueError("a DTLS listener needs psk_file, or certfile and keyfile")
        if self.verify == "verify_peer":
            if self.certfile is None:
                raise ValueError('verify = "verify_peer" needs certfile and keyfile')
            if self.cacertfile is None:
                raise ValueError('verify = "verify_peer" needs cacertfile (the clients\' CA)')
        else:
            _no_peer_keys(self)
            if self.crlfile or self.enable_crl_check or self.ocsp_check.enable:
                raise ValueError('revocation checks (crlfile, enable_crl_check, ocsp_check) '
                                 'need verify = "verify_peer"')
        if self.psk_file is None:
            for key in ("psk_identity_as_clientid", "psk_identity_as_username"):
                if getattr(self, key):
                    raise ValueError(f"{key} needs psk_file")
        return self


class CoapListeners(_Section):
    udp: dict[str, UdpListener] = Field(default_factory=_default_coap_udp)
    dtls: dict[str, DtlsListener] = Field(default_factory=dict)


class CoapConfig(_Section):
    """``[gateway.coap]`` (EMQX's shape): CoAP over UDP with the ``/ps`` publish/subscribe
    mapping and ``/mqtt/connection``. ``connection_required`` refuses requests without a
    connection token; ``heartbeat`` is how often a connected client must PUT; a
    connectionless peer with nothing observed is forgotten after ``idle_timeout``."""

    enable: bool = True
    mountpoint: str = ""
    connection_required: bool = False
    heartbeat: Annotated[Duration, Field(gt=0)] = 30.0
    idle_timeout: Annotated[Duration, Field(gt=0)] = 30.0
    ack_timeout: Annotated[Duration, Field(gt=0)] = 2.0
    max_retransmit: int = Field(default=4, ge=0, le=10)
    block_size: Literal[16, 32, 64, 128, 256, 512, 1024] = 1024
    max_body: int = Field(default=4 * 1024 * 1024, ge=1)
    listeners: CoapListeners = Field(default_factory=CoapListeners)


def _default_lwm2m_udp() -> dict[str, UdpListener]:
    return {"default": UdpListener(bind="0.0.0.0:5783")}


class Lwm2mListeners(_Section):
    udp: dict[str, UdpListener] = Field(default_factory=_default_lwm2m_udp)
    dtls: dict[str, DtlsListener] = Field(default_factory=dict)


class Lwm2mBootstrapWrite(_Section):
    """One Bootstrap-Write: the resources of object instance ``path`` (``"/0/1"``)."""

    path: Annotated[str, Field(pattern=r"^/\d+/\d+$")]
    content: list[dict[str, Any]]

    @field_validator("content")
    @classmethod
    def _entries(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for e in v:
            if "path" not in e or "value" not in e:
                raise ValueError("each entry needs a path and a value")
        return v


class Lwm2mBootstrapPlan(_Section):
    """What one endpoint (or every endpoint: ``"*"``) is told when it bootstraps."""

    delete: bool = True
    writes: list[Lwm2mBootstrapWrite] = Field(default_factory=list)


class Lwm2mBootstrap(_Section):
    """``[gateway.lwm2m.bootstrap]``: a bootstrap server on the LwM2M listeners (``POST
    /bs?ep=``); off unless ``enable``; endpoints without a plan (and no ``"*"``) get 4.00."""

    enable: bool = False
    endpoints: dict[str, Lwm2mBootstrapPlan] = Field(default_factory=dict)


class Lwm2mConfig(_Section):
    """``[gateway.lwm2m]`` (EMQX's shape): LwM2M 1.0/1.1 over CoAP. ``mountpoint`` may use
    ``{ep}`` (the endpoint name); ``xml_dir`` adds object definitions (OMA XML) to the
    shipped core objects 0-7; ``qmode_time_window`` is how long a queue-mode device
    listens after each message it sends; ``max_queue`` bounds the commands waiting for
    one device (the oldest is dropped)."""

    enable: bool = True
    mountpoint: str = "lwm2m/{ep}/"
    lifetime_min: Annotated[Duration, Field(gt=0)] = 1.0
    lifetime_max: Annotated[Duration, Field(gt=0)] = 86400.0
    qmode_time_window: Annotated[Duration, Field(gt=0)] = 22.0
    response_timeout: Annotated[Duration, Field(gt=0)] = 60.0
    idle_timeout: Annotated[Duration, Field(gt=0)] = 30.0
    publish_qos: int = Field(default=0, ge=0, le=2)
    max_queue: int = Field(default=1000, ge=1)
    xml_dir: str = ""
    bootstrap: Lwm2mBootstrap = Field(default_factory=Lwm2mBootstrap)
    listeners: Lwm2mListeners = Field(default_factory=Lwm2mListeners)


class GatewaysConfig(_Section):
    """``[gateway.<protocol>]``: the non-MQTT front-ends; absent means off."""

    mqttsn: MqttSnConfig | None = None
    coap: CoapConfig | None = None
    lwm2m: Lwm2mConfig | None = None


