"""The unit files pass ``systemd-analyze verify``; users, directories and the tuning
profiles are what they say."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze not installed (Debian package systemd)"
)


def fake_root(tmp_path: Path) -> Path:
    """A root with the unit installed as documented, the programs it names, and the
    host's own systemd units (targets) so that dependencies resolve."""
    root = tmp_path / "root"
    for d in ("opt/gateway/bin", "bin", "usr/lib/systemd", "etc/systemd/system"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for exe in ("opt/gateway/bin/gatewayd", "opt/gateway/bin/gatewayctl",
                "opt/gateway/bin/gateway-fleet", "bin/kill"):
        (root / exe).write_text("#!/bin/sh\n")
        (root / exe).chmod(0o755)
    host_units = Path("/usr/lib/systemd/system")
    if not host_units.is_dir():
        host_units = Path("/lib/systemd/system")
    shutil.copytree(host_units, root / "usr/lib/systemd/system", symlinks=True)
    for unit in units():
        shutil.copy(unit, root / "etc/systemd/system" / unit.name)
    dropins = root / "etc/systemd/system/gatewayd.service.d"
    shutil.copytree(SYSTEMD / "gatewayd.service.d", dropins)
    return root


def units() -> list[Path]:
    return sorted(SYSTEMD.glob("*.service")) + sorted(SYSTEMD.glob("*.timer"))


def test_there_is_a_unit() -> None:
    assert [u.name for u in units()] == [
        "gateway-fleet-ship.service", "gatewayd.service", "gateway-fleet-ship.timer"]


@needs_analyze
@pytest.mark.parametrize("unit", [u.name for u in units()])
def test_systemd_analyze_verify(unit: str, tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    r = subprocess.run([ANALYZE, "verify", f"--root={root}", unit],  # type: ignore[list-item]
                       capture_output=True, text=True, timeout=120)
    # verify exits 0 on mere warnings (a bad value is "ignoring"): no output at all
    assert (r.returncode, r.stdout + r.stderr) == (0, "")


@needs_analyze
def test_every_dropin_verifies(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    assert any((root / "etc/systemd/system/gatewayd.service.d").iterdir())
    r = subprocess.run([ANALYZE, "verify", f"--root={root}", "gatewayd.service"],  # type: ignore[list-item]
                       capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout + r.stderr) == (0, "")


@needs_analyze
def test_hardening_exposure_is_low(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    r = subprocess.run(
        [ANALYZE, "security", "--offline=yes", f"--root={root}", "--threshold=25",  # type: ignore[list-item]
         "gatewayd.service"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Overall exposure level for gatewayd.service: 1." in r.stdout \
        or "Overall exposure level for gatewayd.service: 0." in r.stdout, r.stdout[-500:]


def test_unit_essentials() -> None:
    text = (SYSTEMD / "gatewayd.service").read_text()
    for line in ("Type=notify", "WatchdogSec=", "User=gateway", "StateDirectory=gateway",
                 "ProtectSystem=strict", "LimitNOFILE=1048576", "Restart=on-failure",
                 "ExecReload=/bin/kill -HUP $MAINPID", "TimeoutStopSec=120s",
                 "NoNewPrivileges=yes"):
        assert f"\n{line}" in text, line
    assert "AmbientCapabilities=\n" in text  # none: MQTT ports are above 1024


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None
                    or shutil.which("systemd-tmpfiles") is None or os.geteuid() != 0,
                    reason="needs systemd-sysusers and systemd-tmpfiles, as root")
def test_sysusers_and_tmpfiles(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    subprocess.run(["systemd-sysusers", f"--root={root}",
                    str(SYSTEMD / "sysusers.d/gateway.conf")], check=True, capture_output=True)
    passwd = (root / "etc/passwd").read_text()
    entry = next(line for line in passwd.splitlines() if line.startswith("gateway:"))
    uid = int(entry.split(":")[2])
    assert entry.endswith(":/var/lib/gateway:/usr/sbin/nologin") and uid < 1000
    subprocess.run(["systemd-tmpfiles", f"--root={root}", "--create",
                    str(SYSTEMD / "tmpfiles.d/gateway.conf")], check=True, capture_output=True)
    state = (root / "var/lib/gateway").stat()
    assert (state.st_uid, state.st_mode & 0o777) == (uid, 0o750)
    conf = (root / "etc/gateway").stat()
    assert (conf.st_uid, conf.st_mode & 0o777) == (0, 0o750)


def sysctl(name: str) -> dict[str, str]:
    values = {}
    for raw in (SYSTEMD / "sysctl.d" / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        assert sep, raw
        values[key.strip().lstrip("-")] = " ".join(value.split())
    return values


def test_million_connection_profile_has_the_reference_values() -> None:
    v = sysctl("60-gateway-1m.conf")
    assert int(v["fs.nr_open"]) >= 2097152 and int(v["fs.file-max"]) >= 2097152
    assert v["net.core.somaxconn"] == "32768"
    assert v["net.ipv4.tcp_max_syn_backlog"] == "16384"
    assert v["net.core.netdev_max_backlog"] == "16384"
    assert v["net.ipv4.ip_local_port_range"] == "1024 65535"
    assert v["net.ipv4.tcp_fin_timeout"] == "15"
    assert v["net.netfilter.nf_conntrack_max"] == "1000000"
    for key in ("net.core.rmem_max", "net.core.wmem_max", "net.ipv4.tcp_rmem",
                "net.ipv4.tcp_wmem", "net.ipv4.tcp_max_tw_buckets"):
        assert key in v
    # LimitNOFILE of the unit and limits.d fit under fs.nr_open
    limits = (SYSTEMD / "limits.d/90-gateway-1m.conf").read_text()
    assert "gateway hard nofile 1048576" in limits and int(v["fs.nr_open"]) >= 1048576


def test_edge_profile_is_smaller_and_consistent() -> None:
    edge, big = sysctl("60-gateway-edge.conf"), sysctl("60-gateway-1m.conf")
    assert int(edge["fs.file-max"]) < int(big["fs.file-max"])
    assert int(edge["net.core.somaxconn"]) < int(big["net.core.somaxconn"])
    dropin = (SYSTEMD / "gatewayd.service.d/edge.conf").read_text()
    assert "LimitNOFILE=262144" in dropin and "MemoryMax=" in dropin
    assert "gateway hard nofile 262144" in (SYSTEMD / "limits.d/90-gateway-edge.conf").read_text()
    assert int(edge["fs.file-max"]) >= 262144


@pytest.mark.skipif(not Path("/proc/sys/fs/nr_open").exists(), reason="not Linux")
def test_profile_keys_exist_in_this_kernel() -> None:
    """Every key (but the optional conntrack ones) names a real sysctl."""
    for name in ("60-gateway-1m.conf", "60-gateway-edge.conf"):
        for key in sysctl(name):
            if key.startswith("net.netfilter."):
                continue
            assert Path("/proc/sys", *key.split(".")).exists(), (name, key)


def test_fleet_ship_timer_runs_its_service_as_the_gateway_user() -> None:
    service = (SYSTEMD / "gateway-fleet-ship.service").read_text()
    timer = (SYSTEMD / "gateway-fleet-ship.timer").read_text()
    for line in ("Type=oneshot", "User=gateway", "StateDirectory=gateway",
                 "ExecStart=/opt/gateway/bin/gateway-fleet ship --config "
                 "/etc/gateway/gateway.toml", "NoNewPrivileges=yes", "ProtectSystem=strict"):
        assert f"\n{line}" in service, line
    assert "\nOnUnitInactiveSec=" in timer and "\nWantedBy=timers.target" in timer


def test_units_sharing_the_state_directory_agree_on_its_mode() -> None:
    """systemd sets a StateDirectory's mode (0755 unless told) each time a unit starts:
    every unit naming /var/lib/gateway must give tmpfiles.d's 0750, or one run of it
    opens the directory to everyone (and Ansible sees a change at its next run)."""
    tmpfiles = (SYSTEMD / "tmpfiles.d/gateway.conf").read_text()
    assert "d /var/lib/gateway 0750 gateway gateway -" in tmpfiles
    sharing = [u for u in units() if "\nStateDirectory=gateway\n" in u.read_text()]
    assert len(sharing) == 2
    for unit in sharing:
        assert "\nStateDirectoryMode=0750\n" in unit.read_text(), unit.name


@needs_analyze
def test_fleet_ship_hardening_exposure_is_low(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    r = subprocess.run(
        [ANALYZE, "security", "--offline=yes", f"--root={root}", "--threshold=25",  # type: ignore[list-item]
         "gateway-fleet-ship.service"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "exposure level for gateway-fleet-ship.service: 1." in r.stdout \
        or "exposure level for gateway-fleet-ship.service: 0." in r.stdout, r.stdout[-500:]
