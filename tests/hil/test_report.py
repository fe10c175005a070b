"""Reports: junit.xml has one test case per expectation, results.json every figure, and
report.html is one self-contained page that real headless Chromium renders offline."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from hil.expectations import collect, evaluate
from hil.report import write_reports
from hil.report.screenshot import screenshot
from hil.scenario import Scenario
from tests.hil.conftest import needs_chromium, screenshot_dir
from tests.hil.synth import T0, Run


def sample_run() -> tuple[Scenario, list[dict[str, object]]]:
    sc = Scenario.model_validate({
        "name": "synthetic", "duration": 30, "description": "a run made by hand",
        "groups": [{"name": "g", "protocol": "mqtt", "count": 2}],
        "faults": [{"kind": "power-cut", "at": 10, "off_for": 2}],
        "expect": {"latency_p50": 0.05, "latency_p99": 0.1, "rss_max": "200MB"}})
    r = Run()
    for i in range(200):
        t = 0.5 + i * 0.15
        lat = 0.02 + (i % 7) * 0.005
        if 10.5 <= t <= 12.5:
            r.message(t, f"g:0:{i}", acked=False)
            continue
        r.message(t, f"g:0:{i}", recv=[] if i in (120, 121) else [t + lat])
    r.fault(0, "power-cut", 10.5, 12.5, ready_after=1.2)
    r.add(10.6, "down", d="dev0").add(10.6, "down", d="dev1")
    r.add(14.0, "up", d="dev0", n=2).add(14.5, "up", d="dev1", n=2)
    for s in range(31):
        r.add(s, "sample", rss=(80 + s) << 20, connected=0 if 10.5 < s < 14 else 2)
    r.add(1, "note", text="unit ready 1.0 s after power on")
    return sc, r.finish(31)


def test_reports_are_written_and_agree(tmp_path: Path) -> None:
    sc, events = sample_run()
    facts = collect(events)
    verdicts = evaluate(sc, facts)
    results = write_reports(tmp_path, sc, facts, verdicts,
                            {"env": "synthetic", "run": "abc", "duration_s": 31.0,
                             "rig_cpu_s": 1.0, "publishing_at": T0 + 0.5})
    assert not results["passed"]  # two acknowledged messages were never received
    junit = ET.parse(tmp_path / "junit.xml").getroot()
    cases = junit.findall("testsuite/testcase")
    assert [c.get("name") for c in cases] == [v.name for v in verdicts]
    failed = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert set(failed) == {"no_acked_loss"}
    assert "lost ids:\ng:0:120" in (failed["no_acked_loss"].text or "")
    data = json.loads((tmp_path / "results.json").read_text())
    loss = next(e for e in data["expectations"] if e["name"] == "no_acked_loss")
    assert loss["ids"] == ["g:0:120", "g:0:121"] and loss["measured"] == 2
    assert data["totals"]["g"]["sent"] == 200 and data["faults"][0]["kind"] == "power-cut"
    html = (tmp_path / "report.html").read_text()
    assert "<script" not in html and "http://" not in html.replace(
        'xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in html
    assert html.count("<svg") >= 4 and "FAIL" in html and "g:0:121" in html


@needs_chromium
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    sc, events = sample_run()
    facts = collect(events)
    write_reports(tmp_path, sc, facts, evaluate(sc, facts),
                  {"env": "synthetic", "run": "abc", "duration_s": 31.0, "rig_cpu_s": 1.0,
                   "publishing_at": T0 + 0.5})
    png = screenshot_dir() / "report-synthetic.png"
    info = screenshot(tmp_path / "report.html", png)
    print(f"screenshot: {png}")
    assert info["verdict"] == "FAIL" and info["svgs"] == 5
    assert info["errors"] == [] and info["foreign_requests"] == []
    assert png.stat().st_size > 20_000
