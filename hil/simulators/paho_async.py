"""paho-mqtt clients on one asyncio loop, through paho's socket callbacks.

A thousand ``loop_start()`` threads would cost a thread and its stack per device; instead
each client's socket is registered with the loop (``add_reader`` -> ``loop_read``,
``add_writer`` while paho has output -> ``loop_write``) and one task calls ``loop_misc``
on every client once a second (keepalive pings, timeouts). Only the blocking part of
paho, ``connect``/``reconnect`` (TCP, TLS and WebSocket handshakes), runs on a small
thread pool so a partitioned unit cannot stall the loop; the socket callbacks it triggers
from that thread are handed to the loop with ``call_soon_threadsafe``.

Invariants:
- Every paho callback the owner sees (connect, disconnect, publish, message) runs on the
  loop thread, except ``on_connect_fail`` paths, which are re-posted.
- A QoS 2 message whose PUBREC arrived is never published again, however many reconnect
  attempts fail before one succeeds: the PUBREL is what goes again (:class:`Client`, a
  fix of paho-mqtt 2.2's reconnect, which the HIL power-cut scenario caught).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import threading
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

_ALL: set[PahoLink] = set()

#: paho's outgoing QoS 2 states once the PUBREC arrived: PUBREL sent or owed
_PUBREL_PHASE = (mqtt.mqtt_ms_wait_for_pubcomp, mqtt.mqtt_ms_resend_pubrel)


class Client(mqtt.Client):
    """paho's client, with the state of outgoing QoS 2 messages kept across failed
    reconnect attempts.

    paho-mqtt 2.2's ``reconnect()`` resets every outgoing message's state
    (``_messages_reconnect_reset_out``) *before* it opens the socket, and that reset is
    not idempotent: with a persistent session the first call turns a message whose
    PUBREC arrived (``wait_for_pubcomp``) into ``resend_pubrel``, as it should, but a
    second call (the first attempt failed: the unit was still booting after a power cut)
    turns ``resend_pubrel`` into ``publish``. The next connection then sends the
    PUBLISH again, with DUP 0, instead of the PUBREL. The broker had completed that
    packet id when it took the PUBREL, so for it (MQTT 5.0 section 4.3.3, 3.1.1 alike)
    this is a new message and every subscriber gets it twice; the sender itself must
    "not re-send the PUBLISH once it has sent the corresponding PUBREL". Here a message
    in the PUBREL phase stays ``resend_pubrel`` through any number of resets (unless
    the session starts clean, where paho's re-publish is what it means to do).
    """

    def _messages_reconnect_reset_out(self) -> None:
        with self._out_message_mutex:
            owed = [m for m in self._out_messages.values()
                    if m.qos == 2 and m.state in _PUBREL_PHASE]
        super()._messages_reconnect_reset_out()
        if owed and not self._check_clean_session():
            with self._out_message_mutex:
                for m in owed:
                    m.state = mqtt.mqtt_ms_resend_pubrel


class PahoLink:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        pool: Any,
        client_id: str,
        host: str,
        port: int,
        *,
        version: str = "5.0",
        transport: str = "tcp",
        persistent: bool = False,
        keepalive: int = 10,
        ca_file: str | None = None,
        on_up: Callable[[bool], None] = lambda present: None,
        on_down: Callable[[str], None] = lambda why: None,
        on_message: Callable[[mqtt.MQTTMessage], None] = lambda m: None,
        on_acked: Callable[[int, bool], None] = lambda mid, ok: None,
    ) -> None:
        self.loop, self.pool = loop, pool
        self.host, self.port, self.keepalive = host, port, keepalive
        self.persistent = persistent
        self.v5 = version == "5.0"
        self.on_up, self.on_down = on_up, on_down
        self.on_message_cb, self.on_acked = on_message, on_acked
        self.closing = False
        self.connected = False
        self._connecting = False
        self._loop_thread = threading.get_ident()
        c = Client(
            CallbackAPIVersion.VERSION2, client_id=client_id,
            protocol=mqtt.MQTTv5 if self.v5 else mqtt.MQTTv311,
            transport="websockets" if transport in ("ws", "wss") else "tcp",
            clean_session=None if self.v5 else not persistent,
            reconnect_on_failure=False,
        )
        if transport in ("ws", "wss"):
            c.ws_set_options(path="/mqtt")
        self.tls = transport in ("tls", "wss")
        if self.tls:
            c.tls_set(ca_certs=ca_file, cert_reqs=ssl.CERT_REQUIRED)
        c.max_inflight_messages_set(64)
        c.max_queued_messages_set(0)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_publish = self._on_publish
        c.on_message = self._on_message
        c.on_socket_open = self._sock_open
        c.on_socket_close = self._sock_close
        c.on_socket_register_write = self._reg_write
        c.on_socket_unregister_write = self._unreg_write
        self.client = c
        _ALL.add(self)

    # -- loop plumbing ------------------------------------------------------------------
    def _post(self, fn: Callable[[], None]) -> None:
        if threading.get_ident() == self._loop_thread:
            fn()
        else:
            self.loop.call_soon_threadsafe(fn)

    def _read(self) -> None:
        c = self.client
        for _ in range(64):
            rc = c.loop_read()
            sock = c.socket()
            if rc or sock is None or not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                break

    def _sock_open(self, client: Any, userdata: Any, sock: Any) -> None:
        self._post(lambda: self.loop.add_reader(sock, self._read))

    def _sock_close(self, client: Any, userdata: Any, sock: Any) -> None:
        def rm() -> None:
            self.loop.remove_reader(sock)
            self.loop.remove_writer(sock)
        self._post(rm)

    def _reg_write(self, client: Any, userdata: Any, sock: Any) -> None:
        def add() -> None:
            self.loop.add_writer(sock, self.client.loop_write)
        self._post(add)

    def _unreg_write(self, client: Any, userdata: Any, sock: Any) -> None:
        def rm() -> None:
            self.loop.remove_writer(sock)
        self._post(rm)

    # -- paho callbacks -----------------------------------------------------------------
    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        def go() -> None:
            if rc.is_failure:
                self.connected = False
                self.on_down(f"connack {rc}")
                self.schedule_reconnect()
                return
            self.connected = True
            self.on_up(bool(flags.session_present))
        self._post(go)

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        def go() -> None:
            was = self.connected
            self.connected = False
            if was and not self.closing:
                self.on_down(f"disconnect {rc}")
            if not self.closing:
                self.schedule_reconnect()
        self._post(go)

    def _on_publish(self, client: Any, userdata: Any, mid: int, rc: Any, props: Any) -> None:
        ok = not (hasattr(rc, "is_failure") and rc.is_failure)
        self._post(lambda: self.on_acked(mid, ok))

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        self.on_message_cb(msg)

    # -- connecting ---------------------------------------------------------------------
    def _connect_blocking(self, first: bool) -> None:
        props = None
        if self.v5:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = 3600 if self.persistent else 0
        if first:
            self.client.connect(
                self.host, self.port, self.keepalive,
                clean_start=(not self.persistent) if self.v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
                properties=props)
        else:
            self.client.reconnect()

    async def connect(self, first: bool = True) -> None:
        if self._connecting or self.closing:
            return
        self._connecting = True
        try:
            await self.loop.run_in_executor(self.pool, self._connect_blocking, first)
        except Exception as e:  # refused, unreachable, timed out: try again later
            self.on_down(f"connect: {e!r}")
            self._connecting = False
            self.schedule_reconnect(first)
            return
        self._connecting = False

    def schedule_reconnect(self, first: bool = False) -> None:
        if self.closing:
            return
        delay = 0.5 + random.random()
        self.loop.call_later(delay, lambda: self.loop.create_task(self.connect(first)))

    def close(self) -> None:
        self.closing = True
        _ALL.discard(self)
        with contextlib.suppress(Exception):
            self.client.disconnect()


async def misc_loop(stop: asyncio.Event) -> None:
    """``loop_misc`` on every live client once a second, until ``stop``."""
    while not stop.is_set():
        for link in list(_ALL):
            if link.connected:
                link.client.loop_misc()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
