"""bench.fleet_bench's breakdown of a Spark run's CPU by JVM thread."""

from __future__ import annotations

import os
from pathlib import Path

from bench.fleet_bench import _thread_cpu, _thread_groups


def test_thread_cpu_reads_every_thread_of_a_process() -> None:
    snapshot = _thread_cpu(os.getpid())
    comm = Path("/proc/self/comm").read_text().strip()
    assert f"{os.getpid()} {comm}" in snapshot  # the main thread: tid == pid
    assert all(cpu >= 0 for cpu in snapshot.values())


def test_thread_groups_by_jvm_thread_name() -> None:
    before = {"10 C2 CompilerThre": 5.0, "11 Executor task l": 1.0, "12 GC Thread#0": 0.5}
    after = {
        "10 C2 CompilerThre": 7.5,  # 2.5 s of JIT in between
        "11 Executor task l": 4.0,
        "12 GC Thread#0": 1.0,
        "13 C1 CompilerThre": 0.25,  # started in between: all of it counts
        "14 dag-scheduler-e": 0.3,
    }
    assert _thread_groups(before, after) == {"jit": 2.8, "gc": 0.5, "tasks": 3.0, "other": 0.3}
