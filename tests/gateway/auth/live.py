"""Helpers for tests against a real gatewayd process: start/stop it on a free loopback
port, run gatewayctl against its configuration, talk MQTT over a socket with our own
codec in the client role (for SCRAM, which paho-mqtt does not do), and serve HTTP.

The process is a :class:`tests.harness.gatewayd.GatewaydProcess` (ready on gatewayd's
READY=1); answers are waited for with socket timeouts; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from protocols.mqtt.connection import Connection, Role
from protocols.mqtt.packets import Packet
from tests.harness.gatewayd import GatewaydProcess, free_port, gatewayd_env

__all__ = ["Gatewayd", "RawClient", "free_port"]

TIMEOUT = 30.0


class Gatewayd:
    """One gatewayd process configured only through GATEWAY_* variables."""

    def __init__(self, workdir: Path, **env: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.data_dir = workdir / "data"
        self.env = gatewayd_env(
            {
                "GATEWAY_LISTENERS__TCP__DEFAULT__BIND": f"127.0.0.1:{self.port}",
                "GATEWAY_NODE__DATA_DIR": str(self.data_dir),
                "GATEWAY_AUTHENTICATION__ALLOW_ANONYMOUS": "false",
                **env,
            }
        )
        self.log = workdir / "gatewayd.log"
        self.process: GatewaydProcess | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc if self.process is not None else None

    @property
    def addr(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def start(self) -> Gatewayd:
        self.process = GatewaydProcess(self.workdir, self.env, log_path=self.log,
                                       ready_timeout=TIMEOUT)
        self.process.start()
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(10)

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
