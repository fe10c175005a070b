"""The supervisor of a multi-worker node: start N workers, restart them, relay systemd.

``gatewayd`` with ``node.workers = N > 1`` runs this instead of a gateway. It makes the
private worker PKI (:meth:`NodePlan.ensure_pki`) and the API token, then starts each
worker as a new interpreter (``python -m gateway.cli.gatewayd --worker I``: a spawn, never
a fork of a process with an event loop) with the overrides of :mod:`gateway.workers.plan`.

Invariants:

- **systemd sees one service.** The supervisor is the unit's main process; every worker
  gets ``NOTIFY_SOCKET`` pointing at the supervisor's own datagram socket (abstract
  namespace, ``SO_PASSCRED``: each datagram carries the sender's pid). ``READY=1`` goes to
  systemd once every worker has said ``READY=1``; ``STATUS=`` is the workers' status
  lines joined; ``WATCHDOG=1`` is sent from the supervisor's loop, and a worker whose own
  pings (it gets the unit's ``WATCHDOG_USEC``) stop for a whole watchdog period is killed
  with SIGABRT, as systemd would (SIGKILL :data:`ABORT_TIMEOUT` later if it is still
  there), and restarted.
- **A worker that dies is restarted** (the same index, name, ports and files) after a
  backoff that doubles from 0.5 s to 30 s and resets once it stayed up a minute. A worker
  that exits before its first READY at the node's start makes the node exit 1 (a
  configuration error or a port in use would only loop).
- A worker dies with its supervisor (:func:`die_with_supervisor`).
- SIGHUP is passed to every worker; SIGTERM/SIGINT: ``STOPPING=1``, SIGTERM to every
  worker, wait for them (each drains as a single gatewayd does).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import ctypes
import logging
import os
import secrets
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field

from gateway.admin.sdnotify import Notifier
from gateway.admin.tokens import ensure_token
from gateway.config import GatewayConfig
from gateway.security.pki import PkiError
from gateway.workers.plan import NodePlan

log = logging.getLogger("gateway.workers")

BACKOFF_MIN = 0.5
BACKOFF_MAX = 30.0
STABLE_AFTER = 60.0  # a worker up this long restarts with the shortest backoff again
ABORT_TIMEOUT = 5.0  # a worker aborted for its watchdog and still there gets SIGKILL
STOP_TIMEOUT = 110.0  # then SIGKILL (systemd's TimeoutStopSec is 120 s)
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass
class Worker:
    index: int
    proc: asyncio.subprocess.Process | None = None
    ready: bool = False
    ever_ready: bool = False
    status: str = "starting"
    last_ping: float = field(default_factory=time.monotonic)
    started: float = 0.0
    restarts: int = 0
    aborted_at: float | None = None  # when the watchdog sent it SIGABRT
    backoff: float = BACKOFF_MIN


class Supervisor:
    def __init__(self, config: GatewayConfig, config_path: str | None,
                 first_run: bool = False) -> None:
        self.plan = NodePlan.of(config)
        self.config_path = config_path
        self.first_run = first_run  # gatewayd --first-run: the workers load the layer too
        self.workers = [Worker(w.index) for w in self.plan.workers]
        self.systemd = Notifier()
        self.stopping = False
        self.announced_ready = False
        self._stop = asyncio.Event()
        self._failed = asyncio.Event()  # a worker died before the node was ever ready
        self._sock: socket.socket | None = None
        self._address = f"@gatewayd-{os.getpid()}-{secrets.token_hex(6)}"

    # ---------------------------------------------------------------- running

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        try:
            self.plan.ensure_pki()
        except (OSError, PkiError) as exc:
            log.error("cannot make the worker certificates in %s: %s", self.plan.pki_dir, exc)
            return 1
        if self.plan.config.api.enable:
            ensure_token(self.plan.config)  # before the workers: they share it
        self._open_notify_socket(loop)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._signal_all, signal.SIGHUP)
        log.info("gatewayd %s: starting %d workers", self.plan.config.node.name,
                 len(self.workers))
        watchers = [asyncio.create_task(self._keep(w)) for w in self.workers]
        watchdog = asyncio.create_task(self._watchdog())
        failed = asyncio.create_task(self._first_start_failed())
        stop = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait({failed, stop}, return_when=asyncio.FIRST_COMPLETED)
        status = 1 if failed in done and failed.result() else 0
        for task in (failed, stop, watchdog):
            task.cancel()
        log.info("stopping %d workers", len(self.workers))
        self.stopping = True
        self._stop.set()
        self.systemd.notify("STOPPING=1\nSTATUS=draining sessions")
        self._signal_all(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*watchers), STOP_TIMEOUT)
        except TimeoutError:
            log.error("workers still running after %.0fs: killing them", STOP_TIMEOUT)
            self._signal_all(signal.SIGKILL)
            await asyncio.gather(*watchers)
        self._close_notify_socket(loop)
        return status

    async def _first_start_failed(self) -> bool:
        """True when a worker exits before the node was ever ready (then never returns)."""
        await self._failed.wait()
        return True

    def _command(self, index: int) -> list[str]:
        cmd = [sys.executable, "-m", "gateway.cli.gatewayd", "--worker", str(index),
               "--supervisor", str(os.getpid())]
        if self.config_path is not None:
            cmd += ["--config", self.config_path]
        if self.first_run:
            cmd.append("--first-run")
        return cmd

    def _environment(self, index: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "WATCHDOG_PID"}
        env.update(self.plan.environment(index))
        env["NOTIFY_SOCKET"] = self._address
        interval = self.systemd.watchdog_usec
        if interval is not None:
            env["WATCHDOG_USEC"] = str(interval)
        else:
            env.pop("WATCHDOG_USEC", None)
        return env

    async def _keep(self, w: Worker) -> None:
        """Run worker ``w`` until the node stops, restarting it when it dies."""
        while not self._stop.is_set():
            w.ready = False
            w.aborted_at = None
            w.status = "starting"
            w.started = w.last_ping = time.monotonic()
            w.proc = await asyncio.create_subprocess_exec(
                *self._command(w.index), env=self._environment(w.index)
            )
            log.info("worker %d started (pid %d)", w.index, w.proc.pid)
            if self._stop.is_set():  # the node began stopping while this one started
                w.proc.send_signal(signal.SIGTERM)
            code = await w.proc.wait()
            w.ready = False
            if self._stop.is_set():
                log.info("worker %d stopped (%s)", w.index, _describe(code))
                return
            if not w.ever_ready and not self.announced_ready:
                log.error("worker %d exited (%s) before it was ready: stopping the node",
                          w.index, _describe(code))
                self._failed.set()
                return
            w.restarts += 1
            if time.monotonic() - w.started >= STABLE_AFTER:
                w.backoff = BACKOFF_MIN
            log.error("worker %d exited (%s): restarting it in %.1fs (restart %d)",
                      w.index, _describe(code), w.backoff, w.restarts)
            self._update_status()
            try:
                await asyncio.wait_for(self._stop.wait(), w.backoff)
                return
            except TimeoutError:
                pass
            w.backoff = min(w.backoff * 2, BACKOFF_MAX)

    def _signal_all(self, sig: int) -> None:
        for w in self.workers:
            if w.proc is not None and w.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                    w.proc.send_signal(sig)

    # ---------------------------------------------------------------- sd_notify relay

    def _open_notify_socket(self, loop: asyncio.AbstractEventLoop) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.bind("\0" + self._address[1:])
        sock.setblocking(False)
        self._sock = sock
        loop.add_reader(sock.fileno(), self._on_notify)

    def _close_notify_socket(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._sock is not None:
            loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None

    def _on_notify(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data, ancdata, _, _ = self._sock.recvmsg(
                    4096, socket.CMSG_SPACE(_UCRED.size)
                )
            except (BlockingIOError, InterruptedError):
                return
            pid = _sender_pid(ancdata)
            w = next((w for w in self.workers if w.proc is not None and w.proc.pid == pid),
                     None)
            if w is None:
                continue  # not one of ours (or from a worker that is already gone)
            self._apply(w, data.decode("utf-8", "replace"))

    def _apply(self, w: Worker, message: str) -> None:
        for line in message.splitlines():
            key, _, value = line.partition("=")
            if key == "READY" and value == "1":
                if not w.ready:
                    log.info("worker %d ready", w.index)
                w.ready = w.ever_ready = True
                w.last_ping = time.monotonic()
            elif key == "STATUS":
                w.status = value
            elif key == "WATCHDOG" and value == "1":
                w.last_ping = time.monotonic()
        if not self.announced_ready and all(x.ready for x in self.workers):
            self.announced_ready = True
            log.info("all %d workers ready", len(self.workers))
            self.systemd.notify(f"READY=1\nSTATUS={self.status_line()}\nMAINPID={os.getpid()}")
        else:
            self._update_status()

    def status_line(self) -> str:
        return "; ".join(
            f"w{w.index}: {w.status if w.ready else 'starting'}" for w in self.workers
        )

    def _update_status(self) -> None:
        if self.announced_ready:
            self.systemd.notify(f"STATUS={self.status_line()}")

    async def _watchdog(self) -> None:
        """Ping systemd from this loop; SIGABRT a ready worker silent for a whole period."""
        interval = self.systemd.watchdog_interval
        if interval is None:
            return
        timeout = 2 * interval
        while True:
            await asyncio.sleep(interval)
            self.systemd.notify("WATCHDOG=1")
            now = time.monotonic()
            for w in self.workers:
                if not w.ready or w.proc is None or w.proc.returncode is not None:
                    continue
                if w.aborted_at is None and now - w.last_ping > timeout:
                    log.error("worker %d missed its watchdog (%.0fs): aborting it",
                              w.index, now - w.last_ping)
                    w.aborted_at = now
                    w.proc.send_signal(signal.SIGABRT)
                elif w.aborted_at is not None and now - w.aborted_at > ABORT_TIMEOUT:
                    log.error("worker %d still there %.0fs after SIGABRT: killing it",
                              w.index, now - w.aborted_at)
                    w.proc.send_signal(signal.SIGKILL)


def _sender_pid(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            creds = array.array("i")
            creds.frombytes(data[: _UCRED.size])
            return int(creds[0])
    return None


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"status {code}"


PR_SET_PDEATHSIG = 1


def die_with_supervisor(supervisor_pid: int) -> None:
    """In a worker: get SIGTERM when the supervisor dies (``PR_SET_PDEATHSIG``), so a
    supervisor killed with -9 outside systemd leaves no worker holding the ports (under
    systemd, ``KillMode=mixed`` stops them anyway). A supervisor already gone: SIGTERM
    now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return
    if os.getppid() != supervisor_pid:
        os.kill(os.getpid(), signal.SIGTERM)


def run(config: GatewayConfig, config_path: str | None, first_run: bool = False) -> int:
    async def main() -> int:
        return await Supervisor(config, config_path, first_run).run()

    return asyncio.run(main())
