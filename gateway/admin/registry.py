"""What the management API needs to know about the node's listeners.

``Gateway.listeners`` maps a listener id (``"tcp:default"``, ``"ssl:default"``,
``"ws:default"``, ``"udp:mqttsn"``...) to a :class:`ListenerEntry`. Whoever opens a
listener in :mod:`gateway.app` registers it there, so ``/api/v5/listeners``,
``gatewayctl listeners``, the Prometheus listener gauges and the systemd STATUS line
see every front-end without knowing how it was built.

``limits`` is duck-typed (:class:`gateway.net.stream.ListenerLimits` fits): anything
with ``current`` (connections now), ``refused`` (connections refused on accept) and
``max_connections`` (0 = unlimited).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class LimitsView(Protocol):
    @property
    def current(self) -> int: ...
    @property
    def refused(self) -> int: ...
    @property
    def max_connections(self) -> int: ...


@dataclass(slots=True)
class ListenerEntry:
    """One open listener. ``type`` is the transport (``tcp``, ``ssl``, ``ws``, ``wss``,
    ``udp``, ``dtls``), ``protocol`` what it speaks (``mqtt``, ``mqttsn``, ``coap``,
    ``lwm2m``), ``bind`` the configured address and ``addresses`` the bound ones."""

    type: str
    name: str
    protocol: str
    bind: str
    limits: LimitsView | None = None
    addresses: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.type}:{self.name}"

    @property
    def current_connections(self) -> int:
        return self.limits.current if self.limits is not None else 0

    @property
    def refused_connections(self) -> int:
        return self.limits.refused if self.limits is not None else 0

    @property
    def max_connections(self) -> int:
        return self.limits.max_connections if self.limits is not None else 0


def format_address(addr: Any) -> str:
    """``("127.0.0.1", 1883)`` -> ``"127.0.0.1:1883"``; IPv6 in brackets."""
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
