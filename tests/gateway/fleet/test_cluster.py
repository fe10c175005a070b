"""The job on a real Spark standalone cluster (a master and a worker started with
pyspark's own ``spark-class`` on loopback ports) writes the same tables as ``local[*]``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.fleet.generate import FleetSpec, generate_fleet
from gateway.fleet.settings import JobSettings
from tests.gateway.admin.gatewayd import free_port
from tests.gateway.fleet.test_consolidation import snapshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SPEC = FleetSpec(devices=6, days=2, interval=600.0, seed=3, devices_per_gw=3,
                 segment_seconds=6 * 3600)


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def daemon(args: list[str], ready: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start a Spark daemon and wait for its log line ``ready`` (a regex)."""
    proc = subprocess.Popen([str(spark_class()), *args], stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if re.search(ready, line):
            return proc
    raise RuntimeError(f"{args[0]} exited before {ready!r}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(tmp_path),
           "SPARK_WORKER_DIR": str(tmp_path / "work"), "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": os.getcwd()}
    port = free_port()
    master = daemon(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(port), "--webui-port", str(free_port())],
                    r"Starting Spark master at spark://", env)
    url = f"spark://127.0.0.1:{port}"
    worker = None
    try:
        worker = daemon(["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                         "--cores", "2", "--memory", "1g", "--webui-port", str(free_port())],
                        r"Successfully registered with master", env)
        yield url
    finally:
        for proc in (worker, master):
            if proc is not None:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=60)


def test_standalone_cluster_tables_equal_local(spark, cluster: str, tmp_path: Path) -> None:
    from gateway.fleet import job

    raw = tmp_path / "raw"
    generate_fleet(raw, SPEC)
    job.run(spark, JobSettings(raw=str(raw), out=str(tmp_path / "local")))
    done = subprocess.run(
        [sys.executable, "-m", "gateway.fleet", "run", "--raw", str(raw), "--out",
         str(tmp_path / "cluster"), "--master", cluster],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": os.getcwd(), "FLEET_DRIVER_MEMORY": "1g",
             "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"on {cluster}" in done.stderr
    # the driver logs through gateway/fleet/log4j2.properties: no start-up chatter
    assert "log4j" not in done.stderr and "NativeCodeLoader" not in done.stderr, done.stderr
    local, remote = snapshot(tmp_path / "local"), snapshot(tmp_path / "cluster")
    assert all(local[t] for t in ("telemetry", "device_daily", "rollup_5m"))
    assert remote == local
