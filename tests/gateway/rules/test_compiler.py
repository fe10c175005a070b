"""Evaluation semantics of compiled statements over lazily computed columns."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.rules.compiler import Columns, RuleEvalError, compile_sql


def cols(**fields: Any) -> Columns:
    return Columns({k: (lambda _s, v=v: v) for k, v in fields.items()}, None)


def run(sql: str, **fields: Any) -> list[dict[str, Any]]:
    return compile_sql(sql).run(cols(**fields))


PAYLOAD = json.dumps({"t": 35, "list": [5, 6, 7], "a": {"b": {"c": "deep"}},
                      "sensors": [{"n": "a", "v": 1}, {"n": "b", "v": 3}, {"n": "c", "v": 5}]})


def test_select_where_true_and_false() -> None:
    sql = 'SELECT payload.t AS t, clientid FROM "s/#" WHERE payload.t > 30'
    assert run(sql, payload=PAYLOAD, clientid="c1") == [{"t": 35, "clientid": "c1"}]
    assert run(sql, payload='{"t": 3}', clientid="c1") == []


def test_nested_access_one_based_and_negative_and_missing() -> None:
    out = run('SELECT payload.list[1] AS first, payload.list[-1] AS last, payload.list[9] AS '
              'none, payload.a.b.c AS deep, payload.nope.x AS missing FROM "t"', payload=PAYLOAD)
    assert out == [{"first": 5, "last": 7, "none": None, "deep": "deep", "missing": None}]


def test_unaliased_paths_nest_and_expressions_use_their_text() -> None:
    out = run('SELECT payload.a.b.c, clientid, abs(payload.t - 40) FROM "t"', payload=PAYLOAD,
              clientid="x")
    assert out == [{"payload": {"a": {"b": {"c": "deep"}}}, "clientid": "x",
                    "abs(payload.t - 40)": 5}]


def test_alias_path_nests() -> None:
    assert run('SELECT 1 AS a.b, 2 AS a.c FROM "t"') == [{"a": {"b": 1, "c": 2}}]


def test_later_fields_and_where_see_aliases() -> None:
    sql = 'SELECT payload.t * 2 AS d, d + 1 AS e FROM "t" WHERE e > 70'
    assert run(sql, payload=PAYLOAD) == [{"d": 70, "e": 71}]
    assert run(sql.replace("70", "71"), payload=PAYLOAD) == []


def test_star_has_every_column() -> None:
    assert run('SELECT *, 1 AS one FROM "t"', topic="t", qos=1) == [
        {"topic": "t", "qos": 1, "one": 1}]


def test_case_when() -> None:
    sql = ('SELECT CASE WHEN payload.t > 30 THEN \'hot\' WHEN payload.t > 20 THEN \'warm\' '
           'ELSE \'cold\' END AS level FROM "t"')
    assert run(sql, payload='{"t": 35}') == [{"level": "hot"}]
    assert run(sql, payload='{"t": 25}') == [{"level": "warm"}]
    assert run(sql, payload='{"t": 5}') == [{"level": "cold"}]
    assert run('SELECT CASE qos WHEN 1 THEN "one" END AS q FROM "t"', qos=2) == [{"q": None}]


def test_arithmetic() -> None:
    out = run('SELECT 7 / 2 AS a, 7 div 2 AS b, -7 div 2 AS c, 7 mod 3 AS d, -7 mod 3 AS e, '
              '1 + 2 * 3 AS f, \'a\' + 1 AS g, x - 1 AS h FROM "t"', x="5")
    assert out == [{"a": 3.5, "b": 3, "c": -3, "d": 1, "e": -1, "f": 7, "g": "a1", "h": 4}]


@pytest.mark.parametrize("expr", ["1 / 0", "1 div 0", "1 mod 0", "'x' * 2", "-'x'",
                                  "nth(1, 'x')", "null + 1"])
def test_runtime_errors_raise(expr: str) -> None:
    with pytest.raises(RuleEvalError):
        run(f'SELECT {expr} AS v FROM "t"')


def test_comparisons() -> None:
    out = run('SELECT 1 = 1.0 AS a, \'2\' = 2 AS b, \'10\' > 9 AS c, x > 1 AS d, x = null AS e,'
              ' \'b\' > \'a\' AS f, 1 != 2 AS g, 1 <> 1 AS h, [1] = [1] AS i FROM "t"')
    assert out == [{"a": True, "b": True, "c": True, "d": False, "e": True, "f": True,
                    "g": True, "h": False, "i": True}]


def test_topic_match_and_in() -> None:
    out = run('SELECT topic =~ "a/+/c" AS m, topic =~ "x/#" AS n, qos IN (1, 2) AS i, '
              'qos NOT IN (1) AS j FROM "#"', topic="a/b/c", qos=1)
    assert out == [{"m": True, "n": False, "i": True, "j": False}]


def test_and_or_not_short_circuit() -> None:
    # the right side would fail (division by zero) if it were evaluated
    assert run('SELECT a FROM "t" WHERE a = 1 OR 1 / 0 > 1', a=1) == [{"a": 1}]
    assert run('SELECT a FROM "t" WHERE a = 2 AND 1 / 0 > 1', a=1) == []
    assert run('SELECT a FROM "t" WHERE NOT a = 2', a=1) == [{"a": 1}]


def test_payload_not_json_gives_undefined_fields() -> None:
    assert run('SELECT payload.t AS t FROM "t"', payload="not json") == [{"t": None}]
    assert run('SELECT payload AS p FROM "t"', payload="raw") == [{"p": "raw"}]


def test_payload_decoded_once_per_event() -> None:
    calls = 0

    def payload(_s: Any) -> str:
        nonlocal calls
        calls += 1
        return PAYLOAD

    c = Columns({"payload": payload}, None)
    for sql in ('SELECT payload.t AS a, payload.list[2] AS b FROM "t"',
                'SELECT payload.a AS x FROM "t" WHERE payload.t > 1'):
        compile_sql(sql).run(c)
    assert calls == 1


def test_foreach_do_incase() -> None:
    sql = ('FOREACH payload.sensors AS s DO s.n AS name, s.v * 10 AS v, clientid '
           'INCASE s.v > 1 FROM "t"')
    assert run(sql, payload=PAYLOAD, clientid="c") == [
        {"name": "b", "v": 30, "clientid": "c"}, {"name": "c", "v": 50, "clientid": "c"}]


def test_foreach_without_do_outputs_columns_and_item() -> None:
    out = run('FOREACH payload.list FROM "t" WHERE topic = "t"', payload='{"list": [1, 2]}',
              topic="t")
    assert [o["item"] for o in out] == [1, 2]
    assert out[0]["topic"] == "t"
    assert run('FOREACH payload.list FROM "t" WHERE topic = "x"', payload='{"list": [1]}',
               topic="t") == []


def test_foreach_over_a_non_array_fails() -> None:
    with pytest.raises(RuleEvalError):
        run('FOREACH payload.t FROM "t"', payload='{"t": 1}')


def test_foreach_empty_gives_no_output() -> None:
    assert run('FOREACH payload.l FROM "t"', payload='{"l": []}') == []
