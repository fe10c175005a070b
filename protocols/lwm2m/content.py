"""LwM2M content formats, sans-IO: payloads <-> ``[{"path": "/3/0/0", "value": ...}]``.

Decoded: text/plain (0), opaque (42), TLV (11542), OMA-JSON (11543), SenML JSON (110),
SenML CBOR (112), CoRE link format (40, for Discover). Encoded (writes, create): text,
opaque, TLV, and SenML JSON/CBOR (1.1 writes and composite operations). Values become
JSON values: integers, floats and booleans as such, strings as strings, opaque values
as base64, object links as ``"obj:inst"``.

Types come from the object model (:mod:`protocols.lwm2m.objects`) when the resource is
known; an unknown resource in TLV is given as a UTF-8 string when it decodes as one,
otherwise base64.

Rules: every decoder raises :class:`ContentError` (never anything else) on malformed
input; the TLV encoder and decoder are inverse for every value type.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Callable
from typing import Any

import cbor2

TEXT = 0
LINK_FORMAT = 40
OPAQUE = 42
SENML_JSON = 110
SENML_CBOR = 112
TLV = 11542
OMA_JSON = 11543

Entry = dict[str, Any]
TypeOf = Callable[[str], str | None]  # path -> "String" | "Integer" | ... | None


class ContentError(Exception):
    pass


def _no_types(path: str) -> str | None:
    return None


# ------------------------------------------------------------------ values


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def value_from_bytes(raw: bytes, typ: str | None) -> Any:
    """A TLV value of ``typ`` (the OMA type name) -> a JSON value."""
    t = (typ or "").lower()
    try:
        if t in ("integer", "time", "unsigned integer"):
            if len(raw) not in (1, 2, 4, 8):
                raise ContentError(f"integer of {len(raw)} bytes")
            return int.from_bytes(raw, "big", signed=t != "unsigned integer")
        if t == "float":
            if len(raw) == 4:
                return struct.unpack(">f", raw)[0]
            if len(raw) == 8:
                return struct.unpack(">d", raw)[0]
            raise ContentError(f"float of {len(raw)} bytes")
        if t == "boolean":
            if raw not in (b"\x00", b"\x01"):
                raise ContentError("boolean must be 0 or 1")
            return raw == b"\x01"
        if t == "objlnk":
            if len(raw) != 4:
                raise ContentError("objlnk must be 4 bytes")
            a, b = struct.unpack(">HH", raw)
            return f"{a}:{b}"
        if t == "opaque":
            return _b64(raw)
        if t == "string":
            return raw.decode()
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            return _b64(raw)
        return text if text.isprintable() else _b64(raw)
    except UnicodeDecodeError as exc:
        raise ContentError("invalid UTF-8") from exc


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return "float" if isinstance(value, float) else "string"


def value_to_bytes(value: Any, typ: str | None) -> bytes:
    """A JSON value -> TLV value bytes for ``typ``; without a type (a resource outside
    the object model) the JSON value's own: boolean, integer, float, else string."""
    t = (typ or _json_type(value)).lower()
    try:
        if t in ("integer", "time", "unsigned integer"):
            v = int(value)
            for n in (1, 2, 4, 8):
                try:
                    return v.to_bytes(n, "big", signed=t != "unsigned integer")
                except OverflowError:
                    continue
            raise ContentError(f"integer {v} too large")
        if t == "float":
            return struct.pack(">d", float(value))
        if t == "boolean":
            if isinstance(value, str):
                value = value.lower() in ("true", "1")
            return b"\x01" if value else b"\x00"
        if t == "objlnk":
            a, b = str(value).split(":")
            return struct.pack(">HH", int(a), int(b))
        if t == "opaque":
            if isinstance(value, bytes):
                return value
            return base64.b64decode(str(value), validate=True)
        return str(value).encode()
    except (ValueError, TypeError, struct.error) as exc:
        raise ContentError(f"{value!r} is not a valid {typ}") from exc


def text_of(value: Any, typ: str | None) -> bytes:
    """A JSON value as text/plain (booleans 0/1, object links obj:inst)."""
    t = (typ or "").lower()
    if t == "boolean" or isinstance(value, bool):
        if isinstance(value, str):
            value = value.lower() in ("true", "1")
        return b"1" if value else b"0"
    if t == "opaque":
        return value_to_bytes(value, "opaque")
    return str(value).encode()


def value_from_text(text: str, typ: str | None) -> Any:
    t = (typ or "").lower()
    try:
        if t in ("integer", "time", "unsigned integer"):
            return int(text)
        if t == "float":
            return float(text)
        if t == "boolean":
            return text.strip() in ("1", "true")
    except ValueError as exc:
        raise ContentError(f"{text!r} is not a valid {typ}") from exc
    return text


# ------------------------------------------------------------------ TLV

OBJECT_INSTANCE, RESOURCE_INSTANCE, MULTIPLE_RESOURCE, RESOURCE = 0, 1, 2, 3


def tlv_items(data: bytes) -> list[tuple[int, int, bytes]]:
    """One level of TLV: ``[(kind, id, value bytes)]``."""
    out = []
    i = 0
    n = len(data)
    while i < n:
        t = data[i]
        i += 1
        kind = t >> 6
        id_len = 2 if t & 0x20 else 1
        len_type = (t >> 3) & 3
        if i + id_len + len_type > n:
            raise ContentError("TLV header truncated")
        ident = int.from_bytes(data[i : i + id_len], "big")
        i += id_len
        if len_type == 0:
            length = t & 7
        else:
            length = int.from_bytes(data[i : i + len_type], "big")
            i += len_type
        if i + length > n:
            raise ContentError("TLV value truncated")
        out.append((kind, ident, bytes(data[i : i + length])))
        i += length
    return out


def tlv_header(kind: int, ident: int, length: int) -> bytes:
    if not 0 <= ident <= 0xFFFF:
        raise ContentError(f"TLV identifier {ident} out of range")
    t = kind << 6
    idb = ident.to_bytes(2 if ident > 0xFF else 1, "big")
    if ident > 0xFF:
        t |= 0x20
    if length < 8:
        t |= length
        lb = b""
    elif length <= 0xFF:
        t |= 1 << 3
        lb = length.to_bytes(1, "big")
    elif length <= 0xFFFF:
        t |= 2 << 3
        lb = length.to_bytes(2, "big")
    elif length <= 0xFFFFFF:
        t |= 3 << 3
        lb = length.to_bytes(3, "big")
    else:
        raise ContentError("TLV value too long")
    return bytes([t]) + idb + lb


def decode_tlv(data: bytes, base: str, type_of: TypeOf = _no_types) -> list[Entry]:
    """``base`` is the request path (``/3``, ``/3/0``, ``/3/0/7``)."""
    parts = [p for p in base.split("/") if p]
    out: list[Entry] = []

    def walk(items: bytes, prefix: list[str]) -> None:
        for kind, ident, value in tlv_items(items):
            if kind == OBJECT_INSTANCE:
                walk(value, [*prefix[:1], str(ident)])
            elif kind == MULTIPLE_RESOURCE:
                walk(value, [*prefix[:2], str(ident)])
            elif kind == RESOURCE:
                path = "/" + "/".join([*prefix[:2], str(ident)])
                out.append({"path": path, "value": value_from_bytes(value, type_of(path))})
            else:  # a resource instance, inside a multiple resource
                rpath = "/" + "/".join(prefix[:3])
                path = f"{rpath}/{ident}"
                out.append({"path": path, "value": value_from_bytes(value, type_of(rpath))})

    walk(data, parts)
    return out


def encode_tlv(entries: list[Entry], base: str, type_of: TypeOf = _no_types) -> bytes:
    """Resources (``/o/i/r`` or relative ``r``) under instance ``base`` (``/o/i``), or
    under object ``base`` (``/o``): then paths carry the instance and instances are
    wrapped."""
    parts = [p for p in base.split("/") if p]
    by_inst: dict[int, list[tuple[int, int | None, Any, str | None]]] = {}
    for e in entries:
        p = [x for x in str(e["path"]).split("/") if x]
        full = p if len(p) >= 3 else parts + p
        if len(full) < 3:
            raise ContentError(f"{e['path']!r} is not a resource path")
        inst, res = int(full[1]), int(full[2])
        ri = int(full[3]) if len(full) > 3 else None
        rpath = "/" + "/".join(full[:3])
        typ = e.get("type") or type_of(rpath)
        by_inst.setdefault(inst, []).append((res, ri, e.get("value"), typ))

    def resources(items: list[tuple[int, int | None, Any, str | None]]) -> bytes:
        out = b""
        multi: dict[int, bytes] = {}
        order: list[int] = []
        for res, ri, value, typ in items:
            v = value_to_bytes(value, typ)
            if ri is None:
                out += tlv_header(RESOURCE, res, len(v)) + v
            else:
                if res not in multi:
                    multi[res] = b""
                    order.append(res)
                multi[res] += tlv_header(RESOURCE_INSTANCE, ri, len(v)) + v
        for res in order:
            out += tlv_header(MULTIPLE_RESOURCE, res, len(multi[res])) + multi[res]
        return out

    if len(parts) >= 2:
        return b"".join(resources(v) for v in by_inst.values())
    out = b""
    for inst, items in by_inst.items():
        body = resources(items)
        out += tlv_header(OBJECT_INSTANCE, inst, len(body)) + body
    return out


# ------------------------------------------------------------------ JSON, SenML


def _senml_value(rec: dict[Any, Any], keys: dict[str, Any]) -> Any:
    for k in ("v", "vs", "vb", "vlo", "vd"):
        if keys[k] in rec:
            v = rec[keys[k]]
            if k == "vd":
                if isinstance(v, bytes):
                    return _b64(v)
                return _b64(base64.urlsafe_b64decode(str(v) + "=" * (-len(str(v)) % 4)))
            return v
    return None


_JSON_KEYS = {"bn": "bn", "bt": "bt", "n": "n", "t": "t", "v": "v", "vs": "vs", "vb": "vb",
              "vd": "vd", "vlo": "vlo"}
_CBOR_KEYS = {"bn": -2, "bt": -3, "n": 0, "t": 6, "v": 2, "vs": 3, "vb": 4, "vd": 8,
              "vlo": "vlo"}  # SenML CBOR labels (RFC 8428); vlo is a string label in 1.1


def _senml(records: Any, keys: dict[str, Any]) -> list[Entry]:
    if not isinstance(records, list):
        raise ContentError("SenML: expected an array")
    out: list[Entry] = []
    bn = ""
    bt: float | None = None
    for rec in records:
        if not isinstance(rec, dict):
            raise ContentError("SenML: expected records")
        if keys["bn"] in rec:
            bn = str(rec[keys["bn"]])
        if keys["bt"] in rec:
            bt = _number(rec[keys["bt"]])
        name = bn + str(rec.get(keys["n"], ""))
        entry: Entry = {"path": name, "value": _senml_value(rec, keys)}
        t = _number(rec[keys["t"]]) if keys["t"] in rec else None
        if bt is not None or t is not None:
            entry["time"] = (bt or 0) + (t or 0)  # SenML base time + time (RFC 8428)
        out.append(entry)
    return out


def _number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ContentError("SenML: a time must be a number")
    return v


def _resource_path(path: str, base: str) -> list[str]:
    """``path`` (absolute, or relative to ``base`` when shorter than a resource path) as
    the numeric parts of a resource or resource-instance path."""
    p = [x for x in str(path).split("/") if x]
    full = p if len(p) >= 3 else [x for x in base.split("/") if x] + p
    if not 3 <= len(full) <= 4 or not all(x.isdigit() for x in full):
        raise ContentError(f"{path!r} is not a resource path")
    return full


def _senml_out(name: str, value: Any, typ: str | None, cbor: bool) -> dict[Any, Any]:
    t = (typ or _json_type(value)).lower()
    v: Any
    try:
        if t in ("integer", "time", "unsigned integer"):
            key, v = "v", int(value)
        elif t == "float":
            key, v = "v", float(value)
        elif t == "boolean":
            key = "vb"
            v = value.lower() in ("true", "1") if isinstance(value, str) else bool(value)
        elif t == "opaque":
            raw = value_to_bytes(value, "opaque")
            key, v = "vd", raw if cbor else base64.urlsafe_b64encode(raw).decode().rstrip("=")
        elif t == "objlnk":
            a, _, b = str(value).partition(":")
            key, v = "vlo", f"{int(a)}:{int(b)}"
        else:
            key, v = "vs", str(value)
    except (ValueError, TypeError) as exc:
        raise ContentError(f"{value!r} is not a valid {typ}") from exc
    keys = _CBOR_KEYS if cbor else _JSON_KEYS
    return {keys["n"]: name, keys[key]: v}


def encode_senml(entries: list[Entry], base: str, type_of: TypeOf = _no_types, *,
                 cbor: bool = False) -> bytes:
    """Resource values as SenML JSON (or CBOR) records with absolute names (1.1 writes,
    Write-Composite); paths as in :func:`encode_tlv`."""
    recs = []
    for e in entries:
        full = _resource_path(e["path"], base)
        typ = e.get("type") or type_of("/" + "/".join(full[:3]))
        recs.append(_senml_out("/" + "/".join(full), e.get("value"), typ, cbor))
    return cbor2.dumps(recs) if cbor else json.dumps(recs, separators=(",", ":")).encode()


def encode_senml_names(paths: list[str], *, cbor: bool = False) -> bytes:
    """The body of a Read-/Observe-Composite (FETCH): one record per path, name only."""
    names = []
    for p in paths:
        parts = [x for x in str(p).split("/") if x]
        if not parts or len(parts) > 4 or not all(x.isdigit() for x in parts):
            raise ContentError(f"{p!r} is not an LwM2M path")
        names.append("/" + "/".join(parts))
    if cbor:
        return cbor2.dumps([{_CBOR_KEYS["n"]: n} for n in names])
    return json.dumps([{"n": n} for n in names], separators=(",", ":")).encode()


def decode_senml_json(data: bytes) -> list[Entry]:
    try:
        return _senml(json.loads(data), _JSON_KEYS)
    except (ValueError, binascii.Error) as exc:
        raise ContentError(f"SenML JSON: {exc}") from exc


def decode_senml_cbor(data: bytes) -> list[Entry]:
    try:
        return _senml(cbor2.loads(data), _CBOR_KEYS)
    except (cbor2.CBORDecodeError, ValueError, TypeError, binascii.Error) as exc:
        raise ContentError(f"SenML CBOR: {exc}") from exc


def decode_oma_json(data: bytes, base: str) -> list[Entry]:
    try:
        doc = json.loads(data)
        bn = str(doc.get("bn", base))
        if not bn.endswith("/"):
            bn += "/"
        out: list[Entry] = []
        for e in doc["e"]:
            name = str(e.get("n", ""))
            path = (bn + name).rstrip("/") if name else bn.rstrip("/")
            value: Any = None
            for k in ("v", "sv", "bv", "ov"):
                if k in e:
                    value = e[k]
                    break
            out.append({"path": path, "value": value})
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ContentError(f"OMA-JSON: {exc}") from exc


# ------------------------------------------------------------------ link format


def parse_links(data: bytes | str) -> list[tuple[str, dict[str, str]]]:
    """CoRE link format -> ``[(path, attributes)]``."""
    text = data.decode() if isinstance(data, bytes) else data
    out = []
    for item in _split_links(text):
        item = item.strip()
        if not item:
            continue
        if not item.startswith("<") or ">" not in item:
            raise ContentError(f"bad link {item[:40]!r}")
        target, _, rest = item[1:].partition(">")
        attrs: dict[str, str] = {}
        for a in rest.split(";"):
            a = a.strip()
            if not a:
                continue
            k, _, v = a.partition("=")
            attrs[k] = v.strip('"')
        out.append((target, attrs))
    return out


def _split_links(text: str) -> list[str]:
    parts, cur, quoted = [], "", False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


# ------------------------------------------------------------------ dispatch


def decode(fmt: int | None, payload: bytes, path: str, type_of: TypeOf = _no_types) -> list[Any]:
    """A response body -> the ``content`` list of the MQTT message."""
    try:
        if fmt == LINK_FORMAT:
            return [item.strip() for item in _split_links(payload.decode()) if item.strip()]
        if not payload:
            return []
        if fmt == TLV:
            return decode_tlv(payload, path, type_of)
        if fmt == SENML_JSON:
            return decode_senml_json(payload)
        if fmt == SENML_CBOR:
            return decode_senml_cbor(payload)
        if fmt == OMA_JSON:
            return decode_oma_json(payload, path)
        if fmt == OPAQUE:
            return [{"path": path, "value": _b64(payload)}]
        # text/plain, or no content format
        return [{"path": path, "value": value_from_text(payload.decode(), type_of(path))}]
    except UnicodeDecodeError as exc:
        raise ContentError("invalid UTF-8") from exc
