"""LwM2M devices: the project's aiocoap LwM2M client (protocols/lwm2m/client.py).

A device registers at ``/rd`` and then answers whatever the gateway asks (reads, observe).
Its telemetry is a change of resource ``/3/0/15`` (a string) to the message id: once the
rig's commander has asked the gateway to observe that resource (on the device's register
event), each change goes out as a notification, which the collector receives on
``lwm2m/<ep>/up/notify``. Notifications have no application acknowledgement, so LwM2M
telemetry is QoS 0 evidence: sent and received, never ``acked``. Registration is
refreshed by an update every ``keepalive``; a failed update or register marks the device
down and it registers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

from hil.scenario import Group
from hil.simulators.base import Ctx, Fleet
from protocols.lwm2m.client import Lwm2mClient

RESOURCE = "/3/0/15"


class Lwm2mFleet(Fleet):
    def __init__(self, ctx: Ctx, group: Group) -> None:
        super().__init__(ctx, group)
        self.clients: dict[int, Lwm2mClient] = {}

    async def start_device(self, idx: int) -> None:
        self.tasks.append(self.ctx.loop.create_task(self._keep_registered(idx)))

    async def _keep_registered(self, idx: int) -> None:
        ep = self.ctx.ep
        name = self.ctx.client_id(self.group.name, idx)
        while not self.closed:
            if idx not in self.connected:
                old = self.clients.pop(idx, None)
                if old is not None:
                    with contextlib.suppress(Exception):
                        await old.close()
                c = Lwm2mClient((ep.device_host, ep.ports["lwm2m"]), name,
                                lifetime=max(30, int(self.group.keepalive * 3)))
                c.values[RESOURCE] = ""
                try:
                    await c.start(bind=("0.0.0.0", 0))
                    self.clients[idx] = c
                    r = await c.register(timeout=5.0)
                    if not r.code.is_successful():
                        raise RuntimeError(str(r.code))
                    self.up(idx)
                except Exception as e:
                    self.down(idx, f"register: {e!r}")
                    await asyncio.sleep(0.5 + random.random())
                    continue
            await asyncio.sleep(self.group.keepalive)
            c2 = self.clients.get(idx)
            if c2 is not None and idx in self.connected:
                try:
                    r = await c2.update(timeout=5.0)
                    if not r.code.is_successful():
                        raise RuntimeError(str(r.code))
                except Exception as e:
                    self.down(idx, f"update: {e!r}")

    async def publish_once(self, idx: int, mid: str) -> None:
        c = self.clients.get(idx)
        if c is None:
            return
        self.sent(mid, idx, 0)
        c.set(RESOURCE, mid)

    async def stop(self) -> None:
        await super().stop()
        for c in self.clients.values():
            with contextlib.suppress(Exception):
                await c.close()
