"""Run inside a fresh network namespace (``unshare -n``), never on real interfaces.

Brings up lo and a veth pair (10.77.0.1/24), starts gatewayd with MQTT-SN broadcast on,
listens for its ADVERTISE on 10.77.0.255, then broadcasts SEARCHGW and waits for GWINFO.
Prints one JSON line with what it saw; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from protocols.mqttsn.client import MqttSnClient  # noqa: E402
from protocols.mqttsn.packets import Advertise  # noqa: E402
from tests.harness.gatewayd import GatewaydProcess, gatewayd_env  # noqa: E402

GW_PORT, CLIENT_PORT, BROADCAST = 1884, 11884, "10.77.0.255"


def setup_network() -> None:
    for cmd in (
        "ip link set lo up",
        "ip link add v0 type veth peer name v1",
        "ip addr add 10.77.0.1/24 brd + dev v0",
        "ip link set v0 up",
        "ip link set v1 up",
    ):
        subprocess.run(cmd.split(), check=True)


async def main() -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="netns-gw-"))
    env = gatewayd_env(
        {
            "GATEWAY_NODE__DATA_DIR": str(work / "data"),
            "GATEWAY_API__ENABLE": "false",
            "GATEWAY_LISTENERS__TCP__DEFAULT__BIND": "127.0.0.1:1883",
            "GATEWAY_GATEWAY__MQTTSN__GATEWAY_ID": "42",
            "GATEWAY_GATEWAY__MQTTSN__BROADCAST": "true",
            "GATEWAY_GATEWAY__MQTTSN__BROADCAST_ADDRESS": BROADCAST,
            "GATEWAY_GATEWAY__MQTTSN__BROADCAST_PORT": str(CLIENT_PORT),
            "GATEWAY_GATEWAY__MQTTSN__ADVERTISE_INTERVAL": "1s",
            "GATEWAY_GATEWAY__MQTTSN__LISTENERS__UDP__DEFAULT__BIND": f"0.0.0.0:{GW_PORT}",
        }
    )
    # not waiting for READY: the client listens while gatewayd starts (the first ADVERTISE
    # goes out when the listener opens)
    proc = GatewaydProcess(work, env, log_path=work / "gateway.log").start(wait=False)
    client = MqttSnClient(BROADCAST, GW_PORT, "bc", timeout=2)
    try:
        await client.start(local_addr=("0.0.0.0", CLIENT_PORT), broadcast=True)
        advertise = await client.wait_for(lambda p: isinstance(p, Advertise), timeout=30)
        assert isinstance(advertise, Advertise)
        gwinfo = await client.search_gateway(1, to=(BROADCAST, GW_PORT))
        sources = sorted({addr[0] for _, addr in client.gateways})
        return {
            "advertise": [advertise.gw_id, advertise.duration],
            "gwinfo": gwinfo.gw_id,
            "from": sources,
        }
    finally:
        client.close()
        proc.stop(10)


if __name__ == "__main__":
    setup_network()
    print(json.dumps(asyncio.run(asyncio.wait_for(main(), 60))))
