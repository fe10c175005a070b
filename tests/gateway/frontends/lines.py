"""A line-telemetry front-end: the worked example of docs/adding-a-frontend.md.

Each line a device writes on a TCP connection, ``<topic> <payload>\n``, is published at
QoS 0 by a client named ``lines-<host>-<port>``. One module holds the channel (sans-IO, on
the shared channel base) and the front-end declaration; the registry gets one line.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from gateway.config import GatewayConfig
from gateway.frontends.base import Assembly, FrontEnd, ListenerSpec
from protocols.channel_base import ChannelBase
from protocols.context import ClientInfo, ConnectionHandle, Delivery, GatewayContext, Message
from protocols.effects import Close, Effect

MAX_LINE = 4096  # a longer line closes the connection


class State(Enum):
    NEW = "new"
    AUTHENTICATING = "authenticating"
    OPEN = "open"
    CLOSED = "closed"


class LineChannel(ChannelBase):
    LABEL = "lines"
    CLOSED = State.CLOSED
    AUTHENTICATING = State.AUTHENTICATING

    def __init__(self, context: GatewayContext, handle: ConnectionHandle,
                 peer: tuple[str, int] | None, monotonic: Callable[[], float],
                 listener: str) -> None:
        super().__init__(context, handle, peer, monotonic)
        self.state: State = State.NEW
        self.listener = listener
        self.buffer = b""

    # the stream shell's entry points
    def connection_made(self) -> list[Effect]:
        outer = self._enter()
        host, port = self.peer or ("?", 0)
        info = ClientInfo(f"lines-{host}-{port}", protocol="lines", peer_host=host,
                          peer_port=port, listener=self.listener)
        self._start_auth(info, None)  # anonymous: allow_anonymous decides
        return self._leave(outer)

    def handle_data(self, data: bytes) -> list[Effect]:
        if self.state is not State.OPEN:
            return []
        outer = self._enter()
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        for line in lines:
            topic, _, payload = line.decode(errors="replace").partition(" ")
            if topic:
                assert self.info is not None
                self.context.publish(self.info, Message(topic, payload.encode(),
                                                        publisher=self.info.client_id))
        if len(self.buffer) > MAX_LINE:
            self._close("line too long")
        return self._leave(outer)

    def on_timer(self, name: str) -> list[Effect]:
        return []

    def connection_lost(self) -> None:
        self.state = State.CLOSED
        self._notify_core_closed()

    def deliver(self, deliveries: list[Delivery]) -> list[Effect]:
        return []  # it never subscribes

    def release(self, packet_id: int) -> list[Effect]:
        return []

    # what the channel base asks of every channel
    def _auth_done(self, info: ClientInfo, code: int) -> None:
        if code != 0:
            self._close(f"not authorized (0x{code:02X})")
            return
        result = self.context.open_session(info, self.handle, clean_start=True,
                                           expiry_interval=0, receive_maximum=1,
                                           will=None, will_delay=0)
        if result.reason_code != 0:
            self._close(f"refused (0x{result.reason_code:02X})")
            return
        self.session = result.session
        self.state = State.OPEN

    def _close(self, reason: str) -> None:
        self._notify_core_closed()
        self.state = State.CLOSED
        self._out.append(Close(reason))


# ----------------------------------------------------------------- the front-end

def _listeners(config: GatewayConfig) -> list[ListenerSpec]:
    return list(LISTENERS)


def _channel(assembly: Assembly, spec: ListenerSpec, state: None) -> Callable[..., Any]:
    node, monotonic = assembly.node, assembly.monotonic

    def make(shell: ConnectionHandle, peer: tuple[str, int] | None) -> LineChannel:
        return LineChannel(node, shell, peer, monotonic, spec.id)

    return make


FRONTEND = FrontEnd(
    protocol="lines",
    transport="stream",
    kinds=("tcp",),
    listeners=_listeners,
    channel=_channel,
    label=lambda config, spec: "line telemetry",
)

# Where its listeners come from. A real front-end reads its own settings section
# (``config.gateway.lines``, a model added to gateway/config/gateways.py); the test
# sets this list instead.
LISTENERS: list[ListenerSpec] = []
