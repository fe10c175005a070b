"""The expectation maths, on hand-made records whose right answers are known."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hil.expectations import collect, evaluate, percentile, reconnect_times
from hil.records import Recorder, read
from hil.scenario import Scenario
from tests.hil.synth import Run


def scenario(**expect: object) -> Scenario:
    return Scenario.model_validate({
        "name": "t", "duration": 60, "groups": [{"name": "g", "protocol": "mqtt", "count": 2}],
        "expect": expect})


def verdict(events: list[dict[str, object]], name: str, **expect: object):  # type: ignore[no-untyped-def]
    vs = {v.name: v for v in evaluate(scenario(**expect), collect(events))}
    return vs[name]


def test_percentile_nearest_rank() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2
    assert percentile([1, 2, 3, 4], 99) == 4
    assert percentile([5.0], 1) == 5.0
    assert math.isnan(percentile([], 50))


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=200), st.floats(0, 100))
def test_percentile_is_a_member_and_monotone(values: list[float], pct: float) -> None:
    v = percentile(values, pct)
    assert v in values
    assert percentile(values, min(100.0, pct + 10)) >= v


def test_acked_loss_lists_exactly_the_missing_ids() -> None:
    r = Run()
    r.message(1, "g:0:1", recv=[1.1])
    r.message(2, "g:0:2")  # acknowledged, never received: lost
    r.message(3, "g:0:3", acked=False)  # never acknowledged: not a loss
    r.message(4, "g:0:4", q=0)  # QoS 0: not a loss
    r.message(5, "c:g:1:1", k="cmd", d="dev1", recv=[5.2], by="dev1")
    r.message(6, "c:g:1:2", k="cmd", d="dev1")  # command lost
    r.message(7, "c:g:1:3", k="cmd", d="dev1", p=False)  # clean session: not counted
    r.message(8, "c:g:1:4", k="cmd", d="dev1", recv=[8.1], by="collector")  # wrong receiver
    v = verdict(r.finish(20), "no_acked_loss")
    assert not v.passed
    assert v.ids == ["c:g:1:2", "c:g:1:4", "g:0:2"]
    assert v.measured == 3


def test_no_loss_passes() -> None:
    r = Run()
    for i in range(10):
        r.message(i, f"g:0:{i}", recv=[i + 0.2])
    assert verdict(r.finish(20), "no_acked_loss").passed


def test_qos2_duplicate_detected_qos1_duplicate_allowed() -> None:
    r = Run()
    r.message(1, "g:0:1", q=2, recv=[1.1, 1.2])
    r.message(2, "g:0:2", q=1, recv=[2.1, 2.2])
    v = verdict(r.finish(10), "no_qos2_duplicates")
    assert not v.passed and v.ids == ["g:0:1"]


def test_reconnect_p99_from_heal_and_never_back_is_infinite() -> None:
    r = Run()
    r.fault(0, "power-cut", 10, 12)
    r.add(10.1, "down", d="dev0").add(15.0, "up", d="dev0", n=2)
    r.add(10.2, "down", d="dev1").add(13.0, "up", d="dev1", n=2)
    ev = r.finish(30)
    assert sorted(reconnect_times(collect(ev))) == [1.0, 3.0]
    v = verdict(ev, "reconnect_p99", reconnect_p99=2.5)
    assert not v.passed and v.measured == 3.0
    assert verdict(ev, "reconnect_p99", reconnect_p99=3.0).passed
    r2 = Run()
    r2.fault(0, "network", 10, 12).add(10.5, "down", d="dev0")
    v = verdict(r2.finish(30), "reconnect_p99", reconnect_p99=100)
    assert not v.passed and math.isinf(v.measured or 0)
    # a disconnect when the rig closes its clients is not a fault's
    r3 = Run()
    r3.fault(0, "network", 10, 12).add(20, "phase", name="stop").add(20.1, "down", d="dev0")
    assert verdict(r3.events, "reconnect_p99", reconnect_p99=1).passed


def test_latency_percentiles_skip_fault_windows() -> None:
    r = Run()
    for i in range(100):
        r.message(1 + i * 0.1, f"g:0:{i}", recv=[1 + i * 0.1 + 0.010])
    r.fault(0, "power-cut", 20, 22)
    r.message(19.9, "g:0:slow", recv=[25.0])  # in flight across the fault: excluded
    ev = r.finish(40)
    v = verdict(ev, "latency_p99", latency_p99=0.05)
    assert v.passed and v.measured == pytest.approx(0.010, abs=1e-6)
    r.message(30, "g:0:late1", recv=[31.0])  # 2 of 102 slow: the 99th percentile is slow
    r.message(32, "g:0:late2", recv=[33.0])
    assert not verdict(r.finish(40), "latency_p99", latency_p99=0.05).passed


def test_bridge_drain_to_the_level_before_the_outage() -> None:
    sc = Scenario.model_validate({
        "name": "t", "duration": 60, "bridge": {"enable": True},
        "groups": [{"name": "g", "protocol": "mqtt", "count": 1}],
        "faults": [{"kind": "upstream-outage", "at": 10, "for": 5}],
        "expect": {"bridge_drain": 3}})
    r = Run(1)
    for t, q in [(8, 1), (9, 2), (12, 500), (15, 900), (16, 400), (17.5, 2), (18, 0)]:
        r.add(t, "sample", bridge_queue=q)
    r.fault(0, "upstream-outage", 10, 15)
    vs = {v.name: v for v in evaluate(sc, collect(r.finish(30)))}
    assert vs["bridge_drain"].passed and vs["bridge_drain"].measured == pytest.approx(2.5)
    r2 = Run(1)
    r2.add(9, "sample", bridge_queue=0).add(20, "sample", bridge_queue=10)
    r2.fault(0, "upstream-outage", 10, 15)
    vs = {v.name: v for v in evaluate(sc, collect(r2.finish(30)))}
    assert not vs["bridge_drain"].passed


def test_rss_unit_back_and_all_connected() -> None:
    r = Run(3)  # 3 devices announced; Run marks all 3 up and connected
    r.add(1, "sample", rss=100 << 20).add(2, "sample", rss=300 << 20)
    r.fault(0, "process-kill", 5, 5, ready_after=4.0)
    r.fault(1, "power-cut", 10, 12, ready_after=None)  # never answered again
    ev = r.finish(30)
    assert not verdict(ev, "rss_max", rss_max=200 << 20).passed
    assert verdict(ev, "rss_max", rss_max=300 << 20).passed
    v = verdict(ev, "unit_back", unit_back=60)
    assert not v.passed and math.isinf(v.measured or 0)
    assert verdict(ev, "all_connected").passed


def test_records_survive_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    rec = Recorder(path)
    rec("sent", m="a", q=1)
    rec("acked", m="a")
    # the rig died mid-write: the bytes already flushed are on disk without close()
    with path.open("a") as f:
        f.write('{"m":"b","e":"se')
    events = list(read(path))
    assert [e["e"] for e in events] == ["sent", "acked"]
    assert all(json.loads(line) for line in path.read_text().splitlines()[:2])
