"""Live cluster and bridge links checked again against their CRL files (SIGHUP, and
when a CRL file changes: :mod:`gateway.security.crlwatch`).

A link's TLS handshake checks the CRLs its context held when it was made; a CRL published
later (``gatewayctl certs revoke`` then ``certs crl``, then SIGHUP) reaches new links
only, because the owner rebuilds its context. :func:`recheck_links` closes the gap: it
reads the CRL files of ``[cluster.tls]`` and of each bridge's ``tls`` again and cuts every
live link whose peer certificate one of them revokes, through the link's own ``close``
(the cluster then marks the peer down and redials it, which the new CRL refuses; a bridge
reconnects with a client context rebuilt here, which refuses it too).

Invariants:

- Only CRLs signed by a CA of the section's ``cacertfile`` count (as at the handshake);
  a CRL file that cannot be read or checked cuts nothing and is logged (ERROR): the
  previous state stays, as for every SIGHUP failure.
- Each cut is logged (WARNING, with the peer certificate's subject and serial) and
  counted: ``tls.revoked.disconnected``, as for a listener's client.
- A link without a peer certificate (plain TCP, or one that is closing) is left alone.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from gateway.net.tls import TlsError, check_crl, crl_status, load_certificates, load_crls

__all__ = ["LiveLink", "cut_revoked", "recheck_bridge", "recheck_cluster", "recheck_links"]

log = logging.getLogger("gateway.security.links")


@dataclass(frozen=True, slots=True)
class LiveLink:
    """An open TLS link: what to call it in the log, its ``ssl.SSLObject`` (None when it
    has none) and how to cut it."""

    what: str
    ssl_object: Any
    close: Callable[[str], None]


def cut_revoked(links: Iterable[LiveLink], crlfile: list[Path], cacertfile: Path | None,
                *, key: str, incr: Callable[[str], None]) -> int:
    """Cut the links whose peer certificate a CRL of ``crlfile`` revokes; how many were
    cut. ``key`` names the section in log lines (``cluster.tls``). Raises
    :class:`TlsError` when the files cannot be used (nothing is cut then)."""
    if not crlfile:
        return 0
    if cacertfile is None:
        raise TlsError(f"{key}.crlfile", "crlfile needs cacertfile (the CA that signs the CRLs)")
    cas = load_certificates(f"{key}.cacertfile", cacertfile)
    crls = []
    for path, crl in load_crls(f"{key}.crlfile", list(crlfile)):
        check_crl(f"{key}.crlfile", path, crl, cas)
        crls.append(crl)
    cut = 0
    for link in links:
        ssl_object = link.ssl_object
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            continue
        cert = x509.load_der_x509_certificate(der)
        if crl_status(cert, crls) != "revoked":
            continue
        log.warning("%s: peer certificate %s (serial %x) is revoked: link cut", link.what,
                    cert.subject.rfc4514_string(), cert.serial_number)
        incr("tls.revoked.disconnected")
        link.close("peer certificate revoked")
        cut += 1
    return cut


def recheck_links(config: Any, cluster: Any, bridges: Any, incr: Callable[[str], None],
                  bridge_context: Callable[[Any], Any] | None = None) -> int:
    """SIGHUP: check the live cluster links (``cluster.live_links()``) and bridge links
    against the CRL files configured now (module docstring); how many were cut.
    ``bridge_context(tls)`` builds a bridge's client context again
    (``gateway.bridge.tls.client_context``: passed in, gateway.bridge sits above us)."""
    cut = 0
    if cluster is not None:
        cut += recheck_cluster(config, cluster, incr)
    if bridges is not None:
        for name, bridge in bridges.bridges.items():
            cut += recheck_bridge(name, bridge, incr, bridge_context)
    return cut


def recheck_cluster(config: Any, cluster: Any, incr: Callable[[str], None]) -> int:
    """The live cluster links against ``[cluster.tls] crlfile``; how many were cut."""
    tls = config.cluster.tls
    links = [LiveLink(repr(link), link.writer.get_extra_info("ssl_object"), link.close)
             for link in cluster.live_links()]
    return _guarded(lambda: cut_revoked(links, list(tls.crlfile), tls.cacertfile,
                                        key="cluster.tls", incr=incr))


def recheck_bridge(name: str, bridge: Any, incr: Callable[[str], None],
                   bridge_context: Callable[[Any], Any] | None = None) -> int:
    """Bridge ``name``: its client context rebuilt with the CRLs now, its live link
    checked against them; how many were cut (0 or 1)."""
    return _guarded(functools.partial(_recheck_bridge, name, bridge, incr, bridge_context))


def _recheck_bridge(name: str, bridge: Any, incr: Callable[[str], None],
                    client_context: Callable[[Any], Any] | None) -> int:
    tls = bridge.settings.tls
    if tls is None or not tls.crlfile:
        return 0
    key = f"bridges.mqtt.{name}.tls"
    dialer = bridge.client.dialer
    if client_context is not None:
        try:
            dialer.ssl_context = client_context(tls)  # the reconnection checks the new CRLs
        except TlsError as exc:
            raise TlsError(f"{key}.{exc.key}", exc.reason) from None

    client = bridge.client
    link = client.link
    if link is None or link.closed or link.transport is None:
        return 0

    def close(reason: str) -> None:
        client.link_lost(link, reason)  # as if the upstream had gone: backoff, reconnect

    live = LiveLink(f"bridge {name}", link.transport.get_extra_info("ssl_object"), close)
    return cut_revoked([live], list(tls.crlfile), tls.cacertfile, key=key, incr=incr)


def _guarded(check: Callable[[], int]) -> int:
    try:
        return check()
    except TlsError as exc:
        log.error("live links not checked against the CRLs: %s: %s", exc.key, exc.reason)
        return 0
