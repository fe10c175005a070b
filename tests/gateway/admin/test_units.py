"""Unit tests of gateway.admin parts that need no running node: limits, tokens, alarms,
systemd notification, the trace hub and the $SYS publisher (on a virtual clock)."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from gateway.admin.alarms import Alarms
from gateway.admin.limits import RESERVED_FDS, configured_max_connections, raise_nofile_limit
from gateway.admin.sdnotify import Notifier, SystemdIntegration
from gateway.admin.sys_topics import SysPublisher
from gateway.admin.tokens import TokenError, check_bearer, ensure_token, read_token
from gateway.admin.trace import QUEUE_SIZE, TraceHub
from gateway.config import GatewayConfig
from gateway.config.schema import SysTopicsConfig
from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from protocols.context import ClientInfo, Delivery, Message, SubOptions

# -- open-file limit ---------------------------------------------------------------------


def test_max_connections_sums_enabled_listeners() -> None:
    config = GatewayConfig(listeners={"tcp": {
        "default": {"bind": "127.0.0.1:1", "max_connections": 10},
        "b": {"bind": "127.0.0.1:2", "max_connections": 5},
        "off": {"bind": "127.0.0.1:3", "max_connections": 1000, "enable": False},
    }})
    assert configured_max_connections(config) == 15


def test_raise_nofile_limit_raises_soft_to_hard() -> None:
    calls: list[tuple[int, int]] = []
    check = raise_nofile_limit(
        100, getrlimit=lambda _: (1024, 4096), setrlimit=lambda _, v: calls.append(v)
    )
    assert calls == [(4096, 4096)]
    assert (check.before, check.soft, check.hard) == (1024, 4096, 4096)
    assert check.ok and check.wanted == 100 + RESERVED_FDS


def test_raise_nofile_limit_warns_when_even_hard_is_too_low(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check = raise_nofile_limit(1_000_000, getrlimit=lambda _: (1024, 65536),
                               setrlimit=lambda _, v: None)
    assert not check.ok and check.soft == 65536
    assert "raise LimitNOFILE" in caplog.text


def test_infinite_hard_limit_is_capped_by_nr_open() -> None:
    calls: list[tuple[int, int]] = []
    check = raise_nofile_limit(
        10, getrlimit=lambda _: (1024, resource.RLIM_INFINITY),
        setrlimit=lambda _, v: calls.append(v), nr_open=lambda: 1048576,
    )
    assert calls == [(1048576, resource.RLIM_INFINITY)] and check.soft == 1048576


def test_this_process_really_raises_its_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        check = raise_nofile_limit(1)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == check.soft >= soft
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# -- token -------------------------------------------------------------------------------


def test_token_file_is_generated_once_with_mode_0600(tmp_path: Path) -> None:
    config = GatewayConfig(node={"data_dir": tmp_path / "d"})
    with pytest.raises(TokenError, match="does not exist"):
        read_token(config)
    token = ensure_token(config)
    path = tmp_path / "d" / "api.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_token(config) == token == read_token(config)
    assert check_bearer(f"Bearer {token}", token)
    assert check_bearer(f"bearer  {token} ", token)
    assert not check_bearer(f"Basic {token}", token)
    assert not check_bearer("Bearer nope", token)
    assert not check_bearer(None, token)


def test_configured_token_wins(tmp_path: Path) -> None:
    config = GatewayConfig(node={"data_dir": tmp_path}, api={"token": "x" * 20})
    assert ensure_token(config) == "x" * 20 == read_token(config)
    assert not (tmp_path / "api.token").exists()


def test_short_tokens_are_refused() -> None:
    with pytest.raises(ValueError, match="16 characters"):
        GatewayConfig(api={"token": "short"})


# -- alarms ------------------------------------------------------------------------------


def test_alarms_activate_once_and_move_to_history() -> None:
    now = [100.0]
    alarms = Alarms(now=lambda: now[0])
    alarms.activate("a", "first")
    now[0] = 200.0
    alarms.activate("a", "updated", {"x": 1})
    assert [(a.name, a.message, a.activated_at) for a in alarms.active()] == [
        ("a", "updated", 100.0)]
    assert alarms.deactivate("a") and not alarms.deactivate("a")
    assert alarms.active() == [] and alarms.history()[0].deactivated_at == 200.0


# -- systemd notification ----------------------------------------------------------------


@pytest.fixture
def notify_socket(tmp_path: Path) -> Any:
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(10)
    yield str(path), sock
    sock.close()


def test_notifier_without_systemd_is_a_no_op() -> None:
    n = Notifier({})
    assert not n.enabled and n.watchdog_interval is None and not n.notify("READY=1")


def test_notifier_writes_the_datagram_itself(notify_socket: Any) -> None:
    path, sock = notify_socket
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000"})
    assert n.enabled and n.watchdog_interval == 2.0
    assert n.notify("READY=1\nSTATUS=ok")
    assert sock.recv(4096) == b"READY=1\nSTATUS=ok"


def test_watchdog_for_another_pid_is_ignored() -> None:
    n = Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"})
    assert n.watchdog_interval is None or os.getpid() == 1


def test_notifier_uses_systemd_python_when_installed(
    notify_socket: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("systemd.daemon")
    path, sock = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    n = Notifier()
    assert n._daemon_notify is not None
    assert n.notify("STATUS=via libsystemd")
    assert sock.recv(4096) == b"STATUS=via libsystemd"


def test_integration_ready_then_watchdog_pings_from_the_loop(notify_socket: Any) -> None:
    path, sock = notify_socket
    sock.setblocking(False)

    async def main() -> list[bytes]:
        loop = asyncio.get_running_loop()
        notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000"})  # ping 10ms
        integration = SystemdIntegration(lambda: "3 connections", notifier=notifier, loop=loop)
        integration.ready()
        got: list[bytes] = []
        while sum(1 for d in got if d == b"WATCHDOG=1") < 3:
            got.append(await loop.sock_recv(sock, 4096))
        integration.stopping()
        got.append(await loop.sock_recv(sock, 4096))
        return got

    got = asyncio.run(main())
    assert got[0].startswith(b"READY=1\nSTATUS=3 connections\nMAINPID=")
    assert got[-1].startswith(b"STOPPING=1")


# -- trace hub ---------------------------------------------------------------------------


def make_node(clock: VirtualScheduler) -> Node:
    return Node(CoreSettings(node_name="unit@host"), clock)


class Handle:
    def __init__(self) -> None:
        self.delivered: list[Delivery] = []
        self.kicked: list[int] = []

    def deliver(self, deliveries: list[Delivery]) -> None:
        self.delivered.extend(deliveries)

    def release(self, packet_id: int) -> None:
        pass

    def kick(self, reason_code: int) -> None:
        self.kicked.append(reason_code)

    def call_channel(self, fn: Any) -> None:
        pass


def connect(node: Node, cid: str, **kw: Any) -> tuple[ClientInfo, Handle]:
    info = ClientInfo(client_id=cid, peer_host="10.0.0.1", peer_port=5000)
    handle = Handle()
    node.open_session(info, handle, clean_start=True, expiry_interval=kw.get("expiry", 0),
                      receive_maximum=10, will=kw.get("will"),
                      will_delay=kw.get("will_delay", 0))
    return info, handle


def test_trace_hub_hooks_only_while_tracing() -> None:
    clock = VirtualScheduler()
    node = make_node(clock)
    hub = TraceHub(node.hooks, clock.time)

    async def main() -> None:
        assert not node.hooks.has("message.delivered")
        trace = hub.start(topic="t/#")
        assert node.hooks.has("message.delivered")
        info, _ = connect(node, "c1")
        node.subscribe(info, "t/#", SubOptions(qos=0))
        node.publish(info, Message("t/1", b"x", publisher="c1"))
        node.delivered(info, [Delivery(Message("t/1", b"x", publisher="c1"), 0, False)])
        node.publish(info, Message("u/1", b"y", publisher="c1"))
        events = [trace.queue.get_nowait()["event"] for _ in range(trace.queue.qsize())]
        assert events == ["session.subscribed", "message.publish", "message.delivered"]
        hub.stop(trace)
        assert not node.hooks.has("message.delivered")

    asyncio.run(main())


def test_a_full_trace_queue_counts_what_it_drops() -> None:
    clock = VirtualScheduler()
    node = make_node(clock)
    hub = TraceHub(node.hooks, clock.time)

    async def main() -> None:
        trace = hub.start(clientid="c1")
        info, _ = connect(node, "c1")
        for i in range(QUEUE_SIZE + 5):
            node.publish(info, Message(f"t/{i}", b"x", publisher="c1"))
        assert trace.dropped > 0
        while not trace.queue.empty():
            trace.queue.get_nowait()
        node.publish(info, Message("t/last", b"x", publisher="c1"))
        assert trace.queue.get_nowait()["event"] == "trace.dropped"
        hub.close_all()

    asyncio.run(main())


# -- $SYS publisher ----------------------------------------------------------------------


def test_sys_publisher_on_a_virtual_clock() -> None:
    clock = VirtualScheduler()
    node = make_node(clock)
    settings = SysTopicsConfig(sys_msg_interval=60, sys_heartbeat_interval=30)
    sys_pub = SysPublisher(node, settings, version="9.9", started_at=clock.time(),
                           stats=lambda: {"connections.count": node.connections})
    watcher, handle = connect(node, "watcher")
    node.subscribe(watcher, "$SYS/brokers/unit@host/#", SubOptions())
    hash_sub, hash_handle = connect(node, "hash")
    node.subscribe(hash_sub, "#", SubOptions())
    sys_pub.start()
    topics = [d.message.topic for d in handle.delivered]
    assert "$SYS/brokers/unit@host/version" in topics
    assert "$SYS/brokers/unit@host/stats/connections/count" in topics
    assert "$SYS/brokers/unit@host/uptime" in topics
    assert node.retainer.get("$SYS/brokers/unit@host/version") is not None
    assert node.retainer.get("$SYS/brokers").payload == b"unit@host"  # type: ignore[union-attr]
    handle.delivered.clear()
    connect(node, "newcomer")
    clock.advance(0)  # events go out on the next loop turn
    assert [d.message.topic for d in handle.delivered] == [
        "$SYS/brokers/unit@host/clients/newcomer/connected"]
    handle.delivered.clear()
    clock.advance(60)
    after_tick = [d.message.topic for d in handle.delivered]
    assert after_tick.count("$SYS/brokers/unit@host/uptime") == 2  # 30 s and 60 s
    assert "$SYS/brokers/unit@host/version" in after_tick
    assert hash_handle.delivered == []  # "#" never matches $SYS
    sys_pub.stop()
    handle.delivered.clear()
    clock.advance(120)
    assert handle.delivered == []


def test_sys_publisher_idle_node_counts_nothing() -> None:
    clock = VirtualScheduler()
    node = make_node(clock)
    SysPublisher(node, SysTopicsConfig(), version="1", started_at=0.0,
                 stats=lambda: {"connections.count": 0}).start()
    clock.advance(600)
    assert node.metrics.get("messages.received") == 0
    assert node.metrics.get("messages.dropped") == 0
    assert node.retainer.get("$SYS/brokers/unit@host/version") is not None


def test_discard_session_publishes_a_pending_will() -> None:
    clock = VirtualScheduler()
    node = make_node(clock)
    watcher, handle = connect(node, "w")
    node.subscribe(watcher, "will/#", SubOptions())
    will = Message("will/gone", b"bye", publisher="gone")
    info, h = connect(node, "gone", expiry=3600, will=will, will_delay=600)
    node.close(info, h, send_will=True)  # the will waits for its delay
    assert handle.delivered == []
    assert node.discard_session("gone") and "gone" not in node.sessions
    assert [d.message.topic for d in handle.delivered] == ["will/gone"]
    assert not node.discard_session("gone") and not node.discard_session("w")
