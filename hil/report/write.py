"""Write junit.xml, results.json and report.html for one evaluated run.

The HTML page is self-contained (inline CSS and SVG, no script, no external URL), so it
opens offline and can be archived as evidence. Time series are in 1-second bins from the
``publishing`` phase's start; fault windows are the shaded bands.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from html import escape
from pathlib import Path
from typing import Any

from hil.expectations import Facts, Verdict, latencies, percentile
from hil.report.svg import chart
from hil.scenario import Scenario

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:900px;color:#222}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:24px 0 8px}
.verdict{display:inline-block;padding:4px 12px;border-radius:4px;color:#fff;font-weight:600}
.pass{background:#2e7d32}.fail{background:#c62828}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #ddd;padding:4px 6px;
text-align:left;vertical-align:top}th{background:#f4f4f4;white-space:nowrap}
td.num{text-align:right;white-space:nowrap;
font-variant-numeric:tabular-nums}tr.bad td{background:#fdecea}
.chart{width:100%;height:auto;margin:6px 0}.chart .title{font-weight:600;font-size:13px}
.chart .grid{stroke:#e5e5e5}.chart .frame{fill:none;stroke:#999}
.chart .line{fill:none;stroke-width:1.6}.chart .fault{fill:#ffcc80;opacity:.45}
.chart .flabel{font-size:10px;fill:#8a4b00}.chart .ytick{font-size:10px;text-anchor:end}
.chart .xtick{font-size:10px;text-anchor:middle}.chart .ylabel{font-size:11px;text-anchor:middle}
.chart .legend{font-size:11px;text-anchor:end}code{font-size:12px}.muted{color:#666}
.ids{font-family:monospace;font-size:12px;max-height:8em;overflow:auto;background:#fafafa;
padding:4px}
"""


def _bins(times: list[float], t0: float, n: int) -> list[tuple[float, float]]:
    c = Counter(int(t - t0) for t in times if t >= t0)
    return [(i + 0.5, float(c.get(i, 0))) for i in range(n)]  # plotted mid-bin


def series(f: Facts, t0: float) -> dict[str, Any]:
    n = max(1, math.ceil(f.end - t0) + 1)
    sent = [ev["t"] for ev in f.sent.values()]
    recv = [min(ts) for (mid, by), ts in f.recv.items() if by != "upstream"]
    up_recv = [min(ts) for (mid, by), ts in f.recv.items() if by == "upstream"]
    lat_by_bin: dict[int, list[float]] = defaultdict(list)
    for ts, lat in latencies(f):
        if ts >= t0:
            lat_by_bin[int(ts - t0)].append(lat)
    reconnects = [t for ups in f.ups.values() for t in sorted(ups)[1:]]
    downs = [t for d in f.downs.values() for t in d]
    return {
        "seconds": n,
        "sent_per_s": _bins(sent, t0, n),
        "received_per_s": _bins(recv, t0, n),
        "upstream_per_s": _bins(up_recv, t0, n) if up_recv else [],
        "latency_p50_ms": [(i + 0.5, percentile(lat_by_bin[i], 50) * 1000 if lat_by_bin[i]
                            else math.nan) for i in range(n)],
        "latency_p99_ms": [(i + 0.5, percentile(lat_by_bin[i], 99) * 1000 if lat_by_bin[i]
                            else math.nan) for i in range(n)],
        "reconnects_per_s": _bins(reconnects, t0, n),
        "disconnects_per_s": _bins(downs, t0, n),
        "connected": [(s["t"] - t0, float(s.get("connected", 0))) for s in f.samples],
        "rss_mib": [(s["t"] - t0, (s.get("rss") or 0) / 2**20) for s in f.samples
                    if s.get("rss")],
        "bridge_queue": [(s["t"] - t0, float(s["bridge_queue"])) for s in f.samples
                         if "bridge_queue" in s],
    }


def _fmt_measure(v: Verdict, value: float | None) -> str:
    if value is None:
        return ""
    if math.isinf(value):
        return "∞"
    if v.unit == "s":
        return f"{value:.3f} s"
    if v.unit == "bytes":
        return f"{value / 2**20:.1f} MiB"
    return f"{value:g}"


def write_reports(out: Path, sc: Scenario, f: Facts, verdicts: list[Verdict],
                  meta: dict[str, Any]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    passed = all(v.passed for v in verdicts)
    t0 = float(meta.get("publishing_at") or f.start)
    ser = series(f, t0)
    faults = [(x["start"] - t0, (x["end"] or f.end) - t0, x["label"]) for x in f.faults]
    totals: dict[str, Counter[str]] = defaultdict(Counter)
    for ev in f.sent.values():
        g = totals[ev.get("g", "?")]
        g["sent"] += 1
        if ev["m"] in f.acked:
            g["acked"] += 1
    for (mid, by), ts in f.recv.items():
        sent_ev = f.sent.get(mid)
        if sent_ev is not None:
            ev = sent_ev
            totals[ev.get("g", "?")]["received" if by != "upstream" else "upstream"] += 1
            if len(ts) > 1:
                totals[ev.get("g", "?")]["duplicates"] += len(ts) - 1
    results = {
        "scenario": sc.name, "passed": passed, **meta,
        "devices": f.devices, "connected_at_start": f.connected_at_start,
        "faults": [{"kind": x["kind"], "label": x["label"],
                    "start_s": round(x["start"] - t0, 3),
                    "end_s": round((x["end"] or f.end) - t0, 3)} for x in f.faults],
        "totals": {g: dict(c) for g, c in totals.items()},
        "expectations": [v.as_dict() for v in verdicts],
        "series": {k: v for k, v in ser.items() if k != "seconds"},
        "notes": f.notes,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1, default=_json_default))
    _junit(out / "junit.xml", sc, verdicts, meta)
    _html(out / "report.html", sc, verdicts, ser, faults, results)
    return results


def _json_default(o: object) -> object:
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    return str(o)


#: what a failed verdict's message ids are, in junit.xml
_IDS_LABEL = {"no_acked_loss": "lost ids", "no_qos2_duplicates": "duplicated ids"}


def _junit(path: Path, sc: Scenario, verdicts: list[Verdict], meta: dict[str, Any]) -> None:
    suite = ET.Element("testsuite", name=f"hil.{sc.name}", tests=str(len(verdicts)),
                       failures=str(sum(not v.passed for v in verdicts)), errors="0",
                       time=f"{meta.get('duration_s', 0):.3f}")
    for v in verdicts:
        case = ET.SubElement(suite, "testcase", classname=f"hil.{sc.name}", name=v.name)
        if not v.passed:
            fail = ET.SubElement(case, "failure", message=v.detail, type="expectation")
            label = _IDS_LABEL.get(v.name, "message ids")
            fail.text = v.detail + (f"\n{label}:\n" + "\n".join(v.ids) if v.ids else "")
        else:
            out = ET.SubElement(case, "system-out")
            out.text = v.detail
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def _html(path: Path, sc: Scenario, verdicts: list[Verdict], ser: dict[str, Any],
          faults: list[tuple[float, float, str]], results: dict[str, Any]) -> None:
    n = float(ser["seconds"])
    passed = results["passed"]
    rows = []
    for v in verdicts:
        over = ""
        if not v.passed and v.measured is not None and v.bound is not None:
            over = ("∞" if math.isinf(v.measured)
                    else _fmt_measure(v, v.measured - v.bound))
        rows.append(
            f'<tr class="{"" if v.passed else "bad"}"><td>{escape(v.name)}</td>'
            f'<td>{"PASS" if v.passed else "FAIL"}</td>'
            f'<td class="num">{escape(_fmt_measure(v, v.measured))}</td>'
            f'<td class="num">{escape(_fmt_measure(v, v.bound))}</td>'
            f'<td class="num">{escape(over)}</td><td>{escape(v.detail)}'
            + (f'<div class="ids">{escape(" ".join(v.ids[:500]))}</div>' if v.ids else "")
            + "</td></tr>")
    totals = "".join(
        f"<tr><td>{escape(g)}</td>" + "".join(
            f'<td class="num">{c.get(k, 0)}</td>'
            for k in ("sent", "acked", "received", "duplicates", "upstream")) + "</tr>"
        for g, c in sorted(results["totals"].items()))
    charts = [
        chart("Throughput (messages per second)",
              {"sent": ser["sent_per_s"], "received": ser["received_per_s"],
               **({"upstream": ser["upstream_per_s"]} if ser["upstream_per_s"] else {})},
              "msg/s", n, faults),
        chart("End-to-end latency (per second of sending)",
              {"p50 ms": ser["latency_p50_ms"], "p99 ms": ser["latency_p99_ms"]},
              "ms", n, faults),
        chart("Connections", {"connected devices": ser["connected"]}, "devices", n, faults),
        chart("Reconnects and disconnects",
              {"reconnects/s": ser["reconnects_per_s"],
               "disconnects/s": ser["disconnects_per_s"]}, "per s", n, faults),
    ]
    if ser["rss_mib"]:
        charts.append(chart("Unit memory (RSS)", {"RSS MiB": ser["rss_mib"]}, "MiB", n, faults))
    if ser["bridge_queue"]:
        charts.append(chart("Bridge outbox", {"queued": ser["bridge_queue"]}, "messages", n,
                            faults))
    notes = "".join(f"<li>{escape(x)}</li>" for x in results["notes"])
    html = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>HIL {escape(sc.name)}</title>
<style>{CSS}</style></head><body>
<h1>HIL scenario <code>{escape(sc.name)}</code> on
<code>{escape(str(results.get("env", "")))}</code></h1>
<p><span class="verdict {"pass" if passed else "fail"}">{"PASS" if passed else "FAIL"}</span>
<span class="muted">run {escape(str(results.get("run", "")))} ·
{results["devices"]} devices · {results.get("duration_s", 0):.1f} s wall ·
rig CPU {results.get("rig_cpu_s", 0):.1f} s</span></p>
<p class="muted">{escape(sc.description)}</p>
<h2>Expectations</h2>
<table><tr><th>expectation</th><th>verdict</th><th>measured</th><th>bound</th>
<th>over by</th><th>detail</th></tr>{"".join(rows)}</table>
<h2>Over time</h2>
{"".join(charts)}
<h2>Messages per group</h2>
<p class="muted">Telemetry and the commands sent to the group's devices;
QoS 0 has no acknowledgement.</p>
<table><tr><th>group</th><th>sent</th><th>acked</th><th>received</th><th>duplicates</th>
<th>upstream</th></tr>{totals}</table>
<h2>Notes</h2><ul>{notes or "<li>none</li>"}</ul>
</body></html>
"""
    path.write_text(html)
