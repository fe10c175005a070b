"""Banned clients, enforced: an in-memory index checked on every CONNECT.

:class:`BanGuard` subscribes to ``client.authenticate`` at ``Priority.HIGHEST`` and ends
the chain with ``Stop(0x8A)`` for a banned client, before any authentication backend
runs, so it gets CONNACK 0x8A (MQTT 5) or return code 5 (3.1.1). Bans live in the SQLite
store (:class:`~gateway.store.banned.BannedStore`), or only in memory without one.

Invariants:
- The index holds the store's bans in force when it was last loaded, plus those added
  through this guard since; an expired ban never matches, whether or not it was purged.
- Every ``poll_interval`` seconds the guard asks the store whether the bans changed
  (``PRAGMA data_version``, then the table's change counter): a ban added by ``gatewayctl``
  takes effect within one interval, without a restart. A poll costs one PRAGMA when
  nothing changed.
- When a ban appears (through :meth:`BanGuard.ban` or a poll), connected clients it
  matches are kicked: their session is closed without their will, and an MQTT 5 client
  gets DISCONNECT 0x98 (administrative action; DISCONNECT has no "banned" code).
- MQTT 5 enhanced authentication (SCRAM) does not run the ``client.authenticate``
  chain, so the guard also wraps the factories in ``node.auth_methods``: a banned client
  starting an exchange gets an exchange whose first step refuses it with 0x8A.
- Everything runs on the event loop thread (the store connection is the guard's own).
"""

from __future__ import annotations

import ipaddress
import logging
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gateway.core.clock import TimerHandle
from gateway.core.hooks import Priority, Stop
from gateway.core.node import Node
from gateway.store.banned import Ban, BannedStore, normalise
from protocols.context import AuthExchange, AuthStep, ClientInfo
from protocols.mqtt.reason_codes import ReasonCode

__all__ = ["BanGuard", "BanIndex"]

log = logging.getLogger("gateway.protect")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

PURGE_INTERVAL = 60.0  # seconds between deletions of expired bans from the store


def _address(host: str | None) -> Address | None:
    if not host:
        return None
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped  # a v4 peer on a dual-stack listener
    return addr


class BanIndex:
    """Bans by kind, for a lookup per CONNECT: three dict probes and a scan of the
    (usually few) CIDR bans."""

    __slots__ = ("clientid", "username", "peerhost", "cidr")

    def __init__(self, bans: Iterable[Ban] = ()) -> None:
        self.clientid: dict[str, Ban] = {}
        self.username: dict[str, Ban] = {}
        self.peerhost: dict[Address, Ban] = {}
        self.cidr: dict[Network, Ban] = {}
        for ban in bans:
            self.add(ban)

    def __len__(self) -> int:
        return len(self.clientid) + len(self.username) + len(self.peerhost) + len(self.cidr)

    def add(self, ban: Ban) -> None:
        kind, value = normalise(ban.kind, ban.value)
        if kind == "clientid":
            self.clientid[value] = ban
        elif kind == "username":
            self.username[value] = ban
        elif kind == "peerhost":
            addr = _address(value)
            assert addr is not None
            self.peerhost[addr] = ban
        else:
            self.cidr[ipaddress.ip_network(value)] = ban

    def remove(self, kind: str, value: str) -> bool:
        kind, value = normalise(kind, value)
        if kind == "clientid":
            return self.clientid.pop(value, None) is not None
        if kind == "username":
            return self.username.pop(value, None) is not None
        if kind == "peerhost":
            return self.peerhost.pop(_address(value), None) is not None  # type: ignore[arg-type]
        return self.cidr.pop(ipaddress.ip_network(value), None) is not None

    def match(
        self, client_id: str | None, username: str | None, peer_host: str | None, now: float
    ) -> Ban | None:
        """The ban in force at ``now`` that applies to this client, if any."""
        found: Ban | None
        if client_id is not None:
            found = self.clientid.get(client_id)
            if found is not None and not found.expired(now):
                return found
        if username is not None:
            found = self.username.get(username)
            if found is not None and not found.expired(now):
                return found
        if self.peerhost or self.cidr:
            addr = _address(peer_host)
            if addr is not None:
                found = self.peerhost.get(addr)
                if found is not None and not found.expired(now):
                    return found
                for net, ban in self.cidr.items():
                    if addr.version == net.version and addr in net and not ban.expired(now):
                        return ban
        return None

    def drop_expired(self, now: float) -> int:
        """Forget the bans that ended; how many."""
        dropped = 0
        tables: tuple[dict[Any, Ban], ...] = (
            self.clientid, self.username, self.peerhost, self.cidr
        )
        for table in tables:
            gone = [k for k, b in table.items() if b.expired(now)]
            for k in gone:
                del table[k]
            dropped += len(gone)
        return dropped


class _Refused:
    """The exchange a banned client gets: refused at the first step."""

    def step(self, data: bytes | None) -> AuthStep:
        return AuthStep(int(ReasonCode.BANNED), None, "banned")


class _BanCheckedMethods(dict[str, Callable[[ClientInfo], AuthExchange]]):
    """``node.auth_methods`` whose factories check bans first (module docstring)."""

    def __init__(
        self, guard: BanGuard, methods: Mapping[str, Callable[[ClientInfo], AuthExchange]]
    ) -> None:
        super().__init__(methods)
        self.guard = guard

    def _checked(
        self, factory: Callable[[ClientInfo], AuthExchange]
    ) -> Callable[[ClientInfo], AuthExchange]:
        guard = self.guard

        def checked(client: ClientInfo) -> AuthExchange:
            if guard.match(client) is not None:
                guard.node.metrics.incr("client.banned")
                return _Refused()
            return factory(client)

        return checked

    def __getitem__(self, method: str) -> Callable[[ClientInfo], AuthExchange]:
        return self._checked(super().__getitem__(method))

    def get(self, method: str, default: Any = None) -> Any:
        factory = super().get(method)
        return default if factory is None else self._checked(factory)


class BanGuard:
    """Enforces bans on a node (module docstring)."""

    def __init__(
        self, node: Node, store: BannedStore | None = None, *, poll_interval: float = 1.0
    ) -> None:
        self.node = node
        self.store = store
        self.poll_interval = poll_interval
        self.index = BanIndex(store.active(node.scheduler.time()) if store is not None else ())
        self._timer: TimerHandle | None = None
        self._purged_at = node.scheduler.time()
        self._attached = False

    # -- life cycle -------------------------------------------------------------------

    def attach(self) -> None:
        """Check bans on every CONNECT and, with a store, start polling it."""
        if self._attached:
            return
        self._attached = True
        self.node.hooks.add("client.authenticate", self._check, Priority.HIGHEST)
        self.node.auth_methods = _BanCheckedMethods(self, self.node.auth_methods)
        if self.store is not None and self.poll_interval > 0:
            self._timer = self.node.scheduler.call_later(self.poll_interval, self._poll)

    def detach(self) -> None:
        if not self._attached:
            return
        self._attached = False
        self.node.hooks.remove("client.authenticate", self._check)
        if isinstance(self.node.auth_methods, _BanCheckedMethods):
            self.node.auth_methods = dict(self.node.auth_methods.items())
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- the hook ---------------------------------------------------------------------

    def _check(self, client: ClientInfo, password: bytes | None, acc: Any) -> Any:
        if not len(self.index):
            return None
        ban = self.match(client)
        if ban is None:
            return None
        self.node.metrics.incr("client.banned")
        return Stop(int(ReasonCode.BANNED))

    def match(self, client: ClientInfo) -> Ban | None:
        return self.index.match(
            client.client_id, client.username, client.peer_host, self.node.scheduler.time()
        )

    # -- changes ----------------------------------------------------------------------

    def ban(
        self,
        kind: str,
        value: str,
        *,
        reason: str = "",
        created_by: str = "",
        duration: float | None = None,
        expires_at: float | None = None,
    ) -> Ban:
        """Ban a client (persisted when there is a store) and kick it if connected."""
        if self.store is not None:
            ban = self.store.add(
                kind,
                value,
                reason=reason,
                created_by=created_by,
                duration=duration,
                expires_at=expires_at,
            )
        else:
            kind, value = normalise(kind, value)
            now = self.node.scheduler.time()
            if duration is not None:
                expires_at = now + duration
            ban = Ban(kind, value, reason, created_by, now, expires_at)
        self.index.add(ban)
        self.kick_banned()
        return ban

    def unban(self, kind: str, value: str) -> bool:
        found = self.index.remove(kind, value)
        if self.store is not None:
            found = self.store.delete(kind, value) or found
        return found

    def reload(self) -> None:
        """Rebuild the index from the store."""
        if self.store is not None:
            self.index = BanIndex(self.store.active(self.node.scheduler.time()))

    def _poll(self) -> None:
        self._timer = None
        store = self.store
        if store is None or not self._attached:
            return
        try:
            now = self.node.scheduler.time()
            if now - self._purged_at >= PURGE_INTERVAL:
                self._purged_at = now
                if self.index.drop_expired(now):
                    store.purge_expired(now)
            if store.changed():
                self.reload()
                log.info("bans reloaded: %d in force", len(self.index))
                self.kick_banned()
        except sqlite3.Error as exc:  # e.g. the file is locked for longer than busy_timeout
            log.warning("cannot read the banned clients: %s", exc)
        finally:
            if self._attached:
                self._timer = self.node.scheduler.call_later(self.poll_interval, self._poll)

    def kick_banned(self) -> int:
        """Disconnect every connected client that a ban in force matches; how many."""
        if not len(self.index):
            return 0
        node = self.node
        kicked = 0
        for session in list(node.sessions.values()):
            handle, info = session.handle, session.info
            if handle is None or info is None:
                continue
            ban = self.match(info)
            if ban is None:
                continue
            log.warning(
                "kicking banned client %r (username %r, peer %s): %s %s%s",
                info.client_id,
                info.username,
                info.peer_host,
                ban.kind,
                ban.value,
                f" ({ban.reason})" if ban.reason else "",
            )
            info.set_attr("disconnect_reason", "kicked")
            node.close(info, handle, send_will=False)
            handle.kick(ReasonCode.ADMINISTRATIVE_ACTION)
            node.metrics.incr("client.kicked.banned")
            kicked += 1
        return kicked
