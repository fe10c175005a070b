"""A 2-worker gatewayd acts as one broker: connections spread over both workers (the
kernel's SO_REUSEPORT), messages cross between them at QoS 0/1/2, retained messages are
seen from both, a persistent session follows its client to whichever worker it lands on,
a worker killed with -9 is restarted, and systemd hears READY once, then watchdog pings."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.cluster.harness import Client, gatewayctl, wait_until
from tests.gateway.workers.harness import WorkerNode

pytestmark = pytest.mark.slow


@pytest.fixture
def node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[WorkerNode]:
    n = WorkerNode(tmp_path)
    try:
        n.start()
        yield n
    finally:
        code = n.stop()
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(f"----- gatewayd -----\n{n.log()[-12000:]}")
    assert code == (-9 if n.killed else 0), n.log()[-4000:]


def test_spread_cross_worker_qos_and_retained(node: WorkerNode) -> None:
    clients = [Client(node, f"spread-{k}") for k in range(16)]  # type: ignore[arg-type]
    def per_worker() -> list[int] | None:
        counts = [len(node.connected(i)) for i in (0, 1)]
        return counts if sum(counts) == 16 else None

    counts = wait_until(per_worker, what="16 clients listed")
    assert all(c > 0 for c in counts), counts  # the kernel spread them
    for c in clients:
        c.close()

    sub0 = node.client_on(0, "sub0").subscribe("x/#", 2)
    sub1 = node.client_on(1, "sub1").subscribe("x/#", 2)
    wait_until(lambda: node.routes_of(1, 0) >= 1 and node.routes_of(0, 1) >= 1,
               what="routes on both workers")
    pub0 = node.client_on(0, "pub0")
    pub1 = node.client_on(1, "pub1")
    for qos in (0, 1, 2):
        pub1.publish(f"x/from1/{qos}", f"a{qos}", qos=qos)
        pub0.publish(f"x/from0/{qos}", f"b{qos}", qos=qos)
    for sub in (sub0, sub1):
        got = sorted((m.topic, m.payload, m.qos) for m in sub.collect(6))
        assert got == sorted(
            [(f"x/from1/{q}", f"a{q}".encode(), q) for q in (0, 1, 2)]
            + [(f"x/from0/{q}", f"b{q}".encode(), q) for q in (0, 1, 2)]
        )
    pub1.publish("r/state", "kept", qos=1, retain=True)
    for i in (0, 1):  # the retained message is on both workers
        def retained_on(i: int = i) -> bool:
            c = node.client_on(i, f"ret{i}").subscribe("r/#", 1)
            try:
                m = c.next_message(2)
                return bool(m.retain and m.payload == b"kept")
            finally:
                c.close()
        wait_until(retained_on, what=f"retained message on worker {i}")
    for c in (sub0, sub1, pub0, pub1):
        c.close()


def test_persistent_session_follows_its_client(node: WorkerNode) -> None:
    roamer = Client(node, "roamer", clean=False, session_expiry=600)  # type: ignore[arg-type]
    roamer.subscribe("q/roam", 1)
    home = wait_until(lambda: node.where("roamer") is not None and (node.where("roamer"),),
                      what="roamer listed")[0]
    wait_until(lambda: node.routes_of(1 - home, home) >= 1, what="the route on the sibling")
    pub = Client(node, "roam-pub")  # type: ignore[arg-type]
    seen: set[int] = {home}
    k = 0
    while k < 20 and (len(seen) < 2 or k < 6):
        roamer.close()
        wait_until(lambda: node.where("roamer") is None, what="roamer offline")
        pub.publish("q/roam", f"m{k}", qos=1)  # queued for the offline session
        roamer = Client(node, "roamer", clean=False, session_expiry=600)  # type: ignore[arg-type]
        assert roamer.session_present
        m = roamer.next_message()
        assert (m.payload, m.qos) == (f"m{k}".encode(), 1)
        home = wait_until(lambda: node.where("roamer") is not None and (node.where("roamer"),),
                          what="roamer listed")[0]
        seen.add(home)
        # the session's route is where the session now is, on both workers' views
        wait_until(lambda h=home: node.routes_of(1 - h, h) >= 1, what="the route moved")
        k += 1
    assert seen == {0, 1}, f"the session never moved ({k} reconnects)"
    assert roamer.drain() == []  # each message exactly once
    roamer.close()
    pub.close()


def test_killed_worker_is_restarted(node: WorkerNode) -> None:
    victim = node.client_on(1, "victim")
    survivor = node.client_on(0, "survivor").subscribe("k/#", 1)
    old = node.kill_worker(1)
    assert victim.disconnected.wait(20)
    wait_until(lambda: "worker 1 exited (killed by SIGKILL): restarting" in node.log(),
               what="the supervisor noticing")
    wait_until(lambda: node.worker_pid(1) != old and node.worker_meshed(1)
               and node.worker_meshed(0), 60, "worker 1 back and meshed")
    wait_until(lambda: node.routes_of(1, 0) >= 1, what="worker 0's route on the new worker 1")
    victim.close()
    again = node.client_on(1, "victim")  # clients get back onto the restarted worker
    again.publish("k/back", "hello", qos=1)
    m = survivor.next_message()
    assert m.payload == b"hello"
    assert node.proc is not None and node.proc.poll() is None
    ready = [m for m in node.notify.all() if "READY=1" in m]
    assert len(ready) == 1, ready  # READY once, not again after a worker restart
    again.close()
    survivor.close()


def test_systemd_hears_one_service(node: WorkerNode) -> None:
    assert node.proc is not None
    # the API answers a moment before a worker's READY=1 reaches the supervisor; pings
    # go out from the supervisor's start
    def ready_and_ping() -> list[str] | None:
        msgs = node.notify.all()
        seen = ("READY=1" in m for m in msgs), ("WATCHDOG=1" in m for m in msgs)
        return msgs if all(any(s) for s in seen) else None

    msgs = wait_until(ready_and_ping, what="READY and a ping")
    ready = [m for m in msgs if "READY=1" in m]
    assert len(ready) == 1
    assert f"MAINPID={node.proc.pid}" in ready[0]
    assert "w0: " in ready[0] and "w1: " in ready[0]
    # worker API tokens are the node's: gatewayctl's file works against every worker
    assert node.http(1, "GET", "/api/v5/clients")[0] == 200


def test_sighup_reaches_every_worker(node: WorkerNode) -> None:
    assert node.proc is not None
    node.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: all(f"[w{i}] gateway authorization reloaded" in node.log()
                           for i in (0, 1)), what="both workers reloading")


def test_hung_worker_is_aborted_and_restarted(node: WorkerNode) -> None:
    """A worker whose loop stops (SIGSTOP: no watchdog pings) is aborted by the supervisor
    after a watchdog period (2 s here), killed when SIGABRT cannot land, and restarted."""
    old = node.worker_pid(0)
    os.kill(old, signal.SIGSTOP)
    try:
        wait_until(lambda: "worker 0 missed its watchdog" in node.log(), what="the abort")
        wait_until(lambda: node.worker_pid(0) != old, 30, "a new worker 0")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(old, signal.SIGCONT)
    wait_until(lambda: node.worker_meshed(0) and node.worker_meshed(1), 60, "mesh again")
    assert "worker 0 exited (killed by SIGKILL): restarting" in node.log()


def _connack(port: int, clientid: str, user: str = "", password: str = "") -> int | None:
    """CONNECT (MQTT 3.1.1) and the CONNACK return code; None if the broker closed."""
    def s(b: bytes) -> bytes:
        return len(b).to_bytes(2, "big") + b
    flags = 0x02 | (0x80 if user else 0) | (0x40 if password else 0)
    body = s(b"MQTT") + bytes([4, flags]) + (60).to_bytes(2, "big") + s(clientid.encode())
    if user:
        body += s(user.encode())
    if password:
        body += s(password.encode())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(bytes([0x10, len(body)]) + body)
        data = b""
        while len(data) < 4:
            chunk = sock.recv(4 - len(data))
            if not chunk:
                return None
            data += chunk
        return data[3]


def test_users_and_bans_are_shared(node: WorkerNode) -> None:
    """``gatewayctl users``/``ban`` write the node's gateway.db; every worker reads it."""
    env = {"GATEWAY_NODE__DATA_DIR": str(node.workdir / "data")}
    r = gatewayctl("users", "add", "alice", "--password", "secret-pw", "--iterations", "4096",
                   env=env)
    assert r.returncode == 0, r.stderr
    r = gatewayctl("ban", "add", "clientid", "evil", env=env)
    assert r.returncode == 0, r.stderr
    # 10 connections each: with SO_REUSEPORT both workers answer some of them
    wait_until(lambda: all(_connack(node.mqtt_port, "evil") != 0 for _ in range(10)),
               what="the ban on both workers")
    assert all(_connack(node.mqtt_port, f"a{k}", "alice", "secret-pw") == 0
               for k in range(10))
    assert all(_connack(node.mqtt_port, f"b{k}", "alice", "wrong") not in (0,)
               for k in range(10))


def test_shared_subscription_across_workers(node: WorkerNode) -> None:
    members = [node.client_on(i, f"member{i}").subscribe("$share/g/s/#", 1) for i in (0, 1)]
    wait_until(lambda: node.routes_of(0, 1) >= 1 and node.routes_of(1, 0) >= 1,
               what="the group's route on both workers")
    pub = Client(node, "share-pub")  # type: ignore[arg-type]
    for k in range(20):
        pub.publish(f"s/{k}", str(k), qos=1)
    got: list[list[bytes]] = [[], []]

    def arrived() -> bool:
        for i, c in enumerate(members):
            got[i].extend(m.payload for m in c.drain())
        return len(got[0]) + len(got[1]) >= 20

    wait_until(arrived, what="20 messages across the group")
    assert sorted(got[0] + got[1], key=int) == [str(k).encode() for k in range(20)]  # once
    assert got[0] and got[1], got  # both workers' members had a share
    for c in (*members, pub):
        c.close()


def test_workers_die_with_their_supervisor(node: WorkerNode) -> None:
    """The supervisor killed with -9 (outside systemd): its workers get SIGTERM and go."""
    assert node.proc is not None
    pids = node.worker_pids()
    assert len(pids) == 2
    node.killed = True
    node.proc.kill()
    node.proc.wait()

    def gone(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # zombie: exited
        except FileNotFoundError:
            return True

    wait_until(lambda: all(gone(p) for p in pids), 60, "the workers gone")


def test_one_process_to_two_workers_keeps_sessions(tmp_path: Path) -> None:
    """Worker 0 keeps the node's data_dir: a persistent session and its queued message
    from a single-process run are there when the node restarts with 2 workers."""
    single = WorkerNode(tmp_path, workers=1)
    try:
        single.start()
        keeper = Client(single, "keeper", clean=False, session_expiry=600)  # type: ignore[arg-type]
        keeper.subscribe("keep/#", 1)
        keeper.close()
        pub = Client(single, "keep-pub")  # type: ignore[arg-type]
        pub.publish("keep/1", "queued", qos=1)
        pub.close()
    finally:
        assert single.stop() == 0, single.log()[-4000:]
    double = WorkerNode(tmp_path, workers=2)
    try:
        double.start()
        keeper = Client(double, "keeper", clean=False, session_expiry=600)  # type: ignore[arg-type]
        assert keeper.session_present
        m = keeper.next_message()
        assert (m.topic, m.payload) == ("keep/1", b"queued")
        keeper.close()
    finally:
        assert double.stop() == 0, double.log()[-4000:]
