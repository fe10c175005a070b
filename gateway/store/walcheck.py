"""Damage inside a SQLite WAL file, which SQLite itself passes over in silence.

SQLite reads a WAL frame by frame and stops at the first frame whose salt or cumulative
checksum does not match (https://www.sqlite.org/fileformat2.html#walformat): a torn
last write is that, and harmless. But a frame damaged in the *middle* (a bad flash
page) also ends the WAL there, and every transaction committed after it is dropped
without an error. :func:`check_wal` tells the two apart: after the first bad frame,
frames of the same WAL generation (same salts) that follow mean committed data was
skipped. It reads only; :func:`gateway.store.salvage.open_checked` keeps a copy of
such a WAL and raises the alarm ``store_wal_damaged``.

Checksums: pairs of 32-bit words (big-endian when the magic's low bit is 1, else
little-endian), ``s0 += x0 + s1; s1 += x1 + s0`` modulo 2^32, over the header's first 24
bytes, then each frame's first 8 header bytes and its page, cumulatively.
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MAGIC = (0x377F0682, 0x377F0683)
HEADER = 32
FRAME_HEADER = 24
MAX_WAL = 256 * 1024 * 1024  # larger WALs are not checked


@dataclass(frozen=True, slots=True)
class WalCheck:
    frames: int  # whole frames in the file
    valid: int  # frames SQLite will use (up to its first bad one)
    first_bad: int | None  # index of the first bad frame (None: none)
    later_frames: int  # frames of this generation after the first bad one
    later_commits: int  # commit frames among them: transactions SQLite will drop

    @property
    def damaged(self) -> bool:
        """A bad frame with frames of the same generation after it (not a torn tail)."""
        return self.first_bad is not None and self.later_frames > 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _checksum(data: bytes, big: bool, s0: int, s1: int) -> tuple[int, int]:
    words = struct.unpack(f"{'>' if big else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def check_wal(path: Path) -> WalCheck | None:
    """The frames of the WAL at ``path``; None when there is no WAL worth reading (none,
    empty, a header that is not a WAL's, or too large)."""
    try:
        size = path.stat().st_size
        if size < HEADER or size > MAX_WAL:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    magic, _version, page_size, _seq, salt1, salt2, c0, c1 = struct.unpack(">8I", data[:32])
    if magic not in MAGIC or page_size < 512 or page_size & (page_size - 1):
        return None
    big = bool(magic & 1)
    s0, s1 = _checksum(data[:24], big, 0, 0)
    if (s0, s1) != (c0, c1):
        return None  # a header SQLite would not use: the whole WAL is ignored, as written
    frame = FRAME_HEADER + page_size
    frames = (size - HEADER) // frame
    valid = 0
    first_bad: int | None = None
    later = commits = 0
    for i in range(frames):
        off = HEADER + i * frame
        head = data[off : off + FRAME_HEADER]
        _page, commit, f1, f2, k0, k1 = struct.unpack(">6I", head)
        if first_bad is None:
            ok = (f1, f2) == (salt1, salt2)
            if ok:
                n0, n1 = _checksum(head[:8], big, s0, s1)
                n0, n1 = _checksum(data[off + FRAME_HEADER : off + frame], big, n0, n1)
                ok = (n0, n1) == (k0, k1)
            if ok:
                s0, s1 = n0, n1
                valid += 1
                continue
            first_bad = i
            continue
        if (f1, f2) == (salt1, salt2):
            later += 1
            if commit:
                commits += 1
    return WalCheck(frames, valid, first_bad, later, commits)
