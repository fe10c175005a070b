"""A corrupted gateway.db, with a real gatewayd: bytes overwritten in the header, in a
b-tree page, in the WAL (what a power cut or a worn card does), and while running. The
broker must start (no restart loop), salvage, and say so in an alarm; what survived at
each offset is reported (``pytest -s``). Also ``gatewayctl store check|salvage``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fsfaults import corrupt
from tests.gateway.admin.gatewayd import Client, Gatewayd, clean_environ
from tests.gateway.store.test_storage_faults import Publisher, drain_keeper, keeper_session, poll

pytestmark = [pytest.mark.slow, pytest.mark.storage]

# the watermark at 100%: a host disk that is nearly full would raise high_disk_usage,
# and the guard would then truncate the WAL every check, leaving no frame to damage
ENV = {"GATEWAY_DURABILITY__CHECK_INTERVAL": "200ms",
       "GATEWAY_DURABILITY__DISK_HIGH_WATERMARK": "1"}
RETAINED = 60
QUEUED = 40


def ctl(gw: Gatewayd, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.gatewayctl", *args],
        env={**clean_environ(), **gw.env}, capture_output=True, text=True, timeout=60,
        input=stdin,
    )


def populate(gw: Gatewayd) -> set[str]:
    """Users, a ban, RETAINED retained messages, and an offline persistent session with
    QUEUED messages queued; returns the queued topics."""
    assert ctl(gw, "users", "add", "alice", "--password-stdin", stdin="secret\n").returncode == 0
    assert ctl(gw, "ban", "add", "clientid", "evil").returncode == 0
    keeper_session(gw, 5)
    pub = Publisher(gw, "filler", 5)
    mids = [pub.publish(f"r/{i}", os.urandom(1500), retain=True) for i in range(RETAINED)]
    pub.wait_answers(mids)
    queued = [pub.publish(f"t/{i}", os.urandom(800)) for i in range(QUEUED)]
    pub.wait_answers(queued)
    pub.close()
    return {f"t/{i}" for i in range(QUEUED)}


def survivors(gw: Gatewayd, queued: set[str]) -> dict[str, Any]:
    """What the restarted node still has: retained count, users, bans, the keeper's
    queued messages."""
    retained = gw.get("/api/v5/retainer/messages", limit=1000)["meta"].get("count")
    users = ctl(gw, "users", "list")
    bans = ctl(gw, "ban", "list")
    got = drain_keeper(gw, 5, queued)
    return {
        "retained": retained,
        "user_alice": "alice" in users.stdout,
        "ban_evil": "evil" in bans.stdout,
        "queued_delivered": len(got & queued),
    }


def page_of(db: Path, table: str, leaf: bool) -> tuple[int, int]:
    """(page number, page size) of the root page of ``table`` (leaf=False) or of one of
    its leaf pages in the middle (leaf=True)."""
    conn = sqlite3.connect(db)
    try:
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        if not leaf:
            root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name=?",
                                (table,)).fetchone()[0]
            return root, size
        pages = [r[0] for r in conn.execute(
            "SELECT pageno FROM dbstat WHERE name=? AND pagetype='leaf' ORDER BY pageno",
            (table,))]
        return pages[len(pages) // 2], size
    finally:
        conn.close()


CASES = {
    # name: (where, what is overwritten)
    "header": "the first 100 bytes (the file header: 'not a database')",
    "btree_root_retained": "the root page of table retained",
    "btree_leaf_queue": "a leaf page in the middle of table queue (bodies inline)",
    "wal_frame": "bytes inside the middle frame of the WAL (gatewayd killed with -9, WAL "
                 "not checkpointed)",
}


@pytest.mark.parametrize("case", list(CASES))
def test_corruption_at_offset_starts_salvages_alarms(tmp_path: Path, case: str) -> None:
    work = tmp_path / "gw"
    gw = Gatewayd(work, extra_env=ENV).start()
    try:
        queued = populate(gw)
        db = gw.data_dir / "gateway.db"
        assert gw.proc is not None
        if case == "wal_frame":
            # commits after the WAL's last checkpoint stay in it: a few more, then kill -9
            more = Publisher(gw, "late", 5)
            late = [more.publish(f"t/late{i}", b"x" * 200) for i in range(10)]
            more.wait_answers(late)
            more.close()
            gw.proc.kill()
            gw.proc.wait()
            wal = Path(f"{db}-wal")
            frames = (wal.stat().st_size - 32) // (24 + 4096)
            assert frames > 3, "no WAL frames to damage"
            corrupt(wal, 32 + (frames // 2) * (24 + 4096) + 24 + 100, 64)  # a middle frame
        else:
            gw.stop()
            if case == "header":
                corrupt(db, 0, 100)
            else:
                table, leaf = {"btree_root_retained": ("retained", False),
                               "btree_leaf_queue": ("queue", True)}[case]
                page, size = page_of(db, table, leaf)
                corrupt(db, (page - 1) * size + 8, 512)
        t0 = time.monotonic()
        gw.start()  # must come up: no traceback, no restart loop
        started_in = time.monotonic() - t0
        names = {a["name"]: a for a in gw.get("/api/v5/alarms")["data"]}
        expected_alarm = "store_wal_damaged" if case == "wal_frame" else "store_salvaged"
        assert expected_alarm in names, names
        alarm = names[expected_alarm]
        if case != "wal_frame":
            moved = [p for p in gw.data_dir.glob("gateway.db.corrupt-*")
                     if not p.name.endswith(("-wal", "-shm"))]
            assert moved, "the malformed file was not kept"
            st = gw.get("/api/v5/status")["store"]
            assert st["salvaged"] and st["salvaged"][0]["moved_to"] == str(moved[0])
            survived = alarm["details"]["survived"]
            method = alarm["details"]["method"]
        else:
            assert list(gw.data_dir.glob("gateway.db-wal.corrupt-*"))
            survived = {"lost_commits": alarm["details"]["later_commits"]}
            method = "wal check"
        after = survivors(gw, queued)
        # the broker works: a QoS 1 publish is acknowledged and stored
        p = Publisher(gw, "after", 5)
        mid = p.publish("t/after", b"ok")
        p.wait_answers([mid])
        assert p.answers[mid] < 0x80
        p.close()
        print(f"\n[storage] corruption {case}: " + json.dumps({
            "where": CASES[case], "method": method, "salvaged_rows": survived,
            "after_restart": after, "started_in_s": round(started_in, 2),
            "errors": alarm["details"].get("errors")}))
        if case in ("btree_root_retained", "header"):
            # the other tables are untouched (header: rebuilt, everything readable)
            assert after["user_alice"] and after["ban_evil"], after
            assert after["queued_delivered"] == QUEUED, after
    finally:
        gw.stop()


def test_corruption_while_running_is_salvaged_without_restart(tmp_path: Path) -> None:
    """A page of gateway.db goes bad under a running gatewayd: the next commit that
    touches it fails with SQLITE_CORRUPT, the node moves the file aside, salvages it
    and goes on writing to the fresh one, with no restart (same pid)."""
    # a 1% watermark: high_disk_usage is up, so the guard truncates the WAL on every
    # check (200 ms): the pages are in the main file, where the damage is made
    env = {**ENV, "GATEWAY_DURABILITY__DISK_HIGH_WATERMARK": "0.01"}
    gw = Gatewayd(tmp_path / "gw", extra_env=env).start()
    try:
        populate(gw)
        assert gw.proc is not None
        pid = gw.proc.pid
        db = gw.data_dir / "gateway.db"
        poll("an empty WAL", lambda: Path(f"{db}-wal").stat().st_size == 0)
        page, size = page_of(db, "retained", False)
        corrupt(db, (page - 1) * size + 8, 512)
        # another connection commits (a ban): the writer's page cache is dropped
        assert ctl(gw, "ban", "add", "clientid", "evil2").returncode == 0
        c = Client(gw, "writer", version=5)
        c.c.publish("r/new", b"x" * 100, qos=1, retain=True)
        alarm = poll("store_salvaged", lambda: {
            a["name"]: a for a in gw.get("/api/v5/alarms")["data"]}.get("store_salvaged"))
        assert gw.proc.poll() is None and gw.proc.pid == pid
        assert list(gw.data_dir.glob("gateway.db.corrupt-*"))
        poll("the store writable again", lambda: gw.get("/api/v5/status")["store"]["writable"])
        p = Publisher(gw, "after", 5)
        mid = p.publish("t/after", b"ok")
        p.wait_answers([mid])
        assert p.answers[mid] < 0x80
        p.close()
        print("\n[storage] corruption while running: " + json.dumps(
            {"survived": alarm["details"]["survived"], "method": alarm["details"]["method"]}))
    finally:
        gw.stop()


def test_gatewayctl_store_check_and_salvage(tmp_path: Path) -> None:
    """On a stopped node: check says ok (0), then malformed (1) after a page is
    overwritten; salvage moves it aside and reports; check is ok again; a missing data
    directory is one line and exit 2; a running node's file is refused (2)."""
    gw = Gatewayd(tmp_path / "gw").start()
    try:
        populate(gw)
        running = ctl(gw, "store", "check")
        assert running.returncode == 2 and "stop it first" in running.stderr, running
    finally:
        gw.stop()
    ok = ctl(gw, "store", "check")
    assert ok.returncode == 0 and ": ok" in ok.stdout, ok
    db = gw.data_dir / "gateway.db"
    page, size = page_of(db, "retained", False)
    corrupt(db, (page - 1) * size + 8, 512)
    bad = ctl(gw, "store", "check")
    assert bad.returncode == 1 and "malformed" in bad.stdout, bad
    fixed = ctl(gw, "store", "salvage", "--json")
    assert fixed.returncode == 0, fixed
    report = json.loads(fixed.stdout)[0]
    assert report["survived"]["users"] >= 1 and report["survived"]["bans"] >= 1
    assert Path(report["moved_to"]).exists()
    assert ctl(gw, "store", "check").returncode == 0
    missing = subprocess.run(
        [sys.executable, "-m", "gateway.cli.gatewayctl", "store", "--data-dir",
         str(tmp_path / "nope"), "check"], capture_output=True, text=True,
        env=clean_environ(), timeout=60)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing
    assert "no such data directory" in missing.stderr
