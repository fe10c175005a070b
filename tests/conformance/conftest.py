"""Fixtures that run the broker under test as a real process on a free port.

By default the broker is gatewayd (``python -m gateway.cli.gatewayd``), configured only
through ``GATEWAY_*`` environment variables. With ``CONFORMANCE_BROKER=mosquitto`` the same
tests run against Debian's mosquitto, the reference used to validate the suite itself;
configuration keys with a mosquitto equivalent are translated (``MOSQUITTO_EQUIVALENTS``;
authorization rules go to mosquitto's dynamic-security plugin, whose ACLs, unlike an
``acl_file``, can refuse a SUBSCRIBE).

- ``broker``: one broker per test module, yielding ``BrokerAddr(host, port)``.
- ``make_broker(**env)``: a factory for a broker with extra configuration, stopped at the
  end of the test (``module_broker_factory`` is the same with module lifetime);
  ``make_broker.restart(addr, kill=False)`` restarts one on the same port and data.
- ``uid``: a unique token for topics and client ids, so tests sharing a broker never meet.

Markers: ``gateway_only`` (skipped under mosquitto: a known, documented difference) and
``interop`` (needs mosquitto_pub / mosquitto_sub; skipped when they are not installed).
Each broker is a :class:`tests.harness.gatewayd.GatewaydProcess`: gatewayd is ready on its
READY=1, mosquitto on a bounded TCP-connect poll, never a fixed sleep. When a test fails,
the log of every broker still running is attached to its report.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tomllib
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.harness.gatewayd import (
    GatewaydProcess,
    clean_environ,
    free_port,
    gatewayd_env,
    tcp_listening,
)

BROKER_KIND = os.environ.get("CONFORMANCE_BROKER", "gatewayd").strip().lower() or "gatewayd"
UNDER_MOSQUITTO = BROKER_KIND == "mosquitto"
UNDER_GATEWAY = not UNDER_MOSQUITTO
REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 60.0
HAVE_MOSQUITTO_CLIENTS = bool(shutil.which("mosquitto_pub") and shutil.which("mosquitto_sub"))

# gatewayd key -> mosquitto.conf option (global or listener scope).
MOSQUITTO_EQUIVALENTS: dict[str, tuple[str, str]] = {
    "GATEWAY_MQTT__MAX_INFLIGHT": ("global", "max_inflight_messages"),
    "GATEWAY_MQTT__MAX_PACKET_SIZE": ("global", "max_packet_size"),
    "GATEWAY_MQTT__MAX_MQUEUE_LEN": ("global", "max_queued_messages"),
    "GATEWAY_MQTT__MAX_TOPIC_ALIAS": ("listener", "max_topic_alias"),
    # Not identical: mosquitto only lowers keepalives above it, gatewayd imposes its value.
    "GATEWAY_MQTT__SERVER_KEEPALIVE": ("global", "max_keepalive"),
}


class BrokerAddr(NamedTuple):
    host: str
    port: int


_DYNSEC_PLUGIN = next(
    iter(
        sorted(glob.glob("/usr/lib/*/mosquitto_dynamic_security.so"))
        + sorted(glob.glob("/usr/lib/mosquitto_dynamic_security.so"))
    ),
    "mosquitto_dynamic_security.so",
)
_DYNSEC_ACLTYPES = {
    "subscribe": ["subscribePattern"],
    "publish": ["publishClientSend"],
    "all": ["subscribePattern", "publishClientSend"],
}


def _dynsec_config(rules_toml: str) -> dict[str, object]:
    """Translate gatewayd's authorization rules (a TOML inline array) for mosquitto's
    dynamic-security plugin: one role for the anonymous group, first rule = top priority.

    Only rules without clientid/username/ipaddress conditions translate; ``${clientid}``
    and ``${username}`` become dynsec's ``%c`` and ``%u``.
    """
    rules = tomllib.loads(f"rules = {rules_toml}")["rules"]
    acls = []
    for index, rule in enumerate(rules):
        if any(key in rule for key in ("clientid", "username", "ipaddress")):
            continue
        for topic in rule.get("topics", []):
            topic = topic.replace("${clientid}", "%c").replace("${username}", "%u")
            for acltype in _DYNSEC_ACLTYPES[rule.get("action", "all")]:
                acls.append(
                    {
                        "acltype": acltype,
                        "topic": topic,
                        "priority": len(rules) - index,
                        "allow": rule.get("permission") == "allow",
                    }
                )
    everything = {"publishClientSend": True, "publishClientReceive": True}
    return {
        "defaultACLAccess": {**everything, "subscribe": True, "unsubscribe": True},
        "clients": [],
        "groups": [{"groupname": "anonymous", "roles": [{"rolename": "rules"}], "clients": []}],
        "roles": [{"rolename": "rules", "acls": acls}],
        "anonymousGroup": "anonymous",
    }


class BrokerProcess:
    """One broker process with its own port, data directory and log file."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = dict(env)
        self.host = "127.0.0.1"
        self.port = free_port()
        self.log_path = workdir / "broker.log"
        self.process: GatewaydProcess | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc if self.process is not None else None

    @property
    def addr(self) -> BrokerAddr:
        return BrokerAddr(self.host, self.port)

    def _mosquitto_command(self) -> list[str]:
        global_lines = [
            "user root",
            "persistence true",
            f"persistence_location {self.workdir}/",
            "log_dest stderr",
            "log_type all",
        ]
        listener_lines = ["allow_anonymous true"]
        for key, value in self.env.items():
            if key in MOSQUITTO_EQUIVALENTS:
                scope, option = MOSQUITTO_EQUIVALENTS[key]
                (global_lines if scope == "global" else listener_lines).append(f"{option} {value}")
            elif key == "GATEWAY_AUTHORIZATION__RULES":
                dynsec = self.workdir / "dynsec.json"
                dynsec.write_text(json.dumps(_dynsec_config(value), indent=1))
                global_lines += [f"plugin {_DYNSEC_PLUGIN}", f"plugin_opt_config_file {dynsec}"]
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(
            "\n".join([*global_lines, f"listener {self.port} {self.host}", *listener_lines]) + "\n"
        )
        # Debian puts mosquitto in /usr/sbin, which a non-root PATH may lack.
        mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        return [mosquitto, "-c", str(conf)]

    def start(self) -> None:
        if UNDER_MOSQUITTO:
            self.process = GatewaydProcess(
                self.workdir, clean_environ(), command=self._mosquitto_command(),
                ready=lambda: tcp_listening(self.port, self.host), log_path=self.log_path,
                ready_timeout=READY_TIMEOUT, what=BROKER_KIND,
            )
        else:
            data_dir = self.workdir / "data"
            data_dir.mkdir(exist_ok=True)
            env = {
                "GATEWAY_LISTENERS__TCP__DEFAULT__BIND": f"{self.host}:{self.port}",
                "GATEWAY_NODE__DATA_DIR": str(data_dir),
                **self.env,
            }
            self.process = GatewaydProcess(
                self.workdir, gatewayd_env(env), log_path=self.log_path,
                ready_timeout=READY_TIMEOUT, what=BROKER_KIND,
            )
        self.process.start()

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (a graceful shutdown) or, with ``kill``, SIGKILL; waits for the exit."""
        if self.process is None or not self.process.alive():
            return
        if kill:
            self.process.kill()
        else:
            self.process.stop(5)

    def log_tail(self, limit: int = 12000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "(no log)"
        return data[-limit:].decode(errors="replace")


_RUNNING: list[BrokerProcess] = []


class BrokerFactory:
    """Starts brokers with extra ``GATEWAY_*`` configuration and stops them all later."""

    def __init__(self, make_dir: Callable[[], Path]) -> None:
        self._make_dir = make_dir
        self.started: list[BrokerProcess] = []

    def __call__(self, **env: str | int) -> BrokerAddr:
        proc = BrokerProcess(self._make_dir(), {k: str(v) for k, v in env.items()})
        proc.start()
        self.started.append(proc)
        _RUNNING.append(proc)
        return proc.addr

    def process(self, addr: BrokerAddr) -> BrokerProcess:
        return next(p for p in self.started if p.addr == addr)

    def restart(self, addr: BrokerAddr, *, kill: bool = False) -> None:
        """Stop the broker at ``addr`` (SIGTERM, or SIGKILL with ``kill``) and start it
        again on the same port with the same data directory."""
        proc = self.process(addr)
        proc.stop(kill=kill)
        with open(proc.log_path, "ab") as log:
            log.write(b"\n---- restart (%s) ----\n" % (b"SIGKILL" if kill else b"SIGTERM"))
        proc.start()

    def stop_all(self) -> None:
        for proc in self.started:
            crashed = proc.proc is not None and proc.proc.poll() is not None
            proc.stop()
            if proc in _RUNNING:
                _RUNNING.remove(proc)
            if crashed:
                print(
                    f"\n--- {BROKER_KIND} on port {proc.port} had exited "
                    f"(status {proc.proc.returncode if proc.proc else '?'}); log tail:\n"
                    f"{proc.log_tail()}"
                )
        self.started.clear()


@pytest.fixture(scope="module")
def module_broker_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[BrokerFactory]:
    factory = BrokerFactory(lambda: tmp_path_factory.mktemp("broker"))
    yield factory
    factory.stop_all()


@pytest.fixture(scope="module")
def broker(module_broker_factory: BrokerFactory) -> BrokerAddr:
    """The broker under test with its default configuration, shared by one module."""
    return module_broker_factory()


@pytest.fixture
def make_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerFactory]:
    """``make_broker(GATEWAY_MQTT__MAX_INFLIGHT=2, ...)`` -> address of a fresh broker."""
    factory = BrokerFactory(lambda: tmp_path_factory.mktemp("broker"))
    yield factory
    factory.stop_all()


@pytest.fixture
def uid() -> str:
    """A short unique token: prefix topics and client ids with it so tests never collide."""
    return uuid.uuid4().hex[:10]


# --------------------------------------------------------------------------- pytest hooks


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "gateway_only: the spec requires it but mosquitto (the reference used to validate "
        "this suite) differs; skipped when CONFORMANCE_BROKER=mosquitto",
    )
    config.addinivalue_line(
        "markers", "interop: needs the mosquitto_pub / mosquitto_sub command-line clients"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gateway = pytest.mark.skip(reason="gateway_only: known mosquitto difference")
    skip_interop = pytest.mark.skip(reason="mosquitto_pub/mosquitto_sub not installed")
    for item in items:
        if UNDER_MOSQUITTO and item.get_closest_marker("gateway_only"):
            item.add_marker(skip_gateway)
        if not HAVE_MOSQUITTO_CLIENTS and item.get_closest_marker("interop"):
            item.add_marker(skip_interop)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        for proc in _RUNNING:
            state = "running" if proc.alive() else f"EXITED ({proc.proc and proc.proc.returncode})"
            report.sections.append(
                (f"{BROKER_KIND} log, port {proc.port}, {state}", proc.log_tail())
            )
    return report
