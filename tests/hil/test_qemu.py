"""``smoke`` and ``power-cut`` on the ``qemu`` target: the appliance image this checkout
builds (the session fixture ``built``, one build per pytest run shared with tests/image),
booted under QEMU by ``image/qemu``, driven by ``gateway-hil run``.

The test writes its own environment file pointing at the built image in the cache, so it
depends on nothing under build/ in the work tree. ``image/qemu`` forwards MQTT, SSH and
the API only, so the groups on other front-ends are left out with
``groups.X.enable=false``. Each TCG boot costs 60-90 s on a 2-core machine, so durations
are short and the power-cut bounds (``unit_back``, ``reconnect_p99``) allow a cold boot
under emulation; ``settle`` ends as soon as everything owed arrived.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.image_build import Built

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.hil, pytest.mark.image, pytest.mark.slow, pytest.mark.timeout(900)]

#: Groups on front-ends image/qemu does not forward (TLS, WebSocket, MQTT-SN, CoAP, LwM2M).
SMOKE_OFF = ["mqtt-tls", "mqtt-ws", "mqtt-wss", "sn", "coap", "lwm2m"]
#: A cold boot under TCG takes 60-90 s (more on a contended host); the local target's
#: 20-30 s bounds would measure the emulator, not the unit.
BOOT_BOUND = "300s"
#: An emulated unit on a shared 2-core host: 800 devices (smoke's MQTT groups at full
#: size) do not all connect within 60 s and latency reaches seconds (measured: 764/800
#: connected, p50 1.5 s), so smoke runs its two MQTT groups at a fifth of their size.
CI = {
    "smoke": ["duration=20s", "settle=15s", "groups.mqtt5.count=120",
              "groups.mqtt311.count=40",
              *(f"groups.{g}.enable=false" for g in SMOKE_OFF)],
    # 250 devices: 248 connected within 60 s, and the two that did not lost their commands
    "power-cut": ["duration=25s", "settle=180s", "groups.sn.enable=false",
                  "groups.v5q1.count=60", "groups.v5q2.count=20", "groups.v311.count=20",
                  f"expect.unit_back={BOOT_BOUND}", f"expect.reconnect_p99={BOOT_BOUND}"],
}


#: The unit's configuration: the image's default plus a known API token (so the rig
#: samples RSS through /api/v5/nodes) and, as hil/envs/local.toml, a collector queue that
#: holds what piles up while the emulated unit lags behind.
UNIT_CONFIG = """\
[node]
name = "hil@qemu"
data_dir = "/var/lib/gateway"

[listeners.tcp.default]
bind = "0.0.0.0:1883"
max_connections = 100000

[api]
bind = "0.0.0.0:18083"
token = "{token}"

[mqtt]
max_mqueue_len = 1000000
max_inflight = 1000
"""


@pytest.fixture(scope="module")
def env_file(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A labgrid environment like hil/envs/qemu.yaml, on a provisioned copy of the image
    just built (the driver copies it again per run, so every run starts from first boot)."""
    d = tmp_path_factory.mktemp("qemu-env")
    token = secrets.token_hex(16)
    (d / "gateway.toml").write_text(UNIT_CONFIG.format(token=token))
    img = d / built.img.name
    subprocess.run(["cp", "--sparse=always", str(built.img), str(img)], check=True)
    r = subprocess.run([str(REPO / "image" / "provision"), str(img),
                        "--config", str(d / "gateway.toml")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    env = d / "qemu.yaml"
    env.write_text(f"""\
targets:
  main:
    resources:
      GatewayImage:
        image: {img}
        script: {REPO / "image" / "qemu"}
        boot_timeout: 600.0
        api_token: {token}
    drivers:
      QemuGatewayDriver: {{}}
      GatewayStrategy:
        ready_timeout: 600.0
imports:
  - hil.drivers
""")
    return env


def run(scenario: str, env: Path, report: Path) -> tuple[int, str, dict[str, Any]]:
    args = [sys.executable, "-m", "hil.cli", "run", scenario, "--env", str(env),
            "--report", str(report)]
    for s in CI[scenario]:
        args += ["--set", s]
    t0 = time.monotonic()
    r = subprocess.run(args, capture_output=True, text=True, timeout=850, cwd=REPO,
                       env=os.environ.copy())
    if r.returncode == 2:
        pytest.fail(f"bad input: {r.stderr}")
    results = json.loads((report / "results.json").read_text())
    boots = [n for n in results["notes"] if "ready" in n]
    print(f"{scenario} on qemu: exit {r.returncode}, {time.monotonic() - t0:.0f} s; "
          f"{r.stdout.strip().splitlines()[-1]}; {boots}")
    return r.returncode, r.stdout + r.stderr[-3000:], results


def verdicts(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in results["expectations"]}


def test_smoke_on_the_built_image(env_file: Path, tmp_path: Path) -> None:
    rc, out, results = run("smoke", env_file, tmp_path)
    assert rc == 0, out
    v = verdicts(results)
    assert all(x["passed"] for x in v.values()), v
    assert {"no_acked_loss", "no_qos2_duplicates", "all_connected"} <= set(v)
    assert set(results["totals"]) == {"mqtt5", "mqtt311"}
    assert v["rss_max"]["passed"], v["rss_max"]  # sampled through the provisioned token
    for group, totals in results["totals"].items():
        assert totals.get("received", 0) > 0, group
    assert results["connected_at_start"] == results["devices"] == 160


def test_power_cut_on_the_built_image(env_file: Path, tmp_path: Path) -> None:
    rc, out, results = run("power-cut", env_file, tmp_path)
    assert rc == 0, out
    v = verdicts(results)
    assert all(x["passed"] for x in v.values()), v
    for name in ("no_acked_loss", "no_qos2_duplicates", "unit_back", "reconnect_p99"):
        assert v[name]["passed"], v[name]
    assert [f["kind"] for f in results["faults"]] == ["power-cut"]
    assert sum(t.get("acked", 0) for t in results["totals"].values()) > 0
    # the cold boot really happened: a second power-on of the same disk copy booted a
    # kernel (the run ends once the unit answers, often before the health check's verdict)
    serial = tmp_path / "unit" / "serial-2.log"
    assert "Linux version" in serial.read_text(errors="replace"), serial
