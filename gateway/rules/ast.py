"""The syntax tree of one rule statement (frozen dataclasses, comparable and hashable).

:mod:`gateway.rules.parser` builds it from SQL text; :mod:`gateway.rules.compiler` turns it
into Python closures; :func:`render` turns it back into SQL text that parses to an equal
tree (the round-trip the property tests check).

Invariants:

- ``Path.steps`` is never empty: a bare column is a :class:`Var`.
- ``Field.alias`` is None or a non-empty tuple of names (``AS a.b`` nests the output).
- ``Statement.sources`` holds the FROM topic filters and event names as written, at least one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Array",
    "BinOp",
    "Call",
    "Case",
    "Expr",
    "Field",
    "In",
    "Index",
    "Key",
    "Lit",
    "Neg",
    "Not",
    "Path",
    "Star",
    "Statement",
    "Var",
    "render",
]


@dataclass(frozen=True, slots=True)
class Lit:
    value: str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class Var:
    name: str


@dataclass(frozen=True, slots=True)
class Key:
    name: str


@dataclass(frozen=True, slots=True)
class Index:
    expr: Expr


@dataclass(frozen=True, slots=True)
class Path:
    root: Expr
    steps: tuple[Key | Index, ...]


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    args: tuple[Expr, ...]
    pos: tuple[int, int] = field(default=(0, 0), compare=False)  # (line, column) of the name


@dataclass(frozen=True, slots=True)
class BinOp:
    op: str  # + - * / div mod = != < <= > >= =~ and or
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Not:
    expr: Expr


@dataclass(frozen=True, slots=True)
class Neg:
    expr: Expr


@dataclass(frozen=True, slots=True)
class In:
    expr: Expr
    items: tuple[Expr, ...]
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Case:
    subject: Expr | None
    whens: tuple[tuple[Expr, Expr], ...]
    default: Expr | None


@dataclass(frozen=True, slots=True)
class Array:
    items: tuple[Expr, ...]


Expr = Lit | Var | Path | Call | BinOp | Not | Neg | In | Case | Array


@dataclass(frozen=True, slots=True)
class Star:
    pass


@dataclass(frozen=True, slots=True)
class Field:
    expr: Expr
    alias: tuple[str, ...] | None = None
    text: str = field(default="", compare=False)  # source text: an unaliased output key


@dataclass(frozen=True, slots=True)
class Statement:
    kind: Literal["select", "foreach"]
    fields: tuple[Field | Star, ...]  # SELECT fields, or FOREACH's DO fields (may be empty)
    sources: tuple[str, ...]
    where: Expr | None = None
    collection: Expr | None = None  # FOREACH expr
    item: str = "item"  # FOREACH ... AS item
    incase: Expr | None = None


# -- rendering back to SQL ---------------------------------------------------------------

_PREC = {"or": 1, "and": 2, "=": 4, "!=": 4, "<": 4, "<=": 4, ">": 4, ">=": 4, "=~": 4,
         "+": 5, "-": 5, "*": 6, "/": 6, "div": 6, "mod": 6}


def _quote(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _lit(v: Any) -> str:
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, str):
        return _quote(v)
    return repr(v)


def render_expr(e: Expr) -> str:
    """SQL text for ``e``, fully parenthesised where precedence could matter."""
    if isinstance(e, Lit):
        return _lit(e.value)
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Path):
        out = render_expr(e.root)
        if not isinstance(e.root, Var):
            out = f"({out})"
        for s in e.steps:
            out += f".{s.name}" if isinstance(s, Key) else f"[{render_expr(s.expr)}]"
        return out
    if isinstance(e, Call):
        return f"{e.name}({', '.join(render_expr(a) for a in e.args)})"
    if isinstance(e, BinOp):
        op = e.op.upper() if e.op in ("and", "or") else e.op
        return f"({render_expr(e.left)} {op} {render_expr(e.right)})"
    if isinstance(e, Not):
        return f"(NOT {render_expr(e.expr)})"
    if isinstance(e, Neg):
        return f"(-{render_expr(e.expr)})"
    if isinstance(e, In):
        neg = "NOT IN" if e.negated else "IN"
        return f"({render_expr(e.expr)} {neg} ({', '.join(render_expr(i) for i in e.items)}))"
    if isinstance(e, Case):
        parts = ["CASE"]
        if e.subject is not None:
            parts.append(render_expr(e.subject))
        for cond, res in e.whens:
            parts.append(f"WHEN {render_expr(cond)} THEN {render_expr(res)}")
        if e.default is not None:
            parts.append(f"ELSE {render_expr(e.default)}")
        parts.append("END")
        return " ".join(parts)
    if isinstance(e, Array):
        return f"[{', '.join(render_expr(i) for i in e.items)}]"
    raise TypeError(f"not an expression: {e!r}")


def _render_fields(fields: tuple[Field | Star, ...]) -> str:
    out = []
    for f in fields:
        if isinstance(f, Star):
            out.append("*")
        elif f.alias is None:
            out.append(render_expr(f.expr))
        else:
            out.append(f"{render_expr(f.expr)} AS {'.'.join(f.alias)}")
    return ", ".join(out)


def render(st: Statement) -> str:
    """SQL text for a statement (parses back to an equal tree, ``Field.text`` aside)."""
    if st.kind == "select":
        sql = f"SELECT {_render_fields(st.fields)}"
    else:
        assert st.collection is not None
        sql = f"FOREACH {render_expr(st.collection)}"
        if st.item != "item":
            sql += f" AS {st.item}"
        if st.fields:
            sql += f" DO {_render_fields(st.fields)}"
        if st.incase is not None:
            sql += f" INCASE {render_expr(st.incase)}"
    sql += " FROM " + ", ".join(_quote(s) for s in st.sources)
    if st.where is not None:
        sql += f" WHERE {render_expr(st.where)}"
    return sql
