"""Helpers for tests against a real gatewayd process: start/stop it on a free loopback
port, run gatewayctl against its configuration, talk MQTT over a socket with our own
codec in the client role (for SCRAM, which paho-mqtt does not do), and serve HTTP.

Readiness and answers are waited for with bounded polls and socket timeouts; nothing
sleeps for a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from protocols.mqtt.connection import Connection, Role
from protocols.mqtt.packets import Packet

REPO_ROOT = Path(__file__).resolve().parents[3]
TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gatewayd:
    """One gatewayd process configured only through GATEWAY_* variables."""

    def __init__(self, workdir: Path, **env: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.data_dir = workdir / "data"
        self.env = dict(os.environ)
        self.env.update(
            {
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
                ),
                "GATEWAY_LISTENERS__TCP__DEFAULT__BIND": f"127.0.0.1:{self.port}",
                "GATEWAY_NODE__DATA_DIR": str(self.data_dir),
                "GATEWAY_AUTHENTICATION__ALLOW_ANONYMOUS": "false",
            }
        )
        self.env.update(env)
        self.log = workdir / "gatewayd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def addr(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def start(self) -> Gatewayd:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli.gatewayd"],
                cwd=self.workdir,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gatewayd exited:\n{self.log.read_text()[-4000:]}")
            try:
                with socket.create_connection(self.addr, timeout=0.2):
                    return self
            except OSError:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=0.05)
        self.stop()
        raise RuntimeError(f"gatewayd not listening:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def ctl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run gatewayctl with the same environment (so the same database)."""
        return subprocess.run(
            [sys.executable, "-m", "gateway.cli.gatewayctl", *args],
            cwd=self.workdir,
            env=self.env,
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            timeout=60,
        )


class RawClient:
    """MQTT over a blocking socket with our sans-IO codec in the client role."""

    def __init__(self, addr: tuple[str, int], level: int = 5) -> None:
        self.sock = socket.create_connection(addr, timeout=TIMEOUT)
        self.conn = Connection(Role.CLIENT, protocol_level=level)

    def send(self, packet: Packet) -> None:
        self.sock.sendall(self.conn.send(packet))

    def recv(self) -> Packet | None:
        """The next packet, or None when the server closed the connection."""
        while True:
            packet = self.conn.next_event()
            if packet is not None:
                return packet
            data = self.sock.recv(65536)
            if not data:
                return None
            self.conn.receive_data(data)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Handler = Callable[[dict[str, Any]], Awaitable[tuple[int, Any]]]


@contextlib.contextmanager
def http_service(handler: Handler) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An aiohttp server on a free loopback port in its own thread; yields (url, the
    JSON bodies received). ``handler(body) -> (status, json or None)``."""
    from aiohttp import web

    received: list[dict[str, Any]] = []
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        received.append(body)
        status, answer = await handler(body)
        if answer is None:
            return web.Response(status=status)
        return web.json_response(answer, status=status)

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/auth", handle)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        state["stop"] = stop = asyncio.Event()
        state["loop"] = asyncio.get_running_loop()
        ready.set()
        await stop.wait()
        await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(TIMEOUT)
    try:
        yield f"http://127.0.0.1:{state['port']}/auth", received
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(TIMEOUT)
