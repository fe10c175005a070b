"""A real gatewayd with every front-end on free loopback ports, for the interop tests.

``gateway`` (one per module) listens on MQTT/TCP, MQTT over WebSocket (ws and wss, with a
CA and a server certificate made here with ``cryptography``) and MQTT-SN (UDP), with two
predefined MQTT-SN topics. It is configured only through ``GATEWAY_*`` variables.
Readiness is a bounded connect poll, never a fixed sleep; the gateway's log is attached to
the report of a failing test.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
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

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = Path(__file__).resolve().parent / "node"
READY_TIMEOUT = 20.0
PREDEFINED = {1: "predef/one", 2: "predef/two"}


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


_RUNNING: list[tuple[subprocess.Popen[bytes], Path]] = []


def start_gateway(workdir: Path, **extra: str) -> tuple[subprocess.Popen[bytes], Gateway]:
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
    env = dict(os.environ)
    env = {k: v for k, v in env.items() if not k.startswith("GATEWAY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.update(
        {
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
        }
    )
    env.update(extra)
    log = open(gw.log, "ab")  # noqa: SIM115 - the process owns it
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.gatewayd"],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    _RUNNING.append((proc, gw.log))
    deadline = time.monotonic() + READY_TIMEOUT
    pending = [gw.tcp, gw.ws, gw.wss]
    while pending and time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gatewayd exited ({proc.returncode}):\n{gw.log.read_text()}")
        try:
            with socket.create_connection((gw.host, pending[0]), timeout=0.2):
                pending.pop(0)
        except OSError:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.05)
    if pending:
        stop(proc)
        raise RuntimeError(f"gatewayd not ready:\n{gw.log.read_text()}")
    return proc, gw


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    proc, gw = start_gateway(tmp_path_factory.mktemp("gatewayd"))
    yield gw
    stop(proc)
    _RUNNING[:] = [(p, log) for p, log in _RUNNING if p is not proc]


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
        for _, log in _RUNNING:
            with contextlib.suppress(OSError):
                report.sections.append(("gatewayd log", log.read_text()[-8000:]))
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
