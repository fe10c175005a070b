"""Fan-in throughput of gatewayd with 0, 1 and 10 rules matching every message.

    .venv/bin/python -m bench.rules_bench                  # fanin-qos0 and fanin-qos1, quick
    .venv/bin/python -m bench.rules_bench --full --nice -20 --json out.json
    .venv/bin/python -m bench.rules_bench --pin --repeat 5 --nice -20   # medians and ratios
    .venv/bin/python -m bench.rules_bench --distinct ...   # 10 different rules

``--distinct`` gives each rule its own SQL (``... AS n<i> ... WHERE qos < <3+i>``, every
message still matches every rule), so no two rules share an evaluation. ``--pin`` runs each
broker on core 0 (``taskset -c 0``) and the harness with its load-generator workers on
core 1. ``--repeat N`` runs the whole set N times (the brokers interleaved within each
round, so contention hits them alike) and prints, per scenario, the median figure of each
broker and the median of the per-round ratios with rules / without; then each broker's
median CPU time per message (its CPU seconds over the run / messages; less sensitive to
other processes' load than msg/s, which on a shared machine drops with the broker's share
of a core) and the ratio of those medians (rule-less / with rules: the throughput ratio
a broker with a core of its own would show).

Each rule is ``SELECT clientid, topic, qos, payload.n AS n FROM "#" WHERE qos < 3``
(every message matches it, the payload is decoded, and it has no action, so the figure is
the rule engine's own cost: topic lookup, queueing off the publish path, columns, SQL).
``--action republish`` gives each rule a republish to a topic nobody subscribes to. The
brokers are bench.brokers.Gatewayd with a ``[rule_engine]`` section added; everything
else (load generator, scenarios, tables, ``--nice``) is bench.run's.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import run
from bench.brokers import BROKERS, Gatewayd

SQL = 'SELECT clientid, topic, qos, payload.n AS n FROM "#" WHERE qos < 3'


def sql(i: int, distinct: bool) -> str:
    if not distinct:
        return SQL
    return f'SELECT clientid, topic, qos, payload.n AS n{i} FROM "#" WHERE qos < {3 + i}'


def rules_section(n: int, action: str, distinct: bool = False) -> str:
    out = []
    for i in range(n):
        out.append(f"[rule_engine.rules.bench{i}]\nsql = '{sql(i, distinct)}'\n")
        if action == "republish":
            out.append(f'[[rule_engine.rules.bench{i}.actions]]\nfunction = "republish"\n'
                       f'args = {{ topic = "bench/out/{i}", payload = "${{n}}" }}\n')
    return "".join(out)


def _stop_and_report(self: Gatewayd) -> None:
    """Stop, then show the engine's own count: every message ran through the rules (the
    figure is only honest if nothing was dropped and little was left at shutdown)."""
    Gatewayd.stop(self)
    for line in self.log_since_start().splitlines():
        if "rule engine stopped" in line:
            print(f"    [{self.name}] {line.split('gateway.rules ', 1)[-1]}", flush=True)


def with_rules(n: int, action: str, distinct: bool = False) -> type[Gatewayd]:
    return type(f"GatewaydRules{n}", (Gatewayd,), {
        "name": f"gatewayd-rules{n}",
        "OPTIONAL_CONFIG": (*Gatewayd.OPTIONAL_CONFIG, rules_section(n, action, distinct)),
        "stop": _stop_and_report,
    })


def _pin() -> None:
    """Brokers on core 0, this harness and its (forked) load generator on core 1."""
    command = Gatewayd.command

    def pinned(self: Gatewayd) -> list[str]:
        return ["taskset", "-c", "0", *command(self)]

    Gatewayd.command = pinned  # type: ignore[method-assign]
    os.sched_setaffinity(0, {1})


def _flag(argv: list[str], name: str) -> bool:
    if name in argv:
        argv.remove(name)
        return True
    return False


def _option(argv: list[str], name: str, default: str) -> str:
    if name in argv:
        i = argv.index(name)
        value = argv[i + 1]
        del argv[i : i + 2]
        return value
    return default


def summary(rounds: list[dict[str, Any]], brokers: list[str]) -> str:
    """Per scenario: each broker's median figure, and the median of the per-round ratios
    of each rules broker to the rule-less one."""
    figures: dict[tuple[str, str], list[float]] = {}
    ratios: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}  # broker CPU µs per message
    for doc in rounds:
        by = {(r["scenario"], r["broker"]): r["value"] for r in doc["results"]}
        for r in doc["results"]:
            pct = (r.get("details") or {}).get("broker_cpu_pct")
            if r["value"] and pct:
                cpu.setdefault((r["scenario"], r["broker"]), []).append(
                    pct / 100 / r["value"] * 1e6)
        for (scenario, broker), value in by.items():
            if value is None:
                continue
            figures.setdefault((scenario, broker), []).append(value)
            base = by.get((scenario, brokers[0]))
            if broker != brokers[0] and base:
                ratios.setdefault((scenario, broker), []).append(value / base)
    scenarios = sorted({s for s, _ in figures})
    head = ["scenario", *(f"{b} (median)" for b in brokers),
            *(f"{b} / {brokers[0]}" for b in brokers[1:]),
            *(f"CPU µs/msg {b}" for b in brokers),
            *(f"CPU ratio {b}" for b in brokers[1:])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in scenarios:
        row = [s]
        for b in brokers:
            v = figures.get((s, b), [])
            row.append(f"{statistics.median(v):,.0f} (n={len(v)})" if v else "-")
        for b in brokers[1:]:
            v = ratios.get((s, b), [])
            row.append(
                f"{statistics.median(v):.2f}x ({min(v):.2f}-{max(v):.2f})" if v else "-"
            )
        med = {b: statistics.median(cpu[(s, b)]) for b in brokers if cpu.get((s, b))}
        row += [f"{med[b]:.2f}" if b in med else "-" for b in brokers]
        row += [f"{med[brokers[0]] / med[b]:.2f}x" if b in med and brokers[0] in med else "-"
                for b in brokers[1:]]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    action = _option(argv, "--action", "none")
    repeat = int(_option(argv, "--repeat", "1"))
    out_json = _option(argv, "--json", "")
    full = _flag(argv, "--full")
    distinct = _flag(argv, "--distinct")
    if _flag(argv, "--pin"):
        _pin()
    for n in (1, 10):
        cls = with_rules(n, action, distinct)
        probe = cls()
        try:  # bench.brokers leaves out a section gatewayd refuses: here that is an error
            if not probe._accepts(cls.OPTIONAL_CONFIG[-1]):
                raise SystemExit(f"gatewayd refuses the rules of {cls.name}")
        finally:
            probe.cleanup()
        BROKERS[cls.name] = cls
    brokers = ["gatewayd", "gatewayd-rules1", "gatewayd-rules10"]
    args = ["--brokers", ",".join(brokers),
            "--scenarios", "fanin-qos0,fanin-qos1", *([] if full else ["--quick"]), *argv]
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(repeat):
            if repeat > 1:
                print(f"== round {k + 1} of {repeat}", flush=True)
            path = Path(tmp) / f"round{k}.json"
            rc = run.main([*args, "--json", str(path)])
            if rc:
                return rc
            rounds.append(json.loads(path.read_text()))
    if repeat > 1:
        print()
        print(summary(rounds, brokers))
    if out_json:
        Path(out_json).write_text(json.dumps({"rounds": rounds, "distinct": distinct,
                                              "action": action}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
