"""Local routing: topic filter -> the sessions of this node that subscribed.

(The cluster's router, topic filter -> nodes, sits in front of this and is separate.)

Invariants:
- A filter is in ``index`` exactly when it has at least one plain or shared subscriber.
- A message reaches each session at most once through plain subscriptions: overlapping
  filters collapse into one delivery at the highest granted QoS carrying every
  subscription identifier (MQTT-3.3.5-1). Each shared group adds one delivery to one
  member.
- A shared-group message goes to the first member of the strategy's order that is
  online; failing that to one whose session persists; it is lost only when the group
  has no member with a session (counted as ``no_subscribers``).
- ``on_route(key, added)`` (set by gateway.cluster) is called whenever a route key of
  this node appears or disappears: a plain filter when its first subscriber arrives or
  its last leaves, ``$share/<group>/<filter>`` (``$queue/<filter>``) when a shared group
  gets its first member or loses its last.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from gateway.core.session import Session
from gateway.core.shared import SharedGroup
from gateway.core.topic_index import TopicIndex
from protocols.context import Delivery, Message, SubOptions
from protocols.mqtt.topics import parse_shared


class _Group:
    __slots__ = ("members", "options")

    def __init__(self) -> None:
        self.members = SharedGroup()
        self.options: dict[str, SubOptions] = {}


class Broker:
    def __init__(
        self,
        sessions: dict[str, Session],
        *,
        shared_strategy: str = "round_robin",
        upgrade_qos: bool = False,
        ignore_loop_deliver: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        self.sessions = sessions
        self.index = TopicIndex()
        self.plain: dict[str, dict[str, SubOptions]] = {}
        self.shared: dict[str, dict[str, _Group]] = {}
        self.shared_strategy = shared_strategy
        self.upgrade_qos = upgrade_qos
        self.ignore_loop_deliver = ignore_loop_deliver
        self.rng = rng or random.Random()
        self.on_no_subscribers: Callable[[Message], None] | None = None
        self.on_route: Callable[[str, bool], None] | None = None  # the cluster's router

    # -- subscriptions ---------------------------------------------------------------

    def subscribe(self, client_id: str, topic_filter: str, options: SubOptions) -> None:
        group, real = parse_shared(topic_filter)
        if group is None:
            subs = self.plain.get(real)
            if subs is None:
                subs = self.plain[real] = {}
                if self.on_route is not None:
                    self.on_route(real, True)
            subs[client_id] = options
        else:
            groups = self.shared.setdefault(real, {})
            g = groups.get(group)
            if g is None:
                g = groups[group] = _Group()
                if self.on_route is not None:
                    self.on_route(topic_filter, True)
            if client_id not in g.options:
                g.members.add(client_id)
            g.options[client_id] = options
        self.index.add(real)

    def unsubscribe(self, client_id: str, topic_filter: str) -> None:
        group, real = parse_shared(topic_filter)
        if group is None:
            subs = self.plain.get(real)
            if subs is None or subs.pop(client_id, None) is None:
                return
            if not subs:
                del self.plain[real]
                if self.on_route is not None:
                    self.on_route(real, False)
        else:
            groups = self.shared.get(real)
            g = groups.get(group) if groups else None
            if groups is None or g is None or g.options.pop(client_id, None) is None:
                return
            g.members.remove(client_id)
            if not g.options:
                del groups[group]
                if self.on_route is not None:
                    self.on_route(topic_filter, False)
                if not groups:
                    del self.shared[real]
        if real not in self.plain and real not in self.shared:
            self.index.remove(real)

    def subscription_count(self) -> int:
        n = sum(len(s) for s in self.plain.values())
        return n + sum(len(g.options) for gs in self.shared.values() for g in gs.values())

    # -- routing ---------------------------------------------------------------------

    def route(self, message: Message, *, shared: bool = True) -> int:
        """Deliver a message to every matching local session; returns how many.

        ``shared=False`` (clustered: the cluster picks one node per shared group and
        calls :meth:`deliver_shared` there) skips the shared groups."""
        filters = self.index.lookup(message.topic)
        if not filters:
            if self.on_no_subscribers is not None:
                self.on_no_subscribers(message)
            return 0
        sessions = self.sessions
        publisher = message.publisher
        skip_self = self.ignore_loop_deliver
        count = 0
        if len(filters) == 1 and (not shared or filters[0] not in self.shared):
            # Fast path: one plain filter, no aggregation needed (what _delivery does,
            # inline: this loop runs once per subscriber of every message).
            subs = self.plain.get(filters[0])
            if subs:
                max_qos = 2 if self.upgrade_qos else message.qos
                retain = message.retain
                for client_id, opts in subs.items():
                    if (opts.no_local or skip_self) and client_id == publisher:
                        continue
                    session = sessions.get(client_id)
                    if session is None:
                        continue
                    qos = opts.qos
                    sid = opts.subscription_id
                    session.enqueue(
                        Delivery(
                            message,
                            qos if qos < max_qos else max_qos,
                            retain and opts.retain_as_published,
                            (sid,) if sid else (),
                        )
                    )
                    count += 1
        else:
            merged: dict[str, list[SubOptions]] = {}
            for f in filters:
                subs = self.plain.get(f)
                if subs:
                    for client_id, opts in subs.items():
                        if (opts.no_local or skip_self) and client_id == publisher:
                            continue
                        lst = merged.get(client_id)
                        if lst is None:
                            merged[client_id] = [opts]
                        else:
                            lst.append(opts)
                groups = self.shared.get(f) if shared else None
                if groups:
                    for name, g in groups.items():
                        count += self._route_shared(message, f, name, g)
            for client_id, optlist in merged.items():
                session = sessions.get(client_id)
                if session is None:
                    continue
                if len(optlist) == 1:
                    opts = optlist[0]
                    session.enqueue(self._delivery(message, opts.qos, opts, None))
                else:
                    qos = max(o.qos for o in optlist)
                    rap = any(o.retain_as_published for o in optlist)
                    ids = tuple(o.subscription_id for o in optlist if o.subscription_id)
                    granted = qos if self.upgrade_qos else min(qos, message.qos)
                    session.enqueue(
                        Delivery(message, granted, message.retain and rap, ids)
                    )
                count += 1
        if count == 0 and self.on_no_subscribers is not None:
            self.on_no_subscribers(message)
        return count

    def _delivery(
        self,
        message: Message,
        sub_qos: int,
        opts: SubOptions,
        share: tuple[str, str] | None,
    ) -> Delivery:
        qos = sub_qos if self.upgrade_qos else min(sub_qos, message.qos)
        sid = opts.subscription_id
        return Delivery(
            message,
            qos,
            message.retain and opts.retain_as_published,
            (sid,) if sid else (),
            share=share,
        )

    def _route_shared(self, message: Message, real: str, name: str, g: _Group) -> int:
        fallback: Session | None = None
        chosen: Session | None = None
        for member in g.members.candidates(
            self.shared_strategy, topic=message.topic, publisher=message.publisher, rng=self.rng
        ):
            session = self.sessions.get(member)
            if session is None:
                continue
            if session.handle is not None:
                chosen = session
                break
            if fallback is None:
                fallback = session
        target = chosen or fallback
        if target is None:
            return 0
        opts = g.options[target.client_id]
        target.enqueue(self._delivery(message, opts.qos, opts, (name, real)))
        return 1

    def shared_groups(self, topic: str) -> list[tuple[str, str]]:
        """``(group, real filter)`` of every local shared group matching ``topic``."""
        shared = self.shared
        if not shared:
            return []
        return [(name, f) for f in self.index.lookup(topic) for name in shared.get(f, ())]

    def deliver_shared(self, message: Message, real: str, group: str) -> int:
        """Give ``message`` to one member of the local group ``$share/group/real``
        (strategy order, online first); 0 when the group has no member with a session."""
        g = self.shared.get(real, {}).get(group)
        return 0 if g is None else self._route_shared(message, real, group, g)

    def redispatch(self, delivery: Delivery, exclude: str) -> bool:
        """Give an unacknowledged shared-subscription message to another group member."""
        if delivery.share is None:
            return False
        name, real = delivery.share
        g = self.shared.get(real, {}).get(name)
        if g is None:
            return False
        for member in g.members.candidates(
            self.shared_strategy,
            topic=delivery.message.topic,
            publisher=delivery.message.publisher,
            rng=self.rng,
        ):
            if member == exclude:
                continue
            session = self.sessions.get(member)
            if session is None:
                continue
            opts = g.options[member]
            session.enqueue(self._delivery(delivery.message, opts.qos, opts, delivery.share))
            return True
        return False
