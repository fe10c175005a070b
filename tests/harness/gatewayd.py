"""The one way tests and benchmarks start a real ``gatewayd``: configuration, free ports,
a READY wait and a clean stop.

- :func:`free_port` / :func:`free_port_run`: free loopback ports (probed, then closed).
- :func:`gatewayd_env`: the environment a gatewayd child gets: ours without any
  ``GATEWAY_*``, systemd or ``PYTHONPATH`` leftovers, the source tree first on the path
  (:data:`SRC`: this checkout, or the compiled copy ``tests/test_compiled.py`` names in
  ``$EDGE_GATEWAY_TEST_SRC``), then the test's own ``GATEWAY_*`` variables.
- :class:`GatewaydProcess`: one ``python -m gateway.cli.gatewayd`` process (or another
  broker's command, for the benchmarks) in its own working directory, its output in a
  log file. ``start()`` returns once it is ready, ``stop()`` sends SIGTERM and waits
  (SIGKILL after a deadline), ``kill()`` is ``kill -9``.

Readiness, by default, is gatewayd's own ``READY=1``: the harness binds an abstract
``AF_UNIX`` datagram socket, hands it over as ``$NOTIFY_SOCKET`` and waits for the
datagram (sent once every listener and the management API are open), then keeps
draining it (``notifications``) so gatewayd's later STATUS lines never pile up. A caller
that owns ``$NOTIFY_SOCKET`` itself (the multi-worker tests) or starts another broker
passes a ``ready`` predicate instead, polled every 50 ms. Either way a process that
exits before it is ready raises at once, with its log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the source tree gatewayd children run from (tests/test_compiled.py: the compiled copy)
SRC = Path(os.environ.get("EDGE_GATEWAY_TEST_SRC") or REPO)
HOST = "127.0.0.1"
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
POLL = 0.05  # seconds between two looks at a condition of another process


_handed_out: set[int] = set()  # ports free_port returned in this process


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port free on the loopback now (TCP by default, ``SOCK_DGRAM`` for UDP), and
    never one this process was given before: the kernel may offer a port again once its
    probe socket is closed, and two ports of one test (an MQTT listener and the API)
    then collided."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind((HOST, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            break
    _handed_out.add(port)
    return port


def free_port_run(n: int) -> int:
    """A port p with p..p+n-1 free on the loopback (probed, then closed)."""
    for _ in range(100):
        base = free_port()
        if base + n > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind((HOST, base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


def clean_environ() -> dict[str, str]:
    """Our environment without ``GATEWAY_*`` and systemd's variables."""
    drop = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
    return {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_") and k not in drop}


def gatewayd_env(extra: Mapping[str, str] | None = None, src: Path = SRC) -> dict[str, str]:
    """What a gatewayd child runs with: :func:`clean_environ`, the source tree ``src``
    first on ``PYTHONPATH``, and ``extra`` (its ``GATEWAY_*`` configuration)."""
    env = clean_environ()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def gatewayd_command(*args: str, python: str | None = None) -> list[str]:
    return [python or sys.executable, "-m", "gateway.cli.gatewayd", *args]


def tcp_listening(port: int, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class NotifySocket:
    """An abstract AF_UNIX datagram socket standing in for systemd's ``$NOTIFY_SOCKET``;
    a thread collects what arrives."""

    def __init__(self) -> None:
        self.name = f"@gatewayd-test-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.sock.settimeout(0.5)
        self.messages: list[str] = []
        self.changed = threading.Condition()
        self.stopping = threading.Event()  # (an Event: set by another thread)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data and self.stopping.is_set():
                return
            with self.changed:
                self.messages.append(data.decode(errors="replace"))
                self.changed.notify_all()

    def all(self) -> list[str]:
        """Every message so far, in arrival order."""
        with self.changed:
            return list(self.messages)

    def wait_for(self, text: str, timeout: float) -> bool:
        """True once a message containing ``text`` arrived, False after ``timeout``."""
        with self.changed:
            return self.changed.wait_for(
                lambda: any(text in m for m in self.messages), timeout
            )

    def close(self) -> None:
        self.stopping.set()
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"", "\0" + self.name[1:])  # wakes the thread's recv at once
        self.thread.join(2)
        self.sock.close()


class GatewaydProcess:
    """One broker process: ``command`` in ``workdir`` with ``env``, output to ``log_path``.

    ``ready``: None to wait for gatewayd's ``READY=1`` (see the module docstring), or a
    predicate of the running process, polled until true (exceptions count as false)."""

    def __init__(
        self,
        workdir: Path,
        env: Mapping[str, str],
        *,
        command: Sequence[str] | None = None,
        ready: Callable[[], object] | None = None,
        log_path: Path | None = None,
        ready_timeout: float = READY_TIMEOUT,
        what: str = "gatewayd",
    ) -> None:
        self.workdir = workdir
        self.env = dict(env)
        self.command = list(command) if command is not None else gatewayd_command()
        self.ready = ready
        self.log_path = log_path or workdir / "gatewayd.log"
        self.ready_timeout = ready_timeout
        self.what = what
        self.proc: subprocess.Popen[bytes] | None = None
        self.notify: NotifySocket | None = None
        self.log_offset = 0

    # -- life cycle --------------------------------------------------------------------

    def start(self, *, wait: bool = True) -> GatewaydProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = dict(self.env)
        if self.ready is None:
            self._close_notify()
            self.notify = NotifySocket()
            env["NOTIFY_SOCKET"] = self.notify.name
            env.pop("WATCHDOG_USEC", None)
        with open(self.log_path, "ab") as log:
            self.log_offset = log.tell()
            self.proc = subprocess.Popen(
                self.command, cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT,
            )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        """Until ready; raises RuntimeError (with the log) if the process exits first or
        is not ready within ``ready_timeout`` (then it is stopped)."""
        proc = self.proc
        assert proc is not None
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{self.what} exited with status {proc.returncode} before it was "
                    f"ready:\n{self.log_tail(60)}"
                )
            if self.notify is not None:
                if self.notify.wait_for("READY=1", POLL):
                    return
                continue
            assert self.ready is not None
            try:
                if self.ready():
                    return
            except (OSError, AssertionError, KeyError, ValueError):
                pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=POLL)  # a pause that ends at once if the process dies
        self.stop()
        raise RuntimeError(
            f"{self.what} not ready within {self.ready_timeout}s:\n{self.log_tail(60)}"
        )

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, wait (SIGKILL after ``timeout``); the exit status (None if never
        started)."""
        proc = self.proc
        code = None if proc is None else proc.poll()
        if proc is not None and code is None:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        self._close_notify()
        return code

    def kill(self) -> None:
        """``kill -9`` and reap."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._close_notify()

    def _close_notify(self) -> None:
        if self.notify is not None:
            self.notify.close()
            self.notify = None

    # -- views -------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_since_start(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_since_start().splitlines()[-lines:])
