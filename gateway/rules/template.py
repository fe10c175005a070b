"""``${var}`` templates (EMQX's placeholders) for action arguments.

``Template("alerts/${clientid}/${payload.t}")`` splits the text once; ``render(output,
columns)`` looks each path up in the rule's output first, then in the event's columns,
stepping into maps and into JSON text (``${payload.x}`` on a JSON payload). Values are
written with :func:`~gateway.rules.functions.to_str` (maps and arrays as JSON, a missing
value as ``undefined``). ``${.}`` is the whole output as JSON. A ``$`` not followed by
``{`` is literal text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gateway.rules.columns import _decode
from gateway.rules.functions import to_json, to_str

__all__ = ["Template", "lookup"]

_VAR = re.compile(r"\$\{([^}]*)\}")
_PATH_RE = re.compile(r"\.|[A-Za-z0-9_\-$'\"\[\]]+(\.[A-Za-z0-9_\-$'\"\[\]]+)*")


def lookup(path: tuple[str, ...], output: Mapping[str, Any], columns: Mapping[str, Any]) -> Any:
    head = path[0]
    value = output[head] if head in output else columns.get(head)
    for key in path[1:]:
        if isinstance(value, str | bytes):
            value = _decode(value)
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list) and key.isdigit():
            i = int(key)
            value = value[i - 1] if 1 <= i <= len(value) else None
        else:
            return None
    return value


class Template:
    """A parsed template (see the module docstring); ValueError for a bad placeholder."""

    __slots__ = ("text", "parts", "constant")

    def __init__(self, text: str) -> None:
        self.text = text
        parts: list[str | tuple[str, ...]] = []
        pos = 0
        for m in _VAR.finditer(text):
            if m.start() > pos:
                parts.append(text[pos : m.start()])
            name = m.group(1).strip()
            if not name or not _PATH_RE.fullmatch(name):
                raise ValueError(f"bad placeholder ${{{m.group(1)}}} in {text!r}")
            parts.append(("",) if name == "." else tuple(name.split(".")))
            pos = m.end()
        if pos < len(text):
            parts.append(text[pos:])
        self.parts = parts
        self.constant = all(isinstance(p, str) for p in parts)

    def value(self, output: Mapping[str, Any], columns: Mapping[str, Any]) -> Any:
        """A template that is one placeholder only gives the raw value (not text)."""
        if len(self.parts) == 1 and isinstance(self.parts[0], tuple):
            path = self.parts[0]
            return dict(output) if path == ("",) else lookup(path, output, columns)
        return self.render(output, columns)

    def render(self, output: Mapping[str, Any], columns: Mapping[str, Any]) -> str:
        if self.constant:
            return "".join(p for p in self.parts if isinstance(p, str))
        out = []
        for p in self.parts:
            if isinstance(p, str):
                out.append(p)
            elif p == ("",):
                out.append(to_json(dict(output)))
            else:
                out.append(to_str(lookup(p, output, columns)))
        return "".join(out)
