"""DTLS listeners in a real gatewayd: SIGHUP reloads keys and certificates without
dropping sessions (the channel-level behaviour is in tests/protocols/coap/test_dtls.py).

The client is python-mbedtls on a UDP socket; readiness and log lines are awaited by
bounded polling, never fixed sleeps.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import Any

from mbedtls import tls
from mbedtls import x509 as mx509

from protocols.coap.codec import CON, Code, decode, encode, make
from tests.harness.gatewayd import free_port

from .conftest import GatewayFactory, GatewayProcess, Pki, gatewayctl

TIMEOUT = 10.0


def free_udp_port() -> int:
    return free_port(socket.SOCK_DGRAM)


def serial(path: Path) -> int:
    return mx509.CRT.from_file(path).serial_number


class Device:
    """A DTLS client on its own UDP socket (python-mbedtls' socket wrapper)."""

    def __init__(self, port: int, ca: Path, psk: tuple[str, bytes] | None = None) -> None:
        kwargs: dict[str, Any] = {"validate_certificates": psk is None}
        if psk is None:
            kwargs["trust_store"] = tls.TrustStore([mx509.CRT.from_file(ca)])
        else:
            kwargs["pre_shared_key"] = psk
            kwargs["ciphers"] = [c for c in tls.ciphers_available() if c.startswith("TLS-PSK-")]
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.settimeout(TIMEOUT)
        self.sock = tls.ClientContext(tls.DTLSConfiguration(**kwargs)).wrap_socket(
            sock, server_hostname="localhost"
        )
        self.sock.connect(("127.0.0.1", port))
        self.sock.do_handshake()
        self.mid = 0

    @property
    def server_serial(self) -> int:
        return int(mx509.CRT.from_DER(self.sock._buffer.getpeercert(True)).serial_number)

    def post(self, path: str, payload: bytes) -> Code:
        self.mid += 1
        m = make(CON, Code.POST, self.mid, b"t", payload)
        m.opt.uri_path = tuple(path.split("/"))
        self.sock.send(encode(m))
        return Code(decode(self.sock.recv(2048)).code)

    def close(self) -> None:
        self.sock.close()


def start(gatewayd: GatewayFactory, d: Path, port: int) -> GatewayProcess:
    prefix = "GATEWAY_GATEWAY__COAP__LISTENERS__DTLS__HUP__"
    gw = gatewayd(
        {"enable": "false"},
        env={
            "GATEWAY_GATEWAY__COAP__LISTENERS__UDP__DEFAULT__ENABLE": "false",
            prefix + "BIND": f"127.0.0.1:{port}",
            prefix + "CERTFILE": str(d / "server.crt"),
            prefix + "KEYFILE": str(d / "server.key"),
            prefix + "PSK_FILE": str(d / "psk.txt"),
        },
    )
    gw._wait(lambda: "listener coap:dtls:hup" in gw.log(), "opening coap:dtls:hup")
    return gw


def test_sighup_reloads_dtls_keys_without_dropping_sessions(
    pki: Pki, gatewayd: GatewayFactory, tmp_path: Path
) -> None:
    d = tmp_path / "pki"
    shutil.copytree(pki.dir, d)
    (d / "psk.txt").write_text("dev-a:ka\n")
    port = free_udp_port()
    gw = start(gatewayd, d, port)
    old = serial(d / "server.crt")
    established = Device(port, d / "ca.crt")
    assert established.server_serial == old
    assert established.post("ps/hup/1", b"before") == Code.CHANGED

    gatewayctl("certs", "issue", d, "server", "--force")
    (d / "psk.txt").write_text("dev-a:ka\ndev-b:kb\n")
    gw.hup("DTLS reloaded")
    fresh = Device(port, d / "ca.crt")
    assert fresh.server_serial == serial(d / "server.crt") != old
    psk = Device(port, d / "ca.crt", psk=("dev-b", b"kb"))  # a key added to psk_file
    assert psk.post("ps/hup/psk", b"new key") == Code.CHANGED
    assert established.post("ps/hup/2", b"old session") == Code.CHANGED  # still alive

    (d / "server.key").write_text("half-copied")
    gw.hup("DTLS reload failed")
    assert "keyfile: not a PEM private key" in gw.log()
    again = Device(port, d / "ca.crt")
    assert again.server_serial == fresh.server_serial
    assert established.post("ps/hup/3", b"still") == Code.CHANGED
    for dev in (established, fresh, psk, again):
        dev.close()
