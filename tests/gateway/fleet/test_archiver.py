"""The edge archiver on a real Node with a virtual clock, writing real files."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.app import Gateway
from gateway.config import load_config
from gateway.core.clock import VirtualScheduler
from gateway.core.hooks import Priority, Stop
from gateway.core.node import CoreSettings, Node
from gateway.fleet import spool
from gateway.fleet.archiver import Archiver, ArchiverSettings, parse_payload, settings_from_config
from gateway.fleet.records import SCHEMA_VERSION, final_name, segment_name, tmp_name
from protocols.context import ClientInfo, Delivery, Message

# 2023-11-14T22:13:20Z
START = 1_700_000_000.0


class Handle:
    def deliver(self, deliveries: list[Delivery]) -> None:
        pass

    def release(self, packet_id: int) -> None:
        pass

    def kick(self, reason_code: int) -> None:
        pass

    def call_channel(self, fn: Callable[[], Any]) -> None:
        fn()


class HeldSink:
    """Keeps jobs until ``run`` is called (to see what waits for the disk)."""

    def __init__(self) -> None:
        self.jobs: list[Callable[[], None]] = []

    def submit(self, job: Callable[[], None]) -> None:
        self.jobs.append(job)

    def run(self) -> None:
        jobs, self.jobs = self.jobs, []
        for job in jobs:
            job()

    def close(self) -> None:
        self.run()


def make(
    tmp_path: Path, clock: VirtualScheduler | None = None, sink=None, **kw
) -> tuple[Node, Archiver, VirtualScheduler]:
    clock = clock or VirtualScheduler(START)
    node = Node(CoreSettings(), clock)
    settings = ArchiverSettings(root=tmp_path / "archive", site="s1", gw="gw1", **kw)
    archiver = Archiver(settings, clock, sink=sink or spool.InlineSink(), metrics=node.metrics)
    archiver.attach(node.hooks)
    return node, archiver, clock


def connect(node: Node, cid: str) -> tuple[ClientInfo, Handle]:
    info = ClientInfo(client_id=cid, peer_host="10.0.0.7")
    handle = Handle()
    result = node.open_session(
        info,
        handle,
        clean_start=True,
        expiry_interval=0,
        receive_maximum=10,
        will=None,
        will_delay=0,
    )
    assert result.reason_code == 0
    return info, handle


def publish(node: Node, clock: VirtualScheduler, cid: str, topic: str, payload: bytes) -> None:
    info = ClientInfo(client_id=cid)
    node.publish(info, Message(topic, payload, 1, publisher=cid, timestamp=clock.time()))


def segments(root: Path, kind: str = "telemetry") -> list[Path]:
    return sorted((root / "raw" / kind).rglob("*.jsonl.gz"))


def records(root: Path, kind: str = "telemetry") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in segments(root, kind):
        with gzip.open(path, "rt") as f:
            out.extend(json.loads(line) for line in f)
    return out


def test_telemetry_and_events_land_in_sealed_segments(tmp_path):
    node, archiver, clock = make(tmp_path)
    info, handle = connect(node, "dev-1")
    publish(
        node, clock, "dev-1", "sensors/dev-1/env", b'{"temp": 21.5, "hum": 40, "ts": 1699999999}'
    )
    clock.advance(10)
    publish(node, clock, "dev-1", "sensors/dev-1/temp", b"22")
    node.close(info, handle, send_will=False)
    root = archiver.settings.root
    assert segments(root) == []  # still open: nothing visible yet
    archiver.close()

    [path] = segments(root)
    assert path.parent.relative_to(root).as_posix() == (
        "raw/telemetry/ingest_date=2023-11-14/site=s1/gw=gw1"
    )
    first, second = records(root)
    assert first == {
        "v": SCHEMA_VERSION,
        "site": "s1",
        "gw": "gw1",
        "device": "dev-1",
        "seq": 1,
        "ts": 1699999999.0,
        "rx_ts": START,
        "topic": "sensors/dev-1/env",
        "qos": 1,
        "metrics": {"temp": 21.5, "hum": 40.0},
    }
    assert second["seq"] == 2 and second["ts"] == START + 10 == second["rx_ts"]
    assert second["metrics"] == {"temp": 22.0}
    events = records(root, "events")
    assert [(e["event"], e["seq"], e["peer"]) for e in events] == [
        ("connected", 1, "10.0.0.7"),
        ("disconnected", 2, "10.0.0.7"),
    ]
    assert events[1]["ts"] == START + 10
    assert node.metrics.get("fleet.archiver.telemetry") == 2
    assert not list(root.rglob("*.tmp"))


def test_only_matching_topics_and_messages_pass_unchanged(tmp_path):
    node, archiver, clock = make(tmp_path, topics=("sensors/#", "eq meters/+"))
    seen: list[Message] = []

    def spy(message: Message) -> Message:
        seen.append(message)
        return message

    node.hooks.add("message.publish", spy, Priority.LOWEST - 1)
    for topic in ("sensors/a", "other/a", "$SYS/x", "meters/+", "meters/b"):
        publish(node, clock, "dev-1", topic, b"1")
    archiver.close()
    assert [r["topic"] for r in records(archiver.settings.root)] == ["sensors/a", "meters/+"]
    assert [m.topic for m in seen] == ["sensors/a", "other/a", "$SYS/x", "meters/+", "meters/b"]
    assert all(m.payload == b"1" for m in seen)


def test_messages_dropped_by_an_earlier_hook_are_not_archived(tmp_path):
    node, archiver, clock = make(tmp_path)
    node.hooks.add("message.publish", lambda m: Stop(None) if m.topic == "drop" else m)
    publish(node, clock, "dev-1", "keep", b"1")
    publish(node, clock, "dev-1", "drop", b"1")
    archiver.close()
    assert [r["topic"] for r in records(archiver.settings.root)] == ["keep"]


def test_rotation_by_time_size_and_midnight(tmp_path):
    # 23:50 UTC, so the clock crosses midnight during the test.
    clock = VirtualScheduler(1_700_005_800.0)
    node, archiver, _ = make(tmp_path, clock, rotate_interval=60.0, rotate_size=2048)
    root = archiver.settings.root
    publish(node, clock, "d", "t/x", b"1")
    clock.advance(59)
    assert segments(root) == []
    clock.advance(2)  # the segment is 61 s old at the next tick
    assert len(segments(root)) == 1
    for _ in range(30):  # ~120 bytes a line: 2048 bytes fill after ~17 lines
        publish(node, clock, "d", "t/x", b"1")
    assert len(segments(root)) == 2
    clock.advance(600)  # past midnight
    publish(node, clock, "d", "t/x", b"1")
    archiver.close()
    dates = sorted({p.parent.parent.parent.name for p in segments(root)})
    assert dates == ["ingest_date=2023-11-14", "ingest_date=2023-11-15"]
    seqs = [r["seq"] for r in records(root)]
    assert sorted(seqs) == list(range(1, 33))


def test_sequence_numbers_survive_a_restart(tmp_path):
    node, archiver, clock = make(tmp_path)
    publish(node, clock, "a", "t", b"1")
    publish(node, clock, "a", "t", b"1")
    publish(node, clock, "b", "t", b"1")
    archiver.close()
    node, archiver, clock = make(tmp_path)
    publish(node, clock, "a", "t", b"1")
    publish(node, clock, "b", "t", b"1")
    archiver.close()
    got = sorted((r["device"], r["seq"]) for r in records(archiver.settings.root))
    assert got == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2)]


def test_salvage_after_a_crash_keeps_complete_members_and_resumes_counters(tmp_path):
    root = tmp_path / "archive"
    folder = root / "raw/telemetry/ingest_date=2023-11-14/site=s1/gw=gw1"
    name = segment_name("gw1", START, "abcdef", 1)
    tmp = folder / tmp_name(name)
    line = b'{"v":1,"device":"a","seq":%d,"ts":1,"rx_ts":1,"metrics":{}}\n'
    spool.append_member(tmp, line % 7 + line % 8)
    spool.append_member(tmp, line % 9)
    whole = tmp.read_bytes()
    tmp.write_bytes(whole + gzip.compress(line % 10)[:-6])  # a member cut by the crash
    empty = folder / tmp_name(segment_name("gw1", START, "abcdef", 2))
    empty.write_bytes(b"\x1f\x8b")
    node, archiver, clock = make(tmp_path)
    assert not empty.exists()
    sealed = folder / final_name(tmp.name)
    assert sealed.read_bytes() == whole
    with gzip.open(sealed, "rt") as f:
        assert [json.loads(x)["seq"] for x in f] == [7, 8, 9]
    publish(node, clock, "a", "t", b"1")
    archiver.close()
    assert max(r["seq"] for r in records(root) if r.get("topic") == "t") == 10


def test_a_full_disk_queue_drops_and_counts(tmp_path):
    sink = HeldSink()
    node, archiver, clock = make(tmp_path, sink=sink, max_pending=4096, flush_interval=1.0)
    for _ in range(20):
        publish(node, clock, "d", "t/x", b"1")
    clock.advance(1)  # hands the buffer to the (held) sink
    for _ in range(40):
        publish(node, clock, "d", "t/x", b"1")
    dropped = node.metrics.get("fleet.archiver.dropped")
    archived = node.metrics.get("fleet.archiver.telemetry")
    assert dropped > 0 and archived + dropped == 60
    assert archiver.pending_bytes() <= 4096
    archiver.close()
    assert len(records(archiver.settings.root)) == archived


def test_thread_sink_writes_everything_before_close_returns(tmp_path):
    clock = VirtualScheduler(START)
    node, archiver, _ = make(tmp_path, clock, sink=spool.ThreadSink(), rotate_size=4096)
    for i in range(500):
        publish(node, clock, f"d{i % 7}", "t/x", b'{"v": %d}' % i)
    archiver.close()
    got = records(archiver.settings.root)
    assert len(got) == 500
    assert sorted(r["metrics"]["v"] for r in got) == [float(i) for i in range(500)]


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"t": 1, "ok": true, "s": "x", "n": {"a": 2}}', ({"t": 1.0, "n.a": 2.0}, None, None)),
        (b'{"t": 1, "ts": 1700000000123}', ({"t": 1.0}, 1700000000.123, None)),
        (b'{"t": 1, "ts": "yesterday"}', ({"t": 1.0}, None, None)),
        (b"-3.5", ({"temp": -3.5}, None, None)),
        (b"on", ({}, None, "on")),
        (b"\xff\xfe", ({}, None, "\ufffd\ufffd")),
        (b"[1, 2]", ({}, None, "[1, 2]")),
    ],
)
def test_parse_payload(payload, expected):
    assert parse_payload(payload, "s/dev/temp", "ts", 256) == expected


def test_config_section_and_defaults(tmp_path):
    config = load_config(None, {})
    assert config.fleet.archiver.enable is False
    settings = settings_from_config(config)
    assert settings.root == Path("data/archive")
    assert settings.gw == "gateway@127.0.0.1"
    assert settings.topics == ("#",)
    env = {
        "GATEWAY_FLEET__ARCHIVER__ENABLE": "true",
        "GATEWAY_FLEET__ARCHIVER__TOPICS": "sensors/#,meters/+",
        "GATEWAY_FLEET__ARCHIVER__ROTATE_INTERVAL": "10m",
        "GATEWAY_FLEET__ARCHIVER__ROTATE_SIZE": "4MB",
        "GATEWAY_FLEET__ARCHIVER__SITE": "plant-7",
        "GATEWAY_NODE__DATA_DIR": str(tmp_path),
    }
    settings = settings_from_config(load_config(None, env))
    assert settings.root == tmp_path / "archive"
    assert settings.topics == ("sensors/#", "meters/+")
    assert (settings.rotate_interval, settings.rotate_size) == (600.0, 4 << 20)
    assert settings.site == "plant-7"


def test_config_rejects_bad_values():
    from gateway.config import ConfigError

    for key, value in [("SITE", "a/b"), ("TOPICS", "a/#/b"), ("ROTATE_INTERVAL", "0")]:
        with pytest.raises(ConfigError, match=f"fleet.archiver.{key.lower()}"):
            load_config(None, {f"GATEWAY_FLEET__ARCHIVER__{key}": value})


def test_gateway_starts_and_stops_the_archiver(tmp_path):
    config = load_config(
        None,
        {
            "GATEWAY_NODE__DATA_DIR": str(tmp_path),
            "GATEWAY_LISTENERS__TCP__DEFAULT__BIND": "127.0.0.1:0",
            "GATEWAY_DURABILITY__ENABLE": "false",
            "GATEWAY_FLEET__ARCHIVER__ENABLE": "true",
        },
    )

    async def scenario() -> None:
        gateway = Gateway(config)
        await gateway.start()
        assert gateway.node is not None and gateway.archiver is not None
        info, _ = connect(gateway.node, "dev-9")
        gateway.node.publish(info, Message("s/t", b"5", publisher="dev-9", timestamp=START))
        await gateway.stop()
        assert gateway.archiver is None

    asyncio.run(scenario())
    root = tmp_path / "archive"
    assert [r["metrics"] for r in records(root)] == [{"t": 5.0}]
    assert [e["event"] for e in records(root, "events")] == ["connected", "disconnected"]
