"""Replicants link to one core (real gatewayd nodes on loopback): the replicant dials
exactly one core, takes the cluster's routes through it, its publishes reach every node
and every node's publishes reach its subscribers; when its core is killed (-9) it attaches
to another core and delivery goes on. With and without ``cluster.raft``."""

from __future__ import annotations

import json
import queue
from collections.abc import Callable
from typing import Any

import pytest

from tests.gateway.cluster.harness import (
    Client,
    Node,
    free_port,
    gatewayctl,
    wait_mesh,
    wait_until,
)

pytestmark = pytest.mark.slow


def attached(r: Node) -> str | None:
    view = r.cluster()["replicant"] or {}
    if view.get("state") != "normal":
        return None
    core = view.get("core")
    return str(core) if core else None


def links_up(node: Node) -> set[str]:
    """The members ``node`` has a link (either way) with."""
    out = set()
    for m in node.cluster()["members"]:
        if not m["self"] and "up" in m["links"].values():
            out.add(m["node"])
    return out


def check_delivery(pub_nodes: list[Node], subs: dict[str, Client], tag: str) -> None:
    """Each node in ``pub_nodes`` publishes one QoS 1 message; every subscriber gets
    each one exactly once."""
    pubs = [Client(n, f"pub-{tag}-{n.short}") for n in pub_nodes]
    try:
        for p, n in zip(pubs, pub_nodes, strict=True):
            p.publish("r/x", f"{tag} from {n.short}", qos=1)
        want = sorted(f"{tag} from {n.short}" for n in pub_nodes)
        for name, sub in subs.items():
            got = sorted(m.payload.decode() for m in sub.collect(len(want)))
            assert got == want, (name, got)
    finally:
        for p in pubs:
            p.close()


def check_takeover_and_shared(r: Node, core: Node, others: list[Node]) -> None:
    """A session on the replicant taken over on another core (two hops: its core relays
    the takeover); a shared group with members on the replicant and on another core:
    each message to exactly one of them, whichever node publishes."""
    far = others[0]
    mover = Client(r, "mover", clean=False, session_expiry=600).subscribe("mv/t", qos=1)
    mover.close()
    watcher = Client(r, "watcher").subscribe("mv/t")  # says when it reached the replicant
    wait_until(lambda: far.remote_routes(core) == 3, what="the mover's route on the far core")
    pub = Client(far, "pub-mover")
    pub.publish("mv/t", "queued", qos=1)
    pub.close()
    assert watcher.next_message().payload == b"queued"
    watcher.close()
    moved = Client(far, "mover", clean=False, session_expiry=600)
    try:
        assert moved.session_present
        assert moved.next_message().payload == b"queued"
    finally:
        moved.close()

    members = {n.short: Client(n, f"member-{n.short}").subscribe("$share/g/sh/#", qos=1)
               for n in (r, far)}
    arrived: queue.Queue[Any] = queue.Queue()  # what either member receives
    for m in members.values():
        m.messages = arrived
    try:
        wait_until(lambda: far.remote_routes(core) == 3 and r.remote_routes(core) == 3,
                   what="the group known on both sides")
        sent = []
        for n in (r, core, far):
            p = Client(n, f"pub-sh-{n.short}")
            for i in range(4):
                p.publish(f"sh/{n.short}", f"{n.short}{i}", qos=1)
                sent.append(f"{n.short}{i}")
            p.close()
        got = [arrived.get(timeout=20.0).payload.decode() for _ in sent]
        assert sorted(got) == sorted(sent)
    finally:
        for m in members.values():
            m.close()


@pytest.mark.parametrize("raft", [False, True], ids=["announced", "raft"])
def test_replicant_attaches_to_one_core_and_switches_when_it_dies(
        nodes: Callable[..., Node], raft: bool) -> None:
    ports = {s: free_port() for s in "abc"}
    seeds = ",".join(f"{s}@127.0.0.1:{p}" for s, p in ports.items())
    env = {"GATEWAY_CLUSTER__SEEDS": seeds,
           **({"GATEWAY_CLUSTER__RAFT": "true"} if raft else {})}
    cores = {s: nodes(s, cluster_port=ports[s], extra=env) for s in "abc"}
    wait_mesh(list(cores.values()))
    r = nodes("e", role="replicant", extra=env)
    core_name = wait_until(lambda: attached(r), what="the replicant attached to a core")
    core = next(c for c in cores.values() if c.name == core_name)
    others = [c for c in cores.values() if c is not core]
    # exactly one core: links with its core only, and no other core links with it
    wait_until(lambda: links_up(r) == {core.name}, what="links to the one core only")
    assert all(r.name not in links_up(c) for c in others)
    assert core.cluster()["replicants"] == [r.name]
    view: dict[str, Any] = r.cluster()["replicant"]
    assert view["lag"] == 0 and view["switches"] == 0
    text = gatewayctl("cluster", "status", env=r.ctl_env())
    assert text.returncode == 0, text.stderr
    assert "Attached to" in text.stdout and core.name in text.stdout, text.stdout

    subs = {n.short: Client(n, f"sub-{n.short}").subscribe("r/#", qos=1)
            for n in [r, *cores.values()]}
    subs[r.short].subscribe("only/on/replicant")
    try:
        # every node (the replicant included) sees the others' routes, through its core
        for n in [r, *cores.values()]:
            wait_until(lambda n=n: n.cluster()["routes"]["remote"] >= 1,
                       what=f"routes on {n.short}")
        wait_until(lambda: all(o.remote_routes(core) == 2 for o in others),
                   what="the replicant's route announced by its core")
        check_delivery([r, *cores.values()], subs, "before")
        check_takeover_and_shared(r, core, others)
        if raft:
            dev = Client(r, "dev-on-replicant", clean=False, session_expiry=600)
            dev.close()
            wait_until(lambda: all(c.cluster()["raft"]["sessions"] >= 5
                                   for c in cores.values())
                       and r.cluster()["raft"]["state"] == "normal"
                       and r.cluster()["raft"]["sessions"] >= 5,
                       what="the replicant's session claimed through its core")

        core.kill()
        subs.pop(core.short).close()
        new = wait_until(lambda: (a := attached(r)) not in (None, core.name) and a,
                         what="the replicant attached to another core")
        assert new in {o.name for o in others}
        out = gatewayctl("cluster", "status", "--json", env=r.ctl_env())
        assert out.returncode == 0, out.stderr
        view = json.loads(out.stdout)["replicant"]
        assert view["core"] == new and view["switches"] == 1 and view["lag"] == 0
        wait_until(lambda: links_up(r) == {new}, what="links to the new core only")
        if raft:
            wait_until(lambda: r.cluster()["raft"]["state"] == "normal"
                       and r.cluster()["raft"]["core"] == new, what="the log from the new core")
        # the replicant's route reaches the other core through the new one
        new_core = next(x for x in others if x.name == new)
        # (its own keys plus the replicant's one key that no core has)
        wait_until(lambda: all(o.remote_routes(new_core)
                               == new_core.cluster()["routes"]["local"] + 1
                               for o in others if o is not new_core),
                   what="the replicant's route re-announced by its new core")
        check_delivery([r, *others], subs, "after")
        # the replicant leaves: its core forgets it and withdraws its route
        status, body = r.http("POST", "/api/v5/cluster/leave")
        assert status in (200, 204), body
        # once the leave is answered, the replicant's own view has no core (it waited
        # for its links to that core to close)
        assert r.cluster()["replicant"]["core"] is None
        wait_until(lambda: new_core.cluster()["replicants"] == []
                   and all(o.remote_routes(new_core) == new_core.cluster()["routes"]["local"]
                           for o in others if o is not new_core),
                   what="the replicant's route withdrawn after its leave")
    finally:
        for c in subs.values():
            c.close()
