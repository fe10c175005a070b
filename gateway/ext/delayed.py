"""Delayed publish (EMQX's ``$delayed/{seconds}/{topic}``): a ``message.publish`` subscriber
for the ``$delayed/`` prefix (:meth:`gateway.core.node.Node.add_publish_prefix`).

A message published to ``$delayed/N/t`` is taken out of the publish path (nothing is
routed or retained under the ``$delayed`` topic) and published to ``t`` later:

- ``N`` is decimal digits. ``N <= 42949669`` (EMQX 5's maximum, ~497 days) is an
  interval in seconds from now; a larger ``N`` is a Unix time, accepted within 42949669
  seconds of now (a time already past publishes at once). Anything else (not a number,
  out of range, an empty or wildcard ``t``) is discarded, as EMQX does, and counted in
  ``messages.delayed.invalid``.
- At most ``delayed.max_delayed_messages`` wait at a time (0: no limit). When full a
  QoS 1/2 message is refused (:data:`~protocols.context.PUBLISH_REFUSED`: MQTT 5 answers
  0x97 quota exceeded) and a QoS 0 one dropped, counted in ``messages.delayed.refused``.
- A message that waits keeps its publisher, username, QoS, retain flag and properties;
  its MQTT 5 expiry interval counts from the moment it is published to ``t``.
- Authorization checks the final topic ``t`` (``topic.authorize`` strips the prefix).

Durability: with a :class:`~gateway.store.extensions.DelayedStore` every delayed message
is a row written through the node's group commit before the publisher's acknowledgement
leaves, and deleted in the same commit batch as the deliveries it produces; at start-up
:meth:`DelayedPublisher.restore` loads the rows and fires those already due.

Cluster-wide (:mod:`gateway.cluster.delayed`): ``on_change(pending, alive)`` tells the
cluster of every message added (True) and fired or cancelled (False); ``hold()`` keeps
messages already due from firing until ``release()`` (a restarted node first learns
which of its messages another node published while it was down, and ``cancel`` drops
them); ``publish_for(due, message)`` publishes a message another node held.

Invariants: ``pending`` holds exactly the messages not yet fired or cancelled; the heap
holds every pending id (and possibly ids already cancelled, skipped when popped); one
timer is armed for the earliest due time while anything is pending.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from gateway.core.clock import TimerHandle
from gateway.core.hooks import Priority
from gateway.core.node import Node
from protocols.context import PUBLISH_REFUSED, ClientInfo, Message

__all__ = ["MAX_INTERVAL", "PREFIX", "DelayedPublisher", "Pending", "parse_delayed"]

log = logging.getLogger("gateway.ext.delayed")

PREFIX = "$delayed/"
MAX_INTERVAL = 42949669  # seconds (EMQX 5)
PRIORITY = Priority.AUTHN + 50  # before the retainer, the rules, bridges and traces


def parse_delayed(topic: str, now: float) -> tuple[float, str] | None:
    """``(due, final_topic)`` of a ``$delayed/N/topic`` topic, or None when it is not a
    valid one (see module docstring). ``topic`` must start with ``$delayed/``."""
    rest = topic[len(PREFIX):]
    number, sep, final = rest.partition("/")
    if not sep or not final or not number.isascii() or not number.isdigit():
        return None
    if "+" in final or "#" in final or "\0" in final:
        return None
    n = int(number)
    if n <= MAX_INTERVAL:
        return now + n, final
    if abs(n - now) > MAX_INTERVAL:
        return None
    return max(float(n), now), final


class Journal(Protocol):
    """What the publisher needs of :class:`gateway.store.extensions.DelayedStore`."""

    def added(self, row: Pending) -> None: ...
    def removed(self, id_: int) -> None: ...


@dataclass(slots=True)
class Pending:
    id: int
    due: float
    message: Message  # its topic is the final one


class DelayedPublisher:
    """Holds delayed messages and publishes them when due (see module docstring)."""

    def __init__(
        self, node: Node, *, max_messages: int = 0, journal: Journal | None = None,
        first_id: int = 1,
    ) -> None:
        self.node = node
        self.max_messages = max_messages
        self.journal = journal
        self.pending: dict[int, Pending] = {}
        self._heap: list[tuple[float, int]] = []
        self._timer: TimerHandle | None = None
        self._timer_due = 0.0
        self._next_id = first_id
        self._attached = False
        self.on_change: Callable[[Pending, bool], None] | None = None
        self._held = False

    # -- hooks --------------------------------------------------------------------------

    def attach(self) -> None:
        self.node.add_publish_prefix(PREFIX, self._on_publish)
        self.node.hooks.add("topic.authorize", self._authz_topic, PRIORITY)
        self._attached = True

    def detach(self) -> None:
        if self._attached:
            self.node.remove_publish_prefix(PREFIX, self._on_publish)
            self.node.hooks.remove("topic.authorize", self._authz_topic)
            self._attached = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _authz_topic(self, client: ClientInfo, action: str, topic: str) -> str | None:
        if action != "publish" or not topic.startswith(PREFIX):
            return None
        parsed = parse_delayed(topic, self.node.now())
        return None if parsed is None else parsed[1]

    def _on_publish(self, message: Message) -> int:
        """A publish to ``$delayed/...`` (the core calls this for that prefix only)."""
        metrics = self.node.metrics
        now = self.node.now()
        parsed = parse_delayed(message.topic, now)
        if parsed is None:
            metrics.incr("messages.delayed.invalid")
            log.info("delayed publish to %r discarded: not $delayed/{seconds}/{topic} "
                     "within %d seconds", message.topic, MAX_INTERVAL)
            return 0
        if self.max_messages and len(self.pending) >= self.max_messages:
            metrics.incr("messages.delayed.refused")
            log.warning("delayed publish to %r refused: %d delayed messages, the limit "
                        "(delayed.max_delayed_messages)", message.topic, len(self.pending))
            return PUBLISH_REFUSED if message.qos else 0
        due, final = parsed
        self.add(due, self._copy(message, final))
        metrics.incr("messages.delayed")
        return 0

    @staticmethod
    def _copy(m: Message, topic: str) -> Message:
        copy = Message(topic, m.payload, m.qos, m.retain, m.properties, m.publisher,
                       m.username, m.timestamp, m.expires_at)
        copy.headers = m.headers
        return copy

    # -- the queue ------------------------------------------------------------------------

    def add(self, due: float, message: Message) -> Pending:
        p = Pending(self._next_id, due, message)
        self._next_id += 1
        if self.journal is not None:
            self.journal.added(p)
        self._put(p)
        if self.on_change is not None:
            self.on_change(p, True)
        return p

    def restore(self, rows: Iterable[Pending]) -> None:
        """Put back rows loaded from the store (already journaled)."""
        for p in rows:
            self._next_id = max(self._next_id, p.id + 1)
            self._put(p)
        if self.pending:
            log.info("restored %d delayed messages", len(self.pending))

    def _put(self, p: Pending) -> None:
        self.pending[p.id] = p
        heapq.heappush(self._heap, (p.due, p.id))
        self._arm()

    def cancel(self, id_: int) -> bool:
        p = self.pending.pop(id_, None)
        if p is None:
            return False
        if self.journal is not None:
            self.journal.removed(id_)
        if self.on_change is not None:
            self.on_change(p, False)
        self._arm()
        return True

    def hold(self) -> None:
        """Fire nothing until :meth:`release` (the cluster is learning what others did)."""
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._arm()

    def _arm(self) -> None:
        heap = self._heap
        while heap and heap[0][1] not in self.pending:
            heapq.heappop(heap)
        if not heap:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return
        due = heap[0][0]
        if self._timer is not None:
            if self._timer_due <= due:
                return
            self._timer.cancel()
        self._timer_due = due
        self._timer = self.node.scheduler.call_later(max(0.0, due - self.node.now()), self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self._held:
            return  # release() arms again
        now = self.node.now()
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, id_ = heapq.heappop(heap)
            p = self.pending.pop(id_, None)
            if p is None:
                continue
            if self.journal is not None:
                self.journal.removed(id_)
            self._publish(p, now)
            if self.on_change is not None:
                self.on_change(p, False)
        self._arm()

    def publish_for(self, due: float, message: Message) -> None:
        """Publish now a message another node held until ``due`` (it took it over)."""
        self._publish(Pending(0, due, message), self.node.now())

    def _publish(self, p: Pending, now: float) -> None:
        m = p.message
        if m.expires_at is not None:  # the expiry interval starts now
            m.expires_at = now + max(0.0, m.expires_at - m.timestamp)
        m.timestamp = now
        self.node.metrics.incr("messages.delayed.published")
        try:
            self.node.publish(ClientInfo(client_id=m.publisher, username=m.username), m)
        except Exception:  # never lose the timer over one message
            log.exception("publishing the delayed message %d to %r failed", p.id, m.topic)

    # -- views ----------------------------------------------------------------------------

    def view(self, p: Pending) -> dict[str, object]:
        m = p.message
        return {
            "msgid": str(p.id),
            "node": self.node.settings.node_name,
            "topic": m.topic,
            "qos": m.qos,
            "retain": m.retain,
            "from_clientid": m.publisher,
            "from_username": m.username,
            "publish_at": m.timestamp,
            "delayed_interval": round(p.due - m.timestamp, 3),
            "expected_at": p.due,
            "delayed_remaining": max(0.0, round(p.due - self.node.now(), 3)),
            "payload_size": len(m.payload),
        }

    def views(self) -> list[dict[str, object]]:
        return [self.view(p) for p in sorted(self.pending.values(), key=lambda p: (p.due, p.id))]
