"""gatewayctl against a real gatewayd: readable output, --json, exit statuses, node down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.admin.gatewayd import WAIT, Client, Gatewayd, clean_environ, clients, free_port


@pytest.fixture(scope="module")
def gatewayd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gatewayd]:
    gw = Gatewayd(tmp_path_factory.mktemp("ctl"), node_name="ctl-test@127.0.0.1")
    gw.start()
    yield gw
    gw.stop()


def ctl(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.gatewayctl", *args],
        env={**clean_environ(), **(env or {})}, capture_output=True, text=True,
        timeout=60, cwd=cwd,
    )


def ok(gw: Gatewayd, *args: str) -> str:
    r = ctl(*args, env=gw.env)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return r.stdout


def test_status_human_and_json(gatewayd: Gatewayd) -> None:
    with clients() as made:
        made.append(Client(gatewayd, "ctl-status-1"))
        made.append(Client(gatewayd, "ctl-status-2", version=5).subscribe("s/#"))
        out = ok(gatewayd, "status")
        assert "ctl-test@127.0.0.1 (running, standalone)" in out
        assert "Connections    2 (mqtt 2)" in out
        assert "Subscriptions  1" in out
        assert f"tcp:default   mqtt       127.0.0.1:{gatewayd.mqtt_port}   running   2" in out
        assert "not configured" in out  # cluster, bridges
        data = json.loads(ok(gatewayd, "status", "--json"))
        assert data["connections"]["count"] == 2
        assert data["listeners"][0]["current_connections"] == 2


def test_clients_subscriptions_routes_listeners(gatewayd: Gatewayd) -> None:
    with clients() as made:
        made.append(Client(gatewayd, "ctl-c1", username="carol").subscribe("ctl/+/x", qos=1))
        made.append(Client(gatewayd, "ctl-c2", version=5))
        out = ok(gatewayd, "clients", "list", "--like", "ctl-c")
        lines = [ln for ln in out.splitlines() if ln.startswith("ctl-c")]
        assert [ln.split()[0] for ln in lines] == ["ctl-c1", "ctl-c2"]
        assert "carol" in lines[0] and "MQTT 3.1.1" in lines[0] and "connected" in lines[0]
        assert "MQTT 5.0" in lines[1]
        assert out.rstrip().endswith("2 clients")
        listed = json.loads(ok(gatewayd, "clients", "list", "--username", "carol", "--json"))
        assert [c["clientid"] for c in listed] == ["ctl-c1"]
        shown = ok(gatewayd, "clients", "show", "ctl-c1")
        assert "ctl/+/x" in shown and "carol" in shown
        subs = ok(gatewayd, "subscriptions", "--client", "ctl-c1")
        assert "ctl/+/x" in subs and "1 subscription" in subs
        assert "ctl/+/x" in ok(gatewayd, "routes")
        listeners = ok(gatewayd, "listeners")
        assert "tcp:default" in listeners and "mqttsn" in listeners
        assert "not configured" in ok(gatewayd, "cluster")
        assert json.loads(ok(gatewayd, "cluster", "status", "--json"))["enabled"] is False
        assert "messages.received" in ok(gatewayd, "metrics")
        ok(gatewayd, "alarms")


def test_kick(gatewayd: Gatewayd) -> None:
    with clients() as made:
        victim = Client(gatewayd, "ctl-victim", version=5)
        made.append(victim)
        assert ok(gatewayd, "kick", "ctl-victim").strip() == "kicked ctl-victim"
        assert victim.disconnected.wait(WAIT) and victim.disconnect_reason == 0x98
        victim.c.loop_stop()
    r = ctl("kick", "no-such-client", env=gatewayd.env)
    assert r.returncode == 1
    assert r.stderr.strip() == "gatewayctl: no client 'no-such-client'"


def test_retained(gatewayd: Gatewayd) -> None:
    with clients() as made:
        c = Client(gatewayd, "ctl-ret")
        made.append(c)
        c.publish("ctl/ret/t", b"21.5", qos=1, retain=True)
        assert "ctl/ret/t" in ok(gatewayd, "retained", "list", "--topic", "ctl/#")
        assert "21.5" in ok(gatewayd, "retained", "show", "ctl/ret/t")
        ok(gatewayd, "retained", "delete", "ctl/ret/t")
        r = ctl("retained", "show", "ctl/ret/t", env=gatewayd.env)
        assert r.returncode == 1 and "no retained message" in r.stderr


def test_trace_prints_live_events(gatewayd: Gatewayd) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.gatewayctl", "trace", "topic", "ctl/trace/#",
         "--count", "3", "--json"],
        env={**clean_environ(), **gatewayd.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())  # the trace is in place from here on
        assert first["event"] == "trace.started"
        with clients() as made:
            c = Client(gatewayd, "ctl-tracer").subscribe("ctl/trace/#")
            made.append(c)
            c.publish("ctl/trace/1", b"hi")
            out, err = proc.communicate(timeout=WAIT * 3)
        events = [json.loads(line) for line in out.splitlines()]
        assert [e["event"] for e in events] == [
            "session.subscribed", "message.publish", "message.delivered"]
        assert events[1]["payload"] == "hi"
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("args", [["status"], ["metrics"], ["status", "--json"]])
def test_a_reader_that_stops_early_is_not_an_error(gatewayd: Gatewayd, args: list[str]) -> None:
    """``gatewayctl status | head -1``: the reader has gone before gatewayctl writes
    (its end of the pipe is closed first), so every write meets EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "gateway.cli.gatewayctl", *args],
            env={**clean_environ(), **gatewayd.env}, stdout=write_end, stderr=subprocess.PIPE,
            text=True, timeout=60,
        )
    finally:
        os.close(write_end)
    assert (r.returncode, r.stderr) == (0, "")


def test_an_unwritable_stdout_is_one_line(gatewayd: Gatewayd) -> None:
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "gateway.cli.gatewayctl", "status"],
            env={**clean_environ(), **gatewayd.env}, stdout=full, stderr=subprocess.PIPE,
            text=True, timeout=60,
        )
    assert r.returncode == 1
    assert r.stderr == "gatewayctl: [Errno 28] No space left on device\n"


def test_node_down_is_one_line_and_exit_3(tmp_path: Path) -> None:
    env = {"GATEWAY_API__BIND": f"127.0.0.1:{free_port()}",
           "GATEWAY_NODE__DATA_DIR": str(tmp_path), "GATEWAY_API__TOKEN": "t" * 20}
    for args in (["status"], ["clients", "list"], ["kick", "x"], ["trace", "client", "x"]):
        r = ctl(*args, env=env)
        assert r.returncode == 3, (args, r.stderr)
        assert r.stdout == ""
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
        assert r.stderr.startswith("gatewayctl: node gateway@127.0.0.1 is not running")
    # no token file yet (gatewayd never started): still "not running", not a token error
    r = ctl("status", env={k: v for k, v in env.items() if k != "GATEWAY_API__TOKEN"})
    assert r.returncode == 3 and "is not running" in r.stderr


def test_unreadable_token_while_the_node_runs(gatewayd: Gatewayd, tmp_path: Path) -> None:
    env = {**gatewayd.env, "GATEWAY_NODE__DATA_DIR": str(tmp_path / "elsewhere")}
    r = ctl("status", env=env)
    assert r.returncode == 1
    assert "no API token" in r.stderr and r.stderr.count("\n") == 1
    r = ctl("status", env={**gatewayd.env, "GATEWAY_API__TOKEN": "w" * 20})
    assert r.returncode == 1 and "wrong API token" in r.stderr


def test_config_file_and_environment_are_gatewayds(gatewayd: Gatewayd, tmp_path: Path) -> None:
    conf = tmp_path / "gateway.toml"
    conf.write_text(f'[api]\nbind = "127.0.0.1:{gatewayd.api_port}"\n'
                    f'[node]\ndata_dir = "{gatewayd.data_dir}"\nname = "{gatewayd.node_name}"\n')
    r = ctl("status", "--config", str(conf))
    assert r.returncode == 0 and gatewayd.node_name in r.stdout
    r = ctl("status", env={"GATEWAY_CONFIG": str(conf)})
    assert r.returncode == 0
    r = ctl("status", "--config", str(conf), env={"GATEWAY_API__BIND": "nonsense"})
    assert r.returncode == 2
    assert r.stderr.startswith("gatewayctl: invalid configuration: api.bind")


def test_config_check(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[mqtt]\nmax_inflight = 10\n[sys_topics]\nsys_msg_interval = "30s"\n')
    r = ctl("config", "check", str(good))
    assert r.returncode == 0 and r.stdout.strip() == f"{good}: configuration OK"
    bad = tmp_path / "bad.toml"
    bad.write_text("[mqtt]\nmax_infligt = 10\n")
    r = ctl("config", "check", str(bad))
    assert r.returncode == 2
    assert r.stderr.strip() == "gatewayctl: invalid configuration: unknown key mqtt.max_infligt"
    r = ctl("config", "check", str(tmp_path / "missing.toml"))
    assert r.returncode == 2 and "no such file" in r.stderr
    r = ctl("config", "check", str(good), env={"GATEWAY_MQTT__MAX_INFLIGHT": "0"})
    assert r.returncode == 2
    assert ctl("config", "check", "--no-env", str(good),
               env={"GATEWAY_MQTT__MAX_INFLIGHT": "0"}).returncode == 0
    shown = json.loads(ctl("config", "show", "--config", str(good),
                           env={"GATEWAY_API__TOKEN": "s" * 20}).stdout)
    assert shown["mqtt"]["max_inflight"] == 10 and shown["api"]["token"] == "********"
