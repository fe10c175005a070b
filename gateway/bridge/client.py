"""The bridge's MQTT client towards the upstream broker: a state machine without sockets.

:class:`UpstreamClient` owns one :class:`~protocols.mqtt.Connection` (client role; the
codec does all encoding and decoding) per connection attempt, the packet ids, keepalive,
the reconnect backoff and the drain of the outbox. It never touches a socket: a
:class:`Dialer` opens connections and reports back through ``link_up``, ``link_failed``,
``data_received``, ``link_lost`` and ``pause_writing``/``resume_writing``, each naming the
:class:`Link` it is about (events of a link that is no longer current are ignored). Time
and timers come from a :class:`~gateway.core.clock.Scheduler`, so tests drive it with a
virtual clock and a fake dialer.

States and transitions (``TRANSITIONS`` is the whole table)::

    STOPPED ──start──▶ CONNECTING ──link up──▶ AWAITING_CONNACK ──CONNACK 0──▶ CONNECTED
                          │  ▲                        │                          │
              failed/timeout │ backoff timer     refused/lost/timeout        lost/error
                          ▼  │                        ▼                          ▼
                        BACKOFF ◀─────────────────────┴──────────────────────────┘
    any state ──stop──▶ STOPPED (a DISCONNECT first when CONNECTED)

Rules:

- Reconnect delays grow ``initial * 2**n`` up to ``max``, times a jitter factor in
  ``[1 - jitter, 1 + jitter]`` (never above ``max``); a successful CONNACK resets them.
  ``connect_timeout`` bounds the TCP/TLS connect plus the CONNACK wait.
- After CONNACK: SUBSCRIBE to every configured subscription (MQTT 5: no-local, retain as
  published, retain handling 1, a subscription identifier per rule), then re-send every
  in-flight entry in the order first sent, with its packet id (PUBLISH with DUP, or
  PUBREL once its PUBREC arrived), then drain the outbox.
- Draining stops while ``inflight`` is full (``max_inflight`` and the server's Receive
  Maximum), while the transport asked to pause writing, and while the ``drain_rate``
  token bucket is empty (a timer resumes it). A QoS 0 entry leaves when written.
- The server's Maximum QoS lowers an entry's QoS, Retain Available 0 clears retain, and a
  PUBLISH over its Maximum Packet Size is dropped (counted ``too_large``).
- Acknowledgements we owe upstream (PUBACK/PUBREC/PUBCOMP of its messages) and our PUBRELs
  wait for the commit ``gate`` when the node's store has pending writes: upstream
  forgets a message only once the local side of it is durable.
- Keepalive: a PINGREQ when nothing was sent for half the keepalive; the link is
  declared dead after 1.5 x keepalive without any packet from upstream.
- A protocol error from upstream, a refused CONNACK or a server DISCONNECT closes the
  link and is kept as ``last_error``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from enum import Enum
from typing import Protocol

from gateway.bridge.outbox import Entry, Outbox
from gateway.bridge.settings import BackoffSettings, BridgeSettings
from gateway.core.clock import Scheduler, TimerHandle
from protocols.mqtt import (
    MQTT_5,
    ConnAck,
    Connect,
    Connection,
    Disconnect,
    MQTTError,
    OutgoingPacketTooLarge,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Role,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
)
from protocols.mqtt.packets import NO_PROPERTIES, Packet
from protocols.mqtt.reason_codes import ReasonCode
from protocols.mqtt.topics import is_shared
from protocols.ratelimit import TokenBucket

log = logging.getLogger("gateway.bridge")

PUMP_BATCH = 512  # entries written per turn before yielding to the loop
RECEIVE_MAXIMUM = 64  # QoS 1/2 messages upstream may have unacknowledged towards us


class State(Enum):
    STOPPED = "stopped"
    CONNECTING = "connecting"
    AWAITING_CONNACK = "awaiting_connack"
    CONNECTED = "connected"
    BACKOFF = "backoff"


TRANSITIONS: dict[State, frozenset[State]] = {
    State.STOPPED: frozenset({State.CONNECTING}),
    State.CONNECTING: frozenset({State.AWAITING_CONNACK, State.BACKOFF, State.STOPPED}),
    State.AWAITING_CONNACK: frozenset({State.CONNECTED, State.BACKOFF, State.STOPPED}),
    State.CONNECTED: frozenset({State.BACKOFF, State.STOPPED}),
    State.BACKOFF: frozenset({State.CONNECTING, State.STOPPED}),
}

_V3_CONNACK = {
    1: "unacceptable protocol version",
    2: "identifier rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorized",
}


def reason_name(code: int) -> str:
    try:
        return f"0x{code:02X} {ReasonCode(code).name.lower().replace('_', ' ')}"
    except ValueError:
        return f"0x{code:02X}"


class Link(Protocol):
    """One connection attempt as the client sees it."""

    def write(self, data: bytes) -> None: ...
    def close(self) -> None:
        """Close after the writes already made (or give up connecting)."""
        ...


class Dialer(Protocol):
    def dial(self, client: UpstreamClient) -> Link:
        """Start connecting; report with ``client.link_up(link)`` or
        ``client.link_failed(link, reason)`` later (never from inside ``dial``)."""
        ...


class CommitGate(Protocol):
    @property
    def dirty(self) -> bool: ...
    def after_commit(self, callback: Callable[[], None]) -> None: ...


class Backoff:
    """Exponential reconnect delays with jitter (see the module docstring)."""

    def __init__(self, settings: BackoffSettings, rng: random.Random) -> None:
        self.settings = settings
        self.rng = rng
        self.attempts = 0

    def next_delay(self) -> float:
        s = self.settings
        base = min(s.max, s.initial * float(2 ** min(self.attempts, 62)))
        self.attempts += 1
        factor = 1.0 + s.jitter * self.rng.uniform(-1.0, 1.0)
        delay: float = min(s.max, base * factor)
        return delay

    def reset(self) -> None:
        self.attempts = 0


class UpstreamClient:
    def __init__(
        self,
        settings: BridgeSettings,
        outbox: Outbox,
        scheduler: Scheduler,
        dialer: Dialer,
        *,
        on_message: Callable[[Publish], bool | None],
        gate: CommitGate | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.outbox = outbox
        self.scheduler = scheduler
        self.dialer = dialer
        self.on_message = on_message
        self.gate = gate
        self.backoff = Backoff(settings.backoff, rng or random.Random())
        self.state = State.STOPPED
        self.link: Link | None = None
        self.conn: Connection | None = None
        self.paused = False
        self.session_present = False
        self.last_error: str | None = None
        self.connected_at: float | None = None
        self.next_attempt_at: float | None = None
        # counters
        self.forwarded = 0  # entries written upstream (each once, re-sends not counted)
        self.acked = 0
        self.received = 0  # PUBLISH from upstream published locally
        self.refused = 0  # of those, refused by the node (its store could not write)
        self.connects = 0
        self.attempts = 0
        # the current connection
        self._window = settings.max_inflight
        self._max_qos = 2
        self._retain_available = True
        self._keepalive = settings.keepalive
        self._last_sent = 0.0
        self._last_recv = 0.0
        self._awaiting_rel: set[int] = set()  # incoming QoS 2 packet ids (kept across links)
        self._pending_subs: dict[int, tuple[str, ...]] = {}
        self._next_pid = 1
        self._held: list[bytes] = []
        self._held_link: Link | None = None
        # timers
        self._reconnect_timer: TimerHandle | None = None
        self._connect_timer: TimerHandle | None = None
        self._keepalive_timer: TimerHandle | None = None
        self._pump_timer: TimerHandle | None = None
        self._rate_timer: TimerHandle | None = None
        rate = settings.drain_rate
        self._bucket = (
            TokenBucket(rate, max(1.0, rate / 10.0), scheduler.time()) if rate > 0 else None
        )
        outbox.on_ready = self.wake

    # -- state ---------------------------------------------------------------------------

    def _set_state(self, new: State) -> None:
        if new not in TRANSITIONS[self.state]:
            raise AssertionError(f"bridge {self.settings.name}: {self.state} -> {new}")
        self.state = new

    @property
    def can_send_now(self) -> bool:
        """Whether a message put now would leave within this loop turn (nothing stops
        the pump): the outbox may then keep a QoS 0 entry in memory only."""
        return (
            self.state is State.CONNECTED
            and not self.paused
            and self._rate_timer is None
        )

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        if self.state is State.STOPPED:
            self._connect()

    def stop(self) -> None:
        """Disconnect (DISCONNECT 0x00 when connected; the session stays upstream) and
        stay down."""
        if self.state is State.STOPPED:
            return
        link, conn = self.link, self.conn
        if self.state is State.CONNECTED and link is not None and conn is not None:
            self._flush_held(link)
            link.write(conn.send(Disconnect()))
        self._teardown()
        self._set_state(State.STOPPED)
        self.next_attempt_at = None

    def _connect(self) -> None:
        self._set_state(State.CONNECTING)
        self._reconnect_timer = None
        self.next_attempt_at = None
        self.attempts += 1
        self.link = self.dialer.dial(self)
        self._connect_timer = self.scheduler.call_later(
            self.settings.connect_timeout, self._connect_timed_out
        )

    def _connect_timed_out(self) -> None:
        self._connect_timer = None
        if self.state in (State.CONNECTING, State.AWAITING_CONNACK):
            self._fail("connect timeout")

    def _fail(self, reason: str, *, warn: bool = True) -> None:
        """Close the current link (if any) and schedule the next attempt."""
        if self.state in (State.STOPPED, State.BACKOFF):
            return
        was_connected = self.state is State.CONNECTED
        self.last_error = reason
        self._teardown()
        self._set_state(State.BACKOFF)
        delay = self.backoff.next_delay()
        self.next_attempt_at = self.scheduler.time() + delay
        self._reconnect_timer = self.scheduler.call_later(delay, self._connect)
        level = logging.WARNING if warn else logging.INFO
        log.log(
            level,
            "bridge %s: %s %s: %s; retrying in %.1fs (%d queued)",
            self.settings.name,
            "disconnected from" if was_connected else "cannot connect to",
            self.settings.upstream,
            reason,
            delay,
            self.outbox.count,
        )

    def _teardown(self) -> None:
        link = self.link
        self.link = None
        self.conn = None
        self.paused = False
        self.connected_at = None
        self._held = []
        self._held_link = None
        self._pending_subs.clear()
        for name in ("_connect_timer", "_keepalive_timer", "_pump_timer", "_rate_timer",
                     "_reconnect_timer"):
            timer = getattr(self, name)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)
        self.outbox.persist_volatile()
        if link is not None:
            link.close()

    # -- events from the dialer ----------------------------------------------------------

    def link_up(self, link: Link) -> None:
        if link is not self.link or self.state is not State.CONNECTING:
            link.close()
            return
        s = self.settings
        self.conn = conn = Connection(Role.CLIENT, protocol_level=s.protocol_level)
        props = NO_PROPERTIES
        if s.protocol_level == MQTT_5:
            props = Properties(
                session_expiry_interval=s.session_expiry_interval,
                receive_maximum=RECEIVE_MAXIMUM,
            )
        connect = Connect(
            client_id=s.client_id,
            protocol_level=s.protocol_level,
            clean_start=s.clean_start,
            keepalive=s.keepalive,
            username=s.username,
            password=s.password,
            properties=props,
        )
        data = conn.send(connect)
        if s.bridge_mode and s.protocol_level != MQTT_5:
            data = _bridge_flag(data)
        self._set_state(State.AWAITING_CONNACK)
        now = self.scheduler.time()
        self._last_recv = now
        self._write(data)

    def link_failed(self, link: Link, reason: str) -> None:
        if link is self.link:
            self._fail(reason)

    def link_lost(self, link: Link, reason: str | None) -> None:
        if link is self.link:
            self._fail(reason or "connection closed by upstream")

    def pause_writing(self, link: Link) -> None:
        if link is self.link:
            self.paused = True

    def resume_writing(self, link: Link) -> None:
        if link is self.link and self.paused:
            self.paused = False
            self.wake()

    def data_received(self, link: Link, data: bytes) -> None:
        if link is not self.link or self.conn is None:
            return
        conn = self.conn
        self._last_recv = self.scheduler.time()
        try:
            conn.receive_data(data)
            while True:
                packet = conn.next_event()
                if packet is None:
                    break
                self._handle(packet)
                if self.link is not link:
                    return
        except MQTTError as exc:
            self._fail(f"protocol error: {exc}")

    # -- packets from upstream -----------------------------------------------------------

    def _handle(self, p: Packet) -> None:
        if self.state is State.AWAITING_CONNACK:
            if isinstance(p, ConnAck):
                self._on_connack(p)
            else:
                self._fail(f"protocol error: {type(p).__name__} before CONNACK")
            return
        if isinstance(p, PubAck):
            self._on_ack(p.packet_id, p.reason_code)
        elif isinstance(p, PubComp):  # after a PUBREC the message is delivered, whatever
            self._on_ack(p.packet_id, 0)  # the code (0x92: a new session lost the flow)
        elif isinstance(p, Publish):
            self._on_publish(p)
        elif isinstance(p, PubRec):
            self._on_pubrec(p)
        elif isinstance(p, PubRel):
            self._on_pubrel(p)
        elif isinstance(p, SubAck):
            self._on_suback(p)
        elif isinstance(p, PingResp | UnsubAck):
            pass
        elif isinstance(p, Disconnect):
            why = p.properties.reason_string
            self._fail(
                f"upstream disconnected: {reason_name(p.reason_code)}"
                + (f" ({why})" if why else "")
            )
        else:
            self._fail(f"protocol error: unexpected {type(p).__name__}")

    def _on_connack(self, p: ConnAck) -> None:
        s = self.settings
        if p.reason_code != 0:
            if s.protocol_level == MQTT_5:
                why = reason_name(p.reason_code)
                if p.properties.reason_string:
                    why += f" ({p.properties.reason_string})"
            else:
                why = _V3_CONNACK.get(p.reason_code, f"return code {p.reason_code}")
            self._fail(f"connection refused: {why}")
            return
        if self._connect_timer is not None:
            self._connect_timer.cancel()
            self._connect_timer = None
        props = p.properties
        conn = self.conn
        assert conn is not None
        self._window = min(s.max_inflight, props.receive_maximum or 65535)
        self._max_qos = props.maximum_qos if props.maximum_qos is not None else 2
        self._retain_available = props.retain_available != 0
        if props.maximum_packet_size:
            conn.max_outgoing_packet_size = props.maximum_packet_size
        self._keepalive = (
            props.server_keep_alive if props.server_keep_alive is not None else s.keepalive
        )
        self.session_present = p.session_present
        if not p.session_present:
            self._awaiting_rel.clear()
        self._set_state(State.CONNECTED)
        self.connects += 1
        self.connected_at = self.scheduler.time()
        self.last_error = None
        self.backoff.reset()
        log.info(
            "bridge %s: connected to %s as %r (session %s, %d queued)",
            s.name, s.upstream, s.client_id,
            "resumed" if p.session_present else "new", self.outbox.count,
        )
        self._schedule_keepalive()
        out: list[bytes] = []
        if s.subscriptions:
            out.append(self._subscribe_packet())
        for pid, e in self.outbox.inflight.items():
            if e.released:
                out.append(conn.send(PubRel(pid)))
            else:
                data = self._publish_bytes(e, pid, dup=True)
                if data is not None:
                    out.append(data)
        if out:
            self._write(b"".join(out))
        self._pump()

    def _subscribe_packet(self) -> bytes:
        """SUBSCRIBE for every rule: MQTT 5 one packet per rule, with the rule's number
        (1-based) as subscription identifier, so a PUBLISH names the rules it matched."""
        s = self.settings
        conn = self.conn
        assert conn is not None
        v5 = s.protocol_level == MQTT_5
        subs = [
            Subscription(  # No Local is a protocol error on a shared subscription
                r.remote, r.qos, no_local=v5 and not is_shared(r.remote),
                retain_as_published=v5, retain_handling=1 if v5 else 0,
            )
            for r in s.subscriptions
        ]
        groups: list[tuple[tuple[Subscription, ...], Properties]] = (
            [((sub,), Properties(subscription_identifiers=(i + 1,))) for i, sub in enumerate(subs)]
            if v5 else [(tuple(subs), NO_PROPERTIES)]
        )
        out = []
        for group, props in groups:
            pid = self._alloc_pid()
            self._pending_subs[pid] = tuple(sub.topic_filter for sub in group)
            out.append(conn.send(Subscribe(pid, group, props)))
        return b"".join(out)

    def _on_suback(self, p: SubAck) -> None:
        filters = self._pending_subs.pop(p.packet_id, ())
        for f, code in zip(filters, p.reason_codes, strict=False):
            if code >= 0x80:
                self.last_error = f"subscription to {f!r} refused: {reason_name(code)}"
                log.warning("bridge %s: %s", self.settings.name, self.last_error)

    def _on_ack(self, packet_id: int, reason_code: int) -> None:
        e = self.outbox.acked(packet_id, reason_code)
        if e is None:
            return
        self.acked += 1
        if reason_code >= 0x80:
            log.warning(
                "bridge %s: upstream refused a message on %r: %s",
                self.settings.name, e.topic, reason_name(reason_code),
            )
        self.wake()

    def _on_pubrec(self, p: PubRec) -> None:
        if p.reason_code >= 0x80:
            self._on_ack(p.packet_id, p.reason_code)
            return
        e = self.outbox.released(p.packet_id)
        conn = self.conn
        if conn is None:
            return
        if e is None and p.packet_id not in self.outbox.inflight:
            # not ours (any more): complete the flow so upstream forgets it
            self._send_ack(conn.send(PubRel(p.packet_id, 0x92 if self._v5 else 0)))
            return
        self._send_ack(conn.send(PubRel(p.packet_id)))

    @property
    def _v5(self) -> bool:
        return self.settings.protocol_level == MQTT_5

    def _on_publish(self, p: Publish) -> None:
        conn = self.conn
        assert conn is not None
        pid = p.packet_id
        if pid is not None and p.qos == 2 and pid in self._awaiting_rel:
            self._send_ack(conn.send(PubRec(pid)))  # a re-send: published already
            return
        self.received += 1
        if self.on_message(p) is False and pid is not None:
            # the node's store cannot take it (disk full, a write error): no
            # acknowledgement, so upstream keeps it and sends it again (after a reconnect)
            self.refused += 1
            return
        if pid is None:
            return
        if p.qos == 1:
            self._send_ack(conn.send(PubAck(pid)))
        else:
            self._awaiting_rel.add(pid)
            self._send_ack(conn.send(PubRec(pid)))

    def _on_pubrel(self, p: PubRel) -> None:
        conn = self.conn
        assert conn is not None
        found = p.packet_id in self._awaiting_rel
        self._awaiting_rel.discard(p.packet_id)
        code = 0 if found or not self._v5 else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        self._send_ack(conn.send(PubComp(p.packet_id, code)))

    # -- writing -------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        link = self.link
        if link is not None:
            self._last_sent = self.scheduler.time()
            link.write(data)

    def _send_ack(self, data: bytes) -> None:
        """Write an acknowledgement once the node's pending store writes are durable."""
        gate = self.gate
        if gate is not None and (self._held or gate.dirty):
            if not self._held:
                self._held_link = self.link
                gate.after_commit(self._release_held)
            self._held.append(data)
            return
        self._write(data)

    def _release_held(self) -> None:
        held, self._held = self._held, []
        if held and self._held_link is self.link and self.link is not None:
            self._write(b"".join(held))
        self._held_link = None

    def _flush_held(self, link: Link) -> None:
        if self._held and self._held_link is link:
            self._write(b"".join(self._held))
        self._held = []

    def _alloc_pid(self) -> int:
        inflight = self.outbox.inflight
        reserved = self.outbox.reserved
        pending = self._pending_subs
        pid = self._next_pid
        for _ in range(65535):
            if pid not in inflight and pid not in reserved and pid not in pending:
                break
            pid = pid % 65535 + 1
        else:  # pragma: no cover - the window is far below 65535
            raise RuntimeError("no free packet id")
        self._next_pid = pid % 65535 + 1
        return pid

    def _publish_bytes(self, e: Entry, pid: int | None, *, dup: bool = False) -> bytes | None:
        conn = self.conn
        assert conn is not None
        qos = e.qos if e.qos <= self._max_qos else self._max_qos
        props = e.properties
        if e.expires_at is not None and self._v5:
            left = max(1, int(e.expires_at - self.scheduler.time()))
            props = _with_expiry(props, left)
        packet = Publish(
            e.topic,
            e.payload,
            qos,
            e.retain and self._retain_available,
            dup and qos > 0,
            pid if qos > 0 else None,
            props if self._v5 else NO_PROPERTIES,
        )
        try:
            return conn.send(packet)
        except OutgoingPacketTooLarge:
            return None

    # -- draining the outbox -------------------------------------------------------------

    def wake(self) -> None:
        """Something may be sendable: drain on the next loop turn (coalesced)."""
        if self._pump_timer is None and self.state is State.CONNECTED:
            self._pump_timer = self.scheduler.call_later(0, self._pump)

    def _pump(self) -> None:
        if self._pump_timer is not None:
            self._pump_timer.cancel()
            self._pump_timer = None
        if self.state is not State.CONNECTED or self.paused or self._rate_timer is not None:
            self.outbox.persist_volatile()
            return
        outbox = self.outbox
        inflight = outbox.inflight
        window = self._window
        bucket = self._bucket
        max_qos = self._max_qos
        out: list[bytes] = []
        sent = 0
        more = False
        while True:
            e = outbox.peek()
            if e is None:
                break
            if sent >= PUMP_BATCH:
                more = True
                break
            qos = e.qos if e.qos <= max_qos else max_qos
            if qos and len(inflight) >= window:
                break
            if bucket is not None and not bucket.admit(self.scheduler.time()):
                wait = max(0.001, (1.0 - bucket.tokens) / bucket.rate)
                self._rate_timer = self.scheduler.call_later(wait, self._rate_ready)
                break
            outbox.take()
            if qos == 0:
                data = self._publish_bytes(e, None)
                if data is None:
                    outbox.discard(e, "too_large")
                    continue
                outbox.written(e)
            elif e.released and e.packet_id is not None:  # QoS 2 loaded after a restart
                assert self.conn is not None
                data = self.conn.send(PubRel(e.packet_id))
                outbox.sent(e, e.packet_id)
            else:
                pid = e.packet_id if e.packet_id is not None else self._alloc_pid()
                data = self._publish_bytes(e, pid, dup=e.packet_id is not None)
                if data is None:
                    outbox.discard(e, "too_large")
                    continue
                outbox.sent(e, pid)
            out.append(data)
            sent += 1
        if out:
            self.forwarded += sent
            self._write(b"".join(out))
        if more and not self.paused:
            self._pump_timer = self.scheduler.call_later(0, self._pump)
        else:
            outbox.persist_volatile()

    def _rate_ready(self) -> None:
        self._rate_timer = None
        self._pump()

    # -- keepalive -----------------------------------------------------------------------

    def _schedule_keepalive(self) -> None:
        if self._keepalive > 0:
            self._keepalive_timer = self.scheduler.call_later(
                self._keepalive / 2.0, self._keepalive_tick
            )

    def _keepalive_tick(self) -> None:
        self._keepalive_timer = None
        if self.state is not State.CONNECTED or self.conn is None:
            return
        now = self.scheduler.time()
        if now - self._last_recv > self._keepalive * 1.5:
            self._fail("keepalive timeout: nothing from upstream")
            return
        if now - self._last_sent >= self._keepalive / 2.0:
            self._write(self.conn.send(PingReq()))
        self._schedule_keepalive()


def _with_expiry(props: Properties, seconds: int) -> Properties:
    from dataclasses import replace

    return replace(props, message_expiry_interval=seconds)


def _bridge_flag(connect: bytes) -> bytes:
    """Set the bridge bit (0x80) of the protocol level in an encoded 3.x CONNECT
    (mosquitto's and EMQX's ``bridge_mode``/``try_private``: the server then neither
    echoes our own messages back nor clears their retain flag)."""
    i = 1
    while connect[i] & 0x80:  # the remaining length's continuation bytes
        i += 1
    i += 1  # variable header: protocol name (2-byte length + name), then the level
    name_len = int.from_bytes(connect[i : i + 2], "big")
    level = i + 2 + name_len
    out = bytearray(connect)
    out[level] |= 0x80
    return bytes(out)
