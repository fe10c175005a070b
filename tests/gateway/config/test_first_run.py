"""``gatewayd --first-run`` (what ``scripts/run`` starts): every front-end on its standard
port, a taken port reported on one line while the rest still open, and no open-file
alarm on a developer's small ``ulimit -n``. Runs in a network namespace this test makes
(``unshare -n``), the only place where the standard ports are surely ours."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.admin.limits import configured_max_connections, follow_file_limit
from gateway.config import load_config

SCRIPT = Path(__file__).resolve().parent / "netns_first_run.py"


def test_first_run_layer_turns_every_front_end_on() -> None:
    plain = load_config(None, environ={})
    assert plain.gateway.mqttsn is None and not plain.listeners.ws
    assert not plain.node.skip_busy_ports
    config = load_config(None, environ={}, first_run=True)
    assert config.listeners.ws["default"].port == 8083
    assert config.gateway.mqttsn is not None and config.gateway.coap is not None
    assert config.gateway.lwm2m is not None
    binds = [config.gateway.mqttsn.listeners.udp["default"].bind,
             config.gateway.coap.listeners.udp["default"].bind,
             config.gateway.lwm2m.listeners.udp["default"].bind]
    assert binds == ["0.0.0.0:1884", "0.0.0.0:5683", "0.0.0.0:5783"]
    assert config.api.port == 18083 and config.node.skip_busy_ports
    # the environment still wins over the layer
    off = load_config(None, environ={"GATEWAY_GATEWAY__COAP__ENABLE": "false"}, first_run=True)
    assert off.gateway.coap is not None and not off.gateway.coap.enable


def test_default_connection_limit_follows_the_file_limit() -> None:
    config = load_config(None, environ={}, first_run=True)
    assert configured_max_connections(config) == 0  # nothing written: nothing to alarm on
    assert follow_file_limit(config, 4096) == 3072
    assert config.listeners.tcp["default"].max_connections == 3072
    assert config.gateway.lwm2m is not None
    assert config.gateway.lwm2m.listeners.udp["default"].max_connections == 3072
    assert configured_max_connections(config) == 0  # a second start follows again
    written = load_config(None, environ={
        "GATEWAY_LISTENERS__TCP__DEFAULT__MAX_CONNECTIONS": "500000"})
    assert configured_max_connections(written) == 500000  # this one is checked
    assert follow_file_limit(written, 4096) is None


def _netns_reason() -> str | None:
    if not shutil.which("unshare") or not shutil.which("ss"):
        return "unshare or ss (iproute2) not installed"
    for tool in ("mosquitto_sub", "mosquitto_pub"):
        if not shutil.which(tool):
            return f"{tool} not installed"
    if not any(shutil.which(n) for n in ("coap-client-notls", "coap-client-openssl")):
        return "coap-client (libcoap3-bin) not installed"
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True,
                           timeout=30, check=False)
    if probe.returncode != 0:
        return f"cannot make a network namespace: {probe.stderr.strip()}"
    return None


@pytest.mark.slow
@pytest.mark.interop
@pytest.mark.dashboard
def test_first_run_opens_every_front_end_on_its_standard_port() -> None:
    reason = _netns_reason()
    if reason is not None:
        pytest.skip(reason)
    r = subprocess.run(["unshare", "-n", sys.executable, str(SCRIPT)],
                       capture_output=True, text=True, timeout=180, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    log = seen.pop("log")
    assert "error" not in seen, (seen, log)
    for port in ("tcp:1883", "tcp:8083", "tcp:18083", "udp:1884", "udp:5683", "udp:5783"):
        assert port in seen["listening"], (seen, log)
    assert seen["received"] == ["coap/hello from-coap", "sn/hello from-mqttsn",
                                "tcp/hello from-mosquitto"], log
    code, out, err = seen["lwm2m"]
    assert code == 0 and "4." not in out + err, (seen["lwm2m"], log)  # 2.01 Created
    busy = [line for line in log.splitlines() if " WARNING " in line and "not opened" in line]
    assert len(busy) == 1, log
    assert "ws:default" in busy[0] and "0.0.0.0:8083: port already in use" in busy[0]
    # the host's own disk may raise high_disk_usage (the data dir is under /tmp): not ours
    ours = [a for a in seen["alarms"] if a != "high_disk_usage"]
    assert ours == ["listener_not_opened:ws:default"], log
    assert "nofile_limit" not in log and "open-file limit 4096" in log
    assert seen["dashboard"] == 200
