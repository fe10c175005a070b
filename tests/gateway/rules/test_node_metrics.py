"""Node totals of rule metrics (gateway.rules.node_metrics): two workers' SharedMetrics on
one real SQLite file, each with its own connection and its own copy of the rule."""

from __future__ import annotations

from pathlib import Path

from gateway.rules.engine import RuleEngine
from gateway.rules.node_metrics import SharedMetrics
from gateway.rules.rule import Rule
from gateway.store.db import open_db
from protocols.context import Message


def worker(path: Path, i: int, boot: str = "run1") -> tuple[SharedMetrics, RuleEngine]:
    e = RuleEngine(node_name="n", publish=lambda c, m: 0)
    e.put(e.build("r", {"sql": 'SELECT * FROM "t/#" WHERE payload = \'yes\'',
                        "actions": ["console"]}))
    return SharedMetrics(open_db(path), i, boot), e


def feed(e: RuleEngine, *payloads: bytes) -> None:
    for p in payloads:
        e.on_publish(Message("t/1", p, 0, publisher="c"))
    e.drain()


def counts(s: SharedMetrics, rules: dict[str, Rule]) -> tuple[int, ...]:
    t = s.totals(rules)["r"]
    return (t.metrics.matched, t.metrics.passed, t.metrics.no_result, *t.actions[0])


def test_totals_sum_the_workers_and_reset_reaches_all(tmp_path: Path) -> None:
    path = tmp_path / "rule_metrics.db"
    (s0, e0), (s1, e1) = worker(path, 0), worker(path, 1)
    feed(e0, b"yes", b"yes", b"no")
    feed(e1, b"yes")
    s1.flush(e1.rules)
    assert counts(s0, e0.rules) == (4, 3, 1, 3, 0)  # its own flushed now, the other's row
    assert counts(s1, e1.rules) == (4, 3, 1, 3, 0)
    s1.reset(e1.rules["r"])
    # worker 0 has not flushed since: its next flush sees the reset and zeroes first
    assert counts(s1, e1.rules) == (0, 0, 0, 0, 0)
    assert counts(s0, e0.rules) == (0, 0, 0, 0, 0)
    feed(e0, b"yes")
    assert counts(s1, e1.rules) == (0, 0, 0, 0, 0)  # not flushed yet (the poll does it)
    s0.flush(e0.rules)
    assert counts(s1, e1.rules) == (1, 1, 0, 1, 0)


def test_an_earlier_run_and_a_deleted_rule_count_nothing(tmp_path: Path) -> None:
    path = tmp_path / "rule_metrics.db"
    old, e_old = worker(path, 3, boot="run0")  # a worker index the new run does not have
    feed(e_old, b"yes")
    old.flush(e_old.rules)
    s0, e0 = worker(path, 0, boot="run1")
    assert counts(s0, e0.rules) == (0, 0, 0, 0, 0)
    assert old.conn.execute("SELECT count(*) FROM rule_metrics WHERE boot = 'run0'"
                            ).fetchone()[0] == 0
    s1, e1 = worker(path, 1, boot="run1")
    feed(e1, b"yes")
    s1.flush(e1.rules)
    s0.forget("r")
    e0.delete("r")
    assert s0.totals(e0.rules) == {}
    assert s0.conn.execute("SELECT count(*) FROM rule_metrics").fetchone()[0] == 0


def test_an_idle_worker_does_not_write(tmp_path: Path) -> None:
    s0, e0 = worker(tmp_path / "rule_metrics.db", 0)
    s0.flush(e0.rules)
    before = s0.conn.total_changes
    s0.flush(e0.rules)
    assert s0.conn.total_changes == before
    feed(e0, b"no")
    s0.flush(e0.rules)
    assert s0.conn.total_changes == before + 1
