"""Verdicts from the records: pure functions of the event list and the scenario.

Definitions (docs/hil.md states them for users):

- **acknowledged loss**: a message with an ``acked`` event (the unit took it: PUBACK,
  PUBCOMP, CoAP 2.04, MQTT-SN PUBACK/PUBCOMP), QoS >= 1 and ``p`` true, with no ``recv`` by
  its receiver (the collector for telemetry, the device for a command; also ``upstream``
  when the bridge forwards at QoS >= 1). Every such id is listed.
- **QoS 2 duplicate**: a QoS 2 message received more than once by the same receiver.
- **reconnect time**: for each fault and each device that went ``down`` after the fault
  began, from the fault's end (``heal``) to the device's next ``up``; a device that never
  came back counts as infinite. The check is on the 99th percentile.
- **latency**: first ``recv`` minus ``sent``, for messages whose flight does not overlap a
  fault window (fault start to heal + 2 s); percentiles by nearest rank.
- **bridge drain**: after each upstream outage, from ``heal`` to the first sample whose
  outbox length is back to its level before the outage (the largest sample in the 5 s
  before it; under steady traffic a message or two is always on its way); never counts
  as infinite.
- **unit back**: the largest ``ready.after`` (the unit answering again after a fault, with
  no action but the fault's own end); a fault without ``ready`` counts as infinite.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from hil.scenario import Scenario

FAULT_GRACE = 2.0


@dataclass
class Verdict:
    name: str
    passed: bool
    measured: float | None
    bound: float | None
    unit: str
    detail: str
    ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("measured", "bound"):
            if isinstance(d[k], float) and math.isinf(d[k]):
                d[k] = "inf"
        return d


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (``pct`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class Facts:
    """What the verdicts and the report's plots are computed from."""

    start: float = 0.0
    end: float = 0.0
    stopped: float = math.inf  # the rig began closing its clients (phase stop)
    devices: int = 0
    connected_at_start: int = 0
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> sent event
    acked: set[str] = field(default_factory=set)
    recv: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (id, by) -> ts
    ups: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    downs: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    faults: list[dict[str, Any]] = field(default_factory=list)  # kind, i, start, end
    ready: dict[int, float] = field(default_factory=dict)  # fault index -> after
    samples: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def collect(events: Iterable[dict[str, Any]]) -> Facts:
    f = Facts()
    open_faults: dict[int, dict[str, Any]] = {}
    for ev in events:
        kind, t = ev["e"], ev["t"]
        if kind == "sent":
            f.sent[ev["m"]] = ev
        elif kind == "acked":
            f.acked.add(ev["m"])
        elif kind == "recv":
            f.recv.setdefault((ev["m"], ev["by"]), []).append(t)
        elif kind == "up":
            f.ups[ev["d"]].append(t)
        elif kind == "down":
            f.downs[ev["d"]].append(t)
        elif kind == "fault":
            rec = {"kind": ev["kind"], "i": ev["i"], "start": t, "end": None,
                   "label": ev.get("label", ev["kind"])}
            open_faults[ev["i"]] = rec
            f.faults.append(rec)
        elif kind == "heal":
            if ev["i"] in open_faults:
                open_faults[ev["i"]]["end"] = t
        elif kind == "ready":
            f.ready[ev["i"]] = float(ev["after"])
        elif kind == "sample":
            f.samples.append(ev)
        elif kind == "phase":
            if ev["name"] == "start":
                f.start = t
                f.devices = int(ev.get("devices", 0))
            elif ev["name"] == "stop":
                f.stopped = t
            elif ev["name"] == "publishing":
                f.connected_at_start = int(ev.get("connected", 0))
            f.end = max(f.end, t)
        elif kind == "note":
            f.notes.append(str(ev.get("text", "")))
        f.end = max(f.end, t)
    return f


def _receivers(ev: dict[str, Any], bridge_qos: int | None) -> list[str]:
    if ev.get("k") == "cmd":
        return [ev["d"]]
    out = ["collector"]
    if bridge_qos is not None and bridge_qos >= 1 and ev.get("q", 0) >= 1:
        out.append("upstream")
    return out


def _windows(f: Facts) -> list[tuple[float, float]]:
    return [(x["start"], (x["end"] or f.end) + FAULT_GRACE) for x in f.faults]


def latencies(f: Facts) -> list[tuple[float, float]]:
    """(sent time, latency) of first receipts outside fault windows."""
    windows = _windows(f)
    out: list[tuple[float, float]] = []
    for (mid, by), times in f.recv.items():
        if by == "upstream":
            continue
        ev = f.sent.get(mid)
        if ev is None:
            continue
        t0, t1 = ev["t"], min(times)
        if any(a <= t1 and t0 <= b for a, b in windows):
            continue
        out.append((t0, max(0.0, t1 - t0)))
    return out


def reconnect_times(f: Facts) -> list[float]:
    out: list[float] = []
    for fault in f.faults:
        start, end = fault["start"], fault["end"] or f.end
        for dev, downs in f.downs.items():
            went = [t for t in downs if start - 0.5 <= t < f.stopped]
            if not went or min(went) > end + 30.0:
                continue
            first_down = min(went)
            back = [t for t in f.ups.get(dev, []) if t > first_down]
            out.append(max(0.0, min(back) - end) if back else math.inf)
    return out


def evaluate(sc: Scenario, f: Facts) -> list[Verdict]:
    ex = sc.expect
    bridge_qos = sc.bridge.qos if sc.bridge and sc.bridge.enable else None
    verdicts: list[Verdict] = []

    if ex.all_connected:
        verdicts.append(Verdict(
            "all_connected", f.connected_at_start >= f.devices, float(f.connected_at_start),
            float(f.devices), "devices",
            f"{f.connected_at_start} of {f.devices} devices connected within "
            f"{sc.connect_timeout:g} s"))

    if ex.no_acked_loss:
        lost: list[str] = []
        checked = 0
        for mid in f.acked:
            ev = f.sent.get(mid)
            if ev is None or ev.get("q", 0) < 1 or not ev.get("p", True):
                continue
            for by in _receivers(ev, bridge_qos):
                checked += 1
                if (mid, by) not in f.recv:
                    lost.append(mid if by != "upstream" else f"{mid}@upstream")
        lost.sort()
        verdicts.append(Verdict(
            "no_acked_loss", not lost, float(len(lost)), 0.0, "messages",
            f"{len(lost)} of {checked} acknowledged QoS 1/2 deliveries never arrived"
            + (f"; first lost: {', '.join(lost[:10])}" if lost else ""), lost))

    if ex.no_qos2_duplicates:
        dups = sorted(
            mid for (mid, by), times in f.recv.items()
            if len(times) > 1 and f.sent.get(mid, {}).get("q") == 2
            and (by != "upstream" or bridge_qos == 2))
        n2 = sum(1 for ev in f.sent.values() if ev.get("q") == 2)
        verdicts.append(Verdict(
            "no_qos2_duplicates", not dups, float(len(dups)), 0.0, "messages",
            f"{len(dups)} of {n2} QoS 2 messages received more than once"
            + (f"; first: {', '.join(dups[:10])}" if dups else ""), dups))

    if ex.reconnect_p99 is not None and f.faults:
        times = reconnect_times(f)
        p99 = percentile(times, 99) if times else 0.0
        never = sum(1 for t in times if math.isinf(t))
        verdicts.append(Verdict(
            "reconnect_p99", p99 <= ex.reconnect_p99, p99, ex.reconnect_p99, "s",
            f"p99 of {len(times)} reconnects after faults: {p99:.2f} s"
            + (f"; {never} devices never came back" if never else "")))

    lat = [x for _, x in latencies(f)]
    for pct, bound in ((50, ex.latency_p50), (95, ex.latency_p95), (99, ex.latency_p99)):
        if bound is None:
            continue
        v = percentile(lat, pct) if lat else math.inf
        verdicts.append(Verdict(
            f"latency_p{pct}", v <= bound, v, bound, "s",
            f"p{pct} end-to-end latency of {len(lat)} messages: {v * 1000:.1f} ms"))

    if ex.bridge_drain is not None:
        drains: list[float] = []
        for fault in f.faults:
            if fault["kind"] != "upstream-outage" or fault["end"] is None:
                continue
            before = [s["bridge_queue"] for s in f.samples if "bridge_queue" in s
                      and fault["start"] - 5.0 <= s["t"] < fault["start"]]
            baseline = max(before, default=0)
            empty = [s["t"] for s in f.samples
                     if s["t"] >= fault["end"] and "bridge_queue" in s
                     and s["bridge_queue"] <= baseline]
            drains.append(min(empty) - fault["end"] if empty else math.inf)
        worst = max(drains) if drains else math.inf
        verdicts.append(Verdict(
            "bridge_drain", worst <= ex.bridge_drain, worst, ex.bridge_drain, "s",
            f"outbox back to its normal level {worst:.2f} s after the upstream returned" if drains
            else "no upstream outage ended"))

    if ex.rss_max is not None:
        rss = [s["rss"] for s in f.samples if s.get("rss")]
        peak = float(max(rss)) if rss else math.inf
        verdicts.append(Verdict(
            "rss_max", peak <= ex.rss_max, peak, float(ex.rss_max), "bytes",
            f"peak RSS {peak / 2**20:.1f} MiB over {len(rss)} samples" if rss
            else "no RSS sample"))

    if ex.unit_back is not None and f.faults:
        afters = [f.ready.get(x["i"], math.inf) for x in f.faults]
        worst = max(afters)
        verdicts.append(Verdict(
            "unit_back", worst <= ex.unit_back, worst, ex.unit_back, "s",
            f"unit answering {worst:.2f} s after the worst fault ended"
            if not math.isinf(worst) else "the unit did not come back after a fault"))
    return verdicts
