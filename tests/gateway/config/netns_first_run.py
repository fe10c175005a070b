"""Run inside a fresh network namespace (``unshare -n``): ``gatewayd --first-run`` on the
standard ports, which only this namespace has.

Holds 8083/tcp first (a "port already in use"), starts gatewayd with a small open-file
limit (soft 1024, hard 4096: a developer's shell), then talks to each front-end with a
real client: mosquitto_sub/mosquitto_pub on 1883, our MQTT-SN client on 1884/udp,
libcoap's coap-client on 5683/udp (publish) and 5783/udp (an LwM2M registration), and
the API on 18083. Prints one JSON line with what it saw; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from protocols.mqttsn.client import MqttSnClient  # noqa: E402
from tests.harness.gatewayd import GatewaydProcess, gatewayd_command, gatewayd_env  # noqa: E402


def coap_client() -> str:
    for name in ("coap-client-notls", "coap-client-openssl", "coap-client-gnutls", "coap-client"):
        if shutil.which(name):
            return name
    raise SystemExit("no coap-client (Debian libcoap3-bin)")


def listening() -> list[str]:
    out = subprocess.run(["ss", "-Hlntu"], capture_output=True, text=True, check=True).stdout
    return sorted({f"{line.split()[0]}:{line.split()[4].rpartition(':')[2]}"
                   for line in out.splitlines() if line.strip()})


async def mqttsn_publish(topic: str, payload: bytes) -> None:
    client = MqttSnClient("127.0.0.1", 1884, "sn-first-run", timeout=5)
    await client.start()
    try:
        await client.connect()
        await client.publish(topic, payload, qos=1)
    finally:
        client.close()


def api_get(token: str, path: str) -> object:
    req = urllib.request.Request(f"http://127.0.0.1:18083{path}",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def wait_subscribed(token: str, clientid: str) -> None:
    """Bounded poll of the API until ``clientid`` has a subscription."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = api_get(token, f"/api/v5/subscriptions?clientid={clientid}")
        if isinstance(found, dict) and found["data"]:
            return
        time.sleep(0.05)
    raise TimeoutError(f"{clientid} did not subscribe")


def main() -> dict[str, object]:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    work = Path(tempfile.mkdtemp(prefix="first-run-"))
    busy = socket.socket()
    busy.bind(("0.0.0.0", 8083))
    busy.listen()
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096))  # inherited by gatewayd
    env = gatewayd_env({"GATEWAY_NODE__DATA_DIR": str(work / "data")})
    proc = GatewaydProcess(work, env, command=gatewayd_command("--first-run"),
                           log_path=work / "gatewayd.log").start()
    seen: dict[str, object] = {}
    try:
        seen["listening"] = listening()
        sub = subprocess.Popen(
            ["mosquitto_sub", "-h", "127.0.0.1", "-p", "1883", "-t", "#", "-C", "3",
             "-W", "30", "-v", "-i", "first-run-sub"],
            stdout=subprocess.PIPE, text=True,
        )
        token = (work / "data" / "api.token").read_text().strip()
        wait_subscribed(token, "first-run-sub")
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", "1883", "-t", "tcp/hello",
                        "-m", "from-mosquitto", "-q", "1"], check=True, timeout=30)
        asyncio.run(mqttsn_publish("sn/hello", b"from-mqttsn"))
        coap = coap_client()
        subprocess.run([coap, "-m", "post", "-e", "from-coap",
                        "coap://127.0.0.1:5683/ps/coap/hello?clientid=coap1&qos=1"],
                       check=True, timeout=30, capture_output=True)
        out, _ = sub.communicate(timeout=60)
        seen["received"] = sorted(out.split("\n")[:3])
        lwm2m = subprocess.run([coap, "-m", "post", "-t", "40", "-e", "</3/0>",
                                "coap://127.0.0.1:5783/rd?ep=first-run-dev&lt=60&lwm2m=1.0"],
                               capture_output=True, text=True, timeout=30)
        seen["lwm2m"] = [lwm2m.returncode, lwm2m.stdout.strip(), lwm2m.stderr.strip()]
        req = urllib.request.Request("http://127.0.0.1:18083/api/v5/alarms",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            seen["alarms"] = sorted(a["name"] for a in json.load(r)["data"])
        with urllib.request.urlopen("http://127.0.0.1:18083/dashboard/", timeout=10) as r:
            seen["dashboard"] = r.status
    except Exception as exc:  # reported with the log
        seen["error"] = repr(exc)
    finally:
        proc.stop(15)
        busy.close()
    seen["log"] = proc.log()
    return seen


if __name__ == "__main__":
    print(json.dumps(main()))
