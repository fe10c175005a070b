"""Exclusive subscriptions (EMQX's ``$exclusive/{topic}``): hook subscribers in the core.

Enabled by ``mqtt.exclusive_subscription``. A SUBSCRIBE to ``$exclusive/t`` subscribes the
session to ``t`` and makes its client the holder of ``t``:

- at most one client holds ``t`` at a time (on this node; see below). Another client's
  ``$exclusive/t`` is refused with reason code 0x97 (quota exceeded) as in EMQX, counted in
  ``subscriptions.exclusive.refused``; the holder subscribing again is accepted;
- plain subscriptions to ``t`` by other clients are not affected (EMQX's behaviour);
- the hold ends when the holder unsubscribes ``t`` (as ``$exclusive/t`` or ``t``) or its
  session ends (``session.terminated``: clean disconnect of a non-persistent session,
  expiry, discard, takeover with clean start);
- authorization checks ``t`` (``topic.authorize``), the session lists ``t``.

Across a cluster: a hold is also a route of the holder's node under the marker key
``$exclusive/t`` (a broker subscription of the holder that no message reaches: publishes
to ``$exclusive/...`` are dropped), which the cluster streams to every peer with the
other routes; a node refuses ``$exclusive/t`` while a peer announces that key. This is
not a consensus: two claims on two nodes within the route streaming delay (about a link
round trip) can both succeed, and a partition lets each side grant its own.

Invariants: ``holders[t] == c`` exactly when ``t in held[c]``, and exactly then the
broker has ``c`` subscribed to the marker ``$exclusive/t``.

A persistent session restored at start-up keeps its subscription to ``t`` but not the
hold (docs/mqtt-extensions.md).
"""

from __future__ import annotations

import logging

from gateway.core.hooks import Priority, Stop
from gateway.core.node import Node
from protocols.context import ClientInfo, Message, SubOptions
from protocols.mqtt.reason_codes import ReasonCode

__all__ = ["PREFIX", "ExclusiveSubscriptions"]

log = logging.getLogger("gateway.ext.exclusive")

PREFIX = "$exclusive/"
PRIORITY = Priority.AUTHN  # before any other client.subscribe subscriber
_MARKER = SubOptions()


class ExclusiveSubscriptions:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.holders: dict[str, str] = {}  # topic -> client id
        self.held: dict[str, set[str]] = {}  # client id -> topics
        self._attached = False

    def attach(self) -> None:
        hooks = self.node.hooks
        hooks.add("topic.authorize", self._authz_topic, PRIORITY)
        hooks.add("client.subscribe", self._subscribe, PRIORITY)
        hooks.add("client.unsubscribe", self._unsubscribe, PRIORITY)
        hooks.add("session.unsubscribed", self._unsubscribed)
        hooks.add("session.terminated", self._terminated)
        self.node.add_publish_prefix(PREFIX, self._publish)
        self._attached = True

    def detach(self) -> None:
        if not self._attached:
            return
        hooks = self.node.hooks
        hooks.remove("topic.authorize", self._authz_topic)
        hooks.remove("client.subscribe", self._subscribe)
        hooks.remove("client.unsubscribe", self._unsubscribe)
        hooks.remove("session.unsubscribed", self._unsubscribed)
        hooks.remove("session.terminated", self._terminated)
        self.node.remove_publish_prefix(PREFIX, self._publish)
        self._attached = False

    # -- hooks ----------------------------------------------------------------------------

    def _authz_topic(self, client: ClientInfo, action: str, topic: str) -> str | None:
        if action == "subscribe" and topic.startswith(PREFIX):
            return topic[len(PREFIX):]
        return None

    def _subscribe(self, client: ClientInfo, options: SubOptions, topic: str) -> object:
        if not topic.startswith(PREFIX):
            return None
        real = topic[len(PREFIX):]
        if not real:
            return Stop(int(ReasonCode.TOPIC_FILTER_INVALID))
        cid = client.client_id
        holder = self.holders.get(real)
        if holder is None:
            holder = self._remote_holder(topic)
        if holder is not None and holder != cid:
            self.node.metrics.incr("subscriptions.exclusive.refused")
            log.info("exclusive subscription to %r by %s refused: %s holds it", real, cid, holder)
            return Stop(int(ReasonCode.QUOTA_EXCEEDED))
        if holder is None:
            self.holders[real] = cid
            self.held.setdefault(cid, set()).add(real)
            self.node.broker.subscribe(cid, topic, _MARKER)  # the cluster sees the route
        return real

    def _remote_holder(self, marker: str) -> str | None:
        """A peer node announcing the marker route, as "a client on <node>"."""
        cluster = self.node.cluster
        routes = getattr(cluster, "routes", None) if cluster is not None else None
        nodes = routes.nodes_of.get(marker) if routes is not None else None
        return f"a client on {sorted(nodes)[0]}" if nodes else None

    def _publish(self, message: Message) -> int:
        """A publish to ``$exclusive/...``: dropped (the marker routes carry none)."""
        self.node.metrics.dropped("exclusive_topic")
        return 0

    def _unsubscribe(self, client: ClientInfo, topic: str) -> str | None:
        return topic[len(PREFIX):] if topic.startswith(PREFIX) else None

    def _unsubscribed(self, client: ClientInfo, topic: str) -> None:
        self.release(client.client_id, topic)

    def _terminated(self, client: ClientInfo | None, why: str) -> None:
        if client is None:
            return
        for topic in list(self.held.get(client.client_id, ())):
            self.release(client.client_id, topic)

    # -- state ----------------------------------------------------------------------------

    def release(self, client_id: str, topic: str) -> bool:
        if self.holders.get(topic) != client_id:
            return False
        del self.holders[topic]
        self.node.broker.unsubscribe(client_id, PREFIX + topic)
        topics = self.held[client_id]
        topics.discard(topic)
        if not topics:
            del self.held[client_id]
        return True

    def views(self) -> list[dict[str, str | None]]:
        """The holds on this node (with the client), then those peers announce (the
        client is not known here: None)."""
        here = self.node.settings.node_name
        out: list[dict[str, str | None]] = [
            {"topic": t, "clientid": c, "node": here} for t, c in sorted(self.holders.items())]
        cluster = self.node.cluster
        routes = getattr(cluster, "routes", None) if cluster is not None else None
        if routes is not None:
            for peer, keys in sorted(routes.by_node.items()):
                out.extend({"topic": k[len(PREFIX):], "clientid": None, "node": peer}
                           for k in sorted(keys) if k.startswith(PREFIX))
        return out
