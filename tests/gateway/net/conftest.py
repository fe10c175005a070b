"""Fixtures for the TLS listener tests: a PKI made by our own CLI, and real gatewayd
processes on free loopback ports, configured only through ``GATEWAY_*`` variables.

Each runs as a :class:`tests.harness.gatewayd.GatewaydProcess` (ready on its READY=1);
log lines are awaited by bounded polling of the log, never by fixed sleeps. The log of
every gateway a failing test started is attached to its report.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.harness.gatewayd import GatewaydProcess, free_port, gatewayd_env

__all__ = ["GatewayProcess", "Pki", "free_port", "gatewayctl"]

TIMEOUT = 15.0


def gatewayctl(*args: str | Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli.gatewayctl", *map(str, args)],
        capture_output=True, text=True, check=False, timeout=60,
    )
    assert result.returncode == 0, result.stderr


class Pki(NamedTuple):
    """Certificates made with ``gatewayctl certs`` (dir: the gateway's CA)."""

    dir: Path
    other: Path  # another CA, whose client certificate must be refused

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    def crt(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """server (default SANs), dev1 and dev2 (client, no SAN), dev3 (client, DNS SAN),
    and in ``other`` a second CA with its own client "intruder"."""
    root = tmp_path_factory.mktemp("pki")
    main, other = root / "ca", root / "other"
    gatewayctl("certs", "init-ca", main)
    gatewayctl("certs", "issue", main, "server", "--server")
    gatewayctl("certs", "issue", main, "dev1", "--client")
    gatewayctl("certs", "issue", main, "dev2", "--client")
    gatewayctl("certs", "issue", main, "dev3", "--client", "--san", "dev3.plant.local")
    gatewayctl("certs", "init-ca", other, "--cn", "someone else's CA")
    gatewayctl("certs", "issue", other, "intruder", "--client")
    return Pki(main, other)


class GatewayProcess:
    """gatewayd with a TCP and an ssl listener on free loopback ports."""

    def __init__(self, workdir: Path, ssl: dict[str, str], env: dict[str, str]) -> None:
        self.workdir = workdir
        self.tcp_port = free_port()
        self.ssl_port = free_port()
        self.log_path = workdir / "gatewayd.log"
        self.env = gatewayd_env()
        self.env["GATEWAY_LISTENERS__TCP__DEFAULT__BIND"] = f"127.0.0.1:{self.tcp_port}"
        self.env["GATEWAY_LISTENERS__SSL__DEFAULT__BIND"] = f"127.0.0.1:{self.ssl_port}"
        self.env["GATEWAY_NODE__DATA_DIR"] = str(workdir / "data")
        for key, value in ssl.items():
            self.env[f"GATEWAY_LISTENERS__SSL__DEFAULT__{key.upper()}"] = value
        self.env.update(env)
        self.process: GatewaydProcess | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc if self.process is not None else None

    @property
    def tcp(self) -> tuple[str, int]:
        return ("127.0.0.1", self.tcp_port)

    @property
    def ssl(self) -> tuple[str, int]:
        return ("127.0.0.1", self.ssl_port)

    def start(self) -> GatewayProcess:
        self.process = GatewaydProcess(self.workdir, self.env, log_path=self.log_path)
        self.process.start()
        return self

    def _listening(self, port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if ready():
                return
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"gatewayd exited ({self.proc.returncode}) before {what}:\n{self.log()}"
                )
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.05)  # a bounded pause that ends if gatewayd dies
        raise AssertionError(f"gatewayd: not {what} within {TIMEOUT}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def hup(self, expect: str) -> None:
        """Send SIGHUP and wait for one more log line containing ``expect``."""
        assert self.proc is not None
        before = self.log().count(expect)
        self.proc.send_signal(signal.SIGHUP)
        self._wait(lambda: self.log().count(expect) > before, f"logging {expect!r}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(10)


GatewayFactory = Callable[..., GatewayProcess]


@pytest.fixture
def gatewayd(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[GatewayFactory]:
    """``gatewayd(ssl={"certfile": ..., ...}, env={...})`` starts a gateway for this test."""
    started: list[GatewayProcess] = []

    def start(ssl: dict[str, str], env: dict[str, str] | None = None) -> GatewayProcess:
        workdir = tmp_path / f"gw{len(started)}"
        workdir.mkdir()
        gw = GatewayProcess(workdir, ssl, env or {})
        started.append(gw)
        return gw.start()

    yield start
    for gw in started:
        gw.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for gw in started:
            rep.sections.append((f"gatewayd log {gw.workdir.name}", gw.log()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]
