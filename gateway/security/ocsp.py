"""OCSP for certificates of a TLS peer: the request, the checked answer, the query.

Invariants: an answer is used only when signed by the issuing CA, or by a responder
certificate that CA issued with the OCSPSigning purpose, and only about the certificate
asked for; anything else is a ``ValueError``, never "good".
"""

from __future__ import annotations

from typing import Any, Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509 import ocsp
from cryptography.x509.oid import ExtendedKeyUsageOID

from gateway.security.sources import fetch

__all__ = ["Status", "ocsp_answer", "ocsp_query", "ocsp_request"]

Status = Literal["good", "revoked", "unknown"]


def _verify(public_key: Any, signature: bytes, data: bytes, algo: Any) -> bool:
    try:
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(signature, data, ec.ECDSA(algo))
        elif isinstance(public_key, rsa.RSAPublicKey):
            public_key.verify(signature, data, padding.PKCS1v15(), algo)
        else:
            public_key.verify(signature, data)
    except (InvalidSignature, TypeError, ValueError):
        return False
    return True


def ocsp_request(cert: x509.Certificate, issuer: x509.Certificate) -> bytes:
    req = ocsp.OCSPRequestBuilder().add_certificate(cert, issuer, hashes.SHA1()).build()
    return req.public_bytes(serialization.Encoding.DER)


def ocsp_answer(
    der: bytes, cert: x509.Certificate, issuer: x509.Certificate
) -> tuple[Status, float | None]:
    """Status of ``cert`` in the OCSP response ``der`` and its nextUpdate (epoch
    seconds, None when absent); ValueError when the response is unusable (not
    successful, badly signed, about another certificate)."""
    resp = ocsp.load_der_ocsp_response(der)
    if resp.response_status != ocsp.OCSPResponseStatus.SUCCESSFUL:
        raise ValueError(f"OCSP responder says {resp.response_status.name.lower()}")
    signer: x509.Certificate | None = None
    for candidate in [issuer, *resp.certificates]:
        if _verify(candidate.public_key(), resp.signature, resp.tbs_response_bytes,
                   resp.signature_hash_algorithm):
            signer = candidate
            break
    if signer is None:
        raise ValueError("OCSP response signature does not verify")
    if signer is not issuer:  # a delegated responder: issued by the CA for OCSP signing
        try:
            eku = signer.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except x509.ExtensionNotFound:
            eku = None
        if (
            signer.issuer != issuer.subject
            or not _verify(issuer.public_key(), signer.signature, signer.tbs_certificate_bytes,
                           signer.signature_hash_algorithm)
            or eku is None
            or ExtendedKeyUsageOID.OCSP_SIGNING not in eku
        ):
            raise ValueError("OCSP response signed by a certificate the CA did not delegate")
    for single in resp.responses:
        if single.serial_number != cert.serial_number:
            continue
        nxt = single.next_update_utc
        when = nxt.timestamp() if nxt is not None else None
        if single.certificate_status == ocsp.OCSPCertStatus.REVOKED:
            return "revoked", when
        if single.certificate_status == ocsp.OCSPCertStatus.GOOD:
            return "good", when
        return "unknown", when
    raise ValueError("OCSP response is about another certificate")


async def ocsp_query(url: str, cert: x509.Certificate, issuer: x509.Certificate,
                     timeout: float) -> tuple[Status, float | None]:
    der = await fetch(url, timeout, ocsp_request(cert, issuer))
    return ocsp_answer(der, cert, issuer)
