"""Plans (one generated function per tuple of rules) against the reference: each rule's
compiled closures (``Program.run``) over the event's columns. Same outputs in the same
order, same failures, same metrics, same action calls, for random statements (inlinable
and not) and random payloads; rules with the same SQL share one evaluation."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.rules.ast import BinOp, Field, Key, Lit, Path, Star, Statement, Var, render
from gateway.rules.columns import Columns
from gateway.rules.compiler import compile_sql
from gateway.rules.engine import ActionSlot, Rule
from gateway.rules.events import GETTERS, Event
from gateway.rules.plan import inlinable, make_plan
from protocols.context import Message
from tests.gateway.rules.test_eval_fuzz import exprs, json_values

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")

aliases = st.none() | st.sampled_from([("a",), ("b",), ("x",), ("qos",), ("a", "b")])
paths = st.builds(Path, st.just(Var("payload")),
                  st.lists(st.sampled_from(["a", "b", "x"]).map(Key), min_size=1,
                           max_size=2).map(tuple))
field_exprs = st.one_of(exprs, paths)
numbers = st.integers(-5, 5) | st.floats(-5, 5, allow_nan=False)
# the comparisons the plan writes natively: something < a number
wheres = st.one_of(
    st.none(), exprs,
    st.builds(BinOp, st.sampled_from(["<", "<=", ">", ">="]), field_exprs, numbers.map(Lit)),
)
fields = st.lists(st.one_of(st.builds(Field, field_exprs, aliases), st.just(Star())),
                  min_size=1, max_size=3).map(tuple)


def _recorder(log: list[Any], rid: str) -> ActionSlot:
    def run(output: dict[str, Any], columns: Any) -> None:
        log.append((rid, repr(output)))
        if output.get("x") == 1:
            raise ValueError("the action refuses x = 1")

    return ActionSlot("record", {}, run)


def _rule(rid: str, sql: str, log: list[Any]) -> Rule:
    return Rule(rid, sql, compile_sql(sql), [_recorder(log, rid)])


def _reference(rules: list[Rule], message: Message, log: list[Any]) -> None:
    """What the engine did before plans: each rule's closures over shared columns."""
    cols = Columns(GETTERS["message.publish"],
                   Event("message.publish", message, None, None, "n", lambda c: None, 5.0))
    cols.update(topic=message.topic, qos=message.qos, clientid=message.publisher)
    for rule in rules:
        m = rule.metrics
        try:
            outputs = rule.program.run(cols)
        except Exception as exc:
            m.failed += 1
            m.last_error = f"{type(exc).__name__}: {exc}"
            continue
        if not outputs:
            m.no_result += 1
            continue
        m.passed += 1
        for out in outputs:
            for slot in rule.actions:
                try:
                    slot.run(out, cols)
                except Exception as exc:
                    slot.failed += 1
                    m.actions_failed += 1
                    m.last_error = f"{slot.function}: {type(exc).__name__}: {exc}"
                else:
                    slot.success += 1
                    m.actions_success += 1


def _state(rules: list[Rule]) -> list[Any]:
    return [(r.metrics, [(a.success, a.failed) for a in r.actions]) for r in rules]


seen = {"inlined": 0, "closures": 0, "passed": 0, "failed": 0, "no_result": 0,
        "alone": 0, "shared": 0}


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(fields, wheres), min_size=1, max_size=3), st.data(), json_values,
       st.integers(0, 2), json_values)
def test_a_plan_does_what_the_closures_do(specs: list[Any], data: st.DataObject,
                                          payload: Any, qos: int, payload2: Any) -> None:
    sqls = [render(Statement("select", f, ("#",), w)) for f, w in specs]
    # some rules share their SQL (one evaluation, each rule its own metrics and actions)
    order = data.draw(st.lists(st.sampled_from(range(len(sqls))), min_size=1, max_size=4))
    message = Message("t/1", json.dumps(payload).encode(), qos, publisher="c1",
                      timestamp=5.0)
    got: list[Any] = []
    want: list[Any] = []
    mine = [_rule(f"r{i}", sqls[k], got) for i, k in enumerate(order)]
    ref = [_rule(f"r{i}", sqls[k], want) for i, k in enumerate(order)]
    plan = make_plan(tuple(mine), "message.publish", "n", lambda c: None, lambda: 5.0)
    plan.run(message)
    _reference(ref, message, want)
    assert got == want, plan.source
    assert _state(mine) == _state(ref), plan.source
    # a batch (Plan.many): the same as each message in turn, counts added at the end
    second = Message("t/2", json.dumps(payload2).encode(), 1, publisher="c2", timestamp=5.0)
    got_many: list[Any] = []
    want_many: list[Any] = []
    batched = [_rule(f"r{i}", sqls[k], got_many) for i, k in enumerate(order)]
    ref_many = [_rule(f"r{i}", sqls[k], want_many) for i, k in enumerate(order)]
    plan = make_plan(tuple(batched), "message.publish", "n", lambda c: None, lambda: 5.0)
    plan.many([message, second])
    _reference(ref_many, message, want_many)
    _reference(ref_many, second, want_many)
    assert got_many == want_many, plan.source
    assert _state(batched) == _state(ref_many), plan.source
    for r in mine:
        seen["inlined" if inlinable(r.program.statement) else "closures"] += 1
        seen["passed"] += r.metrics.passed
        seen["failed"] += r.metrics.failed
        seen["no_result"] += r.metrics.no_result
        # a rule alone with its SQL and one sharing it are written differently
        seen["alone" if order.count(order[mine.index(r)]) == 1 else "shared"] += 1


def test_the_property_saw_every_path() -> None:
    """Runs after the property (file order): both kinds of statement, passes, failures
    and no results, rules alone with their SQL and rules sharing it (each through ``run``
    and through ``many``)."""
    assert all(seen.values()), seen


def test_native_comparison_keeps_the_sql_semantics() -> None:
    """``payload.t > 30``: a number compares natively, a numeric string as a number, null
    and non-numbers never pass, booleans are not numbers."""
    out: list[Any] = []
    rule = _rule("r", 'SELECT payload.t AS t FROM "#" WHERE payload.t > 30', out)
    assert inlinable(rule.program.statement)
    plan = make_plan((rule,), "message.publish", "n", lambda c: None, lambda: 5.0)
    for t in (31, 30, 30.5, "31", "x", None, True, [40]):
        plan.run(Message("t", json.dumps({"t": t}).encode(), 0, publisher="c"))
    assert [json.loads(o[1].replace("'", '"'))["t"] for o in out] == [31, 30.5, "31"]
    assert rule.metrics.no_result == 5 and rule.metrics.failed == 0


def test_the_statement_of_rules_with_one_sql_runs_once() -> None:
    calls = []
    from gateway.rules import functions

    original = functions.FUNCTIONS["lower"]
    spy = type(original)(lambda v: calls.append(v) or original.fn(v), original.min_args,
                         original.max_args)
    functions.FUNCTIONS["lower"] = spy
    try:
        out: list[Any] = []
        rules = tuple(_rule(f"r{i}", 'SELECT lower(topic) AS t FROM "#"', out)
                      for i in range(3))
        plan = make_plan(rules, "message.publish", "n", lambda c: None, lambda: 5.0)
    finally:
        functions.FUNCTIONS["lower"] = original
    plan.run(Message("A/B", b"", 0, publisher="c"))
    assert calls == ["A/B"]
    assert [o[0] for o in out] == ["r0", "r1", "r2"]
    assert all(r.metrics.passed == 1 for r in rules)
