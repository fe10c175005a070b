"""Configuration: defaults, file and environment layers, error messages, rules files, CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import gatewayctl, gatewayd
from gateway.config import (
    AuthzRule,
    ConfigError,
    GatewayConfig,
    load_config,
    load_rules_file,
    parse_bind,
    parse_duration,
    parse_size,
)

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _no_gateway_environment(monkeypatch):
    """The CLI tests read os.environ: keep the caller's GATEWAY_* variables out."""
    for name in list(os.environ):
        if name.startswith("GATEWAY_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str, name: str = "gateway.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path: Path | None = None, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, env or {})
    message = info.value.message
    assert "\n" not in message
    return message


# ------------------------------------------------------------------ defaults


def test_defaults_without_file():
    config = load_config(None, {})
    assert config == GatewayConfig()
    assert config.node.name == "gateway@127.0.0.1"
    assert config.node.data_dir == Path("data")
    assert config.log.level == "info"
    assert list(config.listeners.tcp) == ["default"]
    default = config.listeners.tcp["default"]
    assert default.enable is True
    assert default.bind == "0.0.0.0:1883"
    assert (default.host, default.port) == ("0.0.0.0", 1883)
    assert default.max_connections == 1_024_000
    assert default.allow == [] and default.deny == []
    assert default.mountpoint == ""


def test_mqtt_defaults_match_emqx():
    mqtt = load_config(None, {}).mqtt
    assert mqtt.max_packet_size == 1024 * 1024
    assert mqtt.max_clientid_len == 65535
    assert mqtt.max_topic_levels == 128
    assert mqtt.max_topic_alias == 65535
    assert mqtt.max_qos_allowed == 2
    assert mqtt.retain_available and mqtt.wildcard_subscription and mqtt.shared_subscription
    assert mqtt.ignore_loop_deliver is False
    assert mqtt.idle_timeout == 15.0
    assert mqtt.keepalive_multiplier == 1.5
    assert mqtt.server_keepalive == 0
    assert mqtt.session_expiry_interval == 7200.0
    assert mqtt.max_session_expiry_interval == 0.0
    assert mqtt.max_inflight == 32
    assert mqtt.retry_interval == 30.0
    assert mqtt.max_awaiting_rel == 100
    assert mqtt.await_rel_timeout == 300.0
    assert mqtt.max_mqueue_len == 1000
    assert mqtt.mqueue_store_qos0 is True
    assert mqtt.mqueue_overflow == "drop_oldest"
    assert mqtt.shared_subscription_strategy == "round_robin"
    assert mqtt.max_subscriptions == 0
    assert mqtt.upgrade_qos is False
    assert mqtt.response_information == ""
    assert mqtt.strict_mode is False


def test_other_section_defaults():
    config = load_config(None, {})
    assert config.retainer.enable is True
    assert config.retainer.max_retained_messages == 0
    assert config.retainer.max_payload_size == 1024 * 1024
    assert config.authentication.allow_anonymous is True
    assert config.authorization.no_match == "allow"
    assert config.authorization.deny_action == "ignore"
    assert config.authorization.rules_file is None
    assert config.authorization.rules == []


# ------------------------------------------------------------------ file layer


def test_file_overrides_defaults(tmp_path):
    path = write(
        tmp_path,
        """
        [node]
        name = "edge1@10.0.0.1"
        data_dir = "/var/lib/gateway"

        [log]
        level = "debug"

        [listeners.tcp.default]
        bind = "127.0.0.1:18830"
        allow = ["10.0.0.0/8", "127.0.0.1"]

        [mqtt]
        max_inflight = 10
        max_packet_size = "64KB"
        session_expiry_interval = "5m"
        idle_timeout = "500ms"
        retry_interval = 2
        mqueue_overflow = "drop_newest"
        shared_subscription_strategy = "hash_clientid"
        """,
    )
    config = load_config(path, {})
    assert config.node.name == "edge1@10.0.0.1"
    assert config.node.data_dir == Path("/var/lib/gateway")
    assert config.log.level == "debug"
    assert config.listeners.tcp["default"].port == 18830
    assert config.listeners.tcp["default"].allow == ["10.0.0.0/8", "127.0.0.1"]
    assert config.mqtt.max_inflight == 10
    assert config.mqtt.max_packet_size == 65536
    assert config.mqtt.session_expiry_interval == 300.0
    assert config.mqtt.idle_timeout == 0.5
    assert config.mqtt.retry_interval == 2.0
    assert config.mqtt.mqueue_overflow == "drop_newest"
    assert config.mqtt.shared_subscription_strategy == "hash_clientid"
    # untouched keys keep their defaults
    assert config.mqtt.max_mqueue_len == 1000


def test_file_listener_adds_to_default(tmp_path):
    path = write(tmp_path, '[listeners.tcp.internal]\nbind = "127.0.0.1:1884"\n')
    tcp = load_config(path, {}).listeners.tcp
    assert sorted(tcp) == ["default", "internal"]
    assert tcp["default"].bind == "0.0.0.0:1883"


def test_default_listener_can_be_disabled(tmp_path):
    path = write(tmp_path, "[listeners.tcp.default]\nenable = false\n")
    assert load_config(path, {}).listeners.tcp["default"].enable is False


def test_ipv6_bind(tmp_path):
    path = write(tmp_path, '[listeners.tcp.default]\nbind = "[::1]:1883"\n')
    listener = load_config(path, {}).listeners.tcp["default"]
    assert (listener.host, listener.port) == ("::1", 1883)


# ------------------------------------------------------------------ environment layer


def test_env_overrides_file(tmp_path):
    path = write(tmp_path, "[mqtt]\nmax_inflight = 10\n")
    env = {"GATEWAY_MQTT__MAX_INFLIGHT": "20", "GATEWAY_NODE__DATA_DIR": "/var/lib/gateway"}
    config = load_config(path, env)
    assert config.mqtt.max_inflight == 20
    assert config.node.data_dir == Path("/var/lib/gateway")


def test_env_creates_listeners():
    env = {
        "GATEWAY_LISTENERS__TCP__DEFAULT__BIND": "127.0.0.1:18830",
        "GATEWAY_LISTENERS__TCP__EXTRA__BIND": "127.0.0.1:18831",
        "GATEWAY_LISTENERS__TCP__EXTRA__MAX_CONNECTIONS": "10",
    }
    tcp = load_config(None, env).listeners.tcp
    assert sorted(tcp) == ["default", "extra"]
    assert tcp["default"].port == 18830
    assert tcp["extra"].port == 18831
    assert tcp["extra"].max_connections == 10


@pytest.mark.parametrize(
    ("name", "value", "attribute", "expected"),
    [
        ("GATEWAY_MQTT__RETAIN_AVAILABLE", "false", ("mqtt", "retain_available"), False),
        ("GATEWAY_MQTT__KEEPALIVE_MULTIPLIER", "2.5", ("mqtt", "keepalive_multiplier"), 2.5),
        ("GATEWAY_MQTT__SESSION_EXPIRY_INTERVAL", "1d", ("mqtt", "session_expiry_interval"), 86400),
        ("GATEWAY_MQTT__SESSION_EXPIRY_INTERVAL", "60", ("mqtt", "session_expiry_interval"), 60),
        ("GATEWAY_MQTT__MAX_PACKET_SIZE", "1GB", ("mqtt", "max_packet_size"), None),
        ("GATEWAY_RETAINER__MAX_PAYLOAD_SIZE", "64KB", ("retainer", "max_payload_size"), 65536),
        ("GATEWAY_NODE__NAME", '"quoted"', ("node", "name"), "quoted"),
        ("GATEWAY_NODE__NAME", "42", ("node", "name"), "42"),
        ("GATEWAY_LOG__LEVEL", "WARNING", ("log", "level"), "warning"),
        ("GATEWAY_MQTT__RESPONSE_INFORMATION", "a b c", ("mqtt", "response_information"), "a b c"),
    ],
)
def test_env_value_types(name, value, attribute, expected):
    if expected is None:  # 1GB is beyond MQTT's largest packet
        assert "mqtt.max_packet_size" in error_of(env={name: value})
        return
    section, key = attribute
    config = load_config(None, {name: value})
    assert getattr(getattr(config, section), key) == expected


def test_env_lists():
    env = {
        "GATEWAY_LISTENERS__TCP__DEFAULT__ALLOW": '["10.0.0.0/8", "::1"]',
        "GATEWAY_LISTENERS__TCP__DEFAULT__DENY": "192.168.0.0/16, 172.16.0.1",
    }
    listener = load_config(None, env).listeners.tcp["default"]
    assert listener.allow == ["10.0.0.0/8", "::1"]
    assert listener.deny == ["192.168.0.0/16", "172.16.0.1"]
    assert [str(n) for n in listener.deny_networks] == ["192.168.0.0/16", "172.16.0.1/32"]


def test_env_rules_as_inline_toml():
    env = {"GATEWAY_AUTHORIZATION__RULES": '[{permission = "deny", topics = ["a/#"]}]'}
    (rule,) = load_config(None, env).authorization.rules
    assert rule.permission == "deny" and rule.action == "all" and rule.topics == ["a/#"]


def test_unrelated_environment_is_ignored():
    env = {"GATEWAY_INTERFACE": "CGI/1.1", "PATH": "/bin", "MQTT__MAX_INFLIGHT": "0"}
    assert load_config(None, env) == GatewayConfig()


def test_env_empty_segment_is_an_error():
    assert "GATEWAY_MQTT____MAX_INFLIGHT" in error_of(env={"GATEWAY_MQTT____MAX_INFLIGHT": "1"})


# ------------------------------------------------------------------ error messages


def test_out_of_range_names_key_and_value(tmp_path):
    path = write(tmp_path, "[mqtt]\nmax_inflight = 0\n")
    assert error_of(path) == (
        "mqtt.max_inflight: Input should be greater than or equal to 1 (got 0)"
    )


def test_bad_bind(tmp_path):
    path = write(tmp_path, '[listeners.tcp.default]\nbind = "nonsense"\n')
    assert error_of(path) == 'listeners.tcp.default.bind: expected "host:port", got "nonsense"'


@pytest.mark.parametrize("bind", ["::1:1883", "[nothost]:1883", "h:70000", "h:", ":1883", "a b:1"])
def test_more_bad_binds(bind):
    message = error_of(env={"GATEWAY_LISTENERS__TCP__DEFAULT__BIND": bind})
    assert message.startswith('listeners.tcp.default.bind: expected "host:port"')
    assert "GATEWAY_LISTENERS__TCP__DEFAULT__BIND" in message


def test_unknown_key(tmp_path):
    path = write(tmp_path, "[mqtt]\nmax_infligt = 3\n")
    assert error_of(path) == "unknown key mqtt.max_infligt"


def test_unknown_section_and_listener_key(tmp_path):
    assert error_of(write(tmp_path, "[mqt]\nx = 1\n")) == "unknown key mqt"
    path = write(tmp_path, '[listeners.tcp.default]\nbnd = "127.0.0.1:1"\n')
    assert error_of(path) == "unknown key listeners.tcp.default.bnd"
    assert error_of(write(tmp_path, "[listeners.quic.default]\n")) == "unknown key listeners.quic"


def test_unknown_key_from_env_names_the_variable():
    message = error_of(env={"GATEWAY_MQTT__MAX_INFLIGT": "3"})
    assert message == "unknown key mqtt.max_infligt [from GATEWAY_MQTT__MAX_INFLIGT]"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[mqtt]\nidle_timeout = "soon"', "mqtt.idle_timeout: expected a duration"),
        ("[mqtt]\nidle_timeout = 0", "mqtt.idle_timeout: Input should be greater than 0"),
        ('[mqtt]\nmax_packet_size = "lots"', "mqtt.max_packet_size: expected a size"),
        ("[mqtt]\nmax_qos_allowed = 3", "mqtt.max_qos_allowed: Input should be less than"),
        ('[mqtt]\nmqueue_overflow = "drop"', "mqtt.mqueue_overflow: Input should be"),
        ("[mqtt]\nmax_clientid_len = 5", "mqtt.max_clientid_len: Input should be greater"),
        ('[mqtt]\nmax_inflight = "many"', "mqtt.max_inflight: Input should be a valid integer"),
        ('[log]\nlevel = "loud"', "log.level: Input should be 'debug', 'info', 'warning'"),
        ('[listeners.tcp.default]\ndeny = ["10.0.0.0/33"]', "listeners.tcp.default.deny[0]:"),
        ("[authorization]\nno_match = 1", "authorization.no_match: Input should be"),
    ],
)
def test_invalid_values(tmp_path, text, expected):
    assert error_of(write(tmp_path, text)).startswith(expected)


def test_several_errors_on_one_line(tmp_path):
    message = error_of(write(tmp_path, "[mqtt]\nmax_inflight = 0\nmax_qos_allowed = 7\n"))
    assert "mqtt.max_inflight" in message and "mqtt.max_qos_allowed" in message


def test_duplicate_binds(tmp_path):
    path = write(tmp_path, '[listeners.tcp.other]\nbind = "0.0.0.0:1883"\n')
    assert error_of(path) == (
        "listeners.tcp: listeners 'default' and 'other' both bind 0.0.0.0:1883"
    )


def test_file_errors(tmp_path):
    assert error_of(tmp_path / "absent.toml").endswith("absent.toml: no such file")
    message = error_of(write(tmp_path, "[mqtt\n"))
    assert "invalid TOML" in message


# ------------------------------------------------------------------ value syntaxes


def test_parse_duration():
    assert parse_duration(5) == 5.0
    assert parse_duration(0.25) == 0.25
    assert parse_duration("500ms") == 0.5
    assert parse_duration("30s") == 30.0
    assert parse_duration("5m") == 300.0
    assert parse_duration("2h") == 7200.0
    assert parse_duration("1d") == 86400.0
    assert parse_duration("0") == 0.0
    for bad in ("", "1y", "-1s", "s", True, None):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_parse_size():
    assert parse_size(100) == 100
    assert parse_size("64KB") == 65536
    assert parse_size("1MB") == 1 << 20
    assert parse_size("1GB") == 1 << 30
    assert parse_size("10b") == 10
    for bad in ("", "1TB", "1.5MB", "MB", False):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_parse_bind():
    assert parse_bind("0.0.0.0:1883") == ("0.0.0.0", 1883)
    assert parse_bind("[::]:0") == ("::", 0)
    assert parse_bind("localhost:1883") == ("localhost", 1883)


def test_bare_port_bind():
    listener = load_config(None, {"GATEWAY_LISTENERS__TCP__DEFAULT__BIND": "18830"})
    assert listener.listeners.tcp["default"].bind == "0.0.0.0:18830"


# ------------------------------------------------------------------ authorization rules


RULES = """
[[rules]]
permission = "allow"
username = "dashboard"
topics = ["$SYS/#", "eq #"]

[[rules]]
permission = "deny"
action = "subscribe"
topics = ["test/nosubscribe"]

[[rules]]
permission = "allow"
action = "publish"
ipaddress = "10.0.0.0/8"
topics = ["devices/${clientid}/up"]
"""


def test_load_rules_file(tmp_path):
    rules = load_rules_file(write(tmp_path, RULES, "acl.toml"))
    assert [r.permission for r in rules] == ["allow", "deny", "allow"]
    assert rules[0].username == "dashboard" and rules[0].action == "all"
    assert rules[1].clientid is None and rules[1].username is None and rules[1].ipaddress is None
    assert rules[2].ipaddress == "10.0.0.0/8"
    assert AuthzRule.split_topic(rules[0].topics[1]) == (True, "#")
    assert AuthzRule.split_topic(rules[2].topics[0]) == (False, "devices/${clientid}/up")


def test_rules_file_errors_name_file_and_rule(tmp_path):
    text = RULES + '\n[[rules]]\npermission = "allw"\ntopics = ["x"]\n'
    path = write(tmp_path, text, "acl.toml")
    with pytest.raises(ConfigError) as info:
        load_rules_file(path)
    assert info.value.message == (
        f"{path}: rules[3].permission: Input should be 'allow' or 'deny' (got \"allw\")"
    )


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ('permission = "deny"', "rules[0].topics: missing required key"),
        ('permission = "deny"\ntopics = []', "rules[0].topics: List should have at least 1"),
        ('permission = "deny"\ntopics = ["a/#/b"]', 'rules[0].topics[0]: "#" must be'),
        ('permission = "deny"\ntopics = ["a+"]', 'rules[0].topics[0]: "+" must be'),
        ('permission = "deny"\ntopics = ["a"]\nclientid = "c"\nusername = "u"', "at most one"),
        ('permission = "deny"\ntopics = ["a"]\nipaddress = "nope"', "rules[0].ipaddress:"),
        ('permission = "deny"\ntopics = ["a"]\naction = "read"', "rules[0].action:"),
        ('permission = "deny"\ntopics = ["a"]\nwho = "all"', "unknown key rules[0].who"),
    ],
)
def test_invalid_rules(tmp_path, rule, expected):
    path = write(tmp_path, f"[[rules]]\n{rule}\n", "acl.toml")
    with pytest.raises(ConfigError) as info:
        load_rules_file(path)
    assert expected in info.value.message
    assert info.value.message.startswith(f"{path}: ")


def test_rules_file_from_config_relative_to_config_file(tmp_path):
    write(tmp_path, RULES, "acl.toml")
    path = write(
        tmp_path,
        """
        [authorization]
        no_match = "deny"
        rules_file = "acl.toml"
        [[authorization.rules]]
        permission = "allow"
        clientid = "admin"
        topics = ["#"]
        """,
    )
    authz = load_config(path, {}).authorization
    assert authz.rules_file == tmp_path / "acl.toml"
    # rules holds the inline rules; the file's rules are read from the resolved path
    assert [r.clientid for r in authz.rules] == ["admin"]
    file_rules = load_rules_file(authz.rules_file)
    assert [r.permission for r in file_rules] == ["allow", "deny", "allow"]


def test_invalid_rules_file_fails_load_config(tmp_path):
    write(tmp_path, '[[rules]]\npermission = "allw"\ntopics = ["x"]\n', "acl.toml")
    path = write(tmp_path, '[authorization]\nrules_file = "acl.toml"\n')
    assert error_of(path).endswith(
        "acl.toml: rules[0].permission: Input should be 'allow' or 'deny' (got \"allw\")"
    )


def test_missing_rules_file(tmp_path):
    path = write(tmp_path, '[authorization]\nrules_file = "absent.toml"\n')
    message = error_of(path)
    assert message.startswith("authorization.rules_file: no such file")
    assert "absent.toml" in message


def test_paho_config_is_valid():
    config = load_config(REPO / "tests" / "configs" / "paho.toml", {})
    listener = config.listeners.tcp["default"]
    assert (listener.host, listener.port) == ("127.0.0.1", 1883)
    assert config.authorization.no_match == "allow"
    assert any(
        rule.permission == "deny"
        and rule.action in ("subscribe", "all")
        and rule.topics == ["test/nosubscribe"]
        for rule in config.authorization.rules
    )


# ------------------------------------------------------------------ command line


def test_gatewayd_check(tmp_path, capsys):
    assert gatewayd.main(["--check"]) == 0
    bad = write(tmp_path, "[mqtt]\nmax_inflight = 0\n")
    assert gatewayd.main(["--config", str(bad), "--check"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "gatewayd: invalid configuration: "
        "mqtt.max_inflight: Input should be greater than or equal to 1 (got 0)\n"
    )


def test_versions(capsys):
    assert gatewayd.main(["--version"]) == 0
    assert gatewayctl.main(["--version"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["gatewayd 0.1.0 (pure)", "gatewayctl 0.1.0"]  # the suite runs pure Python


def test_gatewayctl_without_command_prints_usage(capsys):
    assert gatewayctl.main([]) == 2
    assert "Usage: gatewayctl" in capsys.readouterr().err


def test_gatewayd_bad_config_subprocess(tmp_path):
    bad = write(tmp_path, '[listeners.tcp.default]\nbind = "nonsense"\n', "bad.toml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli.gatewayd", "--config", str(bad)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        "gatewayd: invalid configuration: "
        'listeners.tcp.default.bind: expected "host:port", got "nonsense"\n'
    )


def test_gatewayd_env_error_subprocess():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["PYTHONPATH"] = str(REPO)
    env["GATEWAY_MQTT__MAX_INFLIGHT"] = "0"
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli.gatewayd"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "mqtt.max_inflight" in proc.stderr and "GATEWAY_MQTT__MAX_INFLIGHT" in proc.stderr


# ------------------------------------------------------------------ bridge TLS files


def test_bridge_tls_files_are_relative_to_the_file_and_checked(tmp_path):
    """A bridge's TLS files resolve like an ssl listener's (against the configuration
    file's directory, not the working directory) and load before anything starts; a
    missing one is one line naming the key."""
    from gateway.security.pki import init_ca, issue

    conf_dir = tmp_path / "etc"
    init_ca(conf_dir / "certs")
    issue(conf_dir / "certs", "edge", server=False, client=True)
    text = """
[bridges.mqtt.up]
server = "127.0.0.1:8883"
[bridges.mqtt.up.tls]
enable = true
cacertfile = "certs/ca.crt"
certfile = "certs/edge.crt"
keyfile = "certs/edge.key"
"""
    path = write(conf_dir, text)
    tls = load_config(path, {}).bridges.mqtt["up"].tls
    assert tls.cacertfile == conf_dir / "certs/ca.crt"
    assert tls.keyfile == conf_dir / "certs/edge.key"
    missing = write(conf_dir, text.replace("certs/ca.crt", "certs/nope.crt"), "missing.toml")
    assert error_of(missing) == (
        f'bridges.mqtt.up.tls.cacertfile: no such file "{conf_dir / "certs/nope.crt"}"'
    )
    disabled = write(conf_dir, text.replace("enable = true", "enable = false").replace(
        "certs/ca.crt", "certs/nope.crt"), "disabled.toml")
    load_config(disabled, {})  # not used, not loaded


def test_lwm2m_bootstrap_plan(tmp_path):
    path = write(tmp_path, """
[gateway.lwm2m]
max_queue = 50
[gateway.lwm2m.bootstrap]
enable = true
[gateway.lwm2m.bootstrap.endpoints."*"]
writes = [{path = "/1/1", content = [{path = "1", value = 300}, {path = "7", value = "U"}]}]
""")
    lw = load_config(path, {}).gateway.lwm2m
    assert lw is not None and lw.max_queue == 50
    [w] = lw.bootstrap.endpoints["*"].writes
    assert w.path == "/1/1" and w.content[0] == {"path": "1", "value": 300}
    bad = write(tmp_path, """
[gateway.lwm2m.bootstrap.endpoints.ep1]
writes = [{path = "/1", content = []}]
""", "bad.toml")
    assert "gateway.lwm2m.bootstrap.endpoints.ep1.writes" in error_of(bad)
    bad2 = write(tmp_path, """
[gateway.lwm2m.bootstrap.endpoints.ep1]
writes = [{path = "/1/0", content = [{value = 1}]}]
""", "bad2.toml")
    assert "path and a value" in error_of(bad2)
