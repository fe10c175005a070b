"""EMQX-compatible ``$SYS/brokers/<node>/...`` messages, published through the node.

Topics (``<node>`` is ``[node] name``):

- ``$SYS/brokers`` (retained): the running nodes' names, comma-separated.
- ``$SYS/brokers/<node>/version``, ``.../sysdescr`` (retained): every ``sys_msg_interval``.
- ``$SYS/brokers/<node>/stats/<name>`` (``stats/connections/count``, ``.../max``, ...) and
  ``$SYS/brokers/<node>/metrics/<name>`` (``metrics/messages/received``, ...): decimal
  integers, every ``sys_msg_interval``.
- ``$SYS/brokers/<node>/uptime`` (milliseconds, as EMQX 5) and ``.../datetime``
  (RFC 3339): every ``sys_heartbeat_interval``.
- ``$SYS/brokers/<node>/clients/<clientid>/connected|disconnected|subscribed|unsubscribed``
  (JSON; MQTT clients) or ``$SYS/brokers/<node>/gateway/<protocol>/clients/<clientid>/...``
  (other front-ends), as ``[sys_topics.sys_event_messages]`` selects.

Everything goes out once at start, then on its interval. Messages are QoS 0 from the
empty client id, and go through ``node.publish`` (hooks, metrics, routing) only when some
subscription matches; otherwise only a changed retained value is stored, so an idle node
counts no received-and-dropped messages per tick. A retained message is stored again only
when its payload changed, so a node does not rewrite its store every minute. Event
messages are published on the next loop turn, never from inside the hook that reported
them. ``#`` and ``+`` do not match ``$SYS`` topics (the topic index's rule), so only
explicit ``$SYS/...`` subscribers get them.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import platform
from collections.abc import Callable
from typing import Any

from gateway.core.clock import TimerHandle
from gateway.core.node import Node
from protocols.context import ClientInfo, Message, SubOptions

log = logging.getLogger("gateway.admin")

SYS_CLIENT = ClientInfo(client_id="", protocol="sys", listener="sys")


def sysdescr() -> str:
    return f"edge-gateway on {platform.system()} {platform.release()} ({platform.machine()})"


class SysPublisher:
    def __init__(
        self,
        node: Node,
        settings: Any,  # gateway.config.schema.SysTopicsConfig
        *,
        version: str,
        started_at: float,
        stats: Callable[[], dict[str, int]],
        nodes: Callable[[], list[str]] | None = None,
        sockport: Callable[[str], int | None] = lambda listener: None,
    ) -> None:
        self.node = node
        self.settings = settings
        self.version = version
        self.started_at = started_at
        self._stats = stats
        self._nodes = nodes or (lambda: [node.settings.node_name])
        self._sockport = sockport
        self.prefix = f"$SYS/brokers/{node.settings.node_name}"
        self._tick_timer: TimerHandle | None = None
        self._beat_timer: TimerHandle | None = None
        self._hooks: list[tuple[str, Callable[..., Any]]] = []
        self._running = False
        self.published = 0

    # -- life cycle ----------------------------------------------------------------

    def start(self) -> None:
        self._running = True
        events = self.settings.sys_event_messages
        wanted: list[tuple[str, Callable[..., Any], bool]] = [
            ("client.connected", self._on_connected, events.client_connected),
            ("client.disconnected", self._on_disconnected, events.client_disconnected),
            ("session.subscribed", self._on_subscribed, events.client_subscribed),
            ("session.unsubscribed", self._on_unsubscribed, events.client_unsubscribed),
        ]
        for name, callback, enabled in wanted:
            if enabled:
                self.node.hooks.add(name, callback)
                self._hooks.append((name, callback))
        # the disconnected event's payload has no local address (sockport is the
        # listener's): the node need not look one up for it
        self.node.sockname_unused.add(self._on_disconnected)
        if self.settings.sys_msg_interval > 0:
            self.tick()
        if self.settings.sys_heartbeat_interval > 0:
            self.heartbeat()

    def stop(self) -> None:
        self._running = False
        for name, callback in self._hooks:
            self.node.hooks.remove(name, callback)
        self._hooks.clear()
        self.node.sockname_unused.discard(self._on_disconnected)
        for timer in (self._tick_timer, self._beat_timer):
            if timer is not None:
                timer.cancel()
        self._tick_timer = self._beat_timer = None

    # -- periodic ------------------------------------------------------------------

    def tick(self) -> None:
        """version, sysdescr, brokers, stats/..., metrics/...; then re-arm."""
        self._tick_timer = None
        if not self._running:
            return
        try:
            self._publish(f"{self.prefix}/version", self.version, retain=True)
            self._publish(f"{self.prefix}/sysdescr", sysdescr(), retain=True)
            self._publish("$SYS/brokers", ",".join(self._nodes()), retain=True)
            for name, value in sorted(self._stats().items()):
                self._publish(f"{self.prefix}/stats/{name.replace('.', '/')}", str(value))
            for name, value in sorted(self.node.metrics.snapshot().items()):
                self._publish(f"{self.prefix}/metrics/{name.replace('.', '/')}", str(value))
        except Exception:  # pragma: no cover - never let $SYS take the loop down
            log.exception("$SYS tick failed")
        self._tick_timer = self.node.scheduler.call_later(
            self.settings.sys_msg_interval, self.tick
        )

    def heartbeat(self) -> None:
        """uptime (ms) and datetime; then re-arm."""
        self._beat_timer = None
        if not self._running:
            return
        now = self.node.now()
        uptime_ms = max(0, int((now - self.started_at) * 1000))
        self._publish(f"{self.prefix}/uptime", str(uptime_ms))
        stamp = dt.datetime.fromtimestamp(now, dt.UTC).astimezone()
        self._publish(f"{self.prefix}/datetime", stamp.isoformat(timespec="milliseconds"))
        self._beat_timer = self.node.scheduler.call_later(
            self.settings.sys_heartbeat_interval, self.heartbeat
        )

    def _publish(self, topic: str, payload: str | bytes, *, retain: bool = False) -> None:
        data = payload.encode("utf-8") if isinstance(payload, str) else payload
        if retain:
            old = self.node.retainer.get(topic)
            retain = old is None or old.payload != data
        message = Message(topic, data, 0, retain, publisher="", timestamp=self.node.now())
        node = self.node
        if not node.broker.index.lookup(topic):
            # Nobody listens: keep a retained value, but do not count a received and a
            # dropped message for every $SYS tick of an idle node.
            if retain and node.settings.retainer_enable:
                node.retainer.on_publish(message)
            return
        node.publish(SYS_CLIENT, message)
        self.published += 1

    def alarm(self, alarm: Any, activated: bool) -> None:
        """An alarm was activated or cleared (EMQX's ``$SYS/brokers/<node>/alarms/...``)."""
        if not self._running:
            return
        topic = f"{self.prefix}/alarms/{'activate' if activated else 'deactivate'}"
        self._publish(topic, json.dumps(alarm.as_dict(), separators=(",", ":")))

    # -- client events -------------------------------------------------------------

    def _event_topic(self, client: ClientInfo, event: str) -> str | None:
        cid = client.client_id
        if not cid or "+" in cid or "#" in cid or "\x00" in cid:
            return None  # not usable as a topic level
        if client.protocol in ("mqtt", "ws"):
            return f"{self.prefix}/clients/{cid}/{event}"
        return f"{self.prefix}/gateway/{client.protocol}/clients/{cid}/{event}"

    def _common(self, client: ClientInfo) -> dict[str, Any]:
        return {
            "clientid": client.client_id,
            "username": client.username,
            "ipaddress": client.peer_host,
            "sockport": self._sockport(client.listener),
            "protocol": client.protocol,
            "proto_name": "MQTT" if client.protocol in ("mqtt", "ws") else client.protocol,
            "proto_ver": client.proto_ver,
            "connected_at": int(client.connected_at * 1000) if client.connected_at else None,
            "ts": int(self.node.now() * 1000),
        }

    def _emit(self, client: ClientInfo, event: str, payload: dict[str, Any]) -> None:
        index = self.node.broker.index
        if not index.has_first_level("$SYS"):
            return  # no "$SYS/..." subscription at all (the usual case): not even a topic
        topic = self._event_topic(client, event)
        if topic is None or not index.has_match(topic):
            return  # nobody listens: no JSON, no timer, no cached one-off topic
        data = json.dumps(payload, separators=(",", ":"))

        def later() -> None:
            if self._running:
                self._publish(topic, data)

        self.node.scheduler.call_later(0.0, later)

    def _listened(self, client: ClientInfo, event: str) -> bool:
        """Does anyone subscribe to this client event (else nothing is built for it)?
        Per CONNECT and disconnect: without any ``$SYS/...`` subscription, one dict probe."""
        index = self.node.broker.index
        if not index.has_first_level("$SYS"):
            return False
        topic = self._event_topic(client, event)
        return topic is not None and index.has_match(topic)

    def _on_connected(self, client: ClientInfo) -> None:
        # every CONNECT passes here: no payload (dict, listener port) when nobody listens
        if not self._listened(client, "connected"):
            return
        payload = self._common(client)
        session = self.node.sessions.get(client.client_id)
        payload.update(
            keepalive=client.keepalive,
            clean_start=client.clean_start,
            expiry_interval=session.expiry_interval if session is not None else 0,
        )
        self._emit(client, "connected", payload)

    def _on_disconnected(self, client: ClientInfo) -> None:
        if not self._listened(client, "disconnected"):
            return
        payload = self._common(client)
        payload.update(
            reason=str(client.attrs.get("disconnect_reason", "unknown")),
            disconnected_at=int(self.node.now() * 1000),
        )
        self._emit(client, "disconnected", payload)

    def _on_subscribed(self, client: ClientInfo, topic: str, options: SubOptions) -> None:
        self._emit(
            client,
            "subscribed",
            {
                "clientid": client.client_id,
                "username": client.username,
                "protocol": client.protocol,
                "topic": topic,
                "subopts": {
                    "qos": options.qos,
                    "nl": int(options.no_local),
                    "rap": int(options.retain_as_published),
                    "rh": options.retain_handling,
                },
                "ts": int(self.node.now() * 1000),
            },
        )

    def _on_unsubscribed(self, client: ClientInfo, topic: str) -> None:
        self._emit(
            client,
            "unsubscribed",
            {
                "clientid": client.client_id,
                "username": client.username,
                "protocol": client.protocol,
                "topic": topic,
                "ts": int(self.node.now() * 1000),
            },
        )
