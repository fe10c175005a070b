"""site.yml against real Debian 12 roots: converge two fresh mmdebstrap roots through the
``community.general.chroot`` connection, converge again (changed=0), ``--check --diff``
(changed=0), a wrong variable (fails in validation, changes nothing), then boot both with
systemd-nspawn: gatewayd active and READY on each, paho clients publish and subscribe,
the two form a cluster over mutual TLS with the pki role's certificates (a message
published on one reaches a subscriber on the other), and host b's bridge (role bridge)
forwards to host a.

The two containers share the host's network, each with its own free ports. Slow (a
minute or more per converge on 2 cores); skipped when not root, without mmdebstrap /
systemd-nspawn, or when the Debian mirror cannot be reached.
"""

from __future__ import annotations

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

# python3-apt: the apt module checks packages through it (offline, no apt-get update)
TARGET_PACKAGES = (*PACKAGES, "python3-apt")
HOSTS = ("a", "b")
BRIDGE_SECRET = "bridge-s3cret-never-logged"


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
    runs: dict[str, Run] = field(default_factory=dict)


def write_inventory(path: Path, hosts: dict[str, Host], wheels: Path, pki: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 1048576 if hard == resource.RLIM_INFINITY else min(1048576, hard)
    entries = {}
    for h in hosts.values():
        entries[h.name] = {
            "ansible_host": str(h.root),
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
    state = Converged(hosts, inventory, pki)
    state.runs["first"] = playbook(inventory, "site.yml")
    yield state
    for h in hosts.values():
        if h.container is not None:
            h.container.shutdown()


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
        assert (root / "etc/sysctl.d/60-gateway.conf").read_bytes() == \
            (Path(__file__).resolve().parents[2] / "systemd/sysctl.d/60-gateway-edge.conf").read_bytes()
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
    ('{"cluster_port": 70000}', "cluster_port must be in 1..65535 (got 70000)"),
    ('{"tuning_profile": "huge"}', "tuning_profile"),
    ('{"gateway_keep_releases": "many"}', "gateway_keep_releases"),
])
def test_a_wrong_variable_fails_before_any_change(
    converged: Converged, extra: str, message: str,
) -> None:
    paths = ("etc/gateway", "etc/sysctl.d", "etc/systemd/system", "opt")
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
    for h in booted.values():
        c = h.container
        assert c is not None

        def ready() -> bool:
            assert c is not None
            props = c.show("ActiveState", "StatusText")
            return props.get("ActiveState") == "active" and "connections" in props["StatusText"]

        until(f"gatewayd READY on {h.name}", ready, 90)
        props = c.show("Type", "User", "NRestarts")
        assert props == {"Type": "notify", "User": "gateway", "NRestarts": "0"}, c.journal()
        status = c.run("gatewayctl", "status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["status"] == "running"


def _client(port: int, client_id: str, inbox: queue.Queue[tuple[str, bytes]] | None = None):  # type: ignore[no-untyped-def]
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
    subscribed: queue.Queue[bool] = queue.Queue()
    if inbox is not None:
        client.on_message = lambda _c, _u, m: inbox.put((m.topic, m.payload))
    client.on_subscribe = lambda *_: subscribed.put(True)
    client.connect("127.0.0.1", port)
    client.loop_start()
    client.subscribed = subscribed  # type: ignore[attr-defined]
    return client


def test_paho_publishes_and_subscribes_through_a_node(booted: dict[str, Host]) -> None:
    port = booted["a"].ports["mqtt"]
    inbox: queue.Queue[tuple[str, bytes]] = queue.Queue()
    sub = _client(port, "sub-a", inbox)
    pub = _client(port, "pub-a")
    try:
        sub.subscribe("local/#", qos=1)
        sub.subscribed.get(timeout=10)
        pub.publish("local/x", b"hello", qos=1).wait_for_publish(10)
        assert inbox.get(timeout=10) == ("local/x", b"hello")
    finally:
        for c in (sub, pub):
            c.disconnect()
            c.loop_stop()


def test_the_two_nodes_form_a_cluster_over_mutual_tls(booted: dict[str, Host]) -> None:
    a, b = booted["a"], booted["b"]
    assert a.container is not None

    def members_up() -> bool:
        assert a.container is not None
        r = a.container.run("gatewayctl", "cluster", "status", "--json")
        return r.returncode == 0 and '"up"' in r.stdout and b.node in r.stdout

    until("b up in a's cluster view", members_up, 60)
    inbox: queue.Queue[tuple[str, bytes]] = queue.Queue()
    sub = _client(b.ports["mqtt"], "sub-on-b", inbox)
    pub = _client(a.ports["mqtt"], "pub-on-a")
    try:
        sub.subscribe("across/#", qos=1)
        sub.subscribed.get(timeout=10)

        def arrived() -> bool:  # until a has learnt b's route: publish again
            pub.publish("across/nodes", b"from a", qos=1).wait_for_publish(10)
            try:
                return inbox.get(timeout=1) == ("across/nodes", b"from a")
            except queue.Empty:
                return False

        until("a message from a at b's subscriber", arrived, 30)
    finally:
        for c in (sub, pub):
            c.disconnect()
            c.loop_stop()
    journal = a.container.journal()
    assert "TLS handshake failed" not in journal


def test_the_bridge_role_forwards_from_b_to_a(booted: dict[str, Host]) -> None:
    a, b = booted["a"], booted["b"]
    inbox: queue.Queue[tuple[str, bytes]] = queue.Queue()
    sub = _client(a.ports["mqtt"], "sub-up-on-a", inbox)
    pub = _client(b.ports["mqtt"], "pub-bridged-on-b")
    try:
        sub.subscribe("up/bridged/#", qos=1)
        sub.subscribed.get(timeout=10)

        def arrived() -> bool:  # until the bridge is connected
            pub.publish("bridged/t", b"via bridge", qos=1).wait_for_publish(10)
            try:
                return inbox.get(timeout=1) == ("up/bridged/t", b"via bridge")
            except queue.Empty:
                return False

        until("a bridged message at a", arrived, 60)
    finally:
        for c in (sub, pub):
            c.disconnect()
            c.loop_stop()
