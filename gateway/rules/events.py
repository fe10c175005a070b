"""The event sources of rules and their fields, with EMQX 5's names.

A rule's FROM names topic filters (``"sensors/#"``: the ``message.publish`` event of a
matching message) and ``$events/...`` sources. Each event becomes a
:class:`~gateway.rules.compiler.Columns` whose fields are computed on first use from an
:class:`Event` (the hook's arguments), so a rule pays only for the fields it reads.

Timestamps are integer milliseconds since the epoch, as in EMQX. ``peerhost`` of a message
is its publisher's address (looked up when first read; absent once the publisher left).
``sockname`` is the local address of the client's connection (stream listeners; None for
the datagram front-ends). ``reason`` of ``client_disconnected`` is EMQX's: ``normal`` (the
client sent DISCONNECT 0x00; another code gives its name, e.g.
``disconnect_with_will_message``), ``tcp_closed``/``ssl_closed`` (the peer closed the
socket without DISCONNECT), ``keepalive_timeout``, ``kicked`` (the management API),
``takenover`` / ``discarded`` (a new connection with the same client id took the session
over / started clean), or the name of the reason code the broker closed with
(``protocol_error``, ``malformed_packet``, ``packet_too_large``, ...). The ``*_props``
fields are the MQTT 5 properties of the packet behind the event (CONNECT, DISCONNECT,
PUBLISH, SUBSCRIBE, UNSUBSCRIBE) with EMQX's hyphenated names; ``puback_props`` of
``message_acked`` are those of the subscriber's PUBACK (QoS 1) or PUBCOMP (QoS 2: the
acknowledgement that ends the delivery here; EMQX shows the PUBREC's), ``{}`` without
any (MQTT 3, or none sent).
"""

from __future__ import annotations

import dataclasses
import itertools
import secrets
import time
from collections.abc import Callable
from typing import Any

from gateway.rules.columns import decode_json_container
from protocols.context import ClientInfo, Message
from protocols.mqtt.packets import Properties
from protocols.mqtt.reason_codes import ReasonCode

__all__ = ["EVENT_HOOKS", "EVENTS", "GETTERS", "Event", "message_id", "props_map",
           "publish_getters"]

# $events/<name> -> the core hook that feeds it
EVENT_HOOKS: dict[str, str] = {
    "client_connected": "client.connected",
    "client_disconnected": "client.disconnected",
    "client_connack": "client.connack",
    "session_subscribed": "session.subscribed",
    "session_unsubscribed": "session.unsubscribed",
    "message_delivered": "message.delivered",
    "message_acked": "message.acked",
    "message_dropped": "message.dropped",
}
EVENTS = frozenset(f"$events/{n}" for n in EVENT_HOOKS)


class Event:
    """One occurrence: what the hook gave (``message``, ``client``, ``extra``), the moment,
    and a way to find a client's connection information (``lookup``)."""

    __slots__ = ("kind", "message", "client", "extra", "at", "node", "lookup")

    kind: str
    message: Message
    client: ClientInfo | None
    extra: dict[str, Any]
    at: float
    node: str
    lookup: Callable[[str], ClientInfo | None]

    def __init__(
        self,
        kind: str,
        message: Message | None = None,  # None: an event without a message
        client: ClientInfo | None = None,
        extra: dict[str, Any] | None = None,
        node: str = "",
        lookup: Callable[[str], ClientInfo | None] = lambda cid: None,
        at: float | None = None,
    ) -> None:
        self.kind = kind  # "message.publish", "client.connected", ...
        self.message = message if message is not None else _NO_MESSAGE
        self.client = client
        self.extra = extra or {}
        self.at = time.time() if at is None else at
        self.node = node
        self.lookup = lookup


_NO_MESSAGE = Message("", b"")


def _ms(t: float) -> int:
    return int(t * 1000)


_SALT = secrets.randbits(32)  # this process: ids of workers and restarts differ
_seq = itertools.count(1)


def message_id(m: Message) -> str:
    """A message's id (EMQX's 128-bit GUID in hex): its millisecond, this process's salt
    and a sequence number, made when first asked for and kept in the message's headers,
    so every event of one message (publish, delivered, acked, dropped) shows the same id.
    Two messages never share one (an object's address would not do: Python reuses it)."""
    h = m.headers
    if h is None:
        h = m.headers = {}
    mid: str | None = h.get("id")
    if mid is None:
        mid = h["id"] = (f"{_ms(m.timestamp or 0):012x}{_SALT:08x}"
                         f"{next(_seq) & 0xFFFFFFFF:08x}{m.qos:04x}")
    return mid


def _payload(m: Message) -> str | bytes:
    try:
        return m.payload.decode()
    except UnicodeDecodeError:
        return m.payload


# the dataclass's fields, not its __slots__: a compiled Properties has none
_PROP_NAMES = {
    f.name: "-".join(w.capitalize() for w in f.name.split("_"))
    for f in dataclasses.fields(Properties)
}
_PROP_NAMES.update({"subscription_identifiers": "Subscription-Identifier",
                    "server_keep_alive": "Server-Keep-Alive"})


def props_map(p: Properties | None) -> dict[str, Any]:
    """MQTT 5 properties as EMQX shows them: hyphenated names (``Session-Expiry-Interval``),
    ``User-Property`` a map (and ``User-Property-Pairs`` the list), binary data as text."""
    out: dict[str, Any] = {}
    if p is None:
        return out
    for f, name in _PROP_NAMES.items():
        v = getattr(p, f)
        if v is None or v == ():
            continue
        if f == "user_properties":
            out["User-Property"] = dict(v)
            out["User-Property-Pairs"] = [{"key": k, "value": x} for k, x in v]
        elif f == "subscription_identifiers":
            out[name] = v[0] if len(v) == 1 else list(v)
        elif isinstance(v, bytes):
            out[name] = v.decode("utf-8", "replace")
        else:
            out[name] = v
    return out


def _peer(c: ClientInfo | None) -> str | None:
    return c.peer_host if c is not None else None


def _peername(c: ClientInfo | None) -> str | None:
    if c is None or c.peer_host is None:
        return None
    return f"{c.peer_host}:{c.peer_port}" if c.peer_port is not None else c.peer_host


def _proto_name(c: ClientInfo) -> str:
    return {"mqtt": "MQTT", "ws": "MQTT", "mqttsn": "MQTT-SN", "coap": "CoAP",
            "lwm2m": "LwM2M"}.get(c.protocol, c.protocol)


def _reason_name(code: int) -> str:
    try:
        return ReasonCode(code).name.lower()
    except ValueError:
        return f"0x{code:02x}"


def _publisher(e: Event) -> ClientInfo | None:
    m = e.message
    return e.lookup(m.publisher) if m.publisher else None


_M = Callable[[Event], Any]


def _msg(f: Callable[[Message], Any]) -> _M:
    return lambda e: f(e.message)


def _cli(f: Callable[[ClientInfo], Any]) -> _M:
    return lambda e: f(e.client) if e.client is not None else None


_COMMON: dict[str, _M] = {
    "timestamp": lambda e: _ms(e.at),
    "node": lambda e: e.node,
}

_MESSAGE: dict[str, _M] = {
    **_COMMON,
    # message events always carry their message: one call per field, no wrapper
    "id": lambda e: message_id(e.message),
    "payload": lambda e: _payload(e.message),
    "topic": lambda e: e.message.topic,
    "qos": lambda e: e.message.qos,
    "flags": lambda e: {"retain": e.message.retain, "dup": False},
    "pub_props": lambda e: props_map(e.message.properties),
    "publish_received_at": lambda e: _ms(e.message.timestamp or e.at),
}

def _payload_json(e: Event) -> Any:
    return decode_json_container(e.message.payload)


_MESSAGE["$payload_json"] = _payload_json  # the payload's JSON, straight from its bytes

_PUBLISH: dict[str, _M] = {
    **_MESSAGE,
    "event": lambda e: "message.publish",
    "clientid": lambda e: e.message.publisher,
    "username": lambda e: e.message.username,
    "peerhost": lambda e: _peer(_publisher(e)),
}

_CONN: dict[str, _M] = {
    **_COMMON,
    "clientid": _cli(lambda c: c.client_id),
    "username": _cli(lambda c: c.username),
    "mountpoint": _cli(lambda c: c.mountpoint or None),
    "peername": _cli(_peername),
    "peerhost": _cli(lambda c: c.peer_host),
    "sockname": lambda e: e.extra.get("sockname"),
    "proto_name": _cli(_proto_name),
    "proto_ver": _cli(lambda c: c.proto_ver),
    "keepalive": _cli(lambda c: c.keepalive),
    "clean_start": _cli(lambda c: c.clean_start),
    "expiry_interval": lambda e: e.extra.get("expiry_interval", 0),
    "is_bridge": lambda e: False,
    "conn_props": _cli(lambda c: props_map(c.attrs.get("conn_props"))),
}

_SUB: dict[str, _M] = {
    **_COMMON,
    "clientid": _cli(lambda c: c.client_id),
    "username": _cli(lambda c: c.username),
    "peerhost": _cli(lambda c: c.peer_host),
    "topic": lambda e: e.extra.get("topic"),
}

def publish_getters(node: str, lookup: Callable[[str], ClientInfo | None],
                    now: Callable[[], float]) -> dict[str, Callable[[Message], Any]]:
    """The fields of ``message.publish`` read straight from the :class:`Message` (no
    :class:`Event` per message): the same names, order and values as
    ``GETTERS["message.publish"]`` over ``Event("message.publish", m, node=node,
    lookup=lookup, at=m.timestamp or now())``."""

    def at_ms(m: Message) -> int:
        return _ms(m.timestamp or now())

    def peerhost(m: Message) -> str | None:
        return _peer(lookup(m.publisher)) if m.publisher else None

    own: dict[str, Callable[[Message], Any]] = {
        "timestamp": at_ms,
        "node": lambda m: node,
        "id": message_id,
        "payload": _payload,
        "topic": lambda m: m.topic,
        "qos": lambda m: m.qos,
        "flags": lambda m: {"retain": m.retain, "dup": False},
        "pub_props": lambda m: props_map(m.properties),
        "publish_received_at": at_ms,
        "$payload_json": lambda m: decode_json_container(m.payload),
        "event": lambda m: "message.publish",
        "clientid": lambda m: m.publisher,
        "username": lambda m: m.username,
        "peerhost": peerhost,
    }
    assert list(own) == list(_PUBLISH), "publish_getters out of step with _PUBLISH"
    return own


GETTERS: dict[str, dict[str, _M]] = {
    "message.publish": _PUBLISH,
    "client.connected": {
        **_CONN,
        "event": lambda e: "client.connected",
        "connected_at": _cli(lambda c: _ms(c.connected_at)),
    },
    "client.disconnected": {
        **_CONN,
        "event": lambda e: "client.disconnected",
        "reason": lambda e: e.extra.get("reason", "normal"),
        "disconnected_at": lambda e: _ms(e.at),
        "disconn_props": _cli(lambda c: props_map(c.attrs.get("disconn_props"))),
    },
    "client.connack": {
        **_CONN,
        "event": lambda e: "client.connack",
        "reason_code": lambda e: _reason_name(int(e.extra.get("reason_code", 0))),
    },
    "session.subscribed": {
        **_SUB,
        "event": lambda e: "session.subscribed",
        "qos": lambda e: e.extra.get("qos", 0),
        "sub_props": lambda e: e.extra.get("sub_props", {}),
    },
    "session.unsubscribed": {
        **_SUB,
        "event": lambda e: "session.unsubscribed",
        "unsub_props": lambda e: e.extra.get("unsub_props", {}),
    },
    "message.delivered": {
        **_MESSAGE,
        "event": lambda e: "message.delivered",
        "from_clientid": _msg(lambda m: m.publisher),
        "from_username": _msg(lambda m: m.username),
        "clientid": _cli(lambda c: c.client_id),
        "username": _cli(lambda c: c.username),
        "peerhost": _cli(lambda c: c.peer_host),
    },
    "message.acked": {
        **_MESSAGE,
        "event": lambda e: "message.acked",
        "from_clientid": _msg(lambda m: m.publisher),
        "from_username": _msg(lambda m: m.username),
        "clientid": _cli(lambda c: c.client_id),
        "username": _cli(lambda c: c.username),
        "peerhost": _cli(lambda c: c.peer_host),
        "puback_props": lambda e: e.extra.get("puback_props", {}),
    },
    "message.dropped": {
        **_PUBLISH,
        "event": lambda e: "message.dropped",
        "reason": lambda e: e.extra.get("reason"),
    },
}
