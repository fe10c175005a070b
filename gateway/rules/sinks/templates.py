"""The action templates of the sinks: from a rule's output to one buffered item.

Every sink's action renders its template when the rule fires, so the item put on the
durable buffer is self-contained (JSON): it can be delivered after a restart whatever the
rules look like by then. Rendering never splices a value into a statement's text:

- :class:`SqlTemplate` (PostgreSQL): ``${path}`` (or ``'${path}'``) becomes a bound
  parameter (``%s``); the values travel apart from the SQL text as strings (or NULL) and
  the server casts them to the column's type. A placeholder inside a longer string literal
  (``'a${x}'``) is refused when the rule loads, because it could not be bound.
- :class:`RedisTemplate`: the command is split on white space when the rule loads; each
  word is a template rendered into exactly one argument (a value with spaces stays one).
- :class:`AmqpTemplate`: the routing key and the body are templates; the exchange is fixed.
- :class:`LineTemplate` (InfluxDB line protocol): measurement, tags, fields and timestamp
  are parsed when the rule loads; values are escaped as the line protocol says, so a
  value cannot add a tag, a field or a line. A field that is one placeholder is typed by
  its value (number: float, ``${x}i``: integer, bool, text: a quoted string).

Each ``check`` raises ValueError with one line; ``render`` raises ValueError for an output
that cannot make an item (the rule's action counts it as failed, nothing is queued).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from gateway.rules.functions import to_json, to_str
from gateway.rules.template import Template, lookup

__all__ = [
    "SINK_KINDS", "TEMPLATES", "AmqpTemplate", "LineTemplate", "RedisTemplate", "SqlTemplate",
    "check_args", "make_action",
]

# = gateway.config.connectors.CONNECTOR_KINDS (not imported: see the package docstring)
SINK_KINDS = ("postgresql", "redis", "rabbitmq", "influxdb")

_PLACEHOLDER = re.compile(r"'?\$\{([^}]*)\}'?")


def _value(path: tuple[str, ...], output: Mapping[str, Any], columns: Mapping[str, Any]) -> Any:
    return dict(output) if path == ("",) else lookup(path, output, columns)


def _param(v: Any) -> str | None:
    """A bound SQL parameter: text the server casts to the column's type, or NULL."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, dict | list):
        return to_json(v)
    return to_str(v)


def _keys(args: Mapping[str, Any], allowed: set[str], kind: str) -> None:
    unknown = set(args) - allowed
    if unknown:
        raise ValueError(f"{kind}: unknown argument(s) {', '.join(sorted(unknown))}")


def _str_arg(args: Mapping[str, Any], key: str, kind: str, *, required: bool) -> str | None:
    v = args.get(key)
    if v is None:
        if required:
            raise ValueError(f"{kind}: args.{key} (a template) is required")
        return None
    if not isinstance(v, str) or (required and not v.strip()):
        raise ValueError(f"{kind}: args.{key} must be a non-empty string")
    return v


class SqlTemplate:
    """``args = {sql = "INSERT ... VALUES (${a}, ${b})"}`` (see the module docstring)."""

    def __init__(self, args: Mapping[str, Any]) -> None:
        _keys(args, {"sql"}, "postgresql")
        text = _str_arg(args, "sql", "postgresql", required=True)
        assert text is not None
        self.text = text
        paths: list[tuple[str, ...]] = []
        out: list[str] = []
        pos = 0
        for m in _PLACEHOLDER.finditer(text):
            quoted_l, quoted_r = m.group(0).startswith("'"), m.group(0).endswith("'")
            if quoted_l != quoted_r:
                raise ValueError(f"postgresql: placeholder {m.group(0).strip(chr(39))} inside a "
                                 "string literal; write it as a whole value: '${x}' or ${x}")
            before = text[pos:m.start()]
            out.append(before.replace("%", "%%"))
            # an odd number of quotes so far: this placeholder sits inside a literal
            if text[:m.start()].count("'") % 2:
                raise ValueError(f"postgresql: placeholder {m.group(0)} inside a string "
                                 "literal; write it as a whole value: '${x}' or ${x}")
            name = m.group(1).strip()
            Template("${" + name + "}")  # ValueError for a bad path
            paths.append(("",) if name == "." else tuple(name.split(".")))
            out.append("%s")
            pos = m.end()
        out.append(text[pos:].replace("%", "%%"))
        self.sql = "".join(out)
        self.paths = paths

    def render(self, output: Mapping[str, Any], columns: Mapping[str, Any]) -> bytes:
        params = [_param(_value(p, output, columns)) for p in self.paths]
        return json.dumps({"s": self.sql, "p": params}, ensure_ascii=False).encode()


class RedisTemplate:
    """``args = {command = "HSET dev:${clientid} t ${t}"}``."""

    def __init__(self, args: Mapping[str, Any]) -> None:
        _keys(args, {"command"}, "redis")
        text = _str_arg(args, "command", "redis", required=True)
        assert text is not None
        words = text.split()
        first = Template(words[0])
        if not first.constant or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.|]*", words[0]):
            raise ValueError(f"redis: the command name must be a plain word, got {words[0]!r}")
        if words[0].upper() in {"FLUSHALL", "FLUSHDB", "SHUTDOWN", "CONFIG", "DEBUG", "MULTI",
                                "EXEC", "SUBSCRIBE", "PSUBSCRIBE", "MONITOR", "SELECT", "AUTH"}:
            raise ValueError(f"redis: {words[0].upper()} is not allowed in a sink")
        self.words = [Template(w) for w in words]

    def render(self, output: Mapping[str, Any], columns: Mapping[str, Any]) -> bytes:
        args = [t.render(output, columns) for t in self.words]
        return json.dumps({"c": args}, ensure_ascii=False).encode()


class AmqpTemplate:
    """``args = {exchange, routing_key, payload, delivery_mode, mandatory}``."""

    def __init__(self, args: Mapping[str, Any]) -> None:
        _keys(args, {"exchange", "routing_key", "payload", "delivery_mode", "mandatory"},
              "rabbitmq")
        exchange = args.get("exchange", "")
        if not isinstance(exchange, str):
            raise ValueError("rabbitmq: args.exchange must be a string (\"\": the default "
                             "exchange)")
        key = _str_arg(args, "routing_key", "rabbitmq", required=True)
        assert key is not None
        mode = args.get("delivery_mode", "persistent")
        if mode not in ("persistent", "non_persistent"):
            raise ValueError("rabbitmq: args.delivery_mode is persistent or non_persistent")
        mandatory = args.get("mandatory", False)
        if not isinstance(mandatory, bool):
            raise ValueError("rabbitmq: args.mandatory must be true or false")
        self.exchange = exchange
        self.key = Template(key)
        payload = _str_arg(args, "payload", "rabbitmq", required=False) or ""
        self.payload = Template(payload) if payload else None
        self.persistent = mode == "persistent"
        self.mandatory = mandatory

    def render(self, output: Mapping[str, Any], columns: Mapping[str, Any]) -> bytes:
        body = (self.payload.render(output, columns) if self.payload is not None
                else to_json(dict(output)))
        return json.dumps({"e": self.exchange, "k": self.key.render(output, columns),
                           "b": body, "p": self.persistent, "m": self.mandatory},
                          ensure_ascii=False).encode()


# -- InfluxDB line protocol ---------------------------------------------------------------


def _split(text: str, sep: str) -> list[str]:
    """``text`` split on ``sep`` outside ``${...}``, double quotes and backslash escapes."""
    parts: list[str] = []
    cur: list[str] = []
    i, quoted, depth = 0, False, 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            cur.append(text[i:i + 2])
            i += 2
            continue
        if text.startswith("${", i):
            depth += 1
        elif c == "}" and depth:
            depth -= 1
        elif c == '"' and not depth:
            quoted = not quoted
        if c == sep and not quoted and not depth:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    parts.append("".join(cur))
    return parts


def _esc(s: str, chars: str) -> str:
    """A measurement, tag key/value or field key. InfluxDB 1.x unescapes only ``\\,``,
    ``\\=`` and ``\\ `` there: a backslash is written as is, except before one of those
    or at the end, where it must be doubled to stay a backslash (and is then stored
    doubled: 1.x cannot express it). Newlines (not allowed in line protocol) are
    written as the two characters ``\\n``."""
    out: list[str] = []
    s = s.replace("\n", "\\n").replace("\r", "\\r")
    for i, c in enumerate(s):
        if c == "\\" and (i + 1 == len(s) or s[i + 1] in chars):
            out.append("\\\\")
        elif c in chars:
            out.append("\\" + c)
        else:
            out.append(c)
    return "".join(out)


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") \
        .replace("\r", "\\r") + '"'


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


class _Field:
    """One field's value: ``"text ${x}"`` (string), ``${x}i`` (integer), ``${x}`` (typed
    by the value), or a constant line-protocol value."""

    def __init__(self, raw: str) -> None:
        self.kind: str
        if len(raw) >= 2 and raw.startswith('"') and raw.endswith('"'):
            self.kind, self.t = "string", Template(raw[1:-1].replace('\\"', '"'))
        elif raw.endswith("i") and raw[:-1].startswith("${") and raw[:-1].endswith("}"):
            self.kind, self.t = "int", Template(raw[:-1])
        else:
            self.t = Template(raw)
            if self.t.constant:
                if not (_NUMBER.fullmatch(raw) or re.fullmatch(r"[+-]?\d+[iu]", raw)
                        or raw.lower() in ("t", "true", "f", "false")):
                    raise ValueError(f"influxdb: field value {raw!r} is not a number, a "
                                     "boolean or a quoted string")
                self.kind = "constant"
            elif len(self.t.parts) == 1:
                self.kind = "typed"
            else:
                self.kind = "string"

    def render(self, output: Mapping[str, Any], columns: Mapping[str, Any]) -> str | None:
        if self.kind == "constant":
            return self.t.text
        if self.kind == "string":
            return _quote(self.t.render(output, columns))
        v = self.t.value(output, columns)
        if v is None:
            return None
        if self.kind == "int":
            if isinstance(v, bool) or not isinstance(v, int | float | str):
                raise ValueError(f"influxdb: {v!r} is not an integer")
            return f"{int(float(v))}i" if not isinstance(v, int) else f"{v}i"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            f = float(v)
            if math.isnan(f) or math.isinf(f):
                raise ValueError(f"influxdb: {v!r} cannot be stored")
            return repr(f) if isinstance(v, float) else str(v)
        if isinstance(v, dict | list):
            return _quote(to_json(v))
        return _quote(to_str(v))


class LineTemplate:
    """``args = {write_syntax = "m,tag=${t} field=${v} ${timestamp}"}`` (without a
    timestamp, the event's ``timestamp`` (ms) is used, scaled to the connector's
    precision, so a point sent twice is the same point)."""

    def __init__(self, args: Mapping[str, Any]) -> None:
        _keys(args, {"write_syntax"}, "influxdb")
        text = _str_arg(args, "write_syntax", "influxdb", required=True)
        assert text is not None
        sections = [s for s in _split(text.strip(), " ") if s]
        if len(sections) not in (2, 3):
            raise ValueError("influxdb: write_syntax is 'measurement[,tag=v...] "
                             "field=v[,field=v...] [timestamp]'")
        head = _split(sections[0], ",")
        if not head[0]:
            raise ValueError("influxdb: write_syntax has no measurement")
        self.measurement = Template(head[0])
        self.tags: list[tuple[Template, Template]] = []
        for t in head[1:]:
            k, eq, v = t.partition("=")
            if not eq or not k or not v:
                raise ValueError(f"influxdb: tag {t!r} is not key=value")
            self.tags.append((Template(k), Template(v)))
        self.fields: list[tuple[Template, _Field]] = []
        for f in _split(sections[1], ","):
            k, eq, v = f.partition("=")
            if not eq or not k or not v:
                raise ValueError(f"influxdb: field {f!r} is not key=value")
            self.fields.append((Template(k), _Field(v)))
        self.timestamp = Template(sections[2]) if len(sections) == 3 else None

    def render(self, output: Mapping[str, Any], columns: Mapping[str, Any]) -> bytes:
        line = [_esc(self.measurement.render(output, columns), ", ")]
        for k, v in self.tags:
            value = v.render(output, columns)
            if value and value != "undefined":
                line.append("," + _esc(k.render(output, columns), ",= ") + "="
                            + _esc(value, ",= "))
        fields = []
        for k, fv in self.fields:
            fvalue = fv.render(output, columns)
            if fvalue is not None:
                fields.append(_esc(k.render(output, columns), ",= ") + "=" + fvalue)
        if not fields:
            raise ValueError("influxdb: no field has a value")
        line.append(" " + ",".join(fields))
        if self.timestamp is not None:
            ts = self.timestamp.render(output, columns)
            if not re.fullmatch(r"-?\d+", ts):
                raise ValueError(f"influxdb: timestamp {ts!r} is not an integer")
            item = {"l": "".join(line), "t": int(ts)}
        else:
            ts_ms = columns.get("timestamp")
            item = {"l": "".join(line), "ms": int(ts_ms) if isinstance(ts_ms, int | float)
                    else None}
        return json.dumps(item, ensure_ascii=False).encode()


TEMPLATES: dict[str, type[SqlTemplate | RedisTemplate | AmqpTemplate | LineTemplate]] = {
    "postgresql": SqlTemplate,
    "redis": RedisTemplate,
    "rabbitmq": AmqpTemplate,
    "influxdb": LineTemplate,
}


def check_args(kind: str, args: Mapping[str, Any]) -> None:
    """ValueError (one line) when ``args`` cannot make a ``kind`` action."""
    TEMPLATES[kind](args)


def make_action(function: str, args: Mapping[str, Any], sinks: Callable[[], Mapping[str, Any]]
                ) -> Callable[[dict[str, Any], Mapping[str, Any]], None]:
    """The rule action ``KIND:NAME``: render the item now, buffer it in the running sink
    (``sinks()`` maps ``"KIND:NAME"`` to it); ValueError when no such connector runs."""
    kind, _, name = function.partition(":")
    template = TEMPLATES[kind](args)
    if function not in sinks():
        raise ValueError(f"no [connectors.{kind}.{name}] configured")

    def sink_action(output: dict[str, Any], columns: Mapping[str, Any]) -> None:
        sink = sinks().get(function)
        if sink is None:
            raise ValueError(f"{function} is not running")
        sink.put(template.render(output, columns))

    return sink_action
