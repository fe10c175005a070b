"""The harness's arithmetic (bench.run, bench.scenarios): medians and spread over runs,
the issue-23 verdicts, the kernel counters. No broker, no timing."""

from __future__ import annotations

import pytest

from bench.run import _met, aggregate, main
from bench.scenarios import TCPEXT_COUNTERS, Result, tcpext


def res(scenario: str, broker: str, value: float | None, **details: float) -> Result:
    unit = "ms" if scenario.startswith("latency") else "msg/s"
    return Result(scenario, broker, "x", value, unit, details=dict(details))


def test_median_and_spread_over_runs() -> None:
    by = aggregate(
        [res("p2p-qos0", "gatewayd", v, broker_cpu_us_per_msg=c)
         for v, c in ((100.0, 5.0), (120.0, 4.0), (90.0, 6.0))]
    )
    a = by["p2p-qos0"]["gatewayd"]
    assert a.value == 100.0
    assert a.spread_pct == pytest.approx(15.0)  # (120 - 90) / 2 / 100
    assert a.cpu_us == [5.0, 4.0, 6.0]


def test_a_failed_run_does_not_become_a_figure() -> None:
    bad = Result("p2p-qos0", "gatewayd", "x", None, "-", error="boom\nstack")
    by = aggregate([res("p2p-qos0", "gatewayd", 100.0), bad])
    a = by["p2p-qos0"]["gatewayd"]
    assert a.values == [100.0] and a.errors == ["boom"]
    assert _met("p2p-qos0", by["p2p-qos0"]) == "NO"  # an error is never "met"


@pytest.mark.parametrize(
    ("ours", "mosq", "verdict"),
    [(100.0, 100.0, "yes"), (99.0, 100.0, "NO"), (150.0, 100.0, "yes")],
)
def test_throughput_needs_mosquittos_rate(ours: float, mosq: float, verdict: str) -> None:
    by = aggregate([res("fanin-qos0", "gatewayd", ours), res("fanin-qos0", "mosquitto", mosq)])
    assert _met("fanin-qos0", by["fanin-qos0"]) == verdict


def test_latency_needs_p99_and_p999_at_most_mosquittos() -> None:
    def verdict(p999_ours: float) -> str:
        by = aggregate([
            res("latency-qos0", "gatewayd", 0.5, p999_ms=p999_ours),
            res("latency-qos0", "mosquitto", 0.6, p999_ms=1.0),
        ])
        return _met("latency-qos0", by["latency-qos0"])

    assert verdict(0.9) == "yes"
    assert verdict(1.1) == "NO"


def test_tcpext_counters_are_read() -> None:
    counters = tcpext()
    assert all(isinstance(counters[k], int) for k in TCPEXT_COUNTERS)


@pytest.mark.parametrize(
    "argv",
    [["--pin", "zero:one"], ["--runs", "0"], ["--gatewayd-set", "novalue"]],
)
def test_bad_options_are_one_error_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--brokers", "gatewayd", *argv])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("python -m bench.run")
