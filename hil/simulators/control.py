"""The rig's own clients: the collector, the commander and the upstream collector.

- **Collector**: one MQTT 5 client on the unit's control address with a persistent
  session (expiry one hour), subscribed at QoS 2 to every device's telemetry
  (``hil/<run>/t/#``) and to LwM2M uplinks (``lwm2m/+/up/#``); it subscribes again only
  when the unit answers "no session", so a unit that loses sessions loses messages
  visibly. Every receipt is a ``recv`` by ``collector``.
- **Commander**: publishes commands to devices with ``subscriptions`` at their rate and
  QoS (``sent``/``acked`` with ``k=cmd``); a command counts for loss (``p``) only when the
  device's session is persistent (a clean session may rightly miss what was sent while
  it was away). For LwM2M devices it asks the gateway to observe ``/3/0/15`` when they
  register, and sends ``read`` commands whose answers come back with our id echoed.
- **Upstream collector**: MQTT 3.1.1, persistent, on the rig's mosquitto, subscribed to
  ``up/#`` at QoS 1; receipts are ``recv`` by ``upstream``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import paho.mqtt.client as mqtt

from hil.scenario import Group
from hil.simulators.base import Ctx, message_id, payload
from hil.simulators.lwm2m import RESOURCE
from hil.simulators.paho_async import PahoLink


class Collector:
    def __init__(self, ctx: Ctx, lwm2m_groups: list[Group]) -> None:
        self.ctx = ctx
        self.commander: Commander | None = None
        ep = ctx.ep
        self.link = PahoLink(
            ctx.loop, ctx.pool, f"hil-{ctx.run}-collector", ep.control_host,
            ep.ports["mqtt"], persistent=True, keepalive=5,
            on_up=self._up, on_message=self._msg)
        self.connected = asyncio.Event()

    def _up(self, present: bool) -> None:
        if not present:
            c = self.link.client
            c.subscribe(f"hil/{self.ctx.run}/t/#", 2)
            c.subscribe("lwm2m/+/up/#", 1)
        self.connected.set()

    def _msg(self, msg: mqtt.MQTTMessage) -> None:
        ctx = self.ctx
        if msg.topic.startswith("lwm2m/"):
            self._lwm2m(msg)
            return
        mid = message_id(bytes(msg.payload))
        if mid is not None:
            ctx.received += 1
            ctx.rec("recv", m=mid, by="collector", q=msg.qos)

    def _lwm2m(self, msg: mqtt.MQTTMessage) -> None:
        parts = msg.topic.split("/")
        ep = parts[1]
        if not ep.startswith(f"hil-{self.ctx.run}-"):
            return
        try:
            body = json.loads(msg.payload)
        except ValueError:
            return
        kind = body.get("msgType")
        data = body.get("data", {}) if isinstance(body.get("data"), dict) else {}
        if kind == "register" and self.commander is not None:
            self.commander.lwm2m_registered(ep)
        elif kind == "notify":
            for item in data.get("content", []) or []:
                if item.get("path") == RESOURCE and item.get("value"):
                    self.ctx.received += 1
                    self.ctx.rec("recv", m=str(item["value"]), by="collector", q=msg.qos)
        elif kind == "read" and "hilid" in body:
            self.ctx.received += 1
            self.ctx.rec("recv", m=body["hilid"], by=ep, q=msg.qos)

    async def start(self) -> None:
        await self.link.connect()

    def close(self) -> None:
        self.link.close()


class Commander:
    def __init__(self, ctx: Ctx, groups: list[Group]) -> None:
        self.ctx = ctx
        self.groups = [g for g in groups if g.subscriptions is not None or g.protocol == "lwm2m"]
        ep = ctx.ep
        self.link = PahoLink(
            ctx.loop, ctx.pool, f"hil-{ctx.run}-commander", ep.control_host,
            # persistent, like the collector: a QoS 2 command whose PUBREC a power cut
            # swallowed is re-sent (DUP) after the unit is back, and only the session the
            # unit kept makes that re-send the same message rather than a new one (with a
            # clean session the qemu target recorded QoS 2 "duplicates" the rig made)
            ep.ports["mqtt"], persistent=True, keepalive=5, on_acked=self._acked)
        self.pending: dict[int, str] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.req = 0

    def _acked(self, pmid: int, ok: bool) -> None:
        mid = self.pending.pop(pmid, None)
        if mid is not None and ok:
            self.ctx.acked += 1
            self.ctx.rec("acked", m=mid)

    def lwm2m_registered(self, ep: str) -> None:
        self.req += 1
        cmd = {"reqID": self.req, "msgType": "observe", "data": {"path": RESOURCE}}
        self.link.client.publish(f"lwm2m/{ep}/dn", json.dumps(cmd), 1)

    async def start(self) -> None:
        await self.link.connect()
        for g in self.groups:
            if g.subscriptions is None or g.subscriptions.rate <= 0:
                continue
            for idx in range(g.count):
                self.tasks.append(self.ctx.loop.create_task(self._device(g, idx)))

    async def _device(self, g: Group, idx: int) -> None:
        assert g.subscriptions is not None
        await self.ctx.publishing.wait()
        period = 1.0 / g.subscriptions.rate
        nxt = time.monotonic() + random.random() * period
        cid = self.ctx.client_id(g.name, idx)
        persistent = g.session == "persistent" and g.protocol in ("mqtt", "mqtt-sn")
        seq = 0
        while not self.ctx.stopping.is_set():
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))
            nxt += period
            if self.ctx.stopping.is_set() or not self.link.connected:
                continue
            seq += 1
            mid = f"c:{g.name}:{idx}:{seq}"
            q = g.subscriptions.qos
            if g.protocol == "lwm2m":
                self.req += 1
                body = json.dumps({"reqID": self.req, "msgType": "read", "hilid": mid,
                                   "data": {"path": "/3/0/0"}}).encode()
                info = self.link.client.publish(f"lwm2m/{cid}/dn", body, q)
            else:
                info = self.link.client.publish(self.ctx.cmd_topic(cid), payload(mid, 64), q)
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                continue
            if q:
                self.pending[info.mid] = mid
            self.ctx.sent += 1
            self.ctx.rec("sent", m=mid, g=g.name, d=cid, q=q, k="cmd",
                         p=persistent and q >= 1)

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def close(self) -> None:
        self.link.close()


class UpstreamCollector:
    def __init__(self, ctx: Ctx, host: str, port: int) -> None:
        self.ctx = ctx
        self.link = PahoLink(ctx.loop, ctx.pool, f"hil-{ctx.run}-upstream", host, port,
                             version="3.1.1", persistent=True, keepalive=5,
                             on_up=self._up, on_message=self._msg)

    def _up(self, present: bool) -> None:
        if not present:
            self.link.client.subscribe("up/#", 1)

    def _msg(self, msg: mqtt.MQTTMessage) -> None:
        mid = message_id(bytes(msg.payload))
        if mid is not None:
            self.ctx.rec("recv", m=mid, by="upstream", q=msg.qos)

    async def start(self) -> None:
        await self.link.connect()

    def close(self) -> None:
        self.link.close()
