"""A real gatewayd with every front-end on free loopback ports, for the interop tests.

``gateway`` (one per module) listens on MQTT/TCP, MQTT over WebSocket (ws and wss, with a
CA and a server certificate made here with ``cryptography``) and MQTT-SN (UDP), with two
predefined MQTT-SN topics. It is configured only through ``GATEWAY_*`` variables and
runs as a :class:`tests.harness.gatewayd.GatewaydProcess` (ready on its READY=1, when
every listener is open); the gateway's log is attached to the report of a failing test.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import socket
import time
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.harness.gatewayd import GatewaydProcess, free_port, gatewayd_env

__all__ = ["Gateway", "free_port", "start_gateway", "stop", "wait_lwm2m"]

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = Path(__file__).resolve().parent / "node"
READY_TIMEOUT = 20.0
PREDEFINED = {1: "predef/one", 2: "predef/two"}


class Certs(NamedTuple):
    ca: Path
    cert: Path
    key: Path


def make_certs(directory: Path) -> Certs:
    """A CA and a server certificate for localhost / 127.0.0.1 (P-256, one day)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "interop test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    out = Certs(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    out.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return out


class Gateway(NamedTuple):
    host: str
    tcp: int
    ws: int
    wss: int
    mqttsn: int
    certs: Certs
    log: Path


_RUNNING: list[GatewaydProcess] = []


def start_gateway(workdir: Path, **extra: str) -> tuple[GatewaydProcess, Gateway]:
    certs = make_certs(workdir)
    gw = Gateway(
        "127.0.0.1",
        free_port(),
        free_port(),
        free_port(),
        free_port(socket.SOCK_DGRAM),
        certs,
        workdir / "gateway.log",
    )
    env = {
        "GATEWAY_NODE__DATA_DIR": str(workdir / "data"),
        "GATEWAY_API__ENABLE": "false",
        "GATEWAY_LISTENERS__TCP__DEFAULT__BIND": f"127.0.0.1:{gw.tcp}",
        "GATEWAY_LISTENERS__WS__DEFAULT__BIND": f"127.0.0.1:{gw.ws}",
        "GATEWAY_LISTENERS__WSS__DEFAULT__BIND": f"127.0.0.1:{gw.wss}",
        "GATEWAY_LISTENERS__WSS__DEFAULT__CERTFILE": str(certs.cert),
        "GATEWAY_LISTENERS__WSS__DEFAULT__KEYFILE": str(certs.key),
        "GATEWAY_GATEWAY__MQTTSN__LISTENERS__UDP__DEFAULT__BIND": f"127.0.0.1:{gw.mqttsn}",
        "GATEWAY_GATEWAY__MQTTSN__PREDEFINED": "["
        + ", ".join(f'{{id = {i}, topic = "{t}"}}' for i, t in PREDEFINED.items())
        + "]",
        "GATEWAY_GATEWAY__MQTTSN__RETRY_INTERVAL": "2s",
        **extra,
    }
    proc = GatewaydProcess(workdir, gatewayd_env(env), log_path=gw.log,
                           ready_timeout=READY_TIMEOUT)
    _RUNNING.append(proc)
    proc.start()
    return proc, gw


def stop(proc: GatewaydProcess) -> None:
    proc.stop(10)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    proc, gw = start_gateway(tmp_path_factory.mktemp("gatewayd"))
    yield gw
    stop(proc)
    _RUNNING[:] = [p for p in _RUNNING if p is not proc]


@pytest.fixture
def uid() -> str:
    return uuid.uuid4().hex[:8]


def have_mqttjs() -> bool:
    return bool(shutil.which("node")) and (NODE_DIR / "node_modules" / "mqtt").is_dir()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and call.when == "call":
        for proc in _RUNNING:
            report.sections.append(("gatewayd log", proc.log()[-8000:]))
    return report


def wait_lwm2m(port: int) -> None:
    """Until the LwM2M listener answers a CoAP ping (an empty CON gets RST): start_gateway
    waits for the TCP listeners only, and a request to a UDP port not yet bound fails at
    once (ICMP port unreachable) instead of being retransmitted."""
    deadline = time.monotonic() + READY_TIMEOUT
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                s.sendto(b"\x40\x00\x12\x34", ("127.0.0.1", port))
                if s.recv(64)[:1] == b"\x70":  # RST
                    return
            except OSError:  # refused (not bound yet) or no answer within 0.2 s
                continue
    raise TimeoutError(f"no LwM2M listener on port {port}")
