"""site.yml against real Debian 12 roots: converge two fresh mmdebstrap roots through the
``community.general.chroot`` connection, converge again (changed=0), ``--check --diff``
(changed=0), a wrong variable (fails in validation, changes nothing), then boot both with
systemd-nspawn: gatewayd active and READY on each, paho clients publish and subscribe,
the two form a cluster over mutual TLS with the pki role's certificates (a message
published on one reaches a subscriber on the other), and host b's bridge (role bridge)
forwards to host a. Then, on the running containers (chroot connection whose chroot
command is ``nsenter-root``): a rules change reloads and a configuration change restarts,
upgrade.yml rolls a new wheelhouse host by host, and a broken build (same version,
another hash) stops the roll-out on the first host, which is switched back.

The two containers share the host's network, each with its own free ports. Slow (a
minute or more per converge on 2 cores); skipped when not root, without mmdebstrap /
systemd-nspawn, or when the Debian mirror cannot be reached.
"""

from __future__ import annotations

import functools
import hashlib
import json
import queue
import resource
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.ansible.harness import Run, playbook, wheelhouse
from tests.gateway.admin.gatewayd import free_port
from tests.nspawn import PACKAGES, Container, base_rootfs, copy_tree, skip_unless_possible, until

pytestmark = [pytest.mark.ansible, pytest.mark.slow, pytest.mark.timeout(1800)]

# python3-apt: the apt module checks packages through it (offline, no apt-get update);
# rclone: host a converges with gateway_fleet_ship_enabled and the roots have no APT
# source, so the cached rootfs has it already (the role's apt task finds it present)
TARGET_PACKAGES = (*PACKAGES, "python3-apt", "rclone")
HOSTS = ("a", "b")
# what the roles write on a host
WATCHED = ("etc/gateway", "etc/sysctl.d", "etc/security/limits.d", "etc/systemd/system", "opt",
           "usr/lib/sysusers.d", "usr/lib/tmpfiles.d", "etc/passwd", "var/lib")
BRIDGE_SECRET = "bridge-s3cret-never-logged"
SHIP_TO = "/var/lib/gateway/central"  # writable under the ship unit's ProtectSystem=strict


@dataclass
class Host:
    name: str
    root: Path
    ports: dict[str, int]
    container: Container | None = None

    @property
    def node(self) -> str:
        return f"{self.name}@127.0.0.1"


@dataclass
class Converged:
    hosts: dict[str, Host]
    inventory: Path
    pki: Path
    wheels: Path
    work: Path
    runs: dict[str, Run] = field(default_factory=dict)
    fresh_unchanged: bool = False


def write_inventory(path: Path, hosts: dict[str, Host], wheels: Path, pki: Path,
                    live: bool = False) -> None:
    """The inventory of the test's hosts; ``live``: the booted containers, reached with the
    chroot connection whose chroot command is ``nsenter-root`` (every namespace of the
    container's init), so systemctl talks to the container's systemd."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 1048576 if hard == resource.RLIM_INFINITY else min(1048576, hard)
    entries = {}
    for h in hosts.values():
        entries[h.name] = {
            "ansible_host": (f"/proc/{h.container.leader}/root" if live and h.container
                             else str(h.root)),
            **({"ansible_chroot_exe": str(Path(__file__).with_name("nsenter-root"))}
               if live else {}),
            "gateway_node_name": h.node,
            "cluster_port": h.ports["cluster"],
            "cluster_bind": f"127.0.0.1:{h.ports['cluster']}",
            "gateway_verify_port": h.ports["mqtt"],
            "gateway_config": {
                "listeners": {"tcp": {"default": {"bind": f"127.0.0.1:{h.ports['mqtt']}",
                                                  "max_connections": 1000}}},
                "api": {"bind": f"127.0.0.1:{h.ports['api']}"},
                "log": {"level": "info"},
            },
        }
    # b bridges its "bridged/#" topics to a's MQTT listener (a real upstream)
    entries["b"]["bridge_upstreams"] = [{
        "name": "toa", "server": f"127.0.0.1:{hosts['a'].ports['mqtt']}",
        "username": "b", "password": BRIDGE_SECRET, "proto_ver": "v4",
        "forwards": [{"local": "bridged/#", "remote": "up/${topic}", "qos": 1}],
    }]
    entries["b"]["gateway_config_show_diff"] = False
    # a ships its fleet archive (to a local path: the uplink is not what is tested here)
    entries["a"]["gateway_fleet_ship_enabled"] = True
    config_a = entries["a"]["gateway_config"]
    assert isinstance(config_a, dict)
    config_a["fleet"] = {
        "archiver": {"enable": True, "site": "s1", "gw": "a"},
        "shipper": {"enable": True, "type": "local", "path": SHIP_TO},
    }
    inventory = {
        "gateway": {
            "vars": {
                "ansible_connection": "community.general.chroot",
                "ansible_python_interpreter": "/usr/bin/python3",
                "gateway_wheelhouse_dir": str(wheels),
                "pki_dir": str(pki),
                "tuning_profile": "edge",
                # what this machine allows, a quick restart for the test
                "gateway_service_settings": {"LimitNOFILE": nofile, "RestartSec": "1s"},
                "gateway_authz_rules": [{"permission": "deny", "action": "subscribe",
                                         "topics": ["forbidden/#"]}],
            },
            "children": {"gateway_cluster": {"children": {"gateway_core": {"hosts": entries}}}},
        }
    }
    path.write_text(json.dumps(inventory, indent=1))  # JSON is YAML


def tree_digest(root: Path, *paths: str) -> str:
    """A digest of the files under ``paths`` of ``root`` (names, modes, contents)."""
    digest = hashlib.sha256()
    for rel in paths:
        base = root / rel.lstrip("/")
        files = sorted(base.rglob("*")) if base.is_dir() else [base]
        for f in files:
            if f.is_symlink():
                digest.update(f"{f}->{f.readlink()}".encode())
            elif f.is_file():
                digest.update(f"{f}:{f.stat().st_mode:o}".encode() + f.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def converged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Converged]:
    skip_unless_possible()
    base = base_rootfs(TARGET_PACKAGES)
    wheels = wheelhouse()
    work = tmp_path_factory.mktemp("ansible")
    hosts = {name: Host(name, copy_tree(base, work / f"root-{name}"),
                        {"mqtt": free_port(), "api": free_port(), "cluster": free_port()})
             for name in HOSTS}
    inventory = work / "hosts.yml"
    pki = work / "pki"
    write_inventory(inventory, hosts, wheels, pki)
    state = Converged(hosts, inventory, pki, wheels, work)
    before = {n: tree_digest(h.root, *WATCHED) for n, h in hosts.items()}
    state.runs["check-fresh"] = playbook(inventory, "site.yml", "--check", "--diff")
    state.fresh_unchanged = (before == {n: tree_digest(h.root, *WATCHED) for n, h in hosts.items()}
                             and not (pki / "ca.crt").exists())
    state.runs["first"] = playbook(inventory, "site.yml")
    yield state
    for h in hosts.values():
        if h.container is not None:
            h.container.shutdown()


def test_check_mode_on_a_fresh_root_reports_and_changes_nothing(converged: Converged) -> None:
    run = converged.runs["check-fresh"]
    assert run.returncode == 0, run.output[-6000:]
    assert all(n > 0 for n in run.changed().values()), run.output[-3000:]
    assert '+name = "a@127.0.0.1"' in run.output  # --diff of host a's gateway.toml
    assert converged.fresh_unchanged  # neither the roots nor the controller (no CA yet)


def test_first_converge(converged: Converged) -> None:
    run = converged.runs["first"]
    assert run.returncode == 0, run.output[-6000:]
    assert set(run.recap()) == {"a", "b"}
    assert all(n > 0 for n in run.changed().values())
    print(f"first converge: {run.seconds:.1f}s")
    for h in converged.hosts.values():
        root = h.root
        assert (root / "etc/systemd/system/multi-user.target.wants/gatewayd.service").is_symlink()
        release = (root / "opt/gateway").readlink()  # absolute, inside the root
        assert str(release).startswith("/opt/gateway-releases/")
        assert (root / str(release).lstrip("/") / "bin/gatewayd").exists()
        key = root / f"etc/gateway/cluster-pki/{h.node}.key"
        assert oct(key.stat().st_mode & 0o777) == "0o600"
        config = (root / "etc/gateway/gateway.toml").read_text()
        assert f'name = "{h.node}"' in config and "[cluster.tls]" in config
        edge = Path(__file__).resolve().parents[2] / "systemd/sysctl.d/60-gateway-edge.conf"
        assert (root / "etc/sysctl.d/60-gateway.conf").read_bytes() == edge.read_bytes()
    assert "is persisted; /proc/sys is not writable here" in run.output
    assert (converged.pki / "ca.key").stat().st_mode & 0o777 == 0o600
    assert BRIDGE_SECRET not in run.output


def test_second_converge_changes_nothing(converged: Converged) -> None:
    ca = (converged.pki / "ca.crt").read_bytes()
    run = converged.runs["second"] = playbook(converged.inventory, "site.yml")
    assert run.returncode == 0, run.output[-6000:]
    print(f"second converge: {run.seconds:.1f}s")
    assert run.changed() == {"a": 0, "b": 0}, run.output[-6000:]
    assert (converged.pki / "ca.crt").read_bytes() == ca  # never overwritten


def test_check_mode_on_a_converged_host_changes_nothing(converged: Converged) -> None:
    run = playbook(converged.inventory, "site.yml", "--check", "--diff")
    assert run.returncode == 0, run.output[-6000:]
    assert run.changed() == {"a": 0, "b": 0}, run.output[-6000:]
    assert BRIDGE_SECRET not in run.output


@pytest.mark.parametrize(("extra", "message"), [
    ('{"cluster_port": 70000}', "cluster role: cluster_port must be in 1..65535, got 70000"),
    ('{"tuning_profile": "huge"}',
     "value of tuning_profile must be one of: 1m, edge, none, got: huge"),
    ('{"gateway_keep_releases": "many"}',
     "argument 'gateway_keep_releases' is of type str and we were unable to convert to int"),
    # passes the roles' checks, refused by gatewayd --check before it replaces gateway.toml
    ('{"gateway_config": {"mqtt": {"max_inflight": 0}}}',
     "gatewayd: invalid configuration: mqtt.max_inflight"),
])
def test_a_wrong_variable_fails_before_any_change(
    converged: Converged, extra: str, message: str,
) -> None:
    paths = WATCHED
    before = {n: tree_digest(h.root, *paths) for n, h in converged.hosts.items()}
    pki_before = tree_digest(converged.pki, "")
    run = playbook(converged.inventory, "site.yml", "-e", extra)
    assert run.returncode != 0
    assert message in run.output, run.output[-4000:]
    assert all(n == 0 for n in run.changed().values()), run.output[-4000:]
    assert {n: tree_digest(h.root, *paths) for n, h in converged.hosts.items()} == before
    assert tree_digest(converged.pki, "") == pki_before


@pytest.fixture(scope="module")
def booted(converged: Converged, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Host]:
    logs = tmp_path_factory.mktemp("consoles")
    for h in converged.hosts.values():
        h.container = Container(h.root, logs / f"{h.name}.log", machine=f"gateway-ansible-{h.name}")
        h.container.boot()
    return converged.hosts


def test_gatewayd_active_and_ready_on_each(booted: dict[str, Host]) -> None:
    def ready(c: Container) -> bool:
        props = c.show("ActiveState", "StatusText")
        return props.get("ActiveState") == "active" and "connections" in props["StatusText"]

    for h in booted.values():
        c = h.container
        assert c is not None
        until(f"gatewayd READY on {h.name}", functools.partial(ready, c), 90)
        props = c.show("Type", "User", "NRestarts")
        assert props == {"Type": "notify", "User": "gateway", "NRestarts": "0"}, c.journal()
        status = c.run("gatewayctl", "status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["status"] == "running"


def test_the_fleet_ship_timer_is_enabled_and_a_pass_ships(booted: dict[str, Host]) -> None:
    """Host a converged with gateway_fleet_ship_enabled: the timer is enabled and
    active, and a pass started by hand (the service the timer starts, as the gateway
    user under its hardening) ships a sealed segment and records it."""
    h = booted["a"]
    c = h.container
    assert c is not None
    assert c.run("systemctl", "is-enabled", "gateway-fleet-ship.timer").stdout.strip() == "enabled"
    assert c.run("systemctl", "is-active", "gateway-fleet-ship.timer").stdout.strip() == "active"
    rel = "telemetry/ingest_date=2024-03-01/site=s1/gw=a/a-20240301T000000.000Z.jsonl.gz"
    seg = f"/var/lib/gateway/archive/raw/{rel}"
    made = c.run("sh", "-c", f"mkdir -p $(dirname {seg}) && printf '{{}}\\n' | gzip > {seg}"
                 f" && chown -R gateway:gateway /var/lib/gateway/archive")
    assert made.returncode == 0, made.stderr
    ran = c.run("systemctl", "start", "gateway-fleet-ship.service", timeout=120)
    log = c.run("journalctl", "-u", "gateway-fleet-ship", "--no-pager", "-n", "30").stdout
    assert ran.returncode == 0, ran.stderr + log
    assert c.run("test", "-s", f"{SHIP_TO}/{rel}").returncode == 0, log
    assert c.run("test", "-e", seg).returncode != 0, log
    status = json.loads(c.run("cat", "/var/lib/gateway/archive/shipper-status.json").stdout)
    assert status["shipped_segments_total"] == 1 and status["consecutive_errors"] == 0


class Paho:
    """A paho client on the host, its messages put into ``inbox``, SUBACKs into ``subacks``."""

    def __init__(self, port: int, client_id: str) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.inbox: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.subacks: queue.Queue[bool] = queue.Queue()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
        self.client.on_message = lambda _c, _u, m: self.inbox.put((m.topic, bytes(m.payload)))
        self.client.on_subscribe = lambda *_: self.subacks.put(True)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def subscribe(self, topic: str) -> None:
        self.client.subscribe(topic, qos=1)
        self.subacks.get(timeout=10)

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(10)

    def received(self, expected: tuple[str, bytes], timeout: float = 1) -> bool:
        try:
            return self.inbox.get(timeout=timeout) == expected
        except queue.Empty:
            return False

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_paho_publishes_and_subscribes_through_a_node(booted: dict[str, Host]) -> None:
    port = booted["a"].ports["mqtt"]
    sub, pub = Paho(port, "sub-a"), Paho(port, "pub-a")
    try:
        sub.subscribe("local/#")
        pub.publish("local/x", b"hello")
        assert sub.received(("local/x", b"hello"), timeout=10)
    finally:
        sub.close()
        pub.close()


def test_the_two_nodes_form_a_cluster_over_mutual_tls(booted: dict[str, Host]) -> None:
    a, b = booted["a"], booted["b"]
    assert a.container is not None

    def members_up() -> bool:
        assert a.container is not None
        r = a.container.run("gatewayctl", "cluster", "status", "--json")
        return r.returncode == 0 and '"up"' in r.stdout and b.node in r.stdout

    until("b up in a's cluster view", members_up, 60)
    sub, pub = Paho(b.ports["mqtt"], "sub-on-b"), Paho(a.ports["mqtt"], "pub-on-a")
    try:
        sub.subscribe("across/#")

        def arrived() -> bool:  # until a has learnt b's route: publish again
            pub.publish("across/nodes", b"from a")
            return sub.received(("across/nodes", b"from a"))

        until("a message from a at b's subscriber", arrived, 30)
    finally:
        sub.close()
        pub.close()
    assert "TLS handshake failed" not in a.container.journal()


def test_the_bridge_role_forwards_from_b_to_a(booted: dict[str, Host]) -> None:
    a, b = booted["a"], booted["b"]
    sub, pub = Paho(a.ports["mqtt"], "sub-up-on-a"), Paho(b.ports["mqtt"], "pub-bridged-on-b")
    try:
        sub.subscribe("up/bridged/#")

        def arrived() -> bool:  # until the bridge is connected
            pub.publish("bridged/t", b"via bridge")
            return sub.received(("up/bridged/t", b"via bridge"))

        until("a bridged message at a", arrived, 60)
    finally:
        sub.close()
        pub.close()


# ---------------------------------------------------------------- the running hosts


def live_inventory(converged: Converged, name: str, wheels: Path | None = None) -> Path:
    path = converged.work / f"{name}.yml"
    write_inventory(path, converged.hosts, wheels or converged.wheels, converged.pki, live=True)
    return path


def main_pids(hosts: dict[str, Host]) -> dict[str, str]:
    return {n: h.container.show("MainPID")["MainPID"] for n, h in hosts.items()
            if h.container is not None}


def release_of(h: Host) -> str:
    return str((h.root / "opt/gateway").readlink())


def test_a_rules_change_reloads_and_a_config_change_restarts(
    converged: Converged, booted: dict[str, Host],
) -> None:
    inventory = live_inventory(converged, "live")
    before = main_pids(booted)
    rules = ('{"gateway_authz_rules": [{"permission": "deny", "action": "subscribe", '
             '"topics": ["forbidden/#", "secret/#"]}]}')
    run = playbook(inventory, "site.yml", "-e", rules)
    assert run.returncode == 0, run.output[-6000:]
    # the rules file and the reload handler, nothing else, on the running hosts
    assert run.changed() == {"a": 2, "b": 2}, run.output[-6000:]
    # the role's health check ran on the live hosts (gatewayctl status, MQTT round trip)
    health = run.output.split("TASK [gateway : MQTT round trip through the node]")[1]
    assert "ok: [a]" in health and "ok: [b]" in health, run.output[-3000:]
    assert "RUNNING HANDLER [gateway : Reload gatewayd]" in run.output
    assert "changed: [a]" in run.output.split("RUNNING HANDLER [gateway : Reload gatewayd]")[1]
    assert main_pids(booted) == before  # SIGHUP, no restart
    for h in booted.values():
        assert h.container is not None
        assert "authorization reloaded: 1 rules" in h.container.journal()
    # a key SIGHUP does not re-read: a restart (upgrade.yml's run puts it back)
    base = ('{"gateway_config_base": {"node": {"name": "{{ gateway_node_name }}", '
            '"data_dir": "/var/lib/gateway"}, "mqtt": {"max_inflight": 64}}}')
    run = playbook(inventory, "site.yml", "-e", rules, "-e", base)
    assert run.returncode == 0, run.output[-6000:]
    # gateway.toml and the restart handler, nothing else
    assert run.changed() == {"a": 2, "b": 2}, run.output[-6000:]
    after = main_pids(booted)
    assert all(after[n] != before[n] for n in before), (before, after)
    for h in booted.values():
        assert h.container is not None
        assert "max_inflight = 64" in (h.root / "etc/gateway/gateway.toml").read_text()
        assert h.container.show("ActiveState")["ActiveState"] == "active"


def broken_wheelhouse(converged: Converged) -> Path:
    """A copy of the wheelhouse whose edge-gateway wheel (same version 0.1.0, other bytes)
    builds a gatewayd that exits at start: only its hash tells it apart. Both of ours
    (pure and compiled) go: pip would take the compiled one of the good build."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    src = converged.work / "broken-src"
    src.mkdir()
    for part in ("pyproject.toml", "setup.py", "mypyc.ini", "README.md", "gateway",
                 "protocols"):
        subprocess.run(["cp", "-a", str(repo / part), str(src / part)], check=True)
    cli = src / "gateway/cli/gatewayd.py"
    cli.write_text(cli.read_text().replace(
        "    from gateway.app import run\n",
        "    raise SystemExit('gatewayd: a broken build (tests/ansible upgrade test)')\n"))
    out = converged.work / "broken-wheelhouse"
    subprocess.run(["cp", "-a", str(converged.wheels), str(out)], check=True)
    for whl in out.glob("edge_gateway-*.whl"):
        whl.unlink()
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir",
                        str(out), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (ours,) = out.glob("edge_gateway-*.whl")  # the pure one
    digest = hashlib.sha256(ours.read_bytes()).hexdigest()
    lines = [f"edge-gateway=={ours.name.split('-')[1]} --hash=sha256:{digest}"
             if line.startswith("edge-gateway==") else line
             for line in (out / "requirements.txt").read_text().splitlines()]
    (out / "requirements.txt").write_text("\n".join(lines) + "\n")
    return out


def test_upgrade_rolls_one_host_at_a_time(converged: Converged, booted: dict[str, Host]) -> None:
    new = converged.work / "new-wheelhouse"
    import shutil

    shutil.copytree(converged.wheels, new)
    with (new / "requirements.txt").open("a") as f:
        f.write("# a new build: same wheels, another requirements.txt, another release\n")
    old = {n: release_of(h) for n, h in booted.items()}
    run = playbook(live_inventory(converged, "upgrade", new), "upgrade.yml")
    assert run.returncode == 0, run.output[-6000:]
    print(f"upgrade.yml over two hosts: {run.seconds:.1f}s")
    for n, h in booted.items():
        assert release_of(h) != old[n]
        assert h.container is not None
        assert h.container.show("ActiveState")["ActiveState"] == "active"
    # serial: 1 - a was upgraded and healthy before anything ran on b
    out = run.output
    assert out.index("MQTT round trip through the node") < out.index(": [b]")
    converged.wheels = new


def test_a_failed_upgrade_stops_and_switches_back(converged: Converged,
                                                  booted: dict[str, Host]) -> None:
    broken = broken_wheelhouse(converged)
    good = {n: release_of(h) for n, h in booted.items()}
    b_pid = main_pids(booted)["b"]
    run = playbook(live_inventory(converged, "broken", broken), "upgrade.yml")
    assert run.returncode != 0
    assert "did not become healthy on the new release" in run.output, run.output[-6000:]
    a, b = booted["a"], booted["b"]
    assert a.container is not None
    assert release_of(a) == good["a"]  # switched back
    until("gatewayd on a back on its previous release",
          lambda: a.container is not None
          and a.container.show("ActiveState")["ActiveState"] == "active", 60)
    assert "a broken build" in a.container.run(
        "journalctl", "-u", "gatewayd", "--no-pager").stdout
    assert release_of(b) == good["b"] and main_pids(booted)["b"] == b_pid  # never touched
    assert "b" not in run.changed() or run.changed()["b"] == 0
