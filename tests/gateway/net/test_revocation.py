"""Revocation on TLS listeners, end to end: a real gatewayd, certificates and CRLs from our
own CA (``gateway.security.pki`` / ``ca_revoke``, i.e. ``gatewayctl certs``), paho and
mosquitto_sub as clients, a local HTTP server for CRL distribution points and Debian's
``openssl ocsp`` as the OCSP responder; ``openssl s_client -status`` sees the staple."""

from __future__ import annotations

import http.server
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from gateway.security.ca_revoke import make_crl, revoke
from gateway.security.pki import init_ca, issue

from .clients import HAVE_MOSQUITTO_CLIENTS, Client, MosquittoSub, Refused
from .conftest import GatewayFactory, free_port

needs_mosquitto = pytest.mark.skipif(
    not HAVE_MOSQUITTO_CLIENTS, reason="mosquitto_pub/mosquitto_sub not installed"
)

pytestmark = [pytest.mark.slow, pytest.mark.security]
needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl CLI")


class Ca:
    """A CA directory made for one test: server, and the clients asked for."""

    def __init__(self, root: Path, *, crl_url: str | None = None,
                 ocsp_url: str | None = None) -> None:
        self.dir = root / "ca"
        init_ca(self.dir)
        issue(self.dir, "server", server=True)
        for name in ("dev1", "dev2", "dev3"):
            issue(self.dir, name, server=False, client=True,
                  crl_urls=[crl_url] if crl_url else (), ocsp_url=ocsp_url)
        make_crl(self.dir)

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def crl(self) -> Path:
        return self.dir / "crl.pem"

    def crt(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    def encrypted_key(self, name: str, password: str) -> tuple[Path, Path]:
        """``name``'s key encrypted with ``password`` (PKCS#8), and a password file."""
        key = serialization.load_pem_private_key(self.key(name).read_bytes(), None)
        enc = self.dir / f"{name}.enc.key"
        enc.write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(password.encode()),
        ))
        pw = self.dir / f"{name}.pw"
        pw.write_text(password + "\n")
        return enc, pw

    def revoke(self, name: str) -> None:
        revoke(self.dir, name, "keyCompromise")
        make_crl(self.dir)

    def client(self, addr: tuple[str, int], name: str) -> Client:
        return Client(addr, client_id=name, cafile=self.ca, cert=self.crt(name),
                      key=self.key(name))

    def listener(self, **kw: str) -> dict[str, str]:
        return {
            "certfile": str(self.crt("server")), "keyfile": str(self.key("server")),
            "cacertfile": str(self.ca), "verify": "verify_peer",
            "fail_if_no_peer_cert": "true", **kw,
        }


def refused(ca: Ca, addr: tuple[str, int], name: str) -> bool:
    try:
        ca.client(addr, name).connect().close()
    except Refused:
        return True
    return False


# ------------------------------------------------------------------ CRL files


@needs_mosquitto
def test_crl_file_refuses_revoked_clients_and_cuts_live_ones(tmp_path, gatewayd: GatewayFactory):
    ca = Ca(tmp_path)
    ca.revoke("dev2")
    gw = gatewayd(ssl=ca.listener(crlfile=str(ca.crl)),
                  env={"GATEWAY_CRL_CACHE__FILE_CHECK_INTERVAL": "0.2"})
    gw._wait(lambda: "ssl:default" in gw.log(), "listening")
    live = ca.client(gw.ssl, "dev1").connect()
    assert refused(ca, gw.ssl, "dev2")  # paho: the handshake fails (certificate revoked)
    with pytest.raises(Refused):  # mosquitto_sub too
        MosquittoSub(gw.ssl, ca.ca, "-t", "x", "-i", "dev2-sub",
                     cert=ca.crt("dev2"), key=ca.key("dev2")).close()
    sub = MosquittoSub(gw.ssl, ca.ca, "-t", "x", "-i", "dev3-sub",
                       cert=ca.crt("dev3"), key=ca.key("dev3"))
    try:
        # a half-written CRL file: refused (one line), the old CRL kept, nobody cut
        whole = ca.crl.read_bytes()
        ca.crl.write_bytes(whole[: len(whole) // 2])
        gw._wait(lambda: "TLS reload failed" in gw.log(), "refusing the half-written CRL")
        assert "ends inside a CRL" in gw.log()
        assert live.connected and refused(ca, gw.ssl, "dev2")
        # revoked while connected: the CRL file changes, the guard sees it and cuts dev1
        ca.revoke("dev1")
        assert live._gone.wait(10), "dev1 still connected after its revocation"
        gw._wait(lambda: "disconnected CN=dev1" in gw.log(), "logging the cut")
        assert sub.proc.poll() is None  # dev3 is untouched
        assert refused(ca, gw.ssl, "dev1")  # and dev1 cannot come back
        assert gw.log().count("TLS reload failed") == 1
    finally:
        sub.close()
        live.close()


def test_sighup_rereads_the_crl(tmp_path, gatewayd: GatewayFactory):
    ca = Ca(tmp_path)
    # file watching practically off: only SIGHUP can make the change known
    gw = gatewayd(ssl=ca.listener(crlfile=str(ca.crl)),
                  env={"GATEWAY_CRL_CACHE__FILE_CHECK_INTERVAL": "3600"})
    live = ca.client(gw.ssl, "dev3").connect()
    ca.revoke("dev3")
    assert live.connected
    gw.hup("CRL(s) loaded")
    assert live._gone.wait(10)
    assert refused(ca, gw.ssl, "dev3")
    assert not refused(ca, gw.ssl, "dev1")


def test_a_crl_of_another_ca_is_refused_by_check(tmp_path):
    ca = Ca(tmp_path)
    other = Ca(tmp_path / "other")
    env = {f"GATEWAY_LISTENERS__SSL__DEFAULT__{k.upper()}": v
           for k, v in ca.listener(crlfile=str(other.crl)).items()}
    env["PATH"] = "/usr/bin:/bin"
    result = subprocess.run([sys.executable, "-m", "gateway.cli.gatewayd", "--check"],
                            capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 2
    assert "listeners.ssl.default.crlfile" in result.stderr
    assert "not signed by a certificate of cacertfile" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ distribution points


class CrlServer:
    """An HTTP server on a free loopback port serving one file (the CRL); with ``gate``,
    each answer waits until the gate is set (at most 20 s)."""

    def __init__(self, path: Path, port: int = 0, gate: threading.Event | None = None) -> None:
        self.path = path
        self.requests = 0
        self.asked = threading.Event()
        served = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                served.requests += 1
                served.asked.set()
                if gate is not None:
                    gate.wait(20)
                data = served.path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/crl.pem"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_distribution_point_crl_is_fetched_cached_and_refreshed(tmp_path,
                                                                gatewayd: GatewayFactory):
    # the URL is in the certificates before the server exists: reserve its port first
    port = free_port()
    ca = Ca(tmp_path, crl_url=f"http://127.0.0.1:{port}/crl.pem")
    ca.revoke("dev2")
    server = CrlServer(ca.crl, port)
    try:
        gw = gatewayd(ssl=ca.listener(enable_crl_check="true"),
                      env={"GATEWAY_CRL_CACHE__REFRESH_INTERVAL": "1"})
        assert refused(ca, gw.ssl, "dev2")
        live = ca.client(gw.ssl, "dev1").connect()
        fetched = server.requests
        assert fetched >= 1
        ca.revoke("dev1")  # the next refresh fetches the new CRL and cuts dev1
        assert live._gone.wait(10), "dev1 not cut after the refreshed CRL revoked it"
        assert server.requests > fetched
        assert "CRL distribution point" in gw.log()
    finally:
        server.close()


def test_unreachable_distribution_point_fail_closed_and_open(tmp_path, gatewayd: GatewayFactory):
    ca = Ca(tmp_path, crl_url=f"http://127.0.0.1:{free_port()}/crl.pem")  # nobody listens
    closed = gatewayd(ssl=ca.listener(enable_crl_check="true"),
                      env={"GATEWAY_CRL_CACHE__HTTP_TIMEOUT": "2"})
    assert refused(ca, closed.ssl, "dev1")
    closed._wait(lambda: "fail_mode closed" in closed.log(), "logging the refusal")
    opened = gatewayd(ssl=ca.listener(enable_crl_check="true"),
                      env={"GATEWAY_CRL_CACHE__HTTP_TIMEOUT": "2",
                           "GATEWAY_CRL_CACHE__FAIL_MODE": "open"})
    assert not refused(ca, opened.ssl, "dev1")
    assert "admitted (fail_mode open)" in opened.log()


# ------------------------------------------------------------------ OCSP


class OcspResponder:
    """``openssl ocsp`` answering from the CA's index.txt on a free loopback port."""

    def __init__(self, ca_dir: Path, port: int) -> None:
        self.port = port
        self.log = ca_dir / f"ocsp-{port}.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                ["openssl", "ocsp", "-index", str(ca_dir / "index.txt"), "-port", str(port),
                 "-CA", str(ca_dir / "ca.crt"), "-rsigner", str(ca_dir / "ca.crt"),
                 "-rkey", str(ca_dir / "ca.key"), "-nmin", "1", "-ignore_err"],
                stdout=log, stderr=subprocess.STDOUT,
            )
        # up once it says so (a probe connection would hold the single-threaded responder)
        deadline = time.monotonic() + 10
        while "waiting for OCSP client connections" not in self.log.read_text():
            try:  # a bounded pause that ends at once if openssl exits
                self.proc.wait(0.05)
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise AssertionError("openssl ocsp did not start") from None
                continue
            raise AssertionError(f"openssl ocsp exited: {self.log.read_text()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def make_responder() -> Iterator[list[OcspResponder]]:
    started: list[OcspResponder] = []
    yield started
    for r in started:
        r.close()


@needs_openssl
def test_ocsp_check_of_client_certificates(tmp_path, gatewayd: GatewayFactory,
                                           make_responder):
    port = free_port()
    ca = Ca(tmp_path, ocsp_url=f"http://127.0.0.1:{port}")
    ca.revoke("dev2")
    # openssl ocsp reads index.txt at start (and each -nmin): start it after the revocation
    make_responder.append(OcspResponder(ca.dir, port))
    gw = gatewayd(ssl=ca.listener(**{"ocsp_check__enable": "true"}))
    assert not refused(ca, gw.ssl, "dev1")
    assert refused(ca, gw.ssl, "dev2")
    gw._wait(lambda: "refused CN=dev2" in gw.log(), "logging the refusal")
    # no responder: fail closed (default)
    make_responder.pop().close()
    gw2 = gatewayd(ssl=ca.listener(**{"ocsp_check__enable": "true",
                                      "ocsp_check__http_timeout": "2"}))
    assert refused(ca, gw2.ssl, "dev1")


@needs_openssl
@pytest.mark.parametrize("kind", ["ssl", "wss", "api"])
def test_ocsp_stapling_seen_by_s_client(tmp_path, gatewayd: GatewayFactory, make_responder,
                                        kind: str):
    port = free_port()
    ca = Ca(tmp_path)
    make_responder.append(OcspResponder(ca.dir, port))
    lst = {"certfile": str(ca.crt("server")), "keyfile": str(ca.key("server")),
           "ocsp__enable_ocsp_stapling": "true", "ocsp__responder_url": f"http://127.0.0.1:{port}",
           "ocsp__issuer_pem": str(ca.ca)}
    if kind == "ssl":
        gw = gatewayd(ssl=lst)
        at = gw.ssl[1]
    elif kind == "wss":  # the TLS under the WebSocket staples the same way
        at = free_port()
        env = {f"GATEWAY_LISTENERS__WSS__DEFAULT__{k.upper()}": v for k, v in lst.items()}
        gw = gatewayd(ssl={"enable": "false"},
                      env={**env, "GATEWAY_LISTENERS__WSS__DEFAULT__BIND": f"127.0.0.1:{at}"})
    else:  # the HTTPS management API ([api] certfile, [api.ocsp])
        at = free_port()
        env = {f"GATEWAY_API__{k.upper()}": v for k, v in lst.items()}
        gw = gatewayd(ssl={"enable": "false"},
                      env={**env, "GATEWAY_API__ENABLE": "true",
                           "GATEWAY_API__BIND": f"127.0.0.1:{at}"})
    gw._wait(lambda: "stapling OCSP response (good)" in gw.log(), "fetching the staple")
    out = subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{at}", "-status",
         "-CAfile", str(ca.ca)],
        input="", capture_output=True, text=True, timeout=30, check=False,
    )
    text = out.stdout + out.stderr
    assert "OCSP Response Status: successful" in text, text
    assert "Cert Status: good" in text
    # and without -status nothing is stapled
    out = subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{at}", "-CAfile", str(ca.ca)],
        input="", capture_output=True, text=True, timeout=30, check=False,
    )
    assert "OCSP Response Status" not in out.stdout + out.stderr


# ------------------------------------------------------------------ encrypted keys


def test_encrypted_server_key_with_password_file(tmp_path, gatewayd: GatewayFactory):
    ca = Ca(tmp_path)
    enc, pw = ca.encrypted_key("server", "s3cret pass")
    lst = ca.listener(keyfile=str(enc), password_file=str(pw))
    gw = gatewayd(ssl=lst)
    assert not refused(ca, gw.ssl, "dev1")

    def check(**kw: str) -> subprocess.CompletedProcess[str]:
        env = {f"GATEWAY_LISTENERS__SSL__DEFAULT__{k.upper()}": v
               for k, v in {**lst, **kw}.items()}
        env["PATH"] = "/usr/bin:/bin"
        return subprocess.run([sys.executable, "-m", "gateway.cli.gatewayd", "--check"],
                              capture_output=True, text=True, env=env, timeout=60, check=False)

    pw.write_text("wrong\n")
    bad = check()
    assert bad.returncode == 2 and "listeners.ssl.default.password: wrong password" in bad.stderr
    pw.write_text("s3cret pass\n")
    assert check().returncode == 0
    missing = check(password_file=str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "password_file: no such file" in missing.stderr


# ------------------------------------------------------------------ DTLS (CoAP)


class Dtls:
    """A gatewayd with one CoAP DTLS listener (``sec``) requiring client certificates of
    ``ca``, and python-mbedtls clients posting to ``/ps/t`` (CON, CHANGED expected)."""

    prefix = "GATEWAY_GATEWAY__COAP__LISTENERS__DTLS__SEC__"

    def __init__(self, ca: Ca, gatewayd: GatewayFactory, env: dict[str, str] | None = None,
                 **listener: str) -> None:
        import mbedtls.tls
        from mbedtls.exceptions import TLSError

        self.tls = mbedtls.tls
        self.errors = (OSError, TLSError)
        self.ca = ca
        self.port = free_port(socket.SOCK_DGRAM)
        settings = {"BIND": f"127.0.0.1:{self.port}",
                    "CERTFILE": str(ca.crt("server")), "KEYFILE": str(ca.key("server")),
                    "CACERTFILE": str(ca.ca), "VERIFY": "verify_peer",
                    "FAIL_IF_NO_PEER_CERT": "true",
                    **{k.upper(): v for k, v in listener.items()}}
        self.gw = gatewayd({"enable": "false"}, env={
            "GATEWAY_GATEWAY__COAP__LISTENERS__UDP__DEFAULT__ENABLE": "false",
            **{self.prefix + k: v for k, v in settings.items()}, **(env or {}),
        })
        self.gw._wait(lambda: "listener coap:dtls:sec" in self.gw.log(),
                      "opening coap:dtls:sec")

    def session(self, name: str) -> Any:
        from mbedtls import pk
        from mbedtls import x509 as mx509

        tls, ca = self.tls, self.ca
        key = serialization.load_pem_private_key(ca.key(name).read_bytes(), None)
        der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        conf = tls.DTLSConfiguration(
            validate_certificates=True,
            trust_store=tls.TrustStore([mx509.CRT.from_file(ca.ca)]),
            certificate_chain=((mx509.CRT.from_file(ca.crt(name)),), pk.ECC.from_DER(der)),
        )
        raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        raw.settimeout(3)
        sock = tls.ClientContext(conf).wrap_socket(raw, server_hostname="localhost")
        sock.connect(("127.0.0.1", self.port))
        sock.do_handshake()
        return sock

    def ask(self, sock: Any, mid: int) -> Any:
        from protocols.coap.codec import CON, Code, decode, encode, make

        try:
            m = make(CON, Code.POST, mid, b"t", b"x")
            m.opt.uri_path = ("ps", "t")
            sock.send(encode(m))
            return Code(decode(sock.recv(2048)).code)
        except self.errors:
            return None  # closed or no answer: refused

    def post(self, name: str) -> Any:
        try:
            sock = self.session(name)
        except self.errors:
            return None
        try:
            return self.ask(sock, 1)
        finally:
            sock.close()


def test_dtls_crlfile_refuses_a_revoked_device(tmp_path, gatewayd: GatewayFactory):
    from protocols.coap.codec import Code

    ca = Ca(tmp_path)
    ca.revoke("dev2")
    # file watching practically off: only SIGHUP can make the change known
    d = Dtls(ca, gatewayd, {"GATEWAY_CRL_CACHE__FILE_CHECK_INTERVAL": "3600"},
             crlfile=str(ca.crl))
    gw = d.gw
    assert d.post("dev1") == Code.CHANGED
    assert d.post("dev2") is None
    gw._wait(lambda: "refused CN=dev2" in gw.log(), "logging the refusal")
    live = d.session("dev3")  # a session that stays up across the revocation
    assert d.ask(live, 1) == Code.CHANGED
    ca.revoke("dev1")  # SIGHUP re-reads the CRL for new handshakes
    ca.revoke("dev3")  # ... and cuts the live session of a revoked device
    gw.hup("DTLS reloaded")
    assert d.post("dev1") is None
    gw._wait(lambda: "disconnected CN=dev3" in gw.log(), "logging the cut")
    try:
        assert d.ask(live, 2) is None  # close_notify came: no answer any more
    finally:
        live.close()


def test_dtls_crl_file_rewritten_cuts_the_live_session_without_a_signal(
        tmp_path, gatewayd: GatewayFactory):
    """The CRL file is watched: a half-written file is refused (one ERROR line, the old
    CRL kept, nothing cut), the complete one, put in place by a rename, cuts dev3."""
    from protocols.coap.codec import Code

    ca = Ca(tmp_path)
    live_crl = tmp_path / "live-crl.pem"
    live_crl.write_bytes(ca.crl.read_bytes())
    d = Dtls(ca, gatewayd, {"GATEWAY_CRL_CACHE__FILE_CHECK_INTERVAL": "0.2"},
             crlfile=str(live_crl))
    gw = d.gw
    live = d.session("dev3")
    try:
        assert d.ask(live, 1) == Code.CHANGED
        ca.revoke("dev3")
        whole = ca.crl.read_bytes()
        live_crl.write_bytes(whole[: len(whole) // 2])  # a writer caught half-way
        gw._wait(lambda: "DTLS reload failed" in gw.log(), "refusing the half-written CRL")
        assert d.ask(live, 2) == Code.CHANGED  # the old CRL is kept: dev3 still served
        assert d.post("dev1") == Code.CHANGED
        tmp = tmp_path / "crl.tmp"
        tmp.write_bytes(whole)
        tmp.replace(live_crl)
        gw._wait(lambda: "disconnected CN=dev3" in gw.log(), "cutting dev3")
        assert d.ask(live, 3) is None
        assert d.post("dev3") is None  # and it cannot come back
        assert d.post("dev1") == Code.CHANGED
        assert gw.log().count("DTLS reload failed") == 1
    finally:
        live.close()


@needs_openssl
def test_dtls_distribution_points_and_ocsp(tmp_path, gatewayd: GatewayFactory, make_responder):
    """DTLS listeners check client certificates' CRL distribution points and ask OCSP,
    as the TLS listeners do (the same guard); fail_mode closed and open."""
    from protocols.coap.codec import CON, Code, decode, encode, make

    ocsp_port, crl_port = free_port(), free_port()
    ca = Ca(tmp_path, crl_url=f"http://127.0.0.1:{crl_port}/crl.pem",
            ocsp_url=f"http://127.0.0.1:{ocsp_port}")
    ca.revoke("dev2")
    gate = threading.Event()
    crls = CrlServer(ca.crl, crl_port, gate)
    try:
        dp = Dtls(ca, gatewayd, {"GATEWAY_CRL_CACHE__REFRESH_INTERVAL": "1"},
                  enable_crl_check="true")
        # dev1's verdict waits for the CRL: its requests are held, then answered in order
        sock = dp.session("dev1")
        try:
            assert crls.asked.wait(10)
            for mid in (1, 2):
                m = make(CON, Code.POST, mid, b"t", b"x")
                m.opt.uri_path = ("ps", "t")
                sock.send(encode(m))
            sock._socket.settimeout(0.3)  # nothing may come before the verdict
            with pytest.raises(dp.errors):
                sock.recv(2048)
            sock._socket.settimeout(5)
            gate.set()
            assert [decode(sock.recv(2048)).mid for _ in (1, 2)] == [1, 2]
        finally:
            sock.close()
        assert dp.post("dev1") == Code.CHANGED
        assert dp.post("dev2") is None
        dp.gw._wait(lambda: "refused CN=dev2" in dp.gw.log(), "logging the CRL refusal")
        assert crls.requests >= 1
        # revoked while its session is up: the next refresh of the CRL closes it
        live = dp.session("dev3")
        try:
            assert dp.ask(live, 1) == Code.CHANGED
            ca.revoke("dev3")
            dp.gw._wait(lambda: "disconnected CN=dev3" in dp.gw.log(), "cutting dev3")
            assert dp.ask(live, 2) is None
        finally:
            live.close()
    finally:
        crls.close()
    make_responder.append(OcspResponder(ca.dir, ocsp_port))
    oc = Dtls(ca, gatewayd, OCSP_CHECK__ENABLE="true")
    assert oc.post("dev1") == Code.CHANGED
    assert oc.post("dev2") is None
    oc.gw._wait(lambda: "refused CN=dev2" in oc.gw.log(), "logging the OCSP refusal")
    make_responder.pop().close()  # nobody answers any more
    closed = Dtls(ca, gatewayd, OCSP_CHECK__ENABLE="true", OCSP_CHECK__HTTP_TIMEOUT="1")
    assert closed.post("dev1") is None
    closed.gw._wait(lambda: "fail_mode closed" in closed.gw.log(), "logging fail closed")
    opened = Dtls(ca, gatewayd, OCSP_CHECK__ENABLE="true", OCSP_CHECK__HTTP_TIMEOUT="1",
                  OCSP_CHECK__FAIL_MODE="open")
    assert opened.post("dev1") == Code.CHANGED
    assert "admitted (fail_mode open)" in opened.gw.log()


def test_dtls_encrypted_key_with_password_file(tmp_path, gatewayd: GatewayFactory):
    """The DTLS listener's keyfile encrypted, opened with password_file; --check names a
    wrong password in one line (exit 2)."""
    from protocols.coap.codec import Code

    ca = Ca(tmp_path)
    enc, pw = ca.encrypted_key("server", "dtls pass")
    d = Dtls(ca, gatewayd, keyfile=str(enc), password_file=str(pw))
    assert d.post("dev1") == Code.CHANGED
    env = {k: v for k, v in d.gw.env.items() if k.startswith("GATEWAY_")}
    env["PATH"] = "/usr/bin:/bin"
    pw.write_text("wrong\n")
    bad = subprocess.run([sys.executable, "-m", "gateway.cli.gatewayd", "--check"],
                         capture_output=True, text=True, env=env, timeout=60, check=False)
    assert bad.returncode == 2, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert bad.stderr.strip().endswith(
        f'gateway.coap.listeners.dtls.sec.password: wrong password for "{enc}"'), bad.stderr


# ------------------------------------------------------------------ wss


def test_wss_listener_refuses_and_cuts_revoked_clients(tmp_path, gatewayd: GatewayFactory):
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    ca = Ca(tmp_path)
    ca.revoke("dev2")
    port = free_port()
    env = {"GATEWAY_LISTENERS__WSS__DEFAULT__BIND": f"127.0.0.1:{port}",
           "GATEWAY_CRL_CACHE__FILE_CHECK_INTERVAL": "0.2"}
    env.update({f"GATEWAY_LISTENERS__WSS__DEFAULT__{k.upper()}": v
                for k, v in ca.listener(crlfile=str(ca.crl)).items()})
    gw = gatewayd(ssl={"enable": "false"}, env=env)
    gw._wait(lambda: "listener wss:default" in gw.log(), "opening wss:default")

    def connect(name: str) -> tuple[mqtt.Client, threading.Event, list[int]]:
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=name, transport="websockets",
                        reconnect_on_failure=False)
        c.ws_set_options(path="/mqtt")
        c.tls_set(ca_certs=str(ca.ca), certfile=str(ca.crt(name)), keyfile=str(ca.key(name)))
        done, gone, codes = threading.Event(), threading.Event(), []
        c.on_connect = lambda *a: (codes.append(a[3].value), done.set())
        c.on_disconnect = lambda *a: (gone.set(), done.set())
        try:
            c.connect("127.0.0.1", port)
        except OSError:
            gone.set()
            return c, gone, codes
        c.loop_start()
        done.wait(10)
        return c, gone, codes

    c1, gone1, codes1 = connect("dev1")
    assert codes1 == [0] and not gone1.is_set()
    c2, gone2, codes2 = connect("dev2")
    assert codes2 != [0] or gone2.is_set()
    c2.loop_stop()
    ca.revoke("dev1")
    assert gone1.wait(10), "dev1 (wss) still connected after its revocation"
    c1.loop_stop()


# ------------------------------------------------------------------ intermediate CAs


def _root_and_intermediate(tmp_path: Path) -> tuple[Path, Path]:
    """A root CA (``root.crt``, made here: no path length limit) and an intermediate CA
    directory of our PKI (``gatewayctl certs`` layout) whose ca.crt the root signed."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    root_key = ec.generate_private_key(ec.SECP256R1())
    root_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleet root CA")])
    root = (x509.CertificateBuilder().subject_name(root_name).issuer_name(root_name)
            .public_key(root_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .sign(root_key, hashes.SHA256()))
    root_path = tmp_path / "root.crt"
    root_path.write_bytes(root.public_bytes(serialization.Encoding.PEM))
    inter = tmp_path / "inter"
    init_ca(inter, common_name="plant intermediate CA")
    own = x509.load_pem_x509_certificate((inter / "ca.crt").read_bytes())
    signed = (x509.CertificateBuilder().subject_name(own.subject).issuer_name(root_name)
              .public_key(own.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(hours=1))
              .not_valid_after(now + datetime.timedelta(days=30)))
    for ext in own.extensions:
        if not isinstance(ext.value, x509.AuthorityKeyIdentifier):
            signed = signed.add_extension(ext.value, ext.critical)
    (inter / "ca.crt").write_bytes(
        signed.sign(root_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    return root_path, inter


@needs_openssl
def test_ocsp_and_distribution_points_for_an_intermediate_ca(tmp_path, gatewayd: GatewayFactory,
                                                             make_responder):
    """cacertfile holds only the root; the devices' certificates come from an
    intermediate CA that they send in their chain. Its OCSP answers and its CRL are
    checked against the intermediate learnt from the verified chain (before: "issuer
    not in cacertfile", refused by fail_mode closed)."""
    ocsp_port, crl_port = free_port(), free_port()
    server = Ca(tmp_path / "server")  # the listener's own certificate
    root, inter = _root_and_intermediate(tmp_path)
    for name in ("dev1", "dev2"):
        issue(inter, name, server=False, client=True, ocsp_url=f"http://127.0.0.1:{ocsp_port}",
              crl_urls=[f"http://127.0.0.1:{crl_port}/crl.pem"])
        (inter / f"{name}.chain").write_bytes(
            (inter / f"{name}.crt").read_bytes() + (inter / "ca.crt").read_bytes())
    revoke(inter, "dev2", "keyCompromise")
    make_crl(inter)
    make_responder.append(OcspResponder(inter, ocsp_port))
    crls = CrlServer(inter / "crl.pem", crl_port)

    def refused_here(addr: tuple[str, int], name: str) -> bool:
        try:
            Client(addr, client_id=name, cafile=server.ca, cert=inter / f"{name}.chain",
                   key=inter / f"{name}.key").connect().close()
        except Refused:
            return True
        return False

    try:
        listener = server.listener(cacertfile=str(root))
        gw = gatewayd(ssl={**listener, "ocsp_check__enable": "true"})
        assert not refused_here(gw.ssl, "dev1")
        assert refused_here(gw.ssl, "dev2")
        gw._wait(lambda: "refused CN=dev2" in gw.log(), "logging the OCSP refusal")
        assert "intermediate CA CN=plant intermediate CA learnt" in gw.log()
        gw2 = gatewayd(ssl={**listener, "enable_crl_check": "true"})
        assert not refused_here(gw2.ssl, "dev1")
        assert refused_here(gw2.ssl, "dev2")
        assert crls.requests >= 1
    finally:
        crls.close()
