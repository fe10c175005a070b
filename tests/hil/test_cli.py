"""gateway-hil as a user runs it: list, validate, and exit 2 with one line on bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hil.envfile import load_env
from hil.yamlmarks import BadInput


def hil(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hil.cli", *args], capture_output=True,
                          text=True, timeout=120)


def test_list_names_every_shipped_scenario_and_env() -> None:
    r = hil("list")
    assert r.returncode == 0, r.stderr
    for name in ("smoke", "power-cut", "network", "bridge-outage", "disk-full", "soak"):
        assert name in r.stdout
    assert "hardware-example" in r.stdout and "local" in r.stdout and "qemu" in r.stdout


def test_validate_ok_and_with_env() -> None:
    r = hil("validate", "smoke", "--env", "hardware-example")
    assert r.returncode == 0 and "1010 devices" in r.stdout, r.stderr


def test_bad_scenario_exits_2_with_one_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nduration: 10s\ngroups:\n  - {name: a, protocol: mqtt, count: 0}\n")
    for args in (["validate", str(p)], ["run", str(p), "--env", "local"]):
        r = hil(*args)
        assert r.returncode == 2
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        assert lines[0].startswith(f"gateway-hil: {p}:4: groups.0.count: "), lines[0]


def test_bad_override_and_unit_env_exit_2() -> None:
    r = hil("validate", "smoke", "--set", "duration=-3s")
    assert r.returncode == 2 and "duration" in r.stderr
    r = hil("run", "smoke", "--env", "local", "--unit-env", "NOPE=1")
    assert r.returncode == 2 and "--unit-env" in r.stderr


ENV_OK = """\
targets:
  main:
    resources:
      LocalGateway: {netns: false, disk_size: ""}
    drivers:
      LocalGatewayDriver: {}
      GatewayStrategy: {}
imports: [hil.drivers]
"""


@pytest.mark.parametrize(("edit", "line", "field"), [
    (("      LocalGatewayDriver: {}\n", ""), 6, "targets.main.drivers"),
    (("imports: [hil.drivers]", "imports: [os]"), 8, "imports"),
    (("      GatewayStrategy: {}", "      GatewayStrategy: {ready_timeout: soon}"), 7,
     "targets.main.drivers.GatewayStrategy"),
    (("{netns: false, disk_size: \"\"}", "{netns: maybe}"), 4,
     "targets.main.resources.LocalGateway"),
])
def test_bad_env_file_one_line(tmp_path: Path, edit: tuple[str, str], line: int | None,
                               field: str) -> None:
    p = tmp_path / "env.yaml"
    p.write_text(ENV_OK.replace(*edit))
    with pytest.raises(BadInput) as e:
        load_env(str(p))
    msg = str(e.value)
    assert "\n" not in msg and field in msg, msg
    if line:
        assert msg.startswith(f"{p}:{line}: "), msg
    r = hil("validate", "smoke", "--env", str(p))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_shipped_envs_build_through_labgrid() -> None:
    for name, unit in (("local", "LocalGatewayDriver"), ("qemu", "QemuGatewayDriver"),
                       ("hardware-example", "BoardGatewayDriver")):
        _env, strategy = load_env(name)
        assert type(strategy).__name__ == "GatewayStrategy"
        assert type(strategy.unit).__name__ == unit
    _env, strategy = load_env("hardware-example")
    drivers = {type(d).__name__ for d in strategy.target.drivers}
    assert {"SerialDriver", "ShellDriver", "SSHDriver", "NetworkPowerDriver"} <= drivers


def test_qemu_without_an_image_is_bad_input(tmp_path: Path) -> None:
    env = tmp_path / "qemu.yaml"
    env.write_text(Path("hil/envs/qemu.yaml").read_text().replace(
        "../../build/image/edge-gateway-0.1.0-amd64.img", str(tmp_path / "none.img")))
    r = hil("run", "smoke", "--env", str(env), "--report", str(tmp_path / "r"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"gateway-hil: {env}: no image at")


def test_a_scenario_needing_ports_the_target_lacks_is_bad_input(tmp_path: Path) -> None:
    image = tmp_path / "edge-gateway-0-amd64.img"
    image.write_bytes(b"\0" * 512)  # never booted: the check comes before power-on
    env = tmp_path / "qemu.yaml"
    env.write_text(Path("hil/envs/qemu.yaml").read_text().replace(
        "../../build/image/edge-gateway-0.1.0-amd64.img", str(image)))
    r = hil("run", "smoke", "--env", str(env), "--report", str(tmp_path / "r"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "exposes no coap, lwm2m, mqtts, mqttsn, ws, wss port" in r.stderr
