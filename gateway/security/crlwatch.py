"""CRL files watched for changes: a bounded poll on the event loop.

The listeners' revocation guards (:mod:`gateway.security.revocation`) watch their own CRL
files; :class:`FileWatch` does the same for the files that have no guard: ``[cluster.tls]
crlfile`` and each bridge's ``tls.crlfile`` (wired by :func:`watch_links`). When a group
of files changed, its callback runs: the cluster's TLS settings are rebuilt and the live
cluster links checked again; a bridge's client context is rebuilt and its live link
checked again. That is exactly what SIGHUP does for them (:mod:`gateway.security.links`),
with no signal.

Why a poll and not inotify: no inotify binding is a dependency, a CRL changes a few times
a day at most, and ``stat`` of a handful of files every ``[crl_cache]
file_check_interval`` (5 s by default) costs nothing. A poll also sees a file replaced by
a rename (a new inode), a file on a network filesystem, and a file that appears later.

Invariants:

- A file is "changed" when its (inode, mtime, size) differs from the last look, or it
  appeared or vanished. The callback runs once per change seen, on the loop.
- A half-written or invalid file is the callback's business: the users here log one
  ERROR line and keep the previous CRLs; when the writer finishes, the file changes
  again and is read again.
- A callback that raises is logged (with its traceback) and the watch goes on.
- :meth:`FileWatch.close` stops the timer; nothing runs after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("gateway.security.crlwatch")

__all__ = ["FileWatch", "file_state", "watch_links"]

State = tuple[tuple[int, int, int] | None, ...]


def file_state(paths: Sequence[Path]) -> State:
    """(inode, mtime in ns, size) of each path; None for one that cannot be stat'ed."""
    out: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


class FileWatch:
    """Groups of files, each with a callback run when one of its files changed."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.loop = loop
        self.interval = interval
        self.groups: list[tuple[str, list[Path], Callable[[], object], State]] = []
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False

    def add(self, name: str, paths: Sequence[Path], on_change: Callable[[], object]) -> None:
        """Watch ``paths`` (``name`` for the log); their state now is the baseline."""
        self.groups.append((name, list(paths), on_change, file_state(paths)))
        if self._timer is None and not self.closed:
            self._timer = self.loop.call_later(self.interval, self._tick)

    def check(self) -> int:
        """Look at every group now; run the callbacks of those that changed (how many)."""
        ran = 0
        for i, (name, paths, on_change, before) in enumerate(self.groups):
            now = file_state(paths)
            if now == before:
                continue
            self.groups[i] = (name, paths, on_change, now)
            log.info("%s: CRL file changed", name)
            ran += 1
            try:
                on_change()
            except Exception:
                log.exception("%s: reloading the changed CRL file failed", name)
        return ran

    def _tick(self) -> None:
        self._timer = None
        if self.closed:
            return
        self.check()
        if not self.closed:
            self._timer = self.loop.call_later(self.interval, self._tick)

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def watch_links(
    loop: asyncio.AbstractEventLoop,
    config: Any,
    cluster: Any,
    bridges: Any,
    incr: Callable[[str], None],
    *,
    reload_cluster_tls: Callable[[], bool],
    bridge_context: Callable[[Any], Any] | None,
) -> FileWatch | None:
    """Watch the CRL files of ``[cluster.tls]`` and of each bridge's ``tls`` (None when
    there is none). ``reload_cluster_tls()`` rebuilds the cluster's TLS settings for new
    links (False when the files cannot be used: logged by it, nothing is cut then)."""
    from gateway.security.links import recheck_bridge, recheck_cluster

    watch = FileWatch(loop, config.crl_cache.file_check_interval)
    if cluster is not None and config.cluster.tls.crlfile:

        def on_cluster() -> None:
            if reload_cluster_tls():
                recheck_cluster(config, cluster, incr)

        watch.add("cluster.tls", list(config.cluster.tls.crlfile), on_cluster)
    if bridges is not None:
        for name, bridge in bridges.bridges.items():
            tls = bridge.settings.tls
            if tls is None or not tls.crlfile:
                continue

            def on_bridge(name: str = name, bridge: Any = bridge) -> None:
                recheck_bridge(name, bridge, incr, bridge_context)

            watch.add(f"bridges.mqtt.{name}.tls", list(tls.crlfile), on_bridge)
    if not watch.groups:
        watch.close()
        return None
    return watch
