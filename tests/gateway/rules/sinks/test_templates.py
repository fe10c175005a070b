"""The sinks' templates: values are bound (SQL), kept whole (Redis) or escaped (line
protocol), never spliced; bad templates are refused when the rule loads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.rules.actions import check_action
from gateway.rules.sinks.templates import AmqpTemplate, LineTemplate, RedisTemplate, SqlTemplate

HOSTILE = "x'); DROP TABLE t; -- %s $1 ${clientid}"
COLS: dict[str, Any] = {"clientid": "c1", "timestamp": 1_700_000_000_123,
                        "payload": json.dumps({"t": 21.5, "n": 3, "s": HOSTILE, "ok": True})}


def item(b: bytes) -> Any:
    return json.loads(b)


def test_sql_placeholders_become_bound_parameters() -> None:
    t = SqlTemplate({"sql": "INSERT INTO t(a, b, c, d, e) VALUES (${clientid}, '${payload.t}', "
                            "${payload.s}, ${payload.missing}, ${payload.ok}) -- 100%"})
    assert t.sql == "INSERT INTO t(a, b, c, d, e) VALUES (%s, %s, %s, %s, %s) -- 100%%"
    got = item(t.render({}, COLS))
    assert got == {"s": t.sql, "p": ["c1", "21.5", HOSTILE, None, "true"]}


def test_sql_whole_output_and_maps_are_json() -> None:
    t = SqlTemplate({"sql": "INSERT INTO t(j) VALUES (${.})"})
    assert item(t.render({"a": {"b": 1}}, COLS))["p"] == ['{"a":{"b":1}}']


@pytest.mark.parametrize("sql", [
    "INSERT INTO t VALUES ('a${x}')",
    "INSERT INTO t VALUES ('${x}b')",
    "INSERT INTO t VALUES ('it''s ${x}')",
])
def test_sql_placeholder_inside_a_literal_is_refused(sql: str) -> None:
    with pytest.raises(ValueError, match="inside a string literal"):
        SqlTemplate({"sql": sql})


def test_redis_words_stay_whole_arguments() -> None:
    t = RedisTemplate({"command": "HSET dev:${clientid} s ${payload.s}"})
    assert item(t.render({}, COLS)) == {"c": ["HSET", "dev:c1", "s", HOSTILE]}
    with pytest.raises(ValueError, match="plain word"):
        RedisTemplate({"command": "${cmd} x"})
    with pytest.raises(ValueError, match="not allowed"):
        RedisTemplate({"command": "FLUSHALL"})


def test_amqp_item() -> None:
    t = AmqpTemplate({"exchange": "ex", "routing_key": "dev.${clientid}"})
    got = item(t.render({"n": 1}, COLS))
    assert got == {"e": "ex", "k": "dev.c1", "b": '{"n":1}', "p": True, "m": False}
    with pytest.raises(ValueError, match="delivery_mode"):
        AmqpTemplate({"routing_key": "k", "delivery_mode": 2})


def test_line_protocol_types_and_escapes() -> None:
    t = LineTemplate({"write_syntax": "m,c=${clientid},s=${payload.s} t=${payload.t},"
                                      "n=${payload.n}i,s=${payload.s},ok=${payload.ok},"
                                      "q=\"a ${clientid}\""})
    got = item(t.render({}, COLS))
    assert got["ms"] == 1_700_000_000_123
    tag = "x');\\ DROP\\ TABLE\\ t;\\ --\\ %s\\ $1\\ ${clientid}"
    field = '"x\'); DROP TABLE t; -- %s $1 ${clientid}"'
    assert got["l"] == (f"m,c=c1,s={tag} t=21.5,n=3i,s={field},ok=true,q=\"a c1\"")


def test_line_protocol_explicit_timestamp_and_missing_fields() -> None:
    t = LineTemplate({"write_syntax": "m v=${payload.t},w=${payload.nope} ${payload.n}"})
    assert item(t.render({}, COLS)) == {"l": "m v=21.5", "t": 3}
    t2 = LineTemplate({"write_syntax": "m w=${payload.nope}"})
    with pytest.raises(ValueError, match="no field"):
        t2.render({}, COLS)


@pytest.mark.parametrize(("function", "args", "message"), [
    ("postgresql:pg", {}, "args.sql"),
    ("postgresql:pg", {"sql": "INSERT ${bad path}"}, "bad placeholder"),
    ("postgresql:", {"sql": "x"}, "expected postgresql:NAME"),
    ("redis:r", {"command": "SET k v", "x": 1}, "unknown argument"),
    ("rabbitmq:q", {"exchange": "e"}, "routing_key"),
    ("influxdb:i", {"write_syntax": "only_measurement"}, "write_syntax is"),
    ("influxdb:i", {"write_syntax": "m f=notanumber"}, "not a number"),
])
def test_bad_action_args_are_one_line(function: str, args: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as exc:
        check_action(function, args)
    assert "\n" not in str(exc.value)


def test_the_kinds_agree() -> None:
    from gateway.config.connectors import CONNECTOR_KINDS
    from gateway.rules.sinks import SINK_KINDS, TEMPLATES
    from gateway.rules.sinks.registry import CLIENT_MODULES

    assert CONNECTOR_KINDS == SINK_KINDS == tuple(TEMPLATES) == tuple(CLIENT_MODULES)
