"""Parse EMQX 5 rule SQL into a :class:`~gateway.rules.ast.Statement` (lark, LALR).

The grammar (``_GRAMMAR``) is EMQX's rule SQL:

- ``SELECT fields FROM "filter"[, "filter"...] [WHERE cond]``
- ``FOREACH expr [AS name] [DO fields] [INCASE cond] FROM ... [WHERE cond]``
- fields: ``*`` or ``expr [AS name[.name...]]``; expressions with ``OR``, ``AND``, ``NOT``,
  comparisons (``= != <> < <= > >=``, ``=~`` topic match), ``[NOT] IN (...)``, ``+ - * /``,
  ``div``, ``mod``, unary minus, function calls, ``CASE [x] WHEN .. THEN .. [ELSE ..] END``,
  array literals ``[a, b]``, nested access ``a.b.c`` and ``a[1]`` (1-based, evaluated).
- strings in single or double quotes (backslash escapes); keywords in any case.

Errors raise :class:`SqlError` whose message names the line and column
("line 1, column 24: unexpected 'FORM'"); positions are 1-based.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

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

__all__ = ["SqlError", "parse"]

_GRAMMAR = r"""
?start: select | foreach

select: _SELECT fields _FROM sources where?
foreach: _FOREACH expr item_as? do? incase? _FROM sources where?
item_as: _AS NAME
do: _DO fields
incase: _INCASE expr
where: _WHERE expr

fields: field ("," field)*
field: "*"                     -> star
     | expr (_AS alias)?       -> column
alias: NAME ("." NAME)*
sources: STRING ("," STRING)*

?expr: or_expr
?or_expr: and_expr | or_expr _OR and_expr -> or_
?and_expr: not_expr | and_expr _AND not_expr -> and_
?not_expr: comparison | _NOT not_expr -> not_
?comparison: sum
    | sum COMP sum -> compare
    | sum _IN "(" args ")" -> in_
    | sum _NOT _IN "(" args ")" -> not_in
?sum: product | sum ADDOP product -> arith
?product: unary | product MULOP unary -> arith
?unary: postfix | "-" unary -> neg
?postfix: atom
    | postfix "." NAME -> key
    | postfix "[" expr "]" -> index
?atom: NUMBER -> number
    | STRING -> string
    | _TRUE -> true
    | _FALSE -> false
    | _NULL -> null
    | NAME "(" [args] ")" -> call
    | NAME -> var
    | "(" expr ")"
    | "[" [args] "]" -> array
    | _CASE [expr] when+ [_ELSE expr] _END -> case
when: _WHEN expr _THEN expr
args: expr ("," expr)*

COMP: "=~" | "!=" | "<>" | "<=" | ">=" | "=" | "<" | ">"
ADDOP: "+" | "-"
MULOP: "*" | "/" | /div\b/i | /mod\b/i
_SELECT: /select\b/i
_FOREACH: /foreach\b/i
_FROM: /from\b/i
_WHERE: /where\b/i
_AS: /as\b/i
_DO: /do\b/i
_INCASE: /incase\b/i
_OR: /or\b/i
_AND: /and\b/i
_NOT: /not\b/i
_IN: /in\b/i
_TRUE: /true\b/i
_FALSE: /false\b/i
_NULL: /(null|undefined)\b/i
_CASE: /case\b/i
_WHEN: /when\b/i
_THEN: /then\b/i
_ELSE: /else\b/i
_END: /end\b/i
NAME: /(?!(KEYWORDS)\b)[A-Za-z_][A-Za-z0-9_]*/i
    | /`[^`]+`/
NUMBER: /\d+(\.\d+)?([eE][+-]?\d+)?/
STRING: /"(\\[\s\S]|[^"\\])*"/ | /'(\\[\s\S]|[^'\\])*'/

%import common.WS
%ignore WS
"""


_KEYWORDS = (
    "select|foreach|from|where|as|do|incase|or|and|not|in|true|false|null|undefined|case|"
    "when|then|else|end|div|mod"
)
_GRAMMAR = _GRAMMAR.replace("KEYWORDS", _KEYWORDS)


class SqlError(ValueError):
    """A rule's SQL does not parse or does not compile; ``line``/``column`` are 1-based."""

    def __init__(self, message: str, line: int = 0, column: int = 0) -> None:
        where = f"line {line}, column {column}: " if line else ""
        super().__init__(where + message)
        self.line = line
        self.column = column


# Backslash escapes in string literals, as in Python's (and JSON's): the simple ones, \xHH,
# \uXXXX, \UXXXXXXXX, \N{name}, octal \ooo, and a backslash-newline that joins lines.
# An unknown escape (\q) keeps its backslash; a malformed one is an error.
_ESCAPE = re.compile(r"\\(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})"
                     r"|N\{([^}]*)\}|([0-7]{1,3})|([\s\S]))")
_SIMPLE = {"\n": "", "\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b", "f": "\f",
           "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_MALFORMED = {"x": "truncated \\xXX escape", "u": "truncated \\uXXXX escape",
              "U": "truncated \\UXXXXXXXX escape", "N": "malformed \\N character escape"}


def _unescape(body: str) -> str:
    """``body`` with its escapes decoded; ValueError (the reason) for a malformed one."""

    def one(m: re.Match[str]) -> str:
        hex2, hex4, hex8, name, octal, other = m.groups()
        if other is not None:
            if other in _MALFORMED:
                raise ValueError(_MALFORMED[other])
            return _SIMPLE.get(other, m.group())
        if name is not None:
            try:
                return unicodedata.lookup(name)
            except KeyError:
                raise ValueError("unknown Unicode character name") from None
        code = int(hex2 or hex4 or hex8, 16) if octal is None else int(octal, 8)
        if code > 0x10FFFF:
            raise ValueError("illegal Unicode character")
        return chr(code)

    return _ESCAPE.sub(one, body)


def _unquote(tok: Token) -> str:
    text = str(tok)
    body = text[1:-1]
    if "\\" not in body:
        return body
    try:
        return _unescape(body)
    except ValueError as exc:
        raise SqlError(f"bad escape in string {text}: {exc}", tok.line or 0,
                       tok.column or 0) from None


def _name(tok: Token | str) -> str:
    s = str(tok)
    return s[1:-1] if s.startswith("`") else s


@v_args(inline=True)
class _Build(Transformer[Token, Any]):
    def __init__(self, text: str) -> None:
        super().__init__()
        self._text = text

    # statements
    def select(self, fields: tuple[Field | Star, ...], sources: tuple[str, ...],
               where: tuple[str, Expr] | None = None) -> Statement:
        return Statement("select", fields, sources, None if where is None else where[1])

    def column(self, expr: Expr, *rest: Any) -> Field:
        text = str(rest[-1])
        alias = rest[0] if len(rest) == 2 else None
        return Field(expr, alias, text)

    def foreach(self, coll: Expr, *rest: Any) -> Statement:
        item, fields, incase, sources, where = "item", (), None, (), None
        for r in rest:
            if isinstance(r, tuple) and r and r[0] == "item_as":
                item = r[1]
            elif isinstance(r, tuple) and r and r[0] == "do":
                fields = r[1]
            elif isinstance(r, tuple) and r and r[0] == "incase":
                incase = r[1]
            elif isinstance(r, tuple) and r and r[0] == "where":
                where = r[1]
            else:
                sources = r
        return Statement("foreach", fields, sources, where, coll, item, incase)

    def item_as(self, name: Token) -> tuple[str, str]:
        return ("item_as", _name(name))

    def do(self, fields: tuple[Field | Star, ...]) -> tuple[str, Any]:
        return ("do", fields)

    def incase(self, e: Expr) -> tuple[str, Any]:
        return ("incase", e)

    def where(self, e: Expr) -> Any:
        return ("where", e)

    def fields(self, *fs: Field | Star) -> tuple[Field | Star, ...]:
        return fs

    def star(self) -> Star:
        return Star()

    def alias(self, *names: Token) -> tuple[str, ...]:
        return tuple(_name(n) for n in names)

    def sources(self, *toks: Token) -> tuple[str, ...]:
        return tuple(_unquote(t) for t in toks)

    # expressions
    def or_(self, a: Expr, b: Expr) -> Expr:
        return BinOp("or", a, b)

    def and_(self, a: Expr, b: Expr) -> Expr:
        return BinOp("and", a, b)

    def not_(self, a: Expr) -> Expr:
        return Not(a)

    def compare(self, a: Expr, op: Token, b: Expr) -> Expr:
        o = "!=" if str(op) == "<>" else str(op)
        return BinOp(o, a, b)

    def in_(self, a: Expr, items: tuple[Expr, ...]) -> Expr:
        return In(a, items)

    def not_in(self, a: Expr, items: tuple[Expr, ...]) -> Expr:
        return In(a, items, True)

    def arith(self, a: Expr, op: Token, b: Expr) -> Expr:
        return BinOp(str(op).lower(), a, b)

    def neg(self, a: Expr) -> Expr:
        if isinstance(a, Lit) and isinstance(a.value, int | float) and not isinstance(
            a.value, bool
        ):
            return Lit(-a.value)
        return Neg(a)

    def key(self, base: Expr, name: Token) -> Expr:
        step = Key(_name(name))
        if isinstance(base, Path):
            return Path(base.root, (*base.steps, step))
        return Path(base, (step,))

    def index(self, base: Expr, i: Expr) -> Expr:
        step = Index(i)
        if isinstance(base, Path):
            return Path(base.root, (*base.steps, step))
        return Path(base, (step,))

    def number(self, tok: Token) -> Expr:
        s = str(tok)
        return Lit(int(s) if s.isdigit() else float(s))

    def string(self, tok: Token) -> Expr:
        return Lit(_unquote(tok))

    def true(self) -> Expr:
        return Lit(True)

    def false(self) -> Expr:
        return Lit(False)

    def null(self) -> Expr:
        return Lit(None)

    def call(self, name: Token, args: tuple[Expr, ...] | None) -> Expr:
        return Call(_name(name).lower(), args or (), (name.line or 0, name.column or 0))

    def var(self, name: Token) -> Expr:
        return Var(_name(name))

    def array(self, args: tuple[Expr, ...] | None) -> Expr:
        return Array(args or ())

    def case(self, subject: Expr | None, *rest: Any) -> Expr:
        default = rest[-1]
        whens = tuple(rest[:-1])
        return Case(subject, whens, default)

    def when(self, cond: Expr, result: Expr) -> tuple[Expr, Expr]:
        return (cond, result)

    def args(self, *items: Expr) -> tuple[Expr, ...]:
        return items


_PARSER = Lark(_GRAMMAR, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def parse(text: str) -> Statement:
    """Parse one rule statement; :class:`SqlError` (with line and column) if it is not one."""
    try:
        tree = _PARSER.parse(text)
    except UnexpectedEOF as exc:
        line = text.count("\n") + 1
        col = len(text) - (text.rfind("\n") + 1) + 1
        msg = f"unexpected end of statement, expected {_expected(exc)}"
        raise SqlError(msg, line, col) from None
    except UnexpectedToken as exc:
        tok = exc.token
        if tok.type == "$END":
            line = text.count("\n") + 1
            col = len(text) - (text.rfind("\n") + 1) + 1
            raise SqlError(
                f"unexpected end of statement, expected {_expected(exc)}", line, col
            ) from None
        raise SqlError(
            f"unexpected {str(tok)!r}, expected {_expected(exc)}", exc.line, exc.column
        ) from None
    except UnexpectedCharacters as exc:
        pos = exc.pos_in_stream or 0
        ch = text[pos] if pos < len(text) else ""
        raise SqlError(f"unexpected character {ch!r}", exc.line, exc.column) from None
    except UnexpectedInput as exc:  # pragma: no cover - the three above are all lark raises
        raise SqlError(str(exc), exc.line, exc.column) from None
    # unaliased columns keep their source text as output key
    for node in tree.iter_subtrees():
        if node.data == "column":
            first = node.children[0]
            meta = first.meta if isinstance(first, Tree) else None
            if meta is not None and not meta.empty:
                start, end = meta.start_pos, meta.end_pos
            else:
                assert isinstance(first, Token)
                start, end = first.start_pos or 0, first.end_pos or 0
            node.children.append(Token("TEXT", text[start:end]))
    try:
        built = _Build(text).transform(tree)
    except VisitError as exc:  # lark wraps what a rule callback raises
        if isinstance(exc.orig_exc, SqlError):
            raise exc.orig_exc from None
        raise
    assert isinstance(built, Statement)
    return built


_NAMES = {
    "_SELECT": "SELECT", "_FROM": "FROM", "_WHERE": "WHERE", "_AS": "AS", "_DO": "DO",
    "_INCASE": "INCASE", "_OR": "OR", "_AND": "AND", "_NOT": "NOT", "_IN": "IN",
    "_CASE": "CASE", "_WHEN": "WHEN", "_THEN": "THEN", "_ELSE": "ELSE", "_END": "END",
    "_FOREACH": "FOREACH", "LPAR": "'('", "RPAR": "')'", "COMMA": "','", "STAR": "'*'",
    "LSQB": "'['", "RSQB": "']'", "DOT": "'.'", "MINUS": "'-'", "$END": "end",
    "_TRUE": "TRUE", "_FALSE": "FALSE", "_NULL": "NULL", "NAME": "a name",
    "NUMBER": "a number", "STRING": "a string", "COMP": "a comparison",
    "ADDOP": "'+' or '-'", "MULOP": "'*', '/', div or mod",
}


def _expected(exc: UnexpectedInput) -> str:
    exp = getattr(exc, "expected", None) or getattr(exc, "accepts", None) or set()
    names = sorted({_NAMES.get(e, e.lower()) for e in exp}, key=lambda n: (n[0] in "'", n))
    return " or ".join(names[:6]) + (" ..." if len(names) > 6 else "") if names else "more"
