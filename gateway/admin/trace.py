"""Live trace of one client or one topic filter, for ``/api/v5/trace`` and
``gatewayctl trace``.

A :class:`Trace` collects events about its subject into a bounded queue that the API
streams out (server-sent events). The :class:`TraceHub` registers its hook callbacks
only while at least one trace runs, so an untraced node pays nothing.

Events (``event`` field): ``client.connected``, ``client.disconnected``,
``session.subscribed``, ``session.unsubscribed``, ``message.publish`` (a message the node
accepted, after the publish hooks), ``message.delivered`` (handed to a client's
connection), ``message.dropped`` (with ``reason``), ``message.acked``. A client trace
sees its own connection, subscriptions and the messages it publishes or receives; a
topic trace sees messages whose topic matches its filter. When a slow reader lets the
queue fill, further events are counted in ``dropped`` and reported once room is back
(event ``trace.dropped``), never silently lost.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from gateway.core.hooks import Hooks, Priority
from gateway.core.topic_index import topic_matches
from protocols.context import ClientInfo, Message, SubOptions

QUEUE_SIZE = 1000
PAYLOAD_PREVIEW = 256  # bytes of payload shown in a message event


def payload_preview(payload: bytes, limit: int = PAYLOAD_PREVIEW) -> dict[str, Any]:
    cut = payload[:limit]
    try:
        text: str | None = cut.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    view: dict[str, Any] = {"payload_size": len(payload), "truncated": len(payload) > limit}
    if text is not None:
        view["payload"] = text
    else:
        view["payload_hex"] = cut.hex()
    return view


class Trace:
    def __init__(self, trace_id: int, *, clientid: str | None, topic: str | None,
                 now: Callable[[], float]) -> None:
        if (clientid is None) == (topic is None):
            raise ValueError("a trace follows exactly one of clientid or topic")
        self.id = trace_id
        self.clientid = clientid
        self.topic = topic
        self._now = now
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(QUEUE_SIZE)
        self.dropped = 0
        self.closed = False

    @property
    def subject(self) -> dict[str, str]:
        if self.clientid is not None:
            return {"type": "clientid", "value": self.clientid}
        assert self.topic is not None
        return {"type": "topic", "value": self.topic}

    def wants_client(self, client: ClientInfo | None) -> bool:
        return self.clientid is not None and client is not None and (
            client.client_id == self.clientid
        )

    def wants_message(self, message: Message, client: ClientInfo | None = None) -> bool:
        if self.topic is not None:
            return topic_matches(self.topic, message.topic)
        return message.publisher == self.clientid or self.wants_client(client)

    def put(self, event: dict[str, Any]) -> None:
        if self.closed:
            return
        event.setdefault("ts", self._now())
        if self.dropped and self.queue.qsize() < QUEUE_SIZE - 1:
            self.queue.put_nowait({"event": "trace.dropped", "count": self.dropped,
                                   "ts": self._now()})
            self.dropped = 0
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1

    def close(self) -> None:
        """End the stream (the reader gets None after what is queued)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.queue.put_nowait(None)
        except asyncio.QueueFull:
            self.queue.get_nowait()
            self.queue.put_nowait(None)


def _client_fields(client: ClientInfo | None) -> dict[str, Any]:
    if client is None:
        return {}
    return {"clientid": client.client_id, "username": client.username}


def _message_fields(message: Message) -> dict[str, Any]:
    return {
        "topic": message.topic,
        "qos": message.qos,
        "retain": message.retain,
        "from_clientid": message.publisher or None,
        **payload_preview(message.payload),
    }


class TraceHub:
    def __init__(self, hooks: Hooks, now: Callable[[], float]) -> None:
        self.hooks = hooks
        self._now = now
        self.traces: dict[int, Trace] = {}
        self._ids = itertools.count(1)
        self._attached = False
        self._callbacks: list[tuple[str, Callable[..., Any], int]] = [
            ("client.connected", self._connected, Priority.LOWEST),
            ("client.disconnected", self._disconnected, Priority.LOWEST),
            ("session.subscribed", self._subscribed, Priority.LOWEST),
            ("session.unsubscribed", self._unsubscribed, Priority.LOWEST),
            ("message.publish", self._publish, Priority.LOWEST),
            ("message.delivered", self._delivered, Priority.LOWEST),
            ("message.dropped", self._dropped, Priority.LOWEST),
            ("message.acked", self._acked, Priority.LOWEST),
        ]

    def start(self, *, clientid: str | None = None, topic: str | None = None) -> Trace:
        trace = Trace(next(self._ids), clientid=clientid, topic=topic, now=self._now)
        self.traces[trace.id] = trace
        if not self._attached:
            for name, callback, priority in self._callbacks:
                self.hooks.add(name, callback, priority)
            self._attached = True
        return trace

    def stop(self, trace: Trace) -> None:
        trace.close()
        self.traces.pop(trace.id, None)
        if not self.traces and self._attached:
            for name, callback, _ in self._callbacks:
                self.hooks.remove(name, callback)
            self._attached = False

    def close_all(self) -> None:
        for trace in list(self.traces.values()):
            self.stop(trace)

    # -- hook callbacks ----------------------------------------------------------------

    def _client_event(self, name: str, client: ClientInfo, **extra: Any) -> None:
        for t in self.traces.values():
            if t.wants_client(client):
                t.put({"event": name, **_client_fields(client), **extra})

    def _connected(self, client: ClientInfo) -> None:
        self._client_event(
            "client.connected",
            client,
            ip_address=client.peer_host,
            port=client.peer_port,
            listener=client.listener,
            proto_ver=client.proto_ver,
            keepalive=client.keepalive,
            clean_start=client.clean_start,
        )

    def _disconnected(self, client: ClientInfo) -> None:
        self._client_event("client.disconnected", client)

    def _subscribed(self, client: ClientInfo, topic: str, options: SubOptions) -> None:
        for t in self.traces.values():
            if t.wants_client(client) or (t.topic is not None and t.topic == topic):
                t.put({"event": "session.subscribed", **_client_fields(client),
                       "topic": topic, "qos": options.qos})

    def _unsubscribed(self, client: ClientInfo, topic: str) -> None:
        for t in self.traces.values():
            if t.wants_client(client) or (t.topic is not None and t.topic == topic):
                t.put({"event": "session.unsubscribed", **_client_fields(client),
                       "topic": topic})

    def _publish(self, message: Message) -> None:
        for t in self.traces.values():
            if t.wants_message(message):
                t.put({"event": "message.publish", **_message_fields(message)})
        return None  # a fold callback: the message goes on unchanged

    def _delivered(self, client: ClientInfo, message: Message) -> None:
        for t in self.traces.values():
            if t.wants_client(client) or (t.topic is not None and t.wants_message(message)):
                t.put({"event": "message.delivered", **_client_fields(client),
                       **_message_fields(message)})

    def _acked(self, client: ClientInfo | None, message: Message) -> None:
        for t in self.traces.values():
            if t.wants_client(client) or (t.topic is not None and t.wants_message(message)):
                t.put({"event": "message.acked", **_client_fields(client),
                       "topic": message.topic, "qos": message.qos})

    def _dropped(self, message: Message, reason: str) -> None:
        for t in self.traces.values():
            if t.wants_message(message):
                t.put({"event": "message.dropped", "reason": reason,
                       **_message_fields(message)})
