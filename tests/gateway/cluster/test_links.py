"""Links and membership between real gatewayd processes over mutual TLS.

A full mesh forms from seeds; a node whose certificate comes from another CA, or whose
certificate names another node, is refused and logged; join, leave and force-leave;
``gatewayctl cluster status``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gateway.cluster.harness import gatewayctl, wait_mesh, wait_until

pytestmark = pytest.mark.slow


def test_mesh_forms_from_seeds_and_status_reports_it(nodes) -> None:
    a = nodes("a")
    b = nodes("b", seeds=[a])
    c = nodes("c", seeds=[b])  # learns a through b
    wait_mesh([a, b, c])
    r = gatewayctl("cluster", "status", "--json", env=c.ctl_env())
    assert r.returncode == 0, r.stderr
    view = json.loads(r.stdout)
    assert view["enabled"] and view["self"] == c.name and view["nodes_up"] == 3
    peers = {m["node"]: m for m in view["members"] if not m["self"]}
    assert set(peers) == {a.name, b.name}
    for m in peers.values():
        assert m["status"] == "up" and m["role"] == "core"
        assert set(m["links"].values()) == {"up"}
        assert m["rtt_ms"] is not None
    r = gatewayctl("cluster", "status", env=c.ctl_env())
    assert r.returncode == 0 and a.name in r.stdout and "all up" in r.stdout


def test_foreign_ca_and_wrong_name_are_refused_and_logged(nodes, pki: Path) -> None:
    a = nodes("a")
    intruder = nodes("x", seeds=[a], cert_dir=pki.parent / "other",
                     cert_name="intruder@127.0.0.1")
    wait_until(lambda: "TLS handshake failed" in a.log(), what="refusal in a's log")
    # a certificate of our CA, but for another node name
    liar = nodes("d", seeds=[a], cert_name="b@127.0.0.1")
    wait_until(lambda: "is not the node name" in a.log(), what="name check in a's log")
    assert [m["node"] for m in a.cluster()["members"]] == [a.name]
    assert intruder.state_of(a) != "up" and liar.state_of(a) != "up"


def test_join_leave_and_force_leave(nodes) -> None:
    a = nodes("a")
    b = nodes("b")
    c = nodes("c")
    r = gatewayctl("cluster", "join", a.addr, env=b.ctl_env())
    assert r.returncode == 0, r.stderr
    r = gatewayctl("cluster", "join", f"127.0.0.1:{a.cluster_port}", env=c.ctl_env())
    assert r.returncode == 0, r.stderr  # by address only: the name is learnt
    wait_mesh([a, b, c])
    r = gatewayctl("cluster", "leave", env=c.ctl_env())
    assert r.returncode == 0, r.stderr
    wait_until(lambda: a.member(c.name) is None and b.member(c.name) is None,
               what="c forgotten")
    assert c.member(a.name) is None
    b.kill()
    wait_until(lambda: a.state_of(b) == "down", what="b down")
    r = gatewayctl("cluster", "force-leave", b.name, env=a.ctl_env())
    assert r.returncode == 0, r.stderr
    assert a.member(b.name) is None
