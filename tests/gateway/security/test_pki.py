"""The PKI: a CA and the certificates it issues, checked with cryptography and OpenSSL."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import ssl
import stat
import subprocess

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from gateway.security.pki import AlreadyExists, PkiError, init_ca, issue, load_ca, parse_san


def _ext(cert: x509.Certificate, cls: type) -> x509.Extension:  # type: ignore[type-arg]
    return cert.extensions.get_extension_for_class(cls)


def _mode(path: os.PathLike[str]) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_init_ca_writes_a_self_signed_ca(tmp_path):
    ca = init_ca(tmp_path / "pki", common_name="plant CA", days=30)
    assert ca.cert_path == tmp_path / "pki" / "ca.crt"
    assert ca.key_path == tmp_path / "pki" / "ca.key"
    assert _mode(ca.key_path) == 0o600
    cert = x509.load_pem_x509_certificate(ca.cert_path.read_bytes())
    assert cert.subject == cert.issuer
    assert cert.subject.rfc4514_string() == "CN=plant CA"
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
    bc = _ext(cert, x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    ku = _ext(cert, x509.KeyUsage)
    assert ku.critical and ku.value.key_cert_sign and ku.value.crl_sign
    ski = _ext(cert, x509.SubjectKeyIdentifier).value
    assert _ext(cert, x509.AuthorityKeyIdentifier).value.key_identifier == ski.digest
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert datetime.timedelta(days=30) <= lifetime <= datetime.timedelta(days=30, minutes=6)
    cert.verify_directly_issued_by(cert)
    load_ca(tmp_path / "pki")  # key and certificate belong together


def test_private_key_is_created_with_mode_0600_even_with_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        ca = init_ca(tmp_path)
        srv = issue(tmp_path, "server")
    finally:
        os.umask(old)
    assert _mode(ca.key_path) == 0o600
    assert _mode(srv.key_path) == 0o600
    assert _mode(srv.cert_path) == 0o644


def test_server_certificate(tmp_path):
    ca = init_ca(tmp_path)
    srv = issue(tmp_path, "server")
    cert = srv.certificate
    assert srv.cert_path == tmp_path / "server.crt"
    assert cert.subject.rfc4514_string() == "CN=server"
    assert cert.issuer == ca.certificate.subject
    cert.verify_directly_issued_by(ca.certificate)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    bc = _ext(cert, x509.BasicConstraints)
    assert bc.critical and not bc.value.ca
    ku = _ext(cert, x509.KeyUsage).value
    assert ku.digital_signature and not ku.key_cert_sign
    assert list(_ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    san = _ext(cert, x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    ca_ski = _ext(ca.certificate, x509.SubjectKeyIdentifier).value.digest
    assert _ext(cert, x509.AuthorityKeyIdentifier).value.key_identifier == ca_ski
    assert _ext(cert, x509.SubjectKeyIdentifier).value.digest != ca_ski


def test_client_certificate_and_explicit_sans(tmp_path):
    init_ca(tmp_path)
    cert = issue(
        tmp_path, "dev-1", server=False, client=True,
        sans=["URI:spiffe://plant/dev-1", "dev-1.local", "10.1.2.3"],
    ).certificate
    assert list(_ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    san = _ext(cert, x509.SubjectAlternativeName).value
    assert list(san) == [
        x509.UniformResourceIdentifier("spiffe://plant/dev-1"),
        x509.DNSName("dev-1.local"),
        x509.IPAddress(ipaddress.ip_address("10.1.2.3")),
    ]


def test_client_certificate_without_sans_has_no_san_extension(tmp_path):
    init_ca(tmp_path)
    cert = issue(tmp_path, "dev2", server=False, client=True).certificate
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)


def test_server_and_client_usages_together(tmp_path):
    init_ca(tmp_path)
    cert = issue(tmp_path, "node1", server=True, client=True, sans=["node1.edge"]).certificate
    assert set(_ext(cert, x509.ExtendedKeyUsage).value) == {
        ExtendedKeyUsageOID.SERVER_AUTH,
        ExtendedKeyUsageOID.CLIENT_AUTH,
    }
    san = _ext(cert, x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["node1.edge"]  # no defaults added


def test_leaf_never_outlives_its_ca(tmp_path):
    ca = init_ca(tmp_path, days=10)
    cert = issue(tmp_path, "server", days=1000).certificate
    assert cert.not_valid_after_utc == ca.certificate.not_valid_after_utc


def test_refuses_to_overwrite_without_force(tmp_path):
    init_ca(tmp_path)
    before = (tmp_path / "ca.crt").read_bytes()
    with pytest.raises(AlreadyExists, match=r"ca\.crt already exists"):
        init_ca(tmp_path)
    assert (tmp_path / "ca.crt").read_bytes() == before
    issue(tmp_path, "server")
    with pytest.raises(AlreadyExists, match=r"server\.crt already exists"):
        issue(tmp_path, "server")
    (tmp_path / "server.crt").unlink()  # a stray key alone also blocks
    with pytest.raises(AlreadyExists, match=r"server\.key already exists"):
        issue(tmp_path, "server")
    assert not (tmp_path / "server.crt").exists()


def test_force_replaces_atomically_and_keeps_mode(tmp_path):
    init_ca(tmp_path)
    first = issue(tmp_path, "server").certificate
    second = issue(tmp_path, "server", force=True).certificate
    assert first.serial_number != second.serial_number
    on_disk = x509.load_pem_x509_certificate((tmp_path / "server.crt").read_bytes())
    assert on_disk.serial_number == second.serial_number
    assert _mode(tmp_path / "server.key") == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ca.crt", "ca.key", "index.txt", "server.crt", "server.key",
    ]  # no temporary files left behind


def test_a_new_ca_with_force_no_longer_verifies_old_certificates(tmp_path):
    init_ca(tmp_path)
    old = issue(tmp_path, "server").certificate
    new_ca = init_ca(tmp_path, force=True).certificate
    with pytest.raises(InvalidSignature):
        old.verify_directly_issued_by(new_ca)


def test_issue_needs_a_ca(tmp_path):
    with pytest.raises(PkiError, match=r"ca\.crt: no such file"):
        issue(tmp_path, "server")


def test_issue_detects_a_mismatched_ca_key(tmp_path):
    init_ca(tmp_path / "a")
    init_ca(tmp_path / "b")
    shutil.copy(tmp_path / "b" / "ca.key", tmp_path / "a" / "ca.key")
    with pytest.raises(PkiError, match="does not match"):
        issue(tmp_path / "a", "server")


def test_issue_rejects_a_garbage_ca(tmp_path):
    init_ca(tmp_path)
    (tmp_path / "ca.crt").write_text("not a certificate\n")
    with pytest.raises(PkiError, match="not a PEM certificate"):
        issue(tmp_path, "server")


@pytest.mark.parametrize("name", ["", "ca", "CA", "../evil", ".hidden", "a/b", "sp ace", "x" * 65])
def test_issue_rejects_bad_names(tmp_path, name):
    init_ca(tmp_path)
    with pytest.raises(PkiError, match="invalid certificate name"):
        issue(tmp_path, name)


def test_issue_needs_a_role_and_positive_days(tmp_path):
    init_ca(tmp_path)
    with pytest.raises(PkiError, match="server, a client or both"):
        issue(tmp_path, "x", server=False, client=False)
    with pytest.raises(PkiError, match="days"):
        issue(tmp_path, "x", days=0)
    with pytest.raises(PkiError, match="days"):
        init_ca(tmp_path / "other", days=0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("localhost", x509.DNSName("localhost")),
        ("DNS:edge1.example.com", x509.DNSName("edge1.example.com")),
        ("dns:*.example.com", x509.DNSName("*.example.com")),
        ("127.0.0.1", x509.IPAddress(ipaddress.ip_address("127.0.0.1"))),
        ("::1", x509.IPAddress(ipaddress.ip_address("::1"))),
        ("IP:fe80::1", x509.IPAddress(ipaddress.ip_address("fe80::1"))),
        ("URI:spiffe://edge/node1", x509.UniformResourceIdentifier("spiffe://edge/node1")),
    ],
)
def test_parse_san(text, expected):
    assert parse_san(text) == expected


@pytest.mark.parametrize("text", ["IP:not-an-ip", "bad/name", "", "URI:nope", "héllo", "a b"])
def test_parse_san_rejects(text):
    with pytest.raises(PkiError, match="invalid SAN"):
        parse_san(text)


def test_python_ssl_accepts_the_pair_and_verifies_the_chain(tmp_path):
    init_ca(tmp_path)
    issue(tmp_path, "server")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    assert client.get_ca_certs()[0]["subject"] == ((("commonName", "gateway CA"),),)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_openssl_verifies_server_and_client_purposes(tmp_path):
    init_ca(tmp_path)
    issue(tmp_path, "server")
    issue(tmp_path, "dev1", server=False, client=True)

    def verify(name: str, purpose: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), "-purpose", purpose,
             str(tmp_path / f"{name}.crt")],
            capture_output=True, text=True, check=False,
        )

    assert verify("server", "sslserver").returncode == 0
    assert verify("dev1", "sslclient").returncode == 0
    assert verify("dev1", "sslserver").returncode != 0
    assert verify("server", "sslclient").returncode != 0
