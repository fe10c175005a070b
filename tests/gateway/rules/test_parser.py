"""The rule SQL parser: EMQX's statements, errors with positions, and a round-trip
property (any tree renders to SQL that parses back to the same tree)."""

from __future__ import annotations

import ast as pyast
import re
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.rules.ast import (
    Array,
    BinOp,
    Call,
    Case,
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
    render,
)
from gateway.rules.parser import SqlError, _unescape, parse

# hypothesis warns that a failing tree's repr would be large; that is expected here
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")

P = Path
pt = Var("payload")


def test_select_from_where() -> None:
    st_ = parse('SELECT payload.t AS t, clientid FROM "sensors/+/temp" WHERE payload.t > 30')
    assert st_ == Statement(
        "select",
        (Field(P(pt, (Key("t"),)), ("t",)), Field(Var("clientid"))),
        ("sensors/+/temp",),
        BinOp(">", P(pt, (Key("t"),)), Lit(30)),
    )


def test_keywords_any_case_and_names_that_start_like_keywords() -> None:
    a = parse('select android, order_id, notes, incase_x FROM "t" where android = 1')
    assert [f.expr for f in a.fields if isinstance(f, Field)] == [
        Var("android"), Var("order_id"), Var("notes"), Var("incase_x")
    ]


def test_several_sources_and_events() -> None:
    s = parse("SELECT * FROM \"a/#\", '$events/client_connected', \"b/+\"")
    assert s.sources == ("a/#", "$events/client_connected", "b/+")
    assert s.fields == (Star(),)


def test_foreach_do_incase() -> None:
    s = parse('FOREACH payload.sensors AS s DO s.name AS n, s.v INCASE s.v > 1 '
              'FROM "t/#" WHERE clientid = "c1"')
    assert s.kind == "foreach"
    assert s.collection == P(pt, (Key("sensors"),))
    assert s.item == "s"
    assert s.incase == BinOp(">", P(Var("s"), (Key("v"),)), Lit(1))
    assert s.where == BinOp("=", Var("clientid"), Lit("c1"))
    assert len(s.fields) == 2


def test_foreach_minimal() -> None:
    s = parse('FOREACH payload.list FROM "t"')
    assert (s.kind, s.fields, s.item, s.incase) == ("foreach", (), "item", None)


def test_operators_and_precedence() -> None:
    e = parse('SELECT 1 + 2 * 3 div 4 mod 5 - -x AS v FROM "t"').fields[0]
    assert isinstance(e, Field)
    assert e.expr == BinOp(
        "-",
        BinOp("+", Lit(1), BinOp("mod", BinOp("div", BinOp("*", Lit(2), Lit(3)), Lit(4)),
                                  Lit(5))),
        Neg(Var("x")),
    )
    w = parse('SELECT a FROM "t" WHERE NOT a = 1 OR b <> 2 AND topic =~ "x/#"').where
    assert w == BinOp("or", Not(BinOp("=", Var("a"), Lit(1))),
                      BinOp("and", BinOp("!=", Var("b"), Lit(2)),
                            BinOp("=~", Var("topic"), Lit("x/#"))))


def test_nested_access_index_case_in_array_strings() -> None:
    s = parse("SELECT payload.list[1].v, x[-1], CASE WHEN a > 1 THEN 'big' ELSE \"small\" END,"
              " CASE a WHEN 1 THEN 'one' END, a IN (1, 'x'), a NOT IN (2), [1, 2.5, true, null],"
              " 'it\\'s' FROM \"t\"")
    exprs = [f.expr for f in s.fields if isinstance(f, Field)]
    assert exprs[0] == P(pt, (Key("list"), Index(Lit(1)), Key("v")))
    assert exprs[1] == P(Var("x"), (Index(Lit(-1)),))
    assert exprs[2] == Case(None, ((BinOp(">", Var("a"), Lit(1)), Lit("big")),), Lit("small"))
    assert exprs[3] == Case(Var("a"), ((Lit(1), Lit("one")),), None)
    assert exprs[4] == In(Var("a"), (Lit(1), Lit("x")))
    assert exprs[5] == In(Var("a"), (Lit(2),), True)
    assert exprs[6] == Array((Lit(1), Lit(2.5), Lit(True), Lit(None)))
    assert exprs[7] == Lit("it's")


def test_function_calls_lowercased_with_position() -> None:
    f = parse('SELECT\n  ABS(x) FROM "t"').fields[0]
    assert isinstance(f, Field) and isinstance(f.expr, Call)
    assert f.expr.name == "abs" and f.expr.pos == (2, 3)


def test_unaliased_text_kept() -> None:
    f = parse('SELECT abs(payload.x)  +  1 FROM "t"').fields[0]
    assert isinstance(f, Field) and f.text == "abs(payload.x)  +  1"


def test_alias_path() -> None:
    f = parse('SELECT a AS out.inner FROM "t"').fields[0]
    assert isinstance(f, Field) and f.alias == ("out", "inner")


@pytest.mark.parametrize(
    ("sql", "where", "what"),
    [
        ('SELECT a FORM "t"', "line 1, column 10", "unexpected 'FORM'"),
        ('SELECT a FROM', "line 1, column 14", "unexpected end of statement"),
        ('SELECT a,, b FROM "t"', "line 1, column 10", "unexpected ','"),
        ('SELECT a # b FROM "t"', "line 1, column 10", "unexpected character '#'"),
        ('SELECT a\nFROM "t"\nWHERE a >> 1', "line 3, column 10", "unexpected '>'"),
        ('SELECT "unterminated FROM "t"', "line 1, column 28", ""),
        ("", "line 1, column 1", "unexpected end"),
        ('SELECT a FROM t', "line 1, column 15", "unexpected 't'"),
        ("SELECT 'a\\x' AS y FROM \"t\"", "line 1, column 8",
         "bad escape in string 'a\\x': truncated \\xXX escape"),
        ('SELECT a FROM "t\\N{nope}"', "line 1, column 15", "bad escape in string"),
    ],
)
def test_errors_name_the_position(sql: str, where: str, what: str) -> None:
    with pytest.raises(SqlError) as exc:
        parse(sql)
    assert str(exc.value).startswith(where), str(exc.value)
    assert what in str(exc.value)


# -- the round-trip property --------------------------------------------------------------

_KW = {"select", "foreach", "from", "where", "as", "do", "incase", "or", "and", "not", "in",
       "true", "false", "null", "undefined", "case", "when", "then", "else", "end", "div",
       "mod"}
names = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True).filter(lambda s: s not in _KW)
literals = st.one_of(
    st.integers(min_value=0, max_value=10**6),
    st.floats(min_value=0, max_value=1e6, allow_nan=False).map(lambda f: round(f, 3)),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=8),
    st.booleans(),
    st.none(),
).map(Lit)


def _exprs(children: st.SearchStrategy) -> st.SearchStrategy:
    ops = st.sampled_from(["+", "-", "*", "/", "div", "mod", "=", "!=", "<", "<=", ">", ">=",
                           "=~", "and", "or"])
    steps = st.lists(st.one_of(names.map(Key), children.map(Index)), min_size=1, max_size=3)
    return st.one_of(
        st.builds(BinOp, ops, children, children),
        st.builds(Not, children),
        st.builds(Neg, children).filter(
            lambda n: not (isinstance(n.expr, Lit) and isinstance(n.expr.value, int | float)
                           and not isinstance(n.expr.value, bool))),
        st.builds(Call, names, st.lists(children, max_size=3).map(tuple)),
        st.builds(Path, names.map(Var), steps.map(tuple)),
        st.builds(In, children, st.lists(children, min_size=1, max_size=3).map(tuple),
                  st.booleans()),
        st.builds(Case, st.none() | children,
                  st.lists(st.tuples(children, children), min_size=1, max_size=2).map(tuple),
                  st.none() | children),
        st.builds(Array, st.lists(children, max_size=3).map(tuple)),
    )


exprs = st.recursive(st.one_of(literals, names.map(Var)), _exprs, max_leaves=12)
fields = st.lists(
    st.one_of(st.just(Star()),
              st.builds(Field, exprs, st.none() | st.lists(names, min_size=1, max_size=2)
                        .map(tuple))),
    min_size=1, max_size=4,
).map(tuple)
sources = st.lists(st.sampled_from(["t/#", "a/+/b", "$events/client_connected", "x"]),
                   min_size=1, max_size=3).map(tuple)


@st.composite
def statements(draw: st.DrawFn) -> Statement:
    if draw(st.booleans()):
        return Statement("select", draw(fields), draw(sources), draw(st.none() | exprs))
    return Statement("foreach", draw(st.just(()) | fields), draw(sources),
                     draw(st.none() | exprs), draw(exprs), draw(st.just("item") | names),
                     draw(st.none() | exprs))


@settings(max_examples=300, deadline=None)
@given(statements())
def test_round_trip(tree: Statement) -> None:
    assert parse(render(tree)) == tree


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_garbage_raises_sql_error_only(text: str) -> None:
    try:
        parse(text)
    except SqlError as exc:
        assert str(exc).startswith("line ")


def test_an_unknown_escape_keeps_its_backslash_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st_ = parse("SELECT 'a\\qb' AS y FROM \"t\"")
    assert "Lit(value='a\\\\qb')" in repr(st_), repr(st_)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="\\xuUN{}01aq'\"", max_size=12))
def test_string_literals_parse_or_raise_sql_error(body: str) -> None:
    """Escapes in a quoted string: a value, or a SqlError naming the position."""
    try:
        parse(f"SELECT '{body}' AS y FROM \"t\"")
    except SqlError as exc:
        assert exc.line >= 1 and exc.column >= 1


_BODY = re.compile(r"(\\[\s\S]|[^'\\])*")
_TOKEN = re.compile(r"\\[\s\S]|[^'\\]")


def _python_value(body: str) -> str | None:
    """What Python makes of the same literal (None: it refuses it), in triple quotes so
    that a line break is allowed; a bare double quote is escaped for the delimiters."""
    source = "".join('\\"' if t == '"' else t for t in _TOKEN.findall(body))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return str(pyast.literal_eval('"""' + source + '"""'))
        except (SyntaxError, ValueError):
            return None


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet="\\xuUN{}0123789aefqnt'\"\n", max_size=14))
def test_escapes_decode_as_python_decodes_them(body: str) -> None:
    """Differential: a string literal's value, or its refusal, is Python's for the same
    literal (an unknown escape keeps its backslash in both; a line break inside the
    string is itself, as in a triple-quoted Python string)."""
    if not _BODY.fullmatch(body):
        return  # an unescaped quote: not one string token
    try:
        got: str | None = _unescape(body)
    except ValueError:
        got = None
    assert got == _python_value(body), body


def test_a_string_may_span_lines_and_hold_escapes() -> None:
    """A line break inside a quoted string is part of it, escapes or not (the decoder
    before refused 'a<newline>b\\t' as an unterminated string)."""
    stmt = parse("SELECT 'a\nb\\t' AS y FROM \"t\"")
    assert "Lit(value='a\\nb\\t')" in repr(stmt), repr(stmt)
    stmt = parse("SELECT 'a\\\nb' AS y FROM \"t\"")  # backslash-newline joins the lines
    assert "Lit(value='ab')" in repr(stmt), repr(stmt)


SEEDS = [
    'SELECT payload.t AS t, clientid FROM "sensors/+/temp" WHERE payload.t > 30',
    'FOREACH payload.sensors AS s DO s.name, s.v * 2 AS v INCASE s.v > 1 FROM "t/#", "$events/x"',
    "SELECT CASE WHEN a = 1 THEN 'one' ELSE \"other\" END AS c, x[1], y div 2 FROM 't'",
]


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(SEEDS), st.lists(st.tuples(st.integers(0, 200), st.integers(0, 3),
                                                 st.text(max_size=3)), max_size=4))
def test_mutated_statements_parse_or_raise_sql_error(seed: str, edits: list) -> None:
    """A fuzz target: valid statements with characters deleted, replaced or inserted."""
    text = seed
    for pos, cut, insert in edits:
        pos %= len(text) + 1
        text = text[:pos] + insert + text[pos + cut:]
    try:
        parse(text)
    except SqlError as exc:
        assert exc.line >= 1 and exc.column >= 1
