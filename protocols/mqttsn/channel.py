"""The MQTT-SN 1.2 gateway channel: datagrams in, broker operations and effects out.

One channel per peer address (the datagram shell keys them). It talks to the core only
through :class:`~protocols.context.GatewayContext`, so an MQTT-SN client is a session of
the same broker as an MQTT or WebSocket client: same authentication (by client id; MQTT-SN
1.2 has no credentials), authorization, hooks, metrics and retained messages.

States (``State``)::

    IDLE --CONNECT--> [WILL_TOPIC --WILLTOPIC--> WILL_MSG --WILLMSG-->] AUTHENTICATING
    AUTHENTICATING --accepted--> ACTIVE           (refused: CONNACK 0x03, back to IDLE)
    ACTIVE --DISCONNECT(duration)--> ASLEEP --PINGREQ--> AWAKE --queue flushed, PINGRESP--> ASLEEP
    ASLEEP/AWAKE --CONNECT--> ACTIVE
    any --DISCONNECT / lost / kicked--> CLOSED (the shell forgets the peer)

Rules:
- Without a connection a peer may only search for the gateway (SEARCHGW -> GWINFO) and,
  when ``enable_qos3``, publish at QoS -1 to a predefined or short topic (published at
  QoS 0, as client ``mqttsn-qos3``, authorized like any publish). Anything else gets a
  DISCONNECT, telling the client it has no connection.
- Topic ids: the client's REGISTER allocates ids from ``first_topic_id`` (1025) upwards;
  a wildcard REGISTER is refused (0x03). SUBSCRIBE to a plain name answers its id,
  to a wildcard or a short name 0. Before a delivery on a topic the client has no id for
  (and that is neither predefined nor a two-character short name) the gateway sends
  REGISTER and holds every later delivery until the REGACK, so order is kept.
- QoS 1/2 PUBLISH, PUBREL and REGISTER are retransmitted every ``retry_interval`` with
  DUP, at most ``max_retries`` times; then the client is taken as lost (its will goes).
- Sleeping (DISCONNECT with a duration): deliveries are buffered (QoS 1/2 in the session's
  inflight window and queue, QoS 0 in the channel, at most ``max_sleep_buffer``, oldest
  dropped and counted); PINGREQ wakes the client, the buffer is flushed, then PINGRESP.
  A client that neither wakes nor reconnects within duration x ``keepalive_multiplier``
  is lost.
- The will belongs to the channel (WILLTOPICUPD/WILLMSGUPD change it while connected): it
  is published when the client is lost (keepalive, retries, sleep overrun, socket gone)
  or its session is taken over, never after a DISCONNECT.

Invariants (as in the MQTT channel):
- Effects produced by re-entrant calls (the core delivering to this very client while one
  of its datagrams is handled) are appended in order to the outer call's list.
- The core learns of the end of the connection exactly once (``context.close``).
- A malformed datagram is counted (``packets.malformed``) and dropped; it changes nothing.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from protocols.channel_base import ChannelBase
from protocols.context import (
    RESUBSCRIBED,
    ClientInfo,
    ConnectionHandle,
    Delivery,
    GatewayContext,
    Message,
    SessionAPI,
    SubOptions,
    subscribe_refused,
)
from protocols.effects import CancelTimer, Close, Effect, SetTimer, mark_unheld
from protocols.mqtt.topics import is_wildcard, validate_topic_filter
from protocols.mqttsn.codec import Codec, LocalProtocolError, RemoteProtocolError, Role
from protocols.mqttsn.packets import (
    NORMAL,
    PREDEFINED,
    PROTOCOL_ID,
    SHORT,
    Advertise,
    ConnAck,
    Connect,
    Disconnect,
    Encapsulated,
    GwInfo,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    RegAck,
    Register,
    ReturnCode,
    SearchGw,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    WillMsg,
    WillMsgReq,
    WillMsgResp,
    WillMsgUpd,
    WillTopic,
    WillTopicReq,
    WillTopicResp,
    WillTopicUpd,
)

log = logging.getLogger("protocols.mqttsn.channel")

RC = ReturnCode
SESSION_TAKEN_OVER = 0x8E
QOS3_CLIENT = "mqttsn-qos3"
MAX_TOPIC_ID = 0xFFFE  # 0x0000 and 0xFFFF are reserved


@dataclass(slots=True)
class MqttSnSettings:
    """One MQTT-SN gateway's behaviour (``[gateway.mqttsn]`` and ``[mqtt]``)."""

    gateway_id: int = 1
    predefined: dict[int, str] = field(default_factory=dict)
    enable_qos3: bool = True
    mountpoint: str = ""
    listener: str = "mqttsn:udp:default"
    idle_timeout: float = 30.0
    keepalive_multiplier: float = 1.5
    retry_interval: float = 10.0
    max_retries: int = 4
    max_inflight: int = 32
    session_expiry_interval: int = 7200
    max_sleep_buffer: int = 1000
    max_clientid_len: int = 65535
    first_topic_id: int = 1025
    max_datagram: int = 65507


class State(Enum):
    IDLE = "idle"
    WILL_TOPIC = "will_topic"
    WILL_MSG = "will_msg"
    AUTHENTICATING = "authenticating"
    ACTIVE = "active"
    ASLEEP = "asleep"
    AWAKE = "awake"
    CLOSED = "closed"


CONNECTED = (State.ACTIVE, State.ASLEEP, State.AWAKE)
SENDING = (State.ACTIVE, State.AWAKE)


@dataclass(slots=True)
class _Outstanding:
    packet: Publish | PubRel | Register
    attempts: int
    due: float


def short_id(name: str) -> int:
    """The topic id field value of a two-character short topic name."""
    return int.from_bytes(name.encode(), "big")


class MqttSnChannel(ChannelBase):
    LABEL = "mqtt-sn"
    CLOSED = State.CLOSED
    AUTHENTICATING = State.AUTHENTICATING

    def __init__(
        self,
        context: GatewayContext,
        settings: MqttSnSettings,
        handle: ConnectionHandle,
        *,
        peer: tuple[str, int] | None = None,
        monotonic: Callable[[], float],
    ) -> None:
        super().__init__(context, handle, peer, monotonic)
        self.settings = settings
        self.codec = Codec(Role.GATEWAY)
        self.state: State = State.IDLE
        self.connect: Connect | None = None
        self.will_topic: WillTopic | None = None
        self.will_payload = b""
        self.keepalive = 0.0
        self.last_rx = 0.0
        # topic registry of this client: ids it knows
        self.topic_ids: dict[str, int] = {}
        self.id_topics: dict[int, str] = {}
        self._next_topic_id = settings.first_topic_id
        self._predefined_ids = {t: i for i, t in settings.predefined.items()}
        # outgoing
        self.pending: deque[Delivery] = deque()
        self._pending_qos0 = 0
        self._reg_wait: tuple[int, str] | None = None  # (msg id, topic) of our REGISTER
        self._next_msg_id = 1
        self.unacked: dict[tuple[str, int], _Outstanding] = {}
        self._retry_armed = False
        self._pingresp_due = False

    # -- entry points from the shell ---------------------------------------------------

    def connection_made(self) -> list[Effect]:
        self.last_rx = self._monotonic()
        return [SetTimer("idle", self.settings.idle_timeout)]

    def handle_datagram(self, data: bytes) -> list[Effect]:
        if self.state is State.CLOSED or self._hold(data):
            return []
        outer = self._enter()
        try:
            packet = self.codec.decode(data)
        except RemoteProtocolError as exc:
            self.context.incr("packets.malformed")
            log.warning("%s: malformed datagram dropped: %s", self._who(), exc)
            return self._leave(outer)
        self.last_rx = self._monotonic()
        self._dispatch(packet)
        return self._leave(outer)

    def _replay(self, data: bytes) -> None:
        self.handle_datagram(data)  # (re-entrant: its effects join the outer call's)

    def on_timer(self, name: str) -> list[Effect]:
        if self.state is State.CLOSED:
            return []
        outer = self._enter()
        now = self._monotonic()
        if name == "idle" and self.state not in CONNECTED:
            self._close("no CONNECT within idle timeout")
        elif name == "keepalive" and self.state is State.ACTIVE and self.keepalive:
            limit = self.keepalive * self.settings.keepalive_multiplier
            idle = now - self.last_rx
            if idle >= limit:
                self.context.incr("client.keepalive_timeout")
                self._lost("keepalive timeout", "keepalive_timeout")
            else:
                self._out.append(SetTimer("keepalive", limit - idle))
        elif name == "asleep" and self.state in (State.ASLEEP, State.AWAKE):
            self._lost("did not wake up within its sleep duration", "asleep_timeout")
        elif name == "retry":
            self._retry(now)
        return self._leave(outer)

    def connection_lost(self) -> None:
        """The shell forgot this peer (after our Close, or the listener closed)."""
        if self.state is not State.CLOSED and self.state in CONNECTED:
            self._publish_will()
        self.state = State.CLOSED
        self._notify_core_closed()

    # -- entry points from the core ----------------------------------------------------

    def deliver(self, deliveries: list[Delivery]) -> list[Effect]:
        if self.state is State.CLOSED:
            return []
        outer = self._enter()
        self._queue(deliveries)
        self._pump()
        return self._leave(outer)

    def release(self, packet_id: int) -> list[Effect]:
        if self.state not in CONNECTED:
            return []
        outer = self._enter()
        self._send_tracked("rel", PubRel(packet_id))
        return self._leave(outer)

    def _kicked(self, reason_code: int) -> None:
        """``kick``: the will goes when the session is taken over; a connected client is
        told with a DISCONNECT."""
        if reason_code == SESSION_TAKEN_OVER:
            self._publish_will()
        if self.state in CONNECTED:
            self._send(Disconnect())
        super()._kicked(reason_code)

    # -- plumbing (the rest is in ChannelBase) -------------------------------------------

    def _send(self, packet: Packet) -> None:
        self._out.append(self.codec.encode(packet))

    def _close(self, reason: str) -> None:
        if self.state is State.CLOSED:
            return
        was_connected = self.state in CONNECTED
        self.state = State.CLOSED
        self._out.append(Close(reason))
        if was_connected:
            log.info("%s: closed: %s", self._who(), reason)

    def _lost(self, why: str, reason: str) -> None:
        """The client is gone without a DISCONNECT: its will goes, the session ends
        (``reason``: EMQX's name of why, for ``client.disconnected``)."""
        log.info("%s: lost: %s", self._who(), why)
        self._set_reason(reason)
        self._publish_will()
        self._notify_core_closed()
        self._close(why)

    def _not_connected(self, what: str) -> None:
        log.info("%s: %s without a connection; sending DISCONNECT", self._who(), what)
        self._send(Disconnect())

    def _dispatch(self, p: Packet) -> None:
        """The handler of ``p``'s type in :data:`_ROUTES`; a packet that needs a
        connection and comes without one is ignored, or answered with DISCONNECT."""
        route = _ROUTES.get(type(p))
        if route is None:  # pragma: no cover - the codec's role table rules the rest out
            log.warning("%s: unexpected %s", self._who(), type(p).__name__)
            return
        handler, unconnected = route
        if unconnected is _ANY or self.state in CONNECTED:
            handler(self, p)
        elif unconnected is not _IGNORE:
            self._not_connected(unconnected)

    def _on_publish_any(self, p: Publish) -> None:
        if p.qos == -1:
            self._on_publish_qos3(p)  # QoS -1 needs no connection
        elif self.state in CONNECTED:
            self._on_publish(p)
        else:
            self._not_connected("PUBLISH")

    def _on_pubrel(self, p: PubRel) -> None:
        assert self.session is not None
        self.session.complete_rel(p.msg_id)
        self._send(PubComp(p.msg_id))

    def _on_pubcomp(self, p: PubComp) -> None:
        if self.unacked.pop(("rel", p.msg_id), None) is not None:
            assert self.session is not None
            self.session.pubcomp(p.msg_id)

    def _on_searchgw(self, p: SearchGw) -> None:
        self._send(GwInfo(self.settings.gateway_id))

    def _on_encapsulated(self, p: Encapsulated) -> None:
        self.context.incr("packets.mqttsn.encapsulated.dropped")
        log.info("%s: forwarder encapsulation is not supported; dropped", self._who())

    def _on_broadcast(self, p: Advertise | GwInfo | PingResp) -> None:
        pass  # other gateways' broadcasts; an answer to a PINGREQ we never send

    # -- CONNECT and the will dialogue -----------------------------------------------

    def _on_connect(self, p: Connect) -> None:
        s = self.settings
        if self.state in CONNECTED:
            info = self.info
            assert info is not None
            if p.client_id == info.client_id and not p.clean_session and not p.will:
                self._reactivate(p)  # back from sleep, or a lost CONNACK
                return
            # a new connection replaces the old one (from the same address)
            same = p.client_id == info.client_id and not p.clean_session
            self._set_reason("takenover" if same else "discarded")
            self._notify_core_closed()
            self._reset()
        if p.protocol_id != PROTOCOL_ID:
            self._send(ConnAck(RC.NOT_SUPPORTED))
            return
        if not p.client_id or len(p.client_id) > s.max_clientid_len:
            self.context.incr("client.connack.refused")
            self._send(ConnAck(RC.NOT_SUPPORTED))
            return
        self.connect = p
        self.will_topic = None
        self.will_payload = b""
        if p.will:
            self.state = State.WILL_TOPIC
            self._send(WillTopicReq())
        else:
            self._authenticate()

    def _reset(self) -> None:
        self.state = State.IDLE
        self.info = None
        self.session = None
        self._core_closed = False
        self.unacked.clear()
        self.pending.clear()
        self._pending_qos0 = 0
        self._reg_wait = None
        self._pingresp_due = False
        self._out.append(SetTimer("idle", self.settings.idle_timeout))

    def _on_willtopic(self, p: WillTopic) -> None:
        if self.state is State.WILL_MSG:
            self._send(WillMsgReq())  # our WILLMSGREQ was lost; the client repeats
            return
        if self.state is not State.WILL_TOPIC:
            return
        if not p.topic:
            self.will_topic = None
            self._authenticate()
            return
        self.will_topic = p
        self.state = State.WILL_MSG
        self._send(WillMsgReq())

    def _on_willmsg(self, p: WillMsg) -> None:
        if self.state is not State.WILL_MSG:
            return
        self.will_payload = p.message
        self._authenticate()

    def _authenticate(self) -> None:
        p = self.connect
        assert p is not None
        host, port = self.peer if self.peer else (None, None)
        s = self.settings
        info = ClientInfo(
            client_id=p.client_id,
            protocol="mqttsn",
            proto_ver=1,
            peer_host=host,
            peer_port=port,
            listener=s.listener,
            mountpoint=s.mountpoint,
            keepalive=p.duration,
            clean_start=p.clean_session,
        )
        self._start_auth(info, None)

    def _auth_done(self, info: ClientInfo, code: int) -> None:
        s = self.settings
        p = self.connect
        assert p is not None
        if code:
            self._refuse(info, code, "authentication failed")
            return
        result = self.context.open_session(
            info,
            self.handle,
            clean_start=p.clean_session,
            expiry_interval=0 if p.clean_session else s.session_expiry_interval,
            receive_maximum=s.max_inflight,
            will=None,  # the will is the channel's: MQTT-SN can change it while connected
            will_delay=0,
        )
        if result.reason_code or result.session is None:
            self._refuse(info, result.reason_code or 0x80, "session refused")
            return
        self.session = result.session
        if p.clean_session:
            self.topic_ids.clear()
            self.id_topics.clear()
            self._next_topic_id = s.first_topic_id
        start = len(self._out)
        self._send(ConnAck(RC.ACCEPTED))
        self.context.connack(info, 0)
        self.state = State.ACTIVE
        self.keepalive = float(p.duration)
        self._out.append(CancelTimer("idle"))
        if p.duration:
            self._out.append(SetTimer("keepalive", p.duration * s.keepalive_multiplier))
        if result.connack_early:  # the CONNACK and its timers need not wait for the store
            mark_unheld(self._out, start)
        self._pump()  # anything the core pushed while the session opened
        result.session.resume()

    def _refuse(self, info: ClientInfo, code: int, why: str) -> None:
        self.context.incr("client.connack.refused")
        self.context.connack(info, code)
        log.info("%s refused: %s (0x%02X)", self._who(), why, code)
        self._send(ConnAck(RC.NOT_SUPPORTED))
        self.state = State.IDLE
        self.info = None

    def _reactivate(self, p: Connect) -> None:
        s = self.settings
        self.state = State.ACTIVE
        self._pingresp_due = False
        self.keepalive = float(p.duration)
        self._send(ConnAck(RC.ACCEPTED))
        self._out.append(CancelTimer("asleep"))
        if p.duration:
            self._out.append(SetTimer("keepalive", p.duration * s.keepalive_multiplier))
        self._resend_unacked()
        self._pump()

    def _message_will(self) -> Message | None:
        w = self.will_topic
        info = self.info
        if w is None or info is None:
            return None
        now = self.context.now()
        return Message(
            self.settings.mountpoint + w.topic,
            self.will_payload,
            max(0, w.qos),
            w.retain,
            publisher=info.client_id,
            timestamp=now,
        )

    def _publish_will(self) -> None:
        will = self._message_will()
        self.will_topic = None
        info = self.info
        if will is None or info is None:
            return
        self.context.incr("messages.will")
        allowed = self.context.authorize(info, "publish", will.topic, True)
        if allowed is True:
            self.context.publish(info, will)
        elif allowed is not False:  # asked for: published when allowed (the channel ends)
            context = self.context

            def answered(ok: bool) -> None:
                if ok:
                    context.publish(info, will)

            allowed.add_callback(answered)

    def _on_willtopicupd(self, p: WillTopicUpd) -> None:
        if not p.topic:
            self.will_topic = None
            self.will_payload = b""
        else:
            self.will_topic = WillTopic(p.topic, p.qos, p.retain)
        self._send(WillTopicResp(RC.ACCEPTED))

    def _on_willmsgupd(self, p: WillMsgUpd) -> None:
        self.will_payload = p.message
        self._send(WillMsgResp(RC.ACCEPTED))

    # -- DISCONNECT, sleep, PINGREQ ----------------------------------------------------

    def _on_disconnect(self, p: Disconnect) -> None:
        if self.state not in CONNECTED:
            if self.state is not State.IDLE:
                self._reset()
            self._send(Disconnect())
            return
        if p.duration:
            s = self.settings
            self.state = State.ASLEEP
            self._pingresp_due = False
            self._send(Disconnect())
            self._out.append(CancelTimer("keepalive"))
            self._out.append(SetTimer("asleep", p.duration * s.keepalive_multiplier))
            self.keepalive = float(p.duration)
            return
        self.will_topic = None  # a normal DISCONNECT: no will
        self._send(Disconnect())
        self._set_reason("normal")
        self._notify_core_closed()
        self._close("client disconnected")

    def _on_pingreq(self, p: PingReq) -> None:
        state = self.state
        if state is State.ACTIVE:
            self._send(PingResp())
        elif state in (State.ASLEEP, State.AWAKE):
            self.state = State.AWAKE
            self._pingresp_due = True
            self._out.append(
                SetTimer("asleep", self.keepalive * self.settings.keepalive_multiplier)
            )
            self._resend_unacked()
            self._pump()
        elif p.client_id:
            self._not_connected("PINGREQ")
        else:
            self._send(PingResp())  # a liveness probe of the gateway itself

    # -- PUBLISH in ------------------------------------------------------------------

    def _resolve(self, topic: int | str, tid_type: int) -> str | None:
        if tid_type == SHORT:
            return str(topic)
        if tid_type == PREDEFINED:
            return self.settings.predefined.get(int(topic))
        return self.id_topics.get(int(topic))

    def _topic_id_field(self, p: Publish) -> int:
        return short_id(p.topic) if isinstance(p.topic, str) else p.topic

    def _on_publish_qos3(self, p: Publish) -> None:
        s = self.settings
        if not s.enable_qos3:
            self.context.incr("messages.dropped.qos3_disabled")
            return
        if p.topic_id_type == NORMAL and self.state not in CONNECTED:
            return  # a normal id means nothing without a connection
        topic = self._resolve(p.topic, p.topic_id_type)
        if topic is None:
            self.context.incr("messages.dropped.invalid_topic_id")
            return
        info = self.info if self.state in CONNECTED else None
        if info is None:
            host, port = self.peer if self.peer else (None, None)
            info = ClientInfo(
                client_id=QOS3_CLIENT,
                protocol="mqttsn",
                proto_ver=1,
                peer_host=host,
                peer_port=port,
                listener=s.listener,
                mountpoint=s.mountpoint,
            )
        full = s.mountpoint + topic
        asker = info

        def decided(allowed: bool) -> None:
            if allowed:
                now = self.context.now()
                msg = Message(full, p.data, 0, p.retain, publisher=asker.client_id,
                              timestamp=now)
                self.context.publish(asker, msg)

        self._authorize(info, "publish", full, decided)

    def _on_publish(self, p: Publish) -> None:
        info, session = self.info, self.session
        assert info is not None and session is not None
        s = self.settings
        topic = self._resolve(p.topic, p.topic_id_type)
        tid = self._topic_id_field(p)
        if topic is None:
            self._send(PubAck(tid, p.msg_id, RC.INVALID_TOPIC_ID))
            return
        if p.qos == 2 and p.msg_id in session.awaiting_rel:
            self._send(PubRec(p.msg_id))  # a repeated PUBLISH: acknowledge, not again
            return
        full = s.mountpoint + topic

        def decided(allowed: bool) -> None:
            if self.session is not session:
                return  # (the session ended meanwhile)
            if not allowed:
                self._send(PubAck(tid, p.msg_id, RC.NOT_SUPPORTED))
                return
            self._publish_allowed(p, info, session, tid, full)

        self._authorize(info, "publish", full, decided)

    def _publish_allowed(
        self, p: Publish, info: ClientInfo, session: SessionAPI, tid: int, full: str
    ) -> None:
        # The acknowledgement goes before any delivery the publish causes to this very
        # client: constrained clients (Paho's MQTT-SN samples) read one message at a time
        # and expect the PUBACK first. With a durable node the shell still holds both
        # until the store has committed.
        at = len(self._out)
        if p.qos == 1:
            self._send(PubAck(tid, p.msg_id, RC.ACCEPTED))
        elif p.qos == 2:
            session.await_rel(p.msg_id)
            self._send(PubRec(p.msg_id))
        now = self.context.now()
        msg = Message(
            full, p.data, p.qos, p.retain, publisher=info.client_id, username=info.username,
            timestamp=now,
        )
        if self.context.publish(info, msg) < 0:
            # PUBLISH_REFUSED (the store cannot write; nothing was delivered): the
            # acknowledgement becomes "rejected: congestion" (QoS 1; the client retries
            # later, MQTT-SN 1.2 section 6.9) or, for QoS 2 which has no code, is
            # withdrawn (the client re-sends)
            if p.qos == 2:
                session.complete_rel(p.msg_id)
                del self._out[at]
            elif p.qos == 1:
                self._out[at] = self.codec.encode(PubAck(tid, p.msg_id, RC.CONGESTION))

    # -- REGISTER in and out ---------------------------------------------------------

    def _allocate_topic_id(self) -> int | None:
        used = self.id_topics
        start = self._next_topic_id
        tid = start
        while tid in used:
            tid = tid + 1 if tid < MAX_TOPIC_ID else self.settings.first_topic_id
            if tid == start:
                return None
        self._next_topic_id = tid + 1 if tid < MAX_TOPIC_ID else self.settings.first_topic_id
        return tid

    def _known(self, topic: str, tid: int) -> None:
        self.topic_ids[topic] = tid
        self.id_topics[tid] = topic

    def _id_for(self, topic: str) -> int | None:
        tid = self.topic_ids.get(topic)
        if tid is None:
            tid = self._allocate_topic_id()
            if tid is not None:
                self._known(topic, tid)
        return tid

    def _on_register(self, p: Register) -> None:
        name = p.topic_name
        if not name or is_wildcard(name):
            self._send(RegAck(0, p.msg_id, RC.NOT_SUPPORTED))
            return
        tid = self._id_for(name)
        if tid is None:
            self._send(RegAck(0, p.msg_id, RC.CONGESTION))
            return
        self._send(RegAck(tid, p.msg_id, RC.ACCEPTED))

    def _on_regack(self, p: RegAck) -> None:
        wait = self._reg_wait
        if wait is None or wait[0] != p.msg_id:
            return
        self._reg_wait = None
        self.unacked.pop(("reg", p.msg_id), None)
        topic = wait[1]
        if p.return_code == RC.ACCEPTED:
            self._known(topic, p.topic_id)
        else:
            log.info("%s refused topic %r (0x%02X)", self._who(), topic, p.return_code)
            self._drop_pending_topic(topic, "topic_refused")
        self._pump()

    def _drop_pending_topic(self, topic: str, reason: str) -> None:
        mount = self.settings.mountpoint
        keep: deque[Delivery] = deque()
        for d in self.pending:
            if self._local_topic(d.message.topic, mount) == topic:
                self.context.incr("messages.dropped")
                self.context.incr("messages.dropped." + reason)
                if d.qos == 0:
                    self._pending_qos0 -= 1
                elif d.packet_id is not None and self.session is not None:
                    self.session.discard(d.packet_id)
            else:
                keep.append(d)
        self.pending = keep

    def _next_mid(self) -> int:
        mid = self._next_msg_id
        self._next_msg_id = mid % 0xFFFF + 1
        return mid

    # -- deliveries out --------------------------------------------------------------

    @staticmethod
    def _local_topic(topic: str, mount: str) -> str:
        return topic[len(mount) :] if mount and topic.startswith(mount) else topic

    def _queue(self, deliveries: list[Delivery]) -> None:
        cap = self.settings.max_sleep_buffer
        for d in deliveries:
            if d.qos == 0:
                if self.state not in SENDING and self._pending_qos0 >= cap:
                    self._drop_oldest_qos0()
                self._pending_qos0 += 1
            self.pending.append(d)

    def _drop_oldest_qos0(self) -> None:
        for i, d in enumerate(self.pending):
            if d.qos == 0:
                del self.pending[i]
                self._pending_qos0 -= 1
                self.context.incr("messages.dropped")
                self.context.incr("messages.dropped.sleep_buffer_full")
                return

    def _target(self, topic: str) -> tuple[int, int | str] | None:
        tid = self.topic_ids.get(topic)
        if tid is not None:
            return NORMAL, tid
        pre = self._predefined_ids.get(topic)
        if pre is not None:
            return PREDEFINED, pre
        if len(topic.encode()) == 2:
            return SHORT, topic
        return None

    def _pump(self) -> None:
        """Send pending deliveries in order while the client is awake and no REGISTER of
        ours awaits its REGACK; then the PINGRESP of a wake-up."""
        if self.state not in SENDING:
            return
        pending = self.pending
        mount = self.settings.mountpoint
        sent: list[Delivery] = []
        while pending and self._reg_wait is None:
            d = pending[0]
            topic = self._local_topic(d.message.topic, mount)
            target = self._target(topic)
            if target is None:
                tid = self._allocate_topic_id()
                if tid is None:
                    self._drop_pending_topic(topic, "no_topic_id")
                    continue
                mid = self._next_mid()
                self._reg_wait = (mid, topic)
                self._send_tracked("reg", Register(tid, mid, topic))
                break
            pending.popleft()
            if d.qos == 0:
                self._pending_qos0 -= 1
            tid_type, topic_field = target
            packet = Publish(
                topic_field, d.message.payload, d.qos, d.packet_id or 0, d.retain, d.dup,
                tid_type,
            )
            try:
                if d.qos:
                    self._send_tracked("pub", packet)
                else:
                    self._send(packet)
            except LocalProtocolError as exc:  # too large for a datagram
                log.info("%s: not sent (%s)", self._who(), exc)
                self.context.incr("messages.dropped")
                self.context.incr("messages.dropped.too_large")
                if d.packet_id is not None and self.session is not None:
                    self.session.discard(d.packet_id)
                continue
            sent.append(d)
        if sent:
            assert self.info is not None
            self.context.delivered(self.info, sent)
        if self._pingresp_due and not pending and self._reg_wait is None:
            self._pingresp_due = False
            self._send(PingResp())
            self.state = State.ASLEEP

    def _send_tracked(self, kind: str, packet: Publish | PubRel | Register) -> None:
        data = self.codec.encode(packet)
        if len(data) > self.settings.max_datagram:
            raise LocalProtocolError(f"{len(data)} bytes do not fit in a datagram")
        self._out.append(data)
        mid = packet.msg_id
        self.unacked[(kind, mid)] = _Outstanding(
            packet, 0, self._monotonic() + self.settings.retry_interval
        )
        if not self._retry_armed:
            self._retry_armed = True
            self._out.append(SetTimer("retry", self.settings.retry_interval))

    def _retry(self, now: float) -> None:
        self._retry_armed = False
        if not self.unacked or self.state not in CONNECTED:
            return
        if self.state is State.ASLEEP:
            return  # resent when the client wakes up
        s = self.settings
        for out in list(self.unacked.values()):
            if out.due > now:
                continue
            if out.attempts >= s.max_retries:
                self.context.incr("messages.retry_exhausted")
                self._lost(f"no acknowledgement after {s.max_retries} retransmissions",
                           "reached_max_retry_times")
                return
            out.attempts += 1
            out.due = now + s.retry_interval
            self._resend(out)
        if self.unacked:
            soonest = min(o.due for o in self.unacked.values())
            self._retry_armed = True
            self._out.append(SetTimer("retry", max(0.0, soonest - now)))

    def _resend(self, out: _Outstanding) -> None:
        p = out.packet
        if isinstance(p, Publish):
            p = out.packet = replace(p, dup=True)
        self._out.append(self.codec.encode(p))
        self.context.incr("messages.retransmitted")

    def _resend_unacked(self) -> None:
        now = self._monotonic()
        for out in self.unacked.values():
            out.due = now + self.settings.retry_interval
            self._resend(out)
        if self.unacked and not self._retry_armed:
            self._retry_armed = True
            self._out.append(SetTimer("retry", self.settings.retry_interval))

    def _on_puback(self, p: PubAck) -> None:
        session = self.session
        assert session is not None
        out = self.unacked.pop(("pub", p.msg_id), None)
        if p.return_code == RC.INVALID_TOPIC_ID:
            topic = self.id_topics.pop(p.topic_id, None)  # the client forgot it: REGISTER again
            if topic is not None:
                self.topic_ids.pop(topic, None)
        if out is None:
            return
        if p.return_code != RC.ACCEPTED:
            self.context.incr("messages.dropped")
            self.context.incr("messages.dropped.rejected_by_client")
            session.discard(p.msg_id)
        elif isinstance(out.packet, Publish) and out.packet.qos == 1:
            session.puback(p.msg_id)
        else:
            session.discard(p.msg_id)  # a PUBACK to QoS 2: the client refused it

    def _on_pubrec(self, p: PubRec) -> None:
        session = self.session
        assert session is not None
        self.unacked.pop(("pub", p.msg_id), None)
        session.pubrec(p.msg_id)
        self._send_tracked("rel", PubRel(p.msg_id))

    # -- SUBSCRIBE / UNSUBSCRIBE -----------------------------------------------------

    def _filter_of(self, topic: int | str, tid_type: int) -> str | None:
        if tid_type == PREDEFINED:
            return self.settings.predefined.get(int(topic))
        return str(topic)

    def _on_subscribe(self, p: Subscribe) -> None:
        info = self.info
        assert info is not None
        s = self.settings
        qos = max(0, min(p.qos, 2))
        f = self._filter_of(p.topic, p.topic_id_type)
        if f is None:
            self._send(SubAck(p.msg_id, 0, qos, RC.INVALID_TOPIC_ID))
            return
        try:
            validate_topic_filter(f)
        except Exception:
            self._send(SubAck(p.msg_id, 0, qos, RC.NOT_SUPPORTED))
            return
        tid = 0
        if p.topic_id_type == PREDEFINED:
            tid = int(p.topic)
        elif p.topic_id_type == NORMAL and not is_wildcard(f):
            got = self._id_for(f)
            if got is None:
                self._send(SubAck(p.msg_id, 0, qos, RC.CONGESTION))
                return
            tid = got
        full = s.mountpoint + f
        session = self.session

        def decided(allowed: bool) -> None:
            if self.session is not session or self.info is not info:
                return  # (the session ended meanwhile)
            if not allowed:
                self._send(SubAck(p.msg_id, 0, qos, RC.NOT_SUPPORTED))
                return
            self._subscribe_allowed(p, info, full, qos, tid)

        self._authorize(info, "subscribe", full, decided)

    def _subscribe_allowed(
        self, p: Subscribe, info: ClientInfo, full: str, qos: int, tid: int
    ) -> None:
        opts = SubOptions(qos)
        existed = self.context.subscribe(info, full, opts)
        if subscribe_refused(existed):  # an exclusive topic another client holds
            self._send(SubAck(p.msg_id, 0, qos, RC.CONGESTION))
            return
        self._send(SubAck(p.msg_id, tid, qos, RC.ACCEPTED))
        self.context.deliver_retained(info, full, opts, existed == RESUBSCRIBED)

    def _on_unsubscribe(self, p: Unsubscribe) -> None:
        info = self.info
        assert info is not None
        f = self._filter_of(p.topic, p.topic_id_type)
        if f is not None:
            self.context.unsubscribe(info, self.settings.mountpoint + f)
        self._send(UnsubAck(p.msg_id))


_ANY = "any"  # handled whether or not the client is connected
_IGNORE = ""  # without a connection: dropped silently
# packet type -> (handler, what happens without a connection: _ANY, _IGNORE, or the name
# of the packet in the DISCONNECT's log line)
_ROUTES: dict[type, tuple[Callable[[MqttSnChannel, Any], None], str]] = {
    Publish: (MqttSnChannel._on_publish_any, _ANY),
    PubAck: (MqttSnChannel._on_puback, _IGNORE),
    PubRec: (MqttSnChannel._on_pubrec, _IGNORE),
    PubRel: (MqttSnChannel._on_pubrel, _IGNORE),
    PubComp: (MqttSnChannel._on_pubcomp, _IGNORE),
    PingReq: (MqttSnChannel._on_pingreq, _ANY),
    Connect: (MqttSnChannel._on_connect, _ANY),
    WillTopic: (MqttSnChannel._on_willtopic, _ANY),
    WillMsg: (MqttSnChannel._on_willmsg, _ANY),
    Register: (MqttSnChannel._on_register, "REGISTER"),
    RegAck: (MqttSnChannel._on_regack, _IGNORE),
    Subscribe: (MqttSnChannel._on_subscribe, "SUBSCRIBE"),
    Unsubscribe: (MqttSnChannel._on_unsubscribe, "UNSUBSCRIBE"),
    Disconnect: (MqttSnChannel._on_disconnect, _ANY),
    WillTopicUpd: (MqttSnChannel._on_willtopicupd, _IGNORE),
    WillMsgUpd: (MqttSnChannel._on_willmsgupd, _IGNORE),
    SearchGw: (MqttSnChannel._on_searchgw, _ANY),
    Encapsulated: (MqttSnChannel._on_encapsulated, _ANY),
    Advertise: (MqttSnChannel._on_broadcast, _ANY),
    GwInfo: (MqttSnChannel._on_broadcast, _ANY),
    PingResp: (MqttSnChannel._on_broadcast, _ANY),
}
