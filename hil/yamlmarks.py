"""YAML loading that keeps line numbers, and one-line error messages for bad input.

``load(path)`` returns the plain Python data and a map from each value's path (a tuple of
keys and list indexes, as pydantic reports ``loc``) to its 1-based line. ``BadInput`` is
what every loader raises on a file that does not parse or validate; its ``str`` is the
single line the CLI prints before exiting 2: ``FILE:LINE: FIELD: problem``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

Loc = tuple[str | int, ...]
_NAMED = re.compile(r"([a-z_]+(?:\.[a-z0-9_-]+)*): (.+)", re.S)


class BadInput(Exception):
    """A scenario or environment file that does not load; ``str`` is one line."""

    def __init__(self, path: Path | str, line: int | None, field: str, problem: str) -> None:
        self.path, self.line, self.field, self.problem = str(path), line, field, problem
        where = f"{self.path}:{line}" if line else self.path
        super().__init__(f"{where}: {field}: {problem}" if field else f"{where}: {problem}")


def _walk(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> Any:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = yaml.safe_load(yaml.serialize(key_node)) if not isinstance(
                key_node, yaml.ScalarNode) else _scalar(key_node)
            out[key] = _walk(value_node, (*loc, key), lines)
            lines.setdefault((*loc, key), key_node.start_mark.line + 1)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, (*loc, i), lines) for i, item in enumerate(node.value)]
    return _scalar(node)


def _scalar(node: yaml.Node) -> Any:
    constructor = yaml.SafeLoader("")
    return constructor.construct_object(node, deep=True)


def load(path: Path) -> tuple[Any, dict[Loc, int]]:
    """Parse ``path``; raise :class:`BadInput` (with the line) when it is not YAML."""
    try:
        text = path.read_text()
    except OSError as e:
        raise BadInput(path, None, "", e.strerror or str(e)) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise BadInput(path, mark.line + 1 if mark else None, "", f"not YAML: {problem}") from None
    lines: dict[Loc, int] = {}
    if node is None:
        return None, {(): 1}
    return _walk(node, (), lines), lines


def line_of(lines: dict[Loc, int], loc: Loc) -> int | None:
    """The line of ``loc`` or of its nearest ancestor that the file has."""
    while True:
        if loc in lines:
            return lines[loc]
        if not loc:
            return None
        loc = loc[:-1]


def _data_loc(data: Any, loc: tuple[Any, ...]) -> Loc:
    """Keep the parts of a pydantic ``loc`` that index into ``data`` (drops union tags)."""
    out: list[str | int] = []
    here = data
    for i, part in enumerate(loc):
        in_dict = isinstance(here, dict) and part in here
        in_list = isinstance(here, list) and isinstance(part, int) and part < len(here)
        if in_dict or in_list:
            out.append(part)
            here = here[part]
        elif isinstance(here, dict) and i == len(loc) - 1 and isinstance(part, str):
            out.append(part)  # a missing or unknown key: name it
    return tuple(out)


def _exists(data: Any, loc: Loc) -> bool:
    here = data
    for part in loc:
        in_dict = isinstance(here, dict) and part in here
        in_list = isinstance(here, list) and isinstance(part, int) and part < len(here)
        if not (in_dict or in_list):
            return False
        here = here[part]
    return True


def from_validation(path: Path | str, err: ValidationError, lines: dict[Loc, int],
                    data: Any) -> BadInput:
    """The first pydantic error as a :class:`BadInput` naming field and line."""
    first = err.errors()[0]
    loc = _data_loc(data, tuple(first["loc"]))
    full = loc
    msg = first["msg"].removeprefix("Value error, ")
    # a model-level check names its field itself: "faults.0.at: ends after duration"
    named = _NAMED.match(msg)
    if named:
        parts: Loc = tuple(int(p) if p.isdigit() else p for p in named[1].split("."))
        for cand in (parts, (*loc, *parts)):  # absolute, or relative to the model's place
            if _exists(data, cand):
                loc, full, msg = cand, cand, named[2]
                break
    field = ".".join(str(p) for p in loc) or "(top level)"
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif first["type"] == "missing":
        msg = "required field missing"
    return BadInput(path, line_of(lines, full), field, msg)
