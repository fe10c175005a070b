"""A real gatewayd with every MQTT extension configured (through ``GATEWAY_*`` TOML
values, as a configuration file gives them), MQTT on TCP and MQTT-SN on UDP."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.admin.gatewayd import Gatewayd
from tests.harness.gatewayd import GatewaydProcess, free_port, gatewayd_command, gatewayd_env

EXT_CONFIG = {
    "GATEWAY_MQTT__EXCLUSIVE_SUBSCRIPTION": "true",
    "GATEWAY_AUTO_SUBSCRIBE__TOPICS":
        '[{topic = "cmd/${clientid}", qos = 1}, '
        '{topic = "user/${username}/in", qos = 0, rh = 1}, '
        '{topic = "from/${host}", qos = 0}, '
        '{topic = "denied/${clientid}", qos = 0}]',
    "GATEWAY_AUTHORIZATION__RULES":
        '[{permission = "deny", action = "subscribe", topics = ["denied/#"]}, '
        '{permission = "deny", action = "publish", topics = ["secret/#", "y/forbidden"]}]',
}


# a top-level list cannot come from GATEWAY_* variables: the rules are in a file
REWRITE_TOML = """
[[rewrite]]
action = "publish"
source_topic = "x/#"
dest_topic = "y/$1"
re = "^x/(.+)$"

[[rewrite]]
action = "subscribe"
source_topic = "old/+"
dest_topic = "new/$1"
re = "^old/(.+)$"

[[rewrite]]
action = "all"
source_topic = "me/#"
dest_topic = "dev/${clientid}/$1"
re = "^me/(.+)$"

[[rewrite]]
action = "all"
source_topic = "x/keep/#"
dest_topic = "never"
re = "^x/keep/(.+)$"
"""


def mqttsn_port() -> int:
    return free_port(socket.SOCK_DGRAM)


class ExtGatewayd(Gatewayd):
    mqttsn_port: int
    config_text: str = REWRITE_TOML

    def start(self) -> ExtGatewayd:
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / "gateway.toml"
        path.write_text(self.config_text)
        self.process = GatewaydProcess(
            self.workdir, gatewayd_env(self.env), command=gatewayd_command("--config", str(path))
        ).start()
        return self


def make(workdir: Path, extra: dict[str, str] | None = None) -> ExtGatewayd:
    sn = mqttsn_port()
    env = {
        **EXT_CONFIG,
        "GATEWAY_GATEWAY__MQTTSN__LISTENERS__UDP__DEFAULT__BIND": f"127.0.0.1:{sn}",
        **(extra or {}),
    }
    gw = ExtGatewayd(workdir, env)
    gw.mqttsn_port = sn
    return gw


@pytest.fixture(scope="module")
def gatewayd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExtGatewayd]:
    gw = make(tmp_path_factory.mktemp("ext"))
    gw.start()
    yield gw
    gw.stop()
