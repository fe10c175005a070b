"""TLS towards the upstream broker: a client-side ``ssl.SSLContext`` from a bridge's
``tls`` table.

- ``verify = "verify_peer"`` (the default) checks the server's certificate against
  ``cacertfile`` (the system's CA store when none is given) and its name against
  ``server_name_indication`` (the ``server`` host when empty); ``"disable"`` sends no SNI
  and checks no name, only the chain.
- ``certfile`` + ``keyfile``: our client certificate, for upstream brokers that require
  mutual TLS (``gatewayctl certs issue DIR NAME --client`` makes one).
- Every file is checked on its own before OpenSSL sees it, so a problem names the key at
  fault (:class:`~gateway.net.tls.TlsError`).
- ``enable_crl_check`` / ``ocsp_check``: :func:`link_check` judges the upstream's
  certificate after each handshake, before CONNECT, with
  :class:`gateway.security.linkcheck.LinkRevocation` (a refusal fails the attempt, which
  is retried with the backoff; a revocation learnt later drops the live link likewise).
"""

from __future__ import annotations

import ssl
import warnings
from typing import TYPE_CHECKING, Any

from gateway.net.tls import TlsError, add_crls, key_password, load_certificates, load_key_pair

if TYPE_CHECKING:
    from gateway.bridge.client import UpstreamClient
    from gateway.bridge.link import AsyncioLink, LinkCheck
    from gateway.config.schema import BridgeTls
    from gateway.security.linkcheck import LinkRevocation

_VERSIONS = {
    "tlsv1": ssl.TLSVersion.TLSv1,
    "tlsv1.1": ssl.TLSVersion.TLSv1_1,
    "tlsv1.2": ssl.TLSVersion.TLSv1_2,
    "tlsv1.3": ssl.TLSVersion.TLSv1_3,
}
_ORDER = ("tlsv1", "tlsv1.1", "tlsv1.2", "tlsv1.3")


def client_context(tls: BridgeTls) -> ssl.SSLContext:
    """The context for connecting upstream; :class:`TlsError` names the bad key."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    versions = sorted(tls.versions, key=_ORDER.index)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = _VERSIONS[versions[0]]
        ctx.maximum_version = _VERSIONS[versions[-1]]
    if tls.ciphers:
        try:
            ctx.set_ciphers(tls.ciphers)
        except ssl.SSLError:
            raise TlsError("ciphers", f'no cipher matches "{tls.ciphers}"') from None
    if tls.verify == "verify_peer":
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.check_hostname = tls.server_name_indication != "disable"
        if tls.cacertfile is not None:
            load_certificates("cacertfile", tls.cacertfile)
            try:
                ctx.load_verify_locations(cafile=tls.cacertfile)
            except ssl.SSLError as exc:
                raise TlsError("cacertfile", f"OpenSSL refused it: {exc.reason}") from None
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if tls.crlfile:
        if tls.cacertfile is None:
            raise TlsError("crlfile", "crlfile needs cacertfile (the CA that signs the CRLs)")
        add_crls(ctx, "crlfile", list(tls.crlfile), load_certificates("cacertfile",
                                                                      tls.cacertfile))
    if tls.certfile is not None and tls.keyfile is not None:
        password = key_password(tls)
        load_key_pair(tls.certfile, tls.keyfile, password)  # checked: PEM, matching
        try:
            ctx.load_cert_chain(tls.certfile, tls.keyfile, password)
        except ssl.SSLError as exc:
            raise TlsError("certfile", f"OpenSSL refused the certificate: {exc.reason}") from None
    return ctx


def server_hostname(tls: BridgeTls, host: str) -> str | None:
    """The name sent as SNI and checked against the certificate (None: no SNI)."""
    sni = tls.server_name_indication
    if sni == "disable":
        return None
    return sni or host


def link_check(revocation: LinkRevocation, client: UpstreamClient) -> LinkCheck:
    """The dialer's check of each new TLS link of ``client`` (see the module doc)."""

    async def check(link: AsyncioLink) -> str | None:
        transport = link.transport
        ssl_object: Any = transport.get_extra_info("ssl_object") if transport else None
        peer = transport.get_extra_info("peername") if transport else None
        address = f"{peer[0]}:{peer[1]}" if peer else "?"

        def cut(why: str) -> None:  # as if the upstream had gone: backoff, reconnect
            client.link_lost(link, f"upstream certificate {why}")

        return await revocation.check(ssl_object, address, gone=lambda: link.closed, cut=cut)

    return check
