"""Revocation and encrypted keys on the other TLS ends, in process: the cluster's mutual
TLS contexts (both directions) and the bridge's client context, handshaking over real
loopback sockets; the built-in CA's revoke/crl; the revocation checks themselves
(:mod:`gateway.security.revocation`) on CRLs and OCSP responses made here."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import ocsp

from gateway.bridge.tls import client_context
from gateway.cluster.tls import build as cluster_build
from gateway.config.schema import BridgeTls
from gateway.net.tls import TlsError
from gateway.security.ca_revoke import make_crl, revoke, revoked
from gateway.security.pki import PkiError, init_ca, issue, load_ca
from gateway.security.revocation import crl_status, ocsp_answer

pytestmark = pytest.mark.security


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    d = tmp_path / "ca"
    init_ca(d)
    for name in ("n1", "n2", "n3"):
        issue(d, name, server=True, client=True)
    make_crl(d)
    return d


def encrypt(key_path: Path, password: bytes) -> Path:
    key = serialization.load_pem_private_key(key_path.read_bytes(), None)
    out = key_path.with_suffix(".enc")
    out.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.BestAvailableEncryption(password)))
    return out


async def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> bool:
    """True when both ends complete the handshake and exchange a byte (TLS 1.3 reports a
    refused client certificate only on the first read)."""
    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"x")
        try:
            await w.drain()
            await r.read(1)
        except (ConnectionError, ssl.SSLError):
            pass
        w.close()

    srv = await asyncio.start_server(on_conn, "127.0.0.1", 0, ssl=server)
    port = srv.sockets[0].getsockname()[1]
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port, ssl=client,
                                             server_hostname="localhost")
        data = await r.read(1)
        w.close()
        return data == b"x"
    except (ssl.SSLError, ConnectionError):
        return False
    finally:
        srv.close()


def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> bool:
    return asyncio.run(asyncio.wait_for(_handshake(server, client), 10))


def node(ca: Path, name: str, **kw: object):  # type: ignore[no-untyped-def]
    return cluster_build(ca / f"{name}.crt", ca / f"{name}.key", ca / "ca.crt", **kw)


def test_cluster_refuses_a_revoked_node_in_both_directions(ca):
    revoke(ca, "n2")
    make_crl(ca)
    n1 = node(ca, "n1", crlfile=[ca / "crl.pem"])
    n2 = node(ca, "n2")  # the revoked node itself has no CRL: it is n1 that refuses it
    n3 = node(ca, "n3", crlfile=[ca / "crl.pem"])
    assert handshake(n1.server, n3.client)
    assert handshake(n3.server, n1.client)
    assert not handshake(n1.server, n2.client)  # n2 dials n1: refused
    assert not handshake(n2.server, n1.client)  # n1 dials n2: n1 refuses its certificate
    without = node(ca, "n1")
    assert handshake(without.server, n2.client)  # the same without the CRL (the test can fail)


def test_cluster_encrypted_key(ca):
    enc = encrypt(ca / "n1.key", b"pw")
    tls = cluster_build(ca / "n1.crt", enc, ca / "ca.crt", password=b"pw")
    assert handshake(tls.server, node(ca, "n2").client)
    with pytest.raises(TlsError, match="encrypted: give password"):
        cluster_build(ca / "n1.crt", enc, ca / "ca.crt")
    with pytest.raises(TlsError, match="wrong password"):
        cluster_build(ca / "n1.crt", enc, ca / "ca.crt", password=b"nope")


def test_bridge_refuses_a_revoked_upstream_and_opens_an_encrypted_key(ca, tmp_path):
    upstream = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # n1: SAN localhost, from the CA
    upstream.load_cert_chain(ca / "n1.crt", ca / "n1.key")
    good = BridgeTls(enable=True, cacertfile=ca / "ca.crt", crlfile=[ca / "crl.pem"])
    assert handshake(upstream, client_context(good))
    revoke(ca, "n1")
    make_crl(ca)
    assert not handshake(upstream, client_context(good))
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    enc = encrypt(ca / "n3.key", b"s3cret")
    mutual = BridgeTls(enable=True, cacertfile=ca / "ca.crt", certfile=ca / "n3.crt",
                       keyfile=enc, password_file=pw)
    client_context(mutual)  # opens
    pw.write_text("wrong\n")
    with pytest.raises(TlsError) as err:
        client_context(mutual)
    assert err.value.key == "password"


def test_crl_signed_by_another_ca_is_refused(ca, tmp_path):
    other = tmp_path / "other"
    init_ca(other, common_name="other CA")
    make_crl(other)
    with pytest.raises(TlsError, match="not signed by a certificate of cacertfile"):
        cluster_build(ca / "n1.crt", ca / "n1.key", ca / "ca.crt", crlfile=[other / "crl.pem"])
    with pytest.raises(TlsError, match="no CRL"):
        garbage = tmp_path / "garbage.pem"
        garbage.write_text("not a CRL")
        cluster_build(ca / "n1.crt", ca / "n1.key", ca / "ca.crt", crlfile=[garbage])


def test_ca_revoke_and_crl(ca):
    assert revoked(ca) == []
    r = revoke(ca, "n3", "keyCompromise")
    assert revoke(ca, "n3").at == r.at  # idempotent: the first date stays
    path = make_crl(ca, days=2)
    crl = x509.load_pem_x509_crl(path.read_bytes())
    cert = x509.load_pem_x509_certificate((ca / "n3.crt").read_bytes())
    entry = crl.get_revoked_certificate_by_serial_number(cert.serial_number)
    assert entry is not None
    assert entry.extensions.get_extension_for_class(x509.CRLReason).value.reason == \
        x509.ReasonFlags.key_compromise
    assert crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number == 2
    ca_cert, _ = load_ca(ca)
    assert crl.is_signature_valid(ca_cert.public_key())  # type: ignore[arg-type]
    assert crl_status(cert, [crl]) == "revoked"
    n1 = x509.load_pem_x509_certificate((ca / "n1.crt").read_bytes())
    assert crl_status(n1, [crl]) == "good"
    line = [x for x in (ca / "index.txt").read_text().splitlines() if x.startswith("R")]
    assert len(line) == 1 and line[0].endswith("/CN=n3")
    with pytest.raises(PkiError, match="unknown reason"):
        revoke(ca, "n1", "bored")


def _ocsp(ca: Path, name: str, status: ocsp.OCSPCertStatus, signer: str = "ca") -> bytes:
    ca_cert, ca_key = load_ca(ca)
    cert = x509.load_pem_x509_certificate((ca / f"{name}.crt").read_bytes())
    now = datetime.datetime.now(datetime.UTC)
    key: ec.EllipticCurvePrivateKey = ca_key
    responder = ca_cert
    if signer != "ca":  # a certificate not delegated for OCSP signing
        responder = x509.load_pem_x509_certificate((ca / f"{signer}.crt").read_bytes())
        key = serialization.load_pem_private_key(  # type: ignore[assignment]
            (ca / f"{signer}.key").read_bytes(), None)
    builder = ocsp.OCSPResponseBuilder().add_response(
        cert=cert, issuer=ca_cert, algorithm=hashes.SHA1(), cert_status=status,
        this_update=now, next_update=now + datetime.timedelta(hours=1),
        revocation_time=now if status == ocsp.OCSPCertStatus.REVOKED else None,
        revocation_reason=None,
    ).responder_id(ocsp.OCSPResponderEncoding.HASH, responder)
    if signer != "ca":
        builder = builder.certificates([responder])
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


def test_ocsp_answers_are_verified(ca):
    ca_cert, _ = load_ca(ca)
    n1 = x509.load_pem_x509_certificate((ca / "n1.crt").read_bytes())
    assert ocsp_answer(_ocsp(ca, "n1", ocsp.OCSPCertStatus.GOOD), n1, ca_cert)[0] == "good"
    assert ocsp_answer(_ocsp(ca, "n1", ocsp.OCSPCertStatus.REVOKED), n1, ca_cert)[0] == \
        "revoked"
    with pytest.raises(ValueError, match="did not delegate"):  # n2 signs about n1: no
        ocsp_answer(_ocsp(ca, "n1", ocsp.OCSPCertStatus.GOOD, signer="n2"), n1, ca_cert)
    n2 = x509.load_pem_x509_certificate((ca / "n2.crt").read_bytes())
    with pytest.raises(ValueError, match="another certificate"):
        ocsp_answer(_ocsp(ca, "n1", ocsp.OCSPCertStatus.GOOD), n2, ca_cert)


@pytest.mark.parametrize(
    ("section", "error"),
    [
        ({"listeners": {"ssl": {"x": {"certfile": "a", "keyfile": "b", "crlfile": "c.pem"}}}},
         'need verify = "verify_peer"'),
        ({"listeners": {"ssl": {"x": {"certfile": "a", "keyfile": "b", "password": "p",
                                      "password_file": "f"}}}},
         "give password or password_file, not both"),
        ({"listeners": {"ssl": {"x": {"certfile": "a", "keyfile": "b",
                                      "ocsp": {"enable_ocsp_stapling": True}}}}},
         "enable_ocsp_stapling needs responder_url and issuer_pem"),
        ({"authentication": {"jwt": {"enable": True, "use_jwks": True}}},
         "use_jwks needs endpoint"),
        ({"authentication": {"jwt": {"enable": True}}}, 'algorithm = "hmac-based" needs secret'),
        ({"authorization": {"sources": [{"type": "http", "url": "ftp://x"}]}},
         "expected an http:// or https:// URL"),
        ({"crl_cache": {"fail_mode": "ajar"}}, "fail_mode"),
    ],
)
def test_schema_refuses_inconsistent_settings(section, error):
    from pydantic import ValidationError

    from gateway.config.schema import GatewayConfig

    with pytest.raises(ValidationError, match=error):
        GatewayConfig.model_validate(section)


def test_schema_accepts_the_documented_shapes():
    from gateway.config.schema import GatewayConfig

    cfg = GatewayConfig.model_validate({
        "listeners": {"ssl": {"x": {
            "certfile": "a", "keyfile": "b", "cacertfile": "c", "verify": "verify_peer",
            "crlfile": "one.pem,two.pem", "enable_crl_check": True, "depth": 3,
            "peer_cert_as_clientid": "md5",
            "ocsp_check": {"enable": True, "fail_mode": "open"},
        }}},
        "authentication": {"jwt": {"enable": True, "from": "username", "secret": "s",
                                   "verify_claims": {"sub": "${clientid}"}}},
        "authorization": {"sources": [{"type": "http", "url": "http://127.0.0.1:1/a",
                                       "method": "get"}]},
        "crl_cache": {"refresh_interval": "1m"},
    })
    ssl_x = cfg.listeners.ssl["x"]
    assert [str(p) for p in ssl_x.crlfile] == ["one.pem", "two.pem"]
    assert cfg.authentication.jwt.from_ == "username"
    assert cfg.crl_cache.refresh_interval == 60.0


def test_gatewayctl_certs_revoke_and_crl(ca):
    import subprocess
    import sys

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gateway.cli.gatewayctl", "certs", *args],
                              capture_output=True, text=True, timeout=60, check=False)

    r = ctl("revoke", str(ca), "n2", "--reason", "superseded")
    assert r.returncode == 0 and "revoked /CN=n2" in r.stdout, r.stderr
    r = ctl("crl", str(ca), "--days", "1")
    assert r.returncode == 0 and "(1 revoked)" in r.stdout
    bad = ctl("revoke", str(ca), "nobody")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"Error: no certificate 'nobody' (neither a file nor {ca}/nobody.crt)"]
    usage = ctl("revoke", str(ca), "n1", "--reason", "bored")
    assert usage.returncode == 2  # click's usage error: not one of the reasons


def test_verified_chain_of_a_live_connection(ca):
    """openssl_ext.verified_chain on both ends of a real loopback handshake: the peer's
    certificate then the CA; None for what is not an SSL connection."""
    from gateway.net.openssl_ext import available, verified_chain

    if not available():
        pytest.skip("no ctypes access to the OpenSSL Python links")
    seen: dict[str, object] = {}

    async def run() -> None:
        n1, n2 = node(ca, "n1"), node(ca, "n2")

        async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            seen["server"] = verified_chain(w.get_extra_info("ssl_object"))
            w.write(b"x")
            await w.drain()
            w.close()

        srv = await asyncio.start_server(on_conn, "127.0.0.1", 0, ssl=n1.server)
        port = srv.sockets[0].getsockname()[1]
        r, w = await asyncio.open_connection("127.0.0.1", port, ssl=n2.client,
                                             server_hostname="localhost")
        seen["client"] = verified_chain(w.get_extra_info("ssl_object"))
        await r.read(1)
        w.close()
        srv.close()

    asyncio.run(asyncio.wait_for(run(), 10))

    def names(chain: object) -> list[str]:
        assert isinstance(chain, list)
        return [x509.load_der_x509_certificate(d).subject.rfc4514_string() for d in chain]

    assert names(seen["server"]) == ["CN=n2", "CN=gateway CA"]  # the client's, verified
    assert names(seen["client"]) == ["CN=n1", "CN=gateway CA"]
    assert verified_chain(object()) is None
