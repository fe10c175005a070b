"""MQTT-SN 1.2 devices over UDP: the project's own client (protocols/mqttsn/client.py).

A device connects (clean or persistent session), registers its telemetry topic and, with
``subscriptions``, subscribes to its command topic. A PUBLISH at QoS 1/2 is ``acked`` when
its PUBACK / PUBCOMP arrives; a request that times out (the client retransmits first)
marks the device down, and it reconnects with a fresh socket after a short pause.
"""

from __future__ import annotations

import asyncio
import random

from hil.scenario import Group
from hil.simulators.base import Ctx, Fleet, payload
from protocols.mqttsn.client import MqttSnClient


class MqttSnFleet(Fleet):
    def __init__(self, ctx: Ctx, group: Group) -> None:
        super().__init__(ctx, group)
        self.clients: dict[int, MqttSnClient] = {}
        self.locks: dict[int, asyncio.Lock] = {}

    async def start_device(self, idx: int) -> None:
        self.locks[idx] = asyncio.Lock()
        self.tasks.append(self.ctx.loop.create_task(self._keep_connected(idx)))

    async def _connect(self, idx: int) -> None:
        g, ctx = self.group, self.ctx
        old = self.clients.pop(idx, None)
        if old is not None:
            old.close()
        c = MqttSnClient(ctx.ep.device_host, ctx.ep.ports["mqttsn"],
                         ctx.client_id(g.name, idx), timeout=2.0, retries=2)
        await c.start()
        self.clients[idx] = c
        await c.connect(duration=int(g.keepalive), clean_session=not self.persistent)
        await c.register(ctx.tele_topic(g.name, idx))
        if g.subscriptions is not None:
            await c.subscribe(ctx.cmd_topic(ctx.client_id(g.name, idx)), g.subscriptions.qos)
        self.ctx.loop.create_task(self._drain(idx, c))
        self.up(idx)

    async def _drain(self, idx: int, c: MqttSnClient) -> None:
        while self.clients.get(idx) is c:
            msg = await c.messages.get()
            self.received(msg.payload, idx)

    async def _keep_connected(self, idx: int) -> None:
        while not self.closed:
            if idx not in self.connected:
                try:
                    async with self.locks[idx]:
                        await self._connect(idx)
                except Exception as e:
                    self.down(idx, f"connect: {e!r}")
                    await asyncio.sleep(0.5 + random.random())
                    continue
            # keepalive: a PINGREQ within the duration; a timeout marks the device down
            await asyncio.sleep(self.group.keepalive / 2)
            c = self.clients.get(idx)
            if c is not None and idx in self.connected:
                try:
                    async with self.locks[idx]:
                        await c.ping()
                except Exception as e:
                    self.down(idx, f"ping: {e!r}")

    async def publish_once(self, idx: int, mid: str) -> None:
        c = self.clients.get(idx)
        if c is None or idx not in self.connected:
            return
        q = self.group.qos
        self.sent(mid, idx, q)
        async with self.locks[idx]:
            await c.publish(self.ctx.tele_topic(self.group.name, idx),
                            payload(mid, self.group.payload), q)
        if q:
            self.acked(mid)

    async def stop(self) -> None:
        await super().stop()
        for c in self.clients.values():
            c.close()
