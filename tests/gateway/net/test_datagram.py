"""The datagram shell on real UDP sockets (127.0.0.1 only), with a toy channel and with
the MQTT-SN channel and our MQTT-SN client. Every wait is on a future with a timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import pytest

from gateway.core.clock import LoopScheduler
from gateway.core.node import CoreSettings, Node
from gateway.net.datagram import DatagramPeer, start_datagram_listener
from gateway.net.stream import ListenerLimits
from protocols.context import Delivery
from protocols.effects import Close, Effect, SetTimer
from protocols.mqttsn.channel import MqttSnChannel, MqttSnSettings
from protocols.mqttsn.client import MqttSnClient

TIMEOUT = 5.0


class Toy:
    """Echoes in upper case; "close" closes; "timer" answers "fired" 10 ms later;
    "boom" raises."""

    instances: ClassVar[list[Toy]] = []

    def __init__(self, peer: DatagramPeer, addr: tuple[str, int]) -> None:
        self.peer = peer
        self.addr = addr
        self.lost = 0
        Toy.instances.append(self)

    def connection_made(self) -> list[Effect]:
        return [b"hello"]

    def handle_datagram(self, data: bytes) -> list[Effect]:
        if data == b"close":
            return [b"bye", Close("asked")]
        if data == b"timer":
            return [SetTimer("t", 0.01)]
        if data == b"boom":
            raise RuntimeError("boom")
        return [data.upper()]

    def on_timer(self, name: str) -> list[Effect]:
        return [b"fired"]

    def connection_lost(self) -> None:
        self.lost += 1

    def deliver(self, deliveries: list[Delivery]) -> list[Effect]:
        return []

    def release(self, packet_id: int) -> list[Effect]:
        return []

    def kick(self, reason_code: int) -> list[Effect]:
        return [Close("kicked")]


class UdpClient(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.queue.put_nowait(data)

    async def get(self) -> bytes:
        return await asyncio.wait_for(self.queue.get(), TIMEOUT)


async def udp_client(port: int) -> tuple[asyncio.DatagramTransport, UdpClient]:
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_datagram_endpoint(
        UdpClient, remote_addr=("127.0.0.1", port)
    )
    return transport, proto


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 30))


def test_peers_effects_close_and_limits() -> None:
    async def main() -> None:
        Toy.instances.clear()
        limits = ListenerLimits("udp:test", max_connections=2, deny=["127.0.0.99/32"])
        shell = await start_datagram_listener("127.0.0.1:0", limits, Toy)
        assert shell.transport is not None
        port = shell.transport.get_extra_info("sockname")[1]
        t1, c1 = await udp_client(port)
        t1.sendto(b"abc")
        assert await c1.get() == b"hello"
        assert await c1.get() == b"ABC"
        t1.sendto(b"timer")
        assert await c1.get() == b"fired"
        t2, c2 = await udp_client(port)
        t2.sendto(b"x")
        assert await c2.get() == b"hello" and await c2.get() == b"X"
        assert len(shell.peers) == 2 and limits.current == 2
        t3, c3 = await udp_client(port)  # a third peer: over max_connections
        t3.sendto(b"y")
        t1.sendto(b"close")
        assert await c1.get() == b"bye"
        assert len(shell.peers) == 1 and Toy.instances[0].lost == 1
        assert limits.refused == 1 and c3.queue.empty()
        t3.sendto(b"y")  # room again
        assert await c3.get() == b"hello" and await c3.get() == b"Y"
        t3.sendto(b"close")
        assert await c3.get() == b"bye"
        t1.sendto(b"again")  # a closed peer starts afresh
        assert await c1.get() == b"hello"
        # a channel that raises loses its peer, not the listener
        t2.sendto(b"boom")
        t2.sendto(b"z")
        assert await c2.get() == b"hello" and await c2.get() == b"Z"
        shell.close()
        assert all(toy.lost == 1 for toy in Toy.instances)
        for t in (t1, t2, t3):
            t.close()

    run(main)


def test_mqttsn_channel_on_the_shell() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        node = Node(CoreSettings(), LoopScheduler(loop))
        settings = MqttSnSettings(predefined={5: "pre/five"})

        def factory(peer: DatagramPeer, addr: tuple[str, int]) -> MqttSnChannel:
            return MqttSnChannel(node, settings, peer, peer=addr, monotonic=loop.time)

        shell = await start_datagram_listener("127.0.0.1:0", ListenerLimits("udp"), factory)
        assert shell.transport is not None
        port = shell.transport.get_extra_info("sockname")[1]
        sub = MqttSnClient("127.0.0.1", port, "sub", predefined={5: "pre/five"})
        pub = MqttSnClient("127.0.0.1", port, "pub")
        await sub.start()
        await pub.start()
        assert (await sub.search_gateway()).gw_id == 1
        await sub.connect()
        await pub.connect()
        await sub.subscribe("a/#", qos=2)
        await sub.subscribe(5, qos=1)
        for qos in (0, 1, 2):
            await pub.publish("a/b", b"q%d" % qos, qos)
            got = await sub.next_message()
            assert (got.topic, got.payload, got.qos) == ("a/b", b"q%d" % qos, qos)
        await pub.publish(5, b"pre", qos=-1)
        got = await sub.next_message()
        assert (got.topic, got.payload) == ("pre/five", b"pre")
        await sub.sleep(30)
        await pub.publish("a/c", b"zz", 1)
        woke = await sub.wake()
        assert [(m.topic, m.payload) for m in woke] == [("a/c", b"zz")]
        await pub.disconnect()
        await sub.disconnect()
        assert not shell.peers
        shell.close()
        sub.close()
        pub.close()

    run(main)


@pytest.mark.parametrize("garbage", [b"\x01", b"\xff" * 10, b"\x02\x03"])
def test_garbage_does_not_disturb_a_connected_client(garbage: bytes) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        node = Node(CoreSettings(), LoopScheduler(loop))

        def factory(peer: DatagramPeer, addr: tuple[str, int]) -> MqttSnChannel:
            return MqttSnChannel(node, MqttSnSettings(), peer, peer=addr, monotonic=loop.time)

        shell = await start_datagram_listener("127.0.0.1:0", ListenerLimits("udp"), factory)
        assert shell.transport is not None
        port = shell.transport.get_extra_info("sockname")[1]
        c = MqttSnClient("127.0.0.1", port, "c")
        await c.start()
        await c.connect()
        await c.subscribe("ab", qos=0)
        c.send_raw(garbage)
        t, _ = await udp_client(port)
        t.sendto(garbage)  # another peer's garbage
        await c.publish("ab", b"still fine", 0)
        got = await c.next_message()
        assert got.payload == b"still fine"
        assert node.metrics.get("packets.malformed") == 2
        t.close()
        shell.close()
        c.close()

    run(main)
