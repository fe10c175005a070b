"""Configuration of protection: rates, packet_timeout, slow readers, [flapping_detect]."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.config.schema import parse_byte_rate, parse_rate
from gateway.frontends.mqtt import mqtt_settings


@pytest.mark.parametrize(
    ("text", "per_second"),
    [
        (100, 100.0),
        (2.5, 2.5),
        ("100/s", 100.0),
        ("600/m", 10.0),
        ("50/10s", 5.0),
        ("1/500ms", 2.0),
        ("3600/h", 1.0),
        ("infinity", 0.0),
        ("0", 0.0),
    ],
)
def test_parse_rate(text: object, per_second: float) -> None:
    assert parse_rate(text) == pytest.approx(per_second)


@pytest.mark.parametrize(
    ("text", "per_second"),
    [("1MB/s", 1 << 20), ("512KB/s", 512 << 10), ("10MB/m", (10 << 20) / 60), (1000, 1000.0)],
)
def test_parse_byte_rate(text: object, per_second: float) -> None:
    assert parse_byte_rate(text) == pytest.approx(per_second)


@pytest.mark.parametrize("bad", ["fast", "1MB/s", "10/", "/s", "1/0s", True, "-5/s"])
def test_bad_rates(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_rate(bad)


def test_defaults() -> None:
    c = GatewayConfig()
    assert (c.mqtt.messages_rate, c.mqtt.bytes_rate, c.mqtt.packet_timeout) == (0, 0, 60)
    tcp = c.listeners.tcp["default"]
    assert (tcp.max_conn_rate, tcp.messages_rate, tcp.bytes_rate) == (0, None, None)
    assert (tcp.send_timeout, tcp.max_send_buffer) == (15.0, 64 << 20)
    fd = c.flapping_detect
    assert (fd.enable, fd.max_count, fd.window_time, fd.ban_time) == (False, 15, 60, 300)


def test_environment_and_listener_overrides() -> None:
    env = {
        "GATEWAY_MQTT__MESSAGES_RATE": "100/s",
        "GATEWAY_MQTT__BYTES_RATE": "1MB/s",
        "GATEWAY_MQTT__PACKET_TIMEOUT": "30s",
        "GATEWAY_LISTENERS__TCP__DEFAULT__MAX_CONN_RATE": "1000/m",
        "GATEWAY_LISTENERS__TCP__SLOW__BIND": "127.0.0.1:0",
        "GATEWAY_LISTENERS__TCP__SLOW__MESSAGES_RATE": "5/s",
        "GATEWAY_LISTENERS__TCP__SLOW__BYTES_RATE": "infinity",
        "GATEWAY_FLAPPING_DETECT__ENABLE": "true",
        "GATEWAY_FLAPPING_DETECT__WINDOW_TIME": "2m",
    }
    c = load_config(None, environ=env)
    assert c.listeners.tcp["default"].max_conn_rate == pytest.approx(1000 / 60)
    assert c.flapping_detect.enable and c.flapping_detect.window_time == 120
    default = mqtt_settings(c, "tcp:default", "")
    assert (default.messages_rate, default.bytes_rate, default.packet_timeout) == (
        100,
        1 << 20,
        30,
    )
    slow = mqtt_settings(c, "tcp:slow", "")
    assert (slow.messages_rate, slow.bytes_rate) == (5, 0)  # "infinity" lifts [mqtt]'s


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"GATEWAY_MQTT__MESSAGES_RATE": "lots"}, "mqtt.messages_rate"),
        ({"GATEWAY_LISTENERS__TCP__DEFAULT__MAX_CONN_RATE": "1MB/s"}, "max_conn_rate"),
        ({"GATEWAY_FLAPPING_DETECT__MAX_COUNT": "1"}, "flapping_detect.max_count"),
        ({"GATEWAY_FLAPPING_DETECT__BAN_TIME": "0"}, "flapping_detect.ban_time"),
        ({"GATEWAY_FLAPPING_DETECT__BANTIME": "1m"}, "flapping_detect.bantime"),
    ],
)
def test_errors_name_the_key(env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, environ=env)
    assert key in info.value.message
