"""LwM2M bootstrap server (client-initiated bootstrap, LwM2M 1.0 5.2.7 / 1.1 6.1), sans-IO:
what a device is told after ``POST /bs?ep=``.

A :class:`BootstrapPlan` is configured per endpoint name, or for every endpoint (``"*"``):
Bootstrap-Delete of ``/`` first (unless ``delete`` is off), then one Bootstrap-Write per
object instance (``PUT /0/1``, TLV: the server accounts, Security ``/0`` and Server
``/1``, or any other instance), then Bootstrap-Finish (``POST /bs``). The channel sends
them one at a time, as it sends commands, and reports the outcome in its log and metrics
(``lwm2m.bootstrap.finished`` / ``lwm2m.bootstrap.failed``); nothing goes to MQTT (a
bootstrapping device has no session).

Invariant: :func:`requests` raises :class:`~protocols.lwm2m.content.ContentError` or
``ValueError`` for a plan it cannot encode, before anything is sent.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from protocols.coap.codec import CON, Code, Message, make
from protocols.lwm2m import content
from protocols.lwm2m.content import TypeOf


@dataclass(slots=True)
class BootstrapPlan:
    delete: bool = True
    writes: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)


def plan_for(plans: dict[str, BootstrapPlan], ep: str) -> BootstrapPlan | None:
    return plans.get(ep) or plans.get("*")


def requests(plan: BootstrapPlan, type_of: TypeOf) -> list[tuple[str, Message]]:
    """``(operation, request)`` in the order they go: delete, writes, finish."""
    out: list[tuple[str, Message]] = []
    if plan.delete:
        out.append(("bootstrap-delete", make(CON, Code.DELETE, 0, secrets.token_bytes(4))))
    for path, entries in plan.writes:
        parts = [p for p in path.split("/") if p]
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"bootstrap write {path!r}: an object instance path (/o/i)")
        req = make(CON, Code.PUT, 0, secrets.token_bytes(4),
                   content.encode_tlv(entries, path, type_of))
        req.opt.uri_path = tuple(parts)
        req.opt.content_format = content.TLV
        out.append(("bootstrap-write", req))
    finish = make(CON, Code.POST, 0, secrets.token_bytes(4))
    finish.opt.uri_path = ("bs",)
    out.append(("bootstrap-finish", finish))
    return out
