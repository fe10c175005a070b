"""Profile gatewayd with py-spy while a benchmark scenario runs against it.

    .venv/bin/python -m bench.profile                        # fanout-qos1 and p2p-qos1
    .venv/bin/python -m bench.profile --scenarios fanin-qos0 --duration 10 --top 25
    .venv/bin/python -m bench.profile --scenarios p2p-qos1-persistent --memory  # durability off

For each scenario: start gatewayd, attach ``py-spy record --pid`` (sampling without
pausing the broker, ``--function`` so samples aggregate per function), run the scenario
for ``--duration`` seconds, stop py-spy and print the functions with the most *own* samples
(the leaf frame of a stack: where the interpreter actually was) next to their inclusive
share. The raw collapsed stacks stay in ``--out`` (default ``bench/profiles/``), one file
per scenario, for flame graphs (``flamegraph.pl`` or speedscope read them).

py-spy is installed into the project's virtualenv when missing (it needs ptrace: root, or
``kernel.yama.ptrace_scope=0``).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.brokers import (
    REPO,
    Broker,
    Gatewayd,
    GatewaydCompiled,
    GatewaydCompiledMemory,
    GatewaydMemory,
    use_gatewayd_commit,
)
from bench.run import _markdown, renice
from bench.scenarios import Params, needs_tls, run_scenario


def ensure_py_spy() -> str:
    exe = Path(sys.executable).with_name("py-spy")
    if exe.exists():
        return str(exe)
    found = shutil.which("py-spy")
    if found:
        return found
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "py-spy"], check=True)
    return str(exe)


def top_functions(raw: str, top: int) -> tuple[int, list[tuple[str, int, int]], int]:
    """(total samples, [(function, own samples, inclusive samples)], samples of other
    threads than the event loop's) from collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = threads = 0
    for line in raw.splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        frames = stack.split(";")
        if frames and frames[0].startswith(("process ", "thread ")):
            frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        if any(f.startswith("Thread._bootstrap ") for f in frames):
            threads += count  # the store's writer thread, the space guard's tasks
        own[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
    rows = [(f, n, incl[f]) for f, n in own.most_common(top)]
    return total, rows, threads


def profile(
    scenario: str,
    params: Params,
    out: Path,
    top: int,
    rate: int,
    native: bool = False,
    lines: bool = False,
    memory: bool = False,
    gil: bool = False,
    compiled: bool = False,
) -> str:
    py_spy = ensure_py_spy()
    kinds: dict[tuple[bool, bool], type[Gatewayd]] = {
        (False, False): Gatewayd, (True, False): GatewaydMemory,
        (False, True): GatewaydCompiled, (True, True): GatewaydCompiledMemory,
    }
    broker = kinds[memory, compiled](tls=needs_tls(scenario))
    kind = (".memory" if memory else "") + (".compiled" if compiled else "") + (
        ".native" if native else "") + (
        ".lines" if lines else "") + (".gil" if gil else "")
    raw_path = out / f"{scenario}{kind}.collapsed.txt"
    try:
        broker.start()
        spy = subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(broker.pid),
                "--rate",
                str(rate),
                "--format",
                "raw",
                *([] if lines else ["--function"]),
                *(["--gil"] if gil else []),
                # native unwinding needs the target paused; Python-only sampling does not
                *(["--native"] if native else ["--nonblocking"]),
                "--output",
                str(raw_path),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(1.0)  # py-spy attaches
        t0 = time.monotonic()
        result = run_scenario(scenario, broker, params)
        elapsed = time.monotonic() - t0
        spy.send_signal(signal.SIGINT)
        try:
            _, err = spy.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            _, err = spy.communicate()
    finally:
        broker.cleanup()
    if not raw_path.exists():
        return f"## {scenario}: py-spy wrote nothing\n{err.decode(errors='replace')}"
    total, rows, threads = top_functions(raw_path.read_text(), top)
    table = [["#", "function (file:first line)", "own %", "inclusive %"]]
    for i, (func, n, inc) in enumerate(rows, 1):
        table.append([str(i), func, f"{100 * n / total:.1f}", f"{100 * inc / total:.1f}"])
    busy = 100 * total / max(1.0, elapsed * rate)
    shown = raw_path.relative_to(REPO) if raw_path.is_relative_to(REPO) else raw_path
    return (
        f"## {scenario}: {result.value} {result.unit}, lost {result.lost}"
        f"{' ERROR ' + str(result.error) if result.error else ''}\n"
        f"{total} samples at {rate} Hz over {elapsed:.1f}s (broker on-CPU about {busy:.0f}% "
        f"of the time; {100 * threads / max(1, total):.0f}% of the samples in threads other "
        f"than the event loop's, I/O waits included); stacks in {shown}\n\n"
        + _markdown(table)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--scenarios", default="fanout-qos1,p2p-qos1")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--rate", type=int, default=250, help="samples per second")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "profiles")
    ap.add_argument("--gatewayd-commit", metavar="REV", help="profile this commit (see run.py)")
    ap.add_argument(
        "--native",
        action="store_true",
        help="include C frames (uvloop, CPython): shows what a Python line's own time is spent on",
    )
    ap.add_argument(
        "--lines", action="store_true", help="samples per source line, not per function"
    )
    ap.add_argument(
        "--memory", action="store_true",
        help="profile gatewayd-memory ([durability] enable = false): set beside a durable "
        "profile of the same scenario, what durability costs per function",
    )
    ap.add_argument(
        "--gil", action="store_true",
        help="only samples of the thread holding the GIL: CPU, not a thread waiting for "
        "the GIL or in I/O (with the writer thread busy, a plain profile charges the loop "
        "thread's GIL waits to whatever function it was in)",
    )
    ap.add_argument(
        "--compiled", action="store_true",
        help="profile the compiled build (gatewayd-compiled); its compiled functions show "
        "only with --native, as C functions (CPyDef_<module>___<Class>___<method>)",
    )
    ap.add_argument("--nice", type=int, default=0, help="as in bench.run (e.g. -20)")
    ap.add_argument(
        "--no-pin",
        action="store_true",
        help="do not pin (default on 2+ cores: gatewayd on CPU 0; the load generator, "
        "py-spy and this harness on CPU 1, as bench.run does)",
    )
    args = ap.parse_args(argv)
    if args.nice:
        renice(args.nice)
    if args.gatewayd_commit:
        use_gatewayd_commit(args.gatewayd_commit)
    print(f"gatewayd {(GatewaydCompiled if args.compiled else Gatewayd).version()}\n")
    params = Params(duration=args.duration, latency_duration=args.duration)
    if not args.no_pin and (os.cpu_count() or 1) >= 2:
        Broker.cpus = "0"
        params.loadgen_cpus = (1,)
        os.sched_setaffinity(0, (1,))  # py-spy, started from here, inherits it
    args.out.mkdir(parents=True, exist_ok=True)
    for scenario in args.scenarios.split(","):
        print(
            profile(
                scenario.strip(),
                params,
                args.out,
                args.top,
                args.rate,
                args.native,
                args.lines,
                args.memory,
                args.gil,
                args.compiled,
            ),
            flush=True,
        )
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
