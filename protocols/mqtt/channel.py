"""The MQTT server channel: packets in, broker operations and effects out.

One channel per network connection. The transport shell feeds it bytes
(``handle_data``), timer expiries (``on_timer``) and the end of the connection
(``connection_lost``); the core pushes deliveries through ``deliver``/``release``/``kick``
(via the shell, which implements :class:`~protocols.context.ConnectionHandle`). Every
entry point returns the effects to carry out, in order.

Invariants:
- Nothing but a CONNACK (or a CONNACK then Close) is written before the session is open;
  deliveries pushed during the CONNECT are held until the CONNACK is out.
- Effects produced by re-entrant calls (the core delivering to this very connection while
  one of its packets is being handled) are appended in order to the outer call's list.
- The core learns of the end of the connection exactly once (``context.close``).
- After a Close effect the channel ignores further input.
- Authentication may finish later: while the core decides (``AUTHENTICATING``) the codec
  keeps buffering but no packet is parsed; the answer comes back through
  ``ConnectionHandle.call_channel`` and the buffered packets are then handled in order.
  During an MQTT 5 enhanced authentication exchange (``AUTH_EXCHANGE``) only AUTH and
  DISCONNECT are accepted. The idle timer (armed at accept) bounds both, and what is
  buffered while authenticating is bounded by ``max_packet_size`` (beyond it, 0x97).
- Authorization may finish later too (an HTTP source asking its service): a PUBLISH or
  SUBSCRIBE whose decision is pending suspends the parsing of this connection's input
  (``_authz_wait``); the codec keeps buffering (beyond ``max_packet_size``, reading
  pauses a second at a time), deliveries to the client carry on, and the answer comes
  back through ``call_channel`` (``authz_result``): the packet is finished, then the
  buffered packets are handled in order. So a client's publishes and subscriptions keep
  their order; other connections are not held up. Decisions known at once (rules, the
  cache) take the synchronous path, with no cost of their own.
"""

from __future__ import annotations

import functools
import logging
import struct
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from protocols.context import (
    AUTH_PENDING,
    RESUBSCRIBED,
    AuthExchange,
    AuthStep,
    ClientInfo,
    ConnectionHandle,
    Delivery,
    GatewayContext,
    Message,
    PendingDecision,
    SessionAPI,
    SubOptions,
    subscribe_refused,
)
from protocols.effects import CancelTimer, Close, Effect, Pause, SetTimer, mark_unheld
from protocols.empties import EMPTY_DICT, NOT_BUSY
from protocols.mqtt.codec import (
    encode,
    encode_publish,
    encode_publish_with_id,
    publish_packet_id_offset,
)
from protocols.mqtt.connection import Connection, Role
from protocols.mqtt.errors import LocalProtocolError, RemoteProtocolError, Violation
from protocols.mqtt.packets import (
    MQTT_5,
    NO_PROPERTIES,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
)
from protocols.mqtt.reason_codes import ReasonCode, to_v3_connack
from protocols.mqtt.settings import MqttSettings, State
from protocols.mqtt.topics import is_wildcard, parse_shared
from protocols.rare import rare_set
from protocols.ratelimit import TokenBucket

__all__ = ["MqttChannel", "MqttSettings", "State"]

log = logging.getLogger("protocols.mqtt.channel")

RC = ReasonCode
_PID = struct.Struct(">H").pack  # a packet id, as in an encoded PUBLISH
_ACK = struct.Struct(">BBH")  # PUBACK/PUBREC/PUBREL/PUBCOMP: type+flags, length 2, packet id
_PINGRESP = b"\xd0\x00"
NO_EXPIRY = 0xFFFFFFFF
# The alias maps of a connection that has none (most): shared, and writing to it fails.
_NO_ALIASES: Any = EMPTY_DICT
# ``_out`` between entry points: no list held by an idle connection; appending is a bug.
_NOT_BUSY: Any = NOT_BUSY


def _effects_outside_an_entry_point() -> None:
    """Pure Python raises at the append (NotBusy.append); compiled, ``list.append`` is
    inlined and the effect lands in the shared list: found here, at the next entry
    point's end, instead of growing silently."""
    lost = list(_NOT_BUSY)
    _NOT_BUSY.clear()
    raise RuntimeError(f"effects made outside an entry point: {lost!r}")


# Keepalive values above 256 (not cached by CPython) shared between connections: a fleet
# uses a handful of them, and each would otherwise be a 32-byte int per connection.
_INTS: dict[int, int] = {}
# Timer effects are frozen: one per (name, seconds) shared by every connection, not one
# made per CONNECT (a fleet uses a handful of keepalives); bounded, in case it does not.
_TIMERS: dict[tuple[str, float], SetTimer] = {}
_CANCEL_IDLE = CancelTimer("idle")
# a 3.1.1 / 3.1 CONNACK that accepts: its four bytes (session present or not)
_CONNACK_V3 = (b"\x20\x02\x00\x00", b"\x20\x02\x01\x00")


def _timer(name: str, seconds: float) -> SetTimer:
    timer = _TIMERS.get((name, seconds))
    if timer is None:
        if len(_TIMERS) >= 256:
            _TIMERS.clear()
        timer = _TIMERS[name, seconds] = SetTimer(name, seconds)
    return timer


# reason codes whose EMQX disconnect reason is not the code's own name
_CLOSE_REASONS: dict[int, str] = {RC.KEEP_ALIVE_TIMEOUT: "keepalive_timeout",
                                  RC.DISCONNECT_WITH_WILL: "disconnect_with_will_message"}


def _rc_name(code: int) -> str:
    """A reason code's name as EMQX spells disconnect reasons (``protocol_error``)."""
    try:
        return RC(code).name.lower()
    except ValueError:
        return f"reason_0x{code:02x}"


def _shared_int(n: int) -> int:
    return _INTS.setdefault(n, n)


RX_GRAIN = 1 / 64  # seconds: the resolution of last_rx
_rx_mark = [0.0]  # the last mark handed out (one float shared by many connections)


def _rx_time(now: float) -> float:
    """``now`` rounded UP to the 1/64 s grid, as the one float object of that mark:
    connections that receive within one grain share it (24 bytes each otherwise).
    Never earlier than ``now``: a keepalive deadline only moves later, by <= 1/64 s."""
    mark = _rx_mark[0]
    if mark - RX_GRAIN < now <= mark:
        return mark
    mark = _rx_mark[0] = -(-now // RX_GRAIN) * RX_GRAIN
    return mark


_PARSING = frozenset({State.CONNECTING, State.AUTH_EXCHANGE, State.CONNECTED})
# Plain names for the states the per-packet path compares with: reading an Enum member
# from its class goes through a descriptor in Python 3.11 (~4x a module global).
_CONNECTED = State.CONNECTED
_CLOSED = State.CLOSED


class _Wait(Exception):
    """Internal: an authorization decision is pending; stop handling input for now."""


class _Disconnect(Exception):
    """Internal: end the connection with this reason code (DISCONNECT in 5.0)."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code
        self.why = why


def _publish_properties(p: Properties) -> Properties:
    """Only the properties that travel with the application message."""
    if p is NO_PROPERTIES:
        return p
    if p.topic_alias is None and not p.subscription_identifiers:
        return p
    return replace(p, topic_alias=None, subscription_identifiers=())


def _will_properties(p: Properties) -> Properties:
    if p is NO_PROPERTIES:
        return p
    return Properties(
        payload_format_indicator=p.payload_format_indicator,
        message_expiry_interval=p.message_expiry_interval,
        content_type=p.content_type,
        response_topic=p.response_topic,
        correlation_data=p.correlation_data,
        user_properties=p.user_properties,
    )


class _Guard:
    """A channel's protection state: the rate buckets, reading paused until (monotonic),
    the start of the packet being received and whether its timer runs, the buffered
    count after the last input, and the PUBLISH packets not yet charged.

    A channel holds one from its start when a rate is configured (and keeps it);
    otherwise only while a partial packet is buffered and ``packet_timeout`` is set (it
    is dropped once the buffer is drained), so an idle channel holds none.
    """

    __slots__ = (
        "buffered_before",
        "bytes",
        "messages",
        "packet_timer",
        "partial_since",
        "paused_until",
        "published",
    )

    def __init__(self, messages: TokenBucket | None, bytes_: TokenBucket | None) -> None:
        self.messages = messages
        self.bytes = bytes_
        self.paused_until = 0.0
        self.partial_since: float | None = None
        self.packet_timer = False
        self.buffered_before = 0
        self.published = 0


class MqttChannel:
    # One channel per connection: slots keep an idle connection small (bench/README.md);
    # what few connections hold at a time is kept out of them, in properties over
    # ``_rare`` (protocols.rare; a rare value costs a dict while set), after __slots__.
    __slots__ = (
        "_rare",
        "expiry_interval",
        "peer_cert",
        "_guard",
        "_monotonic",
        "_out",
        "client_alias_max",
        "conn",
        "context",
        "handle",
        "info",
        "keepalive",
        "last_rx",
        "session",
        "settings",
        "state",
        "version",
    )

    # -- rare attributes: for authentication the CONNECT (and assigned client id) while
    # it is decided, the enhanced authentication method and exchange, and data for the
    # CONNACK; what is set only before the CONNACK or at the end: the peer address (until
    # ClientInfo holds it), deliveries pushed before the CONNACK, whether the core has
    # been told of the end; topic aliases (MQTT 5), in and out: the shared read-only empty
    # mapping until the first alias, then a one-entry dict (an empty one would equal the
    # default), then filled; a pending authorization decision and what acts on its answer
    # (module docstring)

    _rare: dict[str, Any] | None  # the rare attributes' values (protocols.rare)

    @property
    def _pending_connect(self) -> tuple[Connect, str | None] | None:
        r = self._rare
        v: tuple[Connect, str | None] | None = None if r is None else r.get("_pending_connect")
        return v

    @_pending_connect.setter
    def _pending_connect(self, value: tuple[Connect, str | None] | None) -> None:
        self._rare = rare_set(self._rare, "_pending_connect", value, None)

    @property
    def _auth_method(self) -> str | None:
        r = self._rare
        v: str | None = None if r is None else r.get("_auth_method")
        return v

    @_auth_method.setter
    def _auth_method(self, value: str | None) -> None:
        self._rare = rare_set(self._rare, "_auth_method", value, None)

    @property
    def _exchange(self) -> AuthExchange | None:
        r = self._rare
        v: AuthExchange | None = None if r is None else r.get("_exchange")
        return v

    @_exchange.setter
    def _exchange(self, value: AuthExchange | None) -> None:
        self._rare = rare_set(self._rare, "_exchange", value, None)

    @property
    def _auth_data_out(self) -> bytes | None:
        r = self._rare
        v: bytes | None = None if r is None else r.get("_auth_data_out")
        return v

    @_auth_data_out.setter
    def _auth_data_out(self, value: bytes | None) -> None:
        self._rare = rare_set(self._rare, "_auth_data_out", value, None)

    @property
    def peer(self) -> tuple[str, int] | None:
        r = self._rare
        v: tuple[str, int] | None = None if r is None else r.get("peer")
        return v

    @peer.setter
    def peer(self, value: tuple[str, int] | None) -> None:
        self._rare = rare_set(self._rare, "peer", value, None)

    @property
    def _held(self) -> list[Delivery] | None:
        r = self._rare
        v: list[Delivery] | None = None if r is None else r.get("_held")
        return v

    @_held.setter
    def _held(self, value: list[Delivery] | None) -> None:
        self._rare = rare_set(self._rare, "_held", value, None)

    @property
    def _aliases_in(self) -> dict[int, str]:
        r = self._rare
        v: dict[int, str] = _NO_ALIASES if r is None else r.get("_aliases_in", _NO_ALIASES)
        return v

    @_aliases_in.setter
    def _aliases_in(self, value: dict[int, str]) -> None:
        self._rare = rare_set(self._rare, "_aliases_in", value, _NO_ALIASES)

    @property
    def _aliases_out(self) -> dict[str, int]:
        r = self._rare
        v: dict[str, int] = _NO_ALIASES if r is None else r.get("_aliases_out", _NO_ALIASES)
        return v

    @_aliases_out.setter
    def _aliases_out(self, value: dict[str, int]) -> None:
        self._rare = rare_set(self._rare, "_aliases_out", value, _NO_ALIASES)

    @property
    def _core_closed(self) -> bool:
        r = self._rare
        v: bool = False if r is None else r.get("_core_closed", False)
        return v

    @_core_closed.setter
    def _core_closed(self, value: bool) -> None:
        self._rare = rare_set(self._rare, "_core_closed", value, False)

    @property
    def _authz_wait(self) -> tuple[PendingDecision, Callable[[bool], None]] | None:
        r = self._rare
        v: tuple[PendingDecision, Callable[[bool], None]] | None = (
            None if r is None else r.get("_authz_wait")
        )
        return v

    @_authz_wait.setter
    def _authz_wait(self, value: tuple[PendingDecision, Callable[[bool], None]] | None) -> None:
        self._rare = rare_set(self._rare, "_authz_wait", value, None)

    def __init__(
        self,
        context: GatewayContext,
        settings: MqttSettings,
        handle: ConnectionHandle,
        *,
        peer: tuple[str, int] | None = None,
        monotonic: Callable[[], float],
        peer_cert: Mapping[str, str] | None = None,
    ) -> None:
        self.context = context
        self.settings = settings
        self.handle = handle
        self._rare = None
        self.expiry_interval = 0
        self.peer_cert = peer_cert  # a verified TLS client certificate: "cn", "dn", "san"
        self.conn = Connection(Role.SERVER, max_incoming_packet_size=settings.max_packet_size)
        self.state = State.CONNECTING
        self.version = 4
        self.info: ClientInfo | None = None
        self.session: SessionAPI | None = None
        self.keepalive = 0  # seconds (the CONNECT's, or the server's)
        self.last_rx = 0.0
        self.client_alias_max = 0
        self._monotonic = monotonic
        # effects of the entry point running now; _NOT_BUSY between entry points
        self._out: list[Effect] = _NOT_BUSY
        # protection (rates, stalled packets): see _Guard for when there is one
        self._guard: _Guard | None = None
        if settings.messages_rate or settings.bytes_rate:
            now = monotonic()
            self._guard = _Guard(
                TokenBucket(settings.messages_rate, max(1.0, settings.messages_rate), now)
                if settings.messages_rate
                else None,
                TokenBucket(settings.bytes_rate, max(1.0, settings.bytes_rate), now)
                if settings.bytes_rate
                else None,
            )
        # last: a property setter (a method call) before the plain attributes would make
        # a compiled channel keep a bitmap of which of them are set, 16 bytes more each
        self.peer = peer

    # -- entry points from the shell ---------------------------------------------------

    def connection_made(self) -> list[Effect]:
        self.last_rx = _rx_time(self._monotonic())
        return [_timer("idle", self.settings.idle_timeout)]

    def handle_data(self, data: bytes) -> list[Effect]:
        if self.state is _CLOSED:
            return []
        outer = self._enter()
        self.last_rx = _rx_time(self._monotonic())
        try:
            self.conn.receive_data(data)
        except RemoteProtocolError as exc:
            self._protocol_error(exc)
        else:
            waiting = self.state is State.AUTHENTICATING
            if waiting and self.conn.buffered > self.settings.max_packet_size:
                # what a client may send before its CONNACK is bounded: one packet's worth
                self._refuse(RC.QUOTA_EXCEEDED, "too much input before CONNACK")
            else:
                self._parse()
        if self.state is not _CLOSED:
            self._after_input(len(data))
        return self._leave(outer)

    def _parse(self) -> None:
        """Handle the buffered packets while the state allows it (and no authorization
        decision is pending)."""
        rare = self._rare
        if rare is not None and "_authz_wait" in rare:
            if self.conn.buffered > self.settings.max_packet_size:
                self._out.append(Pause(1.0))  # bounded: TCP flow control holds the rest
            return
        conn = self.conn
        acked = False  # PUBACKs freed inflight slots: refill the window once, after them
        try:
            while self.state is _CONNECTED or self.state in _PARSING:
                packet = conn.next_event()
                if packet is None:
                    break
                if type(packet) is PubAck and self.state is _CONNECTED:
                    assert self.session is not None
                    if packet.properties is not NO_PROPERTIES:  # (MQTT 5, rare)
                        acked = self._acked_with_props(packet, False) or acked
                        continue
                    acked = self.session.puback(packet.packet_id, drain=False) or acked
                    continue
                self._dispatch(packet)
        except RemoteProtocolError as exc:
            self._protocol_error(exc)
        except _Disconnect as exc:
            self._server_disconnect(exc.code, exc.why)
        except _Wait:
            pass
        if acked and self.state is _CONNECTED and self.session is not None:
            self.session.drain()

    def on_timer(self, name: str) -> list[Effect]:
        if self.state is State.CLOSED:
            return []
        outer = self._enter()
        if name == "idle" and self.state is not State.CONNECTED:
            if self.state is State.CONNECTING:
                self._close("no CONNECT within idle timeout")
            else:
                self.context.incr("authentication.timeout")
                self._close("authentication not finished within idle timeout")
        elif name == "keepalive" and self.state is State.CONNECTED and self.keepalive:
            limit = self.keepalive * self.settings.keepalive_multiplier
            guard = self._guard
            last = self.last_rx if guard is None else max(self.last_rx, guard.paused_until)
            idle = self._monotonic() - last
            if idle >= limit:
                self.context.incr("client.keepalive_timeout")
                self._server_disconnect(RC.KEEP_ALIVE_TIMEOUT, "keepalive timeout")
            else:
                self._out.append(SetTimer("keepalive", limit - idle))
        elif name == "packet":
            self._on_packet_timer()
        return self._leave(outer)

    # -- protection: rate limits and stalled packets -------------------------------------

    def _after_input(self, n: int) -> None:
        """Charge ``n`` bytes and the PUBLISH packets just handled to the rate buckets
        (Pause when in debt), and time the packet left incomplete in the buffer."""
        guard = self._guard
        buffered = self.conn.buffered
        if guard is None:  # no rates: only a partial packet needs a guard
            if not buffered or not self.settings.packet_timeout:
                return
            guard = self._guard = _Guard(None, None)
        now = self._monotonic()
        if buffered and self.settings.packet_timeout:
            if guard.partial_since is None or buffered < guard.buffered_before + n:
                guard.partial_since = now  # a packet completed: the next one starts now
            if not guard.packet_timer:
                guard.packet_timer = True
                self._out.append(SetTimer("packet", self.settings.packet_timeout))
        else:
            guard.partial_since = None
            if guard.messages is None and guard.bytes is None:
                self._guard = None  # drained and no rates: nothing left to keep
                return
        guard.buffered_before = buffered
        wait = 0.0
        if guard.bytes is not None:
            wait = guard.bytes.consume(n, now)
        if guard.messages is not None and guard.published:
            wait = max(wait, guard.messages.consume(guard.published, now))
        guard.published = 0
        if wait > 0.0:
            if guard.paused_until <= 0.0:
                log.info("%s: rate limit reached, pausing reads", self._who())
            guard.paused_until = now + wait
            self.context.incr("client.rate_limited")
            self._out.append(Pause(wait))

    def _on_packet_timer(self) -> None:
        guard = self._guard
        if guard is None:  # drained since the timer was set
            return
        guard.packet_timer = False
        since = guard.partial_since
        if since is None or not self.conn.buffered:
            return
        if self._authz_wait is not None:  # what is buffered waits for a decision
            guard.packet_timer = True
            self._out.append(SetTimer("packet", self.settings.packet_timeout))
            return
        left = max(since, guard.paused_until) + self.settings.packet_timeout - self._monotonic()
        if left > 0:
            guard.packet_timer = True
            self._out.append(SetTimer("packet", left))
            return
        self.context.incr("client.packet_timeout")
        log.warning(
            "%s: packet incomplete after %gs (%d bytes buffered)",
            self._who(),
            self.settings.packet_timeout,
            self.conn.buffered,
        )
        self._server_disconnect(RC.KEEP_ALIVE_TIMEOUT, "packet not completed in time")

    def connection_lost(self) -> None:
        """The socket is gone (any reason). Tell the core once; the will goes unless
        the client said a normal DISCONNECT. While an authorization decision is pending,
        what the client sent before it went (a publish, then DISCONNECT: what a one-shot
        publisher does) is still handled, once the answer is there; then the end."""
        wait = self._authz_wait
        if wait is not None and self.state is _CONNECTED:
            pending = wait[0]

            def answered(allowed: bool) -> None:
                self.authz_result(pending, allowed)  # (no socket: its effects go nowhere)
                if self.state is not _CLOSED:
                    self.connection_lost()

            pending.add_callback(answered)
            return
        self.state = State.CLOSED
        if self.info is not None:  # the peer closed the socket (or it broke)
            tls = self.info.listener.startswith(("ssl:", "wss:"))
            self._close_reason("ssl_closed" if tls else "tcp_closed")
        self._notify_core_closed(send_will=True)

    # -- entry points from the core (via the shell's ConnectionHandle) ---------------------

    def deliver(self, deliveries: list[Delivery]) -> list[Effect]:
        if self.state is _CLOSED:
            return []
        if self.state is not _CONNECTED:
            if self._held is None:
                self._held = []
            self._held.extend(deliveries)
            return []
        if self._out is not _NOT_BUSY:  # re-entrant: the outer call returns these effects
            self._send_deliveries(deliveries)
            return []
        out = self._out = []
        self._send_deliveries(deliveries)
        self._out = _NOT_BUSY
        if _NOT_BUSY:
            _effects_outside_an_entry_point()
        return out

    def release(self, packet_id: int) -> list[Effect]:
        if self.state is not State.CONNECTED:
            return []
        outer = self._enter()
        self._ack(PubRel, 0x62, packet_id)
        return self._leave(outer)

    def authz_result(self, pending: PendingDecision, allowed: bool) -> list[Effect]:
        """The answer of a pending authorization (via ``call_channel``): finish the
        packet that waited for it, then handle the input buffered meanwhile."""
        wait = self._authz_wait
        if self.state is not _CONNECTED or wait is None or wait[0] is not pending:
            return []
        outer = self._enter()
        self._authz_wait = None
        try:
            wait[1](allowed)
        except _Wait:
            pass
        except _Disconnect as exc:
            self._server_disconnect(exc.code, exc.why)
        else:
            self._parse()
        if self.state is not _CLOSED:
            self._after_input(0)
        return self._leave(outer)

    def _suspend(self, pending: PendingDecision, then: Callable[[bool], None]) -> None:
        """Wait for ``pending``; ``then(allowed)`` runs with the answer (``authz_result``).
        Raises :class:`_Wait`, which ends the handling of input for now."""
        self._authz_wait = (pending, then)
        handle = self.handle

        def answered(allowed: bool) -> None:
            handle.call_channel(lambda: self.authz_result(pending, allowed))

        pending.add_callback(answered)
        raise _Wait

    def kick(self, reason_code: int) -> list[Effect]:
        """The core closes us (takeover, admin kick). It already settled the session."""
        if self.state is State.CLOSED:
            return []
        outer = self._enter()
        self._core_closed = True
        if self.state is State.CONNECTED and self.version == MQTT_5:
            self._send(Disconnect(reason_code))
        self._close(f"kicked: {RC(reason_code).name.lower()}")
        return self._leave(outer)

    # -- plumbing ------------------------------------------------------------------

    def _enter(self) -> bool:
        if self._out is not _NOT_BUSY:
            return False
        self._out = []
        return True

    def _leave(self, outer: bool) -> list[Effect]:
        if not outer:
            return []
        out, self._out = self._out, _NOT_BUSY
        if _NOT_BUSY:
            _effects_outside_an_entry_point()
        return out

    def _send(self, packet: Packet) -> None:
        self._out.append(self.conn.send(packet))

    def _ack(
        self, kind: type[PubAck | PubRec | PubRel | PubComp], first: int, pid: int, code: int = 0
    ) -> None:
        """An acknowledgement; with reason 0 (or for 3.x) the same 4 bytes in every version
        (MQTT 5 may omit a 0 reason code), so no packet object and no encoder."""
        if code == 0 or self.version != MQTT_5:
            self._out.append(_ACK.pack(first, 2, pid))
        else:
            self._send(kind(pid, code))

    def _close(self, reason: str) -> None:
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        self._out.append(Close(reason))

    def _notify_core_closed(self, *, send_will: bool, expiry: int | None = None) -> None:
        if self._core_closed or self.info is None or self.session is None:
            return
        self._core_closed = True
        self.context.close(self.info, self.handle, send_will=send_will, expiry_interval=expiry)

    def _close_reason(self, reason: str, props: Properties | None = None) -> None:
        """Why this connection ends, for the ``client.disconnected`` hook (EMQX's reason
        names); the first reason given wins (a DISCONNECT we sent, then the socket)."""
        info = self.info
        if info is not None and "disconnect_reason" not in info.attrs:
            info.set_attr("disconnect_reason", reason)
            if props is not None and props is not NO_PROPERTIES and props != NO_PROPERTIES:
                info.set_attr("disconn_props", props)

    def _protocol_error(self, exc: RemoteProtocolError) -> None:
        self.context.incr("packets.malformed")
        log.warning("%s: %s", self._who(), exc)
        if self.state is State.CONNECTING:
            if exc.violation in (Violation.UNSUPPORTED_VERSION, Violation.PROTOCOL_NAME):
                self._out.append(encode(ConnAck(False, 1), 4))
            self._close(f"protocol error before CONNECT: {exc}")
            return
        self._server_disconnect(exc.reason_code, str(exc))

    def _server_disconnect(self, code: int, why: str) -> None:
        self._close_reason(_CLOSE_REASONS.get(code) or _rc_name(code))
        if self.state is State.CONNECTED and self.version == MQTT_5:
            self._send(Disconnect(code, Properties(reason_string=why)))
        self._notify_core_closed(send_will=True)
        self._close(why)

    def _who(self) -> str:
        if self.info is not None:
            return f"client {self.info.client_id!r}"
        return f"peer {self.peer[0]}:{self.peer[1]}" if self.peer else "peer"

    def _dispatch(self, packet: Packet) -> None:
        state = self.state
        if state is not _CONNECTED:
            if state is State.CONNECTING:
                assert isinstance(packet, Connect)  # the codec guarantees CONNECT first
                self._on_connect(packet)
                return
            if state is State.AUTH_EXCHANGE:
                self._on_auth_exchange(packet)
                return
        assert self.session is not None
        handler = _HANDLERS.get(type(packet))  # one probe, not a chain of isinstance
        if handler is None:
            raise _Disconnect(RC.PROTOCOL_ERROR, f"unexpected {type(packet).__name__}")
        handler(self, packet)

    def _on_puback(self, p: PubAck) -> None:
        if p.properties is not NO_PROPERTIES:
            self._acked_with_props(p, True)
        else:
            assert self.session is not None
            self.session.puback(p.packet_id)

    def _on_pubcomp(self, p: PubComp) -> None:
        if p.properties is not NO_PROPERTIES:
            self._acked_with_props(p, True)
        else:
            assert self.session is not None
            self.session.pubcomp(p.packet_id)

    def _on_pingreq(self, p: PingReq) -> None:
        self._out.append(_PINGRESP)

    # -- CONNECT -------------------------------------------------------------------

    def _refuse(self, code: int, why: str, auth_data: bytes | None = None) -> None:
        self.context.incr("client.connack.refused")
        log.info("%s refused: %s", self._who(), why)
        if self.info is not None:
            self.context.connack(self.info, code)
        if self.version == MQTT_5:
            method = self._auth_method if auth_data is not None else None
            props = Properties(
                reason_string=why, authentication_method=method, authentication_data=auth_data
            )
            self._send(ConnAck(False, code, props))
        else:
            self._send(ConnAck(False, to_v3_connack(code)))
        self._close(why)

    def _on_connect(self, p: Connect) -> None:
        s = self.settings
        self.version = v = p.protocol_level
        props = p.properties
        if self.peer_cert is not None:  # the TLS client certificate may name the client
            cert = self.peer_cert
            cid_from, user_from = s.peer_cert_as_clientid, s.peer_cert_as_username
            if cid_from != "none" and not cert.get(cid_from):
                why = f"client certificate has no {cid_from} for the client id"
                self._refuse(RC.CLIENT_IDENTIFIER_NOT_VALID, why)
                return
            if user_from != "none" and not cert.get(user_from):
                why = f"client certificate has no {user_from} for the username"
                self._refuse(RC.BAD_USER_NAME_OR_PASSWORD, why)
                return
            p = replace(
                p,
                client_id=cert[cid_from] if cid_from != "none" else p.client_id,
                username=cert[user_from] if user_from != "none" else p.username,
            )
        cid = p.client_id
        assigned: str | None = None
        if not cid:
            if v == MQTT_5 or (v == 4 and p.clean_start):
                cid = assigned = "auto-" + uuid.uuid4().hex
            else:
                self._refuse(RC.CLIENT_IDENTIFIER_NOT_VALID, "empty client id")
                return
        elif len(cid) > s.max_clientid_len:
            self._refuse(RC.CLIENT_IDENTIFIER_NOT_VALID, "client id too long")
            return
        peer = self.peer
        host, port = peer if peer else (None, None)
        info = ClientInfo(
            client_id=cid,
            proto_ver=v,
            username=p.username,
            peer_host=host,
            peer_port=port,
            listener=s.listener,
            mountpoint=s.mountpoint,
            keepalive=_shared_int(p.keepalive),
            clean_start=p.clean_start,
        )
        self.info = info
        self.peer = None  # the info holds host and port now: one tuple less per connection
        if self.peer_cert is not None and s.peer_cert_authenticates and p.password is None:
            info.set_attr("authn", "x509")  # the certificate is the credential
        method = props.authentication_method if v == MQTT_5 else None
        if method is not None:
            self._start_enhanced_auth(p, assigned, method)
            return
        code = self.context.authenticate(info, p.password, self._authenticated_later)
        if code == AUTH_PENDING:
            self.state = State.AUTHENTICATING
            self._pending_connect = (p, assigned)
            return
        self._connect_authenticated(p, assigned, code)

    # -- authentication --------------------------------------------------------------

    def _authenticated_later(self, code: int) -> None:
        """``done`` of a pending ``context.authenticate`` (called on the loop thread)."""
        self.handle.call_channel(functools.partial(self.authenticated, code))

    def authenticated(self, code: int) -> list[Effect]:
        """The answer of a pending authentication: finish the CONNECT, then handle what
        the client sent meanwhile."""
        if self.state is not State.AUTHENTICATING or self._pending_connect is None:
            return []
        outer = self._enter()
        p, assigned = self._pending_connect
        self._pending_connect = None
        self.state = State.CONNECTING
        self._connect_authenticated(p, assigned, code)
        self._parse()
        return self._leave(outer)

    def _start_enhanced_auth(self, p: Connect, assigned: str | None, method: str) -> None:
        assert self.info is not None
        exchange = self.context.enhanced_auth(self.info, method)
        if exchange is None:
            self.context.incr("authentication.failure")
            why = f"unsupported authentication method {method!r}"
            self._refuse(RC.BAD_AUTHENTICATION_METHOD, why)
            return
        self._auth_method = method
        self._exchange = exchange
        self._pending_connect = (p, assigned)
        self._connect_auth_step(p.properties.authentication_data)

    def _exchange_step(self, data: bytes | None) -> AuthStep:
        assert self._exchange is not None
        try:
            return self._exchange.step(data)
        except Exception:  # a bug in an exchange must not take the connection's loop down
            log.exception("%s: authentication exchange failed", self._who())
            return AuthStep(RC.UNSPECIFIED_ERROR, None, "authentication error")

    def _auth_packet(self, code: int, data: bytes | None) -> Auth:
        props = Properties(authentication_method=self._auth_method, authentication_data=data)
        return Auth(code, props)

    def _connect_auth_step(self, data: bytes | None) -> None:
        step = self._exchange_step(data)
        if step.reason_code == RC.CONTINUE_AUTHENTICATION:
            self.state = State.AUTH_EXCHANGE
            self._send(self._auth_packet(RC.CONTINUE_AUTHENTICATION, step.data))
            return
        self._exchange = None
        assert self._pending_connect is not None
        p, assigned = self._pending_connect
        self._pending_connect = None
        self.state = State.CONNECTING
        if step.reason_code == 0:
            self.context.incr("authentication.success")
            self._auth_data_out = step.data
            self._connect_authenticated(p, assigned, 0)
        else:
            self.context.incr("authentication.failure")
            self._refuse(step.reason_code, step.reason or "authentication failed", step.data)

    def _on_auth_exchange(self, packet: Packet) -> None:
        """A packet while the CONNECT's enhanced authentication is under way."""
        if isinstance(packet, Auth):
            if packet.reason_code != RC.CONTINUE_AUTHENTICATION:
                self._refuse(RC.PROTOCOL_ERROR, "AUTH must continue the authentication (0x18)")
            elif packet.properties.authentication_method != self._auth_method:
                self._refuse(RC.PROTOCOL_ERROR, "AUTH with a different authentication method")
            else:
                self._connect_auth_step(packet.properties.authentication_data)
        elif isinstance(packet, Disconnect):
            self._close("client disconnected during authentication")
        else:
            self._refuse(
                RC.PROTOCOL_ERROR, f"{type(packet).__name__} before authentication finished"
            )

    def _on_reauth(self, p: Auth) -> None:
        """AUTH on an established connection: MQTT 5 re-authentication (4.12.1)."""
        method = self._auth_method
        if method is None:
            raise _Disconnect(RC.PROTOCOL_ERROR, "AUTH without enhanced authentication")
        if p.properties.authentication_method != method:
            raise _Disconnect(RC.PROTOCOL_ERROR, "AUTH with a different authentication method")
        if p.reason_code == RC.RE_AUTHENTICATE and self._exchange is None:
            assert self.info is not None
            self._exchange = self.context.enhanced_auth(self.info, method)
            if self._exchange is None:
                raise _Disconnect(RC.NOT_AUTHORIZED, f"{method} no longer supported")
        elif p.reason_code != RC.CONTINUE_AUTHENTICATION or self._exchange is None:
            raise _Disconnect(RC.PROTOCOL_ERROR, f"unexpected AUTH 0x{p.reason_code:02X}")
        step = self._exchange_step(p.properties.authentication_data)
        if step.reason_code == RC.CONTINUE_AUTHENTICATION:
            self._send(self._auth_packet(RC.CONTINUE_AUTHENTICATION, step.data))
            return
        self._exchange = None
        if step.reason_code == 0:
            self.context.incr("authentication.success")
            self._send(self._auth_packet(0, step.data))
            return
        self.context.incr("authentication.failure")
        # DISCONNECT has no 0x86: a failed re-authentication is "not authorized"
        raise _Disconnect(RC.NOT_AUTHORIZED, step.reason or "re-authentication failed")

    def _connect_authenticated(self, p: Connect, assigned: str | None, code: int) -> None:
        """The rest of the CONNECT, once authentication has answered ``code``."""
        if code:
            self._refuse(code, "authentication failed")
            return
        s = self.settings
        v = self.version
        props = p.properties
        info = self.info
        assert info is not None
        cid = info.client_id
        will: Message | None = None
        will_delay = 0
        if p.will is not None:
            w = p.will
            if w.qos > s.max_qos_allowed:
                self._refuse(RC.QOS_NOT_SUPPORTED, "will QoS not supported")
                return
            if w.retain and not s.retain_available:
                self._refuse(RC.RETAIN_NOT_SUPPORTED, "retained will not supported")
                return
            now = self.context.now()
            expiry = w.properties.message_expiry_interval
            will = Message(
                s.mountpoint + w.topic,
                w.payload,
                w.qos,
                w.retain,
                _will_properties(w.properties),
                cid,
                info.username,
                now,
                now + expiry if expiry is not None else None,
            )
            will_delay = w.properties.will_delay_interval or 0
        keepalive = p.keepalive
        if v == MQTT_5:
            if s.server_keepalive:
                keepalive = s.server_keepalive
            elif s.max_keepalive and (keepalive == 0 or keepalive > s.max_keepalive):
                keepalive = s.max_keepalive
        if v == MQTT_5:
            expiry_interval = props.session_expiry_interval or 0
        else:
            expiry_interval = 0 if p.clean_start else s.session_expiry_interval
        requested_expiry = expiry_interval
        if s.max_session_expiry_interval and expiry_interval > s.max_session_expiry_interval:
            expiry_interval = s.max_session_expiry_interval
        self.expiry_interval = expiry_interval
        # our outgoing window: the client's Receive Maximum, capped by max_inflight
        receive_max = min(props.receive_maximum or 65535, s.max_inflight)
        if props.maximum_packet_size is not None:
            self.conn.max_outgoing_packet_size = props.maximum_packet_size
        self.client_alias_max = props.topic_alias_maximum or 0
        if v == MQTT_5 and props != NO_PROPERTIES:
            info.set_attr("conn_props", props)  # the rules' conn_props
        result = self.context.open_session(
            info,
            self.handle,
            clean_start=p.clean_start,
            expiry_interval=expiry_interval,
            receive_maximum=receive_max,
            will=will,
            will_delay=will_delay,
        )
        if result.reason_code or result.session is None:
            self._refuse(result.reason_code or RC.UNSPECIFIED_ERROR, "session refused")
            return
        self.session = result.session
        start = len(self._out)
        if v == MQTT_5:
            ack_props = Properties(
                session_expiry_interval=(
                    expiry_interval if expiry_interval != requested_expiry else None
                ),
                receive_maximum=s.max_inflight,
                maximum_qos=s.max_qos_allowed if s.max_qos_allowed < 2 else None,
                retain_available=None if s.retain_available else 0,
                maximum_packet_size=s.max_packet_size,
                assigned_client_identifier=assigned,
                topic_alias_maximum=s.max_topic_alias or None,
                wildcard_subscription_available=None if s.wildcard_subscription else 0,
                shared_subscription_available=None if s.shared_subscription else 0,
                server_keep_alive=keepalive if keepalive != p.keepalive else None,
                authentication_method=self._auth_method,
                authentication_data=self._auth_data_out,
                response_information=(
                    s.response_information
                    if props.request_response_information and s.response_information
                    else None
                ),
            )
            self._send(ConnAck(result.session_present, 0, ack_props))
        else:  # always the same 4 bytes: no packet object, no encoder
            self._out.append(_CONNACK_V3[result.session_present])
        self.context.connack(info, 0)
        self.state = State.CONNECTED
        self.keepalive = _shared_int(keepalive)  # an int, shared: no float per connection
        self._out.append(_CANCEL_IDLE)
        if keepalive:
            self._out.append(_timer("keepalive", keepalive * s.keepalive_multiplier))
        if result.connack_early:  # the CONNACK and its timers need not wait for the store
            mark_unheld(self._out, start)
        if self._held:
            held, self._held = self._held, None
            self._send_deliveries(held)
        result.session.resume()

    def _subscriptions_full(self, session: SessionAPI, full: str) -> bool:
        # read afresh: a session's first subscription replaces its (shared, empty) dict
        subs = session.subscriptions
        return full not in subs and len(subs) >= self.settings.max_subscriptions

    # -- PUBLISH in ----------------------------------------------------------------

    def _on_publish(self, p: Publish) -> None:
        guard = self._guard
        if guard is not None:
            guard.published += 1
        s = self.settings
        v5 = self.version == MQTT_5
        topic = p.topic
        props = p.properties
        if v5 and props.topic_alias is not None:
            alias = props.topic_alias
            if alias == 0 or alias > s.max_topic_alias:
                raise _Disconnect(RC.TOPIC_ALIAS_INVALID, f"topic alias {alias} out of range")
            if topic:
                aliases = self._aliases_in
                if aliases is _NO_ALIASES:
                    self._aliases_in = {alias: topic}
                else:
                    aliases[alias] = topic
            else:
                known = self._aliases_in.get(alias)
                if known is None:
                    raise _Disconnect(RC.PROTOCOL_ERROR, f"unknown topic alias {alias}")
                topic = known
        qos = p.qos
        if qos > s.max_qos_allowed:
            raise _Disconnect(RC.QOS_NOT_SUPPORTED, f"QoS {qos} not supported")
        if p.retain and not s.retain_available:
            raise _Disconnect(RC.RETAIN_NOT_SUPPORTED, "retain not supported")
        if s.max_topic_levels and topic.count("/") >= s.max_topic_levels:
            raise _Disconnect(RC.TOPIC_NAME_INVALID, "too many topic levels")
        info = self.info
        session = self.session
        assert info is not None and session is not None
        full_topic = s.mountpoint + topic if s.mountpoint else topic
        pid = p.packet_id
        if qos == 2 and pid in session.awaiting_rel:
            self._ack(PubRec, 0x50, pid)  # a re-sent PUBLISH: acknowledge, do not deliver again
            return
        allowed = self.context.authorize(info, "publish", full_topic, True)
        if allowed is not True:
            if allowed is False:
                self._publish_denied(p, full_topic, session)
                return
            # asked for: this connection's input waits (raises _Wait)
            self._suspend(allowed, functools.partial(
                self._publish_decided, p, full_topic, session))
        self._publish_allowed(p, full_topic, session)

    def _publish_decided(self, p: Publish, full_topic: str, session: SessionAPI,
                         allowed: bool) -> None:
        if allowed:
            self._publish_allowed(p, full_topic, session)
        else:
            self._publish_denied(p, full_topic, session)

    def _publish_denied(self, p: Publish, full_topic: str, session: SessionAPI) -> None:
        if self.settings.deny_action_disconnect:
            raise _Disconnect(RC.NOT_AUTHORIZED, f"publish to {full_topic!r} denied")
        v5 = self.version == MQTT_5
        code = RC.NOT_AUTHORIZED if v5 else 0
        qos, pid = p.qos, p.packet_id
        if qos == 1:
            self._send(PubAck(pid, code))  # type: ignore[arg-type]
        elif qos == 2:
            assert pid is not None
            if not v5:
                session.await_rel(pid)  # 3.1.1 has no failure code: finish the flow
            self._send(PubRec(pid, code))

    def _publish_allowed(self, p: Publish, full_topic: str, session: SessionAPI) -> None:
        s = self.settings
        v5 = self.version == MQTT_5
        qos, pid, props = p.qos, p.packet_id, p.properties
        info = self.info
        assert info is not None
        if qos == 2:
            assert pid is not None
            awaiting = session.awaiting_rel
            if v5 and len(awaiting) >= s.max_inflight:
                raise _Disconnect(RC.RECEIVE_MAXIMUM_EXCEEDED, "receive maximum exceeded")
            if s.max_awaiting_rel and len(awaiting) >= s.max_awaiting_rel:
                self._expire_awaiting(session)
                if len(awaiting) >= s.max_awaiting_rel:
                    self.context.incr("messages.dropped")
                    self.context.incr("messages.dropped.await_pubrel_full")
                    log.warning("%s: too many QoS 2 messages awaiting PUBREL", self._who())
                    if v5:
                        self._send(PubRec(pid, RC.RECEIVE_MAXIMUM_EXCEEDED))
                    return
        now = self.context.now()
        expiry = props.message_expiry_interval
        message = Message(
            full_topic,
            p.payload,
            qos,
            p.retain,
            props if props is NO_PROPERTIES else _publish_properties(props),
            info.client_id,
            info.username,
            now,
            now + expiry if expiry is not None else None,
        )
        raw = p.raw
        if raw is not None and props is NO_PROPERTIES and not p.dup and not s.mountpoint:
            # The bytes received are what this message encodes to at this version, QoS
            # and retain flag (no properties, no alias, same topic): its subscribers'
            # copy (_shared_publish) at no cost.
            offset = len(raw) - len(p.payload) - (3 if v5 else 2) if qos else -1
            message.wire = {(v5, qos, p.retain): (raw, offset)}
        n = self.context.publish(info, message)
        if n < 0:  # PUBLISH_REFUSED: the store cannot make it durable now
            log.warning("%s: QoS %d publish to %s refused: the store cannot write",
                        self._who(), qos, full_topic)
            if not v5:  # 3.1.1 has no failure code: no PUBACK, the client re-sends
                raise _Disconnect(RC.QUOTA_EXCEEDED, "publish refused: the store cannot write")
            if qos == 1:
                self._ack(PubAck, 0x40, pid, RC.QUOTA_EXCEEDED)  # type: ignore[arg-type]
            else:
                self._ack(PubRec, 0x50, pid, RC.QUOTA_EXCEEDED)  # type: ignore[arg-type]
            return
        if qos == 1:
            if n or not v5:
                self._out.append(_ACK.pack(0x40, 2, pid))  # what _ack does with code 0
            else:
                self._ack(PubAck, 0x40, pid, RC.NO_MATCHING_SUBSCRIBERS)  # type: ignore[arg-type]
        elif qos == 2:
            session.await_rel(pid)  # type: ignore[arg-type]
            self._ack(PubRec, 0x50, pid, RC.NO_MATCHING_SUBSCRIBERS if n == 0 and v5 else 0)  # type: ignore[arg-type]

    def _expire_awaiting(self, session: SessionAPI) -> None:
        deadline = self.context.now() - self.settings.await_rel_timeout
        for pid in [k for k, t in session.awaiting_rel.items() if t <= deadline]:
            session.complete_rel(pid)
            self.context.incr("messages.dropped.await_pubrel_timeout")

    def _on_pubrel(self, p: PubRel) -> None:
        assert self.session is not None
        found = self.session.complete_rel(p.packet_id)
        code = 0 if found or self.version != MQTT_5 else RC.PACKET_IDENTIFIER_NOT_FOUND
        self._ack(PubComp, 0x70, p.packet_id, code)

    def _acked_with_props(self, p: PubAck | PubComp, drain: bool) -> bool:
        """A PUBACK or PUBCOMP with MQTT 5 properties: while the session handles it (and
        runs ``message.acked``), ``attrs["puback_props"]`` holds them (the rules'
        ``puback_props``, as EMQX shows them)."""
        info, session = self.info, self.session
        assert info is not None and session is not None
        info.set_attr("puback_props", p.properties)
        try:
            if type(p) is PubAck:
                return session.puback(p.packet_id, drain=drain)
            return session.pubcomp(p.packet_id)
        finally:
            info.attrs.pop("puback_props", None)

    def _on_pubrec(self, p: PubRec) -> None:
        session = self.session
        assert session is not None
        if p.reason_code >= 0x80:
            session.discard(p.packet_id)
            return
        if session.pubrec(p.packet_id):
            self._ack(PubRel, 0x62, p.packet_id)
        else:
            code = 0 if self.version != MQTT_5 else RC.PACKET_IDENTIFIER_NOT_FOUND
            self._send(PubRel(p.packet_id, code))

    # -- deliveries out ------------------------------------------------------------

    def _send_deliveries(self, deliveries: list[Delivery]) -> None:
        conn = self.conn
        out = self._out
        v5 = self.version == MQTT_5
        mount = self.settings.mountpoint
        dropped: list[Delivery] | None = None  # made on the first delivery not sent
        limit = conn.max_outgoing_packet_size
        shareable = not mount and not self.client_alias_max
        for d in deliveries:
            msg = d.message
            if shareable and (
                not v5 or (not d.subscription_ids and msg.expires_at is None)
            ):
                # Hot path: the same bytes for every subscriber at this (version, QoS,
                # retain); only the packet id (and DUP) differ, patched into a copy.
                data = self._shared_publish(d, v5)
                if limit is not None and len(data) > limit:
                    if dropped is None:
                        dropped = []
                    dropped.append(d)
                    log.info(
                        "%s: not sent (%d bytes, peer accepts %d)", self._who(), len(data), limit
                    )
                    continue
                out.append(data)
                continue
            topic = msg.topic
            if mount and topic.startswith(mount):
                topic = topic[len(mount) :]
            new_alias = False
            if v5:
                now = self.context.now()
                props, topic_out, new_alias = self._v5_publish_fields(d, topic, now)
            else:
                props, topic_out = NO_PROPERTIES, topic
            packet = Publish(topic_out, msg.payload, d.qos, d.retain, d.dup, d.packet_id, props)
            try:
                out.append(conn.send(packet))
            except LocalProtocolError as exc:
                if dropped is None:
                    dropped = []
                dropped.append(d)
                log.info("%s: not sent (%s)", self._who(), exc)
                continue
            if new_alias:
                aliases = self._aliases_out
                if aliases is _NO_ALIASES:
                    self._aliases_out = {topic: 1}
                else:
                    aliases[topic] = len(aliases) + 1
        if dropped:
            self.context.incr("messages.dropped", len(dropped))
            self.context.incr("messages.dropped.too_large", len(dropped))
            deliveries = [d for d in deliveries if d not in dropped]
        assert self.info is not None
        self.context.delivered(self.info, deliveries)
        if dropped and self.session is not None:
            for d in dropped:
                if d.packet_id is not None:
                    self.session.discard(d.packet_id)

    @staticmethod
    def _shared_publish(d: Delivery, v5: bool) -> bytes:
        """The PUBLISH bytes of a delivery whose encoding is the same for every
        subscriber at this (version, QoS, retain) but for the packet id and DUP.

        The cache entry (``msg.wire[key]``) goes through three forms: ``(data, -1)``
        (encoded, the packet id's offset not yet looked up; the publisher's own bytes
        come with their offset), ``(data, offset, None)`` (one copy with another id was
        made) and ``(data, offset, head, tail)`` (the bytes before and after the id,
        split once). The first delivery of an encoded message is those bytes, no copy;
        the first copy is one patch as before; every later one joins ``head``, the id
        and ``tail`` (one allocation instead of two slices and two joins). A message
        with one subscriber (point to point) never keeps a split copy.
        """
        msg = d.message
        wire = msg.wire
        if wire is None:
            wire = msg.wire = {}
        qos = d.qos
        key = (v5, qos, d.retain)
        cached = wire.get(key)
        if cached is None:
            data = encode_publish(
                msg.topic,
                msg.payload,
                qos,
                d.retain,
                d.dup,
                d.packet_id if qos else None,
                msg.properties if v5 else NO_PROPERTIES,
                MQTT_5 if v5 else 4,
            )
            if not d.dup:
                wire[key] = (data, -1)
            return data
        data = cached[0]
        if not qos:
            return data
        pid = d.packet_id or 0
        if len(cached) == 4 and not d.dup and 0 < pid <= 0xFFFF:
            head: bytes = cached[2]
            return head + _PID(pid) + cached[3]
        offset: int = cached[1]
        if offset < 0:  # the first copy: find where the packet id sits, once
            offset = publish_packet_id_offset(data)
        if len(cached) == 3:  # a second copy: split around the id, once
            wire[key] = (data, offset, data[:offset], data[offset + 2 :])
        elif len(cached) == 2:
            wire[key] = (data, offset, None)
        return encode_publish_with_id(data, offset, pid, dup=d.dup)

    def _v5_publish_fields(
        self, d: Delivery, topic: str, now: float
    ) -> tuple[Properties, str, bool]:
        """Properties and topic of an outgoing MQTT 5 PUBLISH; True when the topic takes
        a new alias (registered only once the packet is actually written)."""
        msg = d.message
        alias: int | None = None
        topic_out = topic
        new_alias = False
        if self.client_alias_max:
            aliases = self._aliases_out
            alias = aliases.get(topic)
            if alias is not None:
                topic_out = ""
            elif len(aliases) < self.client_alias_max:
                alias = len(aliases) + 1
                new_alias = True
        expires = msg.expires_at
        props = msg.properties
        if d.subscription_ids or alias is not None or expires is not None:
            props = replace(
                props,
                subscription_identifiers=d.subscription_ids,
                topic_alias=alias,
                message_expiry_interval=(
                    max(1, int(expires - now + 0.5)) if expires is not None else None
                ),
            )
        return props, topic_out, new_alias

    # -- SUBSCRIBE / UNSUBSCRIBE ---------------------------------------------------

    def _full_filter(self, f: str) -> str:
        mount = self.settings.mountpoint
        if not mount:
            return f
        group, real = parse_shared(f)
        if group is None:
            return mount + real
        if group == "$queue":
            return "$queue/" + mount + real
        return f"$share/{group}/{mount}{real}"

    def _on_subscribe(
        self,
        p: Subscribe,
        done: tuple[list[int], list[tuple[str, SubOptions, bool]]] | None = None,
        decided: bool | None = None,
    ) -> None:
        """Handle a SUBSCRIBE; ``done`` (the codes and subscriptions of the filters
        before it) and ``decided`` (the answer for the next filter) resume one whose
        authorization had to wait."""
        s = self.settings
        info, session = self.info, self.session
        assert info is not None and session is not None
        v5 = self.version == MQTT_5
        ids = p.properties.subscription_identifiers
        sid = ids[0] if ids else None
        if done is None:
            if v5 and (p.properties.user_properties or "sub_props" in info.attrs):
                info.set_attr("sub_props", p.properties)  # the rules' sub_props
            done = ([], [])
        codes, accepted = done
        for sub in p.subscriptions[len(codes):]:
            f = sub.topic_filter
            group, real = parse_shared(f)
            full = self._full_filter(f)
            if group is not None and not s.shared_subscription:
                code: int = RC.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED
            elif not s.wildcard_subscription and is_wildcard(real):
                code = RC.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED
            elif s.max_topic_levels and real.count("/") >= s.max_topic_levels:
                code = RC.TOPIC_FILTER_INVALID
            elif s.max_subscriptions and self._subscriptions_full(session, full):
                code = RC.QUOTA_EXCEEDED
            elif not self._subscribe_allowed(p, done, decided, info, full):
                code = s.subscribe_deny_code
            else:
                qos = min(sub.qos, s.max_qos_allowed)
                opts = SubOptions(
                    qos, sub.no_local, sub.retain_as_published, sub.retain_handling, sid
                )
                existed = self.context.subscribe(info, full, opts)
                code = subscribe_refused(existed)  # e.g. 0x97: an exclusive topic is held
                if not code:
                    accepted.append((full, opts, existed == RESUBSCRIBED))
                    code = qos
            if code >= 0x80 and not v5:
                code = 0x80
            codes.append(code)
            decided = None
        self._send(SubAck(p.packet_id, tuple(codes)))
        for full, opts, was in accepted:
            self.context.deliver_retained(info, full, opts, was)

    def _subscribe_allowed(
        self,
        p: Subscribe,
        done: tuple[list[int], list[tuple[str, SubOptions, bool]]],
        decided: bool | None,
        info: ClientInfo,
        full: str,
    ) -> bool:
        """The decision for the next filter of ``p``: ``decided`` when it came later,
        else the core's; a pending one suspends the SUBSCRIBE (raises _Wait)."""
        if decided is not None:
            return decided
        allowed = self.context.authorize(info, "subscribe", full, True)
        if allowed is True or allowed is False:
            return allowed
        self._suspend(allowed, lambda ok: self._on_subscribe(p, done, ok))
        return False  # pragma: no cover - _suspend raises

    def _on_unsubscribe(self, p: Unsubscribe) -> None:
        info = self.info
        assert info is not None
        if self.version == MQTT_5 and (p.properties.user_properties
                                       or "unsub_props" in info.attrs):
            info.set_attr("unsub_props", p.properties)  # the rules' unsub_props
        codes = []
        for f in p.topic_filters:
            found = self.context.unsubscribe(info, self._full_filter(f))
            codes.append(0 if found else RC.NO_SUBSCRIPTION_EXISTED)
        self._send(UnsubAck(p.packet_id, tuple(codes) if self.version == MQTT_5 else ()))

    # -- DISCONNECT ----------------------------------------------------------------

    def _on_disconnect(self, p: Disconnect) -> None:
        expiry: int | None = None
        if self.version == MQTT_5:
            new = p.properties.session_expiry_interval
            if new is not None:
                if self.expiry_interval == 0 and new != 0:
                    raise _Disconnect(RC.PROTOCOL_ERROR, "session expiry set at DISCONNECT")
                cap = self.settings.max_session_expiry_interval
                expiry = min(new, cap) if cap else new
        code = p.reason_code
        self._close_reason(
            "normal" if code == 0 else _CLOSE_REASONS.get(code) or _rc_name(code), p.properties
        )
        self._notify_core_closed(
            send_will=p.reason_code == RC.DISCONNECT_WITH_WILL, expiry=expiry
        )
        self._close("client disconnected")


# what a connected client's packet goes to (MqttChannel._dispatch); a type not here is a
# protocol error (the codec makes exactly these classes)
_HANDLERS: dict[type[Packet], Callable[[MqttChannel, Any], None]] = {
    Publish: MqttChannel._on_publish,
    PubAck: MqttChannel._on_puback,
    PubRec: MqttChannel._on_pubrec,
    PubRel: MqttChannel._on_pubrel,
    PubComp: MqttChannel._on_pubcomp,
    Subscribe: MqttChannel._on_subscribe,
    Unsubscribe: MqttChannel._on_unsubscribe,
    PingReq: MqttChannel._on_pingreq,
    Disconnect: MqttChannel._on_disconnect,
    Auth: MqttChannel._on_reauth,
}
