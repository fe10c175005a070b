"""The image on a (virtual) unit, end to end: flashed with image/flash onto a file-backed
disk, provisioned with an SSH key, booted under QEMU (TCG here; KVM where it works).

One VM serves the whole module, in order: first boot to READY (boot time reported);
MQTT QoS 1 + retained from the host through the forwarded port; read-only root and the
image version/slot in ``gatewayctl status``; a clean reboot keeps /data; a power cut
(``kill -9`` of QEMU) and a cold boot keep a QoS 1 message queued for an offline
persistent session and a retained message; a bundle signed by a foreign key is refused;
a bundle whose gatewayd cannot start is rolled back by boot counting without anyone
touching the unit; the real bundle updates A -> B with /data kept. Boots are the cost
(about a minute each under TCG), so tests share them and run in file order.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.image.conftest import Built
from tests.image.vm import GOOD, REPO, Vm

sys.path.insert(0, str(REPO / "image"))
from edge_image import keys as image_keys
from edge_image import qemu
from edge_image.build import make_bundle

pytestmark = [pytest.mark.image, pytest.mark.slow, pytest.mark.timeout(3600)]

STATE: dict[str, object] = {}


def image_tool(name: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / "image" / name), *map(str, args)],
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def unit(built: Built, ssh_key: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vm]:
    work = tmp_path_factory.mktemp("unit")
    img = work / built.img.name
    subprocess.run(["cp", "--sparse=always", str(built.img), str(img)], check=True)
    subprocess.run(["cp", str(built.bmap), str(work / built.bmap.name)], check=True)
    config = work / "gateway.toml"
    config.write_text((REPO / "image/rootfs/usr/share/edge-gateway/gateway.toml").read_text()
                      .replace('name = "gateway@127.0.0.1"', 'name = "unit-1@127.0.0.1"'))
    r = image_tool("provision", img, "--config", config, "--ssh-key", f"{ssh_key}.pub",
                   "--hostname", "unit-1")
    assert r.returncode == 0, r.stderr
    # The unit's disk: a regular file written by image/flash (bmaptool copy + verify),
    # then made 1 GiB larger than the image, as a real disk would be: the data partition
    # grows into the rest on first boot.
    disk = work / "disk.raw"
    r = image_tool("flash", img, disk, "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert subprocess.run(["cmp", str(img), str(disk)]).returncode == 0
    os.truncate(disk, img.stat().st_size + (1 << 30))
    img.unlink()
    vm = Vm(disk, work, ssh_key)
    vm.start()
    try:
        yield vm
    finally:
        vm.stop()
        print(f"\nboots (s): {[round(b) for b in vm.boots]}; serial log {vm.log}")


def mqtt_client(vm: Vm, client_id: str, clean: bool = True) -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean)
    c.connect("127.0.0.1", vm.ports["mqtt"], keepalive=60)
    c.loop_start()
    return c


def receive(vm: Vm, client_id: str, topic: str, *, clean: bool, count: int = 1,
            timeout: float = 60) -> list[mqtt.MQTTMessage]:
    got: list[mqtt.MQTTMessage] = []
    done = threading.Event()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean)

    def on_message(_c: mqtt.Client, _u: object, msg: mqtt.MQTTMessage) -> None:
        got.append(msg)
        if len(got) >= count:
            done.set()

    def on_connect(cl: mqtt.Client, _u: object, _f: object, rc: object, _p: object) -> None:
        cl.subscribe(topic, qos=1)

    c.on_message = on_message
    c.on_connect = on_connect
    c.connect("127.0.0.1", vm.ports["mqtt"], keepalive=60)
    c.loop_start()
    try:
        assert done.wait(timeout), f"{client_id}: got {len(got)} of {count} on {topic}"
    finally:
        c.disconnect()
        c.loop_stop()
    return got


def publish(vm: Vm, topic: str, payload: bytes, *, retain: bool = False) -> None:
    c = mqtt_client(vm, f"pub-{time.monotonic_ns()}")
    try:
        info = c.publish(topic, payload, qos=1, retain=retain)
        info.wait_for_publish(30)
        assert info.is_published()
    finally:
        c.disconnect()
        c.loop_stop()


# ------------------------------------------------------------------ tests, in order
def test_first_boot_to_ready(unit: Vm) -> None:
    took = unit.wait_good()
    ready = unit.console()
    assert "gateway-health: gatewayd READY" in ready
    print(f"\nfirst boot to READY + MQTT self-check: {took:.0f} s "
          f"({qemu.accelerator().upper()})")
    assert unit.ssh("hostname").stdout.strip() == "unit-1"
    assert unit.ssh("cat /data/provision.applied/hostname").stdout.strip() == "unit-1"
    # The data partition grew into the larger disk on first boot.
    size = int(unit.ssh("df --output=size -B1M /data | tail -1").stdout)
    assert size > 1000, size


def test_mqtt_qos1_and_retained_through_forwarded_port(unit: Vm) -> None:
    publish(unit, "site/1/temp", b"21.5", retain=True)
    got = receive(unit, "reader-1", "site/1/#", clean=True)
    assert got[0].payload == b"21.5" and got[0].retain and got[0].qos == 1
    live = threading.Thread(target=lambda: STATE.setdefault(
        "live", receive(unit, "reader-2", "live/#", clean=True)))
    live.start()
    time.sleep(3)  # let the subscriber's SUBACK arrive over slow TCG before publishing
    publish(unit, "live/x", b"hello")
    live.join(60)
    msgs = STATE["live"]
    assert isinstance(msgs, list) and msgs[0].payload == b"hello"


def test_root_is_read_only_and_status_shows_the_image(unit: Vm) -> None:
    r = unit.ssh("touch /usr/should-fail", check=False)
    assert r.returncode != 0 and "Read-only file system" in r.stderr, r
    status = unit.ssh("/opt/gateway/bin/gatewayctl status").stdout
    assert "edge-gateway test (slot A)" in status, status
    # the wheelhouse's compiled wheel (setup.py's hot path) is the one installed
    version = unit.ssh("/opt/gateway/bin/gatewayd --version").stdout
    assert version.strip().endswith("(compiled)"), version
    assert unit.ssh("passwd -S root").stdout.split()[1] == "L"  # locked, no password


def check_dns_and_ntp(vm: Vm) -> None:
    """systemd-resolved behind /etc/resolv.conf (a link made at build time: the root is
    read-only) with the DHCP lease's name server (QEMU's 10.0.2.3); systemd-timesyncd
    running; no LLMNR / mDNS responder listening (resolved.conf.d/gateway.conf)."""
    assert vm.ssh("readlink /etc/resolv.conf").stdout.strip() == \
        "../run/systemd/resolve/stub-resolv.conf"
    assert "nameserver 127.0.0.53" in vm.ssh("cat /etc/resolv.conf").stdout
    deadline = time.monotonic() + 120
    while "10.0.2.3" not in (dns := vm.ssh("resolvectl dns", check=False).stdout):
        assert time.monotonic() < deadline, dns
        time.sleep(2)
    assert vm.ssh("systemctl is-active systemd-timesyncd").stdout.strip() == "active"
    assert vm.ssh("timedatectl show -p NTP --value").stdout.strip() == "yes"
    listening = vm.ssh("ss -Hlntu").stdout
    assert ":5355 " not in listening and ":5353 " not in listening, listening


def test_dns_resolver_and_ntp(unit: Vm) -> None:
    check_dns_and_ntp(unit)


def test_data_survives_reboot(unit: Vm) -> None:
    unit.ssh("echo kept > /data/marker && sync")
    took = unit.reboot()
    print(f"\nreboot to READY: {took:.0f} s")
    assert unit.ssh("cat /data/marker").stdout.strip() == "kept"
    got = receive(unit, "reader-3", "site/1/temp", clean=True)
    assert got[0].payload == b"21.5"


def test_power_cut_keeps_queued_qos1_and_retained(unit: Vm) -> None:
    # A persistent session subscribes, goes offline; a QoS 1 message is queued for it.
    receive_ready = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="sleeper",
                                clean_session=False)
    subscribed = threading.Event()
    receive_ready.on_subscribe = lambda *a: subscribed.set()
    receive_ready.connect("127.0.0.1", unit.ports["mqtt"])
    receive_ready.loop_start()
    receive_ready.subscribe("alerts/#", qos=1)
    assert subscribed.wait(30)
    receive_ready.disconnect()
    receive_ready.loop_stop()
    publish(unit, "alerts/door", b"open")
    publish(unit, "config/mode", b"eco", retain=True)
    unit.power_cut()
    unit.start()
    took = unit.wait_good()
    print(f"\ncold boot after power cut to READY: {took:.0f} s")
    got = receive(unit, "sleeper", "alerts/#", clean=False)
    assert [m.payload for m in got] == [b"open"]
    got = receive(unit, "reader-4", "config/mode", clean=True)
    assert got[0].payload == b"eco" and got[0].retain


class BundleServer:
    """Serves bundles over HTTP on 127.0.0.1 (the guest reaches it as 10.0.2.2)."""

    def __init__(self, root: Path) -> None:
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def fetch(self, vm: Vm, name: str) -> str:
        dest = f"/tmp/{name}"
        vm.ssh(f"busybox wget -q -O {dest} http://10.0.2.2:{self.port}/{name}", timeout=600)
        return dest


def serve_bundles(built: Built, root: Path, arch: str, *,
                  foreign: bool = True) -> BundleServer:
    """Bundles for ``built``'s units, served over HTTP: ``good.raucb`` (the build's),
    ``bad.raucb`` (its root file system with a gatewayd that exits 1 at once, made with
    debugfs, no mount, and signed with the same development key) and, with ``foreign``,
    ``foreign.raucb`` (well formed, signed by another fleet's key)."""
    subprocess.run(["cp", str(built.bundle), str(root / "good.raucb")], check=True)
    dev = image_keys.resolve(None, None, None, release=False, cache=built.cache)
    bad = root / "bad-rootfs.ext4"
    subprocess.run(["cp", "--sparse=always", str(built.slot), str(bad)], check=True)
    script = root / "gatewayd-broken"
    script.write_text("#!/bin/sh\necho 'gatewayd: broken on purpose' >&2\nexit 1\n")
    cmds = ("rm /opt/gateway/bin/gatewayd\n"
            f"write {script} /opt/gateway/bin/gatewayd\n"
            "sif /opt/gateway/bin/gatewayd mode 0100755\n")
    subprocess.run(["debugfs", "-w", "-f", "-", str(bad)], input=cmds, text=True,
                   check=True, capture_output=True)
    make_bundle(bad, root / "bad.raucb", version="broken", arch=arch, keys=dev)
    bad.unlink()
    if foreign:
        keys = image_keys.make_ca_and_signer(root / "foreign-keys", "Foreign")
        tiny = root / "tiny.ext4"  # content never read: the signature check comes first
        tiny.write_bytes(os.urandom(256 * 1024))
        make_bundle(tiny, root / "foreign.raucb", version="evil", arch=arch, keys=keys)
    return BundleServer(root)


@pytest.fixture(scope="module")
def bundles(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BundleServer]:
    server = serve_bundles(built, tmp_path_factory.mktemp("bundles"), "amd64")
    yield server
    server.httpd.shutdown()


def test_foreign_key_bundle_is_refused(unit: Vm, bundles: BundleServer) -> None:
    path = bundles.fetch(unit, "foreign.raucb")
    r = unit.ssh(f"rauc install {path}", check=False, timeout=600)
    assert r.returncode != 0, r.stdout
    assert "signature" in (r.stdout + r.stderr).lower() or \
        "verif" in (r.stdout + r.stderr).lower(), r.stdout + r.stderr
    unit.ssh(f"rm -f {path}")
    assert "rauc.slot=A" in unit.ssh("cat /proc/cmdline").stdout


def check_rollback(unit: Vm, bundles: BundleServer, *, fail_timeout: float = 600,
                   good_timeout: float = 900, install_timeout: float = 900) -> float:
    """Install ``bad.raucb`` on a unit running A with /data/marker "kept", reboot, and
    touch nothing: B fails its health check BOOT_TRIES (2) times, then A boots good, with
    B's entry at 0 tries left and /data untouched. Returns the seconds from the reboot to
    A's good boot."""
    path = bundles.fetch(unit, "bad.raucb")
    r = unit.ssh(f"rauc install {path}", timeout=install_timeout)
    assert "succeeded" in (r.stdout + r.stderr).lower() or r.returncode == 0
    unit.ssh(f"rm -f {path}")
    entries = unit.ssh("ls /efi/loader/entries").stdout.split()
    assert "slot-b+2.conf" in entries, entries
    unit.mark()
    t0 = time.monotonic()
    unit.ssh("systemctl reboot", check=False, timeout=30)
    # Nobody touches the unit: B fails its health check twice, then A boots.
    unit.wait_for(r"gateway-health: FAILED", timeout=fail_timeout)
    unit.wait_for(re.escape(GOOD), timeout=good_timeout)
    took = time.monotonic() - t0
    unit.wait_ssh()
    console = unit.console()
    print(f"\nrollback ({unit.arch}): {console.count('gateway-health: FAILED')} failed boots "
          f"of B, back on A and good after {took:.0f} s")
    assert console.count("gateway-health: FAILED") == 2
    assert "rauc.slot=A" in unit.ssh("cat /proc/cmdline").stdout
    entries = unit.ssh("ls /efi/loader/entries").stdout.split()
    assert "slot-b+0-2.conf" in entries and "slot-a.conf" in entries, entries
    assert unit.ssh("cat /data/marker").stdout.strip() == "kept"
    return took


def test_broken_update_rolls_back_by_boot_counting(unit: Vm, bundles: BundleServer) -> None:
    check_rollback(unit, bundles)


def check_update(unit: Vm, bundles: BundleServer, *, boot_timeout: float | None = None,
                 install_timeout: float = 900) -> float:
    """Install ``good.raucb`` on a unit running A (with /data/marker "kept" and a retained
    "eco" on config/mode), reboot into B: B is blessed (no counter left), RAUC reports B
    booted, /data and the retained message are kept. Returns the reboot's seconds."""
    path = bundles.fetch(unit, "good.raucb")
    unit.ssh(f"rauc install {path}", timeout=install_timeout)
    unit.ssh(f"rm -f {path}")
    took = unit.reboot() if boot_timeout is None else unit.reboot(boot_timeout)
    print(f"\nupdate reboot into B to READY ({unit.arch}): {took:.0f} s")
    assert "rauc.slot=B" in unit.ssh("cat /proc/cmdline").stdout
    assert "(slot B)" in unit.ssh("/opt/gateway/bin/gatewayctl status").stdout
    # Blessed: the counter is gone once the health check passed.
    entries = unit.ssh("ls /efi/loader/entries").stdout.split()
    assert "slot-b.conf" in entries, entries
    assert unit.ssh("cat /data/marker").stdout.strip() == "kept"
    got = receive(unit, f"reader-{unit.arch}-b", "config/mode", clean=True, timeout=120)
    assert got[0].payload == b"eco"
    booted = unit.ssh("rauc status --output-format=shell").stdout
    assert re.search(r"RAUC_SYSTEM_BOOTED_BOOTNAME='?B'?$", booted, re.M), booted
    return took


def test_update_a_to_b_keeps_data(unit: Vm, bundles: BundleServer) -> None:
    check_update(unit, bundles)
