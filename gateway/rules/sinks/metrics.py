"""Prometheus series of the sinks (read at scrape time)::

    gateway_sink_up{sink="postgresql:pg1"}            1 connected, 0 not
    gateway_sink_buffer_depth{sink}                   items buffered (ready + in flight)
    gateway_sink_buffer_bytes{sink}                   bytes buffered
    gateway_sink_buffer_max_bytes{sink}               the buffer's bound
    gateway_sink_items_total{sink, result="success|failed|dropped"}
    gateway_sink_batches_total{sink}                  delivery attempts (batches)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["SinksCollector"]


class SinksCollector:
    def __init__(self, sinks: Callable[[], Iterable[Any]]) -> None:
        self.sinks = sinks

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("gateway_sink_up", "1 when the sink is connected.",
                               labels=["sink"])
        depth = GaugeMetricFamily("gateway_sink_buffer_depth", "Items buffered.",
                                  labels=["sink"])
        nbytes = GaugeMetricFamily("gateway_sink_buffer_bytes", "Bytes buffered.",
                                   labels=["sink"])
        cap = GaugeMetricFamily("gateway_sink_buffer_max_bytes", "The buffer's bound.",
                                labels=["sink"])
        items = CounterMetricFamily("gateway_sink_items", "Items by outcome.",
                                    labels=["sink", "result"])
        batches = CounterMetricFamily("gateway_sink_batches", "Delivery attempts.",
                                      labels=["sink"])
        for s in self.sinks():
            up.add_metric([s.id], 1 if s.status == "connected" else 0)
            depth.add_metric([s.id], s.queue.depth)
            nbytes.add_metric([s.id], s.queue.bytes)
            cap.add_metric([s.id], s.queue.max_bytes)
            items.add_metric([s.id, "success"], s.success)
            items.add_metric([s.id, "failed"], s.failed)
            items.add_metric([s.id, "dropped"], s.dropped)
            batches.add_metric([s.id], s.batches)
        yield from (up, depth, nbytes, cap, items, batches)
