"""Our own MQTT-SN 1.2 client: the codec in client role over asyncio UDP.

For tests and the HIL rig's device simulators. It speaks the whole client side: SEARCHGW,
CONNECT with the will dialogue, REGISTER/REGACK both ways, predefined and short topic
ids, QoS -1 without a connection, QoS 0/1/2 with retransmission (DUP), SUBSCRIBE by name,
id or short name, sleep (DISCONNECT with a duration) and wake-up (PINGREQ with the client
id), WILLTOPICUPD/WILLMSGUPD.

Every wait has a timeout (``timeout`` per attempt, ``retries`` attempts); a request that
gets no answer raises :class:`TimeoutError`. Received application messages land in
``messages`` (an ``asyncio.Queue`` of :class:`Received`) with their topic name resolved.
This module is the only part of ``protocols.mqttsn`` that does I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from protocols.mqttsn.codec import Codec, RemoteProtocolError, Role
from protocols.mqttsn.packets import (
    NORMAL,
    PREDEFINED,
    SHORT,
    Advertise,
    ConnAck,
    Connect,
    Disconnect,
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


def _topic_id_type(topic: str | int, topic_id_type: int | None) -> int:
    """A predefined id (``int``), or a name: as ``topic_id_type`` says, else a two-byte
    name as a short name and any other as a normal one."""
    if isinstance(topic, int):
        return PREDEFINED
    if topic_id_type is not None:
        return topic_id_type
    return SHORT if len(topic.encode()) == 2 else NORMAL


class Refused(Exception):
    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} refused with return code 0x{code:02X}")
        self.code = code


@dataclass(frozen=True, slots=True)
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    topic_id_type: int


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, client: MqttSnClient) -> None:
        self.client = client

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.client._received(data, addr)


class MqttSnClient:
    def __init__(
        self,
        host: str,
        port: int,
        client_id: str = "",
        *,
        timeout: float = 5.0,
        retries: int = 3,
        predefined: dict[int, str] | None = None,
        auto_ack: bool = True,
    ) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.timeout = timeout
        self.retries = retries
        self.predefined = dict(predefined or {})
        self.auto_ack = auto_ack
        self.codec = Codec(Role.CLIENT)
        self.transport: asyncio.DatagramTransport | None = None
        self.messages: asyncio.Queue[Received] = asyncio.Queue()
        self.topic_ids: dict[str, int] = {}
        self.id_topics: dict[int, str] = {}
        self.received: list[Packet] = []  # every message from the gateway, in order
        self.gateways: list[tuple[Packet, Any]] = []  # ADVERTISE / GWINFO heard
        self._waiters: list[tuple[Callable[[Packet], bool], asyncio.Future[Packet]]] = []
        self._next_msg_id = 1
        self._qos2_in: set[int] = set()

    # -- life cycle ----------------------------------------------------------------

    async def start(
        self, *, local_addr: tuple[str, int] | None = None, broadcast: bool = False
    ) -> None:
        loop = asyncio.get_running_loop()
        if broadcast:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _Protocol(self), local_addr=local_addr or ("0.0.0.0", 0),
                allow_broadcast=True,
            )
        else:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _Protocol(self), remote_addr=(self.host, self.port), local_addr=local_addr
            )
        self.transport = transport

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    async def __aenter__(self) -> MqttSnClient:
        if self.transport is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    @property
    def local_address(self) -> tuple[str, int]:
        assert self.transport is not None
        addr = self.transport.get_extra_info("sockname")
        return addr[0], addr[1]

    # -- sending and waiting -------------------------------------------------------

    def send(self, packet: Packet, addr: tuple[str, int] | None = None) -> None:
        self.send_raw(self.codec.encode(packet), addr)

    def send_raw(self, data: bytes, addr: tuple[str, int] | None = None) -> None:
        assert self.transport is not None, "start() first"
        if addr is None and self.transport.get_extra_info("peername") is None:
            addr = (self.host, self.port)
        self.transport.sendto(data, addr)

    def _mid(self) -> int:
        mid = self._next_msg_id
        self._next_msg_id = mid % 0xFFFF + 1
        return mid

    def expect(self, match: Callable[[Packet], bool]) -> asyncio.Future[Packet]:
        fut: asyncio.Future[Packet] = asyncio.get_running_loop().create_future()
        self._waiters.append((match, fut))
        return fut

    async def wait_for(
        self, match: Callable[[Packet], bool], timeout: float | None = None
    ) -> Packet:
        fut = self.expect(match)
        try:
            return await asyncio.wait_for(fut, timeout or self.timeout)
        finally:
            self._waiters = [(m, f) for m, f in self._waiters if f is not fut]

    async def request(
        self, packet: Packet, match: Callable[[Packet], bool], *, retries: int | None = None
    ) -> Packet:
        """Send ``packet`` and wait for the answer ``match`` accepts, retransmitting (with
        DUP where the message has it) after each ``timeout``."""
        attempts = self.retries if retries is None else retries
        for attempt in range(attempts):
            fut = self.expect(match)
            self.send(packet)
            try:
                return await asyncio.wait_for(asyncio.shield(fut), self.timeout)
            except TimeoutError:
                self._waiters = [(m, f) for m, f in self._waiters if f is not fut]
                fut.cancel()
                if attempt == 0 and isinstance(packet, Publish | Subscribe):
                    packet = replace(packet, dup=True)
        raise TimeoutError(f"no answer to {type(packet).__name__} after {attempts} attempts")

    # -- receiving -----------------------------------------------------------------

    def _received(self, data: bytes, addr: Any) -> None:
        try:
            packet = self.codec.decode(data)
        except RemoteProtocolError:
            return
        self.received.append(packet)
        if isinstance(packet, Advertise | GwInfo):
            self.gateways.append((packet, addr))
        elif isinstance(packet, Publish):
            self._on_publish(packet)
        elif isinstance(packet, Register):
            self._known(packet.topic_name, packet.topic_id)
            if self.auto_ack:
                self.send(RegAck(packet.topic_id, packet.msg_id, ReturnCode.ACCEPTED))
        elif isinstance(packet, PubRel):
            self._qos2_in.discard(packet.msg_id)
            if self.auto_ack:
                self.send(PubComp(packet.msg_id))
        for match, fut in list(self._waiters):
            if not fut.done() and match(packet):
                fut.set_result(packet)
                self._waiters.remove((match, fut))
                break

    def _resolve(self, p: Publish) -> str | None:
        if p.topic_id_type == SHORT:
            return str(p.topic)
        if p.topic_id_type == PREDEFINED:
            return self.predefined.get(int(p.topic))
        return self.id_topics.get(int(p.topic))

    def _on_publish(self, p: Publish) -> None:
        topic = self._resolve(p)
        tid = int.from_bytes(str(p.topic).encode(), "big") if isinstance(p.topic, str) else p.topic
        if topic is None:
            self.send(PubAck(tid, p.msg_id, ReturnCode.INVALID_TOPIC_ID))
            return
        duplicate = p.qos == 2 and p.msg_id in self._qos2_in
        if not duplicate:
            self.messages.put_nowait(
                Received(topic, p.data, p.qos, p.retain, p.dup, p.topic_id_type)
            )
        if not self.auto_ack:
            return
        if p.qos == 1:
            self.send(PubAck(tid, p.msg_id, ReturnCode.ACCEPTED))
        elif p.qos == 2:
            self._qos2_in.add(p.msg_id)
            self.send(PubRec(p.msg_id))

    async def next_message(self, timeout: float | None = None) -> Received:
        return await asyncio.wait_for(self.messages.get(), timeout or self.timeout)

    def _known(self, topic: str, tid: int) -> None:
        self.topic_ids[topic] = tid
        self.id_topics[tid] = topic

    # -- the protocol --------------------------------------------------------------

    async def connect(
        self,
        *,
        duration: int = 60,
        clean_session: bool = True,
        will: tuple[str, bytes, int, bool] | None = None,
    ) -> None:
        """CONNECT (with the will dialogue when ``will`` = (topic, payload, qos, retain))."""
        c = Connect(self.client_id, duration, clean_session, will is not None)
        if will is None:
            ack = await self.request(c, lambda p: isinstance(p, ConnAck))
        else:
            await self.request(c, lambda p: isinstance(p, WillTopicReq))
            topic, payload, qos, retain = will
            await self.request(WillTopic(topic, qos, retain), lambda p: isinstance(p, WillMsgReq))
            ack = await self.request(WillMsg(payload), lambda p: isinstance(p, ConnAck))
        assert isinstance(ack, ConnAck)
        if ack.return_code:
            raise Refused("CONNECT", ack.return_code)

    async def register(self, topic: str) -> int:
        mid = self._mid()
        ack = await self.request(
            Register(0, mid, topic), lambda p: isinstance(p, RegAck) and p.msg_id == mid
        )
        assert isinstance(ack, RegAck)
        if ack.return_code:
            raise Refused("REGISTER", ack.return_code)
        self._known(topic, ack.topic_id)
        return ack.topic_id

    async def _topic(self, topic: str | int, topic_id_type: int | None) -> tuple[int, int | str]:
        if isinstance(topic, int):
            return (PREDEFINED if topic_id_type is None else topic_id_type), topic
        if topic_id_type == SHORT or (topic_id_type is None and len(topic.encode()) == 2):
            return SHORT, topic
        tid = self.topic_ids.get(topic)
        if tid is None:
            tid = await self.register(topic)
        return NORMAL, tid

    async def publish(
        self,
        topic: str | int,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        *,
        topic_id_type: int | None = None,
    ) -> None:
        """A ``str`` topic of two bytes goes as a short name, a longer one by registered
        id (REGISTER first if needed); an ``int`` is a predefined id unless
        ``topic_id_type`` says NORMAL."""
        tid_type, field = await self._topic(topic, topic_id_type)
        mid = self._mid() if qos in (1, 2) else 0
        p = Publish(field, payload, qos, mid, retain, False, tid_type)
        if qos in (-1, 0):
            self.send(p)
            return
        if qos == 1:
            ack = await self.request(p, lambda a: isinstance(a, PubAck) and a.msg_id == mid)
            assert isinstance(ack, PubAck)
            if ack.return_code:
                raise Refused("PUBLISH", ack.return_code)
            return
        rec = await self.request(
            p, lambda a: isinstance(a, PubRec | PubAck) and a.msg_id == mid
        )
        if isinstance(rec, PubAck):
            raise Refused("PUBLISH", rec.return_code)
        await self.request(PubRel(mid), lambda a: isinstance(a, PubComp) and a.msg_id == mid)

    async def subscribe(
        self, topic: str | int, qos: int = 0, *, topic_id_type: int | None = None
    ) -> SubAck:
        """By name (``str``; a two-byte name as a short name unless ``topic_id_type``
        is NORMAL) or predefined id (``int``)."""
        tid_type = _topic_id_type(topic, topic_id_type)
        mid = self._mid()
        ack = await self.request(
            Subscribe(mid, topic, qos, False, tid_type),
            lambda a: isinstance(a, SubAck) and a.msg_id == mid,
        )
        assert isinstance(ack, SubAck)
        if ack.return_code:
            raise Refused("SUBSCRIBE", ack.return_code)
        if tid_type == NORMAL and ack.topic_id and isinstance(topic, str):
            self._known(topic, ack.topic_id)
        return ack

    async def unsubscribe(self, topic: str | int, *, topic_id_type: int | None = None) -> None:
        tid_type = _topic_id_type(topic, topic_id_type)
        mid = self._mid()
        await self.request(
            Unsubscribe(mid, topic, tid_type),
            lambda a: isinstance(a, UnsubAck) and a.msg_id == mid,
        )

    async def ping(self) -> None:
        await self.request(PingReq(), lambda p: isinstance(p, PingResp))

    async def sleep(self, duration: int) -> None:
        """DISCONNECT with a duration: the gateway buffers our messages until we wake."""
        await self.request(Disconnect(duration), lambda p: isinstance(p, Disconnect))

    async def wake(self) -> list[Received]:
        """PINGREQ with our client id: the gateway flushes what it buffered, then
        PINGRESP. Returns the messages that arrived meanwhile."""
        await self.request(PingReq(self.client_id), lambda p: isinstance(p, PingResp))
        out = []
        while not self.messages.empty():
            out.append(self.messages.get_nowait())
        return out

    async def disconnect(self) -> None:
        with contextlib.suppress(TimeoutError):
            await self.request(Disconnect(), lambda p: isinstance(p, Disconnect), retries=1)

    async def update_will_topic(self, topic: str = "", qos: int = 0, retain: bool = False) -> int:
        r = await self.request(
            WillTopicUpd(topic, qos, retain), lambda p: isinstance(p, WillTopicResp)
        )
        assert isinstance(r, WillTopicResp)
        return r.return_code

    async def update_will_message(self, payload: bytes) -> int:
        r = await self.request(WillMsgUpd(payload), lambda p: isinstance(p, WillMsgResp))
        assert isinstance(r, WillMsgResp)
        return r.return_code

    async def search_gateway(
        self, radius: int = 0, *, to: tuple[str, int] | None = None
    ) -> GwInfo:
        """SEARCHGW (to ``to``, e.g. a broadcast address, else the gateway) -> GWINFO."""
        fut = self.expect(lambda p: isinstance(p, GwInfo))
        self.send(SearchGw(radius), to)
        got = await asyncio.wait_for(fut, self.timeout)
        assert isinstance(got, GwInfo)
        return got
