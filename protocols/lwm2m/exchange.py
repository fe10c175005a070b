"""Requests to an LwM2M device and their answers (the server side of a channel), sans-IO.

:class:`Exchange` is the half of :class:`~protocols.lwm2m.channel.Lwm2mChannel` that talks
to the device's own CoAP server: commands from ``{mp}dn`` parsed into requests
(:mod:`protocols.lwm2m.requests`), queued, sent one at a time (CoAP NSTART = 1) while the
device listens, retransmitted, their separate responses awaited, Block1 bodies sent and
Block2 answers collected, and each answer published on ``{mp}up/resp`` (notifications of
an observation on ``{mp}up/notify``).

Content format of reads (:mod:`protocols.lwm2m.formats`): a read, observe or composite
operation asks for the format chosen for the device (its registration's LwM2M version and
root-link ``ct``, or the command's ``accept``); a 4.06 or 5.00 answer to that choice is
retried once in the next candidate format before it is published (not when the command
named its ``accept``), and a format that worked is kept for the device's later reads.

Invariants:
- At most one request is outstanding (``current``); the rest wait in ``pending`` in order.
- Every command gets exactly one answer on ``up/resp`` (a response, a CoAP error code,
  ``coap_timeout``, or ``4.00 bad_request`` for a command we cannot turn into a request),
  whatever retries, fallbacks and blocks happened on the way.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections import deque
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
    encode,
    make,
)
from protocols.coap.endpoint import CoapEndpoint
from protocols.context import Message as BrokerMessage
from protocols.effects import CancelTimer, SetTimer
from protocols.lwm2m import bootstrap, composite, content, formats
from protocols.lwm2m.objects import ObjectModel
from protocols.lwm2m.registry import Registry
from protocols.lwm2m.requests import (
    BLOCK_SZX,
    COMPOSITE,
    Command,
    build,
    build_composite,
    with_format,
)

log = logging.getLogger("protocols.lwm2m.channel")

MAX_BODY = 4 * 1024 * 1024  # a Block2 answer larger than this is refused (4.08)
BLOCK_SIZE = 1 << (BLOCK_SZX + 4)  # Block1 (1024 bytes) for larger request bodies

READS = ("read", "discover", "observe", "cancel-observe", "read-composite",
         "observe-composite", "cancel-observe-composite")  # answers carry "content"
OBSERVES = ("observe", "observe-composite")
FALLBACK_CODES = (Code.NOT_ACCEPTABLE, Code.INTERNAL_SERVER_ERROR)  # asked in the next format
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


class Exchange(CoapEndpoint):
    """Commands to the device and their answers (see the module docstring). The channel
    subclass provides the registration side: ``state``, ``ep``, ``mount`` and what a
    bootstrap step does."""

    settings: Lwm2mSettings
    state: State
    ep: str
    mount: str
    queue_mode: bool
    pending: deque[Command]
    current: _Outstanding | None
    observations: dict[bytes, Command]
    alternate: str
    version: str
    root_formats: list[int]
    read_format: int | None
    composite: bool | None  # False: it does not do composite operations (path by path)

    def _bootstrap_step(self, c: Command, result: dict[str, Any]) -> None:  # pragma: no cover
        raise NotImplementedError

    def _publish(self, suffix: str, body: dict[str, Any]) -> None:
        info = self.info
        if info is None:
            return
        topic = self.mount + suffix
        payload = json.dumps(body).encode()  # (now: ``body`` may change meanwhile)

        def decided(allowed: bool) -> None:
            if not allowed:
                log.info("%s: not authorized to publish %s", self._who(), topic)
                return
            msg = BrokerMessage(topic, payload, self.settings.publish_qos,
                                publisher=info.client_id, username=info.username,
                                timestamp=self.context.now())
            self.context.publish(info, msg)

        self._authorize(info, "publish", topic, decided)

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
                c.request = build(self, self.settings.model, msg_type, path, data, c)
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
        if (c.msg_type in composite.EMULATED and self.composite is False
                and c.parts_left is None):
            self._split(c)
            self._pump()
            return
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
            if msg.code in FALLBACK_CODES and c.fallback and c.partial is None:
                self._fall_back(c, msg)
                return
            if c.fell_back and msg.code.is_successful() and c.request is not None:
                self.read_format = c.request.opt.accept  # ask in it first from now on
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

    def _fall_back(self, c: Command, msg: Message) -> None:
        """A 4.06 or 5.00 to a read in a format the device was expected to take: the
        same request once more, in the next candidate format."""
        first = c.request
        fmt = c.fallback.pop(0)
        log.info("%s: %s %s answered %s in %s: asking in %s", self._who(), c.msg_type,
                 c.path, _code(msg.code), formats.name_of(first.opt.accept if first else None),
                 formats.name_of(fmt))
        self.context.incr("lwm2m.format.fallback")
        req = with_format(c, fmt)
        req.mid = self._mid()
        self._send_current(c, req)

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

    def _split(self, c: Command) -> bool:
        """Carry out composite command ``c`` path by path (:mod:`.composite`): its parts
        go before the waiting commands; False when it cannot be split."""
        try:
            subs = composite.parts(self, self.settings.model, c)
        except (content.ContentError, ValueError, TypeError) as exc:
            log.info("%s: %s cannot go path by path: %s", self._who(), c.msg_type, exc)
            c.parts_left = None
            return False
        if not subs:
            c.parts_left = None
            return False
        self.pending.extendleft(reversed(subs))
        return True

    def _answer(self, c: Command, result: dict[str, Any]) -> None:
        if c.msg_type.startswith("bootstrap-"):
            self._bootstrap_step(c, result)
            return
        if c.part_of is not None:  # a part of a composite operation carried out by path
            parent, whole = composite.gather(c, result)
            if whole is not None:
                self._answer(parent, whole)
            return
        if composite.not_done(c, result) and self.state is State.REGISTERED:
            if self.composite is not False:
                log.info("%s: %s answered %s: no composite operations, going path by path",
                         self._who(), c.msg_type, result.get("code"))
            self.composite = False
            if self._split(c):
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
