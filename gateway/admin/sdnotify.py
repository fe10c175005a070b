"""systemd integration: readiness, status line, watchdog, stopping (``sd_notify``).

Under a ``Type=notify`` unit systemd passes ``$NOTIFY_SOCKET``; with ``WatchdogSec=`` it
also passes ``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``). :class:`Notifier` sends through
systemd-python's ``daemon.notify`` when the package is installed and otherwise writes
the datagram itself (the protocol is one ``AF_UNIX`` datagram of ``KEY=VALUE`` lines;
an ``@`` socket name is in the abstract namespace). Outside systemd everything here is
a no-op.

:class:`SystemdIntegration` sends ``READY=1`` once the listeners are open (the caller
says when), a ``STATUS=`` line with the connection counts every
:data:`STATUS_INTERVAL`, and ``WATCHDOG=1`` every half watchdog period **from an event
loop callback**: a loop that hangs stops the pings, and systemd restarts the service
(``Restart=on-failure`` covers a watchdog timeout). ``STOPPING=1`` goes out when the
graceful drain starts.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import socket
from collections.abc import Callable, Mapping

log = logging.getLogger("gateway.admin")

STATUS_INTERVAL = 10.0


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.socket_path = env.get("NOTIFY_SOCKET") or None
        self.watchdog_usec = _watchdog_usec(env)
        self._daemon_notify: Callable[[str], bool] | None = None
        if self.socket_path is not None and environ is None:
            try:
                daemon = importlib.import_module("systemd.daemon")  # systemd-python
                self._daemon_notify = daemon.notify
            except ImportError:
                log.debug("systemd-python not installed: writing to $NOTIFY_SOCKET directly")

    @property
    def enabled(self) -> bool:
        return self.socket_path is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between pings (half the watchdog timeout), or None when off."""
        if self.watchdog_usec is None:
            return None
        return self.watchdog_usec / 2_000_000

    def notify(self, state: str) -> bool:
        if self.socket_path is None:
            return False
        if self._daemon_notify is not None:
            try:
                return bool(self._daemon_notify(state))
            except Exception as exc:  # pragma: no cover - libsystemd error
                log.warning("sd_notify failed: %s", exc)
                return False
        return self._send(state.encode("utf-8"))

    def _send(self, data: bytes) -> bool:
        assert self.socket_path is not None
        address = self.socket_path
        if address.startswith("@"):
            address = "\0" + address[1:]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.connect(address)
                s.sendall(data)
            return True
        except OSError as exc:
            log.warning("cannot notify systemd at %s: %s", self.socket_path, exc)
            return False


def _watchdog_usec(env: Mapping[str, str]) -> int | None:
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None  # meant for another process
    try:
        value = int(usec)
    except ValueError:
        return None
    return value if value > 0 else None


class SystemdIntegration:
    """READY/STATUS/WATCHDOG/STOPPING for one running gateway."""

    def __init__(
        self,
        status: Callable[[], str],
        *,
        notifier: Notifier | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.notifier = notifier or Notifier()
        self._status = status
        self._loop = loop or asyncio.get_running_loop()
        self._ping_timer: asyncio.TimerHandle | None = None
        self._status_timer: asyncio.TimerHandle | None = None
        self._last_status = ""
        self.pings = 0

    def ready(self) -> None:
        n = self.notifier
        if not n.enabled:
            return
        self._last_status = self._status()
        n.notify(f"READY=1\nSTATUS={self._last_status}\nMAINPID={os.getpid()}")
        log.info("systemd notified: ready")
        interval = n.watchdog_interval
        if interval is not None:
            log.info("systemd watchdog: pinging every %.1fs", interval)
            self._ping(interval)
        self._status_timer = self._loop.call_later(STATUS_INTERVAL, self._update_status)

    def _ping(self, interval: float) -> None:
        self.notifier.notify("WATCHDOG=1")
        self.pings += 1
        self._ping_timer = self._loop.call_later(interval, self._ping, interval)

    def _update_status(self) -> None:
        try:
            status = self._status()
        except Exception:  # pragma: no cover - never let STATUS take the loop down
            log.exception("status line failed")
            status = self._last_status
        if status != self._last_status:
            self.notifier.notify(f"STATUS={status}")
            self._last_status = status
        self._status_timer = self._loop.call_later(STATUS_INTERVAL, self._update_status)

    def reloading(self) -> None:
        self.notifier.notify("RELOADING=1")

    def reloaded(self) -> None:
        self.notifier.notify("READY=1")

    def stopping(self) -> None:
        self.close()
        self.notifier.notify("STOPPING=1\nSTATUS=draining sessions")

    def close(self) -> None:
        for timer in (self._ping_timer, self._status_timer):
            if timer is not None:
                timer.cancel()
        self._ping_timer = self._status_timer = None
