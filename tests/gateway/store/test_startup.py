"""The start-up check on a nearly full file system (gateway/store/startup.py): it is
skipped, with one WARNING, when checking the file (whose close checkpoints the WAL into
it) could take the room that opening the store needs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.store.startup import CHECK_HEADROOM, room_to_check
from tests.fsfaults import can_mount, fill, sized_tmpfs

pytestmark = [
    pytest.mark.storage,
    pytest.mark.skipif(not can_mount(), reason="needs root to mount a file system"),
]

MIB = 1024 * 1024


def test_the_check_is_skipped_when_the_wal_and_headroom_do_not_fit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with sized_tmpfs(tmp_path / "data", 8 * MIB) as data:
        db = data / "gateway.db"
        db.write_bytes(b"\0" * 4096)
        (data / "gateway.db-wal").write_bytes(b"\0" * MIB)
        assert room_to_check(db)  # ~6.9 MiB free
        filler = fill(data / "filler", leave=MIB + CHECK_HEADROOM // 2)
        with caplog.at_level(logging.WARNING, logger="gateway.store"):
            assert not room_to_check(db)  # 1.5 MiB free < 1 MiB of WAL + headroom
        (line,) = [r.getMessage() for r in caplog.records]
        assert line.startswith(f"store {db} not checked at start: ")
        assert line.endswith("(its 1024 KiB WAL goes into the file when it closes)")
        (data / "gateway.db-wal").unlink()
        assert room_to_check(db)  # no WAL: 1.5 MiB covers the headroom
        filler.unlink()
