"""The shipped scenarios, run for real on the ``local`` target (gatewayd in a network
namespace, data on a tmpfs), shortened for CI with ``--set`` overrides; and the proof
that the rig catches a broken unit. Needs root (netns, mounts), nft and mosquitto."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.hil.conftest import have_chromium, screenshot_dir

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.hil,
    pytest.mark.slow,
    pytest.mark.timeout(400),
    pytest.mark.skipif(os.geteuid() != 0, reason="the local target needs root (netns, tmpfs)"),
    pytest.mark.skipif(not shutil.which("nft"), reason="needs nftables (nft)"),
    pytest.mark.skipif(not (shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()),
                       reason="needs mosquitto (the bridge's upstream)"),
]

# CI lengths: long enough for every fault and its recovery, short enough for 2 cores
CI = {
    "smoke": ["duration=20s", "settle=10s"],
    "power-cut": ["duration=25s", "settle=15s"],
    "network": ["duration=30s", "settle=15s"],
    "bridge-outage": ["duration=25s", "settle=20s"],
    "disk-full": ["duration=25s", "settle=15s"],
    "soak": ["duration=20s", "ramp=5s", "settle=15s"],
}


def run(scenario: str, report: Path, *extra: str,
        env: dict[str, str] | None = None) -> tuple[int, str, dict[str, Any]]:
    args = [sys.executable, "-m", "hil.cli", "run", scenario, "--env", "local",
            "--report", str(report)]
    for s in CI[scenario]:
        args += ["--set", s]
    args += list(extra)
    r = subprocess.run(args, capture_output=True, text=True, timeout=380, cwd=REPO,
                       env={**os.environ, **(env or {})})
    if r.returncode == 2:
        pytest.fail(f"bad input: {r.stderr}")
    results = json.loads((report / "results.json").read_text())
    print(r.stdout.strip().splitlines()[-1])  # the JSON summary: verdict, wall, rig CPU
    return r.returncode, r.stdout, results


def verdicts(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in results["expectations"]}


def test_smoke_every_front_end_a_thousand_devices(tmp_path: Path) -> None:
    rc, out, results = run("smoke", tmp_path)
    assert rc == 0, out
    assert results["devices"] >= 1000 and results["connected_at_start"] == results["devices"]
    for group, totals in results["totals"].items():
        assert totals.get("received", 0) > 0, group
    for name in ("junit.xml", "results.json", "report.html", "records.jsonl"):
        assert (tmp_path / name).stat().st_size > 0
    if have_chromium():
        from hil.report.screenshot import screenshot

        png = screenshot_dir() / "report-smoke.png"
        info = screenshot(tmp_path / "report.html", png)
        print(f"screenshot: {png}")
        assert info["verdict"] == "PASS" and info["errors"] == []


def test_power_cut_passes_on_a_sound_unit(tmp_path: Path) -> None:
    rc, out, results = run("power-cut", tmp_path)
    assert rc == 0, out
    v = verdicts(results)
    assert v["no_acked_loss"]["passed"] and v["unit_back"]["passed"]
    assert results["faults"][0]["kind"] == "power-cut"


def test_power_cut_catches_a_unit_without_durability(tmp_path: Path) -> None:
    rc, out, results = run("power-cut", tmp_path, "--set", "settle=8s",
                           env={"GATEWAY_DURABILITY__ENABLE": "false"})
    assert rc == 1, out
    loss = verdicts(results)["no_acked_loss"]
    assert not loss["passed"] and loss["ids"], loss
    assert loss["ids"][0] in out  # lost message ids are listed on the terminal too


def test_network_passes_on_a_sound_unit(tmp_path: Path) -> None:
    rc, out, results = run("network", tmp_path)
    assert rc == 0, out
    assert [f["kind"] for f in results["faults"]] == ["network", "network"]


def test_network_catches_sessions_that_are_not_persistent(tmp_path: Path) -> None:
    rc, out, results = run(
        "network", tmp_path, "--set", "settle=8s",
        "--unit-env", "GATEWAY_MQTT__SESSION_EXPIRY_INTERVAL=0",
        "--unit-env", "GATEWAY_MQTT__MAX_SESSION_EXPIRY_INTERVAL=1s")
    assert rc == 1, out
    loss = verdicts(results)["no_acked_loss"]
    assert not loss["passed"]
    assert any(i.startswith("c:") for i in loss["ids"])  # commands queued while away


def test_bridge_outage_drains(tmp_path: Path) -> None:
    rc, out, results = run("bridge-outage", tmp_path)
    assert rc == 0, out
    v = verdicts(results)
    assert v["bridge_drain"]["passed"] and v["no_acked_loss"]["passed"]
    assert sum(t.get("upstream", 0) for t in results["totals"].values()) > 0


def test_disk_full(tmp_path: Path) -> None:
    rc, out, results = run("disk-full", tmp_path)
    assert rc == 0, out
    assert any("data file system full" in n for n in results["notes"]), results["notes"]


def test_soak_short(tmp_path: Path) -> None:
    rc, out, results = run("soak", tmp_path)
    assert rc == 0, out
    assert verdicts(results)["rss_max"]["passed"]


def test_labgrid_pytest_plugin_drives_the_local_target() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "labgrid",
         "--lg-env",
         "hil/envs/local.yaml", "hil/pytest_example"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed" in r.stdout


def test_netns_faults_cut_only_the_device_address() -> None:
    import socket

    from hil.faults.netns import Netns, netem_available
    from hil.unit import Unsupported

    ns = Netns()
    ns.create()
    server = subprocess.Popen(
        [*ns.exec_prefix(), sys.executable, "-c",
         "import socket,time\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,"
         "socket.SO_REUSEADDR,1);s.bind(('0.0.0.0',7777));s.listen(64)\n"
         "while True: c,_=s.accept(); c.close()"])
    try:
        def reach(addr: str) -> bool:
            try:
                socket.create_connection((addr, 7777), timeout=1.0).close()
                return True
            except OSError:
                return False

        for _ in range(100):  # bounded poll until the listener in the namespace is up
            if reach(ns.device_addr):
                break
            time.sleep(0.1)
        assert reach(ns.device_addr) and reach(ns.control_addr)
        ns.fault("partition", 0, 0)
        assert not reach(ns.device_addr) and reach(ns.control_addr)
        ns.fault("loss", 100, 0)
        assert not reach(ns.device_addr) and reach(ns.control_addr)
        ns.heal()
        assert reach(ns.device_addr)
        if netem_available():
            ns.fault("delay", 0, 0.2)
            ns.heal()
        else:
            with pytest.raises(Unsupported, match="sch_netem"):
                ns.fault("delay", 0, 0.2)
    finally:
        server.kill()
        ns.close()
