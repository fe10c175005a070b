"""Composite operations for devices that do not do them, sans-IO.

LwM2M 1.1 makes Read-/Write-Composite optional, and Eclipse wakaama's client has neither:
it acknowledges the FETCH (or iPATCH) and never answers. When a ``read-composite`` or
``write-composite`` ends in ``coap_timeout`` or in a code that says "not this request"
(4.00, 4.02, 4.05, 5.01), the exchange marks the device as one without composite
operations (until it registers again) and carries the command out path by path instead:
one Read (or one Write, text/plain) per path, sent before the waiting commands, their
results gathered into the one answer the command gets. Later composite reads and writes
to that device go path by path at once.

The answer keeps the composite command's shape (``reqPath "/"``, ``paths``, ``content``):
code 2.05 (read) or 2.04 (write) when every part succeeded, otherwise the first failing
part's code, with the content of the parts that were read; ``"codeMsg"`` says it was
carried out path by path. Observe-Composite is not emulated (one observation per path
would notify separately).
"""

from __future__ import annotations

from typing import Any

from protocols.lwm2m.objects import ObjectModel
from protocols.lwm2m.requests import Command, Device, build

EMULATED = ("read-composite", "write-composite")
NOT_DONE = ("4.00", "4.02", "4.05", "5.01")  # the device does not take the request


def not_done(c: Command, result: dict[str, Any]) -> bool:
    """True when ``result`` of composite command ``c`` says the device does not do it."""
    if c.msg_type not in EMULATED or c.parts_left is not None or c.request is None:
        return False  # not a composite command, split already, or never sent
    code = result.get("code")
    return code in NOT_DONE or (code == "coap_timeout" and result.get("codeMsg") ==
                                "coap_timeout")


def parts(device: Device, model: ObjectModel, c: Command) -> list[Command]:
    """The single-path commands that carry out composite command ``c``, in order; its
    gathering starts."""
    out: list[Command] = []
    if c.msg_type == "read-composite":
        for p in c.paths or []:
            sub = Command(c.req_id, "read", p, {}, part_of=c)
            sub.request = build(device, model, "read", p, {}, sub)
            out.append(sub)
    else:
        for e in c.entries or []:
            path = "/" + "/".join(x for x in str(e.get("path")).split("/") if x)
            data = {"path": path, "value": e.get("value"), "type": e.get("type")}
            sub = Command(c.req_id, "write", path, {}, part_of=c)
            sub.request = build(device, model, "write", path, data)
            out.append(sub)
    c.parts_left = len(out)
    c.gathered = []
    c.error = None
    return out


def gather(sub: Command, result: dict[str, Any]) -> tuple[Command, dict[str, Any] | None]:
    """A part's result into its composite command; the command and its whole result once
    the last part is in (None before)."""
    c = sub.part_of
    assert c is not None and c.parts_left is not None and c.gathered is not None
    code = str(result.get("code"))
    if code.startswith("2."):
        c.gathered.extend(result.get("content") or [])
    elif c.error is None:
        c.error = {"code": code, "codeMsg": f"{result.get('codeMsg', '')} ({sub.path})"}
    c.parts_left -= 1
    if c.parts_left > 0:
        return c, None
    ok = "2.05" if c.msg_type == "read-composite" else "2.04"
    out: dict[str, Any] = c.error or {"code": ok, "codeMsg": "content" if ok == "2.05"
                                      else "changed"}
    out["codeMsg"] = f"{out['codeMsg']}, path by path (no composite operations)"
    if c.msg_type == "read-composite":
        out["content"] = c.gathered
    return c, out
