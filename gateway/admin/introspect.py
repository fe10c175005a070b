"""Read-only views of a running node as JSON-able dicts (the API's payloads).

Pure functions over the core's objects: no I/O, no mutation, so they are tested on a
:class:`~gateway.core.node.Node` built in memory. Field names follow EMQX's management
API where it has one (``clientid``, ``ip_address``, ``proto_ver``, ``connected_at``...).
Times are wall-clock epoch seconds (floats).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from typing import Any

from gateway.core.node import Node
from gateway.core.session import NEVER_EXPIRE, Session
from gateway.core.topic_index import topic_matches
from protocols.context import ClientInfo, Message, SubOptions
from protocols.mqtt.topics import parse_shared

PROTO_NAMES = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}


def client_view(node: Node, session: Session) -> dict[str, Any]:
    """One client (a session, connected or not)."""
    info: ClientInfo | None = session.info
    connected = session.handle is not None
    expiry = session.expiry_interval
    view: dict[str, Any] = {
        "clientid": session.client_id,
        "node": node.settings.node_name,
        "connected": connected,
        "username": info.username if info else None,
        "ip_address": info.peer_host if info else None,
        "port": info.peer_port if info else None,
        "protocol": info.protocol if info else None,
        "proto_name": _proto_name(info),
        "proto_ver": info.proto_ver if info else None,
        "listener": info.listener if info else None,
        "mountpoint": info.mountpoint if info else "",
        "keepalive": info.keepalive if info else 0,
        "clean_start": info.clean_start if info else False,
        "connected_at": info.connected_at if info and info.connected_at else None,
        "created_at": session.created_at,
        "expiry_interval": None if expiry == NEVER_EXPIRE else expiry,
        "subscriptions_cnt": len(session.subscriptions),
        "inflight_cnt": len(session.inflight),
        "inflight_max": session.receive_maximum,
        "mqueue_len": len(session.mqueue),
        "mqueue_max": session.max_mqueue_len,
        "awaiting_rel_cnt": len(session.awaiting_rel),
    }
    return view


def _proto_name(info: ClientInfo | None) -> str | None:
    if info is None:
        return None
    if info.protocol in ("mqtt", "ws"):
        return PROTO_NAMES.get(info.proto_ver, "MQTT")
    return info.protocol.upper()


def _contains(haystack: str | None, needle: str) -> bool:
    return haystack is not None and needle.lower() in haystack.lower()


def filter_clients(
    node: Node,
    *,
    clientid: str | None = None,
    username: str | None = None,
    ip_address: str | None = None,
    conn_state: str | None = None,
    proto_ver: int | None = None,
    protocol: str | None = None,
    listener: str | None = None,
    like_clientid: str | None = None,
    like_username: str | None = None,
) -> list[Session]:
    """Sessions matching every given filter, sorted by client id. ``conn_state`` is
    ``connected`` or ``disconnected``; ``like_*`` match a case-insensitive substring."""
    if clientid is not None:
        s = node.sessions.get(clientid)
        candidates: Iterable[Session] = [s] if s is not None else []
    else:
        candidates = node.sessions.values()
    out = []
    for s in candidates:
        info: ClientInfo | None = s.info
        if conn_state is not None and (s.handle is not None) != (conn_state == "connected"):
            continue
        if username is not None and (info is None or info.username != username):
            continue
        if ip_address is not None and (info is None or info.peer_host != ip_address):
            continue
        if proto_ver is not None and (info is None or info.proto_ver != proto_ver):
            continue
        if protocol is not None and (info is None or info.protocol != protocol):
            continue
        if listener is not None and (info is None or info.listener != listener):
            continue
        if like_clientid is not None and not _contains(s.client_id, like_clientid):
            continue
        if like_username is not None and not _contains(info.username if info else None,
                                                       like_username):
            continue
        out.append(s)
    out.sort(key=lambda s: s.client_id)
    return out


def subscription_view(node: Node, client_id: str, topic: str, opts: SubOptions) -> dict[str, Any]:
    group, real = parse_shared(topic)
    return {
        "node": node.settings.node_name,
        "clientid": client_id,
        "topic": topic,
        "filter": real,
        "share_group": group,
        "qos": opts.qos,
        "nl": int(opts.no_local),
        "rap": int(opts.retain_as_published),
        "rh": opts.retain_handling,
        "subid": opts.subscription_id,
    }


def iter_subscriptions(
    node: Node,
    *,
    clientid: str | None = None,
    topic: str | None = None,
    qos: int | None = None,
    share_group: str | None = None,
    match_topic: str | None = None,
) -> Iterator[dict[str, Any]]:
    """Every subscription of every session (offline ones too), by client id then filter.

    ``topic`` is the exact filter as subscribed (``$share/g/t/#`` included); ``match_topic``
    keeps the filters that a message on that topic would match."""
    if clientid is not None:
        s = node.sessions.get(clientid)
        sessions = [s] if s is not None else []
    else:
        sessions = sorted(node.sessions.values(), key=lambda s: s.client_id)
    for s in sessions:
        for f in sorted(s.subscriptions):
            opts = s.subscriptions[f]
            if topic is not None and f != topic:
                continue
            if qos is not None and opts.qos != qos:
                continue
            group, real = parse_shared(f)
            if share_group is not None and group != share_group:
                continue
            if match_topic is not None and not topic_matches(real, match_topic):
                continue
            yield subscription_view(node, s.client_id, f, opts)


def routes(node: Node, *, topic: str | None = None) -> list[dict[str, Any]]:
    """Topic filter -> node, for every filter with a subscriber here (EMQX ``/topics``).

    With ``topic`` given, only that exact filter. Shared groups are routed by their
    filter; ``shared_groups`` names them."""
    broker = node.broker
    name = node.settings.node_name
    filters = [topic] if topic is not None else sorted(broker.index)
    out = []
    for f in filters:
        if f not in broker.index:
            continue
        plain = broker.plain.get(f, {})
        groups = broker.shared.get(f, {})
        out.append(
            {
                "topic": f,
                "node": name,
                "subscribers": len(plain),
                "shared_groups": sorted(groups),
            }
        )
    return out


def retained_view(message: Message, *, payload: bool = False) -> dict[str, Any]:
    view: dict[str, Any] = {
        "topic": message.topic,
        "qos": message.qos,
        "payload_size": len(message.payload),
        "from_clientid": message.publisher or None,
        "from_username": message.username,
        "publish_at": message.timestamp or None,
        "expires_at": message.expires_at,
    }
    if payload:
        view["payload"] = base64.b64encode(message.payload).decode("ascii")
    return view


def retained_messages(node: Node, *, topic: str | None = None) -> list[dict[str, Any]]:
    """Retained messages (``topic`` filters them, wildcards allowed), by topic."""
    out = []
    for t in sorted(node.retainer.topics()):
        if topic is not None and not topic_matches(topic, t):
            continue
        m = node.retainer.get(t)
        if m is not None:
            out.append(retained_view(m))
    return out


def protocol_counts(node: Node) -> dict[str, int]:
    """Connected clients per protocol (``mqtt``, ``mqttsn``, ``coap``, ``lwm2m``, ...)."""
    counts: dict[str, int] = {}
    for s in node.sessions.values():
        if s.handle is not None and s.info is not None:
            counts[s.info.protocol] = counts.get(s.info.protocol, 0) + 1
    return counts


def listener_counts(node: Node) -> dict[str, int]:
    """Connected (session-holding) clients per listener id."""
    counts: dict[str, int] = {}
    for s in node.sessions.values():
        if s.handle is not None and s.info is not None:
            counts[s.info.listener] = counts.get(s.info.listener, 0) + 1
    return counts


def paginate(items: list[Any], page: int, limit: int) -> dict[str, Any]:
    """``{"data": items[page], "meta": {page, limit, count, hasnext}}`` (pages from 1)."""
    start = (page - 1) * limit
    data = items[start : start + limit]
    return {
        "data": data,
        "meta": {
            "page": page,
            "limit": limit,
            "count": len(items),
            "hasnext": start + limit < len(items),
        },
    }
