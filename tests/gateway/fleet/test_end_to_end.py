"""End to end: two gatewayd units archive what paho clients publish, ship it (one to
Debian's sshd in a network namespace, one to a local path) through a ``kill -9`` and an
uplink cut mid-transfer (nft drops every packet in the server's namespace), and the
central job then holds exactly the published records."""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.fleet import shipper
from gateway.fleet.settings import JobSettings
from tests.gateway.admin.gatewayd import Client, Gatewayd
from tests.gateway.fleet.test_consolidation import snapshot
from tests.gateway.fleet.uplink import Sshd, Uplink
from tests.harness.wait import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DEVICES = {"u1": ["d-a", "d-b"], "u2": ["d-c", "d-d"]}


def unit_env(tmp: Path, unit: str, server: Sshd) -> dict[str, str]:
    env = {
        "GATEWAY_FLEET__ARCHIVER__ENABLE": "true",
        "GATEWAY_FLEET__ARCHIVER__SITE": "plant",
        "GATEWAY_FLEET__ARCHIVER__GW": unit,
        "GATEWAY_FLEET__ARCHIVER__TOPICS": "sensors/#",
        "GATEWAY_FLEET__ARCHIVER__ROTATE_INTERVAL": "1s",
        "GATEWAY_FLEET__ARCHIVER__FLUSH_INTERVAL": "200ms",
        "GATEWAY_FLEET__SHIPPER__ENABLE": "true",
        "GATEWAY_FLEET__SHIPPER__PATH": str(tmp / "central/raw"),
        "GATEWAY_FLEET__SHIPPER__IO_TIMEOUT": "2s",
    }
    if unit == "u1":
        env |= {
            "GATEWAY_FLEET__SHIPPER__TYPE": "sftp",
            "GATEWAY_FLEET__SHIPPER__HOST": server.host,
            "GATEWAY_FLEET__SHIPPER__PORT": str(server.port),
            "GATEWAY_FLEET__SHIPPER__USER": server.user,
            "GATEWAY_FLEET__SHIPPER__KEY_FILE": str(server.client_key),
            "GATEWAY_FLEET__SHIPPER__PATH": "raw",  # under the server's root: central/
        }
    return env


def ship(gw: Gatewayd, *, bwlimit: str = "0", wait: bool = True
         ) -> subprocess.Popen[str]:
    conf = gw.workdir / "empty.toml"
    conf.touch()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.fleet", "ship", "-c", str(conf)],
        env={**os.environ, **gw.env, "PYTHONPATH": os.getcwd(),
             "GATEWAY_FLEET__SHIPPER__BWLIMIT": bwlimit},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    if wait:
        proc.wait(timeout=120)
    return proc


def sealed_lines(archive: Path) -> int:
    return sum(len(gzip.decompress((archive / "raw" / s.rel).read_bytes()).splitlines())
               for s in shipper.sealed_segments(archive / "raw") if s.rel.startswith("tel"))


def publish(gw: Gatewayd, batch: int, n: int, sent: dict[tuple[str, int], dict[str, float]],
            rng: random.Random) -> None:
    """``n`` QoS 1 messages per device of ``gw`` (20 random metrics each: segments that
    take seconds to cross a limited link), each acknowledged."""
    unit = gw.node_name.split("@")[0]
    for device in DEVICES[unit]:
        client = Client(gw, device, version=5)
        try:
            seq0 = sum(1 for d, _ in sent if d == device)
            for i in range(n):
                metrics = {f"m{k}": round(rng.uniform(-1000, 1000), 6) for k in range(20)}
                client.publish(f"sensors/{device}", json.dumps(metrics), qos=1)
                sent[(device, seq0 + i + 1)] = metrics
        finally:
            client.close()


@pytest.fixture
def units(tmp_path: Path) -> Iterator[tuple[Gatewayd, Gatewayd, Uplink]]:
    """u1 ships over SFTP to Debian's sshd in a network namespace (the uplink the test
    cuts), u2 to a local path."""
    (tmp_path / "central/raw").mkdir(parents=True)
    uplink = Uplink()
    made = []
    server = None
    try:
        server = Sshd(tmp_path / "central", tmp_path / "ssh", uplink)
        for unit in ("u1", "u2"):
            gw = Gatewayd(tmp_path / unit, node_name=f"{unit}@127.0.0.1",
                          extra_env=unit_env(tmp_path, unit, server))
            gw.workdir.mkdir()
            made.append(gw.start())
        yield made[0], made[1], uplink
    finally:
        for gw in made:
            gw.stop()
        if server is not None:
            server.stop()
        uplink.close()


def test_two_units_ship_through_faults_and_the_job_holds_every_record(
    spark, units: tuple[Gatewayd, Gatewayd, Uplink], tmp_path: Path
) -> None:
    from gateway.fleet import job

    u1, u2, uplink = units
    rng = random.Random(5)
    sent: dict[tuple[str, int], dict[str, float]] = {}
    for gw in (u1, u2):
        publish(gw, 1, 150, sent, rng)
    for gw in (u1, u2):
        until("not sealed", lambda gw=gw: sealed_lines(gw.data_dir / "archive") == 300, 30)
    central = tmp_path / "central/raw"

    # u2 -> local path: kill -9 while a segment is being copied
    staging = central / ".incoming/plant/u2"
    killed = ship(u2, bwlimit="16KB/s", wait=False)
    until("u2 copy not begun", lambda: any(p.is_file() for p in staging.rglob("*")), 30)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    assert not list((central / "telemetry").rglob("*.gz")) if (central / "telemetry").exists() \
        else True

    # u1 -> SFTP: the uplink is cut mid-copy (every packet dropped in the server's
    # namespace); the pass fails on its I/O timeout
    staging = central / ".incoming/plant/u1"
    cut = ship(u1, bwlimit="16KB/s", wait=False)
    until("u1 copy not begun", lambda: any(p.is_file() for p in staging.rglob("*")), 30)
    uplink.cut()
    try:
        _, err = cut.communicate(timeout=60)
    finally:
        uplink.restore()
    assert cut.returncode == 1 and "ship failed" in err
    # gatewayd shows it: API, Prometheus
    view = u1.get("/api/v5/status")["fleet_shipper"]
    assert view["consecutive_errors"] == 1 and view["last_error"] and view["pending_bytes"] > 0
    _, _, metrics = u1.http("GET", "/api/v5/prometheus/stats", auth=False)
    assert b"gateway_fleet_ship_consecutive_errors 1.0" in metrics

    for gw in (u1, u2):
        publish(gw, 2, 20, sent, rng)
        gw.stop()  # seals what is open, archives the disconnects
    for gw in (u1, u2):
        done = ship(gw)
        assert done.returncode == 0, done.stderr.read() if done.stderr else ""
        assert shipper.sealed_segments(gw.data_dir / "archive" / "raw") == []
        status = shipper.Status.load(gw.data_dir / "archive" / shipper.STATUS_FILE)
        assert status.consecutive_errors == 0 and status.pending_bytes == 0

    result = job.run(spark, JobSettings(raw=str(central), out=str(tmp_path / "tables")))
    rows = snapshot(tmp_path / "tables")["telemetry"]
    assert result.report["totals"]["duplicates"] == 0
    got = {(r[2], r[3]): dict(r[7]) for r in rows}  # (device, seq) -> metrics
    assert len(rows) == len(sent) == 4 * 170
    assert set(got) == set(sent)
    for key in rng.sample(sorted(sent), 25):
        assert got[key] == pytest.approx(sent[key]), key
