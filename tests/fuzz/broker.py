"""A live gatewayd for bad-input tests and the fuzz campaign, and a way to throw bytes at it.

- :class:`Gatewayd`: one ``python -m gateway.cli.gatewayd`` process on a free loopback
  port, configured only through ``GATEWAY_*`` variables, with its data in its own
  directory; ``rss_kb()`` reads ``VmRSS`` from ``/proc/<pid>/status``.
- :func:`throw`: open a connection (optionally CONNECT first), send bytes, and report what
  the broker did: closed it (with the DISCONNECT or CONNACK it sent first, if any) or
  kept it open, every read under a deadline. Nothing here sleeps.

The process is a :class:`tests.harness.gatewayd.GatewaydProcess` (ready on gatewayd's
READY=1, clean stop).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conformance import raw
from tests.harness.gatewayd import GatewaydProcess, free_port, gatewayd_env

__all__ = ["Gatewayd", "Outcome", "free_port", "throw"]

# MQTT 5 DISCONNECT reason codes a server may send (3.14.2.1), failures only.
SERVER_DISCONNECT_CODES = frozenset(
    {
        0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94,
        0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2,
    }
)


def _quiet_defaults() -> dict[str, str]:
    """Turn off side services that bind fixed ports, when this version has them."""
    from gateway.config import GatewayConfig

    fields = GatewayConfig.model_fields
    env = {}
    if "api" in fields:
        env["GATEWAY_API__ENABLE"] = "false"
    return env


class Gatewayd:
    def __init__(self, workdir: Path, **env: str | int) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.env = {k: str(v) for k, v in env.items()}
        self.log_path = workdir / "gatewayd.log"
        self.data_dir = workdir / "data"
        self.process: GatewaydProcess | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc if self.process is not None else None

    @property
    def addr(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 15.0) -> Gatewayd:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **_quiet_defaults(),
            "GATEWAY_LISTENERS__TCP__DEFAULT__BIND": f"127.0.0.1:{self.port}",
            "GATEWAY_NODE__DATA_DIR": str(self.data_dir),
            **self.env,
        }
        self.process = GatewaydProcess(self.workdir, gatewayd_env(env), log_path=self.log_path,
                                       ready_timeout=timeout)
        self.process.start()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_kb(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def wait_briefly(self, seconds: float = 0.05) -> None:
        """Block on the process for a moment (it must not exit): a poll interval."""
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=seconds)

    def stop(self) -> int | None:
        return self.process.stop(10) if self.process is not None else None

    def log_tail(self, limit: int = 8000) -> str:
        try:
            return self.log_path.read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def log_count(self, text: str) -> int:
        try:
            return self.log_path.read_text(errors="replace").count(text)
        except OSError:
            return 0


@dataclass
class Outcome:
    """What the broker did with one connection."""

    closed: bool
    packets: list[raw.Packet] = field(default_factory=list)  # after our CONNACK, if any
    undecodable: bytes = b""  # bytes that were not a well-formed packet (a broker bug)

    @property
    def disconnect(self) -> raw.Packet | None:
        for p in self.packets:
            if p.type in (raw.DISCONNECT, raw.CONNACK):
                return p
        return None


def _read_all(sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """Everything the broker sends until it closes (True) or ``timeout`` passes (False)."""
    data = bytearray()
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return bytes(data), False
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return bytes(data), False
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
            return bytes(data), True
        if not chunk:
            return bytes(data), True
        data += chunk


def split_packets(data: bytes, proto: int) -> tuple[list[raw.Packet], bytes]:
    """Decode a byte stream from the broker; the undecodable rest (should be empty)."""
    out: list[raw.Packet] = []
    pos = 0
    while pos < len(data):
        length, mult, i = 0, 1, pos + 1
        while True:
            if i >= len(data) or i - pos > 4:
                return out, data[pos:]
            b = data[i]
            length += (b & 0x7F) * mult
            mult *= 128
            i += 1
            if not b & 0x80:
                break
        end = i + length
        if end > len(data):
            return out, data[pos:]
        try:
            out.append(raw.decode(data[pos:end], proto))
        except AssertionError:
            return out, data[pos:]
        pos = end
    return out, b""


def decode_reply(data: bytes, proto: int | None) -> tuple[list[raw.Packet], bytes]:
    """The broker's packets; with ``proto`` None (we sent no CONNECT of our own, so the
    level is whatever the input's CONNECT said) the reading that decodes everything."""
    if proto is not None:
        return split_packets(data, proto)
    packets, rest = split_packets(data, raw.V311)
    if rest:
        packets5, rest5 = split_packets(data, raw.V5)
        if not rest5:
            return packets5, rest5
    return packets, rest


def throw(
    addr: tuple[str, int],
    data: bytes | list[bytes],
    *,
    proto: int | None = None,
    client_id: str = "fuzz",
    timeout: float = 5.0,
) -> Outcome:
    """Connect (and CONNECT at ``proto`` first, unless None), send ``data`` (a list: one
    send each), and watch until the broker closes or ``timeout`` passes."""
    chunks = [data] if isinstance(data, bytes) else data
    with socket.create_connection(addr, timeout=timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if proto is not None:
            sock.sendall(raw.connect(client_id, proto=proto, keepalive=0))
            ack = raw.decode(raw.read_packet(sock, timeout), proto)
            assert ack.type == raw.CONNACK and ack.reason == 0, ack
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while we were still sending: what we want to observe
        got, closed = _read_all(sock, timeout)
    packets, rest = decode_reply(got, proto)
    return Outcome(closed, packets, rest)


def throw_many(
    addr: tuple[str, int], payloads: list[bytes], *, timeout: float = 10.0
) -> list[bool]:
    """Open one connection per payload at once, send each, and report which were closed
    by the broker within ``timeout`` (all watched together)."""
    socks: list[socket.socket] = []
    try:
        for p in payloads:
            s = socket.create_connection(addr, timeout=timeout)
            with contextlib.suppress(OSError):
                s.sendall(p)
            s.setblocking(False)
            socks.append(s)
        closed = [False] * len(socks)
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for i, s in enumerate(socks):
                sel.register(s, selectors.EVENT_READ, i)
            pending = len(socks)
            while pending and time.monotonic() < deadline:
                for key, _ in sel.select(deadline - time.monotonic()):
                    i = key.data
                    try:
                        chunk = socks[i].recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk = b""
                    if not chunk:
                        closed[i] = True
                        sel.unregister(socks[i])
                        pending -= 1
        return closed
    finally:
        for s in socks:
            s.close()
