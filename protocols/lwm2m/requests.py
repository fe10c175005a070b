"""LwM2M commands (the JSON of ``{mp}dn``) and the CoAP requests made from them, sans-IO.

:func:`build` makes the request of a single-path command (read, discover, write,
write-attr, execute, create, delete, observe, cancel-observe) and :func:`build_composite`
that of a 1.1 composite operation (FETCH or iPATCH on the root path, SenML), for a device
as the channel knows it (:class:`Device`: its alternate path, LwM2M version, the formats of
its root link and its observations). A cancel takes the observation's token and forgets
the observation. Bodies are SenML when the device reads it (1.1), TLV otherwise.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Protocol

from protocols.coap.codec import CON, Code, Message, make
from protocols.lwm2m import content, formats
from protocols.lwm2m.objects import ObjectModel

BLOCK_SZX = 6  # Block1 size exponent of request bodies: 1024-byte blocks
COMPOSITE = ("read-composite", "write-composite", "observe-composite",
             "cancel-observe-composite")  # LwM2M 1.1, SenML bodies on the root path
NEGOTIATED = ("read", "observe", "cancel-observe", "read-composite", "observe-composite",
              "cancel-observe-composite")  # the device answers with values: Accept chosen
COMMANDS = ("read", "discover", "write", "write-attr", "execute", "create", "delete",
            "observe", "cancel-observe", *COMPOSITE)


@dataclass(slots=True)
class Command:
    req_id: Any
    msg_type: str
    path: str
    echo: dict[str, Any]
    request: Message | None = None  # the CoAP request, once built
    seq: int | None = None  # its place in the registry (None: not kept there)
    paths: list[str] | None = None  # a composite operation's paths
    partial: bytearray | None = None  # a Block2 answer being collected
    upload: bytes | None = None  # a request body sent with Block1
    sent: int = 0  # bytes of ``upload`` sent so far
    block_start: int = 0  # where the last block sent starts
    szx: int = BLOCK_SZX  # Block1 size exponent: ours, or smaller if the device asks
    notify_of: Command | None = None  # fetching the rest of this observation's notification
    seq_num: int | None = None  # that notification's Observe number
    fallback: list[int] = field(default_factory=list)  # formats left to try (4.06, 5.00)
    fell_back: bool = False  # asked again in a fallback format
    entries: list[Any] | None = None  # a write-composite's records
    # carrying out a composite operation path by path (protocols/lwm2m/composite.py)
    part_of: Command | None = None  # this single-path command is a part of that one
    parts_left: int | None = None  # parts not answered yet (None: not split)
    gathered: list[Any] | None = None  # the parts' content so far
    error: dict[str, Any] | None = None  # the first failing part's result


class Device(Protocol):
    """What a request depends on: the device's registration and its observations."""

    alternate: str  # its alternate path ("/" by default)
    version: str  # the LwM2M version it registered with
    root_formats: list[int]  # the content formats of its root link (1.1)
    observations: dict[bytes, Command]  # token -> the observe command
    read_format: int | None  # the format its last negotiated read was answered in


def build(
    device: Device, model: ObjectModel, msg_type: str, path: str, data: dict[str, Any],
    command: Command | None = None,
) -> Message:
    """The CoAP request of a single-path command (``read`` ... ``cancel-observe``);
    ValueError (or a content error) when it cannot be one. With ``command``, reads,
    observes and cancels ask for a negotiated format (:func:`negotiate`); a cancel asks
    in its observation's format unless the command names one."""
    if msg_type not in COMMANDS:
        raise ValueError(f"unknown msgType {msg_type!r}")
    parts = [p for p in path.split("/") if p]
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"bad path {path!r}")
    alt = [p for p in device.alternate.split("/") if p]
    code = Code.GET
    payload = b""
    fmt: int | None = None
    observe: int | None = None
    query: list[str] = []
    accept: int | None = None
    if msg_type == "discover":
        accept = content.LINK_FORMAT
    elif msg_type == "observe":
        observe = 0
    elif msg_type == "cancel-observe":
        observe = 1
    elif msg_type == "write":
        if "content" in data:  # several resources of an instance: partial update
            code = Code.POST
            payload, fmt = encode_values(device, model, list(data["content"]), path)
        else:
            code = Code.PUT
            typ = data.get("type") or model.type_of(path)
            if str(typ).lower() == "opaque":
                payload, fmt = content.value_to_bytes(data.get("value"), "opaque"), 42
            else:
                payload, fmt = content.text_of(data.get("value"), typ), content.TEXT
    elif msg_type == "write-attr":
        code = Code.PUT
        for k in ("pmin", "pmax", "gt", "lt", "st"):
            if data.get(k) not in (None, ""):
                query.append(f"{k}={data[k]}")
    elif msg_type == "execute":
        code = Code.POST
        payload = str(data.get("args") or "").encode()
        if payload:
            fmt = content.TEXT  # arguments are text (LwM2M 1.1 5.4.5), as EMQX sends them
    elif msg_type == "create":
        code = Code.POST
        payload, fmt = encode_values(device, model, list(data.get("content") or []), path)
    elif msg_type == "delete":
        code = Code.DELETE
    req = make(CON, code, 0, secrets.token_bytes(4), payload)
    req.opt.uri_path = tuple(alt + parts)
    if query:
        req.opt.uri_query = tuple(query)
    if fmt is not None:
        req.opt.content_format = fmt
    if accept is not None:
        req.opt.accept = accept
    if observe is not None:
        req.opt.observe = observe
    if msg_type == "cancel-observe":
        for token, c in list(device.observations.items()):
            if c.path == path:
                req.token = token  # the observation's own token
                del device.observations[token]
                if c.request is not None and c.request.opt.accept is not None:
                    req.opt.accept = c.request.opt.accept
    if command is not None and msg_type in NEGOTIATED and (
            req.opt.accept is None or data.get("accept") not in (None, "")):
        req.opt.accept = negotiate(device, command, data)
    return req

def senml_format(device: Device) -> int | None:
    """The SenML format the device said it reads (the ``ct`` of its root link, LwM2M
    1.1): JSON when listed, else CBOR; None for a 1.0 device or no such list."""
    if device.version.strip() in ("", "1.0"):
        return None
    for fmt in (content.SENML_JSON, content.SENML_CBOR):
        if fmt in device.root_formats:
            return fmt
    return None

def encode_values(
    device: Device, model: ObjectModel, entries: list[Any], base: str
) -> tuple[bytes, int]:
    """A multi-resource write or a create: SenML when the device reads it (1.1),
    TLV otherwise (every 1.0 device reads TLV)."""
    type_of = model.type_of
    fmt = senml_format(device)
    if fmt is None:
        return content.encode_tlv(entries, base, type_of), content.TLV
    return content.encode_senml(entries, base, type_of,
                                cbor=fmt == content.SENML_CBOR), fmt

def build_composite(
    device: Device, model: ObjectModel, c: Command, data: dict[str, Any]
) -> Message:
    """Read-/Write-/Observe-Composite (LwM2M 1.1): FETCH or iPATCH on the root path
    with a SenML body (JSON unless the device listed only CBOR)."""
    if formats.is_1_0(device.version):  # a 1.0 device does not answer FETCH at all
        raise ValueError("composite operations need LwM2M 1.1 (the device registered 1.0)")
    if c.msg_type == "write-composite":
        fmt = senml_format(device) or content.SENML_JSON
    else:
        fmt = negotiate(device, c, data)
    cbor = fmt == content.SENML_CBOR
    if c.msg_type == "write-composite":
        entries = data.get("content")
        if not isinstance(entries, list) or not entries:
            raise ValueError("write-composite needs content: [{path, value}]")
        payload = content.encode_senml(entries, "/", model.type_of, cbor=cbor)
        code = Code.iPATCH
        c.paths = [str(e.get("path")) for e in entries if isinstance(e, dict)]
        c.entries = [e for e in entries if isinstance(e, dict)]
    else:
        paths = data.get("paths")
        if not isinstance(paths, list) or not paths:
            raise ValueError(f"{c.msg_type} needs paths: [...]")
        payload = content.encode_senml_names([str(p) for p in paths], cbor=cbor)
        code = Code.FETCH
        c.paths = ["/" + "/".join(x for x in str(p).split("/") if x) for p in paths]
    req = make(CON, code, 0, secrets.token_bytes(4), payload)
    req.opt.uri_path = tuple(p for p in device.alternate.split("/") if p)
    req.opt.content_format = fmt
    if code == Code.FETCH:
        req.opt.accept = fmt
    if c.msg_type == "observe-composite":
        req.opt.observe = 0
    elif c.msg_type == "cancel-observe-composite":
        req.opt.observe = 1
        for token, obs in list(device.observations.items()):
            if obs.msg_type == "observe-composite" and obs.paths == c.paths:
                req.token = token
                del device.observations[token]
    return req


def negotiate(device: Device, c: Command, data: dict[str, Any]) -> int:
    """The format to ask for (Accept) in command ``c`` to ``device``; the formats left to
    try on 4.06/5.00 go to ``c.fallback`` (none when the command names its ``accept``)."""
    composite = c.msg_type in COMPOSITE
    if data.get("accept") not in (None, ""):
        fmt = formats.parse_accept(data["accept"])
        if composite and fmt not in formats.SENML:
            raise ValueError(f"{c.msg_type} takes SenML only (accept {data['accept']!r})")
        c.fallback = []
        return fmt
    order = formats.candidates(device.version, device.root_formats, device.read_format,
                               composite=composite)
    if not composite and len([p for p in c.path.split("/") if p]) == 3:
        # a single resource: text is what every device reads (first, once it worked)
        order.insert(0 if device.read_format == content.TEXT else 1, content.TEXT)
    c.fallback = order[1:2]  # once
    return order[0]


def with_format(c: Command, fmt: int) -> Message:
    """Command ``c``'s request asked again in format ``fmt`` (a fallback): a new token
    (and, for a FETCH, the body in that format); the message id is the caller's."""
    first = c.request
    assert first is not None
    cancel = first.opt.observe == 1  # a cancel keeps the observation's token
    token = first.token if cancel else secrets.token_bytes(4)
    req = make(CON, first.code, 0, token, first.payload)
    req.opt.uri_path = first.opt.uri_path
    if first.opt.observe is not None:
        req.opt.observe = first.opt.observe
    req.opt.accept = fmt
    if first.code == Code.FETCH:
        assert c.paths is not None
        req.payload = content.encode_senml_names(c.paths, cbor=fmt == content.SENML_CBOR)
        req.opt.content_format = fmt
    c.request = req
    c.fell_back = True
    return req
