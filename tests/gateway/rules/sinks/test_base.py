"""gateway.rules.sinks.base.Sink with a scripted server (a real queue in SQLite): order,
partial batches, refusals, a full buffer, and what is on disk after each step."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path

from gateway.config.connectors import RedisConnector
from gateway.rules.sinks.base import Outcome, Refused, Retry, Sink
from gateway.store.queue import QueueDb


class Scripted(Sink[RedisConnector]):
    """Each deliver() pops the next script entry: a list of outcome letters (``o`` ok,
    ``r`` refused, ``x`` retry) applied to the batch, or ``"down"`` to raise."""

    kind = "redis"

    def __init__(self, *a: object, script: list[str], **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.script = script
        self.seen: list[list[bytes]] = []
        self.stored: list[bytes] = []
        self.done = asyncio.Event()

    async def connect(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def ping(self) -> None:
        pass

    async def deliver(self, items: Sequence[bytes]) -> list[Outcome]:
        self.seen.append(list(items))
        step = self.script.pop(0) if self.script else "o" * len(items)
        if not self.script:
            self.done.set()
        if step == "down":
            raise ConnectionError("server went away")
        out: list[Outcome] = []
        for item, letter in zip(items, step.ljust(len(items), "o"), strict=False):
            if letter == "o":
                self.stored.append(item)
                out.append(None)
            elif letter == "r":
                out.append(Refused("refused"))
            else:
                out.append(Retry("not now"))
        return out


def cfg(**buffer: int) -> RedisConnector:
    return RedisConnector.model_validate({
        "server": "127.0.0.1:1", "retry_interval": 0.001, "max_retry_interval": 0.001,
        "health_check_interval": 60, "buffer": {"batch_size": 4, **buffer}})


async def _run(tmp: Path, script: list[str], n: int, **buffer: int
               ) -> tuple[Scripted, list[tuple[bytes]]]:
    db = QueueDb.open(tmp / "rules.db", asyncio.get_running_loop())
    alarms: list[tuple[str, str | None]] = []
    s = Scripted("s", cfg(**buffer), db, alarm=lambda a, m: alarms.append((a, m)),
                 script=script)
    for i in range(n):
        with contextlib.suppress(ValueError):  # a full buffer refuses
            s.put(b"%d" % i)
    await s.start()
    await asyncio.wait_for(s.done.wait(), 10)
    while s.queue.depth:  # the last batch's bookkeeping
        await asyncio.sleep(0.01)
    await s.stop()
    db.close()
    import sqlite3

    rows = sqlite3.connect(tmp / "rules.db").execute("SELECT item FROM durable_queue").fetchall()
    s.alarms = alarms  # type: ignore[attr-defined]
    return s, rows


def test_partial_batches_keep_order_and_refusals_do_not_block(tmp_path: Path) -> None:
    # batch 1: 0 ok, 1 refused, 2 and 3 retry (they go back); then the server is down once;
    # then everything is fine
    s, rows = asyncio.run(_run(tmp_path, ["orxx", "down", "oooo"], 8))
    assert s.seen[0] == [b"0", b"1", b"2", b"3"]
    assert s.seen[1] == [b"2", b"3", b"4", b"5"]  # the retried ones first, in order
    assert s.seen[2] == [b"2", b"3", b"4", b"5"]
    assert s.stored == [b"0", b"2", b"3", b"4", b"5", b"6", b"7"]
    assert (s.success, s.failed, s.dropped) == (7, 1, 0)
    assert rows == []  # every item left the disk too


def test_a_full_buffer_refuses_and_alarms_until_half_empty(tmp_path: Path) -> None:
    s, _ = asyncio.run(_run(tmp_path, ["oooo", "oooo"], 20, max_bytes=10))
    assert s.dropped == 10 and s.success == 10  # 10 one-byte items fitted
    alarms = s.alarms  # type: ignore[attr-defined]
    assert alarms[0][0] == "sink_buffer_full:redis:s" and alarms[0][1]
    assert alarms[-1] == ("sink_buffer_full:redis:s", None)
