"""MQTT over WebSocket: a framing layer between the stream shell and an MQTT channel.

WebSocket is not a transport of its own here: a ``ws``/``wss`` listener is an ordinary
stream listener (:mod:`gateway.net.stream`, with TLS for ``wss``) whose channel is a
:class:`WebSocketChannel`. That wrapper runs the handshake and the framing with the
sans-IO protocol of the ``websockets`` library and hands the MQTT bytes to an unchanged
:class:`~protocols.mqtt.channel.MqttChannel`, wrapping the bytes the MQTT channel writes
into binary frames. So the stream shell's one effect loop (timers, the commit gate,
graceful close) serves WebSocket clients too, and nothing is duplicated.

Rules (EMQX's ``websocket`` listener options):
- The request path must be ``path`` (default ``/mqtt``; the query is ignored): 404 else.
- Sub-protocols: the first of ``subprotocols`` (``mqtt``, ``mqtt-v3.1.1``, ``mqtt-v3``,
  ``mqtt-v5``) that the client offers; when it offers none of them, 400 if
  ``fail_if_no_subprotocol``, else the connection goes on without one.
- Binary frames only: a text frame closes the connection (1003). Frames are a byte
  stream: one MQTT packet may span frames and one frame may carry several packets.
- ``check_origin``: the Origin header must be one of ``origins`` (403 else); a request
  without Origin passes when ``allow_origin_absence``.
- ``X-Forwarded-For``/``X-Forwarded-Port`` (header names configurable, "" disables) are
  honoured only when the TCP peer is in ``trusted_proxies``; the client is the right-most
  address of the list that is not itself a trusted proxy.

Invariants:
- The MQTT channel exists only after a successful handshake (101 written); a refused
  handshake writes its HTTP response and closes.
- Every ``bytes`` effect of the MQTT channel becomes one binary frame, in order; its
  Close becomes a close frame (1000) and then the shell's Close.
- Timers of this layer are named ``ws:...``; every other timer belongs to the inner
  channel.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from websockets.exceptions import NegotiationError
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Origin, Subprotocol

from gateway.net.stream import StreamChannel
from protocols.context import ConnectionHandle, Delivery
from protocols.effects import CancelTimer, Close, Effect, SetTimer, Unheld

log = logging.getLogger("gateway.net.websocket")
# the websockets library logs every opened connection at INFO: keep that at DEBUG level
_protocol_log = logging.getLogger("gateway.net.websocket.protocol")
_protocol_log.setLevel(logging.WARNING)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

HANDSHAKE_TIMER = "ws:handshake"
MQTT_SUBPROTOCOLS = ("mqtt", "mqtt-v3.1.1", "mqtt-v3", "mqtt-v5")


@dataclass(slots=True)
class WebSocketSettings:
    """One listener's WebSocket options (``[listeners.ws.<name>.websocket]``)."""

    path: str = "/mqtt"
    subprotocols: tuple[str, ...] = MQTT_SUBPROTOCOLS
    fail_if_no_subprotocol: bool = True
    check_origin: bool = False
    allow_origin_absence: bool = True
    origins: tuple[str, ...] = ()
    proxy_address_header: str = "x-forwarded-for"
    proxy_port_header: str = "x-forwarded-port"
    trusted_proxies: tuple[str, ...] = ("127.0.0.0/8", "::1/128")
    max_frame_size: int = 0  # bytes; 0 = no limit of its own (the MQTT packet limit holds)
    handshake_timeout: float = 15.0

    def networks(self) -> list[Network]:
        return [ipaddress.ip_network(n, strict=False) for n in self.trusted_proxies]


InnerFactory = Callable[[ConnectionHandle, tuple[str, int] | None], StreamChannel]


def _in(host: str, networks: Sequence[Network]) -> bool:
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return any(addr in n for n in networks)


def forwarded_peer(
    peer: tuple[str, int] | None,
    forwarded_for: str | None,
    forwarded_port: str | None,
    trusted: Sequence[Network],
) -> tuple[str, int] | None:
    """The client's address as a trusted reverse proxy reports it, else ``peer``."""
    if peer is None or not forwarded_for or not _in(peer[0], trusted):
        return peer
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    host: str | None = None
    for hop in reversed(hops):
        host = hop
        if not _in(hop, trusted):
            break
    if host is None:
        return peer
    if host.startswith("[") and "]" in host:  # "[v6]:port"
        host = host[1 : host.index("]")]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return peer  # not an address (e.g. "unknown" or an obfuscated node name)
    port = peer[1]
    if forwarded_port:
        last = forwarded_port.split(",")[-1].strip()
        if last.isdigit() and 0 < int(last) < 65536:
            port = int(last)
    return host, port


class _InnerHandle:
    """The ConnectionHandle the MQTT channel sees: the shell's, except that results
    computed later (``call_channel``) are framed on their way out."""

    __slots__ = ("shell", "outer")

    def __init__(self, shell: ConnectionHandle, outer: WebSocketChannel) -> None:
        self.shell = shell
        self.outer = outer

    def deliver(self, deliveries: list[Delivery]) -> None:
        self.shell.deliver(deliveries)  # -> WebSocketChannel.deliver -> framed

    def release(self, packet_id: int) -> None:
        self.shell.release(packet_id)

    def kick(self, reason_code: int) -> None:
        self.shell.kick(reason_code)

    def call_channel(self, fn: Callable[[], list[Effect]]) -> None:
        outer = self.outer
        self.shell.call_channel(lambda: outer.frame(fn()))


class WebSocketChannel:
    """A StreamChannel: WebSocket handshake and framing around an inner channel."""

    def __init__(
        self,
        settings: WebSocketSettings,
        shell: ConnectionHandle,
        peer: tuple[str, int] | None,
        inner_factory: InnerFactory,
        trusted: Sequence[Network] | None = None,
    ) -> None:
        self.settings = settings
        self.peer = peer
        self.inner_factory = inner_factory
        self.inner: StreamChannel | None = None
        self.handle = _InnerHandle(shell, self)
        self.trusted = settings.networks() if trusted is None else trusted
        self.subprotocol: str | None = None
        origins: list[Origin | None] | None = None
        if settings.check_origin:
            origins = [Origin(o) for o in settings.origins]
            if settings.allow_origin_absence:
                origins.append(None)
        max_size = settings.max_frame_size or None
        self.ws = ServerProtocol(
            origins=origins,
            subprotocols=[Subprotocol(p) for p in settings.subprotocols],
            select_subprotocol=self._selector(),
            max_size=(None, max_size),
            logger=_protocol_log,
        )
        self.closed = False
        self._eof = False  # websockets asked for the end of the stream

    # -- StreamChannel -----------------------------------------------------------------

    def connection_made(self) -> list[Effect]:
        return [SetTimer(HANDSHAKE_TIMER, self.settings.handshake_timeout)]

    def handle_data(self, data: bytes) -> list[Effect]:
        if self.closed:
            return []
        ws = self.ws
        ws.receive_data(data)
        out: list[Effect] = []
        # Every data frame that came before a close frame counts, even when they share
        # one read (websockets has already queued its answer to the close by now).
        for event in ws.events_received():
            if isinstance(event, Request):
                self._handshake(event, out)
            elif isinstance(event, Frame):
                self._frame_in(event, out)
            if self._done():
                return out
        self._flush(out)
        return out

    def _done(self) -> bool:
        return self.closed

    def on_timer(self, name: str) -> list[Effect]:
        if self.closed:
            return []
        if name == HANDSHAKE_TIMER:
            if self.inner is None:
                self.closed = True
                return [Close("websocket handshake timeout")]
            return []
        if self.inner is None:
            return []
        return self.frame(self.inner.on_timer(name))

    def connection_lost(self) -> None:
        self.closed = True
        if self.inner is not None:
            self.inner.connection_lost()

    def deliver(self, deliveries: list[Delivery]) -> list[Effect]:
        return [] if self.inner is None else self.frame(self.inner.deliver(deliveries))

    def release(self, packet_id: int) -> list[Effect]:
        return [] if self.inner is None else self.frame(self.inner.release(packet_id))

    def kick(self, reason_code: int) -> list[Effect]:
        if self.inner is None:
            self.closed = True
            return [Close("kicked")]
        return self.frame(self.inner.kick(reason_code))

    # -- framing -------------------------------------------------------------------

    def frame(self, effects: list[Effect]) -> list[Effect]:
        """The inner channel's effects with its writes framed (one binary frame per
        write) and its Close preceded by a close frame. A leading ``Unheld`` is recounted
        in the effects its inner effects became."""
        if self.closed or not effects:
            return []
        ws = self.ws
        out: list[Effect] = []
        unheld = 0  # inner effects the leading Unheld still covers
        first = effects[0]
        if type(first) is Unheld:
            out.append(first)
            unheld = first.count
            effects = effects[1:]
        for e in effects:
            if type(e) is bytes:
                if ws.state is State.OPEN:  # else the client closed: nothing goes out
                    ws.send_binary(e)
                    self._drain(out)
            elif type(e) is Unheld:
                continue  # not leading: it means nothing
            elif isinstance(e, Close):
                if ws.state is State.OPEN:
                    ws.send_close(1000)
                self._drain(out)
                self.closed = True
                out.append(e)
                if unheld:  # the close was among the covered effects
                    out[0] = Unheld(len(out) - 1)
                return out
            else:
                out.append(e)
            if unheld:
                unheld -= 1
                if not unheld:
                    out[0] = Unheld(len(out) - 1)
        return out

    def _drain(self, out: list[Effect]) -> None:
        """Bytes websockets wants written; its end-of-stream mark waits for ``_flush``."""
        for data in self.ws.data_to_send():
            if data:
                out.append(data)
            else:
                self._eof = True

    def _flush(self, out: list[Effect]) -> None:
        """Write what websockets queued; close when it marked the end of the stream."""
        self._drain(out)
        if self._eof and not self.closed:
            self.closed = True
            out.append(Close("websocket closed"))

    # -- handshake -----------------------------------------------------------------

    def _selector(
        self,
    ) -> Callable[[ServerProtocol, Sequence[Subprotocol]], Subprotocol | None]:
        # a plain function: websockets binds it to its ServerProtocol
        supported = self.settings.subprotocols
        fail = self.settings.fail_if_no_subprotocol

        def select(protocol: ServerProtocol, offered: Sequence[Subprotocol]) -> Subprotocol | None:
            for p in supported:
                if p in offered:
                    return Subprotocol(p)
            if fail:
                raise NegotiationError(
                    "no supported subprotocol offered; expected one of " + ", ".join(supported)
                )
            return None

        return select

    def _handshake(self, request: Request, out: list[Effect]) -> None:
        ws = self.ws
        path = request.path.split("?", 1)[0]
        if path != self.settings.path:
            response = ws.reject(404, f"no MQTT endpoint at {path}; use {self.settings.path}\n")
        else:
            response = ws.accept(request)
        ws.send_response(response)
        if response.status_code != 101:
            log.info(
                "websocket handshake from %s refused: %d %s",
                self.peer,
                response.status_code,
                (response.body or b"").decode(errors="replace").strip(),
            )
            self._flush(out)
            if not self.closed:
                self.closed = True
                out.append(Close("websocket handshake refused"))
            return
        self._flush(out)
        out.append(CancelTimer(HANDSHAKE_TIMER))
        self.subprotocol = response.headers.get("Sec-WebSocket-Protocol")
        s = self.settings
        headers = request.headers
        peer = self.peer
        if s.proxy_address_header:
            peer = forwarded_peer(
                peer,
                headers.get(s.proxy_address_header),
                headers.get(s.proxy_port_header) if s.proxy_port_header else None,
                self.trusted,
            )
        self.inner = self.inner_factory(self.handle, peer)
        out.extend(self.frame(self.inner.connection_made()))

    # -- frames in -----------------------------------------------------------------

    def _frame_in(self, frame: Frame, out: list[Effect]) -> None:
        inner = self.inner
        if frame.opcode is Opcode.BINARY or frame.opcode is Opcode.CONT:
            if inner is not None and frame.data:
                out.extend(self.frame(inner.handle_data(bytes(frame.data))))
        elif frame.opcode is Opcode.TEXT:
            log.warning("websocket client %s sent a text frame; closing", self.peer)
            self.ws.fail(1003, "MQTT needs binary frames")
            self._flush(out)
            if not self.closed:
                self.closed = True
                out.append(Close("text frame"))
        elif frame.opcode is Opcode.CLOSE:
            self._flush(out)  # websockets answered the close frame
            if not self.closed:
                self.closed = True
                out.append(Close("websocket closed by client"))
