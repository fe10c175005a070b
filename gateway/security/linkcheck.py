"""Distribution-point CRLs and OCSP for the peers of cluster and bridge links.

A link (a bridge's connection to its upstream broker, a cluster link in either
direction) is judged by the same :class:`~gateway.security.revocation.RevocationGuard` as
a listener's clients, through :class:`LinkRevocation`: the owner calls
:meth:`LinkRevocation.check` right after the TLS handshake and before it sends its first
byte (a bridge's CONNECT, a cluster HELLO), and gets ``None`` (admitted) or the refusal
(``"revoked"``, ``"status unknown (...), fail_mode closed"``). An admitted link stays
watched: when the guard learns later that its peer is revoked (the distribution points'
``refresh_interval``, OCSP's ``cache_ttl``), the ``cut`` callback given to ``check`` is
called once with the reason.

CRL *files* of links are not handled here: OpenSSL checks them at the handshake and
:mod:`gateway.security.links` / :mod:`gateway.security.crlwatch` re-read them.

Invariants:

- ``check`` always returns (or is cancelled with its caller): a verdict that needs a
  fetch is bounded by ``[crl_cache] http_timeout`` / ``ocsp_check.http_timeout``; a
  link that went away meanwhile (``gone()`` true when the answer comes) gets ``"gone"``.
- ``cut`` is called at most once per link, and never for a link refused by ``check``.
- Refusals and cuts are logged (WARNING, the certificate's subject and serial) and counted
  by the guard (``tls.revoked.refused``, ``tls.revoked.disconnected``,
  ``tls.revocation.unknown``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography import x509

from gateway.security.revocation import GuardSettings, RevocationGuard

__all__ = ["LinkRevocation", "check_stream", "cluster_revocation", "link_guard_settings",
           "wanted"]


def link_guard_settings(tls: Any, crl_cache: Any) -> GuardSettings:
    """Guard settings of a link's ``tls`` table (``enable_crl_check``, ``ocsp_check``,
    ``cacertfile``) with ``[crl_cache]``. CRL files stay with OpenSSL (module doc)."""
    oc = tls.ocsp_check
    cacert: Path = tls.cacertfile
    return GuardSettings(
        crlfile=[], cacertfile=cacert,
        enable_crl_check=tls.enable_crl_check, refresh_interval=crl_cache.refresh_interval,
        http_timeout=crl_cache.http_timeout, capacity=crl_cache.capacity,
        crl_fail_mode=crl_cache.fail_mode, file_check_interval=crl_cache.file_check_interval,
        ocsp_enable=oc.enable, ocsp_url=oc.responder_url, ocsp_ttl=oc.cache_ttl,
        ocsp_timeout=oc.http_timeout, ocsp_fail_mode=oc.fail_mode,
    )


def wanted(tls: Any) -> bool:
    """Whether a link ``tls`` table asks for distribution points or OCSP."""
    return tls is not None and bool(getattr(tls, "enable_crl_check", False)
                                    or getattr(getattr(tls, "ocsp_check", None), "enable", False))


def cluster_revocation(config: Any, incr: Callable[[str], None]) -> LinkRevocation | None:
    """The cluster's checks when ``[cluster.tls]`` asks for distribution points or OCSP
    (not started); the cluster calls :func:`check_stream` when it dials and accepts."""
    tls = config.cluster.tls
    if not wanted(tls):
        return None
    return LinkRevocation("cluster", link_guard_settings(tls, config.crl_cache), incr=incr)


class _LinkPeer:
    """One link as the guard's :class:`~gateway.security.revocation.Peer`."""

    __slots__ = ("_address", "_cut", "_gone", "held", "ssl", "verdict")

    def __init__(self, ssl_object: Any, address: str, gone: Callable[[], bool],
                 cut: Callable[[str], None]) -> None:
        self.ssl = ssl_object
        self._address = address
        self._gone = gone
        self._cut: Callable[[str], None] | None = cut
        self.held = False
        self.verdict: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

    def certificate(self) -> x509.Certificate | None:
        der = self.ssl.getpeercert(binary_form=True) if self.ssl is not None else None
        return x509.load_der_x509_certificate(der) if der else None

    def gone(self) -> bool:
        if self._cut is None:
            return True
        if self._gone():
            if not self.verdict.done():  # the guard drops a gone peer: end the wait
                self.verdict.set_result("gone")
            return True
        return False

    def address(self) -> str:
        return self._address

    def ssl_object(self) -> Any:
        return self.ssl

    def hold(self) -> None:
        self.held = True

    def resume(self) -> None:
        if not self.verdict.done():
            self.verdict.set_result(None)

    def cut(self, live: bool, why: str) -> None:
        if not self.verdict.done():  # refused before the link was admitted
            self._cut = None
            self.verdict.set_result(why)
            return
        cut, self._cut = self._cut, None
        if cut is not None:
            cut(why)


class LinkRevocation:
    """The revocation checks of a family of links (one bridge, or the cluster): ``what``
    names it in log lines (``bridge b1``, ``cluster``). :meth:`start` on the loop,
    :meth:`close` at the end."""

    def __init__(self, what: str, settings: GuardSettings, *,
                 incr: Callable[[str], None] = lambda metric: None) -> None:
        kind, _, name = what.partition(" ")
        self.guard = RevocationGuard(name or kind, settings, incr=incr,
                                     kind=kind if name else "link")

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.guard.start(loop)

    def close(self) -> None:
        self.guard.close()

    async def check(self, ssl_object: Any, address: str, *, gone: Callable[[], bool],
                    cut: Callable[[str], None]) -> str | None:
        """Judge the peer certificate of a link just handshaken: None when admitted (then
        watched: ``cut(why)`` once it is found revoked), else why it is refused."""
        peer = _LinkPeer(ssl_object, address, gone, cut)
        self.guard.admit_peer(peer)
        if not peer.held and not peer.verdict.done():
            peer.verdict.set_result(None)  # decided from what is cached
        # the guard answers within its HTTP timeouts (or "gone", see _LinkPeer.gone)
        return await peer.verdict


async def check_stream(revocation: LinkRevocation | None, writer: asyncio.StreamWriter,
                       cut: Callable[[str], None] | None = None) -> str | None:
    """:meth:`LinkRevocation.check` for an asyncio stream link (a cluster link, dialled or
    accepted): None when admitted or when ``revocation`` is None. A later revocation
    calls ``cut`` (default: abort the transport, so the owner sees the link lost)."""
    if revocation is None:
        return None
    peer = writer.get_extra_info("peername")
    address = f"{peer[0]}:{peer[1]}" if peer else "?"

    def abort(why: str) -> None:
        writer.transport.abort()

    return await revocation.check(writer.get_extra_info("ssl_object"), address,
                                  gone=writer.is_closing, cut=cut or abort)
