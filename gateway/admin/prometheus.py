"""Prometheus exposition (prometheus-client) of the node's stats, counters and listeners.

Read at scrape time from the core (no second set of counters on the hot path):

- ``gateway_info{node, version}`` 1, ``gateway_uptime_seconds``
- gauges from the stats: ``gateway_connections_count``, ``gateway_connections_max``,
  ``gateway_sessions_count``, ``gateway_subscriptions_count``, ``gateway_topics_count``,
  ``gateway_retained_count`` (and each ``_max``)
- counters from :class:`~gateway.core.metrics.Metrics`: ``messages.received`` becomes
  ``gateway_messages_received_total``; ``messages.dropped.<reason>`` becomes
  ``gateway_messages_dropped_reason_total{reason="<reason>"}`` next to the overall
  ``gateway_messages_dropped_total``. The usual counters are always present (0 before the
  first event) so dashboards and alerts have series from the start.
- per listener: ``gateway_listener_connections{listener, type, protocol}``,
  ``gateway_listener_max_connections``, ``gateway_listener_refused_total``
- ``gateway_clients_connected{protocol}``, ``gateway_alarms_active``,
  ``gateway_messages_rate{counter}`` (per second, last sample), ``gateway_nofile_limit``
- ``gateway_cluster_peer_up{peer}``, ``gateway_cluster_nodes_up``,
  ``gateway_cluster_nodes_total``
- the garbage collector (:mod:`gateway.gcpolicy`, while installed):
  ``gateway_gc_frozen_objects``, ``gateway_gc_full_collections_total``,
  ``gateway_gc_full_collections_complete_total`` (those that walked everything),
  ``gateway_gc_full_collection_seconds_total`` and ``..._longest_seconds``
- the standard ``process_*`` and ``python_*`` families (``python_gc_*`` included).
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway import gcpolicy

PREFIX = "gateway"
BASELINE_COUNTERS = (
    "messages.received",
    "messages.sent",
    "messages.dropped",
    "messages.will",
    "client.connected",
    "client.disconnected",
    "session.created",
    "session.resumed",
    "session.takenover",
    "session.terminated",
    "authentication.success",
    "authentication.failure",
    "authorization.deny",
    "packets.malformed",
)
DROPPED_PREFIX = "messages.dropped."
_INVALID = re.compile(r"[^a-zA-Z0-9_]")

__all__ = ["CONTENT_TYPE_LATEST", "GatewayCollector", "make_registry", "metric_name"]


def metric_name(counter: str) -> str:
    """``messages.received`` -> ``gateway_messages_received`` (the family name)."""
    return f"{PREFIX}_{_INVALID.sub('_', counter)}"


class GatewayCollector(Collector):
    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        """``snapshot()`` returns ``node``, ``version``, ``uptime``, ``stats``,
        ``counters``, ``listeners`` (list of dicts), ``protocols``, ``alarms``,
        ``rates`` and ``nofile`` (see :meth:`gateway.admin.Admin.prometheus_snapshot`)."""
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        info = GaugeMetricFamily(f"{PREFIX}_info", "Node name and version.",
                                 labels=["node", "version"])
        info.add_metric([snap["node"], snap["version"]], 1)
        yield info
        yield GaugeMetricFamily(f"{PREFIX}_uptime_seconds", "Seconds since the node started.",
                                value=snap["uptime"])
        for key, value in sorted(snap["stats"].items()):
            yield GaugeMetricFamily(metric_name(key), f"Node statistic {key}.", value=value)

        counters: dict[str, int] = dict.fromkeys(BASELINE_COUNTERS, 0)
        counters.update(snap["counters"])
        reasons = CounterMetricFamily(
            f"{PREFIX}_messages_dropped_reason",
            "Messages dropped, by reason (messages.dropped.<reason>).",
            labels=["reason"],
        )
        for key, value in sorted(counters.items()):
            if key.startswith(DROPPED_PREFIX):
                reasons.add_metric([key[len(DROPPED_PREFIX):]], value)
            else:
                yield CounterMetricFamily(metric_name(key), f"Counter {key}.", value=value)
        yield reasons

        conn = GaugeMetricFamily(f"{PREFIX}_listener_connections",
                                 "Connections open on a listener.",
                                 labels=["listener", "type", "protocol"])
        maxc = GaugeMetricFamily(f"{PREFIX}_listener_max_connections",
                                 "Connections a listener accepts at once (0: unlimited).",
                                 labels=["listener", "type", "protocol"])
        refused = CounterMetricFamily(f"{PREFIX}_listener_refused",
                                      "Connections a listener refused on accept.",
                                      labels=["listener", "type", "protocol"])
        for lst in snap["listeners"]:
            labels = [lst["id"], lst["type"], lst["protocol"]]
            conn.add_metric(labels, lst["current_connections"])
            maxc.add_metric(labels, lst["max_connections"])
            refused.add_metric(labels, lst["refused_connections"])
        yield conn
        yield maxc
        yield refused

        clients = GaugeMetricFamily(f"{PREFIX}_clients_connected",
                                    "Connected clients by protocol.", labels=["protocol"])
        for proto, n in sorted(snap["protocols"].items()):
            clients.add_metric([proto], n)
        yield clients
        rates = GaugeMetricFamily(f"{PREFIX}_messages_rate",
                                  "Messages per second over the last sample.",
                                  labels=["counter"])
        for key, value in sorted(snap["rates"].items()):
            rates.add_metric([key], value)
        yield rates
        yield GaugeMetricFamily(f"{PREFIX}_alarms_active", "Active alarms.",
                                value=snap["alarms"])
        alarm = GaugeMetricFamily(f"{PREFIX}_alarm", "1 per active alarm, by name.",
                                  labels=["name"])
        for name in snap.get("alarm_names", []):
            alarm.add_metric([name], 1)
        yield alarm
        yield from _store_metrics(snap.get("store"))
        yield from _shipper_metrics(snap.get("fleet_shipper"))
        yield from _bridge_metrics(snap.get("bridges", []))
        yield from _cluster_metrics(snap.get("cluster"))
        nofile = snap.get("nofile")
        if nofile is not None and nofile.get("soft", -1) >= 0:
            yield GaugeMetricFamily(f"{PREFIX}_nofile_limit",
                                    "The process's soft open-file limit.",
                                    value=nofile["soft"])


def _shipper_metrics(sh: dict[str, Any] | None) -> Iterator[Metric]:
    """gateway-fleet ship's state (gateway.fleet.shipper.view); nothing when it is off."""
    if not sh:
        return
    gauges = (
        ("fleet_ship_last_success_timestamp_seconds", "Last successful ship pass (0: never).",
         sh.get("last_success") or 0),
        ("fleet_ship_pending_bytes", "Sealed segment bytes waiting to be shipped.",
         sh["pending_bytes"]),
        ("fleet_ship_pending_segments", "Sealed segments waiting to be shipped.",
         sh["pending_segments"]),
        ("fleet_ship_consecutive_errors", "Ship passes failed since the last success.",
         sh["consecutive_errors"]),
        ("fleet_ship_spool_alarm", "1 while the spool is past its alarm threshold.",
         1 if sh["spool_alarm"] else 0),
    )
    for name, doc, value in gauges:
        yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)
    for name, doc, key in (
        ("fleet_ship_errors", "Ship passes that failed.", "errors_total"),
        ("fleet_ship_shipped_bytes", "Segment bytes shipped and verified.",
         "shipped_bytes_total"),
        ("fleet_ship_dropped_bytes", "Segment bytes deleted unshipped (spool full).",
         "dropped_bytes_total"),
    ):
        yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=sh[key])


def _store_metrics(st: dict[str, Any] | None) -> Iterator[Metric]:
    """The store's space and health (gateway.store.space); nothing without durability."""
    if not st:
        return
    gauges = (
        ("store_writable", "1 while the store commits (0: a write error).",
         1 if st.get("writable") else 0),
        ("store_refusing", "1 while QoS 1/2 publishes and new persistent sessions are refused.",
         1 if st.get("refusing") else 0),
        ("store_bytes", "gateway.db and its WAL, bytes.", st.get("db_bytes")),
        ("store_wal_bytes", "The WAL, bytes.", st.get("wal_bytes")),
        ("store_disk_total_bytes", "Size of the data_dir file system.", st.get("disk_total")),
        ("store_disk_free_bytes", "Free bytes on the data_dir file system (for us).",
         st.get("disk_free")),
        ("store_disk_usage_ratio", "Used share of the data_dir file system.",
         st.get("disk_usage")),
        ("store_reserve_held", "1 while the reserve file is held.",
         1 if st.get("reserve_held") else 0),
    )
    for name, doc, value in gauges:
        if value is not None:
            yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=float(value))
    yield CounterMetricFamily(f"{PREFIX}_store_commit_failures", "Commits that failed.",
                              value=float(st.get("commit_failures") or 0))


def _cluster_metrics(view: dict[str, Any] | None) -> Iterator[Metric]:
    """``gateway_cluster_nodes_up``/``_total`` (this node counts; 1/1 standalone) and
    ``gateway_cluster_peer_up{peer}``: 1 while the links to that member are up."""
    members = (view or {}).get("members") or []
    peers = [m for m in members if not m.get("self")]
    up = GaugeMetricFamily(f"{PREFIX}_cluster_peer_up",
                           "1 while the cluster links to a member are up, else 0.",
                           labels=["peer"])
    for m in peers:
        up.add_metric([str(m.get("node"))], 1 if m.get("status") == "up" else 0)
    yield up
    yield GaugeMetricFamily(f"{PREFIX}_cluster_nodes_up", "Cluster members up (this one too).",
                            value=1 + sum(1 for m in peers if m.get("status") == "up"))
    yield GaugeMetricFamily(f"{PREFIX}_cluster_nodes_total", "Cluster members known.",
                            value=1 + len(peers))


def _bridge_metrics(bridges: list[dict[str, Any]]) -> Iterator[Metric]:
    """Per upstream bridge (label ``bridge``): state, outbox and traffic."""
    label = ["bridge"]
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "connected": GaugeMetricFamily(f"{PREFIX}_bridge_connected",
                                       "1 while the bridge is connected upstream.", labels=label),
        "queue_len": GaugeMetricFamily(f"{PREFIX}_bridge_queue_messages",
                                       "Messages in the bridge's outbox.", labels=label),
        "queue_bytes": GaugeMetricFamily(f"{PREFIX}_bridge_queue_bytes",
                                         "Topic and payload bytes in the outbox.", labels=label),
        "oldest_age": GaugeMetricFamily(f"{PREFIX}_bridge_oldest_age_seconds",
                                        "Age of the oldest message in the outbox (0: empty).",
                                        labels=label),
        "inflight": GaugeMetricFamily(f"{PREFIX}_bridge_inflight",
                                      "Messages sent upstream, not yet acknowledged.",
                                      labels=label),
        "forwarded": CounterMetricFamily(f"{PREFIX}_bridge_forwarded",
                                         "Messages sent upstream.", labels=label),
        "acked": CounterMetricFamily(f"{PREFIX}_bridge_acked",
                                     "Messages upstream acknowledged.", labels=label),
        "received": CounterMetricFamily(f"{PREFIX}_bridge_received",
                                        "Messages brought down from upstream.", labels=label),
        "connects": CounterMetricFamily(f"{PREFIX}_bridge_connects",
                                        "Successful connections upstream.", labels=label),
    }
    dropped = CounterMetricFamily(f"{PREFIX}_bridge_dropped",
                                  "Messages the bridge dropped, by reason.",
                                  labels=["bridge", "reason"])
    for b in bridges:
        name = [b["name"]]
        for key, family in families.items():
            family.add_metric(name, float(b.get(key) or 0))
        for reason, n in sorted(b.get("dropped", {}).items()):
            dropped.add_metric([b["name"], reason], n)
    yield from families.values()
    yield dropped


def make_registry(snapshot: Callable[[], dict[str, Any]]) -> CollectorRegistry:
    """A registry of its own (not the global one) with the gateway's and the process's
    collectors, so several nodes in one test process do not collide."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(snapshot))
    registry.register(GcPolicyCollector())
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


class GcPolicyCollector(Collector):
    """What the garbage-collector policy saw (nothing while none is installed)."""

    def collect(self) -> Iterator[Metric]:
        policy = gcpolicy.ACTIVE
        if policy is None:
            return
        yield GaugeMetricFamily(f"{PREFIX}_gc_frozen_objects",
                                "Objects frozen out of the garbage collector's walks.",
                                value=gc.get_freeze_count())
        yield CounterMetricFamily(f"{PREFIX}_gc_full_collections",
                                  "Full (generation 2) collections.", value=policy.full)
        yield CounterMetricFamily(f"{PREFIX}_gc_full_collections_complete",
                                  "Full collections that walked the frozen objects too.",
                                  value=policy.thaws)
        yield CounterMetricFamily(f"{PREFIX}_gc_full_collection_seconds",
                                  "Time spent in full collections.", value=policy.seconds)
        yield GaugeMetricFamily(f"{PREFIX}_gc_full_collection_longest_seconds",
                                "The longest full collection (a pause of the event loop).",
                                value=policy.longest)


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
