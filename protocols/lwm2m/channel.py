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

Device management (MQTT -> us -> device; the half in :mod:`protocols.lwm2m.exchange`,
a base class of this channel): a JSON command on ``{mp}dn`` (``reqID``,
``msgType`` read | discover | write | write-attr | execute | create | delete | observe |
cancel-observe, and the 1.1 read-composite | write-composite | observe-composite |
cancel-observe-composite, ``data``) becomes one CoAP request; its answer is published on
``{mp}up/resp`` as ``{"reqID", "msgType", "data": {"reqPath", "code", "codeMsg",
"content"}}`` (keys of the command other than those are echoed; reads ask for a content
format negotiated per device, :mod:`protocols.lwm2m.formats`); notifications of an
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

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from protocols.coap.codec import (
    ACK,
    CON,
    RST,
    Block,
    Code,
    Message,
    RemoteProtocolError,
    encode,
    make,
)
from protocols.coap.endpoint import query_of
from protocols.context import (
    ClientInfo,
    ConnectionHandle,
    Delivery,
    GatewayContext,
    SubOptions,
)
from protocols.effects import CancelTimer, Close, Effect, SetTimer
from protocols.lwm2m import bootstrap, content
from protocols.lwm2m.exchange import Exchange, Lwm2mSettings, State, _Outstanding
from protocols.lwm2m.requests import Command

__all__ = ["Lwm2mChannel", "Lwm2mSettings", "State"]

log = logging.getLogger("protocols.lwm2m.channel")

MAX_UPLOAD = 64 * 1024  # a request body a device sends with Block1 (links, Send)
MAX_UPLOADS = 4  # Block1 bodies being received from one peer at once (different paths)
DEDUP_SIZE = 64  # requests whose message ids (and answers) are remembered


class Lwm2mChannel(Exchange):
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
        self.read_format: int | None = None  # the format a fallback found it answers in
        self.composite: bool | None = None  # False: no composite operations (path by path)

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
            self._close("lifetime expired", forget=True, event="lifetime_expired")
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
        self._set_reason("closed")
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

    def _kicked(self, reason_code: int) -> None:
        event = "takeover" if reason_code == 0x8E else "kicked"
        self._close(f"{event} (0x{reason_code:02X})", event=event)

    def _close(self, reason: str, *, forget: bool = False, event: str = "") -> None:
        """End this channel. ``forget``: the registration ends too (deregistration,
        lifetime expiry): waiting commands are answered ``coap_timeout`` and dropped.
        Otherwise (a takeover, a kick, shutdown) they stay in the registry for the
        endpoint's next channel, or the next start of gatewayd. ``event``: the reason
        the core is told (deregistered, lifetime_expired, kicked, takeover)."""
        if self.state is State.CLOSED:
            return
        self._set_reason(event)
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
                self._close("deregistered", forget=True, event="deregistered")
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
        self.read_format, self.composite = None, None  # learned anew
        self.version = q.get("lwm2m", "1.0")
        self.binding = q.get("b", "U")
        self.queue_mode = "Q" in self.binding or "Q" in q
        self._start_session(msg, ep, resumed=False)

    def _start_session(self, msg: Message, ep: str, *, resumed: bool) -> None:
        """Authenticate the endpoint and open its broker session (a register, or an
        update ``resumed`` from the registry)."""
        s = self.settings
        if self.state is State.REGISTERED:  # registering again: a new session
            self._set_reason("reregistered")
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

        def decided(allowed: bool) -> None:
            if allowed and self.info is info and self.session is not None:
                self.context.subscribe(info, dn, SubOptions(0))

        self._authorize(info, "subscribe", dn, decided)
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
            log.info("%s registered from %s: lwm2m %s, lifetime %ds, binding %s, %d objects%s",
                     self._who(), self._peer_name().split()[-1], self.version,
                     int(self.lifetime), self.binding, len(self.objects),
                     f", formats {' '.join(map(str, self.root_formats))}"
                     if self.root_formats else "")
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
