"""Storage faults on real file systems of a fixed size, with a real gatewayd and paho
clients: the disk fills under a QoS 1 load, a write error (ext4 errors=remount-ro) hits
under load, the database is corrupted at several offsets (docs/operations.md "Storage
faults").

Mechanisms (tests/fsfaults.py, shared with the HIL rig): a 6 MiB tmpfs mounted as root
for "disk full"; a file-backed ext4 on a loop device with ``errors=remount-ro`` and the
kernel's ``trigger_fs_error`` for the read-only remount (skipped without a loop device).
Waiting is on paho callbacks and bounded polls of the API, never fixed sleeps.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.fsfaults import (
    can_loop,
    can_mount,
    ext4_image,
    fill,
    free_bytes,
    repair_ext4,
    sized_tmpfs,
    trigger_ext4_error,
)
from tests.gateway.admin.gatewayd import Client, Gatewayd, clean_environ

pytestmark = [
    pytest.mark.slow,
    pytest.mark.storage,
    pytest.mark.skipif(not can_mount(), reason="needs root to mount a file system"),
]

MIB = 1024 * 1024
ENV = {
    "GATEWAY_DURABILITY__RESERVE_SIZE": "512KB",
    "GATEWAY_DURABILITY__CHECK_INTERVAL": "200ms",
    "GATEWAY_DURABILITY__DISK_HIGH_WATERMARK": "80%",
}
QUOTA_EXCEEDED = 0x97
WAIT = 30.0


def poll(what: str, fn: Any, timeout: float = WAIT) -> Any:
    """Bounded poll of external state (the API): fn() until truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def alarms(gw: Gatewayd) -> set[str]:
    return {a["name"] for a in gw.get("/api/v5/alarms")["data"]}


def store_status(gw: Gatewayd) -> dict[str, Any]:
    st: dict[str, Any] = gw.get("/api/v5/status")["store"]
    return st


class Publisher:
    """A paho client that records the answer to every QoS 1 publish (reason code value,
    or absent while unanswered) and counts the disconnects it suffered."""

    def __init__(self, gw: Gatewayd, cid: str, version: int) -> None:
        self.v5 = version == 5
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid,
                             protocol=mqtt.MQTTv5 if self.v5 else mqtt.MQTTv311)
        self.c.max_inflight_messages_set(20)
        self.c.reconnect_delay_set(0.1, 0.5)
        self.answers: dict[int, int] = {}
        self.answered_at: dict[int, float] = {}  # monotonic time of each answer
        self.topic_of: dict[int, str] = {}
        self.disconnects = 0
        self.answered = threading.Condition()
        self.connected = threading.Event()
        self.c.on_publish = self._on_publish
        self.c.on_connect = lambda c, u, f, rc, p: self.connected.set()
        self.c.on_disconnect = self._on_disconnect
        self.c.connect("127.0.0.1", gw.mqtt_port, keepalive=30)
        self.c.loop_start()
        assert self.connected.wait(WAIT)

    def _on_publish(self, c: Any, u: Any, mid: int, rc: Any, props: Any) -> None:
        with self.answered:
            self.answers[mid] = rc.value
            self.answered_at[mid] = time.monotonic()
            self.answered.notify_all()

    def _on_disconnect(self, c: Any, u: Any, flags: Any, rc: Any, props: Any) -> None:
        self.disconnects += 1

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> int:
        info = self.c.publish(topic, payload, qos=1, retain=retain)
        self.topic_of[info.mid] = topic
        return info.mid

    def wait_answers(self, mids: list[int], timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        with self.answered:
            while not all(m in self.answers for m in mids):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [m for m in mids if m not in self.answers]
                    raise AssertionError(f"{len(missing)} publishes never answered")
                self.answered.wait(left)

    def acked_topics(self) -> set[str]:
        return {self.topic_of[m] for m, rc in self.answers.items() if rc < 0x80}

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def keeper_session(gw: Gatewayd, version: int) -> None:
    """A persistent session subscribed to t/# at QoS 1, then offline: every acknowledged
    publish to t/... must be kept for it, on disk."""
    k = Client(gw, "keeper", version=version, clean=False, session_expiry=3600)
    k.subscribe("t/#", qos=1)
    k.c.disconnect()
    k.c.loop_stop()


def drain_keeper(gw: Gatewayd, version: int, expected: set[str], idle: float = 5.0) -> set[str]:
    """Resume the keeper's session and collect its messages until ``expected`` is in
    (or none came for ``idle`` seconds: the rest is not coming)."""
    k = Client(gw, "keeper", version=version, clean=False, session_expiry=3600)
    got: set[str] = set()
    deadline = time.monotonic() + WAIT
    while not expected <= got and time.monotonic() < deadline:
        try:
            wait = min(idle, max(0.1, deadline - time.monotonic()))
            got.add(k.next_message(timeout=wait).topic)
        except queue.Empty:
            print(f"drain: nothing for {wait:.1f} s after {len(got)} messages")
            break
    k.c.disconnect()
    k.c.loop_stop()
    return got


def assert_none_lost(gw: Gatewayd, pub: Publisher, expected: set[str], got: set[str],
                     t0: float, since: str) -> None:
    """Every acknowledged topic was delivered; else name when each lost one was
    acknowledged (seconds after ``t0``, the monotonic time of ``since``) and show the
    node's log."""
    if expected <= got:
        return
    lost = {m: round(pub.answered_at[m] - t0, 3) for m in pub.answers
            if pub.topic_of[m] in expected - got}
    raise AssertionError(
        f"lost {len(lost)} of {len(expected)} acknowledged messages; seconds from {since}"
        f" to each one's PUBACK: {lost}; node log:\n{gw.log()[-4000:]}")


def sys_alarm(watcher: Client, name: str) -> bool:
    """The $SYS alarms/activate message for ``name`` arrived."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        m = watcher.next_message(timeout=max(0.1, deadline - time.monotonic()))
        if m.topic.endswith("/alarms/activate") and json.loads(m.payload)["name"] == name:
            return True
    return False


def connack_code(gw: Gatewayd, cid: str, *, persistent: bool) -> int:
    """The CONNACK reason code a new MQTT 5 client gets."""
    codes: list[int] = []
    done = threading.Event()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv5)

    def on_connect(c: Any, u: Any, f: Any, rc: Any, p: Any) -> None:
        codes.append(rc.value)
        done.set()

    c.on_connect = on_connect
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600 if persistent else 0
    c.connect("127.0.0.1", gw.mqtt_port, clean_start=True, properties=props)
    c.loop_start()
    try:
        assert done.wait(WAIT), f"{cid}: no CONNACK"
    finally:
        c.disconnect()
        c.loop_stop()
    return codes[0]


def connack_code_v311(gw: Gatewayd, cid: str, *, clean: bool) -> int:
    """The CONNACK return code a new MQTT 3.1.1 client gets."""
    codes: list[int] = []
    done = threading.Event()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv311,
                    clean_session=clean)

    def on_connect(c: Any, u: Any, f: Any, rc: Any, p: Any) -> None:
        codes.append(rc.value)
        done.set()

    c.on_connect = on_connect
    c.connect("127.0.0.1", gw.mqtt_port)
    c.loop_start()
    try:
        assert done.wait(WAIT), f"{cid}: no CONNACK"
    finally:
        c.disconnect()
        c.loop_stop()
    return codes[0]


def gatewayctl(gw: Gatewayd, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.gatewayctl", *args],
        env={**clean_environ(), **gw.env}, capture_output=True, text=True, timeout=60,
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "gw"


def space_report(gw: Gatewayd) -> str:
    """Where the space went, for a failure message: the data directory's files, the
    store's status and the node's log."""
    files = sorted(
        (str(p.relative_to(gw.data_dir)), p.stat().st_size)
        for p in gw.data_dir.rglob("*") if p.is_file()
    )
    try:
        store: Any = store_status(gw)
    except OSError as exc:
        store = f"not reachable ({exc})"
    lines = [ln for ln in gw.log().splitlines() if "refused: the store" not in ln]
    return (f"free {free_bytes(gw.data_dir)} B; files {files}; store {store}; log (without"
            " the refused publishes):\n" + "\n".join(lines[-60:]))


def report(name: str, **figures: Any) -> None:
    """Figures for the report (printed; run pytest -s to see them)."""
    print(f"\n[storage] {name}: " + json.dumps(figures))


def test_disk_full_v5_refuses_at_once_keeps_serving_and_recovers(workdir: Path) -> None:
    """The database alone fills a 6 MiB file system under 32 KiB QoS 1 publishes:
    every publish is answered (0x00 or 0x97, none hangs), new clean sessions connect, a
    new persistent session gets 0x97, disk_full is raised (API, Prometheus, gatewayctl,
    $SYS); after kill -9 and a restart every acknowledged message is still there, and
    draining it gives the space back: the alarm clears and QoS 1 is accepted again."""
    with sized_tmpfs(workdir / "data", 6 * MIB):
        gw = Gatewayd(workdir, extra_env=ENV).start()
        try:
            keeper_session(gw, 5)
            watcher = Client(gw, "watcher", version=5).subscribe("$SYS/brokers/+/alarms/#")
            pub = Publisher(gw, "pub", 5)
            # rounds of 20 until a whole round is refused: the disk is then as full as
            # the node lets it get (it accepts again whenever a checkpoint gave room)
            t0 = time.monotonic()
            mids: list[int] = []
            for r in range(30):
                batch = [pub.publish(f"t/{r * 20 + i}", os.urandom(32 * 1024))
                         for i in range(20)]
                pub.wait_answers(batch)
                mids += batch
                if all(pub.answers[m] == QUOTA_EXCEEDED for m in batch):
                    break
            answered_in = time.monotonic() - t0
            codes = [pub.answers[m] for m in mids]
            acked = sum(1 for c in codes if c < 0x80)
            refused = sum(1 for c in codes if c == QUOTA_EXCEEDED)
            assert acked + refused == len(mids), sorted(set(codes))
            assert acked > 20 and refused > 0
            # a checkpoint may give some room back at any time (and the node accepts
            # again): a small file takes the rest, so the checks below see a full disk
            fill(workdir / "data" / "filler", leave=200 * 1024)
            poll("disk_full", lambda: "disk_full" in alarms(gw))
            assert store_status(gw)["refusing"] == "disk full"
            _, _, metrics = gw.http("GET", "/api/v5/prometheus/stats", auth=False)
            assert b'gateway_alarm{name="disk_full"} 1.0' in metrics
            assert b"gateway_store_refusing 1.0" in metrics
            ctl = gatewayctl(gw, "alarms")
            assert ctl.returncode == 0 and "disk_full" in ctl.stdout, ctl
            ctl = gatewayctl(gw, "status")
            assert "REFUSING (disk full)" in ctl.stdout, ctl.stdout
            assert sys_alarm(watcher, "disk_full")
            # the broker keeps serving: clean sessions connect, a new persistent one is
            # refused with 0x97, QoS 0 flows
            assert connack_code(gw, "fresh-clean", persistent=False) == 0
            assert connack_code(gw, "fresh-persistent", persistent=True) == QUOTA_EXCEEDED
            assert connack_code_v311(gw, "fresh-311", clean=True) == 0
            # 3.1.1 has no 0x97: a new persistent session gets 3 (server unavailable);
            # paho reports CONNACK return codes as the matching MQTT 5 reason codes
            assert connack_code_v311(gw, "fresh-311-persistent", clean=False) != 0
            pub.close()
            # nothing acknowledged is lost: kill -9, restart on the full disk, drain
            assert gw.proc is not None
            gw.proc.kill()
            gw.proc.wait()
            try:
                gw.start()
            except RuntimeError as exc:
                raise AssertionError(f"restart on the full disk failed; {space_report(gw)}"
                                     ) from exc
            expected = pub.acked_topics()
            got = drain_keeper(gw, 5, expected)
            assert_none_lost(gw, pub, expected, got, t0, "the first publish")
            drained = time.monotonic()
            try:
                poll("disk_full to clear", lambda: "disk_full" not in alarms(gw))
            except AssertionError as exc:
                raise AssertionError(f"{exc}; {space_report(gw)}") from None
            again = Publisher(gw, "pub2", 5)
            mid = again.publish("t/again", b"x" * 1024)
            again.wait_answers([mid])
            recovered_in = time.monotonic() - drained
            assert again.answers[mid] == 0
            again.close()
            report("disk_full_v5", publishes=len(mids), acked=acked, refused_0x97=refused,
                   answered_in_s=round(answered_in, 2), acked_after_kill9=len(got & expected),
                   recovered_in_s=round(recovered_in, 2), store=store_status(gw))
        finally:
            gw.stop()


def test_enospc_v311_releases_reserve_disconnects_then_everything_acked(workdir: Path) -> None:
    """Another file fills the disk to 0 bytes free while an MQTT 3.1.1 client publishes:
    the commit that meets ENOSPC gets the reserve and succeeds, the node refuses from then
    on (3.1.1: the connection is closed without PUBACK, paho re-sends after reconnecting);
    once the file is deleted the reserve is made again and every publish ends up
    acknowledged, and delivered to the offline persistent session.

    Made deterministic: gatewayd is stopped (SIGSTOP) while the disk fills and the next
    publish is sent, so no commit or check of its own sees the disk filling; that publish
    (300 KiB) is larger than the room the journal log keeps ahead in its file (under
    128 KiB after a growth, or a recycled file of under 256 KiB here), so its commit must
    grow the file and meets ENOSPC. (Without it, a small commit that fits in that room
    succeeded, measured the full disk and refused at once: no commit ever met ENOSPC and
    the reserve was not needed, 1 CI run in about 20.)"""
    n = 60
    # no periodic check: its first run after SIGCONT could come before the publish's commit
    env = {**ENV, "GATEWAY_DURABILITY__CHECK_INTERVAL": "60s"}
    with sized_tmpfs(workdir / "data", 6 * MIB):
        gw = Gatewayd(workdir, extra_env=env).start()
        try:
            keeper_session(gw, 4)
            pub = Publisher(gw, "pub311", 4)
            first = [pub.publish(f"t/{i}", os.urandom(16 * 1024)) for i in range(10)]
            pub.wait_answers(first)
            assert gw.proc is not None
            os.kill(gw.proc.pid, signal.SIGSTOP)
            try:
                filler = fill(workdir / "data" / "filler", leave=0)
                assert free_bytes(workdir / "data") == 0
                big = pub.publish("t/big", os.urandom(300 * 1024))
            finally:
                os.kill(gw.proc.pid, signal.SIGCONT)
            pub.wait_answers([big])
            assert pub.answers[big] == 0
            assert "reserve released" in gw.log()
            rest = [pub.publish(f"t/{i}", os.urandom(16 * 1024)) for i in range(10, n)]
            poll("disk_full", lambda: "disk_full" in alarms(gw))
            st = store_status(gw)
            assert st["refusing"] == "disk full"
            poll("a disconnect without PUBACK", lambda: pub.disconnects > 0)
            unanswered_while_full = sum(1 for m in rest if m not in pub.answers)
            assert unanswered_while_full > 0
            assert connack_code(gw, "fresh", persistent=False) == 0
            freed = time.monotonic()
            filler.unlink()
            pub.wait_answers(first + rest, timeout=60)
            recovered_in = time.monotonic() - freed
            assert all(pub.answers[m] == 0 for m in [*first, big, *rest])
            poll("disk_full to clear", lambda: "disk_full" not in alarms(gw))
            poll("the reserve made again", lambda: store_status(gw)["reserve_held"])
            pub.close()
            got = drain_keeper(gw, 4, pub.acked_topics())
            assert pub.acked_topics() <= got
            report("enospc_v311", publishes=n, disconnects=pub.disconnects,
                   unanswered_while_full=unanswered_while_full,
                   all_acked_after_freeing_s=round(recovered_in, 2), delivered=len(got))
        finally:
            gw.stop()


@pytest.mark.skipif(not can_loop(), reason="needs a loop device for a file-backed ext4")
def test_ext4_remount_read_only_under_load(workdir: Path, tmp_path: Path) -> None:
    """ext4 (errors=remount-ro) records an error under a QoS 1 load and goes read-only
    with the database open: store_write_error is raised, publishes are answered 0x97 at
    once, clean clients connect; gatewayd stops cleanly; after e2fsck and a new mount
    every acknowledged message is still there."""
    image = tmp_path / "ext4.img"
    with ext4_image(image, workdir / "data", 32 * MIB):
        gw = Gatewayd(workdir, extra_env=ENV).start()
        try:
            keeper_session(gw, 5)
            pub = Publisher(gw, "pub", 5)
            before = [pub.publish(f"t/{i}", os.urandom(4096)) for i in range(50)]
            pub.wait_answers(before)
            stop = threading.Event()
            during: list[int] = []

            def load() -> None:
                i = 50
                while not stop.is_set() and i < 5000:
                    during.append(pub.publish(f"t/{i}", os.urandom(4096)))
                    i += 1
                    time.sleep(0.002)  # a steady load, not a wait for an event

            loader = threading.Thread(target=load)
            loader.start()
            poll("some publishes during the load", lambda: len(pub.answers) > 80)
            trigger_ext4_error(workdir / "data")
            t0 = time.monotonic()
            poll("store_write_error", lambda: "store_write_error" in alarms(gw))
            detected_in = time.monotonic() - t0
            poll("a 0x97 refusal", lambda: QUOTA_EXCEEDED in pub.answers.values())
            stop.set()
            loader.join()
            pub.wait_answers(during)
            codes = [pub.answers[m] for m in during]
            assert connack_code(gw, "fresh", persistent=False) == 0
            st = store_status(gw)
            assert st["writable"] is False and st["fault"]["kind"] in ("readonly", "io")
            pub.close()
            gw.stop()
            assert gw.proc is not None and gw.proc.returncode == 0, gw.log()[-3000:]
            repair_ext4(image, workdir / "data")
            gw.start()
            expected = pub.acked_topics()
            got = drain_keeper(gw, 5, expected)
            assert_none_lost(gw, pub, expected, got, t0, "the ext4 error")
            report("ext4_remount_ro", acked=sum(1 for c in codes if c < 0x80),
                   refused_0x97=codes.count(QUOTA_EXCEEDED), detected_in_s=round(detected_in, 2),
                   acked_total=len(expected), delivered_after_fsck=len(got & expected))
        finally:
            gw.stop()


def test_start_on_a_full_disk_serves_and_refuses(workdir: Path) -> None:
    """A node stopped with its main reserve used up, then the disk filled to 0 bytes by
    another file: gatewayd starts anyway (the boot reserve gives SQLite room to open its
    file; without it the start fails with "disk I/O error" and systemd loops), raises
    disk_full, refuses QoS 1 with 0x97, serves clean clients, and accepts again once the
    file is deleted."""
    with sized_tmpfs(workdir / "data", 6 * MIB):
        gw = Gatewayd(workdir, extra_env=ENV).start()
        gw.stop()
        (workdir / "data" / "gateway.reserve").unlink()
        assert (workdir / "data" / "gateway.reserve.boot").exists()
        filler = fill(workdir / "data" / "filler", leave=0)
        assert free_bytes(workdir / "data") < 4096
        try:
            gw.start()
            assert "disk_full" in alarms(gw)
            pub = Publisher(gw, "pub", 5)
            mid = pub.publish("t/1", b"x" * 100)
            pub.wait_answers([mid])
            assert pub.answers[mid] == QUOTA_EXCEEDED
            assert connack_code(gw, "clean", persistent=False) == 0
            filler.unlink()
            poll("disk_full to clear", lambda: "disk_full" not in alarms(gw))
            mid = pub.publish("t/2", b"x" * 100)
            pub.wait_answers([mid])
            assert pub.answers[mid] < 0x80
            pub.close()
        finally:
            gw.stop()
