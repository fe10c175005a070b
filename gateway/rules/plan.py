"""Run a set of rules over one event as one generated Python function (a *plan*).

The engine looks up which enabled rules an event concerns (the rules whose FROM matches a
message's topic, or those naming an ``$events/...`` source) and runs them through the plan
made for exactly that tuple of rules. :func:`make_plan` writes the plan's source once,
compiles it with :func:`compile`, and the engine caches it until the rules change. Per
event the plan builds the event's :class:`~gateway.rules.columns.Columns` (lazy, shared
by all its rules) and then, rule by rule:

- evaluates the statement. A SELECT whose fields read no earlier field's output and are
  all flat (``AS a`` or a column, no ``*``, no nested ``AS a.b``) and whose WHERE reads no
  selected alias is *inlined*: the WHERE test and the output dict are Python expressions
  in the plan's body (column reads are dict lookups, a numeric comparison with a number
  is a native comparison, ``payload.x`` is one call on the payload's JSON decoded once
  per event); every other statement runs through its compiled closures
  (:class:`~gateway.rules.compiler.Program`);
- rules with the same SQL text (the usual shape of one rule per destination) share one
  evaluation: the statement runs once per event, each rule counts it and runs its own
  actions (a second rule's actions get shallow copies of the outputs);
- updates the rule's metrics and runs its actions, exactly as the closures would
  (``failed`` with ``last_error``, ``no_result`` or ``passed``, whose sum is ``matched``; each
  action's success or failure).

The plan has two entry points over the same body: ``run(x)`` for one event and
``many(batch)`` for a list of events (the engine queues a loop turn's events of one plan
as one batch): one call and one loop for the batch, the rules' ``passed``/``no_result``
counted in locals and added to their metrics once, at the end of the batch.

Invariants:

- ``many(batch)`` gives the same outputs, action calls and (once it returns) metrics as
  ``run`` on each event of the batch in order.
- A plan gives the same outputs, metrics and action calls, in the same order, as running
  each rule's ``Program.run`` over the event's columns (the property test
  ``tests/gateway/rules/test_plan.py`` checks it over random statements and payloads).
- The inlined expressions read the scope exactly where the closures do (the columns: an
  inlinable statement has no selected field in between), and evaluate operands in the
  same order, so a failure raises in the same place and is counted once per rule.
- A rule's metrics object is read when the event runs (``reset_metrics`` replaces it);
  its action list is read when the plan is made (a rule change makes a new rule object,
  and new plans).
- Actions must not modify the outputs they are given.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.rules.ast import (
    BinOp,
    Call,
    Expr,
    Field,
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
from gateway.rules.columns import _UNSET, Columns, decode_json_container
from gateway.rules.compiler import (
    _BINARY,
    _names,
    _num,
    _output_keys,
    _shadowing,
    _walk,
    compile_expr,
)
from gateway.rules.events import GETTERS, publish_getters
from gateway.rules.functions import FUNCTIONS

if TYPE_CHECKING:
    from gateway.rules.rule import Rule

__all__ = ["Plan", "inlinable", "make_plan"]

log = logging.getLogger("gateway.rules")


class Plan:
    """The rules of one event kind and the function that runs them (``run(x)``: ``x`` is
    the message for ``message.publish``, the :class:`Event` otherwise)."""

    __slots__ = ("rules", "kind", "run", "source", "many")

    def __init__(self, rules: tuple[Rule, ...], kind: str, run: Callable[[Any], None],
                 source: str, many: Callable[[list[Any]], None]) -> None:
        self.rules = rules
        self.kind = kind
        self.run = run  # one event
        # a list of events, in order: ``run`` on each, the counts added once at the end
        self.many = many
        self.source = source


def _fail(rule: Rule, exc: BaseException) -> None:
    m = rule.metrics
    m.failed += 1
    m.last_error = f"{type(exc).__name__}: {exc}"
    log.debug("rule %s failed: %s", rule.id, m.last_error)


def _act(rule: Rule, outputs: list[dict[str, Any]], columns: Columns) -> None:
    for output in outputs:
        _act1(rule, output, columns)


def _act1(rule: Rule, output: dict[str, Any], columns: Columns) -> None:
    m = rule.metrics
    for slot in rule.actions:
        try:
            slot.run(output, columns)
        except Exception as exc:
            slot.failed += 1
            m.actions_failed += 1
            m.last_error = f"{slot.function}: {type(exc).__name__}: {exc}"
            log.debug("rule %s action %s failed: %s", rule.id, slot.function, exc)
        else:
            slot.success += 1
            m.actions_success += 1


def _act_copy(rule: Rule, outputs: list[dict[str, Any]], columns: Columns) -> None:
    _act(rule, [dict(o) for o in outputs], columns)


def _pk(c: Columns, key: str) -> Any:
    """``payload.key`` over the columns (the payload's JSON decoded once per event)."""
    doc = c._json
    if doc is _UNSET:
        doc = c.payload_json()
    return doc.get(key) if type(doc) is dict else None


def _pkp(c: Columns, key: str) -> Any:
    """``_pk`` of a ``message.publish`` plan: the JSON straight from the message's bytes
    (what ``Columns.payload_json`` computes through the ``$payload_json`` getter, without
    its three calls)."""
    doc = c._json
    if doc is _UNSET:
        doc = c._json = decode_json_container(c.source.payload)
    return doc.get(key) if type(doc) is dict else None


def inlinable(st: Statement) -> bool:
    """Whether a SELECT can be written into a plan as expressions over the columns (see
    the module docstring); mirrors the fast paths of ``compiler._compile_fields`` and
    ``Program._select``."""
    if st.kind != "select":
        return False
    hidden: set[str] = set()
    for f in st.fields:
        if isinstance(f, Star):
            return False
        if hidden & set(_names(f.expr)) or len(_output_keys(f)) != 1:
            return False
        name = _shadowing(f)
        if name is not None:
            hidden.add(name)
    return st.where is None or not hidden & set(_names(st.where))


_NUMERIC_ORDER = {"<", "<=", ">", ">="}


class _Writer:
    """Python source for expressions over the columns ``c``; constants go to ``ns``."""

    def __init__(self, ns: dict[str, Any], columns: dict[str, str] | None = None) -> None:
        self.ns = ns
        self.n = 0
        self.columns = columns or {}  # column -> the local holding it (read up front)
        self.shared: dict[tuple[str, ...], str] = {}  # payload key path -> its local
        self.ints: set[str] = set()  # locals always holding an int (a message's qos)
        self.pk = "_pk"  # the function reading payload.KEY (``_pkp`` for message.publish)
        self.bools: set[str] = set()  # expressions written here that are always a bool

    def prelude(self) -> list[str]:
        """Lines that start the shared locals (before the first rule)."""
        return [f"    {name} = _U" for name in self.shared.values()]

    def name(self, value: Any, prefix: str = "_k") -> str:
        self.n += 1
        name = f"{prefix}{self.n}"
        self.ns[name] = value
        return name

    def expr(self, e: Expr) -> str:
        if isinstance(e, Lit):
            v = e.value
            if v is None or type(v) in (bool, int, str) or (
                    type(v) is float and math.isfinite(v)):
                return f"({v!r})"  # a constant of the code (repr round-trips these)
            return self.name(v)
        if isinstance(e, Var):
            local = self.columns.get(e.name)
            return local if local is not None else f"c[{e.name!r}]"
        if isinstance(e, Path):
            return self._path(e)
        if isinstance(e, Call):
            fn = self.name(FUNCTIONS[e.name].fn, "_f")
            return f"{fn}({', '.join(self.expr(a) for a in e.args)})"
        if isinstance(e, BinOp):
            return self._binop(e)
        if isinstance(e, Not):
            return f"(not {self.expr(e.expr)})"
        if isinstance(e, Neg):
            return f"(-_num({self.expr(e.expr)}, '-'))"
        # IN, CASE, arrays: their closure, over the same scope
        return f"{self.name(compile_expr(e), '_e')}(c)"

    def _path(self, e: Path) -> str:
        steps: list[tuple[bool, Any]] = [
            (True, st.name) if isinstance(st, Key) else (False, compile_expr(st.expr))
            for st in e.steps if isinstance(st, Key | Index)
        ]
        if isinstance(e.root, Var):
            first_key, first_arg = steps[0]
            if e.root.name == "payload" and first_key:
                head = f"{self.pk}(c, {self.name(first_arg)})"
                rest = steps[1:]
                value = f"_walk({head}, {self.name(rest)}, c)" if rest else head
                if all(is_key for is_key, _ in steps):
                    # keys only: pure and never raises, so computed once per event and
                    # shared by every rule of the plan that reads it
                    keys = tuple(str(arg) for _, arg in steps)
                    local = self.shared.get(keys)
                    if local is None:
                        local = self.shared[keys] = f"_s{len(self.shared)}"
                    return f"({local} if {local} is not _U else ({local} := {value}))"
                return value
            return f"_walk(c[{e.root.name!r}], {self.name(steps)}, c)"
        return f"_walk({self.expr(e.root)}, {self.name(steps)}, c)"

    def _binop(self, e: BinOp) -> str:
        left = self.expr(e.left)
        right = self.expr(e.right)
        if e.op == "and":
            return f"(bool({left}) and bool({right}))"
        if e.op == "or":
            return f"(bool({left}) or bool({right}))"
        op = self.name(_BINARY[e.op], "_b")
        if (e.op in _NUMERIC_ORDER and isinstance(e.right, Lit)
                and type(e.right.value) in (int, float)):
            # number on the right: the native comparison when the left is a number too
            if left in self.ints:
                code = f"({left} {e.op} {right})"
                self.bools.add(code)
                return code
            self.n += 1
            t = f"_t{self.n}"
            return (f"({t} {e.op} {right} if (type({t} := {left}) is int or type({t}) is "
                    f"float) else {op}({t}, {right}))")
        return f"{op}({left}, {right})"


def _statement_code(w: _Writer, st: Statement, program_run: Any, out: str,
                    fail: str | None = None) -> list[str]:
    """Lines setting ``out`` to the statement's outputs (a list), or the exception (with
    ``fail``, a rule's local: the exception is counted as that rule's failure instead, and
    the lines end in an ``else:`` the caller completes)."""
    lines = ["    try:"]
    if inlinable(st):
        fields = ", ".join(
            f"{_output_keys(f)[0]!r}: {w.expr(f.expr)}" for f in st.fields
            if isinstance(f, Field)
        )
        if st.where is None:
            lines.append(f"        {out} = [{{{fields}}}]")
        else:
            # (a literal WHERE by name: ``(1) is True`` would be a SyntaxWarning)
            cond = (w.name(st.where.value) if isinstance(st.where, Lit)
                    else w.expr(st.where))
            lines.append(f"        {out} = [{{{fields}}}] if ({cond}) is True else _EMPTY")
    else:
        lines.append(f"        {out} = {w.name(program_run, '_p')}(c)")
    if fail is None:
        lines += ["    except Exception as exc:", f"        {out} = exc"]
    else:
        lines += ["    except Exception as exc:", f"        _fail({fail}, exc)", "    else:"]
    return lines


def _single_code(w: _Writer, st: Statement, out: str, rule: str) -> list[str]:
    """An inlinable statement of one rule: ``out`` = its output dict, or None when the
    WHERE does not hold; an exception is counted as ``rule``'s failure; the lines end in
    an ``else:`` the caller completes."""
    fields = ", ".join(
        f"{_output_keys(f)[0]!r}: {w.expr(f.expr)}" for f in st.fields if isinstance(f, Field)
    )
    lines = ["    try:"]
    if st.where is None:
        lines.append(f"        {out} = {{{fields}}}")
    else:
        cond = w.name(st.where.value) if isinstance(st.where, Lit) else w.expr(st.where)
        test = cond if cond in w.bools else f"({cond}) is True"
        lines += [f"        if {test}:", f"            {out} = {{{fields}}}",
                  "        else:", f"            {out} = None"]
    lines += ["    except Exception as exc:", f"        _fail({rule}, exc)", "    else:"]
    return lines


class _Count:
    """A line of a plan's body that counts one event in a rule's metrics (``field``:
    passed or no_result): written ``R.metrics.FIELD += 1`` in ``run``, a local counter in
    ``many`` (added to the metrics once per batch)."""

    __slots__ = ("indent", "rule", "field")

    def __init__(self, indent: int, rule: str, field: str) -> None:
        self.indent = indent
        self.rule = rule
        self.field = field


_Line = str | _Count


def make_plan(rules: tuple[Rule, ...], kind: str, node: str,
              lookup: Callable[[str], Any], now: Callable[[], float]) -> Plan:
    """The plan running ``rules`` (enabled, in this order) for events of hook ``kind``."""
    ns: dict[str, Any] = {
        "_EMPTY": [], "_U": _UNSET, "_fail": _fail, "_act": _act, "_act1": _act1,
        "_act_copy": _act_copy, "_pk": _pk, "_pkp": _pkp,
        "_walk": _walk, "_num": _num, "bool": bool, "type": type, "int": int,
        "float": float, "list": list, "_Columns": Columns, "_new": dict.__new__,
        "_G": publish_getters(node, lookup, now) if kind == "message.publish"
        else GETTERS[kind],
    }
    w = _Writer(ns)
    body: list[_Line]
    if kind == "message.publish":
        arg = "msg"
        body = [
            "    c = _new(_Columns)",  # Columns(_G, msg) without the __init__ call
            "    c.getters = _G",
            "    c.source = msg",
            "    c._json = _U",
            "    c['topic'] = v_topic = msg.topic",
            "    c['qos'] = v_qos = msg.qos",
            "    c['clientid'] = v_clientid = msg.publisher",
        ]
        w.columns = {"topic": "v_topic", "qos": "v_qos", "clientid": "v_clientid"}
        w.ints = {"v_qos"}
        w.pk = "_pkp"
    else:
        arg = "ev"
        body = ["    c = _Columns(_G, ev)"]
    head = len(body)
    groups: dict[str, str] = {}  # SQL text -> the local holding its outputs
    sharing = Counter(rule.sql.strip() for rule in rules)
    for rule in rules:
        r = w.name(rule, "_r")
        key = rule.sql.strip()
        if sharing[key] == 1 and inlinable(rule.program.statement):
            # the only rule with this SQL, inlined: its one output is a dict (or None)
            out = f"o{len(groups)}"
            groups[key] = out
            body += _single_code(w, rule.program.statement, out, r)
            body += [
                f"        if {out} is None:",
                _Count(12, r, "no_result"),
                "        else:",
                _Count(12, r, "passed"),
                *([f"            _act1({r}, {out}, c)"] if rule.actions else []),
            ]
            continue
        if sharing[key] == 1:
            # the only rule with this SQL: its accounting goes in the statement's try
            out = f"o{len(groups)}"
            groups[key] = out
            body += _statement_code(w, rule.program.statement, rule.program.run, out, r)
            body += [
                f"        if {out}:",
                _Count(12, r, "passed"),
                *([f"            _act({r}, {out}, c)"] if rule.actions else []),
                "        else:",
                _Count(12, r, "no_result"),
            ]
            continue
        shared = groups.get(key)
        again = shared is not None
        if shared is None:
            out = groups[key] = f"o{len(groups)}"
            body += _statement_code(w, rule.program.statement, rule.program.run, out)
        else:
            out = shared
        act = "_act_copy" if again else "_act"
        body += [
            f"    if type({out}) is list:",
            f"        if {out}:",
            _Count(12, r, "passed"),
            *([f"            {act}({r}, {out}, c)"] if rule.actions else []),
            "        else:",
            _Count(12, r, "no_result"),
            "    else:",
            f"        _fail({r}, {out})",
        ]
    body[head:head] = w.prelude()
    source = _render(arg, body)
    exec(compile(source, f"<rule plan {kind}>", "exec"), ns)
    return Plan(rules, kind, ns["run"], source, ns["many"])


def _render(arg: str, body: list[_Line]) -> str:
    """``run(arg)`` (one event) and ``many(batch)`` (the same body in a loop over a list
    of events, the counts kept in locals and added to the metrics once, at the end)."""
    run = [f"def run({arg}):"]
    counters: dict[tuple[str, str], str] = {}
    loop = []
    for line in body:
        if isinstance(line, _Count):
            run.append(f"{' ' * line.indent}{line.rule}.metrics.{line.field} += 1")
            name = counters.setdefault((line.rule, line.field), f"n{len(counters)}")
            loop.append(f"{' ' * (line.indent + 8)}{name} += 1")
        else:
            loop.append(f"        {line}")
            run.append(line)
    many = ["def many(batch):", *(f"    {n} = 0" for n in counters.values()),
            "    try:", f"        for {arg} in batch:", *loop, "    finally:",
            *(f"        {r}.metrics.{f} += {n}" for (r, f), n in counters.items()),
            *([] if counters else ["        pass"])]
    return "\n".join(run) + "\n\n\n" + "\n".join(many) + "\n"
