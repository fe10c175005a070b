"""A client's session: subscriptions, outgoing inflight window, offline queue.

The session is protocol-neutral; it pushes deliveries to whatever
:class:`~protocols.context.ConnectionHandle` is attached and learns of acknowledgements
through ``puback`` / ``pubrec`` / ``pubcomp``.

Invariants:
- ``inflight`` holds at most ``receive_maximum`` QoS 1/2 deliveries, each with a unique
  packet id in 1..65535; ids in ``released`` are QoS 2 deliveries whose PUBREC arrived
  (PUBREL sent, PUBCOMP awaited).
- ``mqueue`` is FIFO and bounded by ``max_mqueue_len`` (0 = unbounded); an overflow drops
  per ``overflow`` and is reported through ``on_drop`` — never silently.
- Nothing leaves ``inflight`` except by acknowledgement, ``discard`` (the channel could not
  send it, e.g. too large for the client) or the end of the session.
- Expired messages are dropped (and reported) before they are first sent.
- When ``journal`` is set (a persistent session on a durable node) every change to
  ``inflight``, ``mqueue``, ``released`` and ``awaiting_rel`` of a QoS 1/2 delivery is
  written to it, in the order it happens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from protocols.context import ConnectionHandle, Delivery, Message, SubOptions
from protocols.empties import EMPTY_DEQUE, EMPTY_DICT
from protocols.rare import rare_set

DropCallback = Callable[[str, Delivery], None]
AckCallback = Callable[["Session", Delivery], None]

NEVER_EXPIRE = 0xFFFFFFFF


# shared empties (protocols.empties): an idle session holds no queue or dict of its own
_NO_QUEUE: Any = EMPTY_DEQUE
_NO_DICT: Any = EMPTY_DICT


class SessionConfig:
    """What every session of a node shares: one object per node instead of six slots
    per session. ``on_drop`` reports a dropped delivery, ``on_ack`` an acknowledged one."""

    __slots__ = ("drop_oldest", "max_mqueue_len", "now", "on_ack", "on_drop", "store_qos0")

    def __init__(
        self,
        *,
        max_mqueue_len: int,
        store_qos0: bool,
        drop_oldest: bool,
        now: Callable[[], float],
        on_drop: DropCallback,
        on_ack: AckCallback,
    ) -> None:
        self.max_mqueue_len = max_mqueue_len
        self.store_qos0 = store_qos0
        self.drop_oldest = drop_oldest
        self.now = now
        self.on_drop = on_drop
        self.on_ack = on_ack


class Journal(Protocol):
    """Where a persistent session records its changes (gateway.store.SessionStore)."""

    def queued(self, client_id: str, d: Delivery) -> None: ...
    def assigned(self, d: Delivery) -> None: ...
    def released(self, d: Delivery) -> None: ...
    def removed(self, d: Delivery) -> None: ...
    def awaiting_rel_added(self, client_id: str, packet_id: int) -> None: ...
    def awaiting_rel_removed(self, client_id: str, packet_id: int) -> None: ...


class Session:
    # Only what is set for few sessions at a time is kept out of the slots, in a property
    # over ``_rare`` (protocols.rare; a rare value costs a dict): the will-delay timer
    # runs only between a disconnect and the will, and few wills have a delay. A will, an
    # expiry and the expiry timer of an offline session are common.

    __slots__ = (
        "client_id",
        "subscriptions",
        "handle",
        "inflight",
        "released",
        "mqueue",
        "receive_maximum",
        "config",
        "awaiting_rel",
        "_rare",
        "expiry_interval",
        "will",
        "expiry_timer",
        "created_at",
        "_next_pid",
        "info",
        "journal",
    )

    _rare: dict[str, Any] | None  # the rare attributes' values (protocols.rare)

    @property
    def will_timer(self) -> Any:
        r = self._rare
        v: Any = None if r is None else r.get("will_timer")
        return v

    @will_timer.setter
    def will_timer(self, value: Any) -> None:
        self._rare = rare_set(self._rare, "will_timer", value, None)

    # the will's delay (MQTT 5 Will Delay Interval): most wills have none
    @property
    def will_delay(self) -> int:
        r = self._rare
        v: int = 0 if r is None else r.get("will_delay", 0)
        return v

    @will_delay.setter
    def will_delay(self, value: int) -> None:
        self._rare = rare_set(self._rare, "will_delay", value, 0)

    def __init__(
        self,
        client_id: str,
        *,
        receive_maximum: int,
        config: SessionConfig,
    ) -> None:
        self.client_id = client_id
        # the four dicts start as the shared _NO_DICT and are made on first write
        self.subscriptions: dict[str, SubOptions] = _NO_DICT
        self.handle: ConnectionHandle | None = None
        self.inflight: dict[int, Delivery] = _NO_DICT
        # QoS 2 packet ids whose PUBREC arrived (a dict: smaller than an empty set)
        self.released: dict[int, None] = _NO_DICT
        self.mqueue: deque[Delivery] = _NO_QUEUE  # a real deque on first use
        self.receive_maximum = receive_maximum
        self.config = config
        # incoming QoS 2 packet ids whose PUBREL we await -> time received
        self.awaiting_rel: dict[int, float] = _NO_DICT
        self._rare = None
        self.expiry_interval = 0
        self.will: Message | None = None
        self.expiry_timer: Any = None
        self._next_pid = 1
        self.created_at = config.now()
        self.info: Any = None  # the ClientInfo of the last connection
        self.journal: Journal | None = None

    @property
    def max_mqueue_len(self) -> int:
        return self.config.max_mqueue_len

    # -- state that is made on first use -------------------------------------------

    def subscribed(self, topic_filter: str, options: SubOptions) -> None:
        """Record a subscription (replacing the options of an existing one)."""
        subs = self.subscriptions
        if subs is _NO_DICT:
            subs = self.subscriptions = {}
        subs[topic_filter] = options

    def _own_inflight(self) -> dict[int, Delivery]:
        inflight = self.inflight
        if inflight is _NO_DICT:
            inflight = self.inflight = {}
        return inflight

    def inflight_restored(self, delivery: Delivery) -> None:
        """Put back an inflight delivery loaded from the store (already journaled)."""
        assert delivery.packet_id is not None
        self._own_inflight()[delivery.packet_id] = delivery

    def awaiting_rel_restored(self, packet_id: int, since: float) -> None:
        """Put back an awaited PUBREL loaded from the store (already journaled)."""
        if self.awaiting_rel is _NO_DICT:
            self.awaiting_rel = {}
        self.awaiting_rel[packet_id] = since

    # -- outgoing ------------------------------------------------------------------

    def set_receive_maximum(self, value: int) -> None:
        self.receive_maximum = max(1, value)

    def enqueue(self, delivery: Delivery) -> None:
        """Accept one delivery: send it now if possible, else queue it."""
        handle = self.handle
        if handle is None:
            if delivery.qos == 0 and not self.config.store_qos0:
                self.config.on_drop("qos0_offline", delivery)
                return
            self._queue(delivery)
            return
        if delivery.qos == 0:
            if self.mqueue:
                self._queue(delivery)
                return
            expires = delivery.message.expires_at
            if expires is not None and expires <= self.config.now():
                self.config.on_drop("expired", delivery)
                return
            handle.deliver([delivery])
            return
        if self.mqueue or len(self.inflight) >= self.receive_maximum:
            self._queue(delivery)
            return
        expires = delivery.message.expires_at
        if expires is not None and expires <= self.config.now():
            self.config.on_drop("expired", delivery)
            return
        delivery.packet_id = self._allocate_pid()
        self._own_inflight()[delivery.packet_id] = delivery
        if self.journal is not None:
            self.journal.queued(self.client_id, delivery)
        handle.deliver([delivery])

    def _queue(self, delivery: Delivery) -> None:
        limit = self.config.max_mqueue_len
        journal = self.journal
        if limit and len(self.mqueue) >= limit:
            if self.config.drop_oldest:
                oldest = self.mqueue.popleft()
                if journal is not None:
                    journal.removed(oldest)
                self.config.on_drop("queue_full", oldest)
            else:
                self.config.on_drop("queue_full", delivery)
                return
        if self.mqueue is _NO_QUEUE:
            self.mqueue = deque()
        self.mqueue.append(delivery)
        if journal is not None and delivery.qos > 0:
            journal.queued(self.client_id, delivery)

    def _allocate_pid(self) -> int:
        pid = self._next_pid
        inflight = self.inflight
        while pid in inflight:
            pid = pid % 65535 + 1
        self._next_pid = pid % 65535 + 1
        return pid

    def drain(self) -> None:
        """Move queued deliveries into the inflight window and send them."""
        handle = self.handle
        if handle is None or not self.mqueue:
            return
        out: list[Delivery] = []
        now = self.config.now()
        mqueue = self.mqueue
        journal = self.journal
        while mqueue:
            d = mqueue[0]
            if d.qos > 0 and len(self.inflight) >= self.receive_maximum:
                break
            mqueue.popleft()
            expires = d.message.expires_at
            if expires is not None and expires <= now:
                if journal is not None:
                    journal.removed(d)
                self.config.on_drop("expired", d)
                continue
            if d.qos > 0:
                d.packet_id = self._allocate_pid()
                self._own_inflight()[d.packet_id] = d
                if journal is not None:
                    journal.assigned(d)
            out.append(d)
        if not mqueue:
            self.mqueue = _NO_QUEUE  # give the deque back: idle sessions stay small
        if out:
            handle.deliver(out)

    def resume(self) -> None:
        """After (re)connecting: re-send the inflight window with DUP, then the queue."""
        handle = self.handle
        if handle is None:
            return
        again: list[Delivery] = []
        for pid, d in self.inflight.items():
            if pid in self.released:
                handle.release(pid)
            else:
                d.dup = True
                again.append(d)
        if again:
            handle.deliver(again)
        self.drain()

    # -- acknowledgements ------------------------------------------------------------

    def puback(self, packet_id: int, *, drain: bool = True) -> bool:
        """Acknowledge a QoS 1 delivery. ``drain=False`` leaves refilling the window to
        the caller (one :meth:`drain` after a batch of acknowledgements, so the queued
        deliveries leave together)."""
        d = self.inflight.get(packet_id)
        if d is None or d.qos != 1:
            return False
        del self.inflight[packet_id]
        if self.journal is not None:
            self.journal.removed(d)
        self.config.on_ack(self, d)
        if drain:
            self.drain()
        return True

    def pubrec(self, packet_id: int) -> bool:
        d = self.inflight.get(packet_id)
        if d is None or d.qos != 2:
            return False
        if self.released is _NO_DICT:
            self.released = {}
        self.released[packet_id] = None
        if self.journal is not None:
            self.journal.released(d)
        return True

    def pubcomp(self, packet_id: int) -> bool:
        if packet_id not in self.released:
            return False
        self.released.pop(packet_id, None)
        d = self.inflight.pop(packet_id, None)
        if d is not None:
            if self.journal is not None:
                self.journal.removed(d)
            self.config.on_ack(self, d)
        self.drain()
        return True

    def discard(self, packet_id: int) -> None:
        """The channel could not send this delivery; forget it (already reported)."""
        d = self.inflight.pop(packet_id, None)
        self.released.pop(packet_id, None)
        if d is not None and self.journal is not None:
            self.journal.removed(d)
        self.drain()

    def await_rel(self, packet_id: int) -> None:
        if packet_id not in self.awaiting_rel and self.journal is not None:
            self.journal.awaiting_rel_added(self.client_id, packet_id)
        self.awaiting_rel_restored(packet_id, self.config.now())

    def complete_rel(self, packet_id: int) -> bool:
        if self.awaiting_rel.pop(packet_id, None) is None:
            return False
        if self.journal is not None:
            self.journal.awaiting_rel_removed(self.client_id, packet_id)
        return True

    # -- end of life ---------------------------------------------------------------

    def queue_restored(self, delivery: Delivery) -> None:
        """Put back a delivery loaded from the store (already journaled)."""
        if self.mqueue is _NO_QUEUE:
            self.mqueue = deque()
        self.mqueue.append(delivery)

    def take_undelivered(self) -> list[Delivery]:
        """Everything not yet acknowledged (inflight first, then queued); empties both."""
        pending = [d for pid, d in self.inflight.items() if pid not in self.released]
        pending.extend(self.mqueue)
        self.inflight.clear()
        self.released.clear()
        self.mqueue = _NO_QUEUE
        return pending
