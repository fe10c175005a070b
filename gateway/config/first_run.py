"""The first-run profile: every front-end on its standard port (``gatewayd --first-run``).

A layer between the embedded defaults and the configuration file (see
:func:`gateway.config.loader.load_config`): MQTT 1883 (the default already), MQTT over
WebSocket 8083, MQTT-SN 1884/udp, CoAP 5683/udp, LwM2M 5783/udp, and the API and the
dashboard on 18083 (loopback, the default). A port that is taken is reported on one line
and skipped (``node.skip_busy_ports``); the file and the environment still override
everything here, so ``enable = false`` turns one front-end off again.
"""

from __future__ import annotations

from typing import Any

FIRST_RUN: dict[str, Any] = {
    "node": {"skip_busy_ports": True},
    "listeners": {"tcp": {"default": {}}, "ws": {"default": {}}},
    "gateway": {"mqttsn": {}, "coap": {}, "lwm2m": {}},
}
"""The layer itself: the sections whose presence turns a front-end on."""

STANDARD_PORTS: dict[str, str] = {
    "tcp:default": "MQTT 1883/tcp",
    "ws:default": "MQTT over WebSocket 8083/tcp",
    "mqttsn:udp:default": "MQTT-SN 1884/udp",
    "coap:udp:default": "CoAP 5683/udp",
    "lwm2m:udp:default": "LwM2M 5783/udp",
    "api": "API and dashboard 18083/tcp",
}
"""What the first run opens (for the documentation and its test)."""
