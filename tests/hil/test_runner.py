"""hil/runner.py: what the settle phase still waits for."""

from __future__ import annotations

import time
from pathlib import Path

from hil.runner import _Tracking


def test_a_send_in_flight_at_the_stop_is_waited_for_until_its_ack(tmp_path: Path) -> None:
    rec = _Tracking(tmp_path / "records.jsonl")
    old = time.monotonic()
    rec("sent", m="d:1:1", g="d", d="dev-1", q=1, k="tele", p=True)
    since = time.monotonic()
    rec("sent", m="d:1:2", g="d", d="dev-1", q=2, k="tele", p=True)
    acked: set[str] = set()
    # d:1:2 went out after `since` and has no ack yet: still in flight, waited for
    assert rec.unanswered(acked, since) == 1
    # an older unacknowledged send (lost with its connection) is not waited for
    assert rec.unanswered(acked, old - 1) == 2 and rec.unanswered(acked, since) == 1
    acked.add("d:1:2")  # the ack arrives: now it is owed to the collector instead
    assert rec.unanswered(acked, since) == 0
    assert rec.owed(acked, upstream=False) == 1
    rec("recv", m="d:1:2", by="collector", q=2)
    assert rec.owed(acked, upstream=False) == 0
