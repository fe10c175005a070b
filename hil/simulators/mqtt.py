"""MQTT 3.1.1 / 5.0 devices over TCP, TLS, WebSocket (path /mqtt) or secure WebSocket.

Each device is a :class:`hil.simulators.paho_async.PahoLink`; it publishes telemetry on
its own topic at the group's QoS and, with ``subscriptions``, subscribes (again on every
connect that finds no session) to its command topic. A publish is recorded ``sent`` when
handed to paho while connected and ``acked`` on PUBACK / PUBCOMP without an error code.
"""

from __future__ import annotations

import paho.mqtt.client as mqtt

from hil.scenario import Group
from hil.simulators.base import Ctx, Fleet, payload
from hil.simulators.paho_async import PahoLink

_PORT = {"tcp": "mqtt", "tls": "mqtts", "ws": "ws", "wss": "wss"}


class MqttFleet(Fleet):
    def __init__(self, ctx: Ctx, group: Group) -> None:
        super().__init__(ctx, group)
        self.links: dict[int, PahoLink] = {}
        self.pending: dict[tuple[int, int], str] = {}  # (device, paho mid) -> message id

    async def start_device(self, idx: int) -> None:
        g, ctx = self.group, self.ctx
        ep = ctx.ep
        link = PahoLink(
            ctx.loop, ctx.pool, ctx.client_id(g.name, idx), ep.device_host,
            ep.ports[_PORT[g.mqtt_transport]], version=g.mqtt_version,
            transport=g.mqtt_transport, persistent=self.persistent,
            keepalive=int(g.keepalive), ca_file=str(ep.ca_file) if ep.ca_file else None,
            on_up=lambda present: self._up(idx, present),
            on_down=lambda why: self.down(idx, why),
            on_message=lambda m: self.received(bytes(m.payload), idx),
            on_acked=lambda mid, ok: self._acked(idx, mid, ok),
        )
        self.links[idx] = link
        await link.connect()

    def _up(self, idx: int, session_present: bool) -> None:
        if self.group.subscriptions is not None and not session_present:
            cid = self.ctx.client_id(self.group.name, idx)
            self.links[idx].client.subscribe(self.ctx.cmd_topic(cid),
                                             self.group.subscriptions.qos)
        self.up(idx)

    def _acked(self, idx: int, pmid: int, ok: bool) -> None:
        mid = self.pending.pop((idx, pmid), None)
        if mid is not None and ok:
            self.acked(mid)

    async def publish_once(self, idx: int, mid: str) -> None:
        link = self.links[idx]
        if not link.connected:
            return
        q = self.group.qos
        info = link.client.publish(self.ctx.tele_topic(self.group.name, idx),
                                   payload(mid, self.group.payload), q)
        if info.rc != mqtt.MQTT_ERR_SUCCESS and info.rc != mqtt.MQTT_ERR_QUEUE_SIZE:
            return
        if q:
            self.pending[(idx, info.mid)] = mid
        self.sent(mid, idx, q)

    async def stop(self) -> None:
        await super().stop()
        for link in self.links.values():
            link.close()
