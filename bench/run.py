"""Run the benchmark scenarios against gatewayd, mosquitto and amqtt and print a table.

    .venv/bin/python -m bench.run --quick          # about 2 minutes, every broker
    .venv/bin/python -m bench.run                  # the full run (about 8 minutes)
    .venv/bin/python -m bench.run --brokers gatewayd --scenarios fanin-qos0,p2p-qos1
    .venv/bin/python -m bench.run --json results.json

Each scenario runs against a freshly started broker (one at a time, on a free loopback
port). The table gives each broker's figure, the ratios ours/mosquitto and ours/amqtt, the
target of issue 4 and whether it is met, and the messages lost; a second table gives broker
and load-generator CPU during each run (a broker near 100 % while the load generator has
headroom means the broker is the bottleneck).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any

from bench.brokers import BROKERS, machine_busy_seconds, setup, use_gatewayd_commit
from bench.scenarios import DURABILITY_SCENARIOS, SCENARIOS, Params, Result, run_scenario

OURS = "gatewayd"
# broker log lines that are expected and say nothing about the run
IGNORED_LOG_LINES = ("should not be run as root",)
QUIET_THRESHOLD = 20.0  # % CPU used by other processes before a run, above which we warn


# scenario prefix -> (target text, check(ratio_mosquitto, ratio_amqtt, value) -> bool)
def _target(scenario: str) -> str:
    if scenario.startswith(("fanin", "fanout", "p2p")):
        return ">=0.5x mosq, >=15x amqtt, 0 lost"
    if scenario == "idle-memory":
        return "<= 2 KiB"
    if scenario.startswith("latency"):
        return "p99 <= 5 ms"
    return "-"


def _met(scenario: str, rows: dict[str, Result]) -> str:
    ours = rows.get(OURS)
    if ours is None or ours.value is None:
        return "n/a"
    if scenario.startswith(("fanin", "fanout", "p2p")):
        ok = ours.lost == 0 and ours.error is None
        for other, need in (("mosquitto", 0.5), ("amqtt", 15.0)):
            ref = rows.get(other)
            if ref is not None and ref.value:
                ok = ok and ours.value / ref.value >= need
        return "yes" if ok else "NO"
    if scenario == "idle-memory":
        return "yes" if ours.value <= 2.0 and ours.lost == 0 else "NO"
    if scenario.startswith("latency"):
        return "yes" if ours.value <= 5.0 and ours.lost == 0 else "NO"
    return "-"


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "error"
    if unit in ("msg/s", "conn/s"):
        return f"{v:,.0f}"
    return f"{v:,.2f}"


def _ratio(a: Result | None, b: Result | None) -> str:
    if a is None or b is None or a.value is None or not b.value:
        return "-"
    return f"{a.value / b.value:.2f}x"


def table(results: list[Result], brokers: list[str]) -> str:
    by: dict[str, dict[str, Result]] = {}
    for r in results:
        by.setdefault(r.scenario, {})[r.broker] = r
    head = ["scenario", "unit", *brokers]
    if OURS in brokers:
        head += [f"ours/{b}" for b in brokers if b != OURS]
    head += ["target (issue 4)", "met", f"lost ({'/'.join(b[:4] for b in brokers)})"]
    rows = [head]
    for scenario, rs in by.items():
        unit = next(iter(rs.values())).unit
        row = [scenario, unit] + [_fmt(rs[b].value, unit) if b in rs else "-" for b in brokers]
        if OURS in brokers:
            row += [_ratio(rs.get(OURS), rs.get(b)) for b in brokers if b != OURS]
        row += [
            _target(scenario),
            _met(scenario, rs) if OURS in brokers else "-",
            "/".join(str(rs[b].lost) if b in rs else "-" for b in brokers),
        ]
        rows.append(row)
    return _markdown(rows)


def cpu_table(results: list[Result], brokers: list[str]) -> str:
    rows = [["scenario", *(f"{b} CPU % broker / loadgen / others" for b in brokers)]]
    by: dict[str, dict[str, Result]] = {}
    for r in results:
        by.setdefault(r.scenario, {})[r.broker] = r
    for scenario, rs in by.items():
        if "broker_cpu_pct" not in next(iter(rs.values())).details:
            continue
        row = [scenario]
        for b in brokers:
            d = rs[b].details if b in rs else {}
            if "broker_cpu_pct" not in d:
                row.append("-")
                continue
            others = d["machine_cpu_pct"] - d["broker_cpu_pct"] - d["loadgen_cpu_pct"]
            row.append(f"{d['broker_cpu_pct']:.0f} / {d['loadgen_cpu_pct']:.0f} / {others:.0f}")
        rows.append(row)
    return _markdown(rows)


def latency_table(results: list[Result], brokers: list[str]) -> str:
    rows = [["scenario", *(f"{b} p50 / p99 / max ms" for b in brokers)]]
    by: dict[str, dict[str, Result]] = {}
    for r in results:
        if r.scenario.startswith("latency"):
            by.setdefault(r.scenario, {})[r.broker] = r
    for scenario, rs in by.items():
        row = [scenario]
        for b in brokers:
            d = rs[b].details if b in rs else {}
            row.append(f"{d.get('p50_ms', '-')} / {d.get('p99_ms', '-')} / {d.get('max_ms', '-')}")
        rows.append(row)
    return _markdown(rows) if len(rows) > 1 else ""


def _markdown(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def background_cpu(seconds: float = 0.3) -> float:
    """Machine CPU % (100 = one core) used by others while nothing of ours is busy."""
    b0, t0 = machine_busy_seconds(), time.monotonic()
    time.sleep(seconds)
    return 100 * (machine_busy_seconds() - b0) / (time.monotonic() - t0)


def wait_quiet(max_wait: float, threshold: float) -> float:
    """Wait (at most ``max_wait`` s) until other processes use less than ``threshold`` %."""
    deadline = time.monotonic() + max_wait
    while True:
        busy = background_cpu()
        if busy < threshold or time.monotonic() >= deadline:
            return busy
        time.sleep(1.0)


def renice(nice: int) -> None:
    """Give this process, and everything it starts from now on (brokers, their threads,
    load-generator workers), the scheduling weight of ``nice``.

    With autogroup scheduling (``kernel.sched_autogroup_enabled``), the nice value of a
    process only counts inside its session's group, and the CPU is shared between groups:
    so the harness becomes a session of its own (``setsid``; a terminal's Ctrl-C no longer
    reaches it, use ``kill -INT``) and sets that group's nice too.
    """
    with contextlib.suppress(OSError):
        os.setsid()
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
        f.write(str(nice))
    os.setpriority(os.PRIO_PROCESS, 0, nice)


def machine() -> dict[str, str]:
    info: dict[str, str] = {"cores": str(os.cpu_count())}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                info["cpu"] = line.split(":", 1)[1].strip()
    except OSError:
        pass
    with open("/proc/meminfo") as f:
        info["ram"] = f"{int(f.readline().split()[1]) / 1024 / 1024:.1f} GiB"
    info["kernel"] = platform.release()
    info["python"] = platform.python_version()
    for name, cls in BROKERS.items():
        try:
            info[name] = cls.version()
        except Exception:  # a version string is only informative
            info[name] = "?"
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="short version (< 2 minutes)")
    ap.add_argument("--tiny", action="store_true", help="smallest scale (smoke test)")
    ap.add_argument("--brokers", default="gatewayd,mosquitto,amqtt")
    ap.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated subset of: {', '.join(SCENARIOS + DURABILITY_SCENARIOS)}",
    )
    ap.add_argument("--workers", type=int, help="load-generator processes")
    ap.add_argument("--clients", type=int, help="N of fan-in/fan-out/p2p")
    ap.add_argument("--duration", type=float, help="seconds of publishing per scenario")
    ap.add_argument("--idle-conns", type=int, help="connections of idle-memory (<= 18000)")
    ap.add_argument("--json", metavar="FILE", help="write every result to this JSON file")
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each run, wait up to this long for other processes to use less than "
        f"{QUIET_THRESHOLD:.0f}%% CPU (the machine has 2 cores; other load skews figures)",
    )
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        metavar="N",
        help="run the harness, the brokers and the load generator at this nice value, in "
        "a scheduler group of their own (e.g. -20, needs root): on a shared machine it keeps "
        "other processes from taking CPU from the measurement; every broker gets the same",
    )
    ap.add_argument(
        "--gatewayd-commit",
        metavar="REV",
        help="run gatewayd from this commit (git archive into a temporary directory) "
        "rather than the working tree, e.g. HEAD",
    )
    args = ap.parse_args(argv)

    params = Params.tiny() if args.tiny else Params.quick() if args.quick else Params()
    for attr, value in (
        ("workers", args.workers),
        ("clients", args.clients),
        ("duration", args.duration),
        ("idle_conns", args.idle_conns),
    ):
        if value is not None:
            setattr(params, attr, value)
    if params.idle_conns > 18000:
        # the broker holds one descriptor per connection; the process limit is 20,000
        ap.error("--idle-conns above 18000 would approach the process file limit")
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for b in brokers:
        if b not in BROKERS:
            ap.error(f"unknown broker {b!r}")
    for s in scenarios:
        if s not in SCENARIOS and s not in DURABILITY_SCENARIOS:
            ap.error(f"unknown scenario {s!r}")

    if args.gatewayd_commit:
        use_gatewayd_commit(args.gatewayd_commit)
    setup(brokers)
    if args.nice:
        renice(args.nice)
    started = time.monotonic()
    results: list[Result] = []
    logs: dict[str, list[str]] = {}
    noisy: list[str] = []
    backgrounds: list[float] = []
    for scenario in scenarios:
        for name in brokers:
            cls = BROKERS[name]
            background = wait_quiet(args.wait_quiet, QUIET_THRESHOLD)
            broker = cls()
            try:
                broker.start()
                t0 = time.monotonic()
                result = run_scenario(scenario, broker, params)
            except Exception as exc:  # one broker's failure must not stop the run
                result = Result(scenario, name, "-", None, "-", error=repr(exc))
                t0 = time.monotonic()
            finally:
                log = broker.log_since_start()
                broker.cleanup()
            interesting = [
                ln
                for ln in log.splitlines()
                if any(
                    w in ln
                    for w in ("ERROR", "Error", "Traceback", "WARNING", "Warning", "exception")
                )
                and not any(w in ln for w in IGNORED_LOG_LINES)
            ]
            if interesting:
                logs[f"{scenario}/{name}"] = interesting[:10]
                result.details["broker_log"] = interesting[:10]
            result.details["background_cpu_pct"] = round(background, 1)
            backgrounds.append(background)
            if background >= QUIET_THRESHOLD and not args.nice:
                noisy.append(f"{scenario}/{name} ({background:.0f}%)")
            results.append(result)
            status = f" ERROR {result.error}" if result.error else ""
            if background >= QUIET_THRESHOLD and not args.nice:
                status += f" [other processes used {background:.0f}% CPU before the run]"
            print(
                f"  {scenario:13} {name:10} {_fmt(result.value, result.unit):>10} "
                f"{result.unit:6} lost={result.lost} ({time.monotonic() - t0:.1f}s){status}",
                file=sys.stderr,
                flush=True,
            )

    print()
    print(table(results, brokers))
    print()
    lat = latency_table(results, brokers)
    if lat:
        print(lat)
        print()
    print(cpu_table(results, brokers))
    print()
    info = machine()
    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    if backgrounds:
        print(
            f"other processes before each run: {sum(backgrounds) / len(backgrounds):.0f}% CPU "
            f"on average (100 = one core)"
            + (f"; the run had nice {args.nice} in its own scheduler group" if args.nice else "")
        )
    print(f"total time: {time.monotonic() - started:.0f}s")
    if noisy:
        print(
            f"\nWARNING: other processes used >= {QUIET_THRESHOLD:.0f}% CPU before "
            f"{len(noisy)} of {len(results)} runs; their figures are skewed "
            f"(use --wait-quiet): {', '.join(noisy)}"
        )
    if logs:
        print("\nbroker log lines worth a look:")
        for key, lines in logs.items():
            for ln in lines:
                print(f"  [{key}] {ln}")
    if args.json:
        doc: dict[str, Any] = {
            "nice": args.nice,
            "machine": info,
            "params": asdict(params),
            "results": [asdict(r) for r in results],
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
