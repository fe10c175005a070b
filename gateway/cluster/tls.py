"""Mutual TLS for cluster links: both ends present a certificate from the cluster CA.

Certificates come from our own PKI (``gatewayctl certs init-ca DIR`` then ``gatewayctl
certs issue DIR <node name> --server-client``): subject ``CN=<node name>``, both
serverAuth and clientAuth. Every link is TLS 1.2 or newer with ``CERT_REQUIRED`` on both
sides, so a peer whose certificate does not chain to ``cacertfile`` fails the handshake;
the listener logs it (:mod:`gateway.cluster.link`).

Host names are not checked (a node is dialled at whatever address it advertises);
instead, with ``verify_node_name`` (the default), the certificate's CN must be the node
name the peer claims in its HELLO, checked on both ends, so one node's certificate cannot
speak for another.

Invariants:
- Files are checked (exist, parse, key matches certificate) before OpenSSL sees them;
  errors are :class:`gateway.net.tls.TlsError` naming the ``cluster.tls.*`` key.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gateway.net.tls import TlsError, add_crls, identity_of, key_password


@dataclass(frozen=True)
class ClusterTls:
    server: ssl.SSLContext
    client: ssl.SSLContext
    verify_node_name: bool


def _check_files(
    certfile: Path | None,
    keyfile: Path | None,
    cacertfile: Path | None,
    password: bytes | None = None,
) -> None:
    for name, path in (
        ("cluster.tls.certfile", certfile),
        ("cluster.tls.keyfile", keyfile),
        ("cluster.tls.cacertfile", cacertfile),
    ):
        if path is None:
            raise TlsError(name, "the cluster needs certfile, keyfile and cacertfile")
        if not path.is_file():
            raise TlsError(name, f'no such file "{path}"')
    assert certfile is not None and keyfile is not None and cacertfile is not None
    try:
        cert = x509.load_pem_x509_certificates(certfile.read_bytes())[0]
    except ValueError:
        raise TlsError("cluster.tls.certfile", f'no PEM certificate in "{certfile}"') from None
    try:
        x509.load_pem_x509_certificates(cacertfile.read_bytes())
    except ValueError:
        raise TlsError("cluster.tls.cacertfile", f'no PEM certificate in "{cacertfile}"') from None
    try:
        key = serialization.load_pem_private_key(keyfile.read_bytes(), password=password)
    except TypeError:
        why = "encrypted: give password or password_file" if password is None else (
            "not encrypted: remove the password")
        raise TlsError("cluster.tls.keyfile", f'"{keyfile}" is {why}') from None
    except ValueError:
        why = "wrong password for" if password is not None else "not a PEM key"
        raise TlsError("cluster.tls.keyfile", f'{why} "{keyfile}"') from None
    fmt = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, fmt) != cert.public_key().public_bytes(der, fmt):
        raise TlsError("cluster.tls.keyfile", f'"{keyfile}" does not match certfile')


def build(
    certfile: Path | None,
    keyfile: Path | None,
    cacertfile: Path | None,
    *,
    verify_node_name: bool = True,
    password: bytes | None = None,
    crlfile: list[Path] | None = None,
) -> ClusterTls:
    """Server and client contexts for the cluster port; :class:`TlsError` on bad files.
    ``password`` opens an encrypted keyfile; ``crlfile``: CRLs of the cluster CA, checked
    on both ends at the handshake (a revoked node can neither dial nor be dialled)."""
    _check_files(certfile, keyfile, cacertfile, password)
    assert cacertfile is not None
    cas = x509.load_pem_x509_certificates(cacertfile.read_bytes())
    contexts = []
    for purpose in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        ctx = ssl.SSLContext(purpose)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.options |= ssl.OP_NO_RENEGOTIATION
        try:
            ctx.load_cert_chain(str(certfile), str(keyfile), password)
            ctx.load_verify_locations(cafile=str(cacertfile))
        except ssl.SSLError as exc:
            raise TlsError("cluster.tls.certfile", f"OpenSSL refused it: {exc}") from None
        try:
            add_crls(ctx, "crlfile", list(crlfile or ()), cas)
        except TlsError as exc:
            raise TlsError("cluster.tls.crlfile", exc.reason) from None
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        contexts.append(ctx)
    return ClusterTls(contexts[0], contexts[1], verify_node_name)


def from_config(tls: Any) -> ClusterTls:
    """:func:`build` from a ``[cluster.tls]`` section (SIGHUP builds it again)."""
    try:
        password = key_password(tls)
    except TlsError as exc:
        raise TlsError(f"cluster.tls.{exc.key}", exc.reason) from None
    return build(tls.certfile, tls.keyfile, tls.cacertfile,
                 verify_node_name=tls.verify_node_name, password=password,
                 crlfile=list(tls.crlfile))


def peer_common_name(ssl_object: Any) -> str | None:
    """The CN of the verified peer certificate of a TLS connection (None without one)."""
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    return identity_of(x509.load_der_x509_certificate(der)).get("cn")
