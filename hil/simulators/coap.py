"""CoAP devices (aiocoap), EMQX's publish/subscribe mapping (``/ps/{topic}``).

Each device is one aiocoap client context, hence its own UDP source address, which is
how a connectionless CoAP peer is known to the gateway. Telemetry is ``POST
/ps/<topic>?qos=N`` as a CON request: ``acked`` on 2.04. With ``subscriptions`` the
device observes its command topic (``GET`` with Observe 0) and every notification is a
``recv``. A request without an answer within ``TIMEOUT`` marks the device down; the next
success marks it up (CoAP has no connection: "up" means answered).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiocoap import CON, GET, POST, Context, Message

from hil.scenario import Group
from hil.simulators.base import Ctx, Fleet, payload

TIMEOUT = 5.0


class CoapFleet(Fleet):
    def __init__(self, ctx: Ctx, group: Group) -> None:
        super().__init__(ctx, group)
        self.contexts: dict[int, Any] = {}
        self.observations: dict[int, asyncio.Task[None]] = {}

    def _uri(self, topic: str, query: str = "") -> str:
        ep = self.ctx.ep
        return f"coap://{ep.device_host}:{ep.ports['coap']}/ps/{topic}{query}"

    async def start_device(self, idx: int) -> None:
        self.contexts[idx] = await Context.create_client_context()
        if self.group.subscriptions is not None:
            self.observations[idx] = self.ctx.loop.create_task(self._observe(idx))
        else:
            self.up(idx)
        self.tasks.append(self.ctx.loop.create_task(self._probe(idx)))

    async def _probe(self, idx: int) -> None:
        """A device that lost its answers asks once a second until the unit answers."""
        while not self.closed:
            await asyncio.sleep(1.0)
            if idx in self.connected:
                continue
            msg = Message(code=GET, mtype=CON, uri=self._uri(
                self.ctx.tele_topic(self.group.name, idx)))
            try:
                await asyncio.wait_for(self.contexts[idx].request(msg).response, TIMEOUT)
                self.up(idx)  # any answer (even 4.04) means the unit is there again
            except Exception:
                continue

    async def _observe(self, idx: int) -> None:
        g = self.group
        assert g.subscriptions is not None
        topic = self.ctx.cmd_topic(self.ctx.client_id(g.name, idx))
        while not self.closed:
            req = self.contexts[idx].request(Message(
                code=GET, mtype=CON, observe=0,
                uri=self._uri(topic, f"?qos={g.subscriptions.qos}")))
            try:
                first = await asyncio.wait_for(req.response, TIMEOUT)
                if not first.code.is_successful():
                    raise RuntimeError(str(first.code))
                self.up(idx)
                async for note in req.observation:
                    self.received(note.payload, idx)
                self.down(idx, "observation ended")
            except Exception as e:
                self.down(idx, f"observe: {e!r}")
                with contextlib.suppress(Exception):
                    req.observation.cancel()
                await asyncio.sleep(1.0)

    async def publish_once(self, idx: int, mid: str) -> None:
        g = self.group
        self.sent(mid, idx, g.qos)
        msg = Message(code=POST, mtype=CON, payload=payload(mid, g.payload),
                      uri=self._uri(self.ctx.tele_topic(g.name, idx), f"?qos={g.qos}"))
        try:
            resp = await asyncio.wait_for(self.contexts[idx].request(msg).response, TIMEOUT)
        except Exception as e:
            self.down(idx, f"post: {e!r}")
            return
        if resp.code.is_successful():
            self.up(idx)  # answered: the unit is there (the observation may live on)
            if g.qos:
                self.acked(mid)

    async def stop(self) -> None:
        for t in self.observations.values():
            t.cancel()
        await super().stop()
        for c in self.contexts.values():
            with contextlib.suppress(Exception):
                await c.shutdown()
