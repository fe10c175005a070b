"""A partition inside a network namespace the test creates (``unshare -n``): two nodes
whose cluster ports are on loopback addresses of their own (127.0.0.2, 127.0.0.3), their
MQTT and API ports on 127.0.0.1. The cut is made by the kernel, not by a proxy: policy
routing rules that black-hole every packet to either cluster address (``ip rule ...
blackhole``, consulted before the local table), so established links stall and new
dials fail, as on a real cut; the heal deletes the rules and TCP retransmits.

Asserted: each side finds the cut by its own heartbeat timeout and drops the other's
routes; QoS 1 messages acknowledged on both sides before and after the cut was noticed
reach the persistent subscribers on the other side exactly once after the heal; routes
converge (each side sees the other's route again); the replicated tables converge too
(a retained message written on both sides during the cut: the later one everywhere; a
ban made on one side reaches the other).

The test re-runs itself in a new network namespace (an inner pytest run under
``unshare -n``); it is skipped where namespaces cannot be created (not root, no
``unshare`` or ``ip``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gateway.cluster.harness import Client, Node, make_pki, wait_mesh, wait_until
from tests.gateway.cluster.test_tables import banned_in_db, ctl, retained

pytestmark = pytest.mark.slow

INNER = "GATEWAY_TEST_INSIDE_NETNS"
CUT = ["ip rule add pref 10 to 127.0.0.2 blackhole",
       "ip rule add pref 11 to 127.0.0.3 blackhole"]
HEAL = ["ip rule del pref 10", "ip rule del pref 11"]


def _sh(*commands: str) -> None:
    for c in commands:
        subprocess.run(c.split(), check=True, timeout=10)


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return False
    r = subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10)
    return r.returncode == 0


def test_partition_in_a_network_namespace(tmp_path: Path) -> None:
    if os.environ.get(INNER) != "1":
        if not _can_unshare():
            pytest.skip("cannot create a network namespace (needs root, unshare and ip)")
        here = Path(__file__).resolve()
        root = here.parents[3]
        r = subprocess.run(
            ["unshare", "-n", "--", sys.executable, "-m", "pytest", "-q", "-x",
             "-p", "no:cacheprovider", f"{here}::test_partition_in_a_network_namespace",
             "--basetemp", str(tmp_path / "inner")],
            cwd=root, env={**os.environ, INNER: "1"}, capture_output=True, text=True,
            timeout=240,
        )
        assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-4000:]
        assert " passed" in r.stdout, r.stdout[-4000:]
        return
    inside(tmp_path)


def inside(tmp_path: Path) -> None:
    """The test proper, in the new namespace (only its loopback interface)."""
    _sh("ip link set lo up",
        # the local table after the cut rules, so they see loopback traffic too
        "ip rule del pref 0", "ip rule add pref 100 lookup local")
    pki = make_pki(tmp_path / "pki", ["a@127.0.0.2", "b@127.0.0.3"])
    fast = {"GATEWAY_CLUSTER__HEARTBEAT_TIMEOUT": "2s"}
    a = Node(tmp_path, "a", pki, host="127.0.0.2", extra=fast)
    b = Node(tmp_path, "b", pki, host="127.0.0.3", seeds=[a], extra=fast)
    made = [a.start(), b.start()]
    clients: list[Client] = []
    try:
        wait_mesh([a, b])
        subs = {}
        for n in (a, b):
            c = Client(n, f"sub-{n.short}", clean=False, session_expiry=600)
            clients.append(c.subscribe(f"to/{n.short}", qos=1))
            subs[n.short] = c
        pubs = {n.short: Client(n, f"pub-{n.short}") for n in (a, b)}
        clients.extend(pubs.values())
        wait_until(lambda: a.remote_routes(b) == 1 and b.remote_routes(a) == 1,
                   what="each side's route on the other")

        def publish(tag: str) -> None:  # acknowledged (PUBACK) on the publisher's side
            for src, dst in (("a", "b"), ("b", "a")):
                for i in range(3):
                    pubs[src].publish(f"to/{dst}", f"{tag}-{src}{i}", qos=1)

        _sh(*CUT)
        publish("cut")  # before either side noticed
        wait_until(lambda: a.state_of(b) == "down" and b.state_of(a) == "down",
                   what="each side finds the cut by its heartbeat timeout")
        assert a.remote_routes(b) == 0 and b.remote_routes(a) == 0
        publish("noticed")  # queued durably for the parked routes
        pubs["a"].publish("cfg/x", "a", qos=1, retain=True)
        ctl(a, "ban", "add", "clientid", "cut-a")
        pubs["b"].publish("cfg/x", "b", qos=1, retain=True)  # later: wins
        _sh(*HEAL)
        wait_mesh([a, b], timeout=30)
        wait_until(lambda: a.remote_routes(b) == 1 and b.remote_routes(a) == 1,
                   what="routes converge after the heal")
        for dst, src in (("a", "b"), ("b", "a")):
            want = sorted(f"{t}-{src}{i}" for t in ("cut", "noticed") for i in range(3))
            got = sorted(m.payload.decode() for m in subs[dst].collect(len(want), 30))
            assert got == want, (dst, got)
        for n in (a, b):  # the tables converged: later retained write, ban everywhere
            wait_until(lambda n=n: retained(n, "cfg/x", f"r-{n.short}") == "b",
                       what=f"retained converged on {n.short}")
            wait_until(lambda n=n: banned_in_db(n, "clientid", "cut-a"), what="ban on both")
        # and nothing twice: one more message each way arrives alone
        publish("after")
        for dst, src in (("a", "b"), ("b", "a")):
            got = sorted(m.payload.decode() for m in subs[dst].collect(3))
            assert got == [f"after-{src}{i}" for i in range(3)], (dst, got)
            assert subs[dst].drain() == []
    finally:
        for c in clients:
            c.close()
        for n in made:
            n.stop()
