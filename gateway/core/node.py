"""The broker core of one node: the :class:`~protocols.context.GatewayContext` every
front-end talks to.

It owns the session registry, the local broker (routing), the retainer, authorization,
hooks, metrics and the timers for wills and session expiry. No sockets here.

Invariants:
- ``sessions[cid].handle`` is the one live connection of ``cid`` (or None when offline).
- A connection that was taken over no longer owns its session: its ``close`` only
  settles its own will (MQTT 5 3.1.3.2.2: sent unless the new connection resumes the
  session and the will has a delay).
- A will is published at the earlier of its delay and the end of the session, and
  never when the session is resumed first.
- A session with expiry 0 ends when its connection closes; its unacknowledged shared
  subscription messages go to another member of the group.

Cluster hooks (gateway.cluster attaches itself with :meth:`Node.attach_cluster`):
``publish`` routes locally, then hands the message to ``cluster.forward``, which queues it
for the other nodes whose routes match; a message forwarded by another node enters
through :meth:`Node.inject`, which routes it locally only (never forwarded again).
``open_session`` asks ``cluster.takeover`` when the client id has no session here (a
session on another node is moved here, or ended there for a clean start), and
``_terminate`` tells ``cluster.session_ended`` (the cluster's session registry).
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.core.authz import Authorizer
from gateway.core.broker import Broker
from gateway.core.clock import Scheduler
from gateway.core.deferred import Deferred, fold_deferred
from gateway.core.hooks import Hooks, Priority
from gateway.core.journal import NodeJournal, StoredSession
from gateway.core.metrics import Metrics
from gateway.core.retainer import Retainer
from gateway.core.session import NEVER_EXPIRE, Session, SessionConfig
from protocols.context import (
    AUTH_PENDING,
    PUBLISH_REFUSED,
    RESUBSCRIBED,
    SUBSCRIBED,
    AuthExchange,
    ClientInfo,
    ConnectionHandle,
    ConnectResult,
    Delivery,
    Message,
    SubOptions,
)
from protocols.mqtt.reason_codes import ReasonCode
from protocols.mqtt.topics import parse_shared

log = logging.getLogger("gateway.core")


@dataclass(slots=True)
class CoreSettings:
    """The subset of ``[mqtt]``/``[retainer]``/... that the core itself needs."""

    node_name: str = "gateway@127.0.0.1"
    max_mqueue_len: int = 1000
    mqueue_store_qos0: bool = True
    mqueue_overflow: str = "drop_oldest"
    shared_subscription_strategy: str = "round_robin"
    upgrade_qos: bool = False
    ignore_loop_deliver: bool = False
    allow_anonymous: bool = True
    retainer_enable: bool = True
    max_retained_messages: int = 0
    max_retained_payload_size: int = 0
    authz_cache_ttl: float = 60.0  # 0 disables the per-client authorization cache
    authz_cache_max: int = 32


class Node:
    def __init__(
        self,
        settings: CoreSettings,
        scheduler: Scheduler,
        *,
        authorizer: Authorizer | None = None,
        rng: random.Random | None = None,
        store: NodeJournal | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        # 0 while the store can take durable writes; otherwise the MQTT 5 reason code
        # (0x97) with which QoS 1/2 publishes and persistent sessions are refused
        # (set by gateway.store.space.StoreGuard: disk full, write errors, size cap)
        self.store_refusal = 0
        self.scheduler = scheduler
        self.metrics = Metrics()
        self.hooks = Hooks()
        self.sessions: dict[str, Session] = {}
        self.broker = Broker(
            self.sessions,
            shared_strategy=settings.shared_subscription_strategy,
            upgrade_qos=settings.upgrade_qos,
            ignore_loop_deliver=settings.ignore_loop_deliver,
            rng=rng,
        )
        self.broker.on_no_subscribers = self._no_subscribers
        self.authz_generation = 0
        self._authorizer = authorizer or Authorizer([], "allow")
        self.retainer = Retainer(
            max_messages=settings.max_retained_messages,
            max_payload_size=settings.max_retained_payload_size,
            now=scheduler.time,
            on_refused=self._retain_refused,
        )
        self.retainer.journal = store
        if settings.retainer_enable:
            self.hooks.add("message.publish", self._retain_hook, Priority.RETAINER)
        self._retainer_only = (self._retain_hook,)
        # message.publish subscribers for topics under a $-prefix (add_publish_prefix)
        self._prefixed: tuple[tuple[str, Callable[[Message], int | None]], ...] = ()
        self._counters = self.metrics.counters  # the hot path increments directly
        self._active_hooks = self.hooks.active
        self.connections = 0
        # client.disconnected subscribers that never read attrs["sockname"] (the $SYS
        # client events): when they are the only ones, no local address is looked up
        self.sockname_unused: set[Callable[..., Any]] = set()
        # MQTT 5 enhanced authentication methods ("SCRAM-SHA-256" -> exchange factory),
        # registered by gateway.auth
        # (a MutableMapping, not a dict: the ban guard wraps it in a dict subclass whose
        # get() checks bans, and compiled code calls dict.get without looking for one)
        self.auth_methods: MutableMapping[str, Callable[[ClientInfo], AuthExchange]] = {}
        self.cluster: Any = None  # gateway.cluster.Cluster, when clustered
        # shared by every session (six slots and three bound methods less per session)
        self._session_config = SessionConfig(
            max_mqueue_len=settings.max_mqueue_len,
            store_qos0=settings.mqueue_store_qos0,
            drop_oldest=settings.mqueue_overflow == "drop_oldest",
            now=scheduler.time,
            on_drop=self._session_drop,
            on_ack=self._session_ack,
        )

    # -- GatewayContext: connection life cycle -----------------------------------------

    def now(self) -> float:
        return self.scheduler.time()

    def incr(self, metric: str, n: int = 1) -> None:
        self.metrics.incr(metric, n)

    def connack(self, client: ClientInfo, reason_code: int) -> None:
        if "client.connack" in self._active_hooks:  # (per CONNECT: no call when none)
            self.hooks.run("client.connack", client, reason_code)

    def delivered(self, client: ClientInfo, deliveries: list[Delivery]) -> None:
        self._counters["messages.sent"] += len(deliveries)
        if "message.delivered" in self._active_hooks:  # once per delivered message
            for d in deliveries:
                self.hooks.run("message.delivered", client, d.message)

    def authenticate(
        self,
        client: ClientInfo,
        password: bytes | None,
        done: Callable[[int], None] | None = None,
    ) -> int:
        """The ``client.authenticate`` chain (subscribers may answer later with a
        :class:`~gateway.core.deferred.Deferred`), then ``allow_anonymous`` for a client
        no subscriber claimed: refused with 0x86 when it presented a user name or
        password, 0x87 when it presented nothing. A client its listener already
        authenticated by a verified certificate (``attrs["authn"] == "x509"``) is in."""
        if client.attrs.get("authn") == "x509":
            self.metrics.incr("authentication.success")
            return 0
        callbacks = self._active_hooks.get("client.authenticate")
        if callbacks is None:
            return self._authn_decided(client, password, None)
        finish = functools.partial(self._authn_later, client, password, done)
        finished, result = fold_deferred(
            "client.authenticate", callbacks, (client, password), None, finish
        )
        if finished:
            return self._authn_decided(client, password, result)
        if done is None:
            log.error("authentication of %r had to wait, but the caller cannot", client)
            return ReasonCode.SERVER_UNAVAILABLE
        return AUTH_PENDING

    def _authn_later(
        self,
        client: ClientInfo,
        password: bytes | None,
        done: Callable[[int], None] | None,
        result: int | None,
    ) -> None:
        """The chain's answer came later (a subscriber returned a pending Deferred)."""
        if done is not None:
            done(self._authn_decided(client, password, result))

    def _authn_decided(self, client: ClientInfo, password: bytes | None, result: int | None) -> int:
        if result is None:
            if self.settings.allow_anonymous:
                self._counters["authentication.anonymous"] += 1
                return 0
            if client.username is None and password is None:
                result = ReasonCode.NOT_AUTHORIZED
            else:
                result = ReasonCode.BAD_USER_NAME_OR_PASSWORD
        if result:
            self.metrics.incr("authentication.failure")
            log.info(
                "authentication failed (0x%02X): client=%s username=%s peer=%s",
                result,
                client.client_id,
                client.username,
                client.peer_host,
            )
        else:
            self.metrics.incr("authentication.success")
        return result

    def enhanced_auth(self, client: ClientInfo, method: str) -> AuthExchange | None:
        """An exchange from the factory registered in ``auth_methods`` for ``method``."""
        factory = self.auth_methods.get(method)
        return None if factory is None else factory(client)

    def open_session(
        self,
        client: ClientInfo,
        handle: ConnectionHandle,
        *,
        clean_start: bool,
        expiry_interval: int,
        receive_maximum: int,
        will: Message | None,
        will_delay: int,
    ) -> ConnectResult:
        cid = client.client_id
        if expiry_interval and self.store_refusal and (clean_start or cid not in self.sessions):
            # a new persistent session is a promise to keep its messages, which the store
            # cannot; one that exists resumes (draining its queue is what frees space)
            self.metrics.incr("client.connack.refused.store")
            return ConnectResult(self.store_refusal)
        active = self._active_hooks  # per CONNECT: a hook nobody subscribes costs no call
        if "client.connect" in active:
            self.hooks.run("client.connect", client)
        existing = self.sessions.get(cid)
        present = False
        # see ConnectResult.connack_early: not after a discard or a move from elsewhere
        early = self.cluster is None and not (clean_start and existing is not None)
        if existing is None and self.cluster is not None:
            # a session of this client id on another node moves here (or ends there)
            present = bool(self.cluster.takeover(client, clean_start))
        if existing is not None:
            old_handle = existing.handle
            if old_handle is not None:
                existing.handle = None
                self.connections -= 1
                old_will = existing.will
                if old_will is not None and (clean_start or existing.will_delay == 0):
                    self._publish_will(old_will, existing.info)
                existing.will = None
                old_info = existing.info
                if old_info is not None:  # the old connection ends here (EMQX's reasons)
                    old_info.set_attr("disconnect_reason",
                                      "discarded" if clean_start else "takenover")
                    self._ended(old_info, old_handle)
                self.hooks.run("session.takenover", existing.info, client)
                self.metrics.incr("session.takenover")
                old_handle.kick(ReasonCode.SESSION_TAKEN_OVER)
            self._cancel_timers(existing)
            if clean_start:
                self._terminate(existing, "discarded")
                existing = None
            else:
                present = True
                self.hooks.run("session.resumed", client)
                self.metrics.incr("session.resumed")
        connected_at: float | None = None
        if existing is None:
            existing = self._new_session(cid, receive_maximum)
            connected_at = existing.created_at  # the same moment: one float, not two
            self.sessions[cid] = existing
            if "session.created" in active:
                self.hooks.run("session.created", client)
            self._counters["session.created"] += 1
        existing.set_receive_maximum(receive_maximum)
        existing.expiry_interval = expiry_interval
        self._set_durable(existing, expiry_interval != 0, disconnected_at=None)
        existing.handle = handle
        existing.will = will
        existing.will_delay = will_delay
        existing.info = client
        client.connected_at = self.scheduler.time() if connected_at is None else connected_at
        self.connections += 1
        self._counters["client.connected"] += 1
        if "client.connected" in active:
            self.hooks.run("client.connected", client)
        return ConnectResult(0, existing, present, expiry_interval, early)

    def _new_session(self, cid: str, receive_maximum: int) -> Session:
        return Session(cid, receive_maximum=receive_maximum, config=self._session_config)

    def _set_durable(
        self, session: Session, durable: bool, *, disconnected_at: float | None
    ) -> None:
        """Start, update or stop persisting a session (no-op without a store)."""
        store = self.store
        if store is None:
            return
        cid = session.client_id
        if not durable:
            if session.journal is not None:
                session.journal = None
                store.session_deleted(cid)
            return
        store.session_saved(cid, session.expiry_interval, session.created_at, disconnected_at)
        if session.journal is None:  # newly durable: write what it already holds
            session.journal = store
            for f, opts in session.subscriptions.items():
                store.subscribed(cid, f, opts)
            for d in [*session.inflight.values(), *session.mqueue]:
                if d.qos > 0:
                    store.queued(cid, d)
                    if d.packet_id in session.released:
                        store.released(d)
            for pid in session.awaiting_rel:
                store.awaiting_rel_added(cid, pid)

    def restore(self, stored: Sequence[StoredSession], retained: Sequence[Message]) -> None:
        """Rebuild persisted state at start-up (every session is offline)."""
        now = self.scheduler.time()
        for m in retained:
            if m.expires_at is None or m.expires_at > now:
                self.retainer.store(m, journal=False)
        for st in stored:
            session = self._new_session(st.client_id, 65535)
            session.created_at = st.created_at
            session.expiry_interval = st.expiry_interval
            session.journal = self.store
            for f, opts in st.subscriptions.items():
                session.subscribed(f, opts)
                self.broker.subscribe(st.client_id, f, opts)
            for d in st.deliveries:
                if d.packet_id is not None:
                    session.inflight_restored(d)
                else:
                    session.queue_restored(d)
            released = {pid: None for pid in st.released if pid in session.inflight}
            if released:
                session.released = released
            for pid in st.awaiting_rel:
                session.awaiting_rel_restored(pid, now)
            self.sessions[st.client_id] = session
            if st.expiry_interval != NEVER_EXPIRE:
                left = st.expiry_interval - (now - (st.disconnected_at or now))
                session.expiry_timer = self.scheduler.call_later(
                    max(0.0, left), functools.partial(self._expire, session)
                )
        if stored or retained:
            log.info(
                "restored %d persistent sessions (%d queued messages) and %d retained messages",
                len(stored),
                sum(len(s.deliveries) for s in stored),
                len(retained),
            )

    def _ended(self, client: ClientInfo, handle: ConnectionHandle) -> None:
        """A connection ended: count it and run ``client.disconnected`` (the hook sees
        the connection's local address as ``attrs["sockname"]``, looked up only when a
        subscriber not in :attr:`sockname_unused` is there to read it)."""
        self._counters["client.disconnected"] += 1
        callbacks = self._active_hooks.get("client.disconnected")
        if callbacks is None:
            return
        if "sockname" not in client.attrs and not self.sockname_unused.issuperset(callbacks):
            sockname = getattr(handle, "sockname", None)
            if sockname is not None:
                client.set_attr("sockname", sockname())
        self.hooks.run("client.disconnected", client)

    def close(
        self,
        client: ClientInfo,
        handle: ConnectionHandle,
        *,
        send_will: bool,
        expiry_interval: int | None = None,
    ) -> None:
        session = self.sessions.get(client.client_id)
        if session is None or session.handle is not handle:
            return  # taken over (its will was settled then) or never opened
        session.handle = None
        self.connections -= 1
        self._ended(client, handle)
        if expiry_interval is not None:
            session.expiry_interval = expiry_interval
        expiry = session.expiry_interval
        if expiry != 0:
            self._set_durable(session, True, disconnected_at=self.scheduler.time())
        will = session.will if send_will else None
        session.will = None
        if will is not None:
            delay = session.will_delay
            if delay == 0 or expiry == 0:
                self._publish_will(will, session.info)
            else:
                wait = delay if expiry == NEVER_EXPIRE else min(delay, expiry)
                session.will = will
                session.will_timer = self.scheduler.call_later(
                    wait, lambda: self._will_due(session)
                )
        if expiry == 0:
            self._terminate(session, "terminated")
        elif expiry != NEVER_EXPIRE:
            session.expiry_timer = self.scheduler.call_later(  # (a partial: no closure
                expiry, functools.partial(self._expire, session)  # kept per session)
            )

    def _will_due(self, session: Session) -> None:
        session.will_timer = None
        will, session.will = session.will, None
        if will is not None and session.handle is None:
            self._publish_will(will, session.info)

    def _expire(self, session: Session) -> None:
        session.expiry_timer = None
        if self.sessions.get(session.client_id) is session and session.handle is None:
            if session.will is not None:  # the session ends before the will delay
                self._publish_will(session.will, session.info)
                session.will = None
            self._terminate(session, "expired")

    def _cancel_timers(self, session: Session) -> None:
        for attr in ("will_timer", "expiry_timer"):
            timer = getattr(session, attr)
            if timer is not None:
                timer.cancel()
                setattr(session, attr, None)
        session.will = None

    def _terminate(self, session: Session, why: str) -> None:
        cid = session.client_id
        if self.sessions.get(cid) is session:
            del self.sessions[cid]
            if self.cluster is not None:
                self.cluster.session_ended(cid)
        if session.journal is not None:
            self._set_durable(session, False, disconnected_at=None)
        subs = session.subscriptions
        if subs:  # (most clean sessions of a connect storm have none: no list, no loop)
            for f in list(subs):
                self.broker.unsubscribe(cid, f)
            subs.clear()
        if session.inflight or session.mqueue:
            for d in session.take_undelivered():
                if d.share is not None and (
                    self.broker.redispatch(d, cid)
                    or (self.cluster is not None and self.cluster.reshare(d.message, *d.share))
                ):
                    self.metrics.incr("messages.shared.redispatched")
                elif d.qos > 0 or d.share is not None:
                    self.metrics.dropped("session_ended")
        if "session.terminated" in self._active_hooks:
            self.hooks.run("session.terminated", session.info, why)
        self._counters["session.terminated"] += 1

    def _publish_will(self, will: Message, info: ClientInfo | None) -> None:
        """Publish a will as its client: authorized with the client's own information
        (``info``, the session's last connection: who authenticated it, superuser, peer
        address), so per-user rules apply to wills as to the client's publishes."""
        will.timestamp = self.scheduler.time()
        self.metrics.incr("messages.will")
        if info is None or info.client_id != will.publisher:
            info = ClientInfo(client_id=will.publisher, username=will.username)
        allowed = self.authorize(info, "publish", will.topic, True)
        if allowed is True:
            self.publish(info, will)
        elif allowed is not False:  # asked for: published when allowed
            asker = info

            def answered(ok: bool) -> None:
                if ok:
                    self.publish(asker, will)

            allowed.add_callback(answered)

    # -- GatewayContext: messages ------------------------------------------------------

    @property
    def authorizer(self) -> Authorizer:
        return self._authorizer

    @authorizer.setter
    def authorizer(self, value: Authorizer) -> None:
        """Replacing the rules (a reload) invalidates every client's cached decisions."""
        self._authorizer = value
        self.authz_generation += 1

    def authorize(
        self, client: ClientInfo, action: str, topic: str, wait: bool = False
    ) -> bool | Deferred[bool]:
        """The rules, then the ``client.authorize`` hooks; publish decisions are cached
        per client for ``authz_cache_ttl`` seconds (EMQX's authorization cache), at most
        ``authz_cache_max`` of them, and dropped when the rules are replaced.

        A hook may answer later (a :class:`~gateway.core.deferred.Deferred`: an HTTP
        source asking its service); the decision is then a Deferred resolved with it
        when ``wait`` is true, else False (see ``GatewayContext.authorize``). A decision
        that came later is cached like one that did not."""
        ttl = self.settings.authz_cache_ttl
        if ttl <= 0 or action != "publish":
            # Only publishes repeat: a client subscribes once or rarely, and a cached
            # subscribe decision would stay with every idle client (~370 bytes each).
            return self._authorize(client, action, topic, wait)
        cache = client.authz_cache
        key = topic  # publish decisions only: the topic is the key
        now = self.scheduler.time()
        if cache is not None:
            hit = cache.get(key)
            if hit is not None and hit[1] > now and hit[2] == self.authz_generation:
                if not hit[0]:
                    self.metrics.incr("authorization.deny")
                    self.metrics.incr("authorization.cache_hit")
                return hit[0]
        else:
            cache = client.authz_cache = {}
        allowed = self._authorize(client, action, topic, wait)
        if allowed is not True and allowed is not False:  # pending: cache the answer
            entry_cache, generation = cache, self.authz_generation

            def store(ok: bool) -> None:
                if len(entry_cache) >= self.settings.authz_cache_max:
                    entry_cache.clear()
                entry_cache[key] = (ok, now + ttl, generation)

            allowed.add_callback(store)
            return allowed
        if len(cache) >= self.settings.authz_cache_max:
            cache.clear()
        cache[key] = (allowed, now + ttl, self.authz_generation)
        return allowed

    def _authorize(
        self, client: ClientInfo, action: str, topic: str, wait: bool = False
    ) -> bool | Deferred[bool]:
        hooks = self.hooks
        if hooks.has("topic.rewrite") or hooks.has("topic.authorize"):
            topic = self.authorized_topic(client, action, topic)
        checked = parse_shared(topic)[1] if action == "subscribe" else topic
        allowed: bool = self.authorizer.check(
            action,  # type: ignore[arg-type]
            checked,
            clientid=client.client_id,
            username=client.username,
            peer_ip=client.peer_host,
            client_attrs=client.attrs.get("client_attrs"),  # a JWT's (gateway.auth.jwt)
        )
        if hooks.has("client.authorize"):
            later: Deferred[bool] | None = None

            def finish(value: Any) -> None:
                if later is not None:  # (None: the caller could not wait, it was denied)
                    later.resolve(self._authz_decided(client, action, topic, bool(value)))

            finished, result = fold_deferred(
                "client.authorize", hooks.callbacks("client.authorize"),
                (client, action, topic), allowed, finish,
            )
            if not finished:
                if wait:
                    later = Deferred()
                    return later
                log.error("authorization of %s %s for %r had to wait, but the caller "
                          "cannot: denied", action, topic, client.client_id)
                return self._authz_decided(client, action, topic, False)
            allowed = bool(result)
        return self._authz_decided(client, action, topic, allowed)

    def _authz_decided(self, client: ClientInfo, action: str, topic: str, allowed: bool
                       ) -> bool:
        if not allowed:
            self.metrics.incr("authorization.deny")
            log.info(
                "authorization denied: client=%s username=%s peer=%s action=%s topic=%s",
                client.client_id,
                client.username,
                client.peer_host,
                action,
                topic,
            )
        return allowed

    def publish(self, client: ClientInfo, message: Message) -> int:
        self._counters["messages.received"] += 1
        if self.store_refusal and message.payload and (message.qos or message.retain):
            # (an empty retained message deletes one: it frees space, so it goes through)
            if message.qos:
                self.metrics.incr("messages.refused.store")
                return PUBLISH_REFUSED
            message.retain = False  # QoS 0: delivered live, not retained
            self.metrics.incr("messages.retain_refused.store")
        hooks = self.hooks
        active = self._active_hooks  # (a dict lookup, not a call per hook name)
        rewriters = active.get("topic.rewrite")
        if rewriters:  # the fold of run_fold, inline: this is the publish path
            topic = old = message.topic
            for rewrite in rewriters:
                try:
                    new = rewrite(client, "publish", topic)
                except Exception:
                    log.exception("hook topic.rewrite: callback %r failed", rewrite)
                    continue
                if new is not None:
                    topic = new
            if topic != old:
                message.topic = topic
                message.wire = None  # the publisher's bytes carry the old topic
        if self._prefixed and message.topic[:1] == "$":
            taken = self._run_prefixed(message)
            if taken is not None:
                return taken
        callbacks = active.get("message.publish")
        # the retainer alone has nothing to do with a message that is not retained
        if callbacks and (message.retain or callbacks != self._retainer_only):
            # the fold's type is its accumulator's: Message | None, as a callback may drop
            # it (Stop(None)); a compiled caller checks a value against it (performance.md)
            acc: Message | None = message
            result = hooks.run_fold("message.publish", (), acc)
            if result is None:
                self.metrics.dropped("hook")
                return 0
            message = result
        cluster = self.cluster
        # clustered, the cluster picks one node per shared group (this one included)
        count = self.broker.route(message, shared=cluster is None)
        if cluster is not None:
            count += cluster.forward(message)
            if count == 0:
                self._no_subscribers(message)
        return count

    def inject(self, message: Message, share: tuple[str, str] | None = None) -> int:
        """A message another node forwarded: keep it if retained, route it locally only
        (to plain subscribers; with ``share=(group, filter)`` to one member of that
        shared group only: the sending node chose this node for it)."""
        self.metrics.incr("messages.forwarded.received")
        if share is not None:
            return self.broker.deliver_shared(message, share[1], share[0])
        if message.retain and self.settings.retainer_enable:
            self.retainer.on_publish(message)
        count = self.broker.route(message, shared=False)
        if count == 0:
            self.metrics.dropped("no_subscribers")
        return count

    def attach_cluster(self, cluster: Any) -> None:
        """Forward publishes through ``cluster`` (None: stop). While attached, local
        routing does not count ``no_subscribers``: the cluster may have some."""
        self.cluster = cluster
        self.broker.on_no_subscribers = None if cluster is not None else self._no_subscribers

    def subscribe(
        self, client: ClientInfo, topic_filter: str, options: SubOptions
    ) -> int:
        """Add or replace a subscription: ``RESUBSCRIBED`` when it existed, ``SUBSCRIBED``
        when new, or a reason code (>= 0x80) when a ``client.subscribe`` subscriber
        refused it (an exclusive subscription another client holds: 0x97).
        The filter goes through ``topic.rewrite`` and ``client.subscribe`` first."""
        hooks = self.hooks
        if hooks.has("topic.rewrite"):
            topic_filter = hooks.run_fold("topic.rewrite", (client, "subscribe"), topic_filter)
        if hooks.has("client.subscribe"):
            acc_filter: str | int = topic_filter  # a callback may answer a reason code
            folded = hooks.run_fold("client.subscribe", (client, options), acc_filter)
            if isinstance(folded, int):
                return folded
            topic_filter = folded
        session = self.sessions[client.client_id]
        existed = topic_filter in session.subscriptions
        session.subscribed(topic_filter, options)
        if session.journal is not None and self.store is not None:
            self.store.subscribed(client.client_id, topic_filter, options)
        self.broker.subscribe(client.client_id, topic_filter, options)
        self.hooks.run("session.subscribed", client, topic_filter, options)
        return RESUBSCRIBED if existed else SUBSCRIBED

    def deliver_retained(
        self, client: ClientInfo, topic_filter: str, options: SubOptions, existed: bool
    ) -> None:
        if options.retain_handling == 2 or (options.retain_handling == 1 and existed):
            return
        hooks = self.hooks
        if hooks.has("topic.rewrite") or hooks.has("topic.authorize"):
            topic_filter = self.authorized_topic(client, "subscribe", topic_filter)
        group, real = parse_shared(topic_filter)
        if group is not None or not self.settings.retainer_enable:
            return
        session = self.sessions.get(client.client_id)
        if session is None:
            return
        sid = (options.subscription_id,) if options.subscription_id else ()
        for msg in self.retainer.match(real):
            session.enqueue(Delivery(msg, min(options.qos, msg.qos), True, sid))

    def unsubscribe(self, client: ClientInfo, topic_filter: str) -> bool:
        hooks = self.hooks
        if hooks.has("topic.rewrite"):
            topic_filter = hooks.run_fold("topic.rewrite", (client, "subscribe"), topic_filter)
        if hooks.has("client.unsubscribe"):
            topic_filter = hooks.run_fold("client.unsubscribe", (client,), topic_filter)
        session = self.sessions.get(client.client_id)
        if session is None or session.subscriptions.pop(topic_filter, None) is None:
            return False
        self.broker.unsubscribe(client.client_id, topic_filter)
        if session.journal is not None and self.store is not None:
            self.store.unsubscribed(client.client_id, topic_filter)
        self.hooks.run("session.unsubscribed", client, topic_filter)
        return True

    def add_publish_prefix(self, prefix: str, callback: Callable[[Message], int | None]) -> None:
        """A ``message.publish`` subscriber for topics under ``prefix`` only (which
        starts with ``$``: ``$delayed/``, ``$exclusive/``), run before the
        ``message.publish`` hooks: the publish path of every other topic pays one
        character comparison for all of them. ``callback(message)`` returns None (go on)
        or what :meth:`publish` returns (the message was taken: a count, or
        :data:`PUBLISH_REFUSED`)."""
        if not prefix.startswith("$"):
            raise ValueError(f"a publish prefix starts with '$': {prefix!r}")
        self._prefixed = (*self._prefixed, (prefix, callback))

    def remove_publish_prefix(self, prefix: str, callback: Callable[[Message], int | None]
                              ) -> None:
        self._prefixed = tuple(p for p in self._prefixed if p != (prefix, callback))

    def _run_prefixed(self, message: Message) -> int | None:
        topic = message.topic
        for prefix, callback in self._prefixed:
            if topic.startswith(prefix):
                try:
                    taken = callback(message)
                except Exception:
                    log.exception("publish subscriber for %r failed", prefix)
                    continue
                if taken is not None:
                    return taken
        return None

    def authorized_topic(self, client: ClientInfo, action: str, topic: str) -> str:
        """The topic authorization checks for ``topic`` from ``client``: rewritten
        (``topic.rewrite``), then with any extension's prefix taken off
        (``topic.authorize``: ``$delayed/10/a`` -> ``a``), and that rewritten again (the
        topic a delayed message will be published to)."""
        hooks = self.hooks
        rewrite = hooks.has("topic.rewrite")
        if rewrite:
            topic = hooks.run_fold("topic.rewrite", (client, action), topic)
        if hooks.has("topic.authorize"):
            inner = hooks.run_fold("topic.authorize", (client, action), topic)
            if inner != topic and rewrite:
                inner = hooks.run_fold("topic.rewrite", (client, action), inner)
            topic = inner
        return topic

    # -- hook subscribers and callbacks ----------------------------------------------

    def _retain_hook(self, message: Message) -> Message:
        if message.retain:
            self.retainer.on_publish(message)
        return message

    def _retain_refused(self, reason: str, message: Message) -> None:
        self.metrics.incr("retained." + reason)
        log.warning("retained message on %r not stored: %s", message.topic, reason)

    def _no_subscribers(self, message: Message) -> None:
        self.metrics.dropped("no_subscribers")
        self.hooks.run("message.dropped", message, "no_subscribers")  # ($events/message_dropped)

    def _session_drop(self, reason: str, delivery: Delivery) -> None:
        self.metrics.dropped(reason)
        if reason == "queue_full":
            log.warning(
                "message queue full, dropped a message on %r (qos %d)",
                delivery.message.topic,
                delivery.qos,
            )
        self.hooks.run("message.dropped", delivery.message, reason)

    def _session_ack(self, session: Session, delivery: Delivery) -> None:
        if "message.acked" in self._active_hooks:  # once per acknowledged delivery
            self.hooks.run("message.acked", session.info, delivery.message)

    # -- introspection ---------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "connections.count": self.connections,
            "sessions.count": len(self.sessions),
            "subscriptions.count": self.broker.subscription_count(),
            "topics.count": len(self.broker.index),
            "retained.count": len(self.retainer),
        }

    # -- administration (gateway.admin) ------------------------------------------------

    def discard_session(self, client_id: str, *, send_will: bool = True) -> bool:
        """End an offline session now, as if it expired: its pending will (if any, and
        unless ``send_will`` is False) is published. False when there is no such session
        or it is connected (kick the connection first)."""
        session = self.sessions.get(client_id)
        if session is None or session.handle is not None:
            return False
        will = session.will if send_will else None
        self._cancel_timers(session)
        if will is not None:
            self._publish_will(will, session.info)
        self._terminate(session, "discarded")
        return True
