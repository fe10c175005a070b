"""A CRL published while cluster and bridge links are up: SIGHUP, or the CRL file
changing on disk with no signal, cuts the live links of the revoked peer (real gatewayd
processes over mutual TLS, mosquitto upstream, certificates from ``gatewayctl certs``),
and the peer cannot link again; a peer that was not revoked stays linked. A half-written
CRL file is refused with one ERROR line and cuts nothing."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.gateway.bridge.support import Gatewayd, Mosquitto, needs_mosquitto
from tests.gateway.bridge.test_upstream import bridge_config, make_certs
from tests.gateway.cluster.harness import Node, gatewayctl, make_pki, wait_mesh, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.security]


def test_sighup_cuts_the_live_links_of_a_revoked_node(
        tmp_path: Path, nodes: Callable[..., Node]) -> None:
    names = [f"{n}@127.0.0.1" for n in "abc"]
    ca = make_pki(tmp_path / "pki", names)
    assert gatewayctl("certs", "crl", ca).returncode == 0  # an empty CRL to start with
    # file watching practically off: only SIGHUP can make the change known
    crl = {"GATEWAY_CLUSTER__TLS__CRLFILE": str(ca / "crl.pem"),
           "GATEWAY_CRL_CACHE__FILE_CHECK_INTERVAL": "3600"}
    a = nodes("a", pki=ca, extra=crl)
    b = nodes("b", pki=ca, seeds=[a])
    c = nodes("c", pki=ca, seeds=[a])
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


def publish_half_then_whole(src: Path, dst: Path, wait_refused: object) -> None:
    """Write the first half of ``src`` over ``dst`` (a writer caught half-way), call
    ``wait_refused()``, then put the whole file in place by a rename."""
    whole = src.read_bytes()
    dst.write_bytes(whole[: len(whole) // 2])
    wait_refused()  # type: ignore[operator]
    tmp = dst.with_suffix(".tmp")
    tmp.write_bytes(whole)
    os.replace(tmp, dst)


def test_a_changed_crl_file_cuts_the_cluster_link_of_a_revoked_node(
        tmp_path: Path, nodes: Callable[..., Node]) -> None:
    """No signal: a's ``[cluster.tls] crlfile`` is rewritten; the watch reloads it."""
    names = [f"{n}@127.0.0.1" for n in "ab"]
    ca = make_pki(tmp_path / "pki", names)
    assert gatewayctl("certs", "crl", ca).returncode == 0
    live_crl = tmp_path / "live-crl.pem"
    live_crl.write_bytes((ca / "crl.pem").read_bytes())
    env = {"GATEWAY_CLUSTER__TLS__CRLFILE": str(live_crl),
           "GATEWAY_CRL_CACHE__FILE_CHECK_INTERVAL": "0.2"}
    a = nodes("a", pki=ca, extra=env)
    b = nodes("b", pki=ca, seeds=[a])
    wait_mesh([a, b])
    assert gatewayctl("certs", "revoke", ca, "b@127.0.0.1").returncode == 0
    assert gatewayctl("certs", "crl", ca).returncode == 0
    publish_half_then_whole(ca / "crl.pem", live_crl, lambda: wait_until(
        lambda: "cluster TLS not reloaded" in a.log(), what="the half CRL refused"))
    wait_until(lambda: "CN=b@127.0.0.1" in a.log() and "link cut" in a.log(),
               what="the cut in a's log")
    wait_until(lambda: a.state_of(b) not in ("up", "partial"), what="b down at a")
    wait_until(lambda: a.log().count("TLS handshake failed") >= 1,
               what="b's new link refused")
    assert a.log().count("cluster TLS not reloaded") == 1
    assert "live links not checked" not in a.log()  # one line for the half file


@needs_mosquitto
@pytest.mark.parametrize("how", ["sighup", "file"])
def test_a_bridge_whose_upstream_is_revoked_is_cut(tmp_path: Path, how: str) -> None:
    """A bridge to mosquitto over TLS with a crlfile: the upstream's certificate is
    revoked while the bridge is connected; SIGHUP, or the CRL file rewritten (first
    half-written: refused, the bridge stays up), cuts the link and the reconnection is
    refused (the bridge says why); messages wait in the outbox."""
    pki = tmp_path / "pki"
    make_certs(pki)
    assert gatewayctl("certs", "crl", pki).returncode == 0
    crlfile = pki / "crl.pem"
    interval = "1h"  # sighup: file watching practically off, only the signal tells
    if how == "file":
        interval = "200ms"
        crlfile = tmp_path / "live-crl.pem"
        crlfile.write_bytes((pki / "crl.pem").read_bytes())
    mosq = Mosquitto(tmp_path / "mosquitto", tls={
        "cafile": pki / "ca.crt", "certfile": pki / "upstream.crt",
        "keyfile": pki / "upstream.key"}).start()
    gw: Gatewayd | None = None
    try:
        assert mosq.tls_port is not None
        gw = Gatewayd(tmp_path / "gw", bridge_config(mosq.tls_port, "v4", f"""
[bridges.mqtt.cloud.tls]
enable = true
cacertfile = "{pki / "ca.crt"}"
crlfile = ["{crlfile}"]
server_name_indication = "localhost"
[crl_cache]
file_check_interval = "{interval}"
""")).start()
        gw.wait_bridge("connected", lambda b: b["status"] == "connected")
        assert gatewayctl("certs", "revoke", pki, "upstream").returncode == 0
        assert gatewayctl("certs", "crl", pki).returncode == 0
        assert gw.proc is not None
        if how == "sighup":
            gw.proc.send_signal(signal.SIGHUP)
        else:
            running = gw

            def refused() -> None:
                wait_until(lambda: "bridges.mqtt.cloud.tls.crlfile" in running.log(),
                           what="the half CRL refused")
                assert running.wait_bridge("still up", lambda b: b["status"] == "connected")

            publish_half_then_whole(pki / "crl.pem", crlfile, refused)
        wait_until(lambda: "bridge cloud: peer certificate CN=upstream" in gw.log(),  # type: ignore[union-attr]
                   what="the cut in the log")
        # the next attempt's handshake refuses the upstream (the new CRL)
        view = gw.wait_bridge("refused again", lambda b: b["status"] != "connected"
                              and "certificate verif" in (b["last_error"] or ""))
        assert view["connects"] == 1 and "revoked" in view["last_error"], view
        if how == "file":
            assert gw.log().count("live links not checked") == 1  # the half file, once
    finally:
        if gw is not None:
            gw.stop()
        mosq.stop()
