"""Membership and discovery: members learnt from seeds, joins, peers' member lists and
DNS; leave, force-leave and autoclean; CALLs on the control link; heartbeats and the
peers' states.

Owns: the member table's entries (adding and removing :class:`~gateway.cluster.peer.Peer`
objects in ``Context.peers``), the CALLs under way, the heartbeat timer and the
listeners of peer state changes (``on_state``, ``on_peer_down``), of removed members
(``on_forgotten``) and of heartbeats
(``ticks``).

Given: the :class:`~gateway.cluster.state.Context`, the links part's ``dial_link``,
``start_dial`` (a core's dial loop for a new member) and ``close_peer``,
``drop_routes(name, reps)`` (:mod:`.replication`), the
:class:`~gateway.cluster.forwarding.Sender`, ``wake_attach`` (a replicant's attach
loop) and the Raft glue as a :class:`RaftMembers`.

Invariants:
- A member is dialled by exactly one dial loop (a core) or considered by the attach loop
  (a replicant); ``forget`` stops both and removes every trace of it (links, routes,
  parked routes, outbox, registry entries, ``cluster_members`` row, Raft claims).
- Members learnt from peers are persisted (``cluster_members``), so a restart reconnects
  without seeds; a replicant is never persisted by a core.
- A peer's state follows its links only (``Peer.state``): ``state_changed`` is the one
  place that reacts to a state change (it tells ``on_state`` then ``on_peer_down``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from gateway.cluster import frames as F
from gateway.cluster.discovery import DnsSettings, discover
from gateway.cluster.forwarding import Sender
from gateway.cluster.link import HandshakeError, Link
from gateway.cluster.peer import Peer
from gateway.cluster.state import Context, log, parse_seed

DialLink = Callable[..., Awaitable[Link]]


class RaftMembers(Protocol):
    """What membership tells the Raft glue (:class:`gateway.cluster.raftglue.RaftGlue`)."""

    def member_added(self, name: str) -> None: ...
    def forgotten(self, name: str, *, claims: bool, leaving: bool) -> None: ...
    def on_remove_call(self, link: Link, node: str,
                       reply: Callable[[bool, str], None]) -> None: ...
    async def leave(self, timeout: float = 5.0) -> None: ...
    def pong_extra(self, peer: Peer) -> dict[str, Any] | None: ...
    def on_pong(self, peer: str, rlog: Any) -> None: ...


class Membership:
    """Members: who they are, joining, leaving, heartbeats and states."""

    def __init__(self, ctx: Context, sender: Sender, raft: RaftMembers, *,
                 dial_link: DialLink, start_dial: Callable[[Peer], asyncio.Task[None]],
                 close_peer: Callable[[Peer, str], None],
                 drop_routes: Callable[[str, list[str]], int],
                 wake_attach: Callable[[], None]) -> None:
        self.ctx = ctx
        self.sender = sender
        self.raft = raft
        self._dial_link = dial_link
        self._start_dial = start_dial
        self._close_peer = close_peer
        self._drop_routes = drop_routes
        self._wake_attach = wake_attach
        self._calls: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._call_id = 0
        self._leaving = False
        self._tick: asyncio.TimerHandle | None = None
        self.on_state: list[Callable[[Peer, str], None]] = []
        self.on_peer_down: list[Callable[[str], None]] = []
        self.on_forgotten: list[Callable[[Peer], None]] = []
        self.ticks: list[Callable[[float], None]] = []

    def start(self) -> None:
        assert self.ctx.loop is not None
        self._tick = self.ctx.loop.call_later(self.ctx.settings.heartbeat_interval,
                                              self._heartbeat)

    def stop(self) -> None:
        if self._tick is not None:
            self._tick.cancel()

    def member(self, name: str, addr: str, *, persist: bool = True, role: str = "core"
                ) -> Peer:
        """A member (new or known). Replicants are not kept in ``cluster_members``: they
        dial their core, never the other way round."""
        persist = persist and role != "replicant"
        peer = self.ctx.peers.get(name)
        if peer is not None:
            if addr and addr != peer.addr:
                peer.addr = addr
                if persist:
                    self.ctx.store.member_saved(name, addr)
            return peer
        peer = Peer(name, addr, self.ctx.store.outbox(name, self.ctx.settings.outbox_max))
        peer.role = role
        self.raft.member_added(name)  # a member again
        self.ctx.peers[name] = peer
        if persist:
            self.ctx.store.member_saved(name, addr)
        log.info("cluster: member %s (%s) at %s", name, role, addr)
        if self.ctx.replicant:  # a replicant dials one core: its attach loop picks it
            self._wake_attach()
        elif not self.ctx.stopping:
            peer.task = self._start_dial(peer)
        return peer

    def dial_address(self, addr: str) -> None:
        """A seed or join target given by address only: learn its name, then add it."""
        self.ctx.spawn(self._probe(addr))

    async def _probe(self, addr: str) -> None:
        delay = 0.2
        while not self.ctx.stopping:
            try:
                link = await self._dial_link(addr, "control", None, probe=True)
            except (TimeoutError, OSError, ssl.SSLError, HandshakeError) as exc:
                log.debug("cluster: %s not reachable yet: %s", addr, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.ctx.settings.reconnect_max)
                continue
            link.close("probe done")
            self.learn(link.info.get("members", []))
            role = str(link.info.get("role", "core"))
            if self.ctx.replicant and role == "replicant":
                log.warning("cluster: %s at %s is a replicant; a replicant attaches to a "
                            "core", link.peer, addr)
                return
            self.member(link.peer, addr, role=role)
            return

    async def dns_loop(self, dns: DnsSettings, host: str, port: int) -> None:
        """Dial every address DNS gives that is not this node or a known member."""
        tried: set[str] = set()
        while not self.ctx.stopping:
            addrs = await discover(dns, port)
            own = {self.ctx.settings.advertise, f"{host}:{port}"}
            known = {p.addr for p in self.ctx.peers.values()}
            new = [a for a in addrs if a not in own and a not in known and a not in tried]
            if new:
                log.info("cluster: DNS %s gives %d new addresses: %s", dns.name, len(new),
                         ", ".join(new))
            for addr in new:
                tried.add(addr)
                self.dial_address(addr)
            await asyncio.sleep(dns.refresh)

    def join(self, target: str) -> str:
        """``gatewayctl cluster join``: ``name@host:port`` or ``host:port``."""
        name, addr = parse_seed(target)
        if name == self.ctx.name:
            raise ValueError("cannot join this node itself")
        if name:
            peer = self.member(name, addr)
            peer.wake.set()
            return name
        self.dial_address(addr)
        return addr

    async def leave(self) -> int:
        """Tell every peer this node leaves, forget them all; how many were told. With
        Raft, this node first has the leader remove it from the group (a leader first
        hands its leadership over), so the others' majority no longer counts it."""
        await self.raft.leave()
        self._leaving = True
        told = 0
        for peer in list(self.ctx.peers.values()):
            link = peer.ctl_out
            if link is not None and not link.closed:
                link.send(F.control(F.LEAVE, {"name": self.ctx.name}))
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(link.drain(), 2)
                told += 1
            self.forget(peer.name, "this node left the cluster")
        self._leaving = False
        log.info("cluster: left the cluster (%d peers told)", told)
        return told

    async def call(self, name: str, request: dict[str, Any], timeout: float
                   ) -> dict[str, Any]:
        """A CALL to a peer on our control link; its REPLY (``{"ok": False, "error"}``
        when the link is down or the time is up)."""
        peer = self.ctx.peers.get(name)
        if peer is None or peer.ctl_out is None or peer.ctl_out.closed:
            return {"ok": False, "error": f"no link to {name}"}
        assert self.ctx.loop is not None
        self._call_id += 1
        cid = self._call_id
        fut: asyncio.Future[dict[str, Any]] = self.ctx.loop.create_future()
        self._calls[cid] = fut
        peer.ctl_out.send(F.control(F.CALL, {**request, "id": cid}))
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return {"ok": False, "error": f"no reply from {name} in {timeout:g}s"}
        finally:
            self._calls.pop(cid, None)

    def on_call(self, peer: Peer, link: Link, body: bytes) -> None:
        """A CALL from a peer (on its control link to us); the REPLY goes back on it."""
        msg = F.parse_control(body)
        cid = msg.get("id")

        def reply(ok: bool, error: str = "") -> None:
            link.send(F.control(F.REPLY, {"id": cid, "ok": ok, "error": error}))

        node = msg.get("node")
        if msg.get("op") == "raft_remove" and isinstance(node, str):
            self.raft.on_remove_call(link, node, reply)
        else:
            reply(False, f"unknown call {msg.get('op')!r}")

    def forget(self, name: str, why: str, *, claims: bool = True) -> bool:
        """Remove a member (it left, ``force-leave``, or autoclean): links, routes,
        outbox (its unacknowledged messages are dropped, and counted in the log). With
        Raft, a voter is removed from the group: here when this node leads, else by a
        CALL to the leader."""
        reps = self.ctx.reps()  # before it goes: a replicant's keys are announced by us
        peer = self.ctx.peers.pop(name, None)
        if peer is None:
            return False
        peer.state = "left"
        self._close_peer(peer, why)
        if peer.task is not None:
            peer.task.cancel()
        removed = self._drop_routes(name, reps)
        self.raft.forgotten(name, claims=claims, leaving=self._leaving)
        for gone in self.on_forgotten:  # shared-group messages queued for it
            gone(peer)
        pending = len(peer.outbox)
        self.ctx.store.outbox_deleted(name)
        self.ctx.store.member_deleted(name)
        log.warning(
            "cluster: %s removed (%s): %d routes removed%s", name, why, removed,
            f", {pending} unacknowledged forwarded messages dropped" if pending else "",
        )
        return True

    def learn(self, members: Any, sender: str | None = None) -> None:
        """Members a peer listed: ``[name, addr]``, ``[name, addr, role]``, or for a
        replicant attached to the sender ``[name, addr, "replicant", sender]``."""
        if not isinstance(members, list):
            return
        for item in members:
            if not (isinstance(item, list) and 2 <= len(item) <= 4
                    and all(isinstance(x, str) for x in item)
                    and item[0] and item[0] != self.ctx.name):
                continue
            if len(item) >= 3 and item[2] == "replicant":
                # a replicant is linked to its core only; the core learns it when it
                # dials in. One attached to the sender is no longer ours.
                if len(item) == 4 and sender is not None and item[3] == sender:
                    self._replicant_moved(item[0], sender)
                continue
            if item[0] not in self.ctx.peers:
                self.member(item[0], item[1])
                if not self.ctx.replicant:
                    self.announce_members()

    def members_list(self) -> list[list[str]]:
        """``[name, addr, role]`` of this node and every member it knows (and this node's
        name after its attached replicants)."""
        out = [[self.ctx.name, self.ctx.settings.advertise, self.ctx.settings.role]]
        for p in self.ctx.peers.values():
            if p.role == "replicant" and p.ctl_in is not None and not self.ctx.replicant:
                out.append([p.name, p.addr, p.role, self.ctx.name])
            else:
                out.append([p.name, p.addr, p.role])
        return out

    def _replicant_moved(self, name: str, core: str) -> None:
        """A replicant that was attached here is attached to ``core`` now: what this
        node still had queued for it goes to that core, marked for it (at least once),
        and it is forgotten here."""
        peer = self.ctx.peers.get(name)
        via = self.ctx.peers.get(core)
        if (self.ctx.replicant or peer is None or via is None or peer.role != "replicant"
                or peer.ctl_in is not None):
            return
        records = list(peer.outbox.records)
        if records:
            peer.outbox.take({seq for seq, _ in records})
            for _, body in records:
                fwd = F.decode_body(body)
                self.sender.queue(via, F.encode_message(fwd.message, fwd.share, target=name), 1)
            log.warning("cluster: %d unacknowledged forwards for %s go through its core %s",
                        len(records), name, core)
        self.forget(name, f"attached to {core}", claims=False)

    def announce_members(self) -> None:
        frame = F.control(F.MEMBERS, {"members": self.members_list()})
        for peer in self.ctx.peers.values():
            if peer.ctl_out is not None:
                peer.ctl_out.send(frame)

    def _heartbeat(self) -> None:
        assert self.ctx.loop is not None
        now = time.monotonic()
        timeout = self.ctx.settings.heartbeat_timeout
        ping = F.control(F.PING, {"t": now})
        for peer in list(self.ctx.peers.values()):
            out = peer.ctl_out
            if out is not None:
                if now - peer.last_pong > timeout:
                    out.close(f"no heartbeat for {timeout:g}s")
                else:
                    out.send(ping)
            inn = peer.ctl_in
            if inn is not None and now - peer.last_seen_in > timeout:
                inn.close(f"no heartbeat for {timeout:g}s")
            if peer.unacked_since is not None:
                peer.route_lag_ms = max(peer.route_lag_ms, (now - peer.unacked_since) * 1000)
            self._autoclean(peer)
        for tick in self.ticks:  # Raft membership, relayed takeovers that expired
            tick(now)
        self._tick = self.ctx.loop.call_later(self.ctx.settings.heartbeat_interval, self._heartbeat)

    def _autoclean(self, peer: Peer) -> None:
        limit = self.ctx.settings.autoclean
        down = peer.down_since
        if limit and peer.state == "down" and down is not None and time.time() - down > limit:
            # a replicant down here may be attached to another core: its sessions stay
            self.forget(peer.name, f"down for more than {limit:g}s (autoclean)",
                        claims=peer.role != "replicant")

    def state_changed(self, peer: Peer) -> None:
        new = peer.update_state()
        if new is None or self.ctx.stopping:
            return
        log.info("cluster: node %s is %s", peer.name, new)
        for cb in self.on_state:  # Raft connectivity, shared groups rerouted when down
            cb(peer, new)
        if new == "down":
            for down in self.on_peer_down:
                down(peer.name)

    # -- frames (the links part hands them here) -----------------------------------------

    def on_ping(self, peer: Peer, link: Link, body: bytes) -> None:
        """PING on the peer's control link: a PONG with our connections (and, to a
        replicant, the Raft stream's figures)."""
        pong: dict[str, Any] = {"t": F.parse_control(body).get("t"),
                                "connections": self.ctx.node.connections}
        rlog = self.raft.pong_extra(peer)
        if rlog is not None:
            pong["rlog"] = rlog
        link.send(F.control(F.PONG, pong))

    def on_pong(self, peer: Peer, link: Link, body: bytes) -> None:
        now = time.monotonic()
        peer.last_pong = now
        pong = F.parse_control(body)
        t = pong.get("t")
        if isinstance(t, int | float):
            peer.rtt = max(0.0, now - t)
        conns = pong.get("connections")
        if isinstance(conns, int):
            peer.connections = conns
        self.raft.on_pong(link.peer, pong.get("rlog"))

    def on_reply(self, peer: Peer, link: Link, body: bytes) -> None:
        msg = F.parse_control(body)
        fut = self._calls.get(msg.get("id"))  # type: ignore[arg-type]
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def on_members(self, peer: Peer, link: Link, body: bytes) -> None:
        self.learn(F.parse_control(body).get("members"), peer.name)

    def on_leave(self, peer: Peer, link: Link, body: bytes) -> None:
        self.forget(peer.name, "it left the cluster")
