"""The value syntaxes of the configuration: durations, sizes, rates, bind addresses,
networks and topic filters as annotated types that parse what the file and the
environment may write, and the base of every section (unknown keys are errors)."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
)

# ------------------------------------------------------------------ value syntaxes

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
}
_SIZE_RE = re.compile(r"(\d+)\s*([kmg]?b?)", re.IGNORECASE)

DURATION_HINT = 'expected a duration such as 30, "500ms", "30s", "5m", "2h" or "1d"'
SIZE_HINT = 'expected a size such as 1024, "64KB", "1MB" or "1GB"'


def parse_duration(value: object) -> float:
    """Seconds from an int/float of seconds or a string with a unit (ms, s, m, h, d).

    A string without a unit is seconds. Raises ``ValueError`` for anything else; the
    range (non-negative) is checked by the field that uses it.
    """
    if isinstance(value, bool):
        raise ValueError(DURATION_HINT)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        match = _DURATION_RE.fullmatch(value.strip())
        if match:
            number, unit = match.groups()
            return float(number) * _DURATION_UNITS[(unit or "s").lower()]
    raise ValueError(DURATION_HINT)


def parse_size(value: object) -> int:
    """Bytes from an int of bytes or a string with a unit (B, KB, MB, GB; 1024-based)."""
    if isinstance(value, bool):
        raise ValueError(SIZE_HINT)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        match = _SIZE_RE.fullmatch(value.strip())
        if match:
            number, unit = match.groups()
            return int(number) * _SIZE_UNITS[unit.lower()]
    raise ValueError(SIZE_HINT)


_HOSTNAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?")
BIND_HINT = 'expected "host:port"'


def parse_bind(bind: str) -> tuple[str, int]:
    """Split ``"host:port"`` (IPv6 as ``"[::1]:1883"``) into ``(host, port)``.

    The host comes back without brackets. Raises ``ValueError`` with a short reason.
    """
    host, sep, port_text = bind.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(BIND_HINT)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{BIND_HINT} with a valid IPv6 address in brackets") from None
    elif ":" in host:
        raise ValueError(f'{BIND_HINT} with IPv6 addresses in brackets, as in "[::1]:1883"')
    elif not _HOSTNAME_RE.fullmatch(host):
        raise ValueError(f"{BIND_HINT} with a valid host name or IPv4 address")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"{BIND_HINT} with a port in 0..65535")
    return host, port


def _normalise_bind(value: object) -> object:
    # EMQX accepts a bare port (bind = 1883) meaning every IPv4 interface.
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= 65535:
            raise ValueError(f"{BIND_HINT} or a port in 0..65535")
        return f"0.0.0.0:{value}"
    if isinstance(value, str):
        parse_bind(value)
    return value


def _check_network(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError('expected an IP address or CIDR such as "10.0.0.0/8"') from None
    return value


def _split_commas(value: object) -> object:
    # Convenient from the environment: GATEWAY_..._ALLOW=10.0.0.0/8,192.168.0.0/16
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _check_topic_filter(value: str) -> str:
    """An authorization topic: an MQTT topic filter, or ``"eq <filter>"`` (literal match)."""
    filter_ = value[3:] if value.startswith("eq ") else value
    if not filter_:
        raise ValueError("expected a non-empty topic filter")
    levels = filter_.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            raise ValueError('"#" must be a whole level and the last one')
        if "+" in level and level != "+":
            raise ValueError('"+" must be a whole level')
    return value


Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
"""Seconds, as float; written as a number of seconds or ``"500ms"``, ``"30s"``, ``"2h"``..."""
Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
"""Bytes, as int; written as a number of bytes or ``"64KB"``, ``"1MB"``, ``"1GB"``."""
Bind = Annotated[str, BeforeValidator(_normalise_bind)]
Network = Annotated[str, AfterValidator(_check_network)]
TopicFilter = Annotated[str, AfterValidator(_check_topic_filter)]

_RATE_RE = re.compile(
    r"(\d+(?:\.\d+)?)\s*([kmg]?b?)\s*/\s*(\d+(?:\.\d+)?)?\s*(ms|s|m|h|d)", re.IGNORECASE
)
RATE_HINT = 'expected a rate such as 100, "100/s", "1000/m", "50/10s" or "infinity"'
BYTE_RATE_HINT = 'expected a byte rate such as 1048576, "1MB/s", "512KB/s" or "infinity"'


def _parse_rate(value: object, *, sizes: bool, hint: str) -> float:
    if isinstance(value, bool):
        raise ValueError(hint)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("infinity", "0"):
            return 0.0
        match = _RATE_RE.fullmatch(text)
        if match:
            number, unit, per, per_unit = match.groups()
            if unit and not sizes:
                raise ValueError(hint)
            seconds = float(per or 1) * _DURATION_UNITS[per_unit.lower()]
            if seconds > 0:
                return float(number) * _SIZE_UNITS[unit.lower()] / seconds
    raise ValueError(hint)


def parse_rate(value: object) -> float:
    """Events per second from a number (per second), ``"N/s"``, ``"N/m"``, ``"N/10s"``...;
    ``"infinity"`` (or 0) is 0.0, meaning no limit."""
    return _parse_rate(value, sizes=False, hint=RATE_HINT)


def parse_byte_rate(value: object) -> float:
    """Bytes per second from a number or ``"1MB/s"``, ``"512KB/s"``, ``"10MB/m"`` (sizes
    are 1024-based, as for sizes); ``"infinity"`` (or 0) is 0.0, meaning no limit."""
    return _parse_rate(value, sizes=True, hint=BYTE_RATE_HINT)


Rate = Annotated[float, BeforeValidator(parse_rate), Field(ge=0)]
"""Events per second, as float (0: no limit); written ``100``, ``"100/s"``, ``"6000/m"``."""
ByteRate = Annotated[float, BeforeValidator(parse_byte_rate), Field(ge=0)]
"""Bytes per second, as float (0: no limit); written ``1048576``, ``"1MB/s"``."""

LogLevel = Literal["debug", "info", "warning", "error"]
MqueueOverflow = Literal["drop_oldest", "drop_newest"]
SharedStrategy = Literal[
    "random",
    "round_robin",
    "round_robin_per_group",
    "sticky",
    "local",
    "hash_clientid",
    "hash_topic",
]
Permission = Literal["allow", "deny"]
AuthzAction = Literal["publish", "subscribe", "all"]

# MQTT's largest packet: 1 byte header + 4 bytes remaining length + 268,435,455 bytes.
MAX_MQTT_PACKET = 268_435_460
# MQTT 5 session expiry is a four-byte integer of seconds (0xFFFFFFFF: never expires).
MAX_SESSION_EXPIRY = 0xFFFF_FFFF


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        coerce_numbers_to_str=True,
    )


# ------------------------------------------------------------------ sections



def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


