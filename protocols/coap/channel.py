"""The CoAP gateway channel (EMQX-compatible publish/subscribe mapping), sans-IO.

One channel per peer address (the datagram shell keys them). Datagrams in, effects out;
the core is reached only through :class:`~protocols.context.GatewayContext`, so a CoAP
client is a session of the same broker as every other front-end (same authentication,
authorization, hooks, metrics, retained messages).

The mapping (``{mp}`` is the configured mountpoint, may be empty):

- ``POST|PUT /ps/{topic}?qos=&retain=&expiry=`` publishes the body to ``{mp}{topic}``
  (2.04). Without ``qos`` a CON request publishes at QoS 1, a NON one at QoS 0.
- ``GET /ps/{filter}`` with Observe 0 subscribes (``qos``, ``nl``, ``rh`` in the query);
  the 2.05 answer carries Observe. Each message is a 2.05 notification with the
  observation's token and a strictly increasing Observe number, NON for QoS 0 and CON
  otherwise. Observe 1 (or a RST to a notification) unsubscribes.
- ``/mqtt/connection``: POST with ``clientid``/``username``/``password`` authenticates
  and answers 2.01 with a token; from then on every request needs ``clientid`` and
  ``token`` (missing 4.00, wrong 4.01); PUT is the heartbeat (2.04), DELETE closes (2.02).
  With ``connection_required`` a request without a connection is refused the same way.
  Without it (connectionless), the first request that needs a session authenticates the
  query's ``clientid``/``username``/``password`` (client id ``coap-{host}:{port}`` when
  absent).
- Over DTLS the listener may bind the client id/username to the handshake (``bound``, a
  :class:`~protocols.identity.BoundIdentity`): the query may leave them out, naming
  others is refused 4.03, a handshake without the required field 4.01.

Message layer (RFC 7252): CON requests are answered piggybacked in the ACK, NON requests
by a NON; a repeated message id (within the last ``dedup_size`` requests) gets the same
answer again without acting twice, or nothing while its answer is still being computed;
an empty CON (ping) gets a RST. CON notifications are retransmitted ``max_retransmit``
times with exponential back-off from ``ack_timeout``; then the observation is cancelled.
Blockwise (RFC 7959): Block1 request bodies are reassembled (2.31 Continue per block,
at most ``max_body`` bytes: 4.13; a block out of order: 4.08); notifications larger
than the block size carry Block2 and the rest is fetched with GET + Block2 from the
last notification of that observation.

Invariants:
- A malformed datagram is counted (``packets.malformed``) and, when its header could be
  read, answered 4.00; it changes nothing else and never touches other peers.
- A :class:`Delivery` with a packet id is settled exactly once: acknowledged (ACK of its
  CON notification) or discarded (no observation, RST, retransmissions exhausted, close).
- Effects of re-entrant calls (the core delivering to this client while its own request
  is handled, e.g. retained messages after a subscribe) are appended in order to the
  outer call's list, so the 2.05 of a subscribe precedes the retained notification.
- The core learns of the end of the session exactly once (``context.close``).
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from protocols.coap.codec import (
    ACK,
    CON,
    NON,
    RST,
    Block,
    Code,
    Message,
    RemoteProtocolError,
    encode,
    make,
    unknown_critical,
)
from protocols.coap.endpoint import CoapEndpoint, query_of
from protocols.context import (
    RESUBSCRIBED,
    ClientInfo,
    ConnectionHandle,
    Delivery,
    GatewayContext,
    SubOptions,
    subscribe_refused,
)
from protocols.context import Message as BrokerMessage
from protocols.effects import CancelTimer, Close, Effect, SetTimer
from protocols.identity import BoundIdentity, IdentityRefused
from protocols.mqtt.topics import validate_topic_filter, validate_topic_name

log = logging.getLogger("protocols.coap.channel")

OBSERVE_MAX = 1 << 24


@dataclass(slots=True)
class CoapSettings:
    """One CoAP gateway's behaviour (``[gateway.coap]``)."""

    mountpoint: str = ""
    listener: str = "coap:udp:default"
    connection_required: bool = False
    heartbeat: float = 30.0  # connection mode: a heartbeat at least this often
    idle_timeout: float = 30.0  # connectionless, nothing observed: forget the peer
    ack_timeout: float = 2.0
    max_retransmit: int = 4
    block_size: int = 1024
    max_body: int = 4 * 1024 * 1024
    dedup_size: int = 64
    max_inflight: int = 32
    max_clientid_len: int = 65535


class State(Enum):
    NEW = "new"  # no session
    AUTHENTICATING = "authenticating"
    OPEN = "open"  # a session
    CLOSED = "closed"


@dataclass(slots=True)
class Observation:
    filter: str  # with the mountpoint
    path: tuple[str, ...]
    token: bytes
    qos: int
    szx: int
    last: bytes = b""  # body of the latest notification (Block2 follow-ups)


@dataclass(slots=True)
class _Outstanding:
    data: bytes
    key: str  # observation filter
    packet_id: int | None
    qos: int
    attempts: int = 0
    timeout: float = 2.0


@dataclass(slots=True)
class _Upload:
    next_num: int
    szx: int
    body: bytearray = field(default_factory=bytearray)


def _szx(size: int) -> int:
    return max(0, min(6, size.bit_length() - 5))


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT filter matching (``+``, ``#``; wildcards at the first level skip ``$``)."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    fl = topic_filter.split("/")
    tl = topic.split("/")
    for i, f in enumerate(fl):
        if f == "#":
            return True
        if i >= len(tl):
            return False
        if f != "+" and f != tl[i]:
            return False
    return len(fl) == len(tl)


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes", "")


class CoapChannel(CoapEndpoint):
    LABEL = "coap"
    CLOSED = State.CLOSED
    AUTHENTICATING = State.AUTHENTICATING

    def __init__(
        self,
        context: GatewayContext,
        settings: CoapSettings,
        handle: ConnectionHandle,
        *,
        peer: tuple[str, int] | None = None,
        monotonic: Callable[[], float],
        token_factory: Callable[[], str] = lambda: secrets.token_hex(8),
        bound: BoundIdentity | None = None,
    ) -> None:
        super().__init__(context, handle, peer, monotonic, dedup_size=settings.dedup_size)
        self.settings = settings
        self.bound = bound  # DTLS: the client id/username the handshake fixes
        self._token_factory = token_factory
        self.state: State = State.NEW
        self.conn_token: str | None = None  # connection mode
        self.observations: dict[str, Observation] = {}
        self._seq = 1
        self._outstanding: dict[int, _Outstanding] = {}
        self._non_sent: OrderedDict[int, str] = OrderedDict()  # NON notification mid -> filter
        self._uploads: dict[tuple[str, ...], _Upload] = {}
        self._waiting: list[Message] = []  # requests held while authenticating
        self._probe = False

    # -- entry points from the shell ---------------------------------------------------

    def connection_made(self) -> list[Effect]:
        self.last_rx = self._monotonic()
        return [SetTimer("idle", self._idle_limit())]

    def on_timer(self, name: str) -> list[Effect]:
        if self.state is State.CLOSED:
            return []
        outer = self._enter()
        if name == "idle":
            self._on_idle()
        elif name.startswith("rt:"):
            self._retransmit(int(name[3:]))
        return self._leave(outer)

    def connection_lost(self) -> None:
        self.state = State.CLOSED
        self._settle_all()
        self._notify_core_closed()

    # -- entry points from the core ----------------------------------------------------

    def deliver(self, deliveries: list[Delivery]) -> list[Effect]:
        if self.state is State.CLOSED:
            for d in deliveries:
                self._discard(d.packet_id)
            return []
        outer = self._enter()
        sent: list[Delivery] = []
        for d in deliveries:
            if self._notify(d):
                sent.append(d)
        if sent and self.info is not None:
            self.context.delivered(self.info, sent)
        return self._leave(outer)

    # -- plumbing (the rest is in CoapEndpoint and ChannelBase) ------------------------

    def _idle_limit(self) -> float:
        s = self.settings
        return s.heartbeat * 1.5 if self.conn_token is not None else s.idle_timeout

    def _close(self, reason: str, event: str = "") -> None:
        """End the channel; ``event``: why, for ``client.disconnected`` (EMQX's name)."""
        if self.state is State.CLOSED:
            return
        self._set_reason(event)
        self.state = State.CLOSED
        self._settle_all()
        self._notify_core_closed()
        self._out.append(Close(reason))
        log.info("%s: closed: %s", self._who(), reason)

    def _settle_all(self) -> None:
        for mid, out in list(self._outstanding.items()):
            self._discard(out.packet_id)
            self._out.append(CancelTimer(f"rt:{mid}"))
        self._outstanding.clear()

    def _discard(self, packet_id: int | None) -> None:
        if packet_id is not None and self.session is not None:
            self.session.discard(packet_id)

    def _malformed(self, exc: RemoteProtocolError) -> None:
        self.context.incr("packets.malformed")
        log.warning("%s: malformed CoAP message: %s", self._who(), exc.reason)
        self._answer_malformed(exc, exc.reason.encode()[:128])

    # -- message layer ---------------------------------------------------------------

    def _dispatch(self, msg: Message) -> None:
        mtype, code = msg.mtype, msg.code
        if mtype in (ACK, RST):
            self._on_ack(msg.mid, reset=mtype == RST)
            return
        if code == Code.EMPTY:
            if mtype == CON:  # CoAP ping
                self._out.append(encode(make(RST, Code.EMPTY, msg.mid)))
            return
        if not code.is_request():
            if mtype == CON:  # we sent no request: reject
                self._out.append(encode(make(RST, Code.EMPTY, msg.mid)))
            return
        if self._repeated(msg.mid):
            return
        if self.state is State.AUTHENTICATING:
            self._waiting.append(msg)
            return
        self._request(msg)

    def _respond(
        self,
        req: Message,
        code: int,
        payload: bytes = b"",
        *,
        observe: int | None = None,
        block1: Block | None = None,
        block2: Block | None = None,
        size2: int | None = None,
    ) -> None:
        resp = self._reply(req, code, payload)
        if observe is not None:
            resp.opt.observe = observe
        if block2 is not None:
            resp.opt.block2 = block2
        if size2 is not None:
            resp.opt.size2 = size2
        self._send_reply(req, resp, block1)

    def _on_ack(self, mid: int, *, reset: bool) -> None:
        out = self._outstanding.pop(mid, None)
        if out is None:
            key = self._non_sent.pop(mid, None)
            if reset and key is not None:
                self._cancel_observation(key)
            return
        self._out.append(CancelTimer(f"rt:{mid}"))
        if reset:
            self._discard(out.packet_id)
            self._cancel_observation(out.key)
            return
        session = self.session
        if out.packet_id is not None and session is not None:
            if out.qos == 1:
                session.puback(out.packet_id)
            else:
                session.pubrec(out.packet_id)
                session.pubcomp(out.packet_id)

    def _retransmit(self, mid: int) -> None:
        out = self._outstanding.get(mid)
        if out is None:
            return
        if out.attempts >= self.settings.max_retransmit:
            del self._outstanding[mid]
            self._discard(out.packet_id)
            self.context.incr("messages.dropped")
            log.info("%s: notification unacknowledged; observation of %r cancelled",
                     self._who(), out.key)
            self._cancel_observation(out.key)
            return
        out.attempts += 1
        out.timeout *= 2
        self._out.append(out.data)
        self._out.append(SetTimer(f"rt:{mid}", out.timeout))

    def _on_idle(self) -> None:
        limit = self._idle_limit()
        idle = self._monotonic() - self.last_rx
        if idle < limit:
            self._out.append(SetTimer("idle", limit - idle))
            return
        if self.conn_token is not None:
            self.context.incr("client.keepalive_timeout")
            self._close("no heartbeat", "keepalive_timeout")
        elif self.observations:
            self._probe = True  # the next notification goes CON: is anybody there?
            self._out.append(SetTimer("idle", limit))
        else:
            self._close("idle", "idle_timeout")

    # -- requests ------------------------------------------------------------------

    def _request(self, msg: Message) -> None:
        crit = unknown_critical(msg)
        if crit is not None:
            self._respond(msg, Code.BAD_OPTION, f"option {crit}".encode())
            return
        path = tuple(msg.opt.uri_path)
        q = query_of(msg)
        if path == ("mqtt", "connection"):
            self._connection(msg, q)
            return
        if len(path) < 2 or path[0] != "ps":
            self._respond(msg, Code.NOT_FOUND)
            return
        refusal = self._check_connection(q)
        if refusal is not None:
            self._respond(msg, refusal)
            return
        topic = "/".join(path[1:])
        code = msg.code
        if code in (Code.POST, Code.PUT):
            body = self._body(msg, path)
            if body is None:
                return
            if not self._need_session(msg, q):
                return
            self._publish(msg, topic, q, body)
        elif code == Code.GET:
            observe = msg.opt.observe
            if observe == 0:
                if self._need_session(msg, q):
                    self._subscribe(msg, topic, path, q)
            elif observe == 1:
                self._unsubscribe(msg, topic)
            else:
                self._fetch_block(msg, topic)
        else:
            self._respond(msg, Code.METHOD_NOT_ALLOWED)

    def _check_connection(self, q: dict[str, str]) -> int | None:
        if self.conn_token is None and not self.settings.connection_required:
            return None
        cid, token = q.get("clientid"), q.get("token")
        if not cid and self.bound is not None:  # DTLS: the handshake names the client
            cid = self.bound.client_id
        if not cid or not token:
            return int(Code.BAD_REQUEST)
        if (
            self.conn_token is None
            or self.info is None
            or cid != self.info.client_id
            or not secrets.compare_digest(token, self.conn_token)
        ):
            return int(Code.UNAUTHORIZED)
        return None

    def _body(self, msg: Message, path: tuple[str, ...]) -> bytes | None:
        """The whole request body, or None after answering a Block1 step or error. The
        reassembled body replaces the last block's payload (and its Block1 option goes),
        so a request that waits for authentication is not reassembled twice."""
        b1 = msg.opt.block1
        if b1 is None:
            return bytes(msg.payload)
        s = self.settings
        size = 1 << (b1.size_exponent + 4)
        offset = b1.block_number * size
        if b1.block_number == 0:
            self._uploads[path] = _Upload(0, b1.size_exponent)
        up = self._uploads.get(path)
        if up is None or offset != len(up.body):
            self._uploads.pop(path, None)
            self._respond(msg, Code.REQUEST_ENTITY_INCOMPLETE)
            return None
        up.body += msg.payload
        if len(up.body) > s.max_body:
            self._uploads.pop(path, None)
            self._respond(msg, Code.REQUEST_ENTITY_TOO_LARGE)
            return None
        if b1.more:
            # a smaller szx than the client's tells it to continue with smaller blocks
            szx = min(b1.size_exponent, _szx(s.block_size))
            self._respond(msg, Code.CONTINUE, block1=Block(b1.block_number, True, szx))
            return None
        del self._uploads[path]
        body = bytes(up.body)
        msg.payload = body
        msg.opt.block1 = None
        self._last_block1 = (msg.mid, Block(b1.block_number, False, b1.size_exponent))
        return body

    def _need_session(self, msg: Message, q: dict[str, str]) -> bool:
        """True when there is a session; otherwise authentication starts (or the request
        waits for it) and the request is handled when it ends."""
        if self.state is State.OPEN:
            return True
        if self.state is State.AUTHENTICATING:
            self._waiting.append(msg)
            return False
        host = self.peer[0] if self.peer else "?"
        port = self.peer[1] if self.peer else 0
        named = self._identify(msg, q)
        if named is None:
            return False
        cid = named[0] or f"coap-{host}:{port}"
        if len(cid) > self.settings.max_clientid_len:
            self._respond(msg, Code.BAD_REQUEST, b"client id too long")
            return False
        password = q.get("password")
        self._authenticate(msg, cid, named[1],
                           password.encode() if password is not None else None)
        return False

    def _identify(self, msg: Message, q: dict[str, str]) -> tuple[str | None, str | None] | None:
        """The query's client id and username, checked against the DTLS identity (None
        after answering 4.01/4.03)."""
        cid, username = q.get("clientid"), q.get("username")
        if self.bound is None:
            return cid, username
        checked = self.bound.check(cid, username)
        if isinstance(checked, IdentityRefused):
            log.warning("%s refused: %s", self._who(), checked.reason)
            self.context.incr("client.connack.refused")
            code = Code.UNAUTHORIZED if checked.missing else Code.FORBIDDEN
            self._respond(msg, code, checked.reason.encode())
            return None
        return checked

    def _authenticate(
        self, msg: Message, cid: str, username: str | None, password: bytes | None
    ) -> None:
        s = self.settings
        host, port = self.peer if self.peer else (None, None)
        info = ClientInfo(
            client_id=cid,
            protocol="coap",
            proto_ver=1,
            username=username,
            peer_host=host,
            peer_port=port,
            listener=s.listener,
            mountpoint=s.mountpoint,
            keepalive=int(s.heartbeat),
            clean_start=True,
            connected_at=self.context.now(),
        )
        self._waiting = [msg]
        self._start_auth(info, password)

    def _auth_done(self, info: ClientInfo, code: int) -> None:
        waiting, self._waiting = self._waiting, []
        if code == 0:
            result = self.context.open_session(
                info, self.handle, clean_start=True, expiry_interval=0,
                receive_maximum=self.settings.max_inflight, will=None, will_delay=0,
            )
            if result.reason_code or result.session is None:
                code = result.reason_code or 0x80
            else:
                self.session = result.session
                result.session.resume()
        self.context.connack(info, code)
        if code:
            self.context.incr("client.connack.refused")
            log.info("%s refused (0x%02X)", self._who(), code)
            self.state = State.NEW
            self.info = None
            for m in waiting:
                self._respond(m, Code.UNAUTHORIZED)
            return
        self.state = State.OPEN
        first = waiting[0] if waiting else None
        if first is not None and tuple(first.opt.uri_path) == ("mqtt", "connection"):
            waiting = waiting[1:]
            self.conn_token = self._token_factory()
            self._out.append(SetTimer("idle", self._idle_limit()))
            self._respond(first, Code.CREATED, self.conn_token.encode())
        for m in waiting:
            self._request(m)

    # -- /mqtt/connection ------------------------------------------------------------

    def _connection(self, msg: Message, q: dict[str, str]) -> None:
        code = msg.code
        if code == Code.POST:
            named = self._identify(msg, q)
            if named is None:
                return
            cid, username = named
            if not cid:
                self._respond(msg, Code.BAD_REQUEST, b"clientid missing")
                return
            if self.state is State.AUTHENTICATING:
                self._respond(msg, Code.SERVICE_UNAVAILABLE)
                return
            if self.state is State.OPEN:  # a new connection replaces the old session
                self._set_reason("discarded")
                self._drop_session()
            password = q.get("password")
            self._authenticate(msg, cid, username,
                               password.encode() if password is not None else None)
            return
        if code not in (Code.PUT, Code.DELETE):
            self._respond(msg, Code.METHOD_NOT_ALLOWED)
            return
        refusal = self._check_connection(q)
        if refusal is None and self.conn_token is None:
            refusal = int(Code.UNAUTHORIZED)
        if refusal is not None:
            self._respond(msg, refusal)
            return
        if code == Code.PUT:
            self._respond(msg, Code.CHANGED)
            return
        self._respond(msg, Code.DELETED)
        self._close("connection deleted", "normal")

    def _drop_session(self) -> None:
        self._settle_all()
        self.observations.clear()
        self._notify_core_closed()
        self.session = None
        self.info = None
        self.conn_token = None
        self._core_closed = False
        self.state = State.NEW

    # -- publish / subscribe -------------------------------------------------------------

    def _publish(self, msg: Message, topic: str, q: dict[str, str], body: bytes) -> None:
        info = self.info
        assert info is not None
        try:
            qos = int(q["qos"]) if "qos" in q else (1 if msg.mtype == CON else 0)
            expiry = int(q["expiry"]) if q.get("expiry") else None
            if qos not in (0, 1, 2) or (expiry is not None and expiry < 0):
                raise ValueError
            full = self.settings.mountpoint + topic
            validate_topic_name(full)
        except Exception:
            self._respond(msg, Code.BAD_REQUEST)
            return
        self._authorized(msg, info, "publish", full, lambda: self._publish_allowed(
            msg, info, full, qos, expiry, q, body))

    def _authorized(self, msg: Message, info: ClientInfo, action: str, topic: str,
                    then: Callable[[], None]) -> None:
        """Authorize ``action`` on ``topic`` (now or when a pending decision comes), then
        run ``then``, or answer 4.03; nothing when the session ended meanwhile."""
        session = self.session

        def decided(allowed: bool) -> None:
            if self.info is not info or self.session is not session:
                return
            if not allowed:
                self._respond(msg, Code.FORBIDDEN)
                return
            then()

        self._authorize(info, action, topic, decided)

    def _publish_allowed(self, msg: Message, info: ClientInfo, full: str, qos: int,
                         expiry: int | None, q: dict[str, str], body: bytes) -> None:
        now = self.context.now()
        m = BrokerMessage(full, body, qos, _flag(q.get("retain")),
                          publisher=info.client_id, username=info.username, timestamp=now,
                          expires_at=None if expiry is None else now + expiry)
        if qos and self.context.publish(info, m) < 0:
            # PUBLISH_REFUSED: the node's store cannot make it durable now (disk full, a
            # write error); nothing was delivered, the device may try again later.
            # (Deliveries this publish causes to this very peer are deferred by the
            # shell until after this answer, so publishing first keeps the wire order.)
            self._respond(msg, Code.SERVICE_UNAVAILABLE, b"store unavailable")
            return
        self._respond(msg, Code.CHANGED)
        if not qos:
            self.context.publish(info, m)

    def _subscribe(
        self, msg: Message, topic: str, path: tuple[str, ...], q: dict[str, str]
    ) -> None:
        info = self.info
        assert info is not None
        s = self.settings
        try:
            qos = int(q.get("qos") or 0)
            rh = int(q.get("rh") or 0)
            if qos not in (0, 1, 2) or rh not in (0, 1, 2):
                raise ValueError
            full = s.mountpoint + topic
            validate_topic_filter(full)
        except Exception:
            self._respond(msg, Code.BAD_REQUEST)
            return
        self._authorized(msg, info, "subscribe", full, lambda: self._subscribe_allowed(
            msg, info, full, path, qos, rh, q))

    def _subscribe_allowed(self, msg: Message, info: ClientInfo, full: str,
                           path: tuple[str, ...], qos: int, rh: int, q: dict[str, str]
                           ) -> None:
        s = self.settings
        b2 = msg.opt.block2
        szx = min(_szx(s.block_size), b2.size_exponent if b2 is not None else 6)
        self.observations[full] = Observation(full, path, msg.token, qos, szx)
        opts = SubOptions(qos, no_local=_flag(q.get("nl")), retain_handling=rh)
        existed = self.context.subscribe(info, full, opts)
        if subscribe_refused(existed):  # an exclusive topic another client holds
            del self.observations[full]
            self._respond(msg, Code.SERVICE_UNAVAILABLE)
            return
        self._respond(msg, Code.CONTENT, observe=self._next_seq())
        self.context.deliver_retained(info, full, opts, existed == RESUBSCRIBED)

    def _unsubscribe(self, msg: Message, topic: str) -> None:
        full = self.settings.mountpoint + topic
        self._cancel_observation(full)
        self._respond(msg, Code.CONTENT)

    def _cancel_observation(self, key: str) -> None:
        obs = self.observations.pop(key, None)
        if obs is None:
            return
        if self.info is not None and self.session is not None:
            self.context.unsubscribe(self.info, key)
        if not self.observations and self.conn_token is None:
            self._out.append(SetTimer("idle", self._idle_limit()))

    def _fetch_block(self, msg: Message, topic: str) -> None:
        """GET without Observe: the rest of a large notification (Block2)."""
        obs = self.observations.get(self.settings.mountpoint + topic)
        if obs is None:
            self._respond(msg, Code.NOT_FOUND)
            return
        b2 = msg.opt.block2
        num, szx = (b2.block_number, min(b2.size_exponent, obs.szx)) if b2 else (0, obs.szx)
        size = 1 << (szx + 4)
        body = obs.last
        if len(body) <= size and num == 0:
            self._respond(msg, Code.CONTENT, body)
            return
        start = num * size
        if start >= len(body) and num:
            self._respond(msg, Code.BAD_REQUEST)
            return
        chunk = body[start : start + size]
        more = start + size < len(body)
        self._respond(msg, Code.CONTENT, chunk, block2=Block(num, more, szx),
                      size2=len(body) if num == 0 else None)

    def _next_seq(self) -> int:
        seq = self._seq
        self._seq = (seq + 1) % OBSERVE_MAX
        return seq

    # -- notifications ---------------------------------------------------------------

    def _notify(self, d: Delivery) -> bool:
        topic = d.message.topic
        matched = [o for o in self.observations.values() if topic_matches(o.filter, topic)]
        if not matched or self.state is not State.OPEN:
            self._discard(d.packet_id)
            return False
        packet_id = d.packet_id
        for obs in matched:
            con = d.qos > 0 or self._probe
            self._probe = False
            mid = self._mid()
            body = d.message.payload
            obs.last = body
            size = 1 << (obs.szx + 4)
            note = make(CON if con else NON, Code.CONTENT, mid, obs.token,
                        body if len(body) <= size else body[:size])
            note.opt.observe = self._next_seq()
            if len(body) > size:
                note.opt.block2 = Block(0, True, obs.szx)
                note.opt.size2 = len(body)
            data = encode(note)
            self._out.append(data)
            if con:
                t = self.settings.ack_timeout
                self._outstanding[mid] = _Outstanding(data, obs.filter, packet_id, d.qos, 0, t)
                self._out.append(SetTimer(f"rt:{mid}", t))
                packet_id = None  # one acknowledgement settles the delivery
            else:
                self._non_sent[mid] = obs.filter
                if len(self._non_sent) > self.settings.dedup_size:
                    self._non_sent.popitem(last=False)
        self._discard(packet_id)
        return True
