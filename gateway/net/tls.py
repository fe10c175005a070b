"""TLS for stream listeners: server contexts built from ``[listeners.ssl.<name>]``.

TLS is not a separate transport shell: :func:`~gateway.net.stream.start_stream_listener`
is given ``ssl=ReloadableContext.server_context`` and asyncio (or uvloop) runs the
handshake before the shell's ``connection_made``; the channel factory then reads the
peer's certificate with :func:`peer_identity`.

Reloading (SIGHUP) without dropping connections: the context handed to ``create_server``
never changes, but its ``sni_callback`` (which OpenSSL calls for every ClientHello, with or
without a server name) moves the new handshake onto the most recently loaded context
(``ssl_object.context = current``) before the certificate is chosen. Established
connections keep the context they were made with; new handshakes see the new
certificate, key and CA. A reload that fails (a missing or broken file) logs an error and
keeps the previous context, so a half-copied certificate never takes a listener down.

Invariants:

- Every file is checked on its own (exists, parses, key matches certificate) before
  OpenSSL sees it, so an error names the configuration key at fault (:class:`TlsError`).
- Settings that live on the connection rather than on its certificates (verify mode,
  protocol versions) come from the listener configuration, which a reload does not change;
  only ``certfile``, ``keyfile`` and ``cacertfile`` are re-read.
- ``ciphers`` applies to TLS 1.2 and older. Python's ``ssl`` module cannot configure TLS 1.3
  cipher suites; OpenSSL's defaults are used for them.
"""

from __future__ import annotations

import logging
import ssl
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

if TYPE_CHECKING:
    from gateway.config.schema import SslListener

log = logging.getLogger("gateway.net.tls")

_VERSIONS = {
    "tlsv1": ssl.TLSVersion.TLSv1,
    "tlsv1.1": ssl.TLSVersion.TLSv1_1,
    "tlsv1.2": ssl.TLSVersion.TLSv1_2,
    "tlsv1.3": ssl.TLSVersion.TLSv1_3,
}


class TlsError(Exception):
    """A listener's TLS settings cannot be used; ``key`` names the configuration key."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


# ------------------------------------------------------------------ building contexts


def key_password(section: Any) -> bytes | None:
    """The password of ``section``'s encrypted keyfile: ``password``, or the first line
    of ``password_file``; None when neither is set (:class:`TlsError` names the key)."""
    password = getattr(section, "password", None)
    if password is not None:
        return str(password).encode()
    path = getattr(section, "password_file", None)
    if path is None:
        return None
    lines = _read("password_file", Path(path)).splitlines()
    if not lines or not lines[0].strip():
        raise TlsError("password_file", f'"{path}" is empty')
    return lines[0].strip()


def load_crls(key: str, paths: list[Path]) -> list[tuple[Path, x509.CertificateRevocationList]]:
    """The CRLs in ``paths`` (PEM, one or more per file; or one DER CRL), with their file.

    A file must hold whole CRLs only: anything but blank space after the last PEM block
    (a file caught half-written, even between two CRLs) or a file without any CRL is
    refused (:class:`TlsError`), never read as "fewer revocations"."""
    out: list[tuple[Path, x509.CertificateRevocationList]] = []
    begin, end = b"-----BEGIN X509 CRL-----", b"-----END X509 CRL-----"
    for path in paths:
        data = _read(key, path)
        try:
            if begin in data:
                *blocks, tail = data.split(end)
                if tail.strip() or not blocks:  # a file caught between two CRLs too
                    raise TlsError(key, f'"{path}" ends inside a CRL (half-written?)')
                for block in blocks:
                    out.append((path, x509.load_pem_x509_crl(block[block.index(begin):] + end)))
            else:
                out.append((path, x509.load_der_x509_crl(data)))
        except ValueError:
            raise TlsError(key, f'no CRL (PEM or DER) in "{path}"') from None
    return out


def check_crl(key: str, path: Path | str, crl: x509.CertificateRevocationList,
              cas: list[x509.Certificate]) -> x509.Certificate:
    """The CA of ``cas`` that signed ``crl``; :class:`TlsError` when none did."""
    for ca in cas:
        if ca.subject == crl.issuer and crl.is_signature_valid(ca.public_key()):  # type: ignore[arg-type]
            return ca
    raise TlsError(key, f'the CRL in "{path}" ({crl.issuer.rfc4514_string()}) is not signed '
                        "by a certificate of cacertfile")


def crl_status(
    cert: x509.Certificate, crls: list[x509.CertificateRevocationList]
) -> Literal["good", "revoked", "unknown"]:
    """``revoked`` if a CRL of the certificate's issuer lists its serial, ``good`` if one
    such CRL exists and does not, ``unknown`` when no CRL of its issuer is at hand."""
    seen = False
    for crl in crls:
        if crl.issuer != cert.issuer:
            continue
        seen = True
        if crl.get_revoked_certificate_by_serial_number(cert.serial_number) is not None:
            return "revoked"
    return "good" if seen else "unknown"


def add_crls(
    ctx: ssl.SSLContext,
    key: str,
    paths: list[Path],
    cas: list[x509.Certificate],
) -> list[x509.CertificateRevocationList]:
    """Load the CRL files into ``ctx`` and make OpenSSL check the peer's (leaf)
    certificate against them at the handshake. Each CRL must be signed by a certificate
    of ``cas`` (the ``cacertfile``), else :class:`TlsError`: a CRL nobody can check would
    revoke nothing. Every CA that issues peer certificates then needs a CRL (OpenSSL
    refuses a peer whose issuer has none: fail-closed)."""
    loaded = load_crls(key, paths)
    if not loaded:
        return []
    pem = []
    for path, crl in loaded:
        check_crl(key, path, crl, cas)
        pem.append(crl.public_bytes(serialization.Encoding.PEM).decode())
    # (load_verify_locations(cadata=...) takes certificates only; a file takes CRLs too)
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".pem") as tmp:
        tmp.write("".join(pem))
        tmp.flush()
        try:
            ctx.load_verify_locations(cafile=tmp.name)
        except ssl.SSLError as exc:
            raise TlsError(key, f"OpenSSL refused the CRL: {_why(exc)}") from None
    ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    return [crl for _, crl in loaded]


def build_context(listener: SslListener) -> ssl.SSLContext:
    """A server-side SSLContext for ``listener``; :class:`TlsError` names the bad key."""
    if listener.certfile is None or listener.keyfile is None:
        raise TlsError("certfile", "an ssl listener needs certfile and keyfile")
    password = key_password(listener)
    load_key_pair(listener.certfile, listener.keyfile, password)

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.0/1.1 when asked for
        ctx.minimum_version = _VERSIONS[listener.min_version]
        ctx.maximum_version = _VERSIONS[listener.max_version]
    ctx.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
    if listener.ciphers:
        try:
            ctx.set_ciphers(listener.ciphers)
        except ssl.SSLError:
            raise TlsError("ciphers", f'no cipher matches "{listener.ciphers}"') from None
    try:
        ctx.load_cert_chain(listener.certfile, listener.keyfile, password)
    except ssl.SSLError as exc:
        raise TlsError("certfile", f"OpenSSL refused the certificate: {_why(exc)}") from None

    if listener.verify == "verify_peer":
        if listener.cacertfile is None:
            raise TlsError("cacertfile", 'verify = "verify_peer" needs cacertfile')
        cas = load_certificates("cacertfile", listener.cacertfile)
        try:
            ctx.load_verify_locations(cafile=listener.cacertfile)
        except ssl.SSLError as exc:
            raise TlsError("cacertfile", f"OpenSSL refused it: {_why(exc)}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED if listener.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
        add_crls(ctx, "crlfile", list(listener.crlfile), cas)
        from gateway.net import openssl_ext

        openssl_ext.set_verify_depth(ctx, listener.depth)
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def load_key_pair(
    certfile: Path, keyfile: Path, password: bytes | None = None
) -> tuple[list[x509.Certificate], Any]:
    """The certificate chain in ``certfile`` and the private key in ``keyfile``, checked
    (PEM; encrypted only with ``password``, which then must open it; the key matches the
    first certificate); :class:`TlsError` names the bad key. Shared with the DTLS
    listeners (``gateway.net.dtls``), the cluster and the bridge."""
    certs = load_certificates("certfile", certfile)
    key_pem = _read("keyfile", keyfile)
    try:
        key = serialization.load_pem_private_key(key_pem, password=password)
    except TypeError:
        if password is None:
            raise TlsError("keyfile", f'"{keyfile}" is encrypted: give password or '
                                      "password_file") from None
        raise TlsError("password", f'"{keyfile}" is not encrypted: remove the password') from None
    except (ValueError, NotImplementedError):
        if password is not None and b"ENCRYPTED" in key_pem:
            raise TlsError("password", f'wrong password for "{keyfile}"') from None
        raise TlsError("keyfile", f'not a PEM private key "{keyfile}"') from None
    if _spki(key.public_key()) != _spki(certs[0].public_key()):
        raise TlsError("keyfile", f'"{keyfile}" does not match certfile')
    return certs, key


def _read(key: str, path: Path) -> bytes:
    if not path.is_file():
        raise TlsError(key, f'no such file "{path}"')
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsError(key, f'cannot read "{path}": {exc.strerror or exc}') from None


def load_certificates(key: str, path: Path) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(_read(key, path))
    except ValueError:
        raise TlsError(key, f'no PEM certificate in "{path}"') from None
    return certs


def _spki(public_key: Any) -> bytes:
    data: bytes = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return data


def _why(exc: ssl.SSLError) -> str:
    return str(exc.reason or exc.strerror or exc).lower().replace("_", " ")


def describe(listener: SslListener) -> str:
    """A short description of the certificate a context serves, for the log."""
    assert listener.certfile is not None
    try:
        cert = x509.load_pem_x509_certificates(listener.certfile.read_bytes())[0]
    except (OSError, ValueError):  # pragma: no cover - the file changed since the load
        return str(listener.certfile)
    return (
        f"{cert.subject.rfc4514_string()} serial {cert.serial_number:x} "
        f"valid until {cert.not_valid_after_utc:%Y-%m-%d} ({listener.certfile})"
    )


class ReloadableContext:
    """One listener's TLS context that SIGHUP can refresh without dropping connections.

    Give ``server_context`` to ``create_server``; call :meth:`reload` to re-read the files.
    """

    def __init__(self, name: str, listener: SslListener) -> None:
        self.name = name
        self.listener = listener
        # called after each successful reload (the revocation guard re-reads its CRLs)
        self.on_reload: list[Callable[[], object]] = []
        # each context built gets these (OCSP stapling: gateway.net.openssl_ext.Stapler)
        self.installers: list[Callable[[ssl.SSLContext], object]] = []
        self.closers: list[Callable[[], object]] = []
        self.server_context = build_context(listener)
        self.server_context.sni_callback = self._select
        self.current = self.server_context

    def install(self, fn: Callable[[ssl.SSLContext], object]) -> None:
        """Apply ``fn`` to the current context and to every one a reload builds."""
        self.installers.append(fn)
        fn(self.server_context)
        if self.current is not self.server_context:
            fn(self.current)

    def close(self) -> None:
        for fn in self.closers:
            fn()

    def _select(
        self,
        ssl_object: ssl.SSLObject | ssl.SSLSocket,
        server_name: str | None,
        context: ssl.SSLContext,
    ) -> None:
        current = self.current
        if ssl_object.context is not current:
            ssl_object.context = current

    def reload(self) -> bool:
        """Load the files again; on failure log the error and keep the previous context."""
        try:
            ctx = build_context(self.listener)
        except TlsError as exc:
            log.error(
                "listener %s: TLS reload failed, keeping the previous certificate: %s",
                self.name,
                exc,
            )
            return False
        for fn in self.installers:
            fn(ctx)
        self.current = ctx
        log.info("listener %s: TLS reloaded: %s", self.name, describe(self.listener))
        for after in self.on_reload:
            after()
        return True


# ------------------------------------------------------------------ peer identity


def peer_identity(transport: Any, extra: tuple[str, ...] = ()) -> Mapping[str, str] | None:
    """The verified client certificate of a TLS transport as ``{"cn", "dn", "san"}``.

    None when the transport is not TLS or the client sent no certificate. Keys whose field
    the certificate lacks are absent: ``cn`` is the first commonName, ``dn`` the subject
    in RFC 4514 form (``CN=dev1,O=Plant``), ``san`` the first DNS name or URI among the
    subject alternative names.
    """
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    return identity_of(x509.load_der_x509_certificate(der), extra)


def identity_of(cert: x509.Certificate, extra: tuple[str, ...] = ()) -> dict[str, str]:
    """``cn``, ``dn``, ``san`` (see :func:`peer_identity`), and those of ``extra`` that
    are asked for (they cost memory per connection): ``pem`` (the certificate in PEM),
    ``crt`` (its DER, base64), ``md5`` (hex MD5 of the DER; EMQX's names)."""
    out: dict[str, str] = {}
    if extra:
        import base64
        import hashlib

        der = cert.public_bytes(serialization.Encoding.DER)
        if "pem" in extra:
            out["pem"] = cert.public_bytes(serialization.Encoding.PEM).decode()
        if "crt" in extra:
            out["crt"] = base64.b64encode(der).decode()
        if "md5" in extra:
            out["md5"] = hashlib.md5(der).hexdigest()
    dn = cert.subject.rfc4514_string()
    if dn:
        out["dn"] = dn
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if cns:
        value = cns[0].value
        cn = value if isinstance(value, str) else value.decode("utf-8", "replace")
        if cn:
            out["cn"] = cn
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        sans = None
    for name in sans or ():
        if isinstance(name, x509.DNSName | x509.UniformResourceIdentifier) and name.value:
            out["san"] = name.value
            break
    return out
