"""``to_gateway_toml``: render a mapping as a TOML document (gateway.toml, rules files).

Invariants: the output parses back (``tomllib.loads``) to the input, for mappings whose
leaves are strings, booleans, integers, finite floats, lists and mappings; ``None`` has
no TOML form and is refused with the dotted key that holds it. Keys are written bare
when they can be, quoted otherwise. A table's plain values come before its sub-tables;
a non-empty list of mappings becomes an array of tables (``[[a.b]]``); a mapping inside
an array element is written inline. Key order is the input's order, so the same input
always renders the same bytes (idempotent templates).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(key: Any) -> str:
    text = str(key)
    return text if _BARE.fullmatch(text) else _string(text)


def _string(text: str) -> str:
    # JSON's escapes are valid TOML basic-string escapes; TOML also forbids DEL raw.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(value: Any, where: str) -> str:
    if value is None:
        raise AnsibleFilterError(f"to_gateway_toml: {where} is null, which TOML cannot hold")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_key(k)} = {_value(v, f'{where}.{k}')}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v, f"{where}[{i}]") for i, v in enumerate(value)) + "]"
    raise AnsibleFilterError(f"to_gateway_toml: {where} is a {type(value).__name__}")


def _is_table_array(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(v, Mapping) for v in value)


def _table(table: Mapping[str, Any], path: list[str], out: list[str], header: str) -> None:
    plain = [(k, v) for k, v in table.items()
             if not isinstance(v, Mapping) and not _is_table_array(v)]
    subtables = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
    arrays = [(k, v) for k, v in table.items() if _is_table_array(v)]
    dotted = ".".join(_key(p) for p in path)
    if header == "[[":
        out.extend(["", f"[[{dotted}]]"])
    elif path and (plain or not (subtables or arrays)):
        out.extend(["", f"[{dotted}]"])
    where = ".".join(path) or "the document"
    for k, v in plain:
        out.append(f"{_key(k)} = {_value(v, f'{where}.{k}')}")
    if header == "[[":  # inside an array element: nested tables inline
        for k, v in [*subtables, *arrays]:
            out.append(f"{_key(k)} = {_value(v, f'{where}.{k}')}")
        return
    for k, v in subtables:
        _table(v, [*path, str(k)], out, "[")
    for k, v in arrays:
        for item in v:
            _table(item, [*path, str(k)], out, "[[")


def to_gateway_toml(data: Any) -> str:
    if not isinstance(data, Mapping):
        raise AnsibleFilterError("to_gateway_toml: expects a mapping")
    out: list[str] = []
    _table(data, [], out, "[")
    return "\n".join(out).lstrip("\n") + "\n"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"to_gateway_toml": to_gateway_toml}
