"""What a front-end declares, and what it is handed when its listeners are opened.

A front-end (MQTT over TCP/TLS, MQTT over WebSocket, MQTT-SN, CoAP, LwM2M) is one
:class:`FrontEnd` value in its own module of :mod:`gateway.frontends`. It declares:

- ``protocol``: what its listeners speak (``ListenerEntry.protocol``: ``mqtt``,
  ``mqttsn``, ``coap``, ``lwm2m``), and ``transport``: ``stream`` (TCP, TLS) or
  ``datagram`` (UDP, DTLS);
- ``kinds``: its listener kinds (``tcp``, ``ssl``, ``ws``, ``wss``, ``udp``, ``dtls``);
- ``listeners(config)``: its settings section read into the enabled listeners, as
  :class:`ListenerSpec` values, in the order they are to be opened (none when the
  section is absent or disabled);
- ``channel(assembly, spec, state)``: the channel factory of one listener. For a
  stream listener it is the stream shell's factory ``(shell, peer) -> channel``; for a
  UDP listener the datagram shell's ``(peer, addr) -> channel``; for a DTLS listener
  the inner factory ``(handle, addr, identity) -> channel``, which the assembly wraps
  in :class:`gateway.net.dtls.DtlsChannel`;
- optionally ``prepare(assembly)`` (state the listeners share, made once before the
  first one opens: the LwM2M registry), ``label(config, spec)`` (the listener's log
  line) and ``opened(assembly, spec, listener)`` (after it opened: MQTT-SN's ADVERTISE).

Transport details that are the same for every front-end (listener limits, TLS contexts
reloaded by SIGHUP, DTLS servers, the address the socket got, the listener registry of
the management API) live in :mod:`gateway.frontends.listen`, not here.

Invariants: a front-end never opens a socket itself; the assembly opens every listener.
Datagram front-ends run in worker 0 of a multi-worker node only (a UDP peer needs one
home), so their ``prepare`` runs there only.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.config import GatewayConfig
from gateway.core.node import Node
from gateway.store.sessions import SessionStore

log = logging.getLogger("gateway")

Transport = Literal["stream", "datagram"]


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    """One enabled listener of a front-end, as its settings section declares it."""

    kind: str  # "tcp", "ssl", "ws", "wss", "udp", "dtls" (ListenerEntry.type)
    name: str  # the key of its table: [listeners.tcp.<name>], [gateway.coap.listeners.udp.<name>]
    id: str  # "tcp:default", "mqttsn:udp:default": log lines, limits, Gateway.listeners key
    where: str  # its configuration path, for error messages
    config: Any  # its listener section: TcpListener, SslListener, ..., DtlsListener
    secure: bool = False  # TLS (stream) or DTLS (datagram)
    options: dict[str, Any] = field(default_factory=dict)  # transport options: allow_broadcast


class Assembly:
    """What a front-end gets to build its channels: the node, the configuration, the
    node's store (``gateway.db``; None without durability), the loop's clock, and
    repeating timers that the gateway cancels when it stops."""

    def __init__(
        self, node: Node, config: GatewayConfig, store: SessionStore | None = None
    ) -> None:
        self.node = node
        self.config = config
        self.store = store
        self.loop = asyncio.get_running_loop()
        self.monotonic: Callable[[], float] = self.loop.time
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._ids = itertools.count()
        self._closed = False

    def every(self, interval: float, fn: Callable[[], bool | None]) -> None:
        """Call ``fn`` now and then every ``interval`` seconds until :meth:`close`, or
        until ``fn`` returns False."""
        key = next(self._ids)

        def tick() -> None:
            self._timers.pop(key, None)
            if self._closed or fn() is False:
                return
            self._timers[key] = self.loop.call_later(interval, tick)

        tick()

    def close(self) -> None:
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


ChannelMaker = Callable[[Assembly, ListenerSpec, Any], Callable[..., Any]]


def _no_state(assembly: Assembly) -> None:
    return None


def _default_label(config: GatewayConfig, spec: ListenerSpec) -> str:
    return spec.kind


@dataclass(frozen=True, slots=True)
class FrontEnd:
    """One protocol front-end: a row of the registry (see the module docstring)."""

    protocol: str
    transport: Transport
    kinds: tuple[str, ...]
    listeners: Callable[[GatewayConfig], list[ListenerSpec]]
    channel: ChannelMaker
    prepare: Callable[[Assembly], Any] = _no_state
    label: Callable[[GatewayConfig, ListenerSpec], str] = _default_label
    opened: Callable[[Assembly, ListenerSpec, Any], None] | None = None


def enabled(
    where: str, tables: list[tuple[str, dict[str, Any]]], *, prefix: str = "",
    secure: tuple[str, ...] = (), options: dict[str, Any] | None = None,
) -> list[ListenerSpec]:
    """The enabled listeners of ``tables`` (``[(kind, {name: listener})]``), in order.

    ``where`` is the configuration path of the tables (``listeners``,
    ``gateway.coap.listeners``); ``prefix`` goes before the listener id (``coap:`` for
    ``coap:udp:default``); ``secure`` names the kinds that carry TLS or DTLS."""
    return [
        ListenerSpec(kind, name, f"{prefix}{kind}:{name}", f"{where}.{kind}.{name}", lst,
                     kind in secure, dict(options or {}))
        for kind, table in tables
        for name, lst in table.items()
        if lst.enable
    ]
