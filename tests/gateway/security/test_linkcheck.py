""":class:`gateway.security.linkcheck.LinkRevocation` on a real loop against a real CRL
HTTP server: the verdict before the first byte, a later cut, and a link that goes away
while its verdict is fetched (the bridge end to end: test_link_revocation.py)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from gateway.security.ca_revoke import make_crl, revoke
from gateway.security.linkcheck import LinkRevocation
from gateway.security.pki import init_ca, issue
from gateway.security.revocation import GuardSettings
from tests.gateway.net.conftest import free_port
from tests.gateway.net.test_revocation import CrlServer

pytestmark = pytest.mark.security


class PeerSsl:
    """What the check reads of a handshaken link: its peer certificate (DER), as
    ``ssl.SSLObject.getpeercert(binary_form=True)`` gives it."""

    def __init__(self, der: bytes) -> None:
        self.der = der

    def getpeercert(self, binary_form: bool = False) -> bytes:
        assert binary_form
        return self.der


def der_of(path: Path) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    return x509.load_pem_x509_certificate(path.read_bytes()).public_bytes(Encoding.DER)


@pytest.fixture
def ca(tmp_path: Path):
    port = free_port()
    d = tmp_path / "ca"
    init_ca(d)
    for name in ("up1", "up2"):
        issue(d, name, server=True, crl_urls=[f"http://127.0.0.1:{port}/crl.pem"])
    make_crl(d)
    return d, port


def test_verdicts_and_a_later_cut(ca) -> None:
    d, port = ca
    server = CrlServer(d / "crl.pem", port)
    metrics: list[str] = []

    async def run() -> None:
        rev = LinkRevocation("bridge t", GuardSettings(crlfile=[], cacertfile=d / "ca.crt",
                                                       enable_crl_check=True),
                             incr=metrics.append)
        rev.start(asyncio.get_running_loop())
        cut = asyncio.Event()
        why: list[str] = []

        def on_cut(reason: str) -> None:
            why.append(reason)
            cut.set()

        assert await rev.check(PeerSsl(der_of(d / "up1.crt")), "127.0.0.1:1",
                               gone=lambda: False, cut=on_cut) is None
        assert server.requests == 1
        revoke(d, "up1", "keyCompromise")
        make_crl(d)
        rev.guard._refresh_dp()  # what the refresh_interval timer runs
        await asyncio.wait_for(cut.wait(), 10)
        assert why == ["revoked (CRL distribution point)"]
        # from the cache now: refused at once, never cut afterwards
        assert await rev.check(PeerSsl(der_of(d / "up1.crt")), "127.0.0.1:2",
                               gone=lambda: False, cut=on_cut) == "revoked"
        assert await rev.check(PeerSsl(der_of(d / "up2.crt")), "127.0.0.1:3",
                               gone=lambda: False, cut=on_cut) is None
        rev.close()

    try:
        asyncio.run(run())
    finally:
        server.close()
    assert "tls.revoked.disconnected" in metrics and "tls.revoked.refused" in metrics


def test_a_link_gone_while_its_verdict_is_fetched(ca) -> None:
    d, port = ca
    gate = threading.Event()
    server = CrlServer(d / "crl.pem", port, gate)

    async def run() -> None:
        rev = LinkRevocation("cluster", GuardSettings(crlfile=[], cacertfile=d / "ca.crt",
                                                      enable_crl_check=True))
        rev.start(asyncio.get_running_loop())
        gone = False
        cuts: list[str] = []
        task = asyncio.ensure_future(rev.check(PeerSsl(der_of(d / "up1.crt")), "x",
                                               gone=lambda: gone, cut=cuts.append))
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, server.asked.wait, 10)
        assert not task.done()  # held until the CRL comes
        gone = True
        gate.set()
        assert await asyncio.wait_for(task, 10) == "gone"
        assert cuts == []
        rev.close()

    try:
        asyncio.run(run())
    finally:
        gate.set()
        server.close()
