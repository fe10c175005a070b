"""The edge archiver: a hook subscriber that spools telemetry and connection events.

It registers at ``message.publish`` (lowest priority, so it sees what the other hooks let
through, and returns the message unchanged), ``client.connected`` and
``client.disconnected``, turns each into one JSON line (:mod:`gateway.fleet.records`) and
buffers it. A timer on the node's scheduler flushes the buffers every ``flush_interval``
and seals segments older than ``rotate_interval``; a segment is also sealed when it
reaches ``rotate_size`` bytes of JSON, and at UTC midnight (``ingest_date`` changes).
The gzip and file work runs on a :class:`~gateway.fleet.spool.Sink` (a writer thread in
production), so the event loop only formats lines.

Invariants:

- Per kind and device, ``seq`` is 1 + the last one assigned, and the counters start past
  the saved state and past every record salvaged from a crashed run.
- A record is either written to a segment or counted as dropped
  (``fleet.archiver.dropped``, when more than ``max_pending`` bytes wait for the disk);
  never lost silently while the process lives.
- Only this object's loop thread touches the buffers; the sink only sees finished bytes.
- After :meth:`close`, every record accepted before it is in a sealed segment.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.config import GatewayConfig
from gateway.core.clock import Scheduler, TimerHandle
from gateway.core.hooks import Hooks, Priority
from gateway.core.metrics import Metrics
from gateway.core.topic_index import TopicIndex
from gateway.fleet import spool
from gateway.fleet.records import (
    KINDS,
    SCHEMA_VERSION,
    Kind,
    partition_dir,
    safe_name,
    segment_name,
    tmp_name,
    utc_date,
)
from protocols.context import ClientInfo, Message

log = logging.getLogger("gateway.fleet")

_FLUSH_BYTES = 1 << 20  # hand a buffer to the sink once it holds this much
_MS_EPOCH = 1e11  # a device "ts" above this is milliseconds


@dataclass(slots=True)
class ArchiverSettings:
    """What the archiver needs from ``[fleet.archiver]`` (with defaults resolved)."""

    root: Path
    site: str = "default"
    gw: str = "gateway"
    topics: tuple[str, ...] = ("#",)
    events: bool = True
    rotate_interval: float = 300.0
    rotate_size: int = 16 << 20
    flush_interval: float = 1.0
    max_pending: int = 64 << 20
    ts_field: str = "ts"
    max_payload_text: int = 256


@dataclass(slots=True)
class _Segment:
    kind: Kind
    date: str
    tmp: Path
    opened_at: float
    size: int = 0
    lines: list[bytes] = field(default_factory=list)
    buffered: int = 0


class Archiver:
    """See the module docstring. ``attach`` to a node's hooks; ``close`` when done."""

    def __init__(
        self,
        settings: ArchiverSettings,
        scheduler: Scheduler,
        *,
        sink: spool.Sink | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.scheduler = scheduler
        self.metrics = metrics if metrics is not None else Metrics()
        self._sink: spool.Sink = sink if sink is not None else spool.ThreadSink()
        self._root = settings.root
        self._filters = TopicIndex()
        self._literal: set[str] = set()
        for topic in settings.topics:
            if topic.startswith("eq "):
                self._literal.add(topic[3:])
            else:
                self._filters.add(topic)
        self._boot = os.urandom(3).hex()
        self._number = 0
        self._open: dict[Kind, _Segment] = {}
        self._pending_lock = threading.Lock()
        self._pending = 0  # bytes handed to the sink and not yet written
        self._timer: TimerHandle | None = None
        self._hooks: Hooks | None = None
        self._closed = False
        salvaged = spool.salvage(self._root)
        self._seq = spool.merge_state(spool.load_state(self._root), salvaged)

    # -- wiring ---------------------------------------------------------------------

    def attach(self, hooks: Hooks) -> None:
        """Register the hook callbacks and start the flush timer."""
        hooks.add("message.publish", self.on_publish, Priority.LOWEST)
        if self.settings.events:
            hooks.add("client.connected", self.on_connected, Priority.LOWEST)
            hooks.add("client.disconnected", self.on_disconnected, Priority.LOWEST)
        self._hooks = hooks
        self._arm()

    def detach(self) -> None:
        """Unregister from the hooks and stop the timer (buffers stay until ``close``)."""
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.remove("message.publish", self.on_publish)
            if self.settings.events:
                hooks.remove("client.connected", self.on_connected)
                hooks.remove("client.disconnected", self.on_disconnected)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        """Detach, seal every open segment, save the counters and wait for the disk."""
        if self._closed:
            return
        self.detach()
        for kind in list(self._open):
            self._seal(kind)
        self._save_state()
        self._closed = True
        self._sink.close()

    # -- hook callbacks (event loop thread) --------------------------------------------

    def on_publish(self, message: Message) -> Message:
        topic = message.topic
        if (self._filters.lookup(topic) or topic in self._literal) and message.publisher:
            self._telemetry(message)
        return message

    def on_connected(self, client: ClientInfo) -> None:
        self._event(client, "connected")

    def on_disconnected(self, client: ClientInfo) -> None:
        self._event(client, "disconnected")

    # -- records ---------------------------------------------------------------------

    def _telemetry(self, message: Message) -> None:
        rx = message.timestamp or self.scheduler.time()
        metrics, ts, text = parse_payload(
            message.payload, message.topic, self.settings.ts_field, self.settings.max_payload_text
        )
        device = message.publisher
        record: dict[str, Any] = {
            "v": SCHEMA_VERSION,
            "site": self.settings.site,
            "gw": self.settings.gw,
            "device": device,
            "seq": self._next_seq("telemetry", device),
            "ts": ts if ts is not None else rx,
            "rx_ts": rx,
            "topic": message.topic,
            "qos": message.qos,
            "metrics": metrics,
        }
        if text is not None:
            record["payload"] = text
        self._append("telemetry", record, rx)

    def _event(self, client: ClientInfo, event: str) -> None:
        now = self.scheduler.time()
        device = client.client_id
        record = {
            "v": SCHEMA_VERSION,
            "site": self.settings.site,
            "gw": self.settings.gw,
            "device": device,
            "seq": self._next_seq("events", device),
            "ts": now,
            "rx_ts": now,
            "event": event,
            "protocol": client.protocol,
            "peer": client.peer_host,
        }
        self._append("events", record, now)

    def _next_seq(self, kind: Kind, device: str) -> int:
        counters = self._seq[kind]
        seq = counters.get(device, 0) + 1
        counters[device] = seq
        return seq

    def _append(self, kind: Kind, record: dict[str, Any], rx: float) -> None:
        if self._closed:
            self.metrics.incr("fleet.archiver.dropped")
            return
        line = json.dumps(record, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        with self._pending_lock:
            pending = self._pending
        buffered = sum(s.buffered for s in self._open.values())
        if pending + buffered + len(line) > self.settings.max_pending:
            self.metrics.incr("fleet.archiver.dropped")
            return
        segment = self._segment(kind, rx)
        segment.lines.append(line)
        segment.buffered += len(line)
        segment.size += len(line)
        self.metrics.incr(f"fleet.archiver.{kind}")
        if segment.size >= self.settings.rotate_size:
            self._seal(kind)
        elif segment.buffered >= _FLUSH_BYTES:
            self._flush(segment)

    def _segment(self, kind: Kind, rx: float) -> _Segment:
        date = utc_date(rx).isoformat()
        segment = self._open.get(kind)
        if segment is not None and segment.date == date:
            return segment
        if segment is not None:
            self._seal(kind)
        self._number += 1
        s = self.settings
        name = segment_name(s.gw, rx, self._boot, self._number)
        folder = self._root / "raw" / partition_dir(kind, utc_date(rx), s.site, s.gw)
        segment = _Segment(kind, date, folder / tmp_name(name), self.scheduler.time())
        self._open[kind] = segment
        return segment

    # -- writing ---------------------------------------------------------------------

    def _flush(self, segment: _Segment) -> None:
        if not segment.lines:
            return
        data = b"".join(segment.lines)
        segment.lines = []
        segment.buffered = 0
        size = len(data)
        with self._pending_lock:
            self._pending += size
        tmp = segment.tmp

        def write() -> None:
            try:
                spool.append_member(tmp, data)
            finally:
                with self._pending_lock:
                    self._pending -= size

        self._sink.submit(write)

    def _seal(self, kind: Kind) -> None:
        segment = self._open.pop(kind)
        self._flush(segment)
        self._save_state()
        tmp = segment.tmp
        self._sink.submit(lambda: _seal_logged(tmp))

    def _save_state(self) -> None:
        snapshot: spool.SeqState = {kind: dict(self._seq[kind]) for kind in KINDS}
        root = self._root
        self._sink.submit(lambda: spool.save_state(root, snapshot))

    def _arm(self) -> None:
        self._timer = self.scheduler.call_later(self.settings.flush_interval, self._tick)

    def _tick(self) -> None:
        self._timer = None
        now = self.scheduler.time()
        for kind in list(self._open):
            segment = self._open[kind]
            if now - segment.opened_at >= self.settings.rotate_interval:
                self._seal(kind)
            else:
                self._flush(segment)
        if self._hooks is not None:
            self._arm()

    def pending_bytes(self) -> int:
        """Bytes buffered or on their way to the disk (for metrics and tests)."""
        with self._pending_lock:
            pending = self._pending
        return pending + sum(s.buffered for s in self._open.values())


def _seal_logged(tmp: Path) -> None:
    started = time.monotonic()
    final = spool.seal(tmp)
    if final is not None:
        log.debug("archiver: sealed %s in %.3fs", final, time.monotonic() - started)


def parse_payload(
    payload: bytes, topic: str, ts_field: str, max_text: int
) -> tuple[dict[str, float], float | None, str | None]:
    """``(metrics, device ts, text)`` from a payload.

    - a JSON object: its numbers (booleans excluded; nested objects flattened with ``.``)
      are the metrics, and a number under ``ts_field`` is the device's own time (seconds,
      or milliseconds when above 1e11);
    - a bare JSON number: one metric named after the topic's last level;
    - anything else: no metrics, and up to ``max_text`` bytes of it as text.
    """
    value: Any = None
    first = payload[:1]
    if first in (b"{", b"-", b".") or first.isdigit():
        try:
            value = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            value = None
    if isinstance(value, dict):
        metrics: dict[str, float] = {}
        ts = value.pop(ts_field, None) if ts_field else None
        _flatten(value, "", metrics, 0)
        device_ts: float | None = None
        if isinstance(ts, int | float) and not isinstance(ts, bool) and math.isfinite(ts):
            device_ts = ts / 1000.0 if ts > _MS_EPOCH else float(ts)
        return metrics, device_ts, None
    if _is_number(value):
        return {topic.rsplit("/", 1)[-1]: float(value)}, None, None
    text = payload[:max_text].decode("utf-8", errors="replace") if max_text else None
    return {}, None, text


def _flatten(obj: dict[str, Any], prefix: str, out: dict[str, float], depth: int) -> None:
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if _is_number(value):
            out[name] = float(value)
        elif isinstance(value, dict) and depth < 3:
            _flatten(value, name + ".", out, depth + 1)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def settings_from_config(config: GatewayConfig) -> ArchiverSettings:
    """``[fleet.archiver]`` resolved: ``dir`` defaults to ``{data_dir}/archive`` and
    ``gw`` to the node name made safe for a directory name."""
    a = config.fleet.archiver
    return ArchiverSettings(
        root=a.dir if a.dir is not None else config.node.data_dir / "archive",
        site=a.site,
        gw=a.gw or safe_name(config.node.name),
        topics=tuple(a.topics),
        events=a.events,
        rotate_interval=a.rotate_interval,
        rotate_size=a.rotate_size,
        flush_interval=a.flush_interval,
        max_pending=a.max_pending,
        ts_field=a.ts_field,
        max_payload_text=a.max_payload_text,
    )
