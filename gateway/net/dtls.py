"""DTLS for datagram front-ends: a channel that terminates DTLS and carries an inner one.

:class:`DtlsChannel` sits between the datagram shell and an unchanged inner datagram
channel (CoAP), as the WebSocket framing channel sits between the stream shell and the
MQTT channel. It uses python-mbedtls' sans-IO ``TLSWrappedBuffer`` (``wrap_buffers``):
ciphertext datagrams in, plaintext datagrams to the inner channel; the inner channel's
``bytes`` effects are sealed into DTLS records, one datagram each; every other effect
passes through. The socket stays the shell's, so listener limits, the durability gate and
the effect loop apply unchanged.

Rules:
- A new address gets a HelloVerifyRequest (cookie bound to its address and port) before
  any handshake state is kept for it; a handshake that does not finish within
  ``handshake_timeout`` closes the peer.
- The inner channel is created when the handshake is over (its idle timers start then).
- Its ``ConnectionHandle`` is a proxy: results computed later (``call_channel``) are sealed
  like everything else, never written in the clear.
- A close_notify, a bad record or a failed handshake (unknown PSK identity, wrong key)
  closes the peer; other peers are not touched.

Only pre-shared keys are configured today (``psk_file``: ``identity:secret`` lines, the
format of EMQX's PSK file); certificates are not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from protocols.context import ConnectionHandle, Delivery
from protocols.effects import Close, Effect, SetTimer

log = logging.getLogger("gateway.net.dtls")

Address = tuple[str, int]
HANDSHAKE_TIMER = "dtls:handshake"


class DtlsError(Exception):
    pass


def load_psk_file(path: str | Path) -> dict[str, bytes]:
    """``identity:secret`` per line (``#`` comments and blank lines ignored)."""
    out: dict[str, bytes] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        ident, sep, secret = line.partition(":")
        if not sep or not ident or not secret:
            raise DtlsError(f"{path}:{n}: expected identity:secret")
        out[ident] = secret.encode()
    return out


def server_context(psk: Mapping[str, bytes]) -> Any:
    """A python-mbedtls DTLS server context for these pre-shared keys."""
    try:
        from mbedtls.tls import DTLSConfiguration, ServerContext
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise DtlsError("DTLS needs python-mbedtls (pip install python-mbedtls)") from exc
    if not psk:
        raise DtlsError("a DTLS listener needs at least one pre-shared key")
    conf = DTLSConfiguration(pre_shared_key_store=dict(psk), validate_certificates=False)
    return ServerContext(conf)


class _InnerHandle:
    """The inner channel's ConnectionHandle: everything goes through the DTLS channel."""

    def __init__(self, outer: DtlsChannel) -> None:
        self.outer = outer

    def deliver(self, deliveries: list[Delivery]) -> None:
        self.outer.handle.deliver(deliveries)

    def release(self, packet_id: int) -> None:
        self.outer.handle.release(packet_id)

    def kick(self, reason_code: int) -> None:
        self.outer.handle.kick(reason_code)

    def call_channel(self, fn: Callable[[], list[Effect]]) -> None:
        outer = self.outer
        outer.handle.call_channel(lambda: outer._seal(fn()))


class DtlsChannel:
    def __init__(
        self,
        context: Any,
        handle: ConnectionHandle,
        addr: Address,
        inner_factory: Callable[[ConnectionHandle, Address], Any],
        *,
        handshake_timeout: float = 30.0,
    ) -> None:
        from mbedtls.tls import (
            HandshakeStep,
            HelloVerifyRequest,
            WantReadError,
            WantWriteError,
        )

        self._over = HandshakeStep.HANDSHAKE_OVER
        self._hvr = HelloVerifyRequest
        self._want_read = WantReadError
        self._want_write = WantWriteError
        self.context = context
        self.handle = handle
        self.addr = addr
        self.inner_factory = inner_factory
        self.handshake_timeout = handshake_timeout
        self.buffer = self._new_buffer()
        self.inner: Any = None
        self.closed = False

    def _new_buffer(self) -> Any:
        buf = self.context.wrap_buffers()
        buf.setcookieparam(f"{self.addr[0]}:{self.addr[1]}".encode())
        return buf

    # -- DatagramChannel ------------------------------------------------------------

    def connection_made(self) -> list[Effect]:
        return [SetTimer(HANDSHAKE_TIMER, self.handshake_timeout)]

    def handle_datagram(self, data: bytes) -> list[Effect]:
        if self.closed:
            return []
        out: list[Effect] = []
        buf = self.buffer
        try:
            buf.receive_from_network(data)
            if self.inner is None:
                if not self._handshake(out):
                    return out
                self.inner = self.inner_factory(_InnerHandle(self), self.addr)
                out.extend(self._seal(self.inner.connection_made()))
            while not self.closed:
                try:
                    plain = buf.read(65536)
                except self._want_read:
                    break
                if not plain:
                    break
                out.extend(self._seal(self.inner.handle_datagram(bytes(plain))))
        except Exception as exc:  # mbedtls TLSError: close_notify, bad record, bad PSK
            if self._is_tls_error(exc):
                log.info("dtls peer %s:%d: %s", self.addr[0], self.addr[1], exc)
                self._drain(out)
                self.closed = True  # no close_notify after an error
                out.append(Close("dtls: closed by peer or failed"))
                return out
            raise
        return out

    def on_timer(self, name: str) -> list[Effect]:
        if name == HANDSHAKE_TIMER:
            if self.inner is None and not self.closed:
                self.closed = True
                return [Close("dtls: handshake timeout")]
            return []
        if self.inner is None:
            return []
        return self._seal(self.inner.on_timer(name))

    def connection_lost(self) -> None:
        self.closed = True
        if self.inner is not None:
            self.inner.connection_lost()

    def deliver(self, deliveries: list[Delivery]) -> list[Effect]:
        if self.inner is None:
            return []
        return self._seal(self.inner.deliver(deliveries))

    def release(self, packet_id: int) -> list[Effect]:
        return [] if self.inner is None else self._seal(self.inner.release(packet_id))

    def kick(self, reason_code: int) -> list[Effect]:
        if self.inner is None:
            self.closed = True
            return [Close(f"kicked (0x{reason_code:02X})")]
        return self._seal(self.inner.kick(reason_code))

    # -- DTLS -------------------------------------------------------------------------

    @staticmethod
    def _is_tls_error(exc: Exception) -> bool:
        return type(exc).__module__.startswith("mbedtls")

    def _handshake(self, out: list[Effect]) -> bool:
        """Advance the handshake; True when it is over."""
        buf = self.buffer
        while buf._handshake_state is not self._over:
            try:
                buf.do_handshake()
            except self._want_read:
                break
            except self._want_write:
                self._drain(out)
            except self._hvr:
                # a ClientHello without a valid cookie: answer, keep no state
                self._drain(out)
                self.buffer = self._new_buffer()
                return False
        self._drain(out)
        if buf._handshake_state is self._over:
            log.debug("dtls peer %s:%d: handshake done", *self.addr)
            return True
        return False

    def _drain(self, out: list[Effect]) -> None:
        buf = self.buffer
        while True:
            data = buf.peek_outgoing(65536)
            if not data:
                return
            buf.consume_outgoing(len(data))
            out.append(bytes(data))

    def _seal(self, effects: list[Effect]) -> list[Effect]:
        out: list[Effect] = []
        if self.closed:
            return out
        for e in effects:
            if isinstance(e, bytes):
                self.buffer.write(e)
                self._drain(out)
            elif isinstance(e, Close):
                out.extend(self._close(e.reason))
                break
            else:
                out.append(e)
        return out

    def _close(self, reason: str) -> list[Effect]:
        """close_notify (when the session allows one), then Close."""
        out: list[Effect] = []
        if not self.closed:
            self.closed = True
            try:
                self.buffer.shutdown()
                self._drain(out)
            except Exception:  # nothing to tell a broken peer
                pass
        out.append(Close(reason))
        return out
