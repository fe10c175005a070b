"""A CRL published while cluster links are up: SIGHUP cuts the live links of the revoked
node (real gatewayd processes over mutual TLS, certificates from ``gatewayctl certs``),
and the node cannot link again; the node that was not revoked stays linked."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.gateway.cluster.harness import Node, gatewayctl, make_pki, wait_mesh, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.security]


def test_sighup_cuts_the_live_links_of_a_revoked_node(tmp_path: Path) -> None:
    names = [f"{n}@127.0.0.1" for n in "abc"]
    ca = make_pki(tmp_path / "pki", names)
    assert gatewayctl("certs", "crl", ca).returncode == 0  # an empty CRL to start with
    crl = {"GATEWAY_CLUSTER__TLS__CRLFILE": str(ca / "crl.pem")}
    started: list[Node] = []
    try:
        a = Node(tmp_path, "a", ca, extra=crl).start()
        started.append(a)
        b = Node(tmp_path, "b", ca, seeds=[a]).start()
        started.append(b)
        c = Node(tmp_path, "c", ca, seeds=[a]).start()
        started.append(c)
        wait_mesh([a, b, c])
        assert gatewayctl("certs", "revoke", ca, "b@127.0.0.1").returncode == 0
        assert gatewayctl("certs", "crl", ca).returncode == 0
        assert a.state_of(b) == "up"  # a new CRL alone does not touch live links
        assert a.proc is not None
        a.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "CN=b@127.0.0.1" in a.log() and "link cut" in a.log(),
                   what="the cut in a's log")
        wait_until(lambda: a.state_of(b) not in ("up", "partial"), what="b down at a")
        # b dials again and is refused by the new CRL; c stays up throughout
        wait_until(lambda: a.log().count("TLS handshake failed") >= 1,
                   what="b's new link refused")
        assert a.state_of(b) not in ("up", "partial")
        assert a.state_of(c) == "up"
        assert "peer certificate revoked" not in c.log()
    finally:
        for n in started:
            n.stop()
