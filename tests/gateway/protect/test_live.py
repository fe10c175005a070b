"""Protection against a live gatewayd: bans added with gatewayctl while it runs, flapping,
connection rate, message and byte rates (pause, never drop).

Waiting is on events (a CONNACK, a close, a log line via bounded polling), never on
fixed sleeps; deadlines are generous bounds, not timing assertions.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conformance import raw
from tests.conformance.raw import V5, V311, RawClient
from tests.fuzz.broker import Gatewayd, free_port

WAIT = 15.0


def gatewayctl(proc: Gatewayd, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GATEWAY_NODE__DATA_DIR=str(proc.data_dir))
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli.gatewayctl", *args],
        capture_output=True, text=True, check=False, timeout=60, env=env,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert result.returncode == 0, result.stderr
    return result


def connack(addr: tuple[str, int], cid: str, proto: int, **kw: object) -> int:
    with RawClient(addr, proto) as c:
        c.send(raw.connect(cid, proto=proto, **kw))  # type: ignore[arg-type]
        ack = c.expect("CONNACK", timeout=WAIT)
        if ack.reason == 0:
            c.disconnect()
        else:
            c.expect_closed(timeout=WAIT)
        return ack.reason


def wait_for_log(proc: Gatewayd, text: str, count: int = 1) -> None:
    deadline = time.monotonic() + WAIT
    while proc.log_count(text) < count:
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{proc.log_tail()}"
        proc.wait_briefly()


@pytest.fixture
def gatewayd(tmp_path):
    procs: list[Gatewayd] = []

    def start(**env: str | int) -> Gatewayd:
        proc = Gatewayd(tmp_path / f"g{len(procs)}", **env).start()
        procs.append(proc)
        return proc

    yield start
    for p in procs:
        p.stop()


def test_ban_with_gatewayctl_while_running(gatewayd) -> None:
    proc = gatewayd()
    with RawClient(proc.addr, V5) as victim, RawClient(proc.addr, V311) as bystander:
        victim.connect("victim", keepalive=0)
        bystander.connect("bystander", keepalive=0)
        gatewayctl(proc, "ban", "add", "clientid", "victim", "--reason", "test")
        disconnect = victim.expect_closed(timeout=WAIT)  # within the next poll
        assert disconnect is not None and disconnect.reason == 0x98
        bystander.ping()
    assert connack(proc.addr, "victim", V5) == 0x8A
    assert connack(proc.addr, "victim", V311) == 5
    gatewayctl(proc, "ban", "add", "cidr", "127.0.0.0/8", "--duration", "1h")
    wait_for_log(proc, "bans reloaded", 2)
    assert connack(proc.addr, "anyone", V5) == 0x8A
    gatewayctl(proc, "ban", "delete", "cidr", "127.0.0.0/8")
    gatewayctl(proc, "ban", "delete", "clientid", "victim")
    # Both deletes may land in one poll (one "bans reloaded" line, not two): wait for
    # the outcome itself, bounded.
    deadline = time.monotonic() + WAIT
    while connack(proc.addr, "victim", V5) != 0:
        assert time.monotonic() < deadline, "the deleted bans still refuse the client"
        proc.wait_briefly()


def test_bans_survive_a_restart(gatewayd, tmp_path) -> None:
    proc = gatewayd()
    gatewayctl(proc, "ban", "add", "username", "mallory")
    proc.stop()
    proc.start()
    assert connack(proc.addr, "m", V5, username="mallory") == 0x8A
    assert connack(proc.addr, "m", V5, username="alice") == 0


def test_flapping_client_is_banned(gatewayd) -> None:
    proc = gatewayd(
        GATEWAY_FLAPPING_DETECT__ENABLE="true",
        GATEWAY_FLAPPING_DETECT__MAX_COUNT=3,
        GATEWAY_FLAPPING_DETECT__WINDOW_TIME="1m",
        GATEWAY_FLAPPING_DETECT__BAN_TIME="5m",
    )
    assert connack(proc.addr, "flappy", V5) == 0
    assert connack(proc.addr, "flappy", V5) == 0
    with RawClient(proc.addr, V5) as third:  # the third connect within a minute
        third.connect("flappy", keepalive=0)
        kicked = third.expect_closed(timeout=WAIT)
        assert kicked is not None and kicked.reason == 0x98
    assert connack(proc.addr, "flappy", V5) == 0x8A
    listed = gatewayctl(proc, "ban", "list", "--json").stdout.splitlines()
    (ban,) = [json.loads(line) for line in listed]
    assert (ban["kind"], ban["value"], ban["by"]) == ("clientid", "flappy", "flapping")
    assert connack(proc.addr, "calm", V5) == 0
    wait_for_log(proc, "flapping: client 'flappy'")


def test_max_conn_rate_refuses_at_accept_on_that_listener_only(gatewayd) -> None:
    other = free_port()
    proc = gatewayd(
        GATEWAY_LISTENERS__TCP__DEFAULT__MAX_CONN_RATE="3/m",  # one token, then one per 20 s
        GATEWAY_LISTENERS__TCP__OTHER__BIND=f"127.0.0.1:{other}",
    )
    # start() already used the token with its readiness probe
    refused = 0
    for _ in range(10):
        with socket.create_connection(proc.addr, timeout=WAIT) as s:
            s.sendall(raw.connect("rate", keepalive=0))
            s.settimeout(WAIT)
            try:
                got = s.recv(16)
            except ConnectionResetError:
                got = b""
            refused += got == b""
    assert refused >= 9  # at most one token can have come back meanwhile
    assert connack(("127.0.0.1", other), "elsewhere", V5) == 0
    wait_for_log(proc, "max_conn_rate exceeded")


@pytest.mark.parametrize(
    ("key", "value"),
    [("GATEWAY_MQTT__MESSAGES_RATE", "20/s"), ("GATEWAY_MQTT__BYTES_RATE", "256B/s")],
)
def test_rates_pause_the_client_and_lose_nothing(gatewayd, key: str, value: str) -> None:
    proc = gatewayd(**{key: value})
    with RawClient(proc.addr, V5) as sub, RawClient(proc.addr, V5) as pub:
        sub.connect("rate-sub", keepalive=0)
        sub.subscribe("rate/t", 1)
        pub.connect("rate-pub", keepalive=60)
        batch = b"".join(
            raw.publish("rate/t", b"m%03d" % i, qos=1, mid=i + 1, proto=V5) for i in range(60)
        )
        pub.sock.sendall(batch)  # 60 messages (~1 KB) at once: three seconds' worth
        for i in range(60):
            assert pub.expect("PUBACK", timeout=WAIT).mid == i + 1
            sub.receive("rate/t", b"m%03d" % i, qos=1, timeout=WAIT)
        pub.ping()  # still connected: paused, never disconnected
    wait_for_log(proc, "rate limit reached, pausing reads")


def test_websocket_listeners_get_the_connection_rate_too(gatewayd) -> None:
    ws_port = free_port()
    proc = gatewayd(
        GATEWAY_LISTENERS__WS__DEFAULT__BIND=f"127.0.0.1:{ws_port}",
        GATEWAY_LISTENERS__WS__DEFAULT__MAX_CONN_RATE="3/m",
    )
    closed = 0
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", ws_port), timeout=WAIT) as s:
            s.sendall(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(WAIT)
            try:
                closed += s.recv(16) == b""
            except ConnectionResetError:
                closed += 1
    assert closed >= 4  # one token at most
    wait_for_log(proc, "listener ws:default refused")
