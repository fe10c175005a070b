"""In-process cost of the rule engine per message: ``on_publish`` + ``drain`` with 0, 1
and 10 rules (identical, and distinct SQL), no broker, no sockets.

    .venv/bin/python -m bench.rules_micro

5,000 messages of 16-256 random bytes on 16 topics; CPU time (``time.process_time``, so
other processes' load counts less than in wall time), best of 30 rounds, in µs per
message. The rule is bench.rules_bench's (``--distinct``: its distinct variant).
"""

from __future__ import annotations

import os
import time

from bench.rules_bench import sql
from gateway.rules.engine import RuleEngine
from protocols.context import Message

SIZES = (16, 32, 64, 128, 256, 48, 96, 192)


def engine(n: int, distinct: bool) -> RuleEngine:
    e = RuleEngine(node_name="bench", publish=lambda c, m: 0)
    for i in range(n):
        e.put(e.build(f"r{i}", {"sql": sql(i, distinct)}, "config"))
    return e


def per_message(n: int, distinct: bool, rounds: int = 30, count: int = 5000) -> float:
    payloads = [os.urandom(k) for k in SIZES]
    msgs = [Message(f"run/fanin/{i % 16}", payloads[i % 8], 0, publisher=f"c{i % 16}",
                    timestamp=1.0) for i in range(count)]
    e = engine(n, distinct)
    best = float("inf")
    for _ in range(rounds):
        t = time.process_time()
        for m in msgs:
            e.on_publish(m)
        e.drain()
        best = min(best, (time.process_time() - t) / count)
    return best * 1e6


def main() -> None:
    for n in (0, 1, 10):
        print(f"{n:2} rules: {per_message(n, False):.2f} µs/msg identical, "
              f"{per_message(n, True):.2f} µs/msg distinct", flush=True)


if __name__ == "__main__":
    main()
