"""Configuration of the WebSocket listeners and the MQTT-SN gateway."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return path


def error_of(path: Path | None = None, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, env or {})
    return info.value.message


def test_no_websocket_listener_and_no_mqttsn_by_default() -> None:
    config = load_config(None, {})
    assert config.listeners.ws == {} and config.listeners.wss == {}
    assert config.gateway.mqttsn is None


def test_ws_listener_from_the_environment() -> None:
    config = load_config(
        None,
        {
            "GATEWAY_LISTENERS__WS__DEFAULT__ENABLE": "true",
            "GATEWAY_LISTENERS__WS__DEFAULT__WEBSOCKET__CHECK_ORIGINS": "https://a,https://b",
            "GATEWAY_LISTENERS__WS__DEFAULT__WEBSOCKET__FAIL_IF_NO_SUBPROTOCOL": "false",
        },
    )
    ws = config.listeners.ws["default"]
    assert ws.bind == "0.0.0.0:8083"
    assert ws.websocket.mqtt_path == "/mqtt"
    assert ws.websocket.supported_subprotocols == ["mqtt", "mqtt-v3.1.1", "mqtt-v3", "mqtt-v5"]
    assert ws.websocket.check_origins == ["https://a", "https://b"]
    assert ws.websocket.fail_if_no_subprotocol is False
    assert ws.websocket.trusted_proxies == ["127.0.0.0/8", "::1/128"]


def test_websocket_options_are_checked(tmp_path: Path) -> None:
    path = write(tmp_path, '[listeners.ws.default.websocket]\nmqtt_path = "mqtt"\n')
    assert "listeners.ws.default.websocket.mqtt_path" in error_of(path)
    path = write(tmp_path, '[listeners.ws.default.websocket]\ntrusted_proxies = ["x"]\n')
    assert "trusted_proxies" in error_of(path)


def test_bind_conflict_across_kinds(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[listeners.tcp.default]\nbind = "0.0.0.0:8083"\n[listeners.ws.default]\n',
    )
    assert "both bind 0.0.0.0:8083" in error_of(path)


def test_wss_needs_certificates(tmp_path: Path) -> None:
    assert "certfile" in error_of(write(tmp_path, "[listeners.wss.default]\n"))


def test_mqttsn_section(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[gateway.mqttsn]
gateway_id = 7
enable_qos3 = false
mountpoint = "sn/"
predefined = [{id = 1, topic = "a/b"}, {id = 2, topic = "c"}]

[gateway.mqttsn.listeners.udp.default]
bind = "0.0.0.0:1884"
""",
    )
    sn = load_config(path, {}).gateway.mqttsn
    assert sn is not None and sn.enable and sn.gateway_id == 7 and not sn.enable_qos3
    assert [(p.id, p.topic) for p in sn.predefined] == [(1, "a/b"), (2, "c")]
    assert sn.listeners.udp["default"].port == 1884
    assert sn.advertise_interval == 900.0 and sn.broadcast is False


def test_mqttsn_from_the_environment() -> None:
    config = load_config(
        None,
        {
            "GATEWAY_GATEWAY__MQTTSN__LISTENERS__UDP__DEFAULT__BIND": "127.0.0.1:11884",
            "GATEWAY_GATEWAY__MQTTSN__PREDEFINED": '[{id = 5, topic = "p/5"}]',
        },
    )
    sn = config.gateway.mqttsn
    assert sn is not None and sn.listeners.udp["default"].bind == "127.0.0.1:11884"
    assert sn.predefined[0].id == 5


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("predefined = [{id = 0, topic = \"a\"}]", "predefined"),
        ("predefined = [{id = 1, topic = \"a/#\"}]", "predefined"),
        ("predefined = [{id = 1, topic = \"a\"}, {id = 1, topic = \"b\"}]", "given twice"),
        ("gateway_id = 256", "gateway_id"),
        ("advertise_interval = \"1d\"", "advertise_interval"),
        ("bogus = 1", "bogus"),
    ],
)
def test_mqttsn_errors(tmp_path: Path, text: str, where: str) -> None:
    assert where in error_of(write(tmp_path, f"[gateway.mqttsn]\n{text}\n"))
