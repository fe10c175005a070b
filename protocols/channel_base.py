"""The plumbing every datagram front-end channel (CoAP, LwM2M, MQTT-SN) shares, sans-IO.

:class:`ChannelBase` holds what such a channel needs to talk to the core and to return its
effects: the context, the connection handle, the peer, the client's
:class:`~protocols.context.ClientInfo` and session once it has one, the effects being
gathered, the re-entrancy guard and whether the core has been told of the end. Each
channel keeps its own state machine (``state``, a ``State`` enum whose ``CLOSED`` and
``AUTHENTICATING`` members the class attributes of those names point to) and everything
protocol-specific. The base also asks the core to authenticate (``_start_auth``) and takes
an answer that had to wait (``auth_result``); the channel's ``_auth_done`` acts on it.

Invariants:
- Effects are returned only by the outermost call: an entry point that runs while
  another of the same channel is running (the core delivering to this very client while
  its own datagram is handled, e.g. retained messages after a subscribe) appends its
  effects to the outer call's list, in order, and returns ``[]``.
- A closed channel (``state is CLOSED``) emits nothing more: ``kick`` returns ``[]``,
  and every other entry point of the channel checks the same.
- An authentication answer is acted on only while the channel still waits for it
  (state AUTHENTICATING, the same ``ClientInfo``).
- Authorization may answer later (``_authorize``): while a decision is pending
  (``_authz``), the peer's datagrams (``_hold``, at most :data:`MAX_HELD`; more are
  dropped and counted) and later decisions of this channel wait behind it, and run in
  their order once the answer is there (``authz_result``, via ``call_channel``). A
  client's publishes and subscriptions thus keep their order; other peers are not held
  up. Decisions known at once (rules, the cache) act at once.
- The core learns of the end of a session exactly once (``context.close``, without the
  will: each channel publishes its will itself where its protocol has one); a ``kick``
  comes from the core, which has ended the session already, so it is not told again.

The MQTT channel (``protocols/mqtt/channel.py``) has the same plumbing but keeps its own
copy: it is the hot path, with ``__slots__`` of its own and a ``send_will`` argument.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import Enum
from typing import ClassVar

from protocols.context import (
    AUTH_PENDING,
    ClientInfo,
    ConnectionHandle,
    GatewayContext,
    PendingDecision,
    SessionAPI,
)
from protocols.effects import Effect

log = logging.getLogger("protocols")

MAX_HELD = 64
"""Datagrams a peer may send while one of its authorization decisions is pending."""


class _AuthzWait:
    """A pending decision, what acts on it, and what came after it, in order: a datagram
    (``bytes``) or a later decision (``(info, action, topic, then)``)."""

    __slots__ = ("dropped", "later", "pending", "then")

    def __init__(self, pending: PendingDecision, then: Callable[[bool], None]) -> None:
        self.pending = pending
        self.then = then
        self.later: list[bytes | tuple[ClientInfo, str, str, Callable[[bool], None]]] = []
        self.dropped = 0  # datagrams beyond MAX_HELD (logged once per wait)


class ChannelBase:
    """The shared part of a datagram front-end channel (see the module docstring)."""

    __slots__ = (
        "context",
        "handle",
        "peer",
        "info",
        "session",
        "state",
        "_monotonic",
        "_out",
        "_busy",
        "_core_closed",
        "_authz",
    )

    LABEL: ClassVar[str]  # the protocol in log lines: "coap", "mqtt-sn", ...
    CLOSED: ClassVar[Enum]  # the channel's State.CLOSED
    AUTHENTICATING: ClassVar[Enum]  # the channel's State.AUTHENTICATING

    state: Enum

    def __init__(
        self,
        context: GatewayContext,
        handle: ConnectionHandle,
        peer: tuple[str, int] | None,
        monotonic: Callable[[], float],
    ) -> None:
        self.context = context
        self.handle = handle
        self.peer = peer
        self._monotonic = monotonic
        self.info: ClientInfo | None = None
        self.session: SessionAPI | None = None
        self._out: list[Effect] = []
        self._busy = False
        self._core_closed = False
        self._authz: _AuthzWait | None = None

    # -- entry point from the core -------------------------------------------------------

    def kick(self, reason_code: int) -> list[Effect]:
        """The core closes us (takeover, admin kick, shutdown); it has ended the session."""
        if self.state is self.CLOSED:
            return []
        outer = self._enter()
        self._core_closed = True
        self._kicked(reason_code)
        return self._leave(outer)

    def _kicked(self, reason_code: int) -> None:
        """What a kick does (inside ``kick``'s guard): close, saying why."""
        self._close(f"kicked (0x{reason_code:02X})")

    def _close(self, reason: str) -> None:  # pragma: no cover - every channel has its own
        raise NotImplementedError

    def auth_result(self, info: ClientInfo, code: int) -> list[Effect]:
        """An authentication that had to wait has its answer (via ``call_channel``); an
        answer for a client this channel no longer authenticates is dropped."""
        if self.state is not self.AUTHENTICATING or self.info is not info:
            return []
        outer = self._enter()
        self._auth_done(info, code)
        return self._leave(outer)

    # -- authorization -------------------------------------------------------------------

    def _authorize(
        self, info: ClientInfo, action: str, topic: str, then: Callable[[bool], None]
    ) -> None:
        """``then(allowed)`` with the core's decision: now, or once it is known (see the
        module docstring); behind any decision still pending."""
        wait = self._authz
        if wait is not None:
            wait.later.append((info, action, topic, then))
            return
        allowed = self.context.authorize(info, action, topic, True)
        if allowed is True or allowed is False:
            then(allowed)
            return
        self._authz = _AuthzWait(allowed, then)
        handle = self.handle
        pending = allowed

        def answered(ok: bool) -> None:
            handle.call_channel(lambda: self.authz_result(pending, ok))

        allowed.add_callback(answered)

    def _hold(self, data: bytes) -> bool:
        """True when ``data`` must wait for a pending decision (kept, or dropped when
        :data:`MAX_HELD` are waiting already)."""
        wait = self._authz
        if wait is None:
            return False
        if len(wait.later) < MAX_HELD:
            wait.later.append(data)
        else:
            self.context.incr("packets.dropped.authz_pending")
            wait.dropped += 1
            if wait.dropped == 1:
                log.warning("%s: datagrams dropped: %d wait for an authorization decision "
                            "already", self._who(), MAX_HELD)
        return True

    def authz_result(self, pending: PendingDecision, allowed: bool) -> list[Effect]:
        """A pending decision has its answer: act on it, then on what waited behind it,
        in order, until another decision has to wait."""
        wait = self._authz
        if self.state is self.CLOSED or wait is None or wait.pending is not pending:
            return []
        outer = self._enter()
        self._authz = None
        wait.then(allowed)
        later = wait.later
        for i, item in enumerate(later):
            if self.state is self.CLOSED:
                break
            again = self._waiting_on()
            if again is not None:  # waiting again: the rest stays behind, in order
                again.later.extend(later[i:])
                break
            if isinstance(item, bytes):
                self._replay(item)
            else:
                self._authorize(*item)
        return self._leave(outer)

    def _waiting_on(self) -> _AuthzWait | None:
        return self._authz

    def _replay(self, data: bytes) -> None:  # pragma: no cover - every channel has its own
        """Handle a datagram that waited (inside an entry point's guard)."""
        raise NotImplementedError

    # -- authentication ------------------------------------------------------------------

    def _start_auth(self, info: ClientInfo, password: bytes | None) -> None:
        """Ask the core whether ``info`` may connect, in state AUTHENTICATING:
        ``_auth_done(info, code)`` runs now, or later through ``handle.call_channel``
        (``auth_result``) when the answer has to wait."""
        self.info = info
        self.state = self.AUTHENTICATING
        handle = self.handle

        def later(code: int) -> None:
            handle.call_channel(lambda: self.auth_result(info, code))

        code = self.context.authenticate(info, password, later)
        if code != AUTH_PENDING:
            self._auth_done(info, code)

    def _auth_done(self, info: ClientInfo, code: int) -> None:  # pragma: no cover
        """The core's answer (0: accepted); every channel has its own."""
        raise NotImplementedError

    # -- effects and re-entrancy ---------------------------------------------------------

    def _enter(self) -> bool:
        """Start an entry point; True when it is the outermost one (see ``_leave``)."""
        if self._busy:
            return False
        self._busy = True
        return True

    def _leave(self, outer: bool) -> list[Effect]:
        """End an entry point: the outermost returns every effect gathered, others none."""
        if not outer:
            return []
        self._busy = False
        out, self._out = self._out, []
        return out

    # -- the core ------------------------------------------------------------------------

    def _set_reason(self, reason: str) -> None:
        """Why the session ends, for ``client.disconnected`` (the rules' ``reason``, the
        ``reason`` of ``$SYS/.../disconnected``), in EMQX's words (``keepalive_timeout``,
        ``asleep_timeout``, ``deregistered``, ...). The first reason given wins: the core
        names a takeover (``takenover``/``discarded``), the admin API a kick, before the
        channel hears of it."""
        if self.info is not None and reason and "disconnect_reason" not in self.info.attrs:
            self.info.set_attr("disconnect_reason", reason)

    def _notify_core_closed(self) -> None:
        """Tell the core the session ended (once; nothing when there is none)."""
        if self._core_closed or self.info is None or self.session is None:
            return
        self._core_closed = True
        self.context.close(self.info, self.handle, send_will=False)

    # -- logging -------------------------------------------------------------------------

    def _who(self) -> str:
        if self.info is not None:
            return f"{self.LABEL} client {self.info.client_id!r}"
        return self._peer_name()

    def _peer_name(self) -> str:
        peer = self.peer
        return f"{self.LABEL} peer {peer[0]}:{peer[1]}" if peer else f"{self.LABEL} peer"

