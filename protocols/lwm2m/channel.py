"""The LwM2M server channel (EMQX-compatible MQTT mapping), sans-IO.

One channel per peer address, on the datagram shell, speaking CoAP through
:mod:`protocols.coap.codec`. The device is a session of the broker with client id = its
endpoint name, subscribed to ``{mp}dn/#`` (``mountpoint``, default ``lwm2m/{ep}/``).

Registration interface (device -> us):

- ``POST /rd?ep=&lt=&lwm2m=&b=[&Q]`` with the object links -> 2.01, Location-Path
  ``rd/{ep}``; the register event goes to ``{mp}up/resp``.
- ``POST /rd/{ep}?lt=&b=`` (update) -> 2.04; the update event goes to ``{mp}up/update``.
- ``DELETE /rd/{ep}`` -> 2.02; the session ends. No update within the lifetime: it ends too.
- An update reaching a new channel (new address, or gatewayd restarted) resumes the
  registration kept in the :class:`~protocols.lwm2m.registry.Registry` while it lives.
- ``POST /dp`` (1.1 Send, SenML) -> 2.04; the records go to ``{mp}up/send``.
- Request bodies sent with Block1 (large link lists, Send) are reassembled.

Device management (MQTT -> us -> device): a JSON command on ``{mp}dn`` (``reqID``,
``msgType`` read | discover | write | write-attr | execute | create | delete | observe |
cancel-observe, and the 1.1 read-composite | write-composite | observe-composite |
cancel-observe-composite, ``data``) becomes one CoAP request; its answer is published on
``{mp}up/resp`` as ``{"reqID", "msgType", "data": {"reqPath", "code", "codeMsg",
"content"}}`` (keys of the command other than those are echoed); notifications of an
observation go to ``{mp}up/notify`` with ``seqNum``. No answer: ``"code":
"coap_timeout"``. Requests go one at a time (CoAP NSTART = 1), the rest wait in order.

Queue mode (binding with ``Q``): the device listens only for ``qmode_time_window`` after
each message it sends; commands arriving later wait for its next update (or register).
Waiting commands belong to the endpoint's registry entry, not to the channel: a takeover,
a kick or a restart (with the journal) keeps them; a deregistration or lifetime expiry
answers them ``coap_timeout`` and drops them.

Blockwise: Block2 answers and notifications are collected and published whole; Block1
request bodies go in 1024-byte blocks, or smaller ones when the device asks (2.31 or 4.13
with a smaller Block1 size).

Invariants:
- A malformed datagram is counted and answered 4.00 when its header is readable; it
  changes nothing else.
- Every command gets exactly one answer on ``up/resp`` (a response, a CoAP error code,
  ``coap_timeout``, or ``bad_request`` for a command we cannot turn into a request).
"""

from __future__ import annotations

import json
import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

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
)
from protocols.coap.endpoint import CoapEndpoint, query_of
from protocols.context import (
    ClientInfo,
    ConnectionHandle,
    Delivery,
    GatewayContext,
    SubOptions,
)
from protocols.context import Message as BrokerMessage
from protocols.effects import CancelTimer, Close, Effect, SetTimer
from protocols.lwm2m import bootstrap, content
from protocols.lwm2m.objects import ObjectModel
from protocols.lwm2m.registry import Registry
from protocols.lwm2m.requests import (
    BLOCK_SZX,
    COMPOSITE,
    Command,
    build,
    build_composite,
)

log = logging.getLogger("protocols.lwm2m.channel")

MAX_BODY = 4 * 1024 * 1024  # a Block2 answer larger than this is refused (4.08)
BLOCK_SIZE = 1 << (BLOCK_SZX + 4)  # Block1 (1024 bytes) for larger request bodies
MAX_UPLOAD = 64 * 1024  # a request body a device sends with Block1 (links, Send)
MAX_UPLOADS = 4  # Block1 bodies being received from one peer at once (different paths)
DEDUP_SIZE = 64  # requests whose message ids (and answers) are remembered

READS = ("read", "discover", "observe", "read-composite", "observe-composite")
OBSERVES = ("observe", "observe-composite")
_CODE_MSG = {
    "2.01": "created", "2.02": "deleted", "2.03": "valid", "2.04": "changed",
    "2.05": "content", "2.31": "continue", "4.00": "bad_request", "4.01": "unauthorized",
    "4.02": "bad_option", "4.03": "forbidden", "4.04": "not_found",
    "4.05": "method_not_allowed", "4.06": "not_acceptable", "4.08": "request_entity_incomplete",
    "4.12": "precondition_failed", "4.13": "request_entity_too_large",
    "4.15": "unsupported_content_format", "5.00": "internal_server_error",
    "5.01": "not_implemented", "5.03": "service_unavailable",
}


@dataclass(slots=True)
class Lwm2mSettings:
    """One LwM2M gateway's behaviour (``[gateway.lwm2m]``)."""

    mountpoint: str = "lwm2m/{ep}/"
    listener: str = "lwm2m:udp:default"
    lifetime_min: float = 1.0
    lifetime_max: float = 86400.0
    qmode_time_window: float = 22.0
    ack_timeout: float = 2.0
    max_retransmit: int = 4
    response_timeout: float = 60.0  # after an empty ACK, for the separate response
    idle_timeout: float = 30.0  # a peer that does not register
    max_queue: int = 1000
    publish_qos: int = 0
    model: ObjectModel = field(default_factory=ObjectModel.shipped)
    # shared by every channel of the node (and journaled when durability is on)
    registry: Registry = field(default_factory=Registry)
    # the bootstrap server (POST /bs): endpoint name or "*" -> what the device is told
    bootstrap: dict[str, bootstrap.BootstrapPlan] = field(default_factory=dict)


class State(Enum):
    NEW = "new"
    AUTHENTICATING = "authenticating"
    BOOTSTRAPPING = "bootstrapping"
    REGISTERED = "registered"
    CLOSED = "closed"


@dataclass(slots=True)
class _Outstanding:
    command: Command
    data: bytes
    mid: int
    token: bytes
    attempts: int = 0
    timeout: float = 2.0
    acked: bool = False


def _code(code: Any) -> str:
    c = int(code)
    return f"{c >> 5}.{c & 0x1F:02d}"


def _block2_request(first: Message, mid: int, number: int, szx: int) -> Message:
    """The request for block ``number`` of the answer to ``first``: the same method, path,
    Accept and (for a FETCH) body and content format, a new token, Block2 set."""
    fetch = first.code == Code.FETCH  # the same FETCH body asks for the next block
    req = make(CON, Code.FETCH if fetch else Code.GET, mid, secrets.token_bytes(4),
               first.payload if fetch else b"")
    req.opt.uri_path = first.opt.uri_path
    if fetch and first.opt.content_format is not None:
        req.opt.content_format = first.opt.content_format
    if first.opt.accept is not None:
        req.opt.accept = first.opt.accept
    req.opt.block2 = Block(number, False, szx)
    return req


class Lwm2mChannel(CoapEndpoint):
    LABEL = "lwm2m"
    CLOSED = State.CLOSED
    AUTHENTICATING = State.AUTHENTICATING

    def __init__(
        self,
        context: GatewayContext,
        settings: Lwm2mSettings,
        handle: ConnectionHandle,
        *,
        peer: tuple[str, int] | None = None,
        monotonic: Callable[[], float],
    ) -> None:
        super().__init__(context, handle, peer, monotonic, dedup_size=DEDUP_SIZE)
        self.settings = settings
        self.state: State = State.NEW
        self.ep = ""
        self.mount = ""
        self.lifetime = 86400.0
        self.binding = "U"
        self.version = "1.0"
        self.objects: list[str] = []
        self.alternate = "/"
        self.queue_mode = False
        self.pending: deque[Command] = deque()
        self.current: _Outstanding | None = None
        self.observations: dict[bytes, Command] = {}  # token -> the observe command
        self._waiting: Message | None = None
        self._resumed = False
        self._bootstrap_failed = False
        self._uploads: dict[tuple[str, ...], bytearray] = {}  # Block1 bodies coming in
        self.root_formats: list[int] = []  # ct of the root link (1.1): formats it reads

    # -- entry points from the shell ---------------------------------------------------

    def connection_made(self) -> list[Effect]:
        self.last_rx = self._monotonic()
        return [SetTimer("idle", self.settings.idle_timeout)]

    def on_timer(self, name: str) -> list[Effect]:
        if self.state is State.CLOSED:
            return []
        outer = self._enter()
        if name == "idle" and self.state is not State.REGISTERED:
            self._close("did not register")
        elif name == "lifetime" and self.state is State.REGISTERED:
            log.info("%s: lifetime expired", self._who())
            self._close("lifetime expired", forget=True)
        elif name == "retry":
            self._retransmit()
        elif name == "response":
            cur = self.current
            if cur is not None and cur.acked:
                self.current = None
                self._answer(cur.command, {"code": "coap_timeout", "codeMsg": "coap_timeout"})
                self._pump()
        return self._leave(outer)

    def connection_lost(self) -> None:
        self.state = State.CLOSED
        self._notify_core_closed()

    def deliver(self, deliveries: list[Delivery]) -> list[Effect]:
        outer = self._enter()
        for d in deliveries:
            if d.packet_id is not None and self.session is not None:
                self.session.puback(d.packet_id)  # taken over by the channel's queue
            if self.state is State.REGISTERED:
                self._command(d.message.payload)
        if self.state is State.REGISTERED:
            self._pump()
        return self._leave(outer)

    # -- plumbing (the rest is in CoapEndpoint and ChannelBase) ------------------------

    def _who(self) -> str:
        return f"lwm2m endpoint {self.ep!r}" if self.ep else self._peer_name()

    def _close(self, reason: str, *, forget: bool = False) -> None:
        """End this channel. ``forget``: the registration ends too (deregistration,
        lifetime expiry): waiting commands are answered ``coap_timeout`` and dropped.
        Otherwise (a takeover, a kick, shutdown) they stay in the registry for the
        endpoint's next channel, or the next start of gatewayd."""
        if self.state is State.CLOSED:
            return
        was_registered = self.state is State.REGISTERED
        self.state = State.CLOSED
        if forget and was_registered:
            cur, self.current = self.current, None
            waiting = ([cur.command] if cur is not None else []) + list(self.pending)
            self.pending.clear()
            for c in waiting:
                self._answer(c, {"code": "coap_timeout", "codeMsg": "device gone"})
            self.settings.registry.forget(self.ep)
        self._notify_core_closed()
        self._out.append(Close(reason))
        log.info("%s: closed: %s", self._who(), reason)

    def _malformed(self, exc: RemoteProtocolError) -> None:
        self.context.incr("packets.malformed")
        log.warning("%s: malformed CoAP message: %s", self._who(), exc.reason)
        self._answer_malformed(exc)

    def _respond(self, req: Message, code: int, *, location: tuple[str, ...] = (),
                 block1: Block | None = None) -> None:
        resp = self._reply(req, code)
        if location:
            resp.opt.location_path = location
        self._send_reply(req, resp, block1)

    def _publish(self, suffix: str, body: dict[str, Any]) -> None:
        info = self.info
        if info is None:
            return
        topic = self.mount + suffix
        if not self.context.authorize(info, "publish", topic):
            log.info("%s: not authorized to publish %s", self._who(), topic)
            return
        msg = BrokerMessage(topic, json.dumps(body).encode(), self.settings.publish_qos,
                            publisher=info.client_id, username=info.username,
                            timestamp=self.context.now())
        self.context.publish(info, msg)

    # -- device -> us --------------------------------------------------------------

    def _dispatch(self, msg: Message) -> None:
        if msg.mtype in (ACK, RST) and msg.code == Code.EMPTY:
            self._on_empty_ack(msg.mid, reset=msg.mtype == RST)
            return
        if msg.code == Code.EMPTY:
            if msg.mtype == CON:
                self._out.append(encode(make(RST, Code.EMPTY, msg.mid)))
            return
        if msg.code.is_response():
            self._on_response(msg)
            return
        if not msg.code.is_request():
            return
        if self._repeated(msg.mid):
            return
        path = tuple(msg.opt.uri_path)
        if msg.opt.block1 is not None and not self._reassembled(msg, path):
            return  # answered: 2.31 Continue, or an error
        if path == ("bs",) and msg.code == Code.POST:
            self._bootstrap_request(msg)
            return
        if path == ("dp",) and msg.code == Code.POST:
            self._send_op(msg)
            return
        if not path or path[0] != "rd":
            self._respond(msg, Code.NOT_FOUND)
            return
        if msg.code == Code.POST and len(path) == 1:
            self._register(msg)
        elif len(path) == 2 and self.state is State.REGISTERED and path[1] == self.ep:
            if msg.code == Code.POST:
                self._update(msg)
            elif msg.code == Code.DELETE:
                self._respond(msg, Code.DELETED)
                self._close("deregistered", forget=True)
            else:
                self._respond(msg, Code.METHOD_NOT_ALLOWED)
        elif len(path) == 2 and self.state is State.NEW and msg.code in (Code.POST, Code.DELETE):
            self._known_elsewhere(msg, path[1])
        else:
            self._respond(msg, Code.NOT_FOUND)

    def _reassembled(self, msg: Message, path: tuple[str, ...]) -> bool:
        """A block of a request body sent with Block1 (a register whose links do not fit a
        device's block size, a large Send): True with the whole body in ``msg`` once the
        last block is in, False after answering 2.31 Continue or an error."""
        b1 = msg.opt.block1
        assert b1 is not None
        size = 1 << (b1.size_exponent + 4)
        if b1.block_number == 0:
            self._uploads.pop(path, None)
            while len(self._uploads) >= MAX_UPLOADS:  # one peer's partial bodies are few
                del self._uploads[next(iter(self._uploads))]
            self._uploads[path] = bytearray()
        body = self._uploads.get(path)
        if body is None or b1.block_number * size != len(body):
            self._uploads.pop(path, None)
            self._respond(msg, Code.REQUEST_ENTITY_INCOMPLETE)
            return False
        body += msg.payload
        if len(body) > MAX_UPLOAD:
            self._uploads.pop(path, None)
            self._respond(msg, Code.REQUEST_ENTITY_TOO_LARGE)
            return False
        if b1.more:
            self._respond(msg, Code.CONTINUE, block1=Block(b1.block_number, True,
                                                           b1.size_exponent))
            return False
        del self._uploads[path]
        msg.payload = bytes(body)
        msg.opt.block1 = None
        self._last_block1 = (msg.mid, Block(b1.block_number, False, b1.size_exponent))
        return True

    def _known_elsewhere(self, msg: Message, ep: str) -> None:
        """An update or deregistration of a registration this channel did not see: the
        device's address changed, or gatewayd restarted. Accepted while the registration
        (kept in the registry) lives; 4.04 otherwise, and the device registers again."""
        reg = self.settings.registry.get(ep, self.context.now())
        if reg is None:
            self._respond(msg, Code.NOT_FOUND)
            return
        if msg.code == Code.DELETE:
            n = len(reg.commands)
            self.settings.registry.forget(ep)
            if n:
                log.info("lwm2m endpoint %r deregistered: %d waiting commands dropped", ep, n)
            self._respond(msg, Code.DELETED)
            return
        d = reg.data
        try:
            self.lifetime = float(d.get("lt") or 86400)
        except (TypeError, ValueError):
            self.lifetime = 86400.0
        self.version = str(d.get("lwm2m") or "1.0")
        self.binding = str(d.get("b") or "U")
        self.queue_mode = "Q" in self.binding
        self.objects = [str(o) for o in d.get("objectList") or []]
        self.alternate = str(d.get("alternatePath") or "/")
        self.root_formats = [int(f) for f in d.get("ct") or [] if str(f).isdigit()]
        if not self._apply_update(msg):
            return
        self._start_session(msg, ep, resumed=True)

    def _bootstrap_request(self, msg: Message) -> None:
        """Client-initiated bootstrap (``POST /bs?ep=``): 2.04, then the endpoint's plan
        (Bootstrap-Delete, -Writes, -Finish), one request at a time."""
        ep = query_of(msg).get("ep", "")
        plan = bootstrap.plan_for(self.settings.bootstrap, ep) if ep else None
        if self.state is not State.NEW or plan is None:
            log.info("%s: bootstrap request for %r refused (%s)", self._who(), ep,
                     "no plan for it" if self.state is State.NEW else self.state.value)
            self._respond(msg, Code.BAD_REQUEST)
            return
        try:
            steps = bootstrap.requests(plan, self.settings.model.type_of)
        except (content.ContentError, ValueError) as exc:
            log.error("bootstrap plan for %r cannot be sent: %s", ep, exc)
            self._respond(msg, Code.INTERNAL_SERVER_ERROR)
            return
        self.ep = ep
        self.state = State.BOOTSTRAPPING
        self._bootstrap_failed = False
        self._respond(msg, Code.CHANGED)
        self._out.append(CancelTimer("idle"))
        log.info("%s: bootstrapping (%d operations)", self._who(), len(steps))
        for op, req in steps:
            path = "/" + "/".join(req.opt.uri_path)
            self.pending.append(Command(None, op, path, {}, req))
        self._pump()

    def _bootstrap_step(self, c: Command, result: dict[str, Any]) -> None:
        code = str(result.get("code"))
        if not code.startswith("2."):
            self._bootstrap_failed = True
            log.warning("%s: %s %s: %s", self._who(), c.msg_type, c.path, code)
        if c.msg_type != "bootstrap-finish" and code != "coap_timeout":
            return
        self.pending.clear()
        if self._bootstrap_failed:
            self.context.incr("lwm2m.bootstrap.failed")
        else:
            self.context.incr("lwm2m.bootstrap.finished")
            log.info("%s: bootstrap finished", self._who())
        self.state = State.NEW  # it registers next (perhaps here, from this address)
        self.ep = ""
        self._out.append(SetTimer("idle", self.settings.idle_timeout))

    def _send_op(self, msg: Message) -> None:
        """LwM2M 1.1 Send (``POST /dp``, SenML JSON or CBOR): 2.04 and the decoded
        records on ``up/send``."""
        if self.state is not State.REGISTERED:
            self._respond(msg, Code.NOT_FOUND)  # not registered (yet): nobody to publish as
            return
        fmt = msg.opt.content_format
        if fmt not in (content.SENML_JSON, content.SENML_CBOR):
            self._respond(msg, Code.UNSUPPORTED_CONTENT_FORMAT)
            return
        try:
            entries = content.decode(fmt, bytes(msg.payload), "/", self.settings.model.type_of)
        except content.ContentError as exc:
            self.context.incr("lwm2m.send.malformed")
            log.info("%s: undecodable Send: %s", self._who(), exc)
            self._respond(msg, Code.BAD_REQUEST)
            return
        self._respond(msg, Code.CHANGED)
        self._publish("up/send", {"msgType": "send",
                                  "data": {"reqPath": "/dp", "content": entries}})
        self._pump()  # a queue-mode device listens now

    def _links(self, msg: Message) -> bool:
        try:
            links = content.parse_links(bytes(msg.payload)) if msg.payload else []
        except (content.ContentError, UnicodeDecodeError):
            return False
        objects, alternate, formats = [], "/", []
        for target, attrs in links:
            if attrs.get("rt") == "oma.lwm2m":
                alternate = target
                formats = [int(f) for f in attrs.get("ct", "").split() if f.isdigit()]
                continue
            objects.append(target)
        if msg.payload:
            self.objects, self.alternate, self.root_formats = objects, alternate, formats
        return True

    def _register(self, msg: Message) -> None:
        q = query_of(msg)
        ep = q.get("ep")
        s = self.settings
        try:
            lt = float(q.get("lt") or 86400)
        except ValueError:
            lt = -1
        if not ep or not (s.lifetime_min <= lt <= s.lifetime_max) or not self._links(msg):
            self._respond(msg, Code.BAD_REQUEST)
            return
        if self.state is State.AUTHENTICATING:
            return  # the first REGISTER is being decided
        self.lifetime = lt
        self.version = q.get("lwm2m", "1.0")
        self.binding = q.get("b", "U")
        self.queue_mode = "Q" in self.binding or "Q" in q
        self._start_session(msg, ep, resumed=False)

    def _start_session(self, msg: Message, ep: str, *, resumed: bool) -> None:
        """Authenticate the endpoint and open its broker session (a register, or an
        update ``resumed`` from the registry)."""
        s = self.settings
        if self.state is State.REGISTERED:  # registering again: a new session
            self._notify_core_closed()
            self._core_closed = False
            self.session = None
        self.ep = ep
        self.mount = s.mountpoint.replace("{ep}", ep).replace("%e", ep)
        host, port = self.peer if self.peer else (None, None)
        info = ClientInfo(
            client_id=ep, protocol="lwm2m", proto_ver=1, peer_host=host, peer_port=port,
            listener=s.listener, mountpoint=self.mount, keepalive=int(self.lifetime),
            connected_at=self.context.now(),
        )
        self._waiting = msg
        self._resumed = resumed
        self._start_auth(info, None)

    def _auth_done(self, info: ClientInfo, code: int) -> None:
        msg, self._waiting = self._waiting, None
        assert msg is not None
        if code == 0:
            result = self.context.open_session(
                info, self.handle, clean_start=True, expiry_interval=0, receive_maximum=32,
                will=None, will_delay=0,
            )
            if result.reason_code or result.session is None:
                code = result.reason_code or 0x80
            else:
                self.session = result.session
        self.context.connack(info, code)
        if code:
            log.info("%s refused (0x%02X)", self._who(), code)
            self.state = State.NEW
            self.info = None
            self._respond(msg, Code.FORBIDDEN)
            return
        self.state = State.REGISTERED
        dn = self.mount + "dn/#"
        if self.context.authorize(info, "subscribe", dn):
            self.context.subscribe(info, dn, SubOptions(0))
        if self._resumed:
            self._respond(msg, Code.CHANGED)
        else:
            self._respond(msg, Code.CREATED, location=("rd", self.ep))
        self._out.append(CancelTimer("idle"))
        self._out.append(SetTimer("lifetime", self.lifetime))
        self._save_registration()
        if self._resumed:
            log.info("%s: registration resumed by an update", self._who())
            self._publish("up/update", {"msgType": "update", "data": self._reg_data()})
        else:
            self._publish("up/resp", {"msgType": "register", "data": self._reg_data()})
        assert self.session is not None
        self.session.resume()
        self._load_commands()
        self._pump()

    def _save_registration(self) -> None:
        data = self._reg_data()
        if self.root_formats:
            data["ct"] = self.root_formats
        self.settings.registry.register(self.ep, data, self.context.now() + self.lifetime)

    def _load_commands(self) -> None:
        """The commands waiting for this endpoint (from an earlier channel or an earlier
        run of gatewayd): they go to the device in the order they came."""
        if self.current is not None:
            self._out.append(CancelTimer("retry"))
            self._out.append(CancelTimer("response"))
            self.current = None
        self.pending.clear()
        waiting = self.settings.registry.commands(self.ep)
        for seq, payload in waiting:
            c = self._parse(payload, seq)
            if c is not None:
                self.pending.append(c)
        if waiting:
            log.info("%s: %d waiting commands", self._who(), len(self.pending))

    def _reg_data(self) -> dict[str, Any]:
        return {"ep": self.ep, "lt": int(self.lifetime), "lwm2m": self.version,
                "b": self.binding, "objectList": self.objects,
                "alternatePath": self.alternate}

    def _apply_update(self, msg: Message) -> bool:
        """The parameters of an update (``lt``, ``b``, object links); False, after
        answering 4.00, when one of them is invalid."""
        q = query_of(msg)
        if "lt" in q:
            try:
                lt = float(q["lt"])
            except ValueError:
                lt = -1.0
            if not (self.settings.lifetime_min <= lt <= self.settings.lifetime_max):
                self._respond(msg, Code.BAD_REQUEST)
                return False
            self.lifetime = lt
        if "b" in q:
            self.binding = q["b"]
            self.queue_mode = "Q" in self.binding
        if not self._links(msg):
            self._respond(msg, Code.BAD_REQUEST)
            return False
        return True

    def _update(self, msg: Message) -> None:
        if not self._apply_update(msg):
            return
        self._respond(msg, Code.CHANGED)
        self._out.append(SetTimer("lifetime", self.lifetime))
        self._save_registration()
        self._publish("up/update", {"msgType": "update", "data": self._reg_data()})
        self._pump()

    # -- commands (MQTT -> device) -------------------------------------------------

    def _command(self, payload: bytes) -> None:
        c = self._parse(payload, None)
        if c is None:
            return
        if len(self.pending) >= self.settings.max_queue:
            dropped = self.pending.popleft()
            self.context.incr("lwm2m.queue.dropped")
            log.warning("%s: %d commands waiting (max_queue): the oldest (reqID %r) dropped",
                        self._who(), len(self.pending) + 1, dropped.req_id)
            self._answer(dropped, {"code": "coap_timeout", "codeMsg": "queue full"})
        c.seq = self.settings.registry.queue(self.ep, payload, self.context.now())
        self.pending.append(c)

    def _parse(self, payload: bytes, seq: int | None) -> Command | None:
        """A command from its JSON; None (answered 4.00 when it has a ``reqID`` to answer
        to, or only counted) when it cannot become a request."""
        try:
            cmd = json.loads(payload)
            if not isinstance(cmd, dict):
                raise ValueError
        except ValueError:
            self.context.incr("lwm2m.command.malformed")
            log.info("%s: a command that is not a JSON object", self._who())
            if seq is not None:
                self.settings.registry.done(self.ep, seq)
            return None
        raw_data = cmd.get("data")
        data: dict[str, Any] = raw_data if isinstance(raw_data, dict) else {}
        msg_type = str(cmd.get("msgType", ""))
        path = str(data.get("path") or data.get("basePath") or "")
        echo = {k: v for k, v in cmd.items() if k not in ("reqID", "msgType", "data")}
        c = Command(cmd.get("reqID"), msg_type, path, echo, seq=seq)
        try:
            if msg_type in COMPOSITE:
                c.path = "/"
                c.request = build_composite(self, self.settings.model, c, data)
            else:
                c.request = build(self, self.settings.model, msg_type, path, data)
        except (content.ContentError, ValueError, TypeError, KeyError) as exc:
            self._answer(c, {"code": "4.00", "codeMsg": f"bad_request: {exc}"})
            return None
        return c

    def _awake(self) -> bool:
        if not self.queue_mode:
            return True
        return self._monotonic() - self.last_rx < self.settings.qmode_time_window

    def _pump(self) -> None:
        """Send the next command when none is outstanding and the device listens."""
        if self.current is not None or self.state not in (State.REGISTERED,
                                                          State.BOOTSTRAPPING):
            return
        if not self.pending or not self._awake():
            return
        c = self.pending.popleft()
        req = c.request
        assert req is not None
        if len(req.payload) > BLOCK_SIZE:  # Block1 (RFC 7959): the body goes block by block
            c.upload = bytes(req.payload)
            c.sent, c.szx = 0, BLOCK_SZX
            self._send_block1(c, 0)
            return
        req.mid = self._mid()
        self._send_current(c, req)

    def _send_current(self, c: Command, req: Message) -> None:
        data = encode(req)
        t = self.settings.ack_timeout
        self.current = _Outstanding(c, data, req.mid, req.token, 0, t)
        self._out.append(data)
        self._out.append(SetTimer("retry", t))

    def _send_block1(self, c: Command, num: int) -> None:
        first = c.request
        assert first is not None and c.upload is not None
        size = 1 << (c.szx + 4)
        chunk = c.upload[num * size : (num + 1) * size]
        c.block_start = num * size
        c.sent = num * size + len(chunk)
        more = c.sent < len(c.upload)
        req = make(CON, first.code, self._mid(), first.token, chunk)
        req.opt.uri_path = first.opt.uri_path
        if first.opt.content_format is not None:
            req.opt.content_format = first.opt.content_format
        req.opt.block1 = Block(num, more, c.szx)
        if num == 0:
            req.opt.size1 = len(c.upload)
        self._send_current(c, req)

    def _retransmit(self) -> None:
        cur = self.current
        if cur is None or cur.acked:
            return
        if cur.attempts >= self.settings.max_retransmit:
            self.current = None
            self._answer(cur.command, {"code": "coap_timeout", "codeMsg": "coap_timeout"})
            self._pump()
            return
        cur.attempts += 1
        cur.timeout *= 2
        self._out.append(cur.data)
        self._out.append(SetTimer("retry", cur.timeout))

    def _on_empty_ack(self, mid: int, *, reset: bool) -> None:
        cur = self.current
        if cur is None or cur.mid != mid:
            return
        self._out.append(CancelTimer("retry"))
        if reset:
            self.current = None
            self._answer(cur.command, {"code": "coap_reset", "codeMsg": "reset"})
            self._pump()
            return
        cur.acked = True  # a separate response will follow
        self._out.append(SetTimer("response", self.settings.response_timeout))

    def _on_response(self, msg: Message) -> None:
        if msg.mtype == CON:
            self._out.append(encode(make(ACK, Code.EMPTY, msg.mid)))
        cur = self.current
        if cur is not None and msg.token == cur.token and (
            msg.mtype != ACK or msg.mid == cur.mid
        ):
            self.current = None
            self._out.append(CancelTimer("retry"))
            self._out.append(CancelTimer("response"))
            c = cur.command
            if (c.msg_type in OBSERVES and msg.opt.observe is not None
                    and msg.code.is_successful()):
                self.observations[msg.token] = c
            b1 = msg.opt.block1
            if (msg.code == Code.CONTINUE and c.upload is not None and b1 is not None
                    and c.sent < len(c.upload)):
                # the device may ask for smaller blocks (RFC 7959 2.5): what was sent is
                # kept, the rest goes in its size
                c.szx = min(c.szx, b1.size_exponent)
                self._send_block1(c, c.sent >> (c.szx + 4))
                return
            if (msg.code == Code.REQUEST_ENTITY_TOO_LARGE and b1 is not None
                    and self._smaller_blocks(c, b1)):
                return
            c.upload = None
            if (msg.opt.block2 is not None and msg.code.is_successful()
                    and not self._block2(c, msg)):
                return  # the next block is on its way
            if c.notify_of is not None:
                self._notify(c.notify_of, msg, c.seq_num)
            else:
                self._answer(c, self._result(c, msg))
            self._pump()
            return
        obs = self.observations.get(msg.token)
        if obs is not None:
            b2 = msg.opt.block2
            if b2 is not None and b2.more and b2.block_number == 0 and msg.code.is_successful():
                self._fetch_rest(obs, msg)
            else:
                self._notify(obs, msg, msg.opt.observe)
            return
        if msg.mtype == CON:
            return  # acknowledged; nobody asked for it
        if msg.mtype == NON:
            self._out.append(encode(make(RST, Code.EMPTY, msg.mid)))

    def _smaller_blocks(self, c: Command, b1: Block) -> bool:
        """A 4.13 with Block1 (RFC 7959 2.9.3): the device takes blocks of that size only.
        The rejected block (or the whole body, sent without Block1) goes again in that
        size; False when it is not smaller than what was refused."""
        req = c.request
        szx = b1.size_exponent
        if req is None or szx >= 7:
            return False
        if c.upload is None:
            if len(req.payload) <= 1 << (szx + 4):
                return False
            c.upload = bytes(req.payload)
            c.szx = szx
            self._send_block1(c, 0)
            return True
        if szx >= c.szx:
            return False
        c.szx = szx
        self._send_block1(c, c.block_start >> (szx + 4))
        return True

    def _notify(self, obs: Command, msg: Message, seq_num: int | None) -> None:
        data: dict[str, Any] = {"reqPath": obs.path}
        if obs.paths is not None:
            data["paths"] = obs.paths
        data.update(self._result(obs, msg))
        body = {"reqID": obs.req_id, "msgType": "notify", "seqNum": seq_num, "data": data}
        body.update(obs.echo)
        self._publish("up/notify", body)

    def _fetch_rest(self, obs: Command, msg: Message) -> None:
        """A notification larger than a block (its first block, with Block2): ask for the
        other blocks (GET, or the FETCH of a composite observation, without Observe) and
        publish the whole body once the last arrives. The request goes before the waiting
        commands (the device listens now)."""
        first = obs.request
        b2 = msg.opt.block2
        assert first is not None and b2 is not None
        req = _block2_request(first, 0, 1, b2.size_exponent)
        c = Command(obs.req_id, "notify", obs.path, obs.echo, req, paths=obs.paths,
                    partial=bytearray(msg.payload), notify_of=obs, seq_num=msg.opt.observe)
        self.pending.appendleft(c)
        self._pump()

    def _block2(self, c: Command, msg: Message) -> bool:
        """A block of a larger answer (RFC 7959): keep it and ask for the next one (False),
        or, with the last block, put the whole body in ``msg`` (True)."""
        b2 = msg.opt.block2
        size = 1 << (b2.size_exponent + 4)
        partial = c.partial if c.partial is not None else bytearray()
        if b2.block_number * size != len(partial) or len(partial) > MAX_BODY:
            c.partial = None
            msg.payload = b""
            msg.code = Code.REQUEST_ENTITY_INCOMPLETE
            return True
        partial += msg.payload
        if not b2.more:
            c.partial = None
            msg.payload = bytes(partial)
            return True
        c.partial = partial
        first = c.request
        assert first is not None
        nxt = _block2_request(first, self._mid(), b2.block_number + 1, b2.size_exponent)
        data = encode(nxt)
        t = self.settings.ack_timeout
        self.current = _Outstanding(c, data, nxt.mid, nxt.token, 0, t)
        self._out.append(data)
        self._out.append(SetTimer("retry", t))
        return False

    def _result(self, c: Command, msg: Message) -> dict[str, Any]:
        code = _code(msg.code)
        out: dict[str, Any] = {"code": code, "codeMsg": _CODE_MSG.get(code, "")}
        if msg.code.is_successful() and c.msg_type in READS:
            try:
                out["content"] = content.decode(
                    msg.opt.content_format, bytes(msg.payload), c.path,
                    self.settings.model.type_of,
                )
            except content.ContentError as exc:
                out["codeMsg"] = f"undecodable content: {exc}"
                out["content"] = []
        return out

    def _answer(self, c: Command, result: dict[str, Any]) -> None:
        if c.msg_type.startswith("bootstrap-"):
            self._bootstrap_step(c, result)
            return
        if c.seq is not None:
            self.settings.registry.done(self.ep, c.seq)
            c.seq = None
        data: dict[str, Any] = {"reqPath": c.path}
        if c.paths is not None:
            data["paths"] = c.paths
        data.update(result)
        if c.notify_of is not None:  # the rest of a notification could not be fetched
            note = {"reqID": c.req_id, "msgType": "notify", "seqNum": c.seq_num, "data": data}
            note.update(c.echo)
            self._publish("up/notify", note)
            return
        body: dict[str, Any] = {"reqID": c.req_id, "msgType": c.msg_type, "data": data}
        body.update(c.echo)
        self._publish("up/resp", body)
