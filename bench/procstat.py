"""CPU time from ``/proc``: the user + system seconds of a process or of one thread."""

from __future__ import annotations

import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(stat: str | Path) -> float:
    """User + system CPU seconds from ``/proc/<pid>/stat`` (a process: all its threads,
    ended ones included) or ``/proc/<pid>/task/<tid>/stat`` (one thread). OSError when
    the process or thread is gone."""
    # after the command name, which may hold spaces and ")": utime and stime are the
    # 14th and 15th fields of the line, [11] and [12] here
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK
