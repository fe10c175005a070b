"""A small certificate authority on ``cryptography``: one CA, the certificates it issues.

Layout of a PKI directory (``gatewayctl certs init-ca DIR`` / ``certs issue DIR NAME``)::

    DIR/ca.crt     the CA certificate (PEM), given to clients and listeners as cacertfile
    DIR/ca.key     the CA private key (PEM, PKCS#8, unencrypted, mode 0600)
    DIR/NAME.crt   a certificate issued by the CA; its subject is CN=NAME
    DIR/NAME.key   its private key (mode 0600)

Invariants:

- Every key is EC P-256; every signature is ECDSA with SHA-256.
- Private keys are created with mode 0600 from the start (``os.open`` with the mode, never
  a chmod after the bytes are on disk), and no file is replaced unless ``force`` is given.
  With ``force`` a file is written beside the old one and renamed over it, so a reader
  (a listener reloading on SIGHUP) sees either the old file or the new one.
- The CA is ``basicConstraints CA:TRUE, pathlen:0`` (it signs only end-entity
  certificates), ``keyUsage keyCertSign, cRLSign``. An issued certificate is ``CA:FALSE``,
  ``keyUsage digitalSignature``, ``extendedKeyUsage`` serverAuth and/or clientAuth, and
  carries subjectKeyIdentifier and authorityKeyIdentifier; it never outlives its CA.
- A server certificate without explicit SANs gets ``DNS:localhost, IP:127.0.0.1,
  IP:::1``. Clients check the SAN, not the CN, so give ``sans`` for any other name.
- Validity starts five minutes in the past to tolerate small clock differences.

Errors are :class:`PkiError` (one line); :class:`AlreadyExists` when a file is there and
``force`` is not set.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import AuthorityInformationAccessOID, ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CA_DAYS = 3650
LEAF_DAYS = 825
BACKDATE = datetime.timedelta(minutes=5)
DEFAULT_SERVER_SANS = ("localhost", "127.0.0.1", "::1")

KEY_MODE = 0o600
CERT_MODE = 0o644

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_DNS_RE = re.compile(
    r"(\*\.)?[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
    r"(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?"
)


class PkiError(Exception):
    """A PKI operation failed; the message is one line meant for the operator."""


class AlreadyExists(PkiError):
    """A file to be written exists and ``force`` was not given."""


@dataclass(frozen=True)
class Issued:
    """What a PKI operation wrote."""

    cert_path: Path
    key_path: Path
    certificate: x509.Certificate


# ------------------------------------------------------------------ public API


def init_ca(
    directory: str | Path,
    *,
    common_name: str = "gateway CA",
    days: int = CA_DAYS,
    force: bool = False,
) -> Issued:
    """Create ``directory`` (if needed) with a new self-signed CA: ca.crt and ca.key."""
    if days < 1:
        raise PkiError(f"days must be at least 1, got {days}")
    if not common_name:
        raise PkiError("the CA needs a non-empty common name")
    directory = _make_dir(directory)
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if not force:
        _refuse_existing((cert_path, key_path))

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(digital_signature=True, key_cert_sign=True, crl_sign=True), critical=True
        )
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    _write(key_path, _key_pem(key), KEY_MODE, force=force)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), CERT_MODE, force=force)
    return Issued(cert_path, key_path, cert)


def issue(
    directory: str | Path,
    name: str,
    *,
    server: bool = True,
    client: bool = False,
    sans: Sequence[str] = (),
    days: int = LEAF_DAYS,
    force: bool = False,
    crl_urls: Sequence[str] = (),
    ocsp_url: str | None = None,
) -> Issued:
    """Issue ``directory/NAME.crt`` and ``NAME.key`` (subject CN=NAME) from the CA there.

    ``crl_urls`` become the certificate's CRL distribution points, ``ocsp_url`` its
    OCSP responder (authorityInfoAccess). The certificate is recorded in
    ``DIR/index.txt`` (:mod:`gateway.security.ca_revoke`).

    ``server`` and ``client`` choose the extended key usages (both may be set: a cluster
    node is both). ``sans`` are ``"DNS:name"``, ``"IP:addr"``, ``"URI:uri"`` or a bare
    name or address; a server certificate without any gets localhost, 127.0.0.1 and ::1.
    """
    if not server and not client:
        raise PkiError("a certificate must be for a server, a client or both")
    if days < 1:
        raise PkiError(f"days must be at least 1, got {days}")
    if not _NAME_RE.fullmatch(name) or name.lower() == "ca":
        raise PkiError(
            f"invalid certificate name {name!r}: use letters, digits and . _ @ - "
            '(at most 64, not starting with a punctuation mark, not "ca")'
        )
    general_names = [parse_san(s) for s in sans]
    if server and not general_names:
        general_names = [parse_san(s) for s in DEFAULT_SERVER_SANS]
    directory = Path(directory)
    ca_cert, ca_key = load_ca(directory)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    if not force:
        _refuse_existing((cert_path, key_path))

    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    if not_after <= now:
        raise PkiError(f"{directory / CA_CERT}: the CA has expired")
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(now - BACKDATE, ca_cert.not_valid_before_utc))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(_authority_key_id(ca_cert), critical=False)
    )
    if general_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(_unique(general_names)), critical=False
        )
    if crl_urls:
        builder = builder.add_extension(
            x509.CRLDistributionPoints([
                x509.DistributionPoint([x509.UniformResourceIdentifier(u)], None, None, None)
                for u in crl_urls
            ]),
            critical=False,
        )
    if ocsp_url:
        builder = builder.add_extension(
            x509.AuthorityInformationAccess([x509.AccessDescription(
                AuthorityInformationAccessOID.OCSP, x509.UniformResourceIdentifier(ocsp_url)
            )]),
            critical=False,
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    _write(key_path, _key_pem(key), KEY_MODE, force=force)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), CERT_MODE, force=force)
    record_issued(directory, cert)
    return Issued(cert_path, key_path, cert)


def load_ca(directory: str | Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The CA certificate and key of a PKI directory, checked to belong together."""
    directory = Path(directory)
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    for path in (cert_path, key_path):
        if not path.is_file():
            raise PkiError(f"{path}: no such file (create the CA first with init-ca)")
    try:
        cert = x509.load_pem_x509_certificate(_read(cert_path))
    except ValueError:
        raise PkiError(f"{cert_path}: not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(_read(key_path), password=None)
    except (ValueError, TypeError):
        raise PkiError(f"{key_path}: not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{key_path}: not an EC private key")
    if key.public_key() != cert.public_key():
        raise PkiError(f"{key_path}: does not match {cert_path}")
    return cert, key


def parse_san(text: str) -> x509.GeneralName:
    """``"DNS:host"``, ``"IP:10.0.0.5"``, ``"URI:spiffe://x/y"``, or a bare name/address."""
    kind, sep, value = text.partition(":")
    kind = kind.upper() if sep else ""
    if kind not in ("DNS", "IP", "URI"):
        kind, value = "", text  # bare, or an IPv6 address such as ::1
    value = value.strip()
    if kind in ("", "IP"):
        try:
            return x509.IPAddress(ipaddress.ip_address(value))
        except ValueError:
            if kind == "IP":
                raise PkiError(f"invalid SAN {text!r}: not an IP address") from None
    if kind == "URI":
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*:\S+", value) or not value.isascii():
            raise PkiError(f"invalid SAN {text!r}: expected a URI such as spiffe://edge/node1")
        return x509.UniformResourceIdentifier(value)
    if not value.isascii() or not _DNS_RE.fullmatch(value):
        raise PkiError(f"invalid SAN {text!r}: expected a DNS name, an IP address or URI:...")
    return x509.DNSName(value)


# ------------------------------------------------------------------ the CA database

INDEX = "index.txt"  # OpenSSL's CA database format (see gateway.security.ca_revoke)


def _time(value: datetime.datetime) -> str:
    return value.astimezone(datetime.UTC).strftime("%y%m%d%H%M%SZ")


def _parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%y%m%d%H%M%SZ").replace(tzinfo=datetime.UTC)


def _subject(cert: x509.Certificate) -> str:
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return "/CN=" + str(cns[0].value) if cns else "/" + cert.subject.rfc4514_string()


def _read_index(directory: Path) -> list[list[str]]:
    path = directory / INDEX
    if not path.exists():
        return []
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split("\t")
        if len(fields) != 6 or fields[0] not in ("V", "R", "E"):
            raise PkiError(f"{path}:{n}: not an OpenSSL index line")
        rows.append(fields)
    return rows


def _write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_index(directory: Path, rows: list[list[str]]) -> None:
    _write_atomic(directory / INDEX, "".join("\t".join(r) + "\n" for r in rows).encode())


def record_issued(directory: str | Path, cert: x509.Certificate) -> None:
    """Add an issued certificate to ``index.txt`` as valid (``pki.issue`` calls this)."""
    directory = Path(directory)
    rows = _read_index(directory)
    serial = f"{cert.serial_number:X}"
    rows = [r for r in rows if r[3] != serial]
    rows.append(["V", _time(cert.not_valid_after_utc), "", serial, "unknown", _subject(cert)])
    _write_index(directory, rows)



# ------------------------------------------------------------------ helpers


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


def _key_usage(
    *, digital_signature: bool = False, key_cert_sign: bool = False, crl_sign: bool = False
) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _authority_key_id(ca_cert: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key())  # type: ignore[arg-type]
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def _unique(names: Iterable[x509.GeneralName]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for n in names:
        if n not in out:
            out.append(n)
    return out


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _make_dir(directory: str | Path) -> Path:
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise PkiError(f"{path}: exists and is not a directory") from None
    except OSError as exc:
        raise PkiError(f"{path}: cannot create directory: {exc.strerror or exc}") from None
    return path


def _refuse_existing(paths: Iterable[Path]) -> None:
    for path in paths:
        if path.exists() or path.is_symlink():
            raise AlreadyExists(f"{path} already exists")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PkiError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _write(path: Path, data: bytes, mode: int, *, force: bool) -> None:
    """Write ``data`` to a file created with ``mode``; without ``force`` never replace one."""
    target = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp") if force else path
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise AlreadyExists(f"{path} already exists") from None
    except OSError as exc:
        raise PkiError(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if force:
            os.replace(target, path)
    except OSError as exc:
        target.unlink(missing_ok=True)
        raise PkiError(f"{path}: cannot write: {exc.strerror or exc}") from None
