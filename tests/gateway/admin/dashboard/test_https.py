"""The API and dashboard over HTTPS when ``[api] certfile``/``keyfile`` are set: the
setup link says https, the session cookie is Secure, plain HTTP gets no answer,
``gatewayctl`` follows; a broken certificate stops gatewayd with one line."""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.security.pki import init_ca, issue
from tests.gateway.admin.dashboard.web import setup_tokens
from tests.gateway.admin.gatewayd import Gatewayd, clean_environ
from tests.harness.gatewayd import gatewayd_command, gatewayd_env

pytestmark = pytest.mark.dashboard


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    init_ca(d)
    issue(d, "gateway-api")  # SANs localhost, 127.0.0.1, ::1
    return d


@pytest.fixture(scope="module")
def https_gw(tmp_path_factory: pytest.TempPathFactory, pki: Path) -> Iterator[Gatewayd]:
    gw = Gatewayd(tmp_path_factory.mktemp("https"), {
        "GATEWAY_API__CERTFILE": str(pki / "gateway-api.crt"),
        "GATEWAY_API__KEYFILE": str(pki / "gateway-api.key")})
    gw.start()
    yield gw
    gw.stop()


def https(gw: Gatewayd, pki: Path, method: str, path: str, body: object = None
          ) -> tuple[int, dict[str, str], bytes]:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))  # names checked: 127.0.0.1
    conn = http.client.HTTPSConnection("127.0.0.1", gw.api_port, timeout=30, context=ctx)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers=headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_dashboard_over_https(https_gw: Gatewayd, pki: Path) -> None:
    assert f"https://127.0.0.1:{https_gw.api_port}/dashboard/#/setup/" in https_gw.log()
    assert https(https_gw, pki, "GET", "/dashboard/")[0] == 200
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        plain = http.client.HTTPConnection("127.0.0.1", https_gw.api_port, timeout=10)
        plain.request("GET", "/status")
        plain.getresponse().read()
    ctl = subprocess.run([sys.executable, "-m", "gateway.cli.gatewayctl", "admin", "setup"],
                         env={**clean_environ(), **https_gw.env}, capture_output=True,
                         text=True, timeout=60, check=False)
    assert ctl.returncode == 0, ctl.stderr
    assert ctl.stdout.startswith(f"https://127.0.0.1:{https_gw.api_port}/dashboard/#/setup/")
    token = setup_tokens(ctl.stdout)[0]
    status, headers, _ = https(https_gw, pki, "POST", "/dashboard/api/setup",
                               {"token": token, "username": "root", "password": "tls-admin-pw"})
    assert status == 200
    assert "Secure" in headers["set-cookie"] and "HttpOnly" in headers["set-cookie"]


def test_a_broken_api_certificate_is_one_line_and_exit_2(tmp_path: Path, pki: Path) -> None:
    bad = tmp_path / "bad.crt"
    bad.write_text("not a certificate\n")
    r = subprocess.run(gatewayd_command("--check"), env=gatewayd_env({
        "GATEWAY_NODE__DATA_DIR": str(tmp_path / "data"),
        "GATEWAY_API__CERTFILE": str(bad),
        "GATEWAY_API__KEYFILE": str(pki / "gateway-api.key")}),
        capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "api.certfile" in lines[0], r.stderr
    r = subprocess.run(gatewayd_command("--check"), env=gatewayd_env({
        "GATEWAY_API__CERTFILE": str(pki / "gateway-api.crt")}),
        capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "certfile and keyfile go together" in r.stderr


def _encrypted_key(pki: Path, out: Path, password: bytes) -> Path:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key((pki / "gateway-api.key").read_bytes(), None)
    out.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.BestAvailableEncryption(password)))
    return out


def test_an_encrypted_api_key_opens_with_password_file(tmp_path: Path, pki: Path) -> None:
    key = _encrypted_key(pki, tmp_path / "api.key", b"api key secret")
    secret = tmp_path / "api.pass"
    secret.write_text("api key secret\n")
    gw = Gatewayd(tmp_path / "gw", {
        "GATEWAY_API__CERTFILE": str(pki / "gateway-api.crt"),
        "GATEWAY_API__KEYFILE": str(key),
        "GATEWAY_API__PASSWORD_FILE": str(secret)})
    gw.start()
    try:
        assert https(gw, pki, "GET", "/status")[0] == 200
    finally:
        gw.stop()


@pytest.mark.parametrize(("extra", "message"), [
    ({}, "api.keyfile: "),  # encrypted, no password
    ({"GATEWAY_API__PASSWORD": "wrong"}, "api.password: wrong password"),
    ({"GATEWAY_API__PASSWORD": "a", "GATEWAY_API__PASSWORD_FILE": "/x"},
     "password or password_file, not both"),
])
def test_api_key_password_mistakes_are_one_line(tmp_path: Path, pki: Path,
                                                extra: dict[str, str], message: str) -> None:
    key = _encrypted_key(pki, tmp_path / "api.key", b"right")
    r = subprocess.run(gatewayd_command("--check"), env=gatewayd_env({
        "GATEWAY_NODE__DATA_DIR": str(tmp_path / "data"),
        "GATEWAY_API__CERTFILE": str(pki / "gateway-api.crt"),
        "GATEWAY_API__KEYFILE": str(key), **extra}),
        capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
