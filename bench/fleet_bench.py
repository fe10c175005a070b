"""Fleet job benchmark: the PySpark job (``local[2]``) against the same job in DuckDB, on
one generated fleet, in one run.

    .venv/bin/python -m bench.fleet_bench                    # 300 devices x 7 days: ~3M rows
    .venv/bin/python -m bench.fleet_bench --devices 50 --days 2 --json out.json
    .venv/bin/python -m bench.fleet_bench --conf spark.driver.extraJavaOptions=-XX:+UseParallelGC

The fleet is generated once under ``--dir`` and reused while its spec is the same. Spark's
figure excludes JVM start-up (timed apart); both engines get 2 threads. The engines run
in turn (DuckDB, Spark, DuckDB, ...) ``--repeat`` times (3) and the median run counts;
wall and CPU seconds are both reported (CPU seconds hold up better on a shared machine).
Figures go to bench/README.md ("Fleet job").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import fleet_duckdb, key_value
from bench.procstat import cpu_seconds
from gateway.fleet.generate import MANIFEST, FleetSpec, generate_fleet
from gateway.fleet.settings import JobSettings


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*.jsonl.gz"))


def _machine() -> str:
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        cpu = platform.processor() or "unknown CPU"
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    return f"{os.cpu_count()} cores, {cpu}; {java.splitlines()[0] if java else 'no java'}"


# JVM threads by name (/proc/<pid>/task/*/comm), grouped: where a run's CPU goes besides
# the tasks themselves (Spark's generated code is compiled again by the JIT per new class)
THREAD_GROUPS = (
    ("jit", re.compile(r"^C[12] Compiler")),
    ("gc", re.compile(r"^(GC |G1 |VM Periodic)")),
    ("tasks", re.compile(r"^Executor task")),
)


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of each live thread of ``pid``, keyed "tid name"."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[f"{task.name} {(task / 'comm').read_text().strip()}"] = cpu_seconds(task / "stat")
        except OSError:  # the thread ended
            continue
    return out


def _thread_groups(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds spent between two :func:`_thread_cpu` snapshots, per group of
    :data:`THREAD_GROUPS` ("other": the driver, schedulers, shuffle; threads that
    ended in between are not counted)."""
    groups = dict.fromkeys([name for name, _ in THREAD_GROUPS] + ["other"], 0.0)
    for key, cpu in after.items():
        name = key.split(" ", 1)[1]
        group = next((g for g, pattern in THREAD_GROUPS if pattern.match(name)), "other")
        groups[group] += cpu - before.get(key, 0.0)
    return {g: round(v, 1) for g, v in groups.items()}


def ensure_fleet(root: Path, spec: FleetSpec) -> dict[str, Any]:
    manifest_path = root / MANIFEST
    if manifest_path.exists():
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        if manifest["spec"]["devices"] == spec.devices and manifest["spec"]["days"] == spec.days:
            return manifest
        shutil.rmtree(root)
    started = time.monotonic()
    manifest = generate_fleet(root, spec, progress=print)
    print(f"generated in {time.monotonic() - started:.1f}s")
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/gateway-fleet-bench", type=Path)
    ap.add_argument("--devices", type=int, default=300)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-spark", action="store_true")
    ap.add_argument("--skip-duckdb", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", type=key_value,
                    help="a Spark setting for the session (repeatable), e.g. "
                         "spark.driver.extraJavaOptions=-XX:+UseParallelGC")
    args = ap.parse_args()

    conf = dict(args.conf)
    raw = args.dir / "raw"
    manifest = ensure_fleet(raw, FleetSpec(devices=args.devices, days=args.days))
    lines = manifest["telemetry_lines"]
    result: dict[str, Any] = {
        "machine": _machine(),
        "devices": args.devices,
        "days": args.days,
        "telemetry_lines": lines,
        "event_lines": manifest["event_lines"],
        "raw_bytes": _size(raw),
        "load_before": os.getloadavg(),
    }
    settings = JobSettings(raw=str(raw), out=str(args.dir / "spark"))

    # Interleaved (DuckDB, Spark, DuckDB, Spark, ...) so both see the same background
    # load; the median run counts, and each run records the load average it started at.
    spark = jvm_pid = None
    if not args.skip_spark:
        from gateway.fleet import job

        started = time.monotonic()
        spark = job.spark_session("local[2]", "fleet-bench", conf=conf)
        result["spark_conf"] = conf
        spark.range(1).count()  # the JVM is up and a first job has run
        result["spark_jvm_start_seconds"] = time.monotonic() - started
        gateway = spark.sparkContext._jvm
        assert gateway is not None
        jvm_pid = int(gateway.java.lang.ProcessHandle.current().pid())
    runs: dict[str, list[dict[str, Any]]] = {"duckdb": [], "spark": []}
    for _ in range(args.repeat):
        if not args.skip_duckdb:
            shutil.rmtree(args.dir / "duckdb", ignore_errors=True)
            load = os.getloadavg()[0]
            started, cpu = time.monotonic(), time.process_time()
            duck = fleet_duckdb.run(raw, args.dir / "duckdb", settings)
            runs["duckdb"].append({"wall": time.monotonic() - started,
                                   "cpu": time.process_time() - cpu, "load": load})
            print(f"duckdb: {runs['duckdb'][-1]}")
        if spark is not None and jvm_pid is not None:
            from gateway.fleet import job

            shutil.rmtree(args.dir / "spark", ignore_errors=True)
            load = os.getloadavg()[0]
            jvm_stat = f"/proc/{jvm_pid}/stat"
            cpu = cpu_seconds(jvm_stat) + time.process_time()
            threads = _thread_cpu(jvm_pid)
            run = job.run(spark, settings, job.stderr_progress())
            runs["spark"].append({"wall": run.seconds, "load": load,
                                  "cpu": cpu_seconds(jvm_stat) + time.process_time() - cpu,
                                  "jvm_threads": _thread_groups(threads, _thread_cpu(jvm_pid))})
            print(f"spark: {runs['spark'][-1]}")
    for engine, done in runs.items():
        if done:
            result[engine] = {
                "seconds": statistics.median(r["wall"] for r in done),
                "cpu_seconds": statistics.median(r["cpu"] for r in done),
                "runs": done,
            }
    if spark is not None:
        result["spark"]["lines"] = run.report["lines"]["telemetry"]
        result["spark"]["totals"] = run.report["totals"]
        spark.stop()
    if "duckdb" in result:
        result["duckdb"] |= {"rows": duck["rows"], "lines": duck["lines"]}

    result["load_after"] = os.getloadavg()
    if "spark" in result and "duckdb" in result:
        s, d = result["spark"]["seconds"], result["duckdb"]["seconds"]
        sc, dc = result["spark"]["cpu_seconds"], result["duckdb"]["cpu_seconds"]
        result["ratio_spark_to_duckdb"] = s / d
        result["cpu_ratio_spark_to_duckdb"] = sc / dc
        print(
            f"{lines:,} telemetry lines ({result['raw_bytes'] / 2**20:.0f} MiB gzipped): "
            f"Spark {s:.1f}s ({lines / s:,.0f} lines/s), DuckDB {d:.1f}s "
            f"({lines / d:,.0f} lines/s); Spark/DuckDB = {s / d:.2f}x wall (target <= 1.5x); "
            f"CPU {sc:.0f}s / {dc:.0f}s = {sc / dc:.2f}x"
        )
        first = result["spark"]["runs"][0]
        print(
            f"Spark's first run (a fresh JVM's, what a one-shot `gateway-fleet run` does): "
            f"{first['wall']:.1f}s, {first['wall'] / d:.2f}x DuckDB's median; JVM threads "
            f"(CPU-s) {first['jvm_threads']}, then {result['spark']['runs'][-1]['jvm_threads']}"
        )
        print(f"load average before {result['load_before']}, after {result['load_after']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
