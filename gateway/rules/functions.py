"""The SQL functions of the rule engine, with EMQX 5's names and semantics.

:data:`FUNCTIONS` maps a lower-case name to a :class:`Func` (callable + arity range); the
compiler looks every call up at load time, so an unknown name or a wrong number of
arguments is a load-time error, never a per-message one. A function raises
:class:`RuleEvalError` (or any exception) on bad input: the rule counts a failure for
that message and delivery is not disturbed.

Conventions (EMQX's): positions in strings are 0-based (``substr``), in arrays 1-based
(``nth``, ``sublist``); hashes return lower-case hex; time functions take a unit
``'second' | 'millisecond' | 'microsecond' | 'nanosecond'`` (default second); a missing
value is ``None`` (EMQX's ``undefined``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import operator
import random
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from functools import lru_cache
from typing import Any, TypeVar

__all__ = ["FUNCTIONS", "Func", "RuleEvalError", "to_json", "to_str"]


class RuleEvalError(ValueError):
    """A function or operator got input it cannot handle (one message fails, not the rule)."""


@dataclass(frozen=True, slots=True)
class Func:
    fn: Callable[..., Any]
    min_args: int
    max_args: int  # -1: any number


FUNCTIONS: dict[str, Func] = {}


_F = TypeVar("_F", bound=Callable[..., Any])


def _reg(name: str, lo: int, hi: int | None = None) -> Callable[[_F], _F]:
    def deco(fn: _F) -> _F:
        FUNCTIONS[name] = Func(fn, lo, lo if hi is None else hi)
        return fn

    return deco


# -- conversions shared with the evaluator ------------------------------------------------


def _json_default(o: Any) -> Any:
    if isinstance(o, bytes | bytearray):
        return o.decode("utf-8", "replace")
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    raise TypeError(f"cannot encode {type(o).__name__} as JSON")


def to_json(v: Any) -> str:
    """Compact JSON text (bytes as UTF-8 text)."""
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False, default=_json_default)


def to_str(v: Any) -> str:
    """EMQX's ``str``: text as is, numbers in decimal, booleans true/false, maps and
    arrays as JSON, undefined as ``undefined``."""
    if isinstance(v, str):
        return v
    if v is None:
        return "undefined"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, bytes | bytearray):
        return bytes(v).decode("utf-8", "replace")
    if isinstance(v, float):
        return _float_str(v)
    if isinstance(v, int):
        return str(v)
    return to_json(v)


def _float_str(f: float, decimals: int = 10) -> str:
    if f == int(f) and abs(f) < 1e15:
        return f"{f:.1f}"
    s = f"{f:.{decimals}f}".rstrip("0")
    return s + "0" if s.endswith(".") else s


def _num(v: Any) -> int | float:
    if isinstance(v, bool):
        raise RuleEvalError(f"not a number: {v!r}")
    if isinstance(v, int | float):
        return v
    if isinstance(v, str | bytes):
        s = v.decode() if isinstance(v, bytes) else v
        try:
            return int(s)
        except ValueError:
            try:
                return float(s)
            except ValueError:
                pass
    raise RuleEvalError(f"not a number: {v!r}")


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bytes | bytearray):
        return bytes(v).decode("utf-8", "replace")
    if v is None:
        raise RuleEvalError("undefined where a string is needed")
    return to_str(v)


def _bin(v: Any) -> bytes:
    if isinstance(v, bytes | bytearray):
        return bytes(v)
    return _text(v).encode()


def _list(v: Any) -> list[Any]:
    if isinstance(v, list):
        return v
    if isinstance(v, tuple):
        return list(v)
    raise RuleEvalError(f"not an array: {v!r}")


def _map(v: Any) -> dict[str, Any]:
    if isinstance(v, dict):
        return v
    if isinstance(v, str | bytes):
        try:
            d = json.loads(v)
        except ValueError:
            d = None
        if isinstance(d, dict):
            return d
    raise RuleEvalError(f"not a map: {v!r}")


# -- math ---------------------------------------------------------------------------------

for _name, _f in {
    "acos": math.acos, "acosh": math.acosh, "asin": math.asin, "asinh": math.asinh,
    "atan": math.atan, "atanh": math.atanh, "cos": math.cos, "cosh": math.cosh,
    "exp": math.exp, "log": math.log, "log10": math.log10, "log2": math.log2,
    "sin": math.sin, "sinh": math.sinh, "sqrt": math.sqrt, "tan": math.tan,
    "tanh": math.tanh,
}.items():
    FUNCTIONS[_name] = Func((lambda f: lambda x: float(f(_num(x))))(_f), 1, 1)


@_reg("abs", 1)
def _abs(x: Any) -> int | float:
    return abs(_num(x))


@_reg("ceil", 1)
def _ceil(x: Any) -> int:
    return math.ceil(_num(x))


@_reg("floor", 1)
def _floor(x: Any) -> int:
    return math.floor(_num(x))


@_reg("round", 1)
def _round(x: Any) -> int:
    n = _num(x)  # Erlang round: halves away from zero
    return math.floor(abs(n) + 0.5) * (1 if n >= 0 else -1)


@_reg("fmod", 2)
def _fmod(x: Any, y: Any) -> float:
    return math.fmod(_num(x), _num(y))


@_reg("power", 2)
def _power(x: Any, y: Any) -> float:
    return float(math.pow(_num(x), _num(y)))


@_reg("random", 0)
def _random() -> float:
    return random.random()


# -- type checks and conversion -----------------------------------------------------------


@_reg("str", 1)
def _str(x: Any) -> str:
    return to_str(x)


FUNCTIONS["str_utf8"] = FUNCTIONS["str"]


@_reg("int", 1)
def _int(x: Any) -> int:
    if x is True:
        return 1
    if x is False:
        return 0
    n = _num(x)
    return int(n)


def _bitop(op: Callable[[int, int], int]) -> Callable[[Any, Any], int]:
    return lambda a, b: op(_int(a), _int(b))


MAX_SHIFT = 1024  # bits: a rule must not build a number no message can carry


def _shift_left(a: int, b: int) -> int:
    if b > MAX_SHIFT:
        raise ValueError(f"bitsl: a shift of {b} bits is over {MAX_SHIFT}")
    return a << b


for _name, _bop in {
    "bitand": operator.and_, "bitor": operator.or_, "bitxor": operator.xor,
    "bitsl": _shift_left, "bitsr": operator.rshift,
}.items():
    FUNCTIONS[_name] = Func(_bitop(_bop), 2, 2)


@_reg("bitnot", 1)
def _bitnot(x: Any) -> int:
    return ~_int(x)


@_reg("float", 1, 2)
def _float(x: Any, decimals: Any = None) -> float:
    f = float(_num(x))
    return f if decimals is None else round(f, _int(decimals))


@_reg("float2str", 2)
def _float2str(x: Any, decimals: Any) -> str:
    return _float_str(float(_num(x)), _int(decimals))


@_reg("bool", 1)
def _bool(x: Any) -> bool:
    if isinstance(x, bool):
        return x
    if x in (1, "true", b"true", "1"):
        return True
    if x in (0, "false", b"false", "0"):
        return False
    raise RuleEvalError(f"not a boolean: {x!r}")


@_reg("map", 1)
def _mapf(x: Any) -> dict[str, Any]:
    return _map(x)


FUNCTIONS["is_null"] = Func(lambda x: x is None, 1, 1)
FUNCTIONS["is_not_null"] = Func(lambda x: x is not None, 1, 1)
FUNCTIONS["is_str"] = Func(lambda x: isinstance(x, str | bytes), 1, 1)
FUNCTIONS["is_bool"] = Func(lambda x: isinstance(x, bool), 1, 1)
FUNCTIONS["is_int"] = Func(lambda x: isinstance(x, int) and not isinstance(x, bool), 1, 1)
FUNCTIONS["is_float"] = Func(lambda x: isinstance(x, float), 1, 1)
FUNCTIONS["is_num"] = Func(
    lambda x: isinstance(x, int | float) and not isinstance(x, bool), 1, 1
)
FUNCTIONS["is_map"] = Func(lambda x: isinstance(x, dict), 1, 1)
FUNCTIONS["is_array"] = Func(lambda x: isinstance(x, list), 1, 1)


# -- strings ------------------------------------------------------------------------------

FUNCTIONS["lower"] = Func(lambda s: _text(s).lower(), 1, 1)
FUNCTIONS["upper"] = Func(lambda s: _text(s).upper(), 1, 1)
FUNCTIONS["trim"] = Func(lambda s: _text(s).strip(), 1, 1)
FUNCTIONS["ltrim"] = Func(lambda s: _text(s).lstrip(), 1, 1)
FUNCTIONS["rtrim"] = Func(lambda s: _text(s).rstrip(), 1, 1)
FUNCTIONS["reverse"] = Func(lambda s: _text(s)[::-1], 1, 1)
FUNCTIONS["strlen"] = Func(lambda s: len(_text(s)), 1, 1)


@_reg("ascii", 1, 1)
def _ascii(s: Any) -> int:
    text = _text(s)
    if not text:
        raise RuleEvalError("ascii: empty string")
    return ord(text[0])


@_reg("concat", 2, -1)
def _concat(*parts: Any) -> str:
    return "".join(to_str(p) for p in parts)


@_reg("substr", 2, 3)
def _substr(s: Any, start: Any, length: Any = None) -> str:
    t, i = _text(s), _int(start)
    if i < 0:
        raise RuleEvalError(f"substr: negative start {i}")
    return t[i:] if length is None else t[i : i + _int(length)]


@_reg("split", 2, 3)
def _split(s: Any, sep: Any, how: Any = None) -> list[str]:
    parts = _text(s).split(_text(sep))
    if how == "notrim":
        return parts
    if how == "leading_trim":
        while parts and parts[0] == "":
            parts.pop(0)
        return parts
    if how == "trailing_trim":
        while parts and parts[-1] == "":
            parts.pop()
        return parts
    return [p for p in parts if p != ""]


@_reg("tokens", 2, 3)
def _tokens(s: Any, seps: Any, nocrlf: Any = None) -> list[str]:
    chars = _text(seps) + ("\r\n" if nocrlf == "nocrlf" else "")
    return [t for t in re.split("[" + re.escape(chars) + "]", _text(s)) if t]


@_reg("replace", 3, 4)
def _replace(s: Any, old: Any, new: Any, how: Any = "all") -> str:
    t, o, n = _text(s), _text(old), _text(new)
    if how == "all":
        return t.replace(o, n)
    if how == "leading":
        return t.replace(o, n, 1)
    if how == "trailing":
        i = t.rfind(o)
        return t if i < 0 else t[:i] + n + t[i + len(o) :]
    raise RuleEvalError(f"replace: unknown mode {how!r}")


@lru_cache(maxsize=256)
def _re(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise RuleEvalError(f"bad regular expression {pattern!r}: {exc}") from None


FUNCTIONS["regex_match"] = Func(lambda s, p: _re(_text(p)).search(_text(s)) is not None, 2, 2)


@_reg("regex_replace", 3)
def _regex_replace(s: Any, p: Any, r: Any) -> str:
    # EMQX (re:replace) writes groups as \1 or \g{1}; Python's re.sub takes \1 and \g<1>
    repl = re.sub(r"\\g\{(\d+)\}", r"\\g<\1>", _text(r))
    return _re(_text(p)).sub(repl, _text(s))


@_reg("regex_extract", 2)
def _regex_extract(s: Any, p: Any) -> list[str]:
    m = _re(_text(p)).search(_text(s))
    if m is None:
        return []
    return [g or "" for g in m.groups()] if m.groups() else [m.group(0)]


@_reg("find", 2, 3)
def _find(s: Any, sub: Any, how: Any = "leading") -> str:
    t, u = _text(s), _text(sub)
    i = t.find(u) if how != "trailing" else t.rfind(u)
    return "" if i < 0 else t[i:]


@_reg("pad", 2, 4)
def _pad(s: Any, n: Any, how: Any = "trailing", char: Any = " ") -> str:
    t, width, c = _text(s), _int(n), _text(char)[:1] or " "
    if how == "leading":
        return t.rjust(width, c)
    if how == "both":
        return t.center(width, c)
    return t.ljust(width, c)


@_reg("join_to_string", 2)
def _join(sep: Any, items: Any) -> str:
    return _text(sep).join(to_str(i) for i in _list(items))


@_reg("unescape", 1)
def _unescape(s: Any) -> str:
    return _text(s).encode("latin-1", "backslashreplace").decode("unicode_escape")


_FMT = re.compile(r"~(-?\d*)(?:\.(\d+))?([spwdfen~])")


@_reg("sprintf", 1, -1)
def _sprintf(fmt: Any, *args: Any) -> str:
    """Erlang ``io_lib:format``: ``~s`` (text), ``~p``/``~w`` (term), ``~d``, ``~f``,
    ``~e``, ``~n`` (newline), ``~~``."""
    it = iter(args)

    def sub(m: re.Match[str]) -> str:
        c = m.group(3)
        if c == "~":
            return "~"
        if c == "n":
            return "\n"
        try:
            a = next(it)
        except StopIteration:
            raise RuleEvalError("sprintf: too few arguments") from None
        if c == "s":
            return _text(a)
        if c == "d":
            return str(_int(a))
        if c == "f":
            prec = int(m.group(2)) if m.group(2) else 6
            return f"{float(_num(a)):.{prec}f}"
        if c == "e":
            return f"{float(_num(a)):e}"
        return to_json(a) if isinstance(a, dict | list) else to_str(a)

    return _FMT.sub(sub, _text(fmt))


# -- maps and arrays ----------------------------------------------------------------------


def _path(key: Any) -> list[str]:
    return _text(key).split(".")


@_reg("map_get", 2, 3)
def _map_get(key: Any, m: Any, default: Any = None) -> Any:
    cur: Any = _map(m)
    for k in _path(key):
        if not isinstance(cur, dict) or k not in cur:
            return default
        cur = cur[k]
    return cur


FUNCTIONS["mget"] = FUNCTIONS["map_get"]


@_reg("map_put", 3)
def _map_put(key: Any, value: Any, m: Any) -> dict[str, Any]:
    out = dict(_map(m))
    keys = _path(key)
    cur = out
    for k in keys[:-1]:
        nxt = cur.get(k)
        nxt = dict(nxt) if isinstance(nxt, dict) else {}
        cur[k] = nxt
        cur = nxt
    cur[keys[-1]] = value
    return out


FUNCTIONS["mput"] = FUNCTIONS["map_put"]
FUNCTIONS["map_keys"] = Func(lambda m: list(_map(m).keys()), 1, 1)
FUNCTIONS["map_values"] = Func(lambda m: list(_map(m).values()), 1, 1)
FUNCTIONS["map_to_entries"] = Func(
    lambda m: [{"key": k, "value": v} for k, v in _map(m).items()], 1, 1
)


@_reg("nth", 2)
def _nth(n: Any, items: Any) -> Any:
    lst, i = _list(items), _int(n)
    if not 1 <= i <= len(lst):
        raise RuleEvalError(f"nth: index {i} out of 1..{len(lst)}")
    return lst[i - 1]


@_reg("length", 1)
def _length(x: Any) -> int:
    if isinstance(x, dict):
        return len(x)
    return len(_list(x))


@_reg("sublist", 2, 3)
def _sublist(a: Any, b: Any, c: Any = None) -> list[Any]:
    if c is None:
        return _list(b)[: _int(a)]
    start = _int(a)
    return _list(c)[start - 1 : start - 1 + _int(b)]


@_reg("first", 1)
def _first(x: Any) -> Any:
    lst = _list(x)
    if not lst:
        raise RuleEvalError("first: empty array")
    return lst[0]


@_reg("last", 1)
def _last(x: Any) -> Any:
    lst = _list(x)
    if not lst:
        raise RuleEvalError("last: empty array")
    return lst[-1]


FUNCTIONS["contains"] = Func(lambda item, xs: item in _list(xs), 2, 2)


@_reg("coalesce", 1, -1)
def _coalesce(*xs: Any) -> Any:
    if len(xs) == 1 and isinstance(xs[0], list):
        xs = tuple(xs[0])
    return next((x for x in xs if x is not None and x != ""), None)


# -- JSON, encodings, hashes --------------------------------------------------------------


@_reg("json_decode", 1)
def _json_decode(s: Any) -> Any:
    try:
        return json.loads(_bin(s))
    except ValueError as exc:
        raise RuleEvalError(f"json_decode: {exc}") from None


FUNCTIONS["json_encode"] = Func(to_json, 1, 1)
FUNCTIONS["base64_encode"] = Func(lambda s: base64.b64encode(_bin(s)).decode(), 1, 1)


@_reg("base64_decode", 1)
def _b64d(s: Any) -> str | bytes:
    try:
        raw = base64.b64decode(_bin(s), validate=True)
    except binascii.Error as exc:
        raise RuleEvalError(f"base64_decode: {exc}") from None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw


FUNCTIONS["bin2hexstr"] = Func(lambda s: _bin(s).hex().upper(), 1, 1)


@_reg("hexstr2bin", 1)
def _hex2bin(s: Any) -> str | bytes:
    try:
        raw = bytes.fromhex(_text(s))
    except ValueError as exc:
        raise RuleEvalError(f"hexstr2bin: {exc}") from None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw


FUNCTIONS["md5"] = Func(lambda s: hashlib.md5(_bin(s)).hexdigest(), 1, 1)
FUNCTIONS["sha"] = Func(lambda s: hashlib.sha1(_bin(s)).hexdigest(), 1, 1)
FUNCTIONS["sha256"] = Func(lambda s: hashlib.sha256(_bin(s)).hexdigest(), 1, 1)
FUNCTIONS["uuid_v4"] = Func(lambda: str(uuid.uuid4()), 0, 0)
FUNCTIONS["uuid_v4_no_hyphen"] = Func(lambda: uuid.uuid4().hex, 0, 0)


# -- time ---------------------------------------------------------------------------------

_UNITS = {"second": 1, "millisecond": 1_000, "microsecond": 1_000_000, "nanosecond": 10**9}


def _unit(u: Any) -> int:
    try:
        return _UNITS[_text(u)]
    except KeyError:
        raise RuleEvalError(f"unknown time unit {u!r}") from None


@_reg("now_timestamp", 0, 1)
def _now_ts(unit: Any = "second") -> int:
    return int(time.time_ns() * _unit(unit) // 10**9)


def _tz(offset: Any) -> timezone:
    if offset in (None, "Z", "z", "utc", "UTC"):
        return UTC
    if isinstance(offset, int):
        return timezone(timedelta(seconds=offset))
    m = re.fullmatch(r"([+-])(\d\d):?(\d\d)", _text(offset))
    if m is None:
        if offset == "local":
            return datetime.now().astimezone().tzinfo or UTC  # type: ignore[return-value]
        raise RuleEvalError(f"bad time offset {offset!r}")
    secs = int(m.group(2)) * 3600 + int(m.group(3)) * 60
    return timezone(timedelta(seconds=secs if m.group(1) == "+" else -secs))


def _rfc3339(ts: int | float, unit: int, tz: timezone = UTC) -> str:
    secs, frac = divmod(int(ts), unit)
    dt = datetime.fromtimestamp(secs, tz)
    base = dt.strftime("%Y-%m-%dT%H:%M:%S")
    digits = {1: 0, 1_000: 3, 1_000_000: 6, 10**9: 9}[unit]
    if digits:
        base += f".{frac:0{digits}d}"
    off = dt.strftime("%z")
    return base + (off[:3] + ":" + off[3:] if off not in ("+0000", "") else "Z")


@_reg("now_rfc3339", 0, 1)
def _now_rfc3339(unit: Any = "second") -> str:
    u = _unit(unit)
    return _rfc3339(time.time_ns() * u // 10**9, u)


@_reg("unix_ts_to_rfc3339", 1, 2)
def _ts_to_rfc3339(ts: Any, unit: Any = "second") -> str:
    return _rfc3339(_int(ts), _unit(unit))


@_reg("rfc3339_to_unix_ts", 1, 2)
def _rfc3339_to_ts(s: Any, unit: Any = "second") -> int:
    try:
        dt = datetime.fromisoformat(_text(s).replace("Z", "+00:00"))
    except ValueError as exc:
        raise RuleEvalError(f"rfc3339_to_unix_ts: {exc}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return round(dt.timestamp() * _unit(unit))


@_reg("format_date", 3, 4)
def _format_date(unit: Any, offset: Any, fmt: Any, ts: Any = None) -> str:
    """``strftime`` directives (%Y %m %d %H %M %S %z ...) plus EMQX's %N (nanoseconds),
    %3N (milliseconds), %6N (microseconds)."""
    u = _unit(unit)
    t = _int(ts) if ts is not None else time.time_ns() * u // 10**9
    secs, frac = divmod(t, u)
    nanos = frac * (10**9 // u)
    dt = datetime.fromtimestamp(secs, _tz(offset))
    f = _text(fmt).replace("%3N", f"{nanos // 10**6:03d}").replace("%6N", f"{nanos // 1000:06d}")
    f = f.replace("%N", f"{nanos:09d}").replace("%s", str(secs))
    return dt.strftime(f)


@_reg("date_to_unix_ts", 3, 4)
def _date_to_ts(unit: Any, a: Any, b: Any, c: Any = None) -> int:
    offset, fmt, s = (None, a, b) if c is None else (a, b, c)
    try:
        dt = datetime.strptime(_text(s), _text(fmt))
    except ValueError as exc:
        raise RuleEvalError(f"date_to_unix_ts: {exc}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=_tz(offset))
    return round(dt.timestamp() * _unit(unit))


@_reg("timezone_to_offset_seconds", 1)
def _tz_offset(s: Any) -> int:
    off = _tz(s).utcoffset(None)
    return int(off.total_seconds()) if off is not None else 0
