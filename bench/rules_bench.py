"""Fan-in throughput of gatewayd with 0, 1 and 10 rules matching every message.

    .venv/bin/python -m bench.rules_bench                  # fanin-qos0 and fanin-qos1, quick
    .venv/bin/python -m bench.rules_bench --full --nice -20 --json out.json

Each rule is ``SELECT clientid, topic, qos, payload.n AS n FROM "#" WHERE qos < 3``
(every message matches it, the payload is decoded, and it has no action, so the figure is
the rule engine's own cost: topic lookup, queueing off the publish path, columns, SQL).
``--action republish`` gives each rule a republish to a topic nobody subscribes to. The
brokers are bench.brokers.Gatewayd with a ``[rule_engine]`` section added; everything
else (load generator, scenarios, tables, ``--nice``) is bench.run's.
"""

from __future__ import annotations

import sys

from bench import run
from bench.brokers import BROKERS, Gatewayd

SQL = 'SELECT clientid, topic, qos, payload.n AS n FROM "#" WHERE qos < 3'


def rules_section(n: int, action: str) -> str:
    out = []
    for i in range(n):
        out.append(f"[rule_engine.rules.bench{i}]\nsql = '{SQL}'\n")
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


def with_rules(n: int, action: str) -> type[Gatewayd]:
    return type(f"GatewaydRules{n}", (Gatewayd,), {
        "name": f"gatewayd-rules{n}",
        "OPTIONAL_CONFIG": (*Gatewayd.OPTIONAL_CONFIG, rules_section(n, action)),
        "stop": _stop_and_report,
    })


def main(argv: list[str]) -> int:
    action = "none"
    if "--action" in argv:
        i = argv.index("--action")
        action = argv[i + 1]
        del argv[i : i + 2]
    full = "--full" in argv
    if full:
        argv.remove("--full")
    for n in (1, 10):
        cls = with_rules(n, action)
        probe = cls()
        try:  # bench.brokers leaves out a section gatewayd refuses: here that is an error
            if not probe._accepts(cls.OPTIONAL_CONFIG[-1]):
                raise SystemExit(f"gatewayd refuses the rules of {cls.name}")
        finally:
            probe.cleanup()
        BROKERS[cls.name] = cls
    args = ["--brokers", "gatewayd,gatewayd-rules1,gatewayd-rules10",
            "--scenarios", "fanin-qos0,fanin-qos1", *([] if full else ["--quick"]), *argv]
    return run.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
