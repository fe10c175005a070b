"""Smoke test of the benchmark harness (bench/): every scenario at a tiny scale against
gatewayd only. It checks that the harness runs end to end, that nothing is lost and that
every scenario produced a figure; it asserts nothing about speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def tiny_run(tmp_path: Path, *args: str, timeout: float = 110) -> tuple[str, list[Any]]:
    """``bench.run --tiny`` against gatewayd with ``args``: its output and results."""
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--tiny", "--brokers", "gatewayd", *args,
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, json.loads(out.read_text())["results"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tiny_run_against_gatewayd(tmp_path: Path) -> None:
    stdout, results = tiny_run(tmp_path, timeout=280)
    from bench.scenarios import SCENARIOS

    assert sorted(r["scenario"] for r in results) == sorted(SCENARIOS)
    for r in results:
        assert r["broker"] == "gatewayd"
        assert r["error"] is None, (r["scenario"], r["error"])
        assert r["value"] is not None, r
        if r["unit"] in ("msg/s", "conn/s"):
            assert r["value"] > 0, r
        assert r["lost"] == 0, r
    traffic = [r for r in results if "expected" in r["details"]]
    assert traffic
    for r in traffic:
        d = r["details"]
        assert d["expected"] > 0 and d["received"] == d["expected"], r
    for r in results:  # the machine-stable figure, and the kernel's listen counters
        d = r["details"]
        if r["scenario"] != "idle-memory":
            assert d["broker_cpu_us_per_msg"] >= 0, r
        if r["scenario"].startswith(("connrate", "storm")):
            assert {"ListenOverflows", "ListenDrops", "TCPSynRetrans"} <= d.keys(), r
        if r["scenario"].startswith("latency"):
            assert d["p50_ms"] <= d["p99_ms"] <= d["p999_ms"] <= d["max_ms"], r
    assert "| fanin-qos0" in stdout  # the table was printed
    assert "load average" in stdout and "broker on CPU 0" in stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_coalesced_reads_still_receive_the_tail(tmp_path: Path) -> None:
    """``--rcvlowat``: with a mark above what a subscriber's last messages add up to,
    the tail is still read once the publishers are done (else it counts as lost)."""
    _, results = tiny_run(tmp_path, "--scenarios", "fanout-qos0,p2p-qos0", "--rcvlowat", "65536")
    assert len(results) == 2
    for r in results:
        d = r["details"]
        assert r["error"] is None and r["lost"] == 0, r
        assert d["expected"] > 0 and d["received"] == d["expected"], r


def test_connrate_rotates_its_source_address_every_block_of_connects() -> None:
    from bench.loadgen import SOURCE_IP_EVERY, WorkerSpec, source_ip

    spec = WorkerSpec.__new__(WorkerSpec)
    spec.source_ip = "127.1.7.1"
    assert source_ip(spec, 0) == source_ip(spec, SOURCE_IP_EVERY - 1) == "127.1.7.1"
    assert source_ip(spec, SOURCE_IP_EVERY) == "127.2.7.1"
    assert source_ip(spec, 3 * SOURCE_IP_EVERY) == "127.4.7.1"
    assert source_ip(spec, 251 * SOURCE_IP_EVERY) == "127.2.7.1"  # round again


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_conn_count_runs_that_many_connects(tmp_path: Path) -> None:
    _, (r,) = tiny_run(tmp_path, "--scenarios", "connrate-persist-50", "--conn-count", "4500")
    assert r["error"] is None and r["details"]["failed"] == 0, r
    assert r["details"]["connects"] == 4500, r  # three source addresses' worth


def test_open_loop_schedule_starts_at_the_phase_and_keeps_the_rate() -> None:
    from bench.loadgen import open_loop_due

    # 10 msg/s: a period of 100 ms; phase 0.25 puts message k at 25 ms + k * 100 ms
    assert open_loop_due(0, 10.0, 0.25) == (0, 25_000_000)
    assert open_loop_due(25_000_000, 10.0, 0.25) == (1, 100_000_000)
    assert open_loop_due(124_999_999, 10.0, 0.25) == (1, 1)
    assert open_loop_due(1_025_000_000, 10.0, 0.25) == (11, 100_000_000)
    # phase 0 is the old schedule: message 0 at once, message k at k / rate
    assert open_loop_due(0, 2500.0, 0.0) == (1, 400_000)


def test_devices_get_distinct_phases_spread_over_the_period() -> None:
    from bench.loadgen import PubSpec
    from bench.scenarios import spread_phases

    pubs = [PubSpec(i, f"p{i}", f"t/{i}", 1, [], 1) for i in range(200)]
    spread_phases(pubs)
    phases = [p.phase for p in pubs]
    assert sorted(phases) == [i / 200 for i in range(200)]
    assert phases != sorted(phases)  # shuffled: neighbours in the list are not in step
    again = [PubSpec(i, f"p{i}", f"t/{i}", 1, [], 1) for i in range(200)]
    spread_phases(again)
    assert [p.phase for p in again] == phases  # the same every run


def test_mosquitto_set_adds_its_lines_to_the_config(tmp_path: Path) -> None:
    """``--mosquitto-set``: each line reaches mosquitto.conf beside the bench's own."""
    from bench.brokers import Mosquitto

    broker = Mosquitto()
    Mosquitto.extra_lines = ["set_tcp_nodelay true"]
    try:
        broker.command()
        conf = (broker.tmp / "mosquitto.conf").read_text().splitlines()
    finally:
        Mosquitto.extra_lines = []
        broker.cleanup()
    assert "set_tcp_nodelay true" in conf
    assert "allow_anonymous true" in conf


def test_device_subscribers_get_a_load_generator_process_of_their_own() -> None:
    """``subs_apart``: the backend's reads never queue behind 1,000 device timers."""
    from types import SimpleNamespace

    from bench.loadgen import PubSpec, SubSpec
    from bench.scenarios import Params, _assign

    broker: Any = SimpleNamespace(host="127.0.0.1", port=1883)
    pubs = [PubSpec(i, f"p{i}", f"t/{i}", 1, [(0, [i])], 1) for i in range(10)]
    subs = [SubSpec(0, "s0", "t/#", 1)]
    for workers in (1, 3):
        specs = _assign(broker, Params(workers=workers), "traffic", pubs, subs, 1.0,
                        subs_apart=True)
        assert len(specs) == workers + 1
        assert specs[0].subs == subs and specs[0].pubs == []
        assert all(s.subs == [] for s in specs[1:])
        assert sorted(p.index for s in specs[1:] for p in s.pubs) == list(range(10))
    (together,) = _assign(broker, Params(workers=1), "traffic", pubs, subs, 1.0)
    assert together.subs == subs and len(together.pubs) == 10
