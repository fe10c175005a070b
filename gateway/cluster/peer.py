"""What one node knows of another: its links, state, outbox and figures.

States: ``joining`` (never reached yet), ``up`` (our control link to it and its control
link to us both open), ``partial`` (one direction only), ``down`` (was up, both gone),
``left``. ``down_since`` (wall clock) drives autoclean.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from gateway.cluster.link import Link
from gateway.cluster.outbox import Outbox


class Peer:
    def __init__(self, name: str, addr: str, outbox: Outbox) -> None:
        self.name = name
        self.addr = addr
        self.outbox = outbox
        self.ctl_out: Link | None = None
        self.data_out: Link | None = None
        self.ctl_in: Link | None = None
        self.data_in: Link | None = None
        self.state = "joining"
        self.was_up = False
        self.since = time.time()
        self.down_since: float | None = None
        self.role = "core"
        self.version = ""
        self.rtt: float | None = None
        self.connections = 0  # the peer's client connections, from its PONGs
        self.last_pong = 0.0
        self.last_seen_in = 0.0
        self.last_error = ""
        self.failures = 0
        # route replication towards this peer
        self.rev_sent = 0
        self.rev_acked = 0
        self.unacked_since: float | None = None  # monotonic time of the oldest unacked rev
        self.rev_times: deque[tuple[int, float]] = deque()  # (rev, sent at) not yet acked
        self.route_lag_ms = 0.0
        # forwarding
        self.qos0: list[bytes] = []
        self.flush_scheduled = False
        self.blocked = False
        self.forwarded = 0
        self.received = 0
        self.dropped = 0
        self.duplicates = 0
        # outbox seq -> (group, filter, message) of unacknowledged shared-group forwards
        self.shared_pending: dict[int, tuple[str, str, Any]] = {}
        self.task: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()

    def update_state(self) -> str | None:
        """Recompute ``state``; the new state when it changed."""
        out = self.ctl_out is not None and self.data_out is not None
        inn = self.ctl_in is not None
        if self.state == "left":
            return None
        if out and inn:
            new = "up"
        elif out or inn:
            new = "partial" if self.was_up or out or inn else "joining"
        else:
            new = "down" if self.was_up else "joining"
        if new == self.state:
            return None
        self.state = new
        self.since = time.time()
        if new == "up":
            self.was_up = True
            self.down_since = None
        elif new == "down":
            self.down_since = time.time()
        return new

    def view(self) -> dict[str, Any]:
        box = self.outbox
        return {
            "node": self.name,
            "addr": self.addr,
            "status": self.state,
            "role": self.role,
            "version": self.version,
            "self": False,
            "connections": self.connections,
            "since": self.since,
            "links": {
                "control_out": _link(self.ctl_out),
                "data_out": _link(self.data_out),
                "control_in": _link(self.ctl_in),
                "data_in": _link(self.data_in),
            },
            "rtt_ms": None if self.rtt is None else round(self.rtt * 1000, 3),
            "last_error": self.last_error or None,
            "outbox": {
                "len": len(box),
                "next_seq": box.next_seq,
                "acked": box.acked,
                "dropped": box.dropped,
            },
            "replication": {
                "routes_rev_sent": self.rev_sent,
                "routes_rev_acked": self.rev_acked,
                "lag": self.rev_sent - self.rev_acked,
                "lag_ms": round(self.route_lag_ms, 3),
            },
            "forwarded": self.forwarded,
            "received": self.received,
            "dropped": self.dropped,
        }


def _link(link: Link | None) -> str:
    return "up" if link is not None and not link.closed else "down"
