"""Distribution-point CRLs and OCSP for bridge links: a real gatewayd bridging to
Debian's mosquitto over TLS, the upstream's certificate naming a CRL HTTP server and an
``openssl ocsp`` responder the test runs (gateway/security/linkcheck.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.security.ca_revoke import make_crl, revoke
from gateway.security.pki import init_ca, issue
from tests.gateway.bridge.support import Gatewayd, Mosquitto, needs_mosquitto, wait_until
from tests.gateway.bridge.test_upstream import bridge_config
from tests.gateway.cluster.harness import Node
from tests.gateway.net.conftest import free_port
from tests.gateway.net.test_revocation import CrlServer, OcspResponder, needs_openssl

pytestmark = [pytest.mark.slow, pytest.mark.security]


def upstream_pki(pki: Path, *, crl_url: str | None = None, ocsp: str | None = None) -> None:
    init_ca(pki)
    issue(pki, "upstream", server=True, crl_urls=[crl_url] if crl_url else (), ocsp_url=ocsp)
    make_crl(pki)


def start(tmp_path: Path, pki: Path, tls_extra: str, crl_cache: str = "") -> tuple[
        Mosquitto, Gatewayd]:
    mosq = Mosquitto(tmp_path / "mosquitto", tls={
        "cafile": pki / "ca.crt", "certfile": pki / "upstream.crt",
        "keyfile": pki / "upstream.key"}).start()
    assert mosq.tls_port is not None
    gw = Gatewayd(tmp_path / "gw", bridge_config(mosq.tls_port, "v4", f"""
[bridges.mqtt.cloud.tls]
enable = true
cacertfile = "{pki / "ca.crt"}"
server_name_indication = "localhost"
{tls_extra}
[crl_cache]
{crl_cache}
"""))
    return mosq, gw.start()


def refused_again(gw: Gatewayd, why: str, connects: int = 1) -> dict:
    """Attempts refused after the handshake (backoff, retried), CONNECT not sent."""
    view = gw.wait_bridge("refused after the handshake", lambda b: b["status"] != "connected"
                          and why in (b["last_error"] or "") and b["attempts"] >= 3)
    assert view["connects"] == connects, view  # CONNECT never went out (again)
    return view


@needs_mosquitto
def test_bridge_upstream_cut_and_refused_by_its_distribution_point(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    port = free_port()  # the URL is in the certificate before the server runs
    upstream_pki(pki, crl_url=f"http://127.0.0.1:{port}/crl.pem")
    server = CrlServer(pki / "crl.pem", port)
    mosq, gw = start(tmp_path, pki, "enable_crl_check = true", 'refresh_interval = "1s"')
    try:
        gw.wait_bridge("connected", lambda b: b["status"] == "connected")
        assert server.requests >= 1  # fetched before CONNECT
        revoke(pki, "upstream", "keyCompromise")
        make_crl(pki)  # the next refresh fetches it and cuts the live link
        wait_until("the cut in the log", lambda: "bridge cloud: disconnected CN=upstream"
                   in gw.log())
        refused_again(gw, "upstream certificate revoked")
        log = gw.log()
        assert "certificate revoked (CRL distribution point)" in log
        assert "bridge cloud: refused CN=upstream" in log
    finally:
        gw.stop()
        mosq.stop()
        server.close()


@needs_mosquitto
def test_bridge_unreachable_distribution_point_fail_closed_then_open(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    upstream_pki(pki, crl_url=f"http://127.0.0.1:{free_port()}/crl.pem")  # nobody listens
    mosq, gw = start(tmp_path, pki, "enable_crl_check = true", 'http_timeout = "1s"')
    try:
        refused_again(gw, "fail_mode closed", connects=0)
    finally:
        gw.stop()
        mosq.stop()
    mosq, gw = start(tmp_path / "open", pki, "enable_crl_check = true",
                     'http_timeout = "1s"\nfail_mode = "open"')
    try:
        gw.wait_bridge("connected", lambda b: b["status"] == "connected")
        assert "admitted (fail_mode open)" in gw.log()
    finally:
        gw.stop()
        mosq.stop()


@needs_mosquitto
@needs_openssl
def test_bridge_upstream_checked_by_ocsp_and_cut_when_revoked(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    port = free_port()
    upstream_pki(pki, ocsp=f"http://127.0.0.1:{port}")
    responder = OcspResponder(pki, port)
    mosq, gw = start(tmp_path, pki, '[bridges.mqtt.cloud.tls.ocsp_check]\nenable = true\n'
                     'cache_ttl = "1s"')
    try:
        gw.wait_bridge("connected", lambda b: b["status"] == "connected")
        revoke(pki, "upstream", "keyCompromise")
        responder.close()  # openssl ocsp reads index.txt when it starts
        responder = OcspResponder(pki, port)
        wait_until("the cut in the log", lambda: "bridge cloud: disconnected CN=upstream"
                   in gw.log())
        refused_again(gw, "upstream certificate revoked")
        assert "certificate revoked (OCSP)" in gw.log()
    finally:
        gw.stop()
        mosq.stop()
        responder.close()


def test_check_refuses_link_revocation_without_a_ca(tmp_path: Path) -> None:
    """``gatewayd --check``: enable_crl_check on a bridge without cacertfile, or API
    stapling without HTTPS, is one line naming the key, exit 2."""
    import subprocess
    import sys

    def check(toml: str) -> subprocess.CompletedProcess[str]:
        conf = tmp_path / "gw.toml"
        conf.write_text(toml)
        return subprocess.run([sys.executable, "-m", "gateway.cli.gatewayd", "--config",
                               str(conf), "--check"], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin"}, timeout=60, check=False)

    bad = check('[bridges.mqtt.cloud]\nserver = "127.0.0.1:8883"\n'
                "[bridges.mqtt.cloud.tls]\nenable = true\nenable_crl_check = true\n")
    assert bad.returncode == 2, bad
    assert "enable_crl_check and ocsp_check need" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    api = check('[api.ocsp]\nenable_ocsp_stapling = true\nresponder_url = "http://x"\n'
                'issuer_pem = "/etc/hostname"\n')
    assert api.returncode == 2 and "ocsp.enable_ocsp_stapling needs certfile" in api.stderr


@needs_openssl
@pytest.mark.parametrize("source", ["crl", "ocsp"])
def test_cluster_peer_cut_and_refused_by_revocation(
        tmp_path: Path, source: str, nodes: Callable[..., Node]) -> None:
    """Node a checks its peers' distribution points or OCSP (b does not): b's certificate
    revoked → a's next refresh/re-check cuts b's links; b's redials are refused by a
    after the handshake (accept side) and a's own dials to b are refused before HELLO
    (dial side)."""
    from tests.gateway.cluster.harness import gatewayctl, make_pki, wait_mesh
    from tests.gateway.cluster.harness import wait_until as wait_for

    port = free_port()
    names = [f"{n}@127.0.0.1" for n in "ab"]
    ca = make_pki(tmp_path / "pki", [])
    where = (["--crl-url", f"http://127.0.0.1:{port}/crl.pem"] if source == "crl"
             else ["--ocsp-url", f"http://127.0.0.1:{port}"])
    for name in names:  # node certificates naming the CRL server / OCSP responder
        r = gatewayctl("certs", "issue", ca, name, "--server-client", *where)
        assert r.returncode == 0, r.stderr
    assert gatewayctl("certs", "crl", ca).returncode == 0
    closers: list[Any] = [CrlServer(ca / "crl.pem", port) if source == "crl"
                          else OcspResponder(ca, port)]
    env = ({"GATEWAY_CLUSTER__TLS__ENABLE_CRL_CHECK": "true",
            "GATEWAY_CRL_CACHE__REFRESH_INTERVAL": "1"} if source == "crl" else
           {"GATEWAY_CLUSTER__TLS__OCSP_CHECK__ENABLE": "true",
            "GATEWAY_CLUSTER__TLS__OCSP_CHECK__CACHE_TTL": "1"})
    try:
        a = nodes("a", pki=ca, extra=env)
        b = nodes("b", pki=ca, seeds=[a])
        wait_mesh([a, b])
        assert gatewayctl("certs", "revoke", ca, "b@127.0.0.1").returncode == 0
        assert gatewayctl("certs", "crl", ca).returncode == 0
        if source == "ocsp":  # openssl ocsp reads index.txt when it starts
            closers.pop().close()
            closers.append(OcspResponder(ca, port))
        wait_for(lambda: "cluster: disconnected CN=b@127.0.0.1" in a.log(),
                 what="the cut in a's log")
        wait_for(lambda: "cluster: refused b@127.0.0.1 from" in a.log()
                 and "peer certificate revoked" in a.log(), what="b's redial refused")
        wait_for(lambda: "HandshakeError: peer certificate revoked" in a.log(),
                 what="a's dial to b refused before HELLO")
        assert a.state_of(b) not in ("up", "partial")
        why = "CRL distribution point" if source == "crl" else "OCSP"
        assert f"certificate revoked ({why})" in a.log()
    finally:
        for c in closers:
            c.close()
