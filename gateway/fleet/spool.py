"""The archive's file side: sealed segments, salvage after a crash, the sequence state.

Everything here is blocking file I/O. The archiver runs it on a :class:`ThreadSink`
(one writer thread, so operations happen in submission order) or, in tests, on an
:class:`InlineSink`.

Invariants:

- A segment under its temporary name is a concatenation of complete gzip members plus, after
  a crash, at most one incomplete member at the end. Each member holds whole lines.
- :func:`salvage` keeps every complete member of a leftover temporary segment, renames it
  into place (or deletes it when nothing is left) and reports the highest ``seq`` it saw per
  kind and device, so counters resume past every record that reached the disk.
- The state file is replaced atomically (write to a temporary name, fsync, rename).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import queue
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from gateway.fleet.records import KINDS, TMP_SUFFIX, Kind, final_name

log = logging.getLogger("gateway.fleet")

STATE_FILE = "archiver-state.json"

SeqState = dict[Kind, dict[str, int]]


class Sink(Protocol):
    """Runs blocking I/O jobs in submission order."""

    def submit(self, job: Callable[[], None]) -> None: ...
    def close(self) -> None:
        """Run every job submitted so far, then stop accepting jobs."""
        ...


class InlineSink:
    """Runs each job at once, on the caller's thread (tests, tools)."""

    def submit(self, job: Callable[[], None]) -> None:
        job()

    def close(self) -> None:
        pass


class ThreadSink:
    """One daemon writer thread fed by a queue. A job that raises is logged and skipped."""

    def __init__(self, name: str = "fleet-archiver") -> None:
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        if self._closed:
            raise RuntimeError("sink is closed")
        self._queue.put(job)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                job()
            except Exception:
                log.exception("archiver: write failed")


# ------------------------------------------------------------------ segments


def append_member(path: Path, data: bytes, level: int = 6) -> int:
    """Append ``data`` as one gzip member to ``path`` (created with its parents); returns
    the compressed size."""
    member = gzip.compress(data, compresslevel=level, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(member)
    return len(member)


def seal(tmp: Path) -> Path | None:
    """fsync a finished temporary segment and rename it to its final name (same folder).

    Returns the final path, or None when there was no file (a segment that never got a
    record).
    """
    if not tmp.exists():
        return None
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    final = tmp.with_name(final_name(tmp.name))
    os.replace(tmp, final)
    _fsync_dir(tmp.parent)
    return final


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def complete_members(data: bytes) -> Iterator[tuple[int, bytes]]:
    """``(end offset, decompressed bytes)`` for each complete gzip member at the start of
    ``data``; stops quietly at the first incomplete or damaged one."""
    offset = 0
    while offset < len(data):
        d = zlib.decompressobj(wbits=31)
        try:
            out = d.decompress(data[offset:])
        except zlib.error:
            return
        if not d.eof:
            return
        end = len(data) - len(d.unused_data)
        yield end, out
        offset = end


def salvage(root: Path) -> SeqState:
    """Seal what a crash left under temporary names below ``root/raw``; see module doc."""
    seen: SeqState = {kind: {} for kind in KINDS}
    raw = root / "raw"
    if not raw.is_dir():
        return seen
    for tmp in sorted(raw.rglob(f".*{TMP_SUFFIX}")):
        kind = _kind_of(tmp, raw)
        data = tmp.read_bytes()
        keep = 0
        for end, text in complete_members(data):
            keep = end
            if kind is not None:
                _max_seq(text, seen[kind])
        if keep == 0:
            tmp.unlink()
            log.warning("archiver: removed empty leftover segment %s", tmp)
            continue
        if keep < len(data):
            with open(tmp, "r+b") as f:
                f.truncate(keep)
            log.warning("archiver: leftover segment %s cut to %d of %d bytes", tmp, keep, len(data))
        final = seal(tmp)
        log.warning("archiver: salvaged leftover segment as %s", final)
    return seen


def _kind_of(path: Path, raw: Path) -> Kind | None:
    first = path.relative_to(raw).parts[0]
    for kind in KINDS:
        if first == kind:
            return kind
    return None


def _max_seq(text: bytes, into: dict[str, int]) -> None:
    for line in text.splitlines():
        try:
            rec = json.loads(line)
            device, seq = rec["device"], rec["seq"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(device, str) and isinstance(seq, int) and seq > into.get(device, 0):
            into[device] = seq


# ------------------------------------------------------------------ sequence state


def load_state(root: Path) -> SeqState:
    """The saved counters (empty when there is no state file or it is unreadable)."""
    state: SeqState = {kind: {} for kind in KINDS}
    path = root / STATE_FILE
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return state
    except (OSError, ValueError) as exc:
        log.error("archiver: cannot read %s (%s); sequence numbers restart", path, exc)
        return state
    for kind in KINDS:
        counters = saved.get("seq", {}).get(kind, {}) if isinstance(saved, dict) else {}
        if isinstance(counters, dict):
            state[kind] = {d: s for d, s in counters.items() if isinstance(s, int)}
    return state


def save_state(root: Path, state: SeqState) -> None:
    root.mkdir(parents=True, exist_ok=True)
    path = root / STATE_FILE
    tmp = path.with_name(f".{STATE_FILE}{TMP_SUFFIX}")
    with open(tmp, "w") as f:
        json.dump({"seq": state}, f, separators=(",", ":"), sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def merge_state(a: SeqState, b: SeqState) -> SeqState:
    """Per kind and device, the higher counter of ``a`` and ``b``."""
    out: SeqState = {}
    for kind in KINDS:
        merged = dict(a.get(kind, {}))
        for device, seq in b.get(kind, {}).items():
            if seq > merged.get(device, 0):
                merged[device] = seq
        out[kind] = merged
    return out
