"""Links: dialling a control and a data link to each member (HELLO/WELCOME over mutual
TLS), accepting the other side's, and routing each frame that arrives to the part that
handles it.

Invariants:
- A peer has at most one open link of each kind and direction (``ctl_out``, ``data_out``,
  ``ctl_in``, ``data_in``); a newer one replaces an older one, which is closed.
- Nothing is read from a connection before its TLS handshake verified the peer's
  certificate against the cluster CA, and (with ``verify_node_name``) its CN is the name
  it claims.
- When our control link to a peer comes up, the peer gets our whole route, session and
  table snapshots before any delta; when its control link to us goes, its routes go.
- Control frames are only taken from the peer's current control link.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from typing import TYPE_CHECKING, Any

from gateway.cluster import frames as F
from gateway.cluster.link import HandshakeError, Link, accept_tls, dial, refuse
from gateway.cluster.peer import Peer
from gateway.cluster.state import (
    _SHARED_PREFIXES,
    NOT_MY_CORE,
    ClusterState,
    log,
)
from gateway.cluster.takeover import export_session, import_session
from gateway.cluster.tls import peer_common_name

if TYPE_CHECKING:
    pass


class LinksPart(ClusterState):
    """Outgoing and incoming links, their frames, and what their loss means."""

    def _hello(self, channel: str, probe: bool = False) -> dict[str, Any]:
        return {
            "probe": probe,
            "name": self.name,
            "cluster": self.settings.cluster_name,
            "channel": channel,
            "addr": self.settings.advertise,
            "epoch": self.store.epoch,
            "role": self.settings.role,
            "version": self.settings.version,
            # its retained messages come as stamped table rows (tables.py): a node does not
            # keep them from this node's DATA forwards
            "tables": bool(self.settings.tables),
        }

    async def _dial_link(self, addr: str, channel: str, expect: str | None, *,
                         probe: bool = False) -> Link:
        return await dial(
            addr, self.tls.client, self._hello(channel, probe), expect=expect,
            verify_name=self.tls.verify_node_name, timeout=self.settings.connect_timeout,
        )

    async def _dial_loop(self, peer: Peer) -> None:
        delay = 0.1
        while not self.stopping and self.peers.get(peer.name) is peer:
            if peer.role == "replicant" and peer.ctl_in is None:
                # a replicant dials its core; we dial it back only while it is attached
                peer.wake.clear()
                await peer.wake.wait()
                continue
            ctl: Link | None = None
            try:
                ctl = await self._dial_link(peer.addr, "control", peer.name)
                data = await self._dial_link(peer.addr, "data", peer.name)
            except (TimeoutError, OSError, ssl.SSLError, HandshakeError) as exc:
                if ctl is not None:
                    ctl.close("data link failed")
                not_ours = isinstance(exc, HandshakeError) and NOT_MY_CORE in str(exc)
                if not_ours and peer.role != "replicant":
                    peer.role = "replicant"  # it is attached to another core: we wait
                    self.store.member_deleted(peer.name)  # until it dials us (loop top)
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                peer.failures += 1
                if (why != peer.last_error or peer.failures == 1) and not not_ours:
                    level = logging.WARNING if isinstance(exc, HandshakeError) else logging.INFO
                    log.log(level, "cluster: cannot reach %s at %s: %s", peer.name, peer.addr, why)
                peer.last_error = why
                peer.wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(peer.wake.wait(), delay)
                delay = min(delay * 2, self.settings.reconnect_max)
                continue
            if self.stopping or self.peers.get(peer.name) is not peer:
                ctl.close("stopping")
                data.close("stopping")
                return
            delay = 0.1
            peer.failures = 0
            peer.last_error = ""
            self._links_up(peer, ctl, data)
            await ctl.done.wait()  # closing either link closes the other
            await data.done.wait()

    def _links_up(self, peer: Peer, ctl: Link, data: Link) -> None:
        peer.ctl_out, peer.data_out = ctl, data
        peer.last_pong = time.monotonic()
        peer.role = str(ctl.info.get("role", "core"))
        peer.version = str(ctl.info.get("version", ""))
        ctl.start(self._on_out_frame, self._out_closed)
        data.start(self._on_out_frame, self._out_closed)
        # our routes, from scratch: the peer replaces whatever it had from us (a core
        # stands in for its replicants, and for the cluster towards them: relay.py)
        self._route_rev += 1
        if peer.role == "replicant" and not self.replicant:
            keys = self.route_ann.replica_view(peer.name)
            cids = self.session_ann.replica_view(peer.name)
            self.route_ann.replica_ops.pop(peer.name, None)
            self.session_ann.replica_ops.pop(peer.name, None)
        else:
            reps = self._reps()
            keys = self.route_ann.core_view(reps)
            cids = self.session_ann.core_view(reps)
        ctl.send(F.control(F.ROUTES, {
            "snapshot": sorted(keys), "sessions_snapshot": sorted(cids),
            "rev": self._route_rev,
        }))
        self._sent_rev(peer)
        self.tables.link_up(peer.name)
        if peer.role == "replicant":
            self._rlog_snapshot(peer)
        self._learn(ctl.info.get("members", []), peer.name)
        if not self.replicant and peer.role != "replicant":  # incl. who is attached here
            ctl.send(F.control(F.MEMBERS, {"members": self.members_list()}))
        # resend every unacknowledged forward the peer has not applied
        box = peer.outbox
        applied = data.info.get("applied")
        if isinstance(applied, int) and applied > 0:
            box.ack(applied)
        box.rewind()
        self._schedule_flush(peer)
        self._state_changed(peer)

    def _out_closed(self, link: Link) -> None:
        peer = self.peers.get(link.peer)
        if peer is None:
            return
        if peer.ctl_out is link:
            peer.ctl_out = None
            self.tables.link_down(peer.name)
            if peer.data_out is not None:
                peer.data_out.close("control link closed")
        elif peer.data_out is link:
            peer.data_out = None
            if peer.ctl_out is not None:
                peer.ctl_out.close("data link closed")
        else:
            return
        if not self.stopping:
            log.info("cluster: %r closed: %s", link, link.reason)
        self._state_changed(peer)

    def _on_out_frame(self, link: Link, kind: int, body: bytes) -> None:
        peer = self.peers.get(link.peer)
        if peer is None:
            return
        if kind == F.PONG:
            now = time.monotonic()
            peer.last_pong = now
            pong = F.parse_control(body)
            t = pong.get("t")
            if isinstance(t, int | float):
                peer.rtt = max(0.0, now - t)
            conns = pong.get("connections")
            if isinstance(conns, int):
                peer.connections = conns
            rlog = pong.get("rlog")
            view = self.raft_view
            if view is not None and isinstance(rlog, dict) and link.peer == self._candidate:
                seq = rlog.get("seq")
                if isinstance(seq, int):
                    view.core_seq = max(view.core_seq, seq)
                leader = rlog.get("leader")
                view.leader = leader if isinstance(leader, str) else None
        elif kind == F.REPLY:
            msg = F.parse_control(body)
            fut = self._calls.get(msg.get("id"))  # type: ignore[arg-type]
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif kind == F.ACK:
            seq = F.parse_control(body).get("seq")
            if isinstance(seq, int):
                peer.outbox.ack(seq)
                pending = peer.shared_pending
                while pending:
                    first = next(iter(pending))
                    if first > seq:
                        break
                    del pending[first]
        elif kind == F.ROUTES_ACK:
            rev = F.parse_control(body).get("rev")
            if isinstance(rev, int) and rev > peer.rev_acked:
                peer.rev_acked = rev
                now = time.monotonic()
                times = peer.rev_times
                sent_at = None
                while times and times[0][0] <= rev:
                    sent_at = times.popleft()[1]
                if sent_at is not None:  # lag: from sending this revision to its ack
                    peer.route_lag_ms = (now - sent_at) * 1000
                peer.unacked_since = times[0][1] if times else None
        elif kind == F.MEMBERS:
            self._learn(F.parse_control(body).get("members"), link.peer)
        elif kind == F.CAST:
            msg = F.parse_control(body)
            cid, export = msg.get("cid"), msg.get("export")
            if msg.get("op") == "session" and isinstance(cid, str) and isinstance(export, dict):
                via = self._takeovers.pop(cid, (None, 0.0))[0]
                if via is not None:  # a takeover relayed for a replicant or its peer
                    if not via.closed:
                        via.send(F.control(F.CAST, msg))
                        log.info("cluster: session %r relayed from %s to %s", cid, peer.name,
                                 via.peer)
                    return
                n = import_session(self.node, cid, export)
                log.info("cluster: session %r taken over from %s (%d subscriptions, "
                         "%d messages)", cid, peer.name, len(export.get("subscriptions", ())), n)

    def _close_peer(self, peer: Peer, why: str) -> None:
        for link in (peer.ctl_out, peer.data_out, peer.ctl_in, peer.data_in):
            if link is not None:
                link.close(why)

    async def _accept_loop(self, lsock: socket.socket) -> None:
        assert self._loop is not None
        while not self.stopping:
            try:
                sock, _ = await self._loop.sock_accept(lsock)
            except OSError as exc:
                if lsock.fileno() < 0:  # closed by stop()
                    return
                log.warning("cluster: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            self._spawn(self._accept(sock))

    async def _accept(self, sock: socket.socket) -> None:
        accepted = await accept_tls(sock, self.tls.server, self.settings.connect_timeout)
        if accepted is None:
            return
        reader, writer, hello = accepted
        remote = writer.get_extra_info("peername")
        name = hello.get("name")
        channel = hello.get("channel")
        why = None
        if hello.get("cluster") != self.settings.cluster_name:
            why = f"cluster {hello.get('cluster')!r} is not {self.settings.cluster_name!r}"
        elif not isinstance(name, str) or not name or name == self.name:
            why = f"bad node name {name!r}"
        elif channel not in ("control", "data"):
            why = f"bad channel {channel!r}"
        elif self.tls.verify_node_name:
            cn = peer_common_name(writer.get_extra_info("ssl_object"))
            if cn != name:
                why = f"certificate CN {cn!r} is not the node name {name!r}"
        if why is None and self.replicant and not hello.get("probe"):
            if hello.get("role") == "replicant":
                why = "a replicant attaches to a core, not to another replicant"
            elif name != self._candidate:
                why = f"{self.name} is {NOT_MY_CORE}"
        if why is not None and NOT_MY_CORE in why:
            log.debug("cluster: refused %s: %s", name, why)
            refuse(writer, why)
            return
        if why is not None or self.stopping:
            why = why or "node stopping"
            log.warning("cluster: refused %s from %s: %s", name, remote, why)
            refuse(writer, why)
            return
        assert isinstance(name, str)
        addr = hello.get("addr")
        role = "replicant" if hello.get("role") == "replicant" else "core"
        peer = self._member(name, addr if isinstance(addr, str) else "", role=role)
        if not hello.get("probe"):
            peer.role = role
        if hello.get("probe"):  # it only learns our name and members: not a link
            writer.write(F.control(F.WELCOME, {
                "name": self.name, "members": self.members_list(),
                "role": self.settings.role, "version": self.settings.version,
            }))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.drain(), self.settings.connect_timeout)
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
                "name": self.name, "members": self.members_list(),
                "role": self.settings.role, "version": self.settings.version,
            }))
            if peer.state != "up" and peer.ctl_out is None:
                peer.wake.set()  # it is back: dial it now rather than at the next backoff
            if role == "replicant":
                log.info("cluster: replicant %s attached", name)
                self._announce_members()  # its former core hands over what it queued
        else:
            old, peer.data_in = peer.data_in, link
            if old is not None:
                old.close("replaced by a new data link")
            epoch = str(hello.get("epoch", ""))
            mark = self.inbox.get(name)
            applied = mark[1] if mark is not None and mark[0] == epoch else 0
            writer.write(F.control(F.WELCOME, {"name": self.name, "applied": applied}))
        link.start(self._on_in_frame, self._in_closed)
        self._state_changed(peer)

    def _in_closed(self, link: Link) -> None:
        peer = self.peers.get(link.peer)
        if peer is None:
            return
        if peer.ctl_in is link:
            reps = self._reps()
            peer.ctl_in = None
            self.tables.link_down(peer.name)
            self.parked.replace(peer.name, [
                k for k in self.routes.keys_of(peer.name) if not k.startswith(_SHARED_PREFIXES)
            ])
            removed = self._drop(self.route_ann, self.routes, peer.name, reps)
            self._drop(self.session_ann, self.registry, peer.name, reps)
            self._schedule_routes()
            if peer.role == "replicant" and peer.ctl_out is not None:
                peer.ctl_out.close("the replicant detached")  # it may attach elsewhere
            if self.replicant and peer.name == self._candidate and peer.ctl_out is not None:
                # its core's link back went: no routes come any more; attach afresh
                peer.ctl_out.close("the core's link to us closed")
            if not self.stopping:
                log.info("cluster: %r closed (%s): %d routes of %s removed",
                         link, link.reason, removed, peer.name)
        elif peer.data_in is link:
            peer.data_in = None
        self._state_changed(peer)

    def _on_in_frame(self, link: Link, kind: int, body: bytes) -> None:
        peer = self.peers.get(link.peer)
        if peer is None:
            link.close("not a member")
            return
        if kind == F.DATA:
            self._on_data(peer, link, body)
            return
        if link is not peer.ctl_in:
            return  # a control frame on a stale or data link
        peer.last_seen_in = time.monotonic()
        if kind == F.RAFT:
            if self.raft is not None:
                self.raft.received(peer.name, body)
        elif kind == F.PING:
            t = F.parse_control(body).get("t")
            pong: dict[str, Any] = {"t": t, "connections": self.node.connections}
            if peer.role == "replicant" and self.raft is not None:
                pong["rlog"] = {"seq": self._rlog_seq, "leader": self.raft.leader()}
            link.send(F.control(F.PONG, pong))
        elif kind == F.ROUTES:
            self._on_routes(peer, link, F.parse_control(body))
        elif kind == F.TABLE:
            self.tables.received(peer.name, F.parse_control(body))
        elif kind == F.CALL:
            self._on_call(link, F.parse_control(body))
        elif kind == F.MEMBERS:
            self._learn(F.parse_control(body).get("members"), peer.name)
        elif kind == F.LEAVE:
            self.forget(peer.name, "it left the cluster")
        elif kind == F.CAST:
            msg = F.parse_control(body)
            cid = msg.get("cid")
            if msg.get("op") == "takeover" and isinstance(cid, str):
                clean = bool(msg.get("clean"))
                export = export_session(self.node, cid, clean_start=clean)
                if export is not None:  # answered on this link: it reaches the new node
                    link.send(F.control(F.CAST, {"op": "session", "cid": cid, "export": export}))
                    log.info("cluster: session %r handed over to %s", cid, peer.name)
                elif not self.replicant:
                    self._relay_takeover(peer, link, cid, msg)
            elif msg.get("op") == "rlog" and self.raft_view is not None and (
                    peer.name == self._candidate):
                self._on_rlog(msg)
