"""Membership and discovery: members learnt from seeds, joins, peers' member lists and
DNS; leave, force-leave and autoclean; CALLs on the control link; heartbeats and the
peers' states.

Invariants:
- A member is dialled by exactly one dial loop (a core) or considered by the attach loop
  (a replicant); ``forget`` stops both and removes every trace of it (links, routes,
  parked routes, outbox, registry entries, ``cluster_members`` row, Raft claims).
- Members learnt from peers are persisted (``cluster_members``), so a restart reconnects
  without seeds; a replicant is never persisted by a core.
- A peer's state follows its links only (``Peer.state``): ``_state_changed`` is the one
  place that reacts to a state change (logging, Raft connectivity, shared-group
  rerouting).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from typing import TYPE_CHECKING, Any

from gateway.cluster import frames as F
from gateway.cluster.discovery import DnsSettings, discover
from gateway.cluster.link import HandshakeError, Link
from gateway.cluster.peer import Peer
from gateway.cluster.state import (
    ClusterState,
    log,
    parse_seed,
)

if TYPE_CHECKING:
    pass


class MembershipPart(ClusterState):
    """Members: who they are, joining, leaving, heartbeats and states."""

    @property
    def replicant(self) -> bool:
        return self.settings.role == "replicant"

    def _member(self, name: str, addr: str, *, persist: bool = True, role: str = "core"
                ) -> Peer:
        """A member (new or known). Replicants are not kept in ``cluster_members``: they
        dial their core, never the other way round."""
        persist = persist and role != "replicant"
        peer = self.peers.get(name)
        if peer is not None:
            if addr and addr != peer.addr:
                peer.addr = addr
                if persist:
                    self.store.member_saved(name, addr)
            return peer
        peer = Peer(name, addr, self.store.outbox(name, self.settings.outbox_max))
        peer.role = role
        self._raft_forget.discard(name)  # a member again
        self.peers[name] = peer
        if persist:
            self.store.member_saved(name, addr)
        log.info("cluster: member %s (%s) at %s", name, role, addr)
        if self.replicant:  # a replicant dials one core: its attach loop picks it
            self._attach_wake.set()
        elif not self.stopping:
            peer.task = self._spawn(self._dial_loop(peer))
        return peer

    def _dial_address(self, addr: str) -> None:
        """A seed or join target given by address only: learn its name, then add it."""
        self._spawn(self._probe(addr))

    async def _probe(self, addr: str) -> None:
        delay = 0.2
        while not self.stopping:
            try:
                link = await self._dial_link(addr, "control", None, probe=True)
            except (TimeoutError, OSError, ssl.SSLError, HandshakeError) as exc:
                log.debug("cluster: %s not reachable yet: %s", addr, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.reconnect_max)
                continue
            link.close("probe done")
            self._learn(link.info.get("members", []))
            role = str(link.info.get("role", "core"))
            if self.replicant and role == "replicant":
                log.warning("cluster: %s at %s is a replicant; a replicant attaches to a "
                            "core", link.peer, addr)
                return
            self._member(link.peer, addr, role=role)
            return

    async def _dns_loop(self, dns: DnsSettings) -> None:
        """Dial every address DNS gives that is not this node or a known member."""
        assert self.bound is not None
        tried: set[str] = set()
        while not self.stopping:
            addrs = await discover(dns, self.bound[1])
            own = {self.settings.advertise, f"{self.bound[0]}:{self.bound[1]}"}
            known = {p.addr for p in self.peers.values()}
            new = [a for a in addrs if a not in own and a not in known and a not in tried]
            if new:
                log.info("cluster: DNS %s gives %d new addresses: %s", dns.name, len(new),
                         ", ".join(new))
            for addr in new:
                tried.add(addr)
                self._dial_address(addr)
            await asyncio.sleep(dns.refresh)

    def join(self, target: str) -> str:
        """``gatewayctl cluster join``: ``name@host:port`` or ``host:port``."""
        name, addr = parse_seed(target)
        if name == self.name:
            raise ValueError("cannot join this node itself")
        if name:
            peer = self._member(name, addr)
            peer.wake.set()
            return name
        self._dial_address(addr)
        return addr

    async def leave(self) -> int:
        """Tell every peer this node leaves, forget them all; how many were told. With
        Raft, this node first has the leader remove it from the group (a leader first
        hands its leadership over), so the others' majority no longer counts it."""
        await self._raft_leave()
        self._leaving = True
        told = 0
        for peer in list(self.peers.values()):
            link = peer.ctl_out
            if link is not None and not link.closed:
                link.send(F.control(F.LEAVE, {"name": self.name}))
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
        peer = self.peers.get(name)
        if peer is None or peer.ctl_out is None or peer.ctl_out.closed:
            return {"ok": False, "error": f"no link to {name}"}
        assert self._loop is not None
        self._call_id += 1
        cid = self._call_id
        fut: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._calls[cid] = fut
        peer.ctl_out.send(F.control(F.CALL, {**request, "id": cid}))
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return {"ok": False, "error": f"no reply from {name} in {timeout:g}s"}
        finally:
            self._calls.pop(cid, None)

    def _on_call(self, link: Link, msg: dict[str, Any]) -> None:
        """A CALL from a peer (on its control link to us); the REPLY goes back on it."""
        cid = msg.get("id")

        def reply(ok: bool, error: str = "") -> None:
            link.send(F.control(F.REPLY, {"id": cid, "ok": ok, "error": error}))

        node = msg.get("node")
        if msg.get("op") == "raft_remove" and isinstance(node, str):
            raft = self.raft
            if raft is None or not raft.is_leader():
                reply(False, "not the Raft leader")
            elif node == self.name:
                reply(False, "the leader cannot remove itself (it hands over when it leaves)")
            elif node not in raft.members():
                reply(True)
            else:
                log.info("cluster: removing %s from the Raft group (asked by %s)", node,
                         link.peer)
                self._raft_removed.add(node)
                raft.remove(node, lambda ok: reply(ok, "" if ok else "not committed"))
        else:
            reply(False, f"unknown call {msg.get('op')!r}")

    def forget(self, name: str, why: str, *, claims: bool = True) -> bool:
        """Remove a member (it left, ``force-leave``, or autoclean): links, routes,
        outbox (its unacknowledged messages are dropped, and counted in the log). With
        Raft, a voter is removed from the group: here when this node leads, else by a
        CALL to the leader."""
        reps = self._reps()  # before it goes: a replicant's keys are announced by us
        peer = self.peers.pop(name, None)
        if peer is None:
            return False
        peer.state = "left"
        self._close_peer(peer, why)
        if peer.task is not None:
            peer.task.cancel()
        removed = self._drop(self.route_ann, self.routes, name, reps)
        self._drop(self.session_ann, self.registry, name, reps)
        self._schedule_routes()
        self.parked.drop_node(name)
        if self.raft_sessions is not None and claims:
            self.raft_sessions.forget(name, sync=False)
        raft = self.raft
        if raft is not None and name in raft.members():
            if raft.is_leader():
                raft.remove(name)  # a voter that left: the majority shrinks with it
            elif not self._leaving:  # the leader removes it (next heartbeat, a CALL)
                self._raft_forget.add(name)
        self._reroute_shared(peer)
        pending = len(peer.outbox)
        self.store.outbox_deleted(name)
        self.store.member_deleted(name)
        log.warning(
            "cluster: %s removed (%s): %d routes removed%s", name, why, removed,
            f", {pending} unacknowledged forwarded messages dropped" if pending else "",
        )
        return True

    async def _forward_removal(self, leader: str, name: str) -> None:
        try:
            reply = await self.call(leader, {"op": "raft_remove", "node": name}, 5.0)
        finally:
            self._raft_asking.discard(name)
        if reply.get("ok"):
            log.info("cluster: %s removed from the Raft group by the leader %s", name, leader)
        else:  # asked again at a later heartbeat while it is in the group
            log.warning("cluster: the Raft leader %s did not remove %s: %s", leader, name,
                        reply.get("error"))

    def _learn(self, members: Any, sender: str | None = None) -> None:
        """Members a peer listed: ``[name, addr]``, ``[name, addr, role]``, or for a
        replicant attached to the sender ``[name, addr, "replicant", sender]``."""
        if not isinstance(members, list):
            return
        for item in members:
            if not (isinstance(item, list) and 2 <= len(item) <= 4
                    and all(isinstance(x, str) for x in item)
                    and item[0] and item[0] != self.name):
                continue
            if len(item) >= 3 and item[2] == "replicant":
                # a replicant is linked to its core only; the core learns it when it
                # dials in. One attached to the sender is no longer ours.
                if len(item) == 4 and sender is not None and item[3] == sender:
                    self._replicant_moved(item[0], sender)
                continue
            if item[0] not in self.peers:
                self._member(item[0], item[1])
                if not self.replicant:
                    self._announce_members()

    def members_list(self) -> list[list[str]]:
        """``[name, addr, role]`` of this node and every member it knows (and this node's
        name after its attached replicants)."""
        out = [[self.name, self.settings.advertise, self.settings.role]]
        for p in self.peers.values():
            if p.role == "replicant" and p.ctl_in is not None and not self.replicant:
                out.append([p.name, p.addr, p.role, self.name])
            else:
                out.append([p.name, p.addr, p.role])
        return out

    def _replicant_moved(self, name: str, core: str) -> None:
        """A replicant that was attached here is attached to ``core`` now: what this
        node still had queued for it goes to that core, marked for it (at least once),
        and it is forgotten here."""
        peer = self.peers.get(name)
        via = self.peers.get(core)
        if (self.replicant or peer is None or via is None or peer.role != "replicant"
                or peer.ctl_in is not None):
            return
        records = list(peer.outbox.records)
        if records:
            peer.outbox.take({seq for seq, _ in records})
            for _, body in records:
                fwd = F.decode_body(body)
                via.outbox.append(F.encode_message(fwd.message, fwd.share, target=name),
                                  lambda p=via: self._schedule_flush(p))  # type: ignore[misc]
            log.warning("cluster: %d unacknowledged forwards for %s go through its core %s",
                        len(records), name, core)
        self.forget(name, f"attached to {core}", claims=False)

    def _announce_members(self) -> None:
        frame = F.control(F.MEMBERS, {"members": self.members_list()})
        for peer in self.peers.values():
            if peer.ctl_out is not None:
                peer.ctl_out.send(frame)

    def _heartbeat(self) -> None:
        assert self._loop is not None
        now = time.monotonic()
        timeout = self.settings.heartbeat_timeout
        ping = F.control(F.PING, {"t": now})
        for peer in list(self.peers.values()):
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
        if self.raft is not None:
            self._raft_membership()
        if self._takeovers:  # relayed takeovers nobody answered (no session there)
            self._takeovers = {c: v for c, v in self._takeovers.items() if now - v[1] < 60}
        self._tick = self._loop.call_later(self.settings.heartbeat_interval, self._heartbeat)

    def _autoclean(self, peer: Peer) -> None:
        limit = self.settings.autoclean
        down = peer.down_since
        if limit and peer.state == "down" and down is not None and time.time() - down > limit:
            # a replicant down here may be attached to another core: its sessions stay
            self.forget(peer.name, f"down for more than {limit:g}s (autoclean)",
                        claims=peer.role != "replicant")

    def _state_changed(self, peer: Peer) -> None:
        new = peer.update_state()
        if new is None or self.stopping:
            return
        log.info("cluster: node %s is %s", peer.name, new)
        if self.settings.raft and self.raft is None and new == "up" and not self.replicant:
            self._start_raft()  # the members are known now (its WELCOME listed them)
        if new == "up":
            self._raft_removed.discard(peer.name)  # back: the leader may add it again
        if self.raft is not None:
            if new != "up":
                self.raft.link_down(peer.name)
            elif peer.role != "replicant":
                self.raft.link_up(peer.name)
        if new == "down":
            self._reroute_shared(peer)
            for cb in self.on_peer_down:
                cb(peer.name)
