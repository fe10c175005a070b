"""A bridge: forward rules feeding the outbox, the upstream client draining it, and
upstream subscriptions published into the local broker.

Loop prevention, in two layers:

- Messages a bridge publishes locally (from its upstream subscriptions) carry
  ``headers["bridge"] = <bridge name>``; that bridge's forwarder skips them (counted
  ``loops_prevented``), so nothing goes back to the broker it came from, whatever the
  topic mappings. Another bridge may still forward them (an edge relaying between two
  upstreams).
- Upstream, MQTT 5 subscriptions are made with No Local, and MQTT 3.x bridges may set
  ``bridge_mode`` (mosquitto's and EMQX's bridge flag): the upstream broker then does not
  send our own forwarded messages back to us at all, so local subscribers do not see them
  twice.

The forwarder runs last on the ``message.publish`` hook (``Priority.LOWEST``), sees the
message as it will be routed, and returns it unchanged.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import replace
from typing import Any

from gateway.bridge.client import CommitGate, Dialer, State, UpstreamClient
from gateway.bridge.outbox import Outbox
from gateway.bridge.settings import BridgeSettings, ForwardRule, SubscriptionRule, render
from gateway.bridge.store import OutboxStore
from gateway.core.clock import Scheduler, TimerHandle
from gateway.core.hooks import Priority
from gateway.core.node import Node
from gateway.core.topic_index import TopicIndex, topic_matches
from protocols.context import ClientInfo, Message
from protocols.mqtt.packets import NO_PROPERTIES, Publish
from protocols.mqtt.topics import parse_shared

log = logging.getLogger("gateway.bridge")

HEADER = "bridge"  # Message.headers key naming the bridge a message came down from
DROP_LOG_INTERVAL = 10.0  # seconds between two warnings about drops (a summary)
RATE_INTERVAL = 5.0  # seconds between two samples of the message rates

STATUS = {
    State.STOPPED: "stopped",
    State.CONNECTING: "connecting",
    State.AWAITING_CONNACK: "connecting",
    State.CONNECTED: "connected",
    State.BACKOFF: "disconnected",
}


class Bridge:
    def __init__(
        self,
        settings: BridgeSettings,
        node: Node,
        store: OutboxStore | None,
        dialer: Dialer,
        *,
        scheduler: Scheduler | None = None,
        gate: CommitGate | None = None,
    ) -> None:
        self.settings = settings
        self.name = settings.name
        self.node = node
        self.scheduler = scheduler = scheduler or node.scheduler
        self.outbox = Outbox(settings.name, settings.outbox, store, scheduler.time, self._dropped)
        self.client = UpstreamClient(
            settings, self.outbox, scheduler, dialer, on_message=self._from_upstream, gate=gate
        )
        self.forward_index = TopicIndex()
        self.forward_rules: dict[str, list[ForwardRule]] = defaultdict(list)
        for rule in settings.forwards:
            self.forward_index.add(rule.local)
            self.forward_rules[rule.local].append(rule)
        self.sub_index = TopicIndex()
        self.sub_rules: dict[str, list[SubscriptionRule]] = defaultdict(list)
        for sub in settings.subscriptions:
            real = parse_shared(sub.remote)[1]  # upstream strips $share/<group>/
            self.sub_index.add(real)
            self.sub_rules[real].append(sub)
        self.info = ClientInfo(client_id=f"$bridge:{settings.name}", protocol="bridge")
        self.drops: dict[str, int] = defaultdict(int)
        self.loops_prevented = 0
        self.unmatched = 0
        self.queued = 0
        self.rates = {"forwarded": 0.0, "received": 0.0}
        self._rate_sample: tuple[float, int, int] | None = None
        self._unlogged: dict[str, int] = defaultdict(int)
        self._last_drop_log = float("-inf")
        self._last_unmatched_log = float("-inf")
        self._drop_timer: TimerHandle | None = None
        self._sweep_timer: TimerHandle | None = None
        self._rate_timer: TimerHandle | None = None
        self.attached = False

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Load the outbox from disk, start forwarding and connecting."""
        restored = self.outbox.load()
        if restored:
            log.info(
                "bridge %s: %d messages (%d bytes) waiting in the outbox",
                self.name, self.outbox.count, self.outbox.bytes,
            )
        self.attach()
        self.client.start()
        self._sample_rates()
        if self.settings.outbox.max_age:
            self._schedule_sweep()

    def stop(self) -> None:
        self.detach()
        self.client.stop()
        for name in ("_drop_timer", "_sweep_timer", "_rate_timer"):
            timer = getattr(self, name)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)
        self._log_drops()

    def attach(self) -> None:
        if not self.attached and self.settings.forwards:
            self.node.hooks.add("message.publish", self._forward, Priority.LOWEST)
            self.attached = True

    def detach(self) -> None:
        if self.attached:
            self.node.hooks.remove("message.publish", self._forward)
            self.attached = False

    # -- local -> upstream ---------------------------------------------------------------

    def _forward(self, message: Message) -> Message:
        filters = self.forward_index.match(message.topic)
        if not filters:
            return message
        headers = message.headers
        if headers is not None and headers.get(HEADER) == self.name:
            self.loops_prevented += 1
            return message
        outbox = self.outbox
        volatile = self.client.can_send_now
        topic = message.topic
        for f in filters:
            for rule in self.forward_rules[f]:
                entry = outbox.put(
                    render(rule.remote, topic),
                    message.payload,
                    message.qos if rule.qos is None else rule.qos,
                    message.retain if rule.retain is None else rule.retain,
                    message.properties,
                    message.expires_at,
                    volatile=volatile,
                )
                if entry is not None:
                    self.queued += 1
        self.client.wake()
        return message

    # -- upstream -> local ---------------------------------------------------------------

    def _from_upstream(self, p: Publish) -> bool:
        """Publish a message from upstream locally; False when the node refused it (its
        store cannot write: the client then does not acknowledge it upstream)."""
        rules: list[SubscriptionRule] = []
        ids = p.properties.subscription_identifiers
        subs = self.settings.subscriptions
        if ids:  # checked against the topic: an identifier may be from an older config
            rules = [
                subs[i - 1] for i in ids
                if 0 < i <= len(subs) and topic_matches(parse_shared(subs[i - 1].remote)[1],
                                                        p.topic)
            ]
        if not rules:
            for f in self.sub_index.match(p.topic):
                rules.extend(self.sub_rules[f])
        if not rules:
            self.unmatched += 1
            self.node.metrics.dropped("bridge_no_subscription")
            now = self.scheduler.time()
            if now - self._last_unmatched_log >= DROP_LOG_INTERVAL:
                self._last_unmatched_log = now
                log.warning(
                    "bridge %s: a message on %r matches no configured subscription "
                    "(one left in the upstream session by an older configuration?); "
                    "dropped (%d so far)",
                    self.name, p.topic, self.unmatched,
                )
            return True
        now = self.scheduler.time()
        props = p.properties
        expiry = props.message_expiry_interval
        if props is not NO_PROPERTIES and (props.subscription_identifiers or props.topic_alias):
            props = replace(props, subscription_identifiers=(), topic_alias=None)
        seen: set[str] = set()
        taken = True
        for rule in rules:
            local = render(rule.local, p.topic)
            if local in seen:
                continue
            seen.add(local)
            message = Message(
                local,
                p.payload,
                p.qos,
                p.retain,
                props,
                publisher=self.info.client_id,
                timestamp=now,
                expires_at=now + expiry if expiry else None,
            )
            message.headers = {HEADER: self.name}
            try:
                if self.node.publish(self.info, message) < 0:  # PUBLISH_REFUSED
                    taken = False
            except Exception:  # never let a local problem take the link down
                log.exception("bridge %s: publishing %r locally failed", self.name, local)
        return taken

    # -- drops, expiry, rates ------------------------------------------------------------

    def _dropped(self, reason: str, n: int) -> None:
        self.drops[reason] += n
        self.node.metrics.dropped(f"bridge_{reason}", n)
        self._unlogged[reason] += n
        now = self.scheduler.time()
        if now - self._last_drop_log >= DROP_LOG_INTERVAL:
            self._log_drops()
        elif self._drop_timer is None:
            self._drop_timer = self.scheduler.call_later(
                self._last_drop_log + DROP_LOG_INTERVAL - now, self._log_drops
            )

    def _log_drops(self) -> None:
        self._drop_timer = None
        if not self._unlogged:
            return
        self._last_drop_log = self.scheduler.time()
        what = ", ".join(f"{n} {_DROP_WHY.get(r, r)}" for r, n in self._unlogged.items())
        self._unlogged.clear()
        o = self.outbox
        policy = "drop_oldest" if self.settings.outbox.drop_oldest else "drop_newest"
        log.warning(
            "bridge %s: dropped messages: %s (outbox %d messages, %d bytes; %s)",
            self.name, what, o.count, o.bytes, policy,
        )

    def _schedule_sweep(self) -> None:
        period = max(1.0, min(self.settings.outbox.max_age / 4.0, 60.0))
        self._sweep_timer = self.scheduler.call_later(period, self._sweep)

    def _sweep(self) -> None:
        self.outbox.expire()
        self._schedule_sweep()

    def _sample_rates(self) -> None:
        now = self.scheduler.time()
        c = self.client
        if self._rate_sample is not None:
            then, fwd, rcv = self._rate_sample
            dt = now - then
            if dt > 0:
                self.rates = {
                    "forwarded": round(max(0.0, (c.forwarded - fwd) / dt), 3),
                    "received": round(max(0.0, (c.received - rcv) / dt), 3),
                }
        self._rate_sample = (now, c.forwarded, c.received)
        self._rate_timer = self.scheduler.call_later(RATE_INTERVAL, self._sample_rates)

    # -- state ---------------------------------------------------------------------------

    def view(self) -> dict[str, Any]:
        """The bridge as the management API shows it."""
        s = self.settings
        c = self.client
        o = self.outbox
        now = self.scheduler.time()
        oldest = o.oldest()
        return {
            "name": s.name,
            "type": "mqtt",
            "upstream": s.upstream,
            "status": STATUS[c.state],
            "connected": c.state is State.CONNECTED,
            "connected_at": c.connected_at,
            "session_present": c.session_present if c.state is State.CONNECTED else None,
            "clientid": s.client_id,
            "proto_ver": {3: "v3", 4: "v4", 5: "v5"}[s.protocol_level],
            "queue_len": o.count,
            "queue_bytes": o.bytes,
            "inflight": len(o.inflight),
            "oldest_age": round(max(0.0, now - oldest), 3) if oldest is not None else None,
            "queued": self.queued,
            "forwarded": c.forwarded,
            "acked": c.acked,
            "received": c.received,
            "dropped": dict(self.drops),
            "loops_prevented": self.loops_prevented,
            "rates": dict(self.rates),
            "connects": c.connects,
            "attempts": c.attempts,
            "next_attempt_in": (
                round(max(0.0, c.next_attempt_at - now), 3)
                if c.next_attempt_at is not None else None
            ),
            "last_error": c.last_error,
        }


_DROP_WHY = {
    "outbox_full": "outbox full",
    "too_large": "too large",
    "expired": "expired (max_age or message expiry)",
    "rejected": "refused by upstream",
}
