"""The rule engine: a hook subscriber that runs rules off the publish path.

Hook callbacks only classify and queue: ``message.publish`` finds the rules whose FROM
filters match the topic (a topic index of every rule's filters, a trie, never a scan of
the rules; the answer is cached per topic until the rules change) and, when there are
some, queues the message for that plan in ``pending``; the ``$events/...`` hooks do the
same for the rules naming them. ``pending`` holds ``(plan, batch)``: consecutive events
of one plan share one batch (a list), which the plan runs in one call (``Plan.many``: one
loop, the rules' counts added once per batch; in a fan-in every message of a loop turn
goes through the same plan). A *plan* (:mod:`gateway.rules.plan`) is one generated function
running exactly that tuple of rules, made once per tuple. The callback always returns the
message unchanged, so a rule can never change, delay or drop a delivery; a message no
rule wants costs a dict lookup. ``pending`` is drained by a callback
scheduled once per event-loop turn (``call_soon``), so the publisher's own routing and
acknowledgement are done before any rule runs; it runs everything queued, so the next
turn's socket reads wait for the rules of this one: a broker whose rules cannot keep up
slows its readers (as EMQX, whose rules run in the publisher's process) instead of
building an unbounded backlog.

Per event the columns are computed lazily and shared by the rules it matches (and the
statement of rules with the same SQL runs once); each rule then runs its actions for
each output. Everything that goes
wrong in a rule (the SQL on this message, an action) is counted in that rule's metrics
and logged at DEBUG (a rule's failures are the operator's data, not our bug); nothing
escapes to the core.

Invariants:

- Hooks are registered only for sources some enabled rule uses (``message.delivered``
  costs nothing while no rule reads ``$events/message_delivered``).
- Events run in the order they were queued (a batch only ever holds consecutive events
  of one plan; a batch being run takes no more events).
- ``pending`` holds at most ``max_pending`` events (``waiting``); past that an event is counted in
  ``rules.dropped`` (node metrics) and a warning logged once per overload.
- Rule changes (``put``/``delete``) replace the rule object and drop the cached plans:
  an event queued before the change runs against the rules it matched when it was queued.
- A message a rule republished (``headers["republish_by"]``) is not seen by that rule.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, cast

from gateway.core.hooks import Hooks, Priority
from gateway.core.metrics import Metrics
from gateway.core.topic_index import TopicIndex, topic_matches
from gateway.rules.actions import build_action
from gateway.rules.compiler import Columns, compile_sql
from gateway.rules.events import EVENT_HOOKS, GETTERS, Event, props_map
from gateway.rules.plan import Plan, make_plan
from gateway.rules.rule import ActionSlot, Rule, RuleMetrics
from protocols.context import ClientInfo, Message, SubOptions

__all__ = ["BATCH", "Rule", "RuleEngine", "RuleMetrics"]

log = logging.getLogger("gateway.rules")

REPUBLISH_BY = "republish_by"  # Message.headers key: the rule that republished it
BATCH = 100_000  # events run per call; more (queued by the rules' own actions) go next turn
TOPIC_CACHE = 10_000  # topics whose plan is remembered (all forgotten when full)
_MISS = object()


class RuleEngine:
    """See the module docstring."""

    def __init__(
        self,
        *,
        node_name: str,
        publish: Callable[[ClientInfo, Message], Any],
        lookup: Callable[[str], ClientInfo | None] = lambda cid: None,
        session_expiry: Callable[[str], int] = lambda cid: 0,
        sockname: Callable[[str], str | None] = lambda cid: None,
        webhooks: Mapping[str, Any] | None = None,
        bridges: Callable[[], Mapping[str, Any]] = dict,
        metrics: Metrics | None = None,
        max_pending: int = 100_000,
        call_soon: Callable[[Callable[[], None]], Any] | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.node_name = node_name
        self._publish = publish
        self._lookup = lookup
        self._session_expiry = session_expiry
        self._sockname = sockname
        self.webhooks: Mapping[str, Any] = webhooks or {}
        self.sinks: Mapping[str, Any] = {}  # "KIND:NAME" -> gateway.rules.sinks Sink (service)
        self._bridges = bridges
        self.metrics = metrics if metrics is not None else Metrics()
        self.max_pending = max_pending
        self._call_soon = call_soon
        self._now = now
        self.rules: dict[str, Rule] = {}
        self._index = TopicIndex()
        self._by_filter: dict[str, tuple[Rule, ...]] = {}
        self._by_hook: dict[str, tuple[Rule, ...]] = {}
        self._plans: dict[tuple[str, tuple[int, ...]], Plan] = {}
        self._topic_plans: dict[str, Plan | None] = {}
        self._hook_plans: dict[str, Plan] = {}
        self._hooks: Hooks | None = None
        self._registered: dict[str, Callable[..., Any]] = {}
        self.pending: deque[tuple[Plan, list[Any]]] = deque()
        self.waiting = 0  # events in pending
        self._tail_plan: Plan | None = None  # the plan of pending's last, still open, batch
        self._tail: list[Any] = []
        self._scheduled = False
        self._overloaded = False
        self.dropped = 0
        self.events_run = 0

    # -- ActionContext ----------------------------------------------------------------

    def publish(self, rule_id: str, message: Message) -> None:
        message.headers = {REPUBLISH_BY: rule_id}
        self._publish(ClientInfo(client_id=rule_id), message)

    def webhook(self, name: str) -> Any:
        return self.webhooks.get(name)

    def bridge(self, name: str) -> Any:
        return self._bridges().get(name)

    def now(self) -> float:
        return self._now()

    # -- rules ------------------------------------------------------------------------

    def build(self, rule_id: str, spec: Mapping[str, Any], origin: str = "api") -> Rule:
        """A rule from its spec (``sql``, ``actions``, ``enable``, ``description``);
        ValueError (SqlError for the SQL) with a one-line reason."""
        sql = spec.get("sql")
        if not isinstance(sql, str) or not sql.strip():
            raise ValueError("sql: missing")
        program = compile_sql(sql)
        actions: list[ActionSlot] = []
        raw = spec.get("actions") or []
        if not isinstance(raw, list):
            raise ValueError("actions: expected a list")
        for i, a in enumerate(raw):
            if isinstance(a, str):
                a = {"function": a, "args": {}}
            if not isinstance(a, dict) or not isinstance(a.get("function"), str):
                raise ValueError(f"actions[{i}]: expected {{function, args}}")
            function, args = a["function"], dict(a.get("args") or {})
            try:
                run = build_action(rule_id, function, args, self)
            except ValueError as exc:
                raise ValueError(f"actions[{i}]: {exc}") from None
            if function.startswith("webhook:") and function[8:] not in self.webhooks:
                raise ValueError(f"actions[{i}]: no [webhooks.{function[8:]}] configured")
            if function.startswith("bridge:") and function[7:] not in self._bridges():
                raise ValueError(f"actions[{i}]: no [bridges.mqtt.{function[7:]}] running")
            actions.append(ActionSlot(function, args, run))
        enable = spec.get("enable", True)
        if not isinstance(enable, bool):
            raise ValueError("enable: expected true or false")
        return Rule(
            rule_id, sql, program, actions, enable, str(spec.get("description") or ""),
            float(spec.get("created_at") or self._now()), origin,
        )

    def put(self, rule: Rule) -> None:
        old = self.rules.get(rule.id)
        if old is not None and old.sql == rule.sql:
            rule.metrics = old.metrics  # an update that keeps the SQL keeps the counts
        self.rules[rule.id] = rule
        self._rebuild()

    def delete(self, rule_id: str) -> bool:
        if self.rules.pop(rule_id, None) is None:
            return False
        self._rebuild()
        return True

    def _rebuild(self) -> None:
        index = TopicIndex()
        by_filter: dict[str, list[Rule]] = {}
        by_hook: dict[str, list[Rule]] = {}
        for rule in self.rules.values():
            if not rule.enable:
                continue
            for f in rule.topics:
                index.add(f)
                by_filter.setdefault(f, []).append(rule)
            for ev in rule.events:
                by_hook.setdefault(EVENT_HOOKS[ev], []).append(rule)
        self._index = index
        self._by_filter = {f: tuple(rs) for f, rs in by_filter.items()}
        self._by_hook = {h: tuple(rs) for h, rs in by_hook.items()}
        self._plans = {}
        self._topic_plans = {}
        self._hook_plans = {h: self.plan(h, rs) for h, rs in self._by_hook.items()}
        if self._hooks is not None:
            self._register(self._hooks)

    # -- hooks ------------------------------------------------------------------------

    def attach(self, hooks: Hooks) -> None:
        self._hooks = hooks
        self._register(hooks)

    def detach(self) -> None:
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            for name, cb in self._registered.items():
                hooks.remove(name, cb)
        self._registered = {}

    def _register(self, hooks: Hooks) -> None:
        wanted: dict[str, Callable[..., Any]] = {}
        if self._by_filter:
            wanted["message.publish"] = self.on_publish
        callbacks: dict[str, Callable[..., Any]] = {
            "client.connected": self.on_connected,
            "client.disconnected": self.on_disconnected,
            "client.connack": self.on_connack,
            "session.subscribed": self.on_subscribed,
            "session.unsubscribed": self.on_unsubscribed,
            "message.delivered": self.on_delivered,
            "message.acked": self.on_acked,
            "message.dropped": self.on_dropped,
        }
        for hook in self._by_hook:
            wanted[hook] = callbacks[hook]
        for name, cb in list(self._registered.items()):
            if name not in wanted:
                hooks.remove(name, cb)
                del self._registered[name]
        for name, cb in wanted.items():
            if name not in self._registered:
                hooks.add(name, cb, Priority.LOWEST)
                self._registered[name] = cb

    def plan(self, kind: str, rules: tuple[Rule, ...]) -> Plan:
        """The (cached) plan running ``rules`` for events of hook ``kind``."""
        key = (kind, tuple(map(id, rules)))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = make_plan(rules, kind, self.node_name, self._lookup,
                                                self._now)
        return plan

    def _topic_plan(self, topic: str) -> Plan | None:
        filters = self._index.lookup(topic)
        plan: Plan | None = None
        if filters:
            by_filter = self._by_filter
            if len(filters) == 1:
                rules = by_filter[filters[0]]
            else:
                seen: dict[str, Rule] = {}
                for f in filters:
                    for r in by_filter[f]:
                        seen.setdefault(r.id, r)
                rules = tuple(seen.values())
            plan = self.plan("message.publish", rules)
        cache = self._topic_plans
        if len(cache) >= TOPIC_CACHE:
            cache.clear()
        cache[topic] = plan
        return plan

    def _queue(self, plan: Plan, x: Any) -> None:
        if self.waiting >= self.max_pending:
            self.dropped += 1
            self.metrics.incr("rules.dropped")
            if not self._overloaded:
                self._overloaded = True
                log.warning("rule engine overloaded: %d events waiting; new events are "
                            "dropped (counted in rules.dropped)", self.waiting)
            return
        self.waiting += 1
        if plan is self._tail_plan:
            self._tail.append(x)
            return
        self._tail_plan = plan
        self._tail = batch = [x]
        self.pending.append((plan, batch))
        if not self._scheduled:
            self._scheduled = True
            if self._call_soon is not None:
                self._call_soon(self.drain)

    def on_publish(self, message: Message) -> Message:
        plan = self._topic_plans.get(message.topic, _MISS)
        if plan is _MISS:
            plan = self._topic_plan(message.topic)
        if plan is not None:
            headers = message.headers
            if headers is not None and REPUBLISH_BY in headers:
                # a rule does not see what it republished itself (EMQX's loop guard)
                by = headers[REPUBLISH_BY]
                rules = tuple(r for r in cast(Plan, plan).rules if r.id != by)
                if not rules:
                    return message
                if len(rules) != len(cast(Plan, plan).rules):
                    plan = self.plan("message.publish", rules)
            # _queue, inlined: this runs for every message
            if self.waiting < self.max_pending and plan is self._tail_plan:
                self.waiting += 1
                self._tail.append(message)  # the same plan as the last: the same batch
            elif self.waiting < self.max_pending:
                self.waiting += 1
                self._tail_plan = cast(Plan, plan)
                self._tail = batch = [message]
                self.pending.append((cast(Plan, plan), batch))
                if not self._scheduled:
                    self._scheduled = True
                    if self._call_soon is not None:
                        self._call_soon(self.drain)
            else:
                self._queue(cast(Plan, plan), message)  # counts the drop
        return message

    def _event(self, kind: str, **kw: Any) -> Event:
        return Event(kind, node=self.node_name, lookup=self._lookup, at=self._now(), **kw)

    def _on(self, kind: str, **kw: Any) -> None:
        plan = self._hook_plans.get(kind)
        if plan is not None:
            self._queue(plan, self._event(kind, **kw))

    def on_connected(self, client: ClientInfo) -> None:
        if "client.connected" in self._hook_plans:
            cid = client.client_id
            self._on("client.connected", client=client, extra={
                "expiry_interval": self._session_expiry(cid), "sockname": self._sockname(cid)})

    def on_disconnected(self, client: ClientInfo) -> None:
        attrs = client.attrs
        self._on("client.disconnected", client=client, extra={
            "reason": attrs.get("disconnect_reason", "normal"),
            "sockname": attrs.get("sockname")})

    def on_connack(self, client: ClientInfo, reason_code: int) -> None:
        self._on("client.connack", client=client, extra={"reason_code": reason_code})

    def on_subscribed(self, client: ClientInfo, topic: str, options: SubOptions) -> None:
        if "session.subscribed" in self._hook_plans:
            props = props_map(client.attrs.get("sub_props"))
            if options.subscription_id is not None:
                props["Subscription-Identifier"] = options.subscription_id
            self._on("session.subscribed", client=client,
                     extra={"topic": topic, "qos": options.qos, "sub_props": props})

    def on_unsubscribed(self, client: ClientInfo, topic: str) -> None:
        if "session.unsubscribed" in self._hook_plans:
            self._on("session.unsubscribed", client=client, extra={
                "topic": topic, "unsub_props": props_map(client.attrs.get("unsub_props"))})

    def on_delivered(self, client: ClientInfo, message: Message) -> None:
        if not message.topic.startswith("$SYS/"):
            self._on("message.delivered", client=client, message=message)

    def on_acked(self, client: ClientInfo | None, message: Message) -> None:
        if not message.topic.startswith("$SYS/"):
            # the acknowledgement's properties: there while the channel handles it only
            props = client.attrs.get("puback_props") if client is not None else None
            self._on("message.acked", client=client, message=message,
                     extra={"puback_props": props_map(props)} if props is not None else None)

    def on_dropped(self, message: Message, reason: str) -> None:
        if not message.topic.startswith("$SYS/"):
            self._on("message.dropped", message=message, extra={"reason": reason})

    # -- running ----------------------------------------------------------------------

    def drain(self) -> None:
        """Run the batches pending now (up to about :data:`BATCH` events: what the rules'
        own actions queue meanwhile waits for the next call); reschedule if more wait."""
        self._tail_plan = None  # the batches taken here take no more events
        pending = self.pending
        popleft = pending.popleft
        n = 0
        for _ in range(len(pending)):
            plan, batch = popleft()
            self.waiting -= len(batch)
            n += len(batch)
            plan.many(batch)
            if n >= BATCH:
                break
        self.events_run += n
        if pending:
            if self._call_soon is not None:
                self._call_soon(self.drain)
        else:
            self._scheduled = False
            self._overloaded = False

    def run_event(self, event: Event, rules: tuple[Rule, ...]) -> None:
        """Run ``rules`` over ``event`` now (what :meth:`drain` does for a queued one)."""
        enabled = tuple(r for r in rules if r.enable)
        if enabled:
            plan = self.plan(event.kind, enabled)
            plan.run(event.message if event.kind == "message.publish" else event)

    # -- rule_test ----------------------------------------------------------------------

    def test(self, sql: str, context: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Run ``sql`` over a sample event (EMQX's "test SQL"): ``context`` gives the
        columns (``event_type`` names the event, default ``message_publish``); returns the
        outputs (empty: no match). SqlError/ValueError for bad SQL; the statement's own
        failure propagates."""
        program = compile_sql(sql)
        kind = str(context.get("event_type") or "message_publish")
        hook = "message.publish" if kind == "message_publish" else EVENT_HOOKS.get(kind)
        if hook is None:
            raise ValueError(f"unknown event_type {kind!r}")
        getters = {**GETTERS[hook]}
        event = self._event(hook)
        cols = Columns(getters, event)
        sample = _sample_context(hook, self.node_name, self._now())
        sample.update({k: v for k, v in context.items() if k != "event_type"})
        for k, v in sample.items():
            cols[k] = v
        topic = cols["topic"]
        sources = program.sources
        if hook == "message.publish":
            topics = [s for s in sources if not s.startswith("$events/")]
            if isinstance(topic, str) and topics and not any(
                topic_matches(f, topic) for f in topics
            ):
                return []
        elif f"$events/{kind}" not in sources:
            return []
        return program.run(cols)


def _sample_context(hook: str, node: str, now: float) -> dict[str, Any]:
    ms = int(now * 1000)
    base: dict[str, Any] = {
        "clientid": "c_emqx", "username": "u_emqx", "peerhost": "127.0.0.1",
        "timestamp": ms, "node": node, "event": hook,
    }
    if hook in ("message.publish", "message.delivered", "message.acked", "message.dropped"):
        base.update({"topic": "t/a", "payload": '{"msg": "hello"}', "qos": 1,
                     "flags": {"retain": False, "dup": False}, "pub_props": {},
                     "publish_received_at": ms, "id": "0" * 32})
    return base
