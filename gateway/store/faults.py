"""What a failed SQLite write means for the node: a :class:`StoreFault` of one kind.

Kinds (from SQLite's primary result code, which Python exposes as
``sqlite3.Error.sqlite_errorcode``; the message text is the fallback):

- ``full``: SQLITE_FULL, the file system is out of space (ENOSPC) or the database hit
  ``max_page_count``;
- ``io``: SQLITE_IOERR, the kernel failed a read, write or fsync (EIO, and EROFS on some
  paths);
- ``readonly``: SQLITE_READONLY / SQLITE_CANTOPEN, the file or its directory cannot be
  written (a read-only remount after ext4 ``errors=remount-ro``);
- ``corrupt``: SQLITE_CORRUPT / SQLITE_NOTADB, the file is malformed;
- ``busy``: SQLITE_BUSY / SQLITE_LOCKED, another process holds a lock past the timeout;
- ``other``: anything else (a bug: a constraint or a statement that cannot run).

``full``, ``io``, ``readonly`` and ``busy`` may pass by themselves (space freed, the
file system remounted, the other writer gone): the store retries. ``corrupt`` does not:
the file is moved aside and salvaged (:mod:`gateway.store.salvage`).
"""

from __future__ import annotations

import errno
import sqlite3
from dataclasses import dataclass
from typing import Literal

FaultKind = Literal["full", "io", "readonly", "corrupt", "busy", "other"]

_BY_CODE: dict[int, FaultKind] = {
    13: "full",  # SQLITE_FULL
    10: "io",  # SQLITE_IOERR
    8: "readonly",  # SQLITE_READONLY
    14: "readonly",  # SQLITE_CANTOPEN
    11: "corrupt",  # SQLITE_CORRUPT
    26: "corrupt",  # SQLITE_NOTADB
    5: "busy",  # SQLITE_BUSY
    6: "busy",  # SQLITE_LOCKED
}

_BY_ERRNO: dict[int, FaultKind] = {
    errno.ENOSPC: "full",
    errno.EDQUOT: "full",
    errno.EIO: "io",
    errno.EROFS: "readonly",
    errno.EACCES: "readonly",
    errno.EPERM: "readonly",
}


@dataclass(frozen=True, slots=True)
class StoreFault:
    kind: FaultKind
    message: str

    @property
    def space(self) -> bool:
        """Lack of space: freeing some (or releasing the reserve) can cure it."""
        return self.kind == "full"

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}


def classify(exc: BaseException) -> StoreFault:
    """The fault a failed commit (or open) raised."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        kind = _BY_CODE.get(code & 0xFF) if isinstance(code, int) else None
        if kind is None:
            text = str(exc).lower()
            if "disk is full" in text:
                kind = "full"
            elif "malformed" in text or "not a database" in text:
                kind = "corrupt"
            elif "readonly" in text or "read-only" in text:
                kind = "readonly"
            elif "i/o" in text:
                kind = "io"
            elif "locked" in text:
                kind = "busy"
            else:
                kind = "other"
        return StoreFault(kind, str(exc))
    if isinstance(exc, OSError) and exc.errno is not None:
        return StoreFault(_BY_ERRNO.get(exc.errno, "io"), exc.strerror or str(exc))
    return StoreFault("other", f"{type(exc).__name__}: {exc}")
