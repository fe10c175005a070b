"""Rule metrics as node totals on a multi-worker node (``node.workers > 1``).

Each worker counts its own events in memory (:class:`~gateway.rules.rule.RuleMetrics`,
nothing shared on the hot path). :meth:`SharedMetrics.flush` writes a worker's counts
(per rule: passed, failed, no_result, actions success/failed, and per action its
success/failed) as one row per (worker, rule) into table ``rule_metrics`` of the node's
shared ``rules.db``; the service calls it every :data:`gateway.rules.service.POLL`
seconds (only when a count changed: an idle node does not write) and before every read.
:meth:`SharedMetrics.totals` sums the rows of every worker: what the API, ``gatewayctl
rules show`` and ``/metrics`` show, whichever worker answers (the other workers' counts
are at most one poll old).

A reset (``PUT /api/v5/rules/{id}/metrics/reset`` on any worker) bumps the rule's
generation in ``rule_metrics_reset`` and deletes every worker's row of the rule; a worker
that finds a newer generation at its next flush zeroes its own counts first, in the same
transaction, so no count from before the reset comes back.

Invariants:

- A worker writes only its own rows (its index). Every row names the run of the node it
  belongs to (``boot``: the supervisor's pid and start time, which the workers of one run
  share); a worker sums only its own run's rows and at start deletes its own rows and
  every earlier run's (a node restarted with fewer workers keeps no stale counts).
- ``totals`` only sums rows of rules this worker knows (a deleted rule's rows are
  ignored, and removed when it is deleted).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gateway.rules.rule import Rule, RuleMetrics

__all__ = ["SCHEMA", "SharedMetrics", "Totals", "local_totals", "zero_counts"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS rule_metrics(
    worker INTEGER NOT NULL,
    rule TEXT NOT NULL,
    boot TEXT NOT NULL,
    counts TEXT NOT NULL,
    PRIMARY KEY (worker, rule)
);
CREATE TABLE IF NOT EXISTS rule_metrics_reset(
    rule TEXT PRIMARY KEY,
    gen INTEGER NOT NULL
);
"""


@dataclass(slots=True)
class Totals:
    """A rule's counts over the node: the rule's metrics and, per action, (success,
    failed)."""

    metrics: RuleMetrics
    actions: list[tuple[int, int]] = field(default_factory=list)


def _snapshot(rule: Rule) -> list[object]:
    m = rule.metrics
    return [m.passed, m.failed, m.no_result, m.actions_success, m.actions_failed,
            [[a.success, a.failed] for a in rule.actions]]


def boot_id() -> str:
    """This run of the node: the parent's (the workers' supervisor's) pid and start time
    (``/proc``; the pid alone where there is none)."""
    ppid = os.getppid()
    try:
        start = Path(f"/proc/{ppid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = "?"
    return f"{ppid}:{start}"


def local_totals(rule: Rule) -> Totals:
    """This process's counts of ``rule`` (a single-process node's totals)."""
    return Totals(rule.metrics, [(a.success, a.failed) for a in rule.actions])


class SharedMetrics:
    """One worker's side of the node's ``rule_metrics`` table (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection, worker: int, boot: str | None = None
                 ) -> None:
        conn.executescript(SCHEMA)
        # counts a crash may lose (they restart from zero anyway): no fsync per commit
        conn.execute("PRAGMA synchronous=NORMAL")
        self.conn = conn
        self.worker = worker
        self.boot = boot_id() if boot is None else boot
        with self._tx():
            conn.execute("DELETE FROM rule_metrics WHERE worker = ? OR boot != ?",
                         (worker, self.boot))
        self._gens = self._read_gens()  # resets before this start are not ours to apply
        self._written: dict[str, str] = {}  # rule -> the counts last written

    @contextmanager
    def _tx(self) -> Iterator[None]:
        """One write transaction (the connection is in autocommit mode: ``open_db``)."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _read_gens(self) -> dict[str, int]:
        return dict(self.conn.execute("SELECT rule, gen FROM rule_metrics_reset").fetchall())

    def flush(self, rules: dict[str, Rule]) -> None:
        """Write this worker's changed counts (after applying resets made elsewhere)."""
        conn = self.conn
        with self._tx():  # (the generations read and the counts written: one transaction)
            gens = self._read_gens()
            for rid, gen in gens.items():
                if gen != self._gens.get(rid):
                    rule = rules.get(rid)
                    if rule is not None:
                        zero_counts(rule)
                    self._written.pop(rid, None)
            self._gens = gens
            for rid, rule in rules.items():
                text = json.dumps(_snapshot(rule), separators=(",", ":"))
                if self._written.get(rid) != text:
                    conn.execute(
                        "INSERT INTO rule_metrics(worker, rule, boot, counts) "
                        "VALUES (?, ?, ?, ?) ON CONFLICT(worker, rule) DO UPDATE SET "
                        "boot = excluded.boot, counts = excluded.counts",
                        (self.worker, rid, self.boot, text))
                    self._written[rid] = text
            for rid in [r for r in self._written if r not in rules]:
                conn.execute("DELETE FROM rule_metrics WHERE worker = ? AND rule = ?",
                             (self.worker, rid))
                del self._written[rid]

    def reset(self, rule: Rule) -> None:
        """Zero ``rule``'s counts on every worker of the node."""
        conn = self.conn
        with self._tx():
            conn.execute(
                "INSERT INTO rule_metrics_reset(rule, gen) VALUES (?, 1) "
                "ON CONFLICT(rule) DO UPDATE SET gen = gen + 1", (rule.id,))
            conn.execute("DELETE FROM rule_metrics WHERE rule = ?", (rule.id,))
            self._gens = self._read_gens()
        zero_counts(rule)
        self._written.pop(rule.id, None)

    def forget(self, rule_id: str) -> None:
        """A deleted rule: its rows go (every worker's)."""
        with self._tx():
            self.conn.execute("DELETE FROM rule_metrics WHERE rule = ?", (rule_id,))
        self._written.pop(rule_id, None)

    def totals(self, rules: dict[str, Rule]) -> dict[str, Totals]:
        """Every worker's counts summed, per rule of ``rules`` (flushes this worker's
        first, so they are current)."""
        self.flush(rules)
        out = {rid: Totals(RuleMetrics(), [(0, 0)] * len(r.actions))
               for rid, r in rules.items()}
        for rid, text in self.conn.execute(
                "SELECT rule, counts FROM rule_metrics WHERE boot = ?", (self.boot,)):
            t = out.get(rid)
            if t is None:
                continue
            passed, failed, no_result, a_ok, a_failed, per_action = json.loads(text)
            m = t.metrics
            m.passed += passed
            m.failed += failed
            m.no_result += no_result
            m.actions_success += a_ok
            m.actions_failed += a_failed
            t.actions = [(s + ps, f + pf) for (s, f), (ps, pf) in
                         zip(t.actions, [*per_action, *[(0, 0)] * len(t.actions)],
                             strict=False)]
        for rid, r in rules.items():
            out[rid].metrics.last_error = r.metrics.last_error
        return out


def zero_counts(rule: Rule) -> None:
    """A rule's counts (and its actions') back to zero."""
    rule.metrics = RuleMetrics()
    for a in rule.actions:
        a.success = a.failed = 0
