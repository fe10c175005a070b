"""Fleet job benchmark: the PySpark job (``local[2]``) against the same job in DuckDB, on
one generated fleet, in one run.

    .venv/bin/python -m bench.fleet_bench                    # 300 devices x 7 days: ~3M rows
    .venv/bin/python -m bench.fleet_bench --devices 50 --days 2 --json out.json

The fleet is generated once under ``--dir`` and reused while its spec is the same. Spark's
figure excludes JVM start-up (timed apart); both engines get 2 threads. Each engine runs
``--repeat`` times (2) and the best run counts; wall and CPU seconds are both reported (CPU
seconds hold up better on a shared machine). Figures go to bench/README.md ("Fleet job").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import fleet_duckdb
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


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--skip-spark", action="store_true")
    ap.add_argument("--skip-duckdb", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

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

    if not args.skip_duckdb:
        runs = []
        for _ in range(args.repeat):
            shutil.rmtree(args.dir / "duckdb", ignore_errors=True)
            started, cpu = time.monotonic(), time.process_time()
            duck = fleet_duckdb.run(raw, args.dir / "duckdb", settings)
            runs.append((time.monotonic() - started, time.process_time() - cpu))
            print(f"duckdb: {runs[-1][0]:.1f}s wall, {runs[-1][1]:.1f}s CPU")
        result["duckdb"] = {
            "seconds": min(r[0] for r in runs),
            "cpu_seconds": min(r[1] for r in runs),
            "runs": runs,
            "rows": duck["rows"],
            "lines": duck["lines"],
        }

    if not args.skip_spark:
        from gateway.fleet import job

        started = time.monotonic()
        spark = job.spark_session("local[2]", "fleet-bench")
        spark.range(1).count()  # the JVM is up and a first job has run
        jvm = time.monotonic() - started
        gateway = spark.sparkContext._jvm
        assert gateway is not None
        jvm_pid = int(gateway.java.lang.ProcessHandle.current().pid())
        runs = []
        for _ in range(args.repeat):
            shutil.rmtree(args.dir / "spark", ignore_errors=True)
            cpu = _cpu_of(jvm_pid) + time.process_time()
            run = job.run(spark, settings, job.stderr_progress())
            runs.append((run.seconds, _cpu_of(jvm_pid) + time.process_time() - cpu))
            print(f"spark: {runs[-1][0]:.1f}s wall, {runs[-1][1]:.1f}s CPU")
        spark.stop()
        result["spark"] = {
            "seconds": min(r[0] for r in runs),
            "cpu_seconds": min(r[1] for r in runs),
            "runs": runs,
            "jvm_start_seconds": jvm,
            "lines": run.report["lines"]["telemetry"],
            "totals": run.report["totals"],
        }

    result["load_after"] = os.getloadavg()
    if "spark" in result and "duckdb" in result:
        s, d = result["spark"]["seconds"], result["duckdb"]["seconds"]
        sc, dc = result["spark"]["cpu_seconds"], result["duckdb"]["cpu_seconds"]
        result["ratio_spark_to_duckdb"] = s / d
        result["cpu_ratio_spark_to_duckdb"] = sc / dc
        print(
            f"{lines:,} telemetry lines ({result['raw_bytes'] / 2**20:.0f} MiB gzipped): "
            f"Spark {s:.1f}s ({lines / s:,.0f} lines/s), DuckDB {d:.1f}s "
            f"({lines / d:,.0f} lines/s); Spark/DuckDB = {s / d:.2f}x wall (target <= 3x); "
            f"CPU {sc:.0f}s / {dc:.0f}s = {sc / dc:.2f}x"
        )
        print(f"load average before {result['load_before']}, after {result['load_after']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
