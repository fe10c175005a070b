"""Which content format to ask an LwM2M device for (CoAP Accept), sans-IO.

A 1.0 device reads and answers TLV (every 1.0 client must); a 1.1 device may have dropped
TLV and answers SenML CBOR or SenML JSON (the formats its registration's root link lists
in ``ct``). :func:`candidates` orders the formats to try for a read, observe or
composite operation of one device: the format that last worked for it, then the
formats its root link lists (in the order listed), then the defaults of its version.
The exchange asks in the first and, on 4.06 Not Acceptable or 5.00, once in the
second (text/plain for a single resource: :func:`protocols.lwm2m.requests.negotiate`).
A command's ``"accept"`` (:func:`parse_accept`: a name such as ``"senml-cbor"`` or a
number such as ``112``) overrides the choice, without fallback.

Invariants: :func:`candidates` never returns an empty list nor a format twice; for a
composite operation it returns SenML formats only (FETCH bodies are SenML).
"""

from __future__ import annotations

from typing import Any

from protocols.lwm2m import content

NAMES: dict[str, int] = {
    "text": content.TEXT,
    "text/plain": content.TEXT,
    "opaque": content.OPAQUE,
    "application/octet-stream": content.OPAQUE,
    "tlv": content.TLV,
    "application/vnd.oma.lwm2m+tlv": content.TLV,
    "json": content.OMA_JSON,
    "oma-json": content.OMA_JSON,
    "application/vnd.oma.lwm2m+json": content.OMA_JSON,
    "senml-json": content.SENML_JSON,
    "senml+json": content.SENML_JSON,
    "application/senml+json": content.SENML_JSON,
    "senml-cbor": content.SENML_CBOR,
    "senml+cbor": content.SENML_CBOR,
    "application/senml+cbor": content.SENML_CBOR,
}
READABLE = (content.TEXT, content.OPAQUE, content.TLV, content.OMA_JSON, content.SENML_JSON,
            content.SENML_CBOR)  # the formats :func:`content.decode` reads
SENML = (content.SENML_CBOR, content.SENML_JSON)
MULTI = (*SENML, content.TLV, content.OMA_JSON)  # formats that carry several resources
DEFAULTS_1_0 = (content.TLV, content.OMA_JSON)
DEFAULTS_1_1 = (content.SENML_CBOR, content.SENML_JSON, content.TLV)


def name_of(fmt: int | None) -> str:
    """The short name of a format for log lines and docs ("senml-cbor", "tlv", ...)."""
    for name, f in NAMES.items():
        if f == fmt and "/" not in name and "+" not in name:
            return name
    return "none" if fmt is None else str(fmt)


def parse_accept(value: Any) -> int:
    """A command's ``accept``: a name of :data:`NAMES` or a format number that the
    gateway can decode; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"accept {value!r} is not a content format")
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        fmt = int(value)
    elif isinstance(value, str) and value.strip().lower() in NAMES:
        fmt = NAMES[value.strip().lower()]
    else:
        raise ValueError(f"accept {value!r} is not a content format "
                         f"(one of {', '.join(n for n in NAMES if '/' not in n)} or a number)")
    if fmt not in READABLE:
        raise ValueError(f"accept {value!r}: content format {fmt} cannot be decoded")
    return fmt


def is_1_0(version: str) -> bool:
    """True for a device that registered LwM2M 1.0 (or said no version)."""
    return version.strip() in ("", "1.0")


def candidates(version: str, root_formats: list[int], learned: int | None, *,
               composite: bool = False) -> list[int]:
    """The formats to ask for, best first (see the module docstring)."""
    defaults = DEFAULTS_1_0 if is_1_0(version) else DEFAULTS_1_1
    if composite:
        defaults = SENML
    allowed = SENML if composite else MULTI
    out: list[int] = []
    listed = [] if is_1_0(version) else list(root_formats)  # 1.0's ct means little
    for fmt in [learned, *listed, *defaults]:
        if fmt is not None and fmt in allowed and fmt not in out:
            out.append(fmt)
    return out
