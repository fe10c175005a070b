"""Run the benchmark scenarios against gatewayd, mosquitto and amqtt and print tables.

    .venv/bin/python -m bench.run --quick          # 3 interleaved runs, about 10 minutes
    .venv/bin/python -m bench.run --quick --runs 1 # one run, about 3 minutes
    .venv/bin/python -m bench.run --brokers gatewayd --scenarios fanin-qos0,p2p-qos1
    .venv/bin/python -m bench.run --json results.json

Each run of a scenario uses a freshly started broker (one at a time, on a free loopback
port), pinned to CPU 0 while the load generator and this harness run on CPU 1 (--pin).
Scenarios run --runs times, interleaved across brokers; the tables give the median and
± half the range of each figure, the ratios ours/mosquitto and ours/amqtt, issue 23's
target and whether it is met, the messages lost, the broker's CPU time per message (the
figure that compares across machines), the latency percentiles, and the kernel's
listen-queue counters of the connection scenarios; the machine and its load average head
every table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench import key_value
from bench.brokers import (
    BROKERS,
    Broker,
    Gatewayd,
    Mosquitto,
    machine_busy_seconds,
    setup,
    use_gatewayd_commit,
)
from bench.scenarios import (
    DURABILITY_SCENARIOS,
    EXTRA_SCENARIOS,
    SCENARIOS,
    TCPEXT_COUNTERS,
    Params,
    Result,
    needs_tls,
    run_scenario,
)

OURS = "gatewayd"
# broker log lines that are expected and say nothing about the run
IGNORED_LOG_LINES = ("should not be run as root", "no dashboard administrator yet")
QUIET_THRESHOLD = 20.0  # % CPU used by other processes before a run, above which we warn


TRAFFIC = ("fanin", "fanout", "p2p")


def _target(scenario: str) -> str:
    """Issue 23's target for ``scenario`` (issue 4's were 0.5x mosquitto, 2 KiB, 5 ms)."""
    if scenario.startswith(TRAFFIC) and "persistent" not in scenario:
        return ">=1.0x mosq, 0 lost"
    if scenario.startswith(("connrate-", "storm")):
        return ">=1.0x mosq"
    if scenario == "idle-memory":
        return "<= 1 KiB"
    if scenario.startswith("latency"):
        return "p99, p99.9 <= mosq"
    return "-"


@dataclass
class Agg:
    """One (scenario, broker) over its runs: medians, and the spread of the headline."""

    scenario: str
    broker: str
    unit: str
    values: list[float]
    cpu_us: list[float]
    lost: int
    errors: list[str]
    details: list[dict[str, Any]]

    @property
    def value(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def spread_pct(self) -> float | None:
        """Half the range of the runs, in % of the median (0 with one run)."""
        m = self.value
        if not m:
            return None
        return 100 * (max(self.values) - min(self.values)) / 2 / m

    def median_of(self, key: str) -> float | None:
        xs = [d[key] for d in self.details if isinstance(d.get(key), int | float)]
        return statistics.median(xs) if xs else None

    def sum_of(self, key: str) -> int:
        return sum(int(d.get(key, 0) or 0) for d in self.details)


def aggregate(results: list[Result]) -> dict[str, dict[str, Agg]]:
    by: dict[str, dict[str, Agg]] = {}
    for r in results:
        a = by.setdefault(r.scenario, {}).get(r.broker)
        if a is None:
            a = by[r.scenario][r.broker] = Agg(r.scenario, r.broker, r.unit, [], [], 0, [], [])
        if r.unit != "-":
            a.unit = r.unit
        if r.value is not None:
            a.values.append(r.value)
        cpu = r.details.get("broker_cpu_us_per_msg")
        if cpu is not None:
            a.cpu_us.append(cpu)
        a.lost += r.lost
        if r.error:
            a.errors.append(r.error.splitlines()[0][:200])
        a.details.append(r.details)
    return by


def _better(scenario: str, ours: float, ref: float) -> bool:
    lower = scenario.startswith("latency") or scenario == "idle-memory"
    return ours <= ref if lower else ours >= ref


def _met(scenario: str, rs: dict[str, Agg]) -> str:
    ours = rs.get(OURS)
    if ours is None or ours.value is None:
        return "n/a"
    ok = ours.lost == 0 and not ours.errors
    if not ok and _target(scenario) != "-":
        return "NO"  # a lost message or a failed run is never a met target
    mosq = rs.get("mosquitto")
    if scenario == "idle-memory":
        return "yes" if ok and ours.value <= 1.0 else "NO"
    if scenario.startswith("latency"):
        if mosq is None or mosq.value is None:
            return "n/a"
        p999 = ours.median_of("p999_ms"), mosq.median_of("p999_ms")
        ok = ok and ours.value <= mosq.value
        if p999[0] is not None and p999[1] is not None:
            ok = ok and p999[0] <= p999[1]
        return "yes" if ok else "NO"
    if scenario.startswith((*TRAFFIC, "connrate-", "storm")) and "persistent" not in scenario:
        if mosq is None or mosq.value is None:
            return "n/a"
        return "yes" if ok and _better(scenario, ours.value, mosq.value) else "NO"
    return "-"


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "error"
    if unit in ("msg/s", "conn/s"):
        return f"{v:,.0f}"
    return f"{v:,.2f}"


def _cell(a: Agg | None) -> str:
    if a is None:
        return "-"
    if a.value is None:
        return "error"
    spread = a.spread_pct
    runs = len(a.values)
    return _fmt(a.value, a.unit) + (f" ±{spread:.0f}%" if runs > 1 and spread is not None else "")


def _ratio(a: Agg | None, b: Agg | None) -> str:
    if a is None or b is None or a.value is None or not b.value:
        return "-"
    return f"{a.value / b.value:.2f}x"


def table(by: dict[str, dict[str, Agg]], brokers: list[str]) -> str:
    head = ["scenario", "unit", *brokers]
    if OURS in brokers:
        head += [f"ours/{b}" for b in brokers if b != OURS]
    head += ["target (issue 23)", "met", f"lost ({'/'.join(b[:4] for b in brokers)})"]
    rows = [head]
    for scenario, rs in by.items():
        unit = next(iter(rs.values())).unit
        row = [scenario, unit] + [_cell(rs.get(b)) for b in brokers]
        if OURS in brokers:
            row += [_ratio(rs.get(OURS), rs.get(b)) for b in brokers if b != OURS]
        row += [
            _target(scenario),
            _met(scenario, rs) if OURS in brokers else "-",
            "/".join(str(rs[b].lost) if b in rs else "-" for b in brokers),
        ]
        rows.append(row)
    return _markdown(rows)


def cpu_table(by: dict[str, dict[str, Agg]], brokers: list[str]) -> str:
    """Broker CPU time (user + system) per delivered message or per connect: the figure
    that compares across machines and survives a busy machine better than rates."""
    rows = [
        [
            "scenario",
            *(f"{b} µs/msg" for b in brokers),
            *(f"{b} CPU % broker / loadgen / others" for b in brokers),
        ]
    ]
    for scenario, rs in by.items():
        if not any(a.cpu_us for a in rs.values()):
            continue
        row = [scenario]
        for b in brokers:
            a = rs.get(b)
            row.append(f"{statistics.median(a.cpu_us):.2f}" if a and a.cpu_us else "-")
        for b in brokers:
            a = rs.get(b)
            bc, lc, mc = (
                (a.median_of("broker_cpu_pct"), a.median_of("loadgen_cpu_pct"),
                 a.median_of("machine_cpu_pct"))
                if a else (None, None, None)
            )
            if bc is None or lc is None or mc is None:
                row.append("-")
            else:
                row.append(f"{bc:.0f} / {lc:.0f} / {mc - bc - lc:.0f}")
        rows.append(row)
    return _markdown(rows) if len(rows) > 1 else ""


def latency_table(by: dict[str, dict[str, Agg]], brokers: list[str]) -> str:
    rows = [["scenario", *(f"{b} p50 / p99 / p99.9 / max ms" for b in brokers)]]
    for scenario, rs in by.items():
        if not scenario.startswith("latency"):
            continue
        row = [scenario]
        for b in brokers:
            a = rs.get(b)
            row.append(
                " / ".join(
                    f"{v:.3f}" if (v := a.median_of(k) if a else None) is not None else "-"
                    for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms")
                )
            )
        rows.append(row)
    return _markdown(rows) if len(rows) > 1 else ""


def listen_table(by: dict[str, dict[str, Agg]], brokers: list[str]) -> str:
    """The kernel's ListenOverflows / ListenDrops / TCPSynRetrans during the connection
    scenarios, summed over the runs (machine-wide counters: another program's connects
    count too)."""
    rows = [["scenario", *(f"{b} overflows / drops / SYN retrans" for b in brokers)]]
    for scenario, rs in by.items():
        if not scenario.startswith(("connrate", "storm")):
            continue
        row = [scenario]
        for b in brokers:
            a = rs.get(b)
            row.append(
                " / ".join(str(a.sum_of(k)) for k in TCPEXT_COUNTERS) if a else "-"
            )
        rows.append(row)
    return _markdown(rows) if len(rows) > 1 else ""


def _markdown(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def machine_line(info: dict[str, str]) -> str:
    """The machine, and the load averages now: printed above every table."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"machine: {info.get('cpu', '?')}, {info.get('cores', '?')} cores; "
        f"load average {load} (1/5/15 min); {info.get('pinning', 'not pinned')}"
    )


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


def _one(
    scenario: str,
    name: str,
    params: Params,
    args: argparse.Namespace,
    logs: dict[str, list[str]],
    noisy: list[str],
    backgrounds: list[float],
    run: int,
) -> Result:
    """One run of ``scenario`` against a fresh broker ``name``."""
    cls = BROKERS[name]
    background = wait_quiet(args.wait_quiet, QUIET_THRESHOLD)
    load1 = os.getloadavg()[0]
    broker = cls(tls=needs_tls(scenario))
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
        if any(w in ln for w in ("ERROR", "Error", "Traceback", "WARNING", "Warning", "exception"))
        and not any(w in ln for w in IGNORED_LOG_LINES)
    ]
    if interesting:
        logs[f"{scenario}/{name}"] = interesting[:10]
        result.details["broker_log"] = interesting[:10]
    result.details["background_cpu_pct"] = round(background, 1)
    result.details["loadavg_1min"] = round(load1, 2)
    result.details["run"] = run
    backgrounds.append(background)
    status = f" ERROR {result.error}" if result.error else ""
    if background >= QUIET_THRESHOLD and not args.nice:
        noisy.append(f"{scenario}/{name} ({background:.0f}%)")
        status += f" [other processes used {background:.0f}% CPU before the run]"
    cpu = result.details.get("broker_cpu_us_per_msg")
    print(
        f"  run {run + 1} {scenario:25} {name:10} {_fmt(result.value, result.unit):>10} "
        f"{result.unit:6} lost={result.lost}"
        + (f" cpu={cpu:.2f}µs" if cpu is not None else "")
        + f" load={load1:.2f} ({time.monotonic() - t0:.1f}s){status}",
        file=sys.stderr,
        flush=True,
    )
    return result


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
    ap.add_argument(
        "--runs",
        type=int,
        help="runs of every scenario, interleaved across brokers (default 3; --tiny 1); "
        "tables give the median and ± half the range",
    )
    ap.add_argument(
        "--pin",
        default="auto",
        metavar="BROKER:LOADGEN",
        help="CPU lists for taskset: the broker's and the load generator's (and this "
        "harness's), e.g. 0:1; 'auto' = 0:1 on a machine of 2 or more cores; 'none' = "
        "not pinned. Multi-process brokers (gatewayd-2w) are never pinned",
    )
    ap.add_argument(
        "--gatewayd-set",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="a configuration key for every gatewayd broker, e.g. "
        "listeners.tcp.default.backlog=1024 (as a GATEWAY_* variable; repeatable)",
    )
    ap.add_argument(
        "--mosquitto-set",
        action="append",
        default=[],
        metavar="LINE",
        help='a mosquitto.conf line for every mosquitto broker, e.g. "set_tcp_nodelay true" '
        "(repeatable)",
    )
    ap.add_argument("--workers", type=int, help="load-generator processes")
    ap.add_argument("--clients", type=int, help="N of fan-in/fan-out/p2p")
    ap.add_argument("--duration", type=float, help="seconds of publishing per scenario")
    ap.add_argument(
        "--window", type=int, help="messages outstanding per subscriber, closed loop (500)"
    )
    ap.add_argument("--idle-conns", type=int, help="connections of idle-memory (<= 18000)")
    ap.add_argument("--json", metavar="FILE", help="write every result to this JSON file")
    ap.add_argument(
        "--rcvlowat",
        type=int,
        metavar="BYTES",
        help="SO_RCVLOWAT of the load generator's QoS 0 throughput subscribers: one read "
        "per this many bytes, not per send() of the broker (default 0: off)",
    )
    ap.add_argument(
        "--conn-count",
        type=int,
        metavar="N",
        help="connects per connrate run (8,000; --quick 3,000); the run's time cap grows to "
        "N / 2,000 seconds if that is longer. Persistent sessions stay: N of them at the end",
    )
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
        ("rcvlowat", args.rcvlowat),
        ("window", args.window),
    ):
        if value is not None:
            setattr(params, attr, value)
    if args.conn_count is not None:
        if args.conn_count < 1:
            ap.error("--conn-count must be at least 1")
        params.conn_count = args.conn_count
        params.conn_duration = max(params.conn_duration, args.conn_count / 2000)
    if params.idle_conns > 18000:
        # the broker holds one descriptor per connection; the process limit is 20,000
        ap.error("--idle-conns above 18000 would approach the process file limit")
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for b in brokers:
        if b not in BROKERS:
            ap.error(f"unknown broker {b!r}")
    for s in scenarios:
        if s not in SCENARIOS + DURABILITY_SCENARIOS + EXTRA_SCENARIOS:
            ap.error(f"unknown scenario {s!r}")
    runs = args.runs if args.runs is not None else (1 if args.tiny else 3)
    if runs < 1:
        ap.error("--runs must be at least 1")
    pin = args.pin
    if pin == "auto":
        pin = "0:1" if (os.cpu_count() or 1) >= 2 else "none"
    pinning = "not pinned"
    if pin != "none":
        try:
            bcpus, lcpus = pin.split(":")
            loadgen_cpus = tuple(int(c) for c in lcpus.split(","))
            [int(c) for c in bcpus.split(",")]
        except ValueError:
            ap.error(f"--pin wants BROKER:LOADGEN CPU lists such as 0:1, got {pin!r}")
        Broker.cpus = bcpus
        params.loadgen_cpus = loadgen_cpus
        os.sched_setaffinity(0, loadgen_cpus)  # the harness polls: keep it off the broker
        pinning = f"broker on CPU {bcpus}, load generator and harness on CPU {lcpus}"

    for key, value in args.gatewayd_set:
        Gatewayd.settings["GATEWAY_" + key.upper().replace(".", "__")] = value
    for line in args.mosquitto_set:
        if not line.strip() or "\n" in line:
            ap.error(f"--mosquitto-set wants one mosquitto.conf line, got {line!r}")
        Mosquitto.extra_lines.append(line.strip())
    if Mosquitto.extra_lines:
        pinning += "; mosquitto.conf adds " + ", ".join(repr(x) for x in Mosquitto.extra_lines)
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
    for run in range(runs):
        order = brokers[run % len(brokers):] + brokers[: run % len(brokers)]
        for scenario in scenarios:
            for name in order:
                result = _one(scenario, name, params, args, logs, noisy, backgrounds, run)
                results.append(result)

    by = aggregate(results)
    info = machine()
    info["pinning"] = pinning
    head = machine_line(info)
    for title, text in (
        (f"median of {runs} run(s), ± half the range", table(by, brokers)),
        ("latency (medians of the runs)", latency_table(by, brokers)),
        ("broker CPU (user+system) per delivered message or connect", cpu_table(by, brokers)),
        ("kernel listen queue (TcpExt, summed over the runs)", listen_table(by, brokers)),
    ):
        if text:
            print(f"\n{title}; {head}\n")
            print(text)
    print()
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
            "runs": runs,
            "machine": info,
            "params": asdict(params),
            "results": [asdict(r) for r in results],
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
