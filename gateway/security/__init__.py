"""Security building blocks of the gateway: the PKI (certificate authority and issued
certificates) shared by the TLS listeners and, later, the cluster's mutual-TLS links."""

from gateway.security.pki import (
    CA_CERT,
    CA_KEY,
    AlreadyExists,
    Issued,
    PkiError,
    init_ca,
    issue,
    load_ca,
    parse_san,
)

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "AlreadyExists",
    "Issued",
    "PkiError",
    "init_ca",
    "issue",
    "load_ca",
    "parse_san",
]
