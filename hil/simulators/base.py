"""What every device fleet shares: the run context, message ids, payloads, scheduling.

Message ids are ``<group>:<device>:<seq>`` for telemetry and ``c:<group>:<device>:<seq>``
for commands, unique within a run; every payload is JSON starting with them
(``{"id": ..., "ts": ..., "pad": "xx..."}``), padded to the group's payload size, so the
receiver needs nothing but the payload to match a receipt to its sending.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hil.scenario import Group
from hil.unit import Endpoints


@dataclass
class Ctx:
    run: str
    ep: Endpoints
    rec: Callable[..., None]
    loop: asyncio.AbstractEventLoop
    pool: ThreadPoolExecutor
    publishing: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    sent: int = 0
    acked: int = 0
    received: int = 0

    def tele_topic(self, group: str, idx: int) -> str:
        return f"hil/{self.run}/t/{group}/{idx}"

    def cmd_topic(self, client_id: str) -> str:
        return f"hil/{self.run}/c/{client_id}"

    def client_id(self, group: str, idx: int) -> str:
        return f"hil-{self.run}-{group}-{idx}"


def payload(mid: str, size: int) -> bytes:
    head = json.dumps({"id": mid, "ts": round(time.time(), 6), "pad": ""},
                      separators=(",", ":"))
    return (head[:-2] + "x" * max(0, size - len(head)) + '"}').encode()


def message_id(data: bytes) -> str | None:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    mid = obj.get("id") if isinstance(obj, dict) else None
    return mid if isinstance(mid, str) else None


class Fleet:
    """One scenario group's devices. Subclasses implement ``start_device`` and
    ``publish_once``; the base runs the per-device schedule at ``group.rate``."""

    def __init__(self, ctx: Ctx, group: Group) -> None:
        self.ctx, self.group = ctx, group
        self.connected: set[int] = set()
        self.ups: dict[int, int] = {}
        self.tasks: list[asyncio.Task[Any]] = []
        self.persistent = group.session == "persistent"
        # connections are kept (reconnects included) until stop(), after publishing ends
        self.closed = False

    # -- bookkeeping the subclasses call ------------------------------------------------
    def up(self, idx: int) -> None:
        if idx in self.connected:
            return
        self.connected.add(idx)
        self.ups[idx] = self.ups.get(idx, 0) + 1
        self.ctx.rec("up", d=self.ctx.client_id(self.group.name, idx), g=self.group.name,
                     n=self.ups[idx])

    def down(self, idx: int, why: str = "") -> None:
        if idx not in self.connected:
            return
        self.connected.discard(idx)
        self.ctx.rec("down", d=self.ctx.client_id(self.group.name, idx), g=self.group.name,
                     why=why[:80])

    def sent(self, mid: str, idx: int, qos: int) -> None:
        self.ctx.sent += 1
        self.ctx.rec("sent", m=mid, g=self.group.name, d=self.ctx.client_id(self.group.name, idx),
                     q=qos, k="tele", p=True)

    def acked(self, mid: str) -> None:
        self.ctx.acked += 1
        self.ctx.rec("acked", m=mid)

    def received(self, data: bytes, idx: int) -> None:
        mid = message_id(data)
        if mid is None:
            return
        self.ctx.received += 1
        self.ctx.rec("recv", m=mid, by=self.ctx.client_id(self.group.name, idx))

    # -- life cycle ---------------------------------------------------------------------
    async def start(self, ramp: float) -> None:
        n = self.group.count
        for idx in range(n):
            delay = ramp * idx / n
            self.tasks.append(self.ctx.loop.create_task(self._device(idx, delay)))

    async def _device(self, idx: int, delay: float) -> None:
        await asyncio.sleep(delay)
        await self.start_device(idx)
        if self.group.rate <= 0:
            return
        await self.ctx.publishing.wait()
        period = 1.0 / self.group.rate
        nxt = time.monotonic() + random.random() * period
        seq = 0
        while not self.ctx.stopping.is_set():
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))
            nxt += period
            if self.ctx.stopping.is_set():
                break
            if idx in self.connected:
                seq += 1
                mid = f"{self.group.name}:{idx}:{seq}"
                self.ctx.loop.create_task(self._publish(idx, mid))

    async def _publish(self, idx: int, mid: str) -> None:
        try:
            await self.publish_once(idx, mid)
        except Exception as e:  # a failed publish is evidence, not a rig error
            self.down(idx, f"publish: {e!r}")

    async def start_device(self, idx: int) -> None:
        raise NotImplementedError

    async def publish_once(self, idx: int, mid: str) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        self.closed = True
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
