"""Revocation for the built-in CA (``gatewayctl certs revoke`` / ``certs crl``).

Files in the PKI directory (next to ``ca.crt``/``ca.key``, see :mod:`gateway.security.pki`)::

    DIR/index.txt   OpenSSL's CA database format, so ``openssl ocsp -index DIR/index.txt
                    -CA DIR/ca.crt -rsigner ... -port N`` answers for our certificates:
                    ``V<TAB>expiry<TAB><TAB>SERIAL<TAB>unknown<TAB>/CN=name`` per issued
                    certificate, ``R<TAB>expiry<TAB>revoked-at[,reason]<TAB>...`` once revoked
    DIR/crl.pem     the CRL signed by the CA (``certs crl``), what listeners take as crlfile
    DIR/crlnumber   the last CRL number (decimal)

Invariants:

- Revocation is idempotent (revoking twice keeps the first date) and final (nothing
  un-revokes; issue a new certificate instead).
- Every write goes through a temporary file renamed over the old one, so a listener
  watching ``crl.pem`` reads either the old CRL or the new one, never half of one.
- The CRL's number grows by one on every ``crl``; it is valid for ``days`` (nextUpdate):
  re-issue it before then (a listener refuses clients when its CRL has expired).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from gateway.security.pki import (
    INDEX,
    PkiError,
    _parse_time,
    _read_index,
    _subject,
    _time,
    _write_atomic,
    _write_index,
    load_ca,
    record_issued,
)

__all__ = ["INDEX", "Revoked", "make_crl", "record_issued", "revoke", "revoked"]

CRL = "crl.pem"
CRL_NUMBER = "crlnumber"
REASONS = {
    "unspecified": x509.ReasonFlags.unspecified,
    "keyCompromise": x509.ReasonFlags.key_compromise,
    "CACompromise": x509.ReasonFlags.ca_compromise,
    "affiliationChanged": x509.ReasonFlags.affiliation_changed,
    "superseded": x509.ReasonFlags.superseded,
    "cessationOfOperation": x509.ReasonFlags.cessation_of_operation,
}


@dataclass(frozen=True)
class Revoked:
    serial: int
    at: datetime.datetime
    reason: str
    subject: str


def _certificate(directory: Path, which: str) -> x509.Certificate:
    """``which``: a certificate file, or a NAME issued in ``directory`` (NAME.crt)."""
    path = Path(which)
    if not path.is_file():
        path = directory / f"{which}.crt"
    if not path.is_file():
        raise PkiError(f"no certificate {which!r} (neither a file nor {directory}/{which}.crt)")
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except ValueError:
        raise PkiError(f"{path}: not a PEM certificate") from None


def revoke(directory: str | Path, which: str, reason: str = "unspecified") -> Revoked:
    """Mark a certificate of this CA revoked in ``index.txt`` (run :func:`make_crl` after)."""
    directory = Path(directory)
    if reason not in REASONS:
        raise PkiError(f"unknown reason {reason!r}; one of {', '.join(REASONS)}")
    ca_cert, _ = load_ca(directory)
    cert = _certificate(directory, which)
    if cert.issuer != ca_cert.subject:
        raise PkiError(f"{which}: issued by {cert.issuer.rfc4514_string()}, not by this CA")
    serial = f"{cert.serial_number:X}"
    rows = _read_index(directory)
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    for row in rows:
        if row[3] == serial:
            if row[0] == "R":
                at, _, why = row[2].partition(",")
                return Revoked(cert.serial_number, _parse_time(at), why or "unspecified", row[5])
            row[0] = "R"
            row[2] = _time(now) + ("" if reason == "unspecified" else f",{reason}")
            break
    else:
        rows.append(["R", _time(cert.not_valid_after_utc),
                     _time(now) + ("" if reason == "unspecified" else f",{reason}"),
                     serial, "unknown", _subject(cert)])
    _write_index(directory, rows)
    return Revoked(cert.serial_number, now, reason, _subject(cert))


def revoked(directory: str | Path) -> list[Revoked]:
    out = []
    for row in _read_index(Path(directory)):
        if row[0] == "R":
            at, _, why = row[2].partition(",")
            out.append(Revoked(int(row[3], 16), _parse_time(at), why or "unspecified", row[5]))
    return out


def make_crl(directory: str | Path, *, days: int = 7, out: str | Path | None = None) -> Path:
    """Sign a CRL of every revoked certificate, valid ``days``; written to ``out``
    (default ``DIR/crl.pem``) in PEM. Returns the path."""
    if days < 1:
        raise PkiError(f"days must be at least 1, got {days}")
    directory = Path(directory)
    ca_cert, ca_key = load_ca(directory)
    number_path = directory / CRL_NUMBER
    try:
        number = int(number_path.read_text().strip() or "0") + 1 if number_path.exists() else 1
    except ValueError:
        raise PkiError(f"{number_path}: not a number") from None
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now - datetime.timedelta(minutes=5))
        .next_update(now + datetime.timedelta(days=days))
        .add_extension(x509.CRLNumber(number), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    for r in revoked(directory):
        entry = x509.RevokedCertificateBuilder().serial_number(r.serial).revocation_date(r.at)
        if r.reason != "unspecified":
            entry = entry.add_extension(x509.CRLReason(REASONS[r.reason]), critical=False)
        builder = builder.add_revoked_certificate(entry.build())
    crl = builder.sign(ca_key, hashes.SHA256())
    target = Path(out) if out is not None else directory / CRL
    _write_atomic(target, crl.public_bytes(serialization.Encoding.PEM))
    _write_atomic(number_path, f"{number}\n".encode())
    return target
