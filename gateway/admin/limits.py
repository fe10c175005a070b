"""The process's open-file limit against the connections the configuration allows.

Every connection is one file descriptor. At start ``gatewayd`` raises its soft
``RLIMIT_NOFILE`` to the hard limit (capped by ``/proc/sys/fs/nr_open``, since Linux
refuses an infinite soft limit for files) and warns when even that cannot hold the
configured maximum connections (the sum of the enabled listeners' ``max_connections``)
plus :data:`RESERVED_FDS` for everything else (the store, the API, logs). The warning
is also an alarm (``nofile_limit``) in the API and ``gatewayctl status``.

Only a ``max_connections`` written in the configuration (file or environment) counts
towards that check. A listener that leaves it at its default follows the process's
open-file limit instead (:func:`follow_file_limit`: the raised soft limit minus the
reserve), so a development start with a small ``ulimit -n`` raises no alarm; one info
line says what the limit is and how to raise it for production.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("gateway.admin")

RESERVED_FDS = 1024
"""File descriptors kept for what is not a client connection."""

NR_OPEN = Path("/proc/sys/fs/nr_open")


def _stream_listeners(config: Any) -> list[Any]:
    out: list[Any] = []
    listeners = config.listeners
    for kind in type(listeners).model_fields:
        table = getattr(listeners, kind)
        if isinstance(table, dict):
            out.extend(table.values())
    return out


def _datagram_listeners(config: Any) -> list[Any]:
    out: list[Any] = []
    gateways = getattr(config, "gateway", None)
    for name in type(gateways).model_fields if gateways is not None else ():
        gw = getattr(gateways, name)
        if gw is None or not getattr(gw, "enable", True):
            continue
        for kind in type(gw.listeners).model_fields:
            out.extend(getattr(gw.listeners, kind).values())
    return out


def configured_max_connections(config: Any) -> int:
    """The sum of ``max_connections`` over every enabled listener of every kind
    (``listeners.tcp``, ``listeners.ssl``, ... whatever the schema has) whose
    ``max_connections`` is written in the configuration (not left at its default)."""
    total = 0
    for listener in _stream_listeners(config):
        if getattr(listener, "enable", True) and "max_connections" in listener.model_fields_set:
            total += int(getattr(listener, "max_connections", 0) or 0)
    return total


def follow_file_limit(config: Any, soft: int) -> int | None:
    """Set every listener's default ``max_connections`` (stream and datagram) to what the
    open-file limit ``soft`` allows; returns that number, or None when every listener
    has its own (or ``soft`` is unknown). Call once, after :func:`raise_nofile_limit`."""
    if soft < 0:
        return None
    follow = max(soft - RESERVED_FDS, soft // 2, 1)
    changed = False
    for listener in _stream_listeners(config) + _datagram_listeners(config):
        if "max_connections" not in listener.model_fields_set:
            listener.max_connections = follow
            # still "not written in the configuration": a second start follows again
            listener.__pydantic_fields_set__.discard("max_connections")
            changed = True
    if not changed:
        return None
    log.info(
        "connection limit per listener %d, from the open-file limit %d (for production "
        "raise LimitNOFILE (systemd) or ulimit -n, or set the listeners' max_connections)",
        follow, soft,
    )
    return follow


@dataclass(frozen=True, slots=True)
class NofileCheck:
    soft: int  # after raising; -1 when unknown (no resource module)
    hard: int
    before: int
    wanted: int  # configured max connections + RESERVED_FDS

    @property
    def ok(self) -> bool:
        return self.soft < 0 or self.soft >= self.wanted

    def as_dict(self) -> dict[str, int | bool]:
        return {
            "soft": self.soft,
            "hard": self.hard,
            "before": self.before,
            "wanted": self.wanted,
            "ok": self.ok,
        }


def _nr_open() -> int | None:
    try:
        return int(NR_OPEN.read_text().strip())
    except (OSError, ValueError):
        return None


def raise_nofile_limit(
    max_connections: int,
    *,
    getrlimit: Callable[[int], tuple[int, int]] | None = None,
    setrlimit: Callable[[int, tuple[int, int]], None] | None = None,
    nr_open: Callable[[], int | None] = _nr_open,
) -> NofileCheck:
    """Raise the soft limit to the hard one; report whether it covers ``max_connections``."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Linux
        return NofileCheck(-1, -1, -1, max_connections + RESERVED_FDS)
    get = getrlimit or resource.getrlimit
    set_ = setrlimit or resource.setrlimit
    what = resource.RLIMIT_NOFILE
    soft, hard = get(what)
    before = soft
    target = hard
    if hard == resource.RLIM_INFINITY:
        target = nr_open() or soft
    if target > soft:
        try:
            set_(what, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    check = NofileCheck(soft, hard, before, max_connections + RESERVED_FDS)
    if not check.ok:
        log.warning(
            "open-file limit %d (hard %d) is below the configured maximum connections %d "
            "+ %d reserved: raise LimitNOFILE (systemd) or nofile (limits.conf), or lower "
            "the listeners' max_connections",
            check.soft,
            hard,
            max_connections,
            RESERVED_FDS,
        )
    elif soft != before:
        log.info("open-file limit raised from %d to %d", before, soft)
    return check
