"""Where revocation information comes from: a certificate's CRL distribution points and
OCSP responder (its extensions), and the HTTP fetch of a CRL or an OCSP answer.

Invariants: :func:`fetch` reads at most :data:`MAX_BODY` bytes and turns every failure
(a refused connection, a timeout, a status other than 200) into one ``OSError`` whose
message names the URL.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.x509.oid import AuthorityInformationAccessOID

__all__ = ["MAX_BODY", "distribution_points", "fetch", "ocsp_url"]

MAX_BODY = 16 << 20  # a CRL or OCSP response read at most


def distribution_points(cert: x509.Certificate) -> list[str]:
    """The http(s) URLs of the certificate's CRL distribution points."""
    try:
        ext = cert.extensions.get_extension_for_class(x509.CRLDistributionPoints).value
    except x509.ExtensionNotFound:
        return []
    urls = []
    for dp in ext:
        for name in dp.full_name or ():
            if isinstance(name, x509.UniformResourceIdentifier) and name.value.startswith("http"):
                urls.append(name.value)
    return urls


def ocsp_url(cert: x509.Certificate) -> str | None:
    """The certificate's OCSP responder (authorityInfoAccess), if it names one."""
    try:
        aia = cert.extensions.get_extension_for_class(x509.AuthorityInformationAccess).value
    except x509.ExtensionNotFound:
        return None
    for desc in aia:
        if desc.access_method == AuthorityInformationAccessOID.OCSP and isinstance(
            desc.access_location, x509.UniformResourceIdentifier
        ):
            return desc.access_location.value
    return None


async def fetch(url: str, timeout: float, body: bytes | None = None,
                content_type: str = "application/ocsp-request") -> bytes:
    """GET ``url`` (POST ``body`` when given); the body of a 200 answer, else OSError."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            if body is None:
                req = s.get(url)
            else:
                req = s.post(url, data=body, headers={"Content-Type": content_type})
            async with req as r:
                data = await r.content.read(MAX_BODY)
                if r.status != 200:
                    raise OSError(f"HTTP {r.status} from {url}")
                return bytes(data)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise OSError(f"{url}: {type(exc).__name__} {exc}".strip()) from None
