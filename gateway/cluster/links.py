"""Links: dialling a control and a data link to each member (HELLO/WELCOME over mutual
TLS), accepting the other side's, and handing each frame that arrives to the part that
handles it.

Owns: the listening socket (``lsock``, ``bound``) and the link fields of each
:class:`~gateway.cluster.peer.Peer` (``ctl_out``, ``data_out``, ``ctl_in``, ``data_in``,
``last_pong``, ``last_seen_in``).

Given (:class:`LinkEvents`): how to add a member, the member list for WELCOME, the
replicant's candidate core, the applied mark of a peer's epoch, what to do when our
links to a peer come up or a control link goes (the ``Cluster`` sequences the parts),
and the frame handlers, by frame kind, for frames on the peers' control links to us
(``inbound``) and on ours to them (``outbound``).

Invariants:
- A peer has at most one open link of each kind and direction (``ctl_out``, ``data_out``,
  ``ctl_in``, ``data_in``); a newer one replaces an older one, which is closed.
- Nothing is read from a connection before its TLS handshake verified the peer's
  certificate against the cluster CA, and (with ``verify_node_name``) its CN is the name
  it claims.
- When our control link to a peer comes up, the peer gets our whole route, session and
  table snapshots before any delta (``LinkEvents.up``); when its control link to us goes,
  its routes go (``LinkEvents.ctl_in_lost``).
- Control frames are only taken from the peer's current control link; DATA frames from
  any of its links to us.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gateway.cluster import frames as F
from gateway.cluster.link import HandshakeError, Link, accept_tls, dial, refuse
from gateway.cluster.peer import Peer
from gateway.cluster.state import NOT_MY_CORE, Context, log
from gateway.cluster.tls import peer_common_name
from gateway.security.linkcheck import check_stream

Handler = Callable[[Peer, Link, bytes], None]


class LinkEvents(Protocol):
    """What the links part needs from the rest of the cluster (the ``Cluster`` gives it)."""

    def member(self, name: str, addr: str, *, role: str) -> Peer: ...
    def members_list(self) -> list[list[str]]: ...
    def announce_members(self) -> None: ...
    def state_changed(self, peer: Peer) -> None: ...
    def candidate(self) -> str | None: ...
    def applied_mark(self, name: str, epoch: str) -> int: ...
    def up(self, peer: Peer, ctl: Link, data: Link) -> None: ...
    def ctl_out_lost(self, peer: Peer) -> None: ...
    def ctl_in_lost(self, peer: Peer, link: Link, reps: list[str]) -> None: ...


class Links:
    """Outgoing and incoming links and their frames."""

    def __init__(self, ctx: Context, events: LinkEvents, *, data: Handler,
                 inbound: Mapping[int, Handler], outbound: Mapping[int, Handler]) -> None:
        self.ctx = ctx
        self.events = events
        self._on_data = data
        self._inbound = inbound
        self._outbound = outbound
        self.lsock: socket.socket | None = None
        self.bound: tuple[str, int] | None = None

    def listen(self, host: str, port: int) -> tuple[str, int]:
        """Open the listening socket and accept links on it; the address bound."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.lsock = lsock = socket.create_server((host, port), family=family, backlog=128)
        lsock.setblocking(False)
        name = lsock.getsockname()
        self.bound = (name[0], name[1])
        self.ctx.spawn(self._accept_loop(lsock))
        return self.bound

    def close(self) -> None:
        if self.lsock is not None:
            self.lsock.close()

    def live(self) -> list[Link]:
        """The open links to and from peers."""
        links = (link for p in self.ctx.peers.values()
                 for link in (p.ctl_out, p.data_out, p.ctl_in, p.data_in))
        return [link for link in links if link is not None and not link.closed]

    def _hello(self, channel: str, probe: bool = False) -> dict[str, Any]:
        return {
            "probe": probe,
            "name": self.ctx.name,
            "cluster": self.ctx.settings.cluster_name,
            "channel": channel,
            "addr": self.ctx.settings.advertise,
            "epoch": self.ctx.store.epoch,
            "role": self.ctx.settings.role,
            "version": self.ctx.settings.version,
            # its retained messages come as stamped table rows (tables.py): a node does not
            # keep them from this node's DATA forwards
            "tables": bool(self.ctx.settings.tables),
        }

    async def dial_link(self, addr: str, channel: str, expect: str | None, *,
                         probe: bool = False) -> Link:
        return await dial(
            addr, self.ctx.tls.client, self._hello(channel, probe), expect=expect,
            verify_name=self.ctx.tls.verify_node_name, timeout=self.ctx.settings.connect_timeout,
            check=lambda writer: check_stream(self.ctx.revocation, writer),
        )

    async def dial_loop(self, peer: Peer) -> None:
        delay = 0.1
        while not self.ctx.stopping and self.ctx.peers.get(peer.name) is peer:
            if peer.role == "replicant" and peer.ctl_in is None:
                # a replicant dials its core; we dial it back only while it is attached
                peer.wake.clear()
                await peer.wake.wait()
                continue
            ctl: Link | None = None
            try:
                ctl = await self.dial_link(peer.addr, "control", peer.name)
                data = await self.dial_link(peer.addr, "data", peer.name)
            except (TimeoutError, OSError, ssl.SSLError, HandshakeError) as exc:
                if ctl is not None:
                    ctl.close("data link failed")
                not_ours = isinstance(exc, HandshakeError) and NOT_MY_CORE in str(exc)
                if not_ours and peer.role != "replicant":
                    peer.role = "replicant"  # it is attached to another core: we wait
                    self.ctx.store.member_deleted(peer.name)  # until it dials us (loop top)
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                peer.failures += 1
                if (why != peer.last_error or peer.failures == 1) and not not_ours:
                    level = logging.WARNING if isinstance(exc, HandshakeError) else logging.INFO
                    log.log(level, "cluster: cannot reach %s at %s: %s", peer.name, peer.addr, why)
                peer.last_error = why
                peer.wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(peer.wake.wait(), delay)
                delay = min(delay * 2, self.ctx.settings.reconnect_max)
                continue
            if self.ctx.stopping or self.ctx.peers.get(peer.name) is not peer:
                ctl.close("stopping")
                data.close("stopping")
                return
            delay = 0.1
            peer.failures = 0
            peer.last_error = ""
            self.links_up(peer, ctl, data)
            await ctl.done.wait()  # closing either link closes the other
            await data.done.wait()

    def links_up(self, peer: Peer, ctl: Link, data: Link) -> None:
        """Our control and data links to ``peer`` are up (dial loop or attach loop)."""
        peer.ctl_out, peer.data_out = ctl, data
        peer.last_pong = time.monotonic()
        peer.role = str(ctl.info.get("role", "core"))
        peer.version = str(ctl.info.get("version", ""))
        ctl.start(self._on_out_frame, self._out_closed)
        data.start(self._on_out_frame, self._out_closed)
        self.events.up(peer, ctl, data)

    def _out_closed(self, link: Link) -> None:
        peer = self.ctx.peers.get(link.peer)
        if peer is None:
            return
        if peer.ctl_out is link:
            peer.ctl_out = None
            self.events.ctl_out_lost(peer)
            if peer.data_out is not None:
                peer.data_out.close("control link closed")
        elif peer.data_out is link:
            peer.data_out = None
            if peer.ctl_out is not None:
                peer.ctl_out.close("data link closed")
        else:
            return
        if not self.ctx.stopping:
            log.info("cluster: %r closed: %s", link, link.reason)
        self.events.state_changed(peer)

    def _on_out_frame(self, link: Link, kind: int, body: bytes) -> None:
        peer = self.ctx.peers.get(link.peer)
        if peer is None:
            return
        handler = self._outbound.get(kind)
        if handler is not None:
            handler(peer, link, body)

    async def _accept_loop(self, lsock: socket.socket) -> None:
        assert self.ctx.loop is not None
        while not self.ctx.stopping:
            try:
                sock, _ = await self.ctx.loop.sock_accept(lsock)
            except OSError as exc:
                if lsock.fileno() < 0:  # closed by stop()
                    return
                log.warning("cluster: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            self.ctx.spawn(self._accept(sock))

    async def _accept(self, sock: socket.socket) -> None:
        accepted = await accept_tls(sock, self.ctx.tls.server, self.ctx.settings.connect_timeout)
        if accepted is None:
            return
        reader, writer, hello = accepted
        remote = writer.get_extra_info("peername")
        name = hello.get("name")
        channel = hello.get("channel")
        why = None
        if hello.get("cluster") != self.ctx.settings.cluster_name:
            why = f"cluster {hello.get('cluster')!r} is not {self.ctx.settings.cluster_name!r}"
        elif not isinstance(name, str) or not name or name == self.ctx.name:
            why = f"bad node name {name!r}"
        elif channel not in ("control", "data"):
            why = f"bad channel {channel!r}"
        elif self.ctx.tls.verify_node_name:
            cn = peer_common_name(writer.get_extra_info("ssl_object"))
            if cn != name:
                why = f"certificate CN {cn!r} is not the node name {name!r}"
        if why is None and self.ctx.revocation is not None:  # distribution points / OCSP
            refusal = await check_stream(self.ctx.revocation, writer)
            why = f"peer certificate {refusal}" if refusal is not None else None
        if why is None and self.ctx.replicant and not hello.get("probe"):
            if hello.get("role") == "replicant":
                why = "a replicant attaches to a core, not to another replicant"
            elif name != self.events.candidate():
                why = f"{self.ctx.name} is {NOT_MY_CORE}"
        if why is not None and NOT_MY_CORE in why:
            log.debug("cluster: refused %s: %s", name, why)
            refuse(writer, why)
            return
        if why is not None or self.ctx.stopping:
            why = why or "node stopping"
            log.warning("cluster: refused %s from %s: %s", name, remote, why)
            refuse(writer, why)
            return
        assert isinstance(name, str)
        addr = hello.get("addr")
        role = "replicant" if hello.get("role") == "replicant" else "core"
        peer = self.events.member(name, addr if isinstance(addr, str) else "", role=role)
        if not hello.get("probe"):
            peer.role = role
        if hello.get("probe"):  # it only learns our name and members: not a link
            writer.write(F.control(F.WELCOME, {
                "name": self.ctx.name, "members": self.events.members_list(),
                "role": self.ctx.settings.role, "version": self.ctx.settings.version,
            }))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.drain(), self.ctx.settings.connect_timeout)
            writer.close()
            return
        link = Link(name, str(channel), True, reader, writer)
        link.info = hello
        if channel == "control":
            old, peer.ctl_in = peer.ctl_in, link
            if old is not None:
                old.close("replaced by a new control link")
            peer.last_seen_in = time.monotonic()
            writer.write(F.control(F.WELCOME, {
                "name": self.ctx.name, "members": self.events.members_list(),
                "role": self.ctx.settings.role, "version": self.ctx.settings.version,
            }))
            if peer.state != "up" and peer.ctl_out is None:
                peer.wake.set()  # it is back: dial it now rather than at the next backoff
            if role == "replicant":
                log.info("cluster: replicant %s attached", name)
                self.events.announce_members()  # its former core hands over what it queued
        else:
            old, peer.data_in = peer.data_in, link
            if old is not None:
                old.close("replaced by a new data link")
            applied = self.events.applied_mark(name, str(hello.get("epoch", "")))
            writer.write(F.control(F.WELCOME, {"name": self.ctx.name, "applied": applied}))
        link.start(self._on_in_frame, self._in_closed)
        self.events.state_changed(peer)

    def _in_closed(self, link: Link) -> None:
        peer = self.ctx.peers.get(link.peer)
        if peer is None:
            return
        if peer.ctl_in is link:
            reps = self.ctx.reps()  # before: a replicant's keys are announced by us
            peer.ctl_in = None
            self.events.ctl_in_lost(peer, link, reps)  # its routes go
        elif peer.data_in is link:
            peer.data_in = None
        self.events.state_changed(peer)

    def _on_in_frame(self, link: Link, kind: int, body: bytes) -> None:
        peer = self.ctx.peers.get(link.peer)
        if peer is None:
            link.close("not a member")
            return
        if kind == F.DATA:
            self._on_data(peer, link, body)
            return
        if link is not peer.ctl_in:
            return  # a control frame on a stale or data link
        peer.last_seen_in = time.monotonic()
        handler = self._inbound.get(kind)
        if handler is not None:
            handler(peer, link, body)


def close_links(peer: Peer, why: str) -> None:
    """Close every link to and from ``peer``."""
    for link in (peer.ctl_out, peer.data_out, peer.ctl_in, peer.data_in):
        if link is not None:
            link.close(why)
