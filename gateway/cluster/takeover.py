"""The session registry (client id -> nodes holding a session) and session takeover.

Each node owns its registry rows as it owns its routes: the client ids of the sessions
it holds travel with its route updates (``sessions`` ops in ROUTES frames, a snapshot on
connect) and vanish with its control link.

Takeover: when a client connects to node B with a client id B has no session for, and the
registry says node A holds one, B answers the CONNECT at once (session present unless
clean start) and sends A a ``takeover`` notice. A closes the client's connection there
with 0x8E (session taken over; its will is settled as for a local takeover), takes the
session's subscriptions and every undelivered message out of its core (the session ends
on A, so its routes go), and sends them to B, which adds them to the new session: the
subscriptions (and so B's routes) and the messages, delivered or queued as usual. With
clean start A just ends its session.

Invariants:
- ``owners[cid]`` mirrors ``by_node``: a node is listed for a client id exactly while
  its last announcement says it holds a session for it.
- A message in an exported session is either still on A (not yet exported) or in the
  export: the export and the end of the session on A happen in one loop step.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from gateway.cluster import frames as F
from protocols.context import Delivery, SubOptions
from protocols.mqtt.reason_codes import ReasonCode

if TYPE_CHECKING:
    from gateway.core.node import Node


class SessionRegistry:
    def __init__(self) -> None:
        self.by_node: dict[str, set[str]] = {}
        self.owners: dict[str, set[str]] = {}

    def add(self, node: str, cid: str) -> None:
        self.by_node.setdefault(node, set()).add(cid)
        self.owners.setdefault(cid, set()).add(node)

    def remove(self, node: str, cid: str) -> None:
        cids = self.by_node.get(node)
        if cids is None or cid not in cids:
            return
        cids.discard(cid)
        owners = self.owners[cid]
        owners.discard(node)
        if not owners:
            del self.owners[cid]

    def replace(self, node: str, cids: list[str]) -> None:
        self.drop_node(node)
        for cid in cids:
            self.add(node, cid)

    def drop_node(self, node: str) -> int:
        cids = self.by_node.pop(node, set())
        for cid in cids:
            owners = self.owners.get(cid)
            if owners is not None:
                owners.discard(node)
                if not owners:
                    del self.owners[cid]
        return len(cids)

    def holders(self, cid: str) -> set[str]:
        return self.owners.get(cid, set())


def export_session(node: Node, cid: str, *, clean_start: bool) -> dict[str, Any] | None:
    """End ``cid``'s session on this node for a takeover elsewhere; its state (None when
    there is none, or when ``clean_start``: then it is only ended)."""
    session = node.sessions.get(cid)
    if session is None:
        return None
    handle = session.handle
    if handle is not None:
        session.handle = None
        node.connections -= 1
        will = session.will
        if will is not None and (clean_start or session.will_delay == 0):
            node._publish_will(will, session.info)
        session.will = None
        info = session.info
        if info is not None:  # the connection here ends (the rules' client_disconnected)
            info.set_attr("disconnect_reason", "discarded" if clean_start else "takenover")
            node._ended(info, handle)
        node.hooks.run("session.takenover", session.info, session.info)
        node.metrics.incr("session.takenover")
        handle.kick(ReasonCode.SESSION_TAKEN_OVER)
    node._cancel_timers(session)
    export: dict[str, Any] | None = None
    if not clean_start:
        subs = [
            [f, o.qos, o.no_local, o.retain_as_published, o.retain_handling, o.subscription_id]
            for f, o in session.subscriptions.items()
        ]
        msgs = [
            [
                base64.b64encode(F.encode_message(d.message)).decode(),
                d.qos,
                d.retain,
                list(d.subscription_ids),
                list(d.share) if d.share else None,
            ]
            for d in session.take_undelivered()
        ]
        export = {
            "expiry": session.expiry_interval,
            "created_at": session.created_at,
            "subscriptions": subs,
            "messages": msgs,
        }
    node._terminate(session, "takenover")
    return export


def import_session(node: Node, cid: str, export: dict[str, Any]) -> int:
    """Add a taken-over session's subscriptions and messages to ``cid``'s session here;
    how many messages."""
    session = node.sessions.get(cid)
    if session is None:
        return 0
    store = node.store
    for f, qos, nl, rap, rh, sid in export.get("subscriptions", ()):
        if f in session.subscriptions:
            continue
        opts = SubOptions(int(qos), bool(nl), bool(rap), int(rh), sid)
        session.subscribed(f, opts)
        if session.journal is not None and store is not None:
            store.subscribed(cid, f, opts)
        node.broker.subscribe(cid, f, opts)
    n = 0
    for body, qos, retain, sub_ids, share in export.get("messages", ()):
        [fwd] = F.decode_batch(F.encode_batch([F.record(0, base64.b64decode(body))])[5:])
        d = Delivery(fwd.message, int(qos), bool(retain), tuple(sub_ids),
                     share=(share[0], share[1]) if share else None)
        session.enqueue(d)
        n += 1
    return n
