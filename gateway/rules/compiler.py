"""Compile a parsed statement into closures, and run it over one event's columns.

``compile_statement(st)`` returns a :class:`Program`; ``Program.run(columns)`` returns the
list of outputs (one map for SELECT, one per kept element for FOREACH; empty when WHERE
is false or FOREACH kept nothing) or raises on a per-message failure.

Semantics (EMQX 5's):

- A name is looked up in the fields selected so far, then in the event's columns (a
  :class:`Columns` mapping, computed lazily); an unknown name is ``None`` (undefined).
- ``x.k`` on a map is its key ``k``; on a string (the payload) the string is decoded as
  JSON first (the payload once per event); ``x[i]`` is 1-based, negative counts from the
  end; out of range or a missing key is ``None``.
- Comparisons: numbers compare numerically, a number against a numeric string too;
  ``=`` between other values is equality; ordering anything with ``None`` is false.
  ``a =~ f``: topic ``a`` matches filter ``f``.
- ``+`` adds numbers or concatenates when either side is a string; ``/`` divides to a
  float; ``div`` and ``mod`` truncate toward zero (Erlang's div and rem); division by zero
  and arithmetic on non-numbers raise :class:`RuleEvalError`.
- An unaliased field ``a.b.c`` (keys only) nests its output as ``{"a": {"b": {"c": v}}}``;
  any other unaliased expression is keyed by its source text; ``AS a.b`` nests too.
- WHERE sees the columns overlaid with the selected fields. When it names no selected
  alias it is evaluated first (a message it rejects costs no SELECT work).
- Every function call is resolved when the statement compiles: an unknown name or a wrong
  number of arguments raises :class:`~gateway.rules.parser.SqlError` with its position.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import Any

from gateway.core.topic_index import is_valid_filter, topic_matches
from gateway.rules.ast import (
    Array,
    BinOp,
    Call,
    Case,
    Expr,
    Field,
    In,
    Index,
    Key,
    Lit,
    Neg,
    Not,
    Path,
    Star,
    Statement,
    Var,
)
from gateway.rules.columns import (
    Columns,
    Scope,
    _decode,
    _Overlay,
    _root_columns,
    decode_json_container,
)
from gateway.rules.functions import FUNCTIONS, RuleEvalError, to_str
from gateway.rules.parser import SqlError, parse

__all__ = [
    "Columns", "Program", "RuleEvalError", "compile_sql", "compile_statement",
    "decode_json_container",
]

Fn = Callable[[Scope], Any]


# -- expressions ----------------------------------------------------------------------


def _step_key(value: Any, name: str) -> Any:
    if isinstance(value, dict):
        return value.get(name)
    if isinstance(value, str | bytes):
        value = _decode(value)
        return value.get(name) if isinstance(value, dict) else None
    return None


def _step_index(value: Any, i: Any) -> Any:
    if isinstance(value, str | bytes):
        value = _decode(value)
    if isinstance(value, list):
        if isinstance(i, bool) or not isinstance(i, int):
            raise RuleEvalError(f"array index is not an integer: {i!r}")
        n = len(value)
        if 1 <= i <= n:
            return value[i - 1]
        if -n <= i <= -1:
            return value[i]
        return None
    if isinstance(value, dict):
        return value.get(str(i)) if not isinstance(i, str) else value.get(i)
    return None


def _as_number(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return v
    return v


def _cmp_pair(a: Any, b: Any) -> tuple[Any, Any]:
    an = isinstance(a, int | float) and not isinstance(a, bool)
    bn = isinstance(b, int | float) and not isinstance(b, bool)
    if an and isinstance(b, str):
        return a, _as_number(b)
    if bn and isinstance(a, str):
        return _as_number(a), b
    if isinstance(a, bytes):
        a = a.decode("utf-8", "replace")
    if isinstance(b, bytes):
        b = b.decode("utf-8", "replace")
    return a, b


def _eq(a: Any, b: Any) -> bool:
    a, b = _cmp_pair(a, b)
    return bool(a == b)


def _order(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def cmp(a: Any, b: Any) -> bool:
        ta, tb = type(a), type(b)
        if (ta is int or ta is float) and (tb is int or tb is float):
            return op(a, b)  # the common case, first
        if a is None or b is None:
            return False
        a, b = _cmp_pair(a, b)
        try:
            return op(a, b)
        except TypeError:
            return False

    return cmp


def _num(v: Any, op: str) -> int | float:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return v
    n = _as_number(v)
    if isinstance(n, int | float) and not isinstance(n, bool):
        return n
    raise RuleEvalError(f"{op}: not a number: {v!r}")


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, str) or isinstance(b, str):
        return to_str(a) + to_str(b)
    return _num(a, "+") + _num(b, "+")


def _div_trunc(a: Any, b: Any) -> int:
    x, y = _num(a, "div"), _num(b, "div")
    if not isinstance(x, int) or not isinstance(y, int):
        raise RuleEvalError("div: integers only")
    if y == 0:
        raise RuleEvalError("division by zero")
    q = abs(x) // abs(y)
    return q if (x >= 0) == (y >= 0) else -q


def _rem(a: Any, b: Any) -> int:
    x, y = _num(a, "mod"), _num(b, "mod")
    if not isinstance(x, int) or not isinstance(y, int):
        raise RuleEvalError("mod: integers only")
    if y == 0:
        raise RuleEvalError("division by zero")
    return x - y * _div_trunc(x, y)


def _fdiv(a: Any, b: Any) -> float:
    y = _num(b, "/")
    if y == 0:
        raise RuleEvalError("division by zero")
    return _num(a, "/") / y


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "=": _eq,
    "!=": lambda a, b: not _eq(a, b),
    "<": _order(operator.lt),
    "<=": _order(operator.le),
    ">": _order(operator.gt),
    ">=": _order(operator.ge),
    "=~": lambda a, b: isinstance(a, str) and isinstance(b, str) and topic_matches(b, a),
    "+": _add,
    "-": lambda a, b: _num(a, "-") - _num(b, "-"),
    "*": lambda a, b: _num(a, "*") * _num(b, "*"),
    "/": _fdiv,
    "div": _div_trunc,
    "mod": _rem,
}


def compile_expr(e: Expr) -> Fn:
    """A closure computing ``e`` over a scope."""
    if isinstance(e, Lit):
        v = e.value
        return lambda s: v
    if isinstance(e, Var):
        name = e.name
        return lambda s: s[name]
    if isinstance(e, Path):
        return _compile_path(e)
    if isinstance(e, Call):
        return _compile_call(e)
    if isinstance(e, BinOp):
        left, right = compile_expr(e.left), compile_expr(e.right)
        if e.op == "and":
            return lambda s: bool(left(s)) and bool(right(s))
        if e.op == "or":
            return lambda s: bool(left(s)) or bool(right(s))
        op = _BINARY[e.op]
        return lambda s: op(left(s), right(s))
    if isinstance(e, Not):
        inner = compile_expr(e.expr)
        return lambda s: not inner(s)
    if isinstance(e, Neg):
        inner = compile_expr(e.expr)
        return lambda s: -_num(inner(s), "-")
    if isinstance(e, In):
        subject = compile_expr(e.expr)
        items = [compile_expr(i) for i in e.items]
        negated = e.negated

        def is_in(s: Scope) -> bool:
            v = subject(s)
            found = any(_eq(v, i(s)) for i in items)
            return found != negated

        return is_in
    if isinstance(e, Case):
        return _compile_case(e)
    if isinstance(e, Array):
        items = [compile_expr(i) for i in e.items]
        return lambda s: [i(s) for i in items]
    raise TypeError(f"cannot compile {e!r}")


def _compile_path(e: Path) -> Fn:
    steps: list[tuple[bool, Any]] = []
    for st in e.steps:
        if isinstance(st, Key):
            steps.append((True, st.name))
        else:
            assert isinstance(st, Index)
            steps.append((False, compile_expr(st.expr)))
    first_key, first_arg = steps[0]
    if isinstance(e.root, Var):
        # EMQX looks a path up in the fields selected so far, then (if undefined there)
        # in the columns: ``SELECT payload.a, payload.b`` reads both from the event
        name = e.root.name
        rest = steps[1:] if first_key else steps
        is_payload = name == "payload" and first_key

        def var_path(s: Scope) -> Any:
            if type(s) is Columns:  # the common case: no selected fields in between
                if is_payload:
                    doc = s.payload_json()
                    v = doc.get(first_arg) if type(doc) is dict else None
                    return _walk(v, rest, s) if rest else v
                return _walk(s[name], steps, s)
            while isinstance(s, _Overlay):
                if dict.__contains__(s, name):
                    v = _walk(dict.__getitem__(s, name), steps, s)
                    if v is not None:
                        return v
                s = s.base
            if is_payload and isinstance(s, Columns):
                # payload.x: the payload's JSON, decoded once per event
                doc = s.payload_json()
                v = doc.get(first_arg) if isinstance(doc, dict) else None
                return _walk(v, rest, s)
            return _walk(s[name], steps, s)

        return var_path
    root = compile_expr(e.root)
    return lambda s: _walk(root(s), steps, s)


def _walk(v: Any, steps: list[tuple[bool, Any]], s: Scope) -> Any:
    for is_key, arg in steps:
        v = _step_key(v, arg) if is_key else _step_index(v, arg(s))
    return v


def _compile_call(e: Call) -> Fn:
    func = FUNCTIONS.get(e.name)
    if func is None:
        raise SqlError(f"unknown function {e.name!r}", *e.pos)
    n = len(e.args)
    if n < func.min_args or (func.max_args >= 0 and n > func.max_args):
        want = (
            str(func.min_args)
            if func.min_args == func.max_args
            else f"{func.min_args}..{func.max_args if func.max_args >= 0 else 'n'}"
        )
        raise SqlError(f"function {e.name!r} takes {want} arguments, got {n}", *e.pos)
    fn = func.fn
    args = [compile_expr(a) for a in e.args]
    if n == 0:
        return lambda s: fn()
    if n == 1:
        (a0,) = args
        return lambda s: fn(a0(s))
    if n == 2:
        a0, a1 = args
        return lambda s: fn(a0(s), a1(s))
    return lambda s: fn(*[a(s) for a in args])


def _compile_case(e: Case) -> Fn:
    subject = compile_expr(e.subject) if e.subject is not None else None
    whens = [(compile_expr(c), compile_expr(r)) for c, r in e.whens]
    default = compile_expr(e.default) if e.default is not None else None

    def case(s: Scope) -> Any:
        if subject is not None:
            v = subject(s)
            for cond, res in whens:
                if _eq(v, cond(s)):
                    return res(s)
        else:
            for cond, res in whens:
                if cond(s) is True:
                    return res(s)
        return default(s) if default is not None else None

    return case


# -- statements -----------------------------------------------------------------------


def _nest(out: dict[str, Any], keys: tuple[str, ...], value: Any) -> None:
    cur = out
    for k in keys[:-1]:
        nxt = cur.get(k)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[k] = nxt
        cur = nxt
    cur[keys[-1]] = value


def _output_keys(f: Field) -> tuple[str, ...]:
    if f.alias is not None:
        return f.alias
    e = f.expr
    if isinstance(e, Var):
        return (e.name,)
    if isinstance(e, Path) and isinstance(e.root, Var) and all(isinstance(s, Key) for s in e.steps):
        return (e.root.name, *(s.name for s in e.steps if isinstance(s, Key)))
    return (f.text or "expr",)


def _shadowing(f: Field) -> str | None:
    """The name a field's output hides from later lookups, None when it hides nothing
    (an unaliased column: the output is the column's own value)."""
    if f.alias is None and isinstance(f.expr, Var):
        return None
    return _output_keys(f)[0]


def _compile_fields(fields: tuple[Field | Star, ...]) -> Callable[[Scope], dict[str, Any]]:
    parts: list[tuple[tuple[str, ...], Fn] | None] = []
    for f in fields:
        if isinstance(f, Star):
            parts.append(None)
        else:
            parts.append((_output_keys(f), compile_expr(f.expr)))
    hidden: set[str] = set()
    independent = True  # no field reads what an earlier one selected
    for f in fields:
        if isinstance(f, Star):
            independent = False
            break
        if hidden & set(_names(f.expr)):
            independent = False
        name = _shadowing(f)
        if name is not None:
            hidden.add(name)
    if independent:
        flat = [(keys[0], fn) for keys, fn in (p for p in parts if p is not None)
                if len(keys) == 1]
        if len(flat) == len(parts):

            def select_flat(base: Scope) -> dict[str, Any]:
                return {key: fn(base) for key, fn in flat}

            return select_flat

    def select(base: Scope) -> dict[str, Any]:
        scope = _Overlay(base)
        for part in parts:
            if part is None:
                cols = _root_columns(base)
                everything = cols.everything() if cols is not None else dict(base)
                for k, v in everything.items():
                    scope.setdefault(k, v)
                if base is not cols:  # FOREACH item and such, on top of the columns
                    for k, v in base.items():
                        scope[k] = v
                continue
            keys, fn = part
            value = fn(scope)
            if len(keys) == 1:
                scope[keys[0]] = value
            else:
                _nest(scope, keys, value)
        return dict(scope)

    return select


_EXPR_TYPES = (Lit, Var, Path, Call, BinOp, Not, Neg, In, Case, Array)


def _names(e: Any) -> Iterator[str]:
    if e is None:
        return
    if isinstance(e, Var):
        yield e.name
    for child in getattr(e, "__slots__", ()):
        v = getattr(e, child)
        if isinstance(v, _EXPR_TYPES):
            yield from _names(v)
        elif isinstance(v, tuple):
            for x in v:
                if isinstance(x, _EXPR_TYPES):
                    yield from _names(x)
                elif isinstance(x, Index):
                    yield from _names(x.expr)
                elif isinstance(x, tuple):
                    for y in x:
                        yield from _names(y)


class Program:
    """A compiled statement (see the module docstring)."""

    __slots__ = ("statement", "sources", "run")

    def __init__(self, st: Statement) -> None:
        self.statement = st
        self.sources = st.sources
        self.run: Callable[[Scope], list[dict[str, Any]]] = (
            self._select(st) if st.kind == "select" else self._foreach(st)
        )

    @staticmethod
    def _select(st: Statement) -> Callable[[Scope], list[dict[str, Any]]]:
        select = _compile_fields(st.fields)
        if st.where is None:
            return lambda cols: [select(cols)]
        where = compile_expr(st.where)
        hidden = {_shadowing(f) for f in st.fields if isinstance(f, Field)} - {None}
        if not hidden & set(_names(st.where)):
            # WHERE does not see anything SELECT computes: test it first
            def where_first(cols: Scope) -> list[dict[str, Any]]:
                if where(cols) is not True:
                    return []
                return [select(cols)]

            return where_first

        def select_first(cols: Scope) -> list[dict[str, Any]]:
            out = select(cols)
            scope = _Overlay(cols)
            scope.update(out)
            return [out] if where(scope) is True else []

        return select_first

    @staticmethod
    def _foreach(st: Statement) -> Callable[[Scope], list[dict[str, Any]]]:
        assert st.collection is not None
        collection = compile_expr(st.collection)
        where = compile_expr(st.where) if st.where is not None else None
        incase = compile_expr(st.incase) if st.incase is not None else None
        do = _compile_fields(st.fields) if st.fields else None
        item = st.item

        def foreach(cols: Scope) -> list[dict[str, Any]]:
            if where is not None and where(cols) is not True:
                return []
            items = collection(cols)
            if isinstance(items, str | bytes):
                items = _decode(items)
            if not isinstance(items, list):
                raise RuleEvalError(f"FOREACH: not an array: {items!r}")
            out = []
            for element in items:
                scope = _Overlay(cols)
                scope[item] = element
                if incase is not None and incase(scope) is not True:
                    continue
                if do is not None:
                    out.append(do(scope))
                else:
                    cols_all = _root_columns(cols)
                    row = cols_all.everything() if cols_all is not None else dict(cols)
                    row[item] = element
                    out.append(row)
            return out

        return foreach


def compile_statement(st: Statement) -> Program:
    return Program(st)


def compile_sql(sql: str) -> Program:
    """Parse and compile; :class:`SqlError` naming the position on any load-time error,
    including a FROM source that is neither a topic filter nor a known ``$events/...``."""
    from gateway.rules.events import EVENTS

    program = Program(parse(sql))
    for s in program.sources:
        if s.startswith("$events/"):
            if s not in EVENTS:
                raise SqlError(f"FROM: unknown event source {s!r}", *_from_pos(sql, s))
        elif not is_valid_filter(s):
            raise SqlError(f"FROM: {s!r} is not a valid topic filter", *_from_pos(sql, s))
    return program


def _from_pos(sql: str, source: str) -> tuple[int, int]:
    i = sql.rfind(source)
    if i < 0:
        return (1, 1)
    line = sql.count("\n", 0, i) + 1
    return line, i - (sql.rfind("\n", 0, i) + 1)  # the opening quote's column, 1-based
