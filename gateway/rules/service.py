"""The rule engine inside a running ``gatewayd``: assembly, persistence, operations.

:func:`start_rules` (called by :class:`gateway.app.Gateway` before its listeners open)
opens ``{node.data_dir}/rules.db`` when there is something to keep there (the rules made
at run time; the webhooks' durable queues, with their own group-commit writer), starts
the webhooks, builds the configured
rules and then the stored ones over them, attaches the engine to the node's hooks and
adds the rule and webhook series to the Prometheus registry. The management API and
``gatewayctl rules`` work through :class:`RulesService`.

Invariants:

- A rule change through the API is validated completely (SQL, functions, actions) before
  anything changes; a bad one raises ValueError and the running rules stay as they were.
- A change is saved (committed) before it is answered, so it survives a restart.
- :meth:`RulesService.stop` runs the events already queued, so what the rules accepted
  reaches the webhook queues, then commits those queues.
- The rules made at run time are kept in the node's ``{data_dir}/rules.db``
  (``gateway.shared_dir``), shared by the workers of a multi-worker node. Each worker
  polls it (``PRAGMA data_version``, every :data:`POLL` seconds) and before every API
  operation, and applies what another worker committed: a rule made, changed or deleted
  through one worker's API runs in every worker within :data:`POLL` seconds. Rule
  metrics are the node's totals (:mod:`gateway.rules.node_metrics`: each worker writes
  its counts to ``{data_dir}/rule_metrics.db`` every :data:`POLL` seconds and before a
  read, and a read sums every worker's); webhook queues are per worker.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.config import GatewayConfig
from gateway.core.node import Node
from gateway.rules.engine import Rule, RuleEngine
from gateway.rules.node_metrics import SharedMetrics, Totals, local_totals, zero_counts
from gateway.rules.sinks.base import Sink
from gateway.rules.sinks.metrics import SinksCollector
from gateway.rules.sinks.registry import make_sink
from gateway.rules.store import RuleStore
from gateway.rules.webhook import Webhook
from gateway.store.db import open_db
from gateway.store.queue import QUEUE_DB_NAME, QueueDb
from protocols.context import ClientInfo


class AlarmSink(Protocol):
    def activate(self, name: str, message: str, details: dict[str, Any] | None = None) -> None:
        ...

    def deactivate(self, name: str) -> bool: ...


class AdminPart(Protocol):
    """What the rules use of :class:`gateway.admin.admin.Admin`."""

    @property
    def alarms(self) -> AlarmSink: ...

    @property
    def prometheus_registry(self) -> Any: ...


class BridgesPart(Protocol):
    @property
    def bridges(self) -> dict[str, Any]: ...


class Gateway(Protocol):
    """What the rules use of :class:`gateway.app.Gateway` (stated here, so that
    gateway.rules does not import gateway.app, which imports it)."""

    @property
    def config(self) -> GatewayConfig: ...

    @property
    def node(self) -> Node | None: ...

    @property
    def bridges(self) -> BridgesPart | None: ...

    @property
    def admin(self) -> AdminPart | None: ...

    @property
    def shared_dir(self) -> Path: ...

    @property
    def worker(self) -> int | None: ...

__all__ = ["RulesService", "rule_view", "start_rules"]

log = logging.getLogger("gateway.rules")

_ID_RE = re.compile(r"[A-Za-z0-9_\-]{1,64}")
DB_NAME = QUEUE_DB_NAME
POLL = 1.0  # seconds between looks at the shared rule store
METRICS_DB_NAME = "rule_metrics.db"  # the node's summed rule metrics (workers > 1)


def _rfc3339(t: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat(timespec="milliseconds")


def _action_view(a: Any, counts: tuple[int, int], webhooks: dict[str, Webhook]
                 ) -> dict[str, Any]:
    view = {"function": a.function, "success": counts[0], "failed": counts[1]}
    if a.function.startswith("webhook:") and a.function[8:] in webhooks:
        view["queue_depth"] = webhooks[a.function[8:]].queue.depth
    return view


def rule_view(rule: Rule, node: str, webhooks: dict[str, Webhook] | None = None,
              totals: Totals | None = None) -> dict[str, Any]:
    """A rule in EMQX 5's JSON shape (plus ``origin``, per-action metrics and, for a
    webhook action, its queue's depth); the counts are ``totals`` (default: this
    process's)."""
    t = totals if totals is not None else local_totals(rule)
    return {
        "id": rule.id,
        "name": rule.id,
        "sql": rule.sql,
        "actions": [{"function": a.function, "args": a.args} for a in rule.actions],
        "enable": rule.enable,
        "description": rule.description,
        "created_at": _rfc3339(rule.created_at),
        "from": list(rule.program.sources),
        "origin": rule.origin,
        "metrics": t.metrics.as_dict(),
        "node_metrics": [{"node": node, "metrics": t.metrics.as_dict()}],
        "action_metrics": [_action_view(a, c, webhooks or {})
                           for a, c in zip(rule.actions, t.actions, strict=True)],
        "last_error": rule.metrics.last_error,
    }


class RulesService:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        config = gateway.config
        node = gateway.node
        assert node is not None
        self.node = node
        self.node_name = config.node.name
        self.loop = asyncio.get_running_loop()
        # rules.db is opened only when needed: webhooks configured, rules saved before,
        # or the first rule saved through the API (a node without rules makes no file)
        self.path = Path(config.node.data_dir) / DB_NAME
        enabled = {name: cfg for name, cfg in config.webhooks.items() if cfg.enable}
        connectors = config.connectors.enabled()
        self.db: QueueDb | None = (QueueDb.open(self.path, self.loop)
                                   if enabled or connectors else None)
        # run-time rules: in the node's data_dir (shared by the workers of a node)
        self.store_path = Path(gateway.shared_dir) / DB_NAME
        self._store: RuleStore | None = (
            RuleStore(open_db(self.store_path)) if self.store_path.exists() else None
        )
        self._store_version = -1
        self._poll_timer: asyncio.TimerHandle | None = None
        # the node's rule metrics, summed over its workers (gateway.rules.node_metrics)
        worker = getattr(gateway, "worker", None)
        self.shared_metrics: SharedMetrics | None = None
        if worker is not None and config.rule_engine.enable:
            self.shared_metrics = SharedMetrics(
                open_db(Path(gateway.shared_dir) / METRICS_DB_NAME), worker)
        self.webhooks: dict[str, Webhook] = {}
        if self.db is not None:
            self.webhooks = {
                name: Webhook(name, cfg, self.db, alarm=self._alarm)
                for name, cfg in enabled.items()
            }
        # the data-integration sinks, by "KIND:NAME" (gateway.rules.sinks)
        self.sinks: dict[str, Sink[Any]] = {}
        if self.db is not None:
            for sid, ccfg in connectors.items():
                kind, _, cname = sid.partition(":")
                self.sinks[sid] = make_sink(kind, cname, ccfg, self.db, alarm=self._alarm)

        def lookup(cid: str) -> ClientInfo | None:
            s = node.sessions.get(cid)
            return s.info if s is not None else None

        def session_expiry(cid: str) -> int:
            s = node.sessions.get(cid)
            return int(s.expiry_interval) if s is not None else 0

        def sockname(cid: str) -> str | None:
            s = node.sessions.get(cid)
            get = getattr(s.handle, "sockname", None) if s is not None else None
            return get() if get is not None else None

        self.engine = RuleEngine(
            node_name=self.node_name,
            publish=node.publish,
            lookup=lookup,
            session_expiry=session_expiry,
            sockname=sockname,
            webhooks=self.webhooks,
            bridges=lambda: gateway.bridges.bridges if gateway.bridges is not None else {},
            metrics=node.metrics,
            max_pending=config.rule_engine.max_pending,
            call_soon=self.loop.call_soon,
        )
        self.engine.sinks = self.sinks

    @property
    def store(self) -> RuleStore:
        if self._store is None:
            self._store = RuleStore(open_db(self.store_path))
            self._store_version = self._store.data_version()
        return self._store

    def refresh(self) -> bool:
        """Apply what another process (a sibling worker) committed to the rule store
        since the last look; True when something was applied."""
        store = self._store
        if store is None:
            if not self.store_path.exists():
                return False
            store = self._store = RuleStore(open_db(self.store_path))
        version = store.data_version()
        if version == self._store_version:
            return False
        self._store_version = version
        engine = self.engine
        changed = False
        for rid, spec in store.load():
            current = engine.rules.get(rid)
            if spec is None:
                changed = engine.delete(rid) or changed
            elif current is None or current.spec() != spec:
                try:
                    engine.put(engine.build(rid, spec, "api"))
                except ValueError as exc:
                    log.error("stored rule %s not loaded: %s", rid, exc)
                    continue
                changed = True
                log.info("rule %s changed by another worker", rid)
        return changed

    def _poll(self) -> None:
        try:
            self.refresh()
        except Exception:
            log.exception("reading the shared rule store failed")
        if self.shared_metrics is not None:
            try:
                self.shared_metrics.flush(self.engine.rules)
            except Exception:
                log.exception("writing the node's rule metrics failed")
        self._poll_timer = self.loop.call_later(POLL, self._poll)

    def _alarm(self, name: str, message: str | None) -> None:
        admin = self.gateway.admin
        if admin is None:
            return
        if message is None:
            admin.alarms.deactivate(name)
        else:
            admin.alarms.activate(name, message)

    async def start(self) -> None:
        engine = self.engine
        config = self.gateway.config
        if config.rule_engine.enable:
            for name, rc in config.rule_engine.rules.items():
                engine.put(engine.build(name, rc.model_dump(), "config"))
            if self._store is not None:
                self._store_version = self._store.data_version()
            for rid, spec in (self._store.load() if self._store is not None else []):
                if spec is None:
                    engine.delete(rid)
                    continue
                try:
                    engine.put(engine.build(rid, spec, "api"))
                except ValueError as exc:
                    log.error("stored rule %s not loaded: %s", rid, exc)
        for hook in self.webhooks.values():
            await hook.start()
        for sink in self.sinks.values():
            await sink.start()
        engine.attach(self.node.hooks)
        if config.rule_engine.enable:
            self._poll_timer = self.loop.call_later(POLL, self._poll)
        admin = self.gateway.admin
        if admin is not None:
            admin.prometheus_registry.register(RulesCollector(self))
            admin.prometheus_registry.register(SinksCollector(lambda: self.sinks.values()))
        if engine.rules or self.webhooks:
            log.info("rule engine: %d rule(s), %d webhook(s)", len(engine.rules),
                     len(self.webhooks))

    async def stop(self) -> None:
        if self._poll_timer is not None:
            self._poll_timer.cancel()
            self._poll_timer = None
        engine = self.engine
        engine.detach()
        left = engine.waiting
        while engine.pending:  # what the rules accepted reaches the queues
            engine.drain()
        if engine.rules:
            log.info("rule engine stopped: %d events run (%d at shutdown), %d dropped",
                     engine.events_run, left, engine.dropped)
        for hook in self.webhooks.values():
            await hook.stop()
        for sink in self.sinks.values():
            await sink.stop()
        if self.db is not None:
            self.db.close()  # commits the queues' last writes (joins the writer thread)
        if self._store is not None:
            self._store.conn.close()
        if self.shared_metrics is not None:
            try:
                self.shared_metrics.flush(self.engine.rules)
            finally:
                self.shared_metrics.conn.close()

    # -- operations (API, gatewayctl) ----------------------------------------------------

    def _refresh_quietly(self) -> None:
        if self.gateway.config.rule_engine.enable:
            try:
                self.refresh()
            except Exception:
                log.exception("reading the shared rule store failed")

    def totals(self) -> dict[str, Totals]:
        """Each rule's counts: the node's (every worker's) on a multi-worker node."""
        rules = self.engine.rules
        if self.shared_metrics is not None:
            try:
                return self.shared_metrics.totals(rules)
            except Exception:
                log.exception("reading the node's rule metrics failed; this worker's shown")
        return {rid: local_totals(r) for rid, r in rules.items()}

    def views(self) -> list[dict[str, Any]]:
        self._refresh_quietly()
        totals = self.totals()
        return [rule_view(r, self.node_name, self.webhooks, totals[r.id])
                for r in self.engine.rules.values()]

    def get(self, rule_id: str) -> dict[str, Any] | None:
        self._refresh_quietly()
        r = self.engine.rules.get(rule_id)
        if r is None:
            return None
        return rule_view(r, self.node_name, self.webhooks, self.totals()[rule_id])

    def create(self, spec: dict[str, Any]) -> dict[str, Any]:
        self._refresh_quietly()
        rid = spec.get("id") or spec.get("name")
        if rid is None:
            n = len(self.engine.rules) + 1
            while f"rule_{n}" in self.engine.rules:
                n += 1
            rid = f"rule_{n}"
        if not isinstance(rid, str) or not _ID_RE.fullmatch(rid):
            raise ValueError("id: letters, digits, '_' and '-', at most 64")
        if rid in self.engine.rules:
            raise KeyError(rid)
        return self._save(rid, spec)

    def update(self, rule_id: str, changes: dict[str, Any]) -> dict[str, Any] | None:
        self._refresh_quietly()
        old = self.engine.rules.get(rule_id)
        if old is None:
            return None
        spec = {**old.spec(), **{k: v for k, v in changes.items() if k not in ("id", "name")}}
        return self._save(rule_id, spec)

    def _save(self, rid: str, spec: dict[str, Any]) -> dict[str, Any]:
        rule = self.engine.build(rid, spec, "api")  # ValueError: nothing changes
        self.store.save(rid, rule.spec())
        self.engine.put(rule)
        log.info("rule %s saved (%s)", rid, "enabled" if rule.enable else "disabled")
        return rule_view(rule, self.node_name, self.webhooks)

    def delete(self, rule_id: str) -> bool:
        self._refresh_quietly()
        if rule_id not in self.engine.rules:
            return False
        self.store.save(rule_id, None)
        self.engine.delete(rule_id)
        if self.shared_metrics is not None:
            self.shared_metrics.forget(rule_id)
        log.info("rule %s deleted", rule_id)
        return True

    def reset_metrics(self, rule_id: str) -> bool:
        r = self.engine.rules.get(rule_id)
        if r is None:
            return False
        if self.shared_metrics is not None:
            self.shared_metrics.reset(r)  # every worker's counts
        else:
            zero_counts(r)
        return True

    def webhooks_view(self) -> list[dict[str, Any]]:
        return [w.stats() for w in self.webhooks.values()]

    def connectors_view(self) -> list[dict[str, Any]]:
        """Each sink's health, counters and buffer (``GET /api/v5/connectors``)."""
        return [s.stats() for s in self.sinks.values()]


async def start_rules(gateway: Gateway) -> RulesService:
    service = RulesService(gateway)
    await service.start()
    return service


class RulesCollector:
    """Prometheus series of the rules and webhooks (read at scrape time)."""

    def __init__(self, service: RulesService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        engine = self.service.engine
        totals = self.service.totals()  # the node's, on a multi-worker node
        fams = {
            k: CounterMetricFamily(f"gateway_rule_{k}", f"Rule events: {k}.", labels=["rule"])
            for k in ("matched", "passed", "failed", "no_result")
        }
        actions = CounterMetricFamily("gateway_rule_actions", "Rule action runs.",
                                      labels=["rule", "action", "result"])
        for r in engine.rules.values():
            t = totals[r.id]
            m = t.metrics
            fams["matched"].add_metric([r.id], m.matched)
            fams["passed"].add_metric([r.id], m.passed)
            fams["failed"].add_metric([r.id], m.failed)
            fams["no_result"].add_metric([r.id], m.no_result)
            for i, (a, (ok, failed)) in enumerate(zip(r.actions, t.actions, strict=True)):
                label = f"{i}:{a.function}"
                actions.add_metric([r.id, label, "success"], ok)
                actions.add_metric([r.id, label, "failed"], failed)
        yield from fams.values()
        yield actions
        yield GaugeMetricFamily("gateway_rules_pending", "Events waiting for the rules.",
                                value=engine.waiting)
        yield CounterMetricFamily("gateway_rules_dropped", "Events dropped (engine overloaded).",
                                  value=engine.dropped)
        depth = GaugeMetricFamily("gateway_webhook_queue_depth", "Requests queued.",
                                  labels=["webhook"])
        qbytes = GaugeMetricFamily("gateway_webhook_queue_bytes", "Bytes queued.",
                                   labels=["webhook"])
        reqs = CounterMetricFamily("gateway_webhook_requests", "Requests by outcome.",
                                   labels=["webhook", "result"])
        for w in self.service.webhooks.values():
            depth.add_metric([w.name], w.queue.depth)
            qbytes.add_metric([w.name], w.queue.bytes)
            reqs.add_metric([w.name, "success"], w.success)
            reqs.add_metric([w.name, "failed"], w.failed)
            reqs.add_metric([w.name, "dropped"], w.dropped)
        yield from (depth, qbytes, reqs)
