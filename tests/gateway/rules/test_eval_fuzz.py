"""A fuzz target for the evaluator: random statements over random events either give
outputs that JSON can encode or fail with a value error (what the engine counts as a
failed message), never anything else (a KeyError or AttributeError would be our bug)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.rules.ast import Call, Field, Star, Statement, Var, render
from gateway.rules.compiler import Columns, compile_sql
from gateway.rules.functions import FUNCTIONS, to_json
from tests.gateway.rules.test_parser import _exprs, literals

# hypothesis warns that the failing example's repr would be large; that is expected here
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")

FUNCS = sorted(n for n, f in FUNCTIONS.items() if f.min_args <= 2 and n not in (
    "random", "uuid_v4", "uuid_v4_no_hyphen", "now_timestamp", "now_rfc3339"))
names = st.sampled_from(["payload", "topic", "qos", "clientid", "x", "item"])


def _calls(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        _exprs(children).filter(lambda e: not isinstance(e, Call)),
        st.sampled_from(FUNCS).flatmap(lambda n: st.lists(
            children, min_size=FUNCTIONS[n].min_args,
            max_size=FUNCTIONS[n].min_args if FUNCTIONS[n].max_args >= 0 else 3,
        ).map(lambda args, n=n: Call(n, tuple(args)))),
    )


exprs = st.recursive(st.one_of(literals, names.map(Var)), _calls, max_leaves=8)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.floats(allow_nan=False,
              allow_infinity=False), st.text(max_size=5)),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "x"]), c,
                                                         max_size=3),
    max_leaves=6,
)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(exprs, min_size=1, max_size=3), st.none() | exprs, json_values,
       st.sampled_from(["t/1", "a/b"]))
def test_evaluation_fails_only_with_value_errors(fields: list[Any], where: Any,
                                                 payload: Any, topic: str) -> None:
    st_ = Statement("select", (*(Field(f) for f in fields), Star()), ("#",), where)
    program = compile_sql(render(st_))
    getters = {"payload": lambda _s: json.dumps(payload), "topic": lambda _s: topic,
               "qos": lambda _s: 1, "clientid": lambda _s: "c"}
    try:
        outputs = program.run(Columns(getters, None))
    except (ValueError, TypeError, ArithmeticError, OverflowError):
        return
    for out in outputs:
        to_json(out)  # every output can be published or sent
    outcomes.add(len(outputs))


outcomes: set[int] = set()


def test_the_fuzz_saw_outputs() -> None:
    """Runs after the property (file order): it must have produced real outputs too."""
    assert outcomes & {1}
