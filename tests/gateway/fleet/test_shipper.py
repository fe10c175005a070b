"""gateway-fleet ship: real rclone against a local path and a real SFTP server
(``rclone serve sftp`` on loopback, a free port, a temp host key)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from gateway.config import load_config
from gateway.fleet import shipper
from tests.gateway.fleet.uplink import Sshd, Uplink
from tests.harness.status import status_view
from tests.harness.wait import until

PW = "S3cr3t-sftp-pw-4711"
SEG = "telemetry/ingest_date=2024-03-01/site=s1/gw=g1"


def write_segment(root: Path, rel: str, size: int, seed: int = 0) -> Path:
    path = root / "raw" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    block = hashlib.sha256(f"{rel}{seed}".encode()).digest()
    path.write_bytes((block * (size // len(block) + 1))[:size])
    return path


def tree(root: Path) -> dict[str, str]:
    """Visible files under ``root`` (hidden folders left out) and their MD5."""
    out = {}
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts):
            out[rel.as_posix()] = hashlib.md5(p.read_bytes()).hexdigest()
    return out


def config_file(tmp: Path, shipper_toml: str) -> Path:
    path = tmp / "gateway.toml"
    path.write_text(
        f'[fleet.archiver]\nenable = true\ndir = "{tmp / "archive"}"\nsite = "s1"\ngw = "g1"\n'
        f"[fleet.shipper]\nenable = true\n{shipper_toml}"
    )
    return path


def ship_cli(cfg: Path, drop_env: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in drop_env}
    return subprocess.run(
        [sys.executable, "-m", "gateway.fleet", "ship", "-c", str(cfg)],
        capture_output=True, text=True, timeout=120, env={**env, "PYTHONPATH": os.getcwd()},
    )


def start_logged(start: Callable[[IO[str]], subprocess.Popen[str]], log: Path, pattern: str,
                 what: str) -> tuple[subprocess.Popen[str], int]:
    """A server started by ``start`` with its output in ``log`` (a pipe nobody reads could
    fill and stall it), and the port ``pattern``'s one group finds in that log."""
    with log.open("w") as out:
        proc = start(out)
    rx = re.compile(pattern)

    def listening() -> re.Match[str] | None:
        assert proc.poll() is None, f"{what} ended: {log.read_text()}"
        return rx.search(log.read_text())

    return proc, int(until(f"{what} to listen", listening).group(1))


def creds_file(tmp: Path, text: str) -> Path:
    """A credentials file as the shipper wants it (0600)."""
    creds = tmp / "creds"
    creds.write_text(text)
    creds.chmod(0o600)
    return creds


class SftpServer:
    """``rclone serve sftp`` with a password; ``port`` read from its own log line. With
    ``uplink`` it runs in that network namespace and listens on its address."""

    def __init__(self, root: Path, keydir: Path, port: int = 0,
                 uplink: Uplink | None = None) -> None:
        keydir.mkdir(exist_ok=True)
        key = keydir / "host_key"
        if not key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                           check=True)
        self.host = uplink.server_ip if uplink else "127.0.0.1"
        cmd = ["rclone", "serve", "sftp", str(root), "--addr", f"{self.host}:{port}", "--key",
               str(key), "--user", "gw", "--pass", PW, "--config", os.devnull]
        self.log = keydir / f"serve-{secrets.token_hex(3)}.log"
        self.proc, self.port = start_logged(
            lambda out: (uplink.popen(cmd, stderr=out) if uplink
                         else subprocess.Popen(cmd, stderr=out, text=True)),
            self.log, rf"listening on {re.escape(self.host)}:(\d+)", "rclone serve sftp")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def sftp(tmp_path: Path) -> Iterator[SftpServer]:
    (tmp_path / "central").mkdir()
    server = SftpServer(tmp_path / "central", tmp_path / "keys")
    yield server
    server.stop()


def sftp_toml(tmp: Path, port: int, extra: str = "", host: str = "127.0.0.1") -> str:
    creds = creds_file(tmp, f"# the SFTP password\npass = {PW}\n")
    return (f'type = "sftp"\nhost = "{host}"\nport = {port}\nuser = "gw"\npath = "fleet/raw"\n'
            f'credentials_file = "{creds}"\nio_timeout = "2s"\n{extra}')


def test_local_path_ships_verifies_deletes_and_rerun_is_a_no_op(tmp_path: Path) -> None:
    arch, central = tmp_path / "archive", tmp_path / "central"
    sent = {}
    for i in range(3):
        p = write_segment(arch, f"{SEG}/g1-{i}.jsonl.gz", 50_000 + i)
        sent[f"{SEG}/g1-{i}.jsonl.gz"] = hashlib.md5(p.read_bytes()).hexdigest()
    open_tmp = write_segment(arch, f"{SEG}/.g1-9.jsonl.gz.tmp", 100)  # being written
    cfg = config_file(tmp_path, f'type = "local"\npath = "{central}"\n')
    done = ship_cli(cfg)
    assert done.returncode == 0, done.stderr
    assert "shipped 3 segments" in done.stdout
    assert tree(central) == sent
    assert open_tmp.exists() and shipper.sealed_segments(arch / "raw") == []
    status = shipper.Status.load(arch / shipper.STATUS_FILE)
    assert status.shipped_segments_total == 3 and status.pending_bytes == 0
    assert status.last_success is not None and status.last_error is None
    again = ship_cli(cfg)
    assert again.returncode == 0 and "shipped 0 segments" in again.stdout
    assert tree(central) == sent


def test_verification_rejects_a_copy_with_other_bytes(tmp_path: Path) -> None:
    """The checker fails on broken input: same size, other content is not verified."""
    arch, central = tmp_path / "archive", tmp_path / "central"
    rel = f"{SEG}/g1-0.jsonl.gz"
    write_segment(arch, rel, 4096)
    config = load_config(config_file(tmp_path, f'type = "local"\npath = "{central}"\n'))
    ship = shipper.Shipper(config.fleet.shipper, arch, site="s1", gw="g1")
    ship._env, ship._secrets = shipper.remote_env(config.fleet.shipper)
    seg = shipper.sealed_segments(arch / "raw")
    sums = {s.rel: shipper.md5_file(arch / "raw" / s.rel) for s in seg}
    damaged = central / rel  # a copy of the same size with other bytes
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(bytes(b ^ 1 for b in (arch / "raw" / rel).read_bytes()))
    assert ship.verified(f"fleet:{central}", seg, sums, unhashed_by="error") == []
    shutil.copy(arch / "raw" / rel, central / rel)
    assert ship.verified(f"fleet:{central}", seg, sums, unhashed_by="error") == seg


def test_spool_policy_deletes_oldest_or_keeps(tmp_path: Path) -> None:
    arch = tmp_path / "archive"
    for i in range(4):
        p = write_segment(arch, f"{SEG}/g1-{i}.jsonl.gz", 512 << 10)
        os.utime(p, (1000 + i, 1000 + i))
    config = load_config(config_file(
        tmp_path, f'type = "local"\npath = "{tmp_path / "c"}"\nspool_max = "1MB"\n'))
    ship = shipper.Shipper(config.fleet.shipper, arch, site="s1", gw="g1")
    kept, dropped = ship.apply_spool_policy(shipper.sealed_segments(arch / "raw"))
    assert [s.rel.rsplit("/", 1)[1] for s in dropped] == ["g1-0.jsonl.gz", "g1-1.jsonl.gz"]
    assert [s.rel for s in kept] == [s.rel for s in shipper.sealed_segments(arch / "raw")]
    keep = config.fleet.shipper.model_copy(update={"when_full": "keep"})
    ship = shipper.Shipper(keep, arch, site="s1", gw="g1")
    write_segment(arch, f"{SEG}/g1-5.jsonl.gz", 1 << 20)
    kept, dropped = ship.apply_spool_policy(shipper.sealed_segments(arch / "raw"))
    assert dropped == [] and len(kept) == 3
    view = shipper.view(config)
    assert view is not None and view["spool_alarm"] and view["pending_segments"] == 3


def test_the_pass_itself_raises_and_clears_the_spool_alarm(tmp_path: Path) -> None:
    """Uplink down (the destination cannot be made) with 900 kB pending of a 1 MB (MiB) spool
    (alarm at 80 %): the failed pass records ``spool_alarm`` in the status file and logs
    ``fleet_spool_high`` once (not again on the next failed pass); the pass that ships
    clears it and says so."""
    arch = tmp_path / "archive"
    for i in range(3):
        write_segment(arch, f"{SEG}/g1-{i}.jsonl.gz", 300_000, seed=i)
    (tmp_path / "afile").write_text("not a folder")
    down = config_file(tmp_path, f'type = "local"\npath = "{tmp_path / "afile" / "c"}"\n'
                                 'spool_max = "1MB"\n')
    first, second = ship_cli(down), ship_cli(down)
    assert first.returncode == second.returncode == 1
    assert "fleet_spool_high: 900,000 bytes pending" in first.stderr
    assert "fleet_spool_high" not in second.stderr
    status = shipper.Status.load(arch / shipper.STATUS_FILE)
    assert status.spool_alarm and status.spool_alarm_since is not None
    up = config_file(tmp_path, f'type = "local"\npath = "{tmp_path / "c"}"\nspool_max = "1MB"\n')
    done = ship_cli(up)
    assert done.returncode == 0 and "fleet_spool_high cleared: 0 bytes pending" in done.stderr
    status = shipper.Status.load(arch / shipper.STATUS_FILE)
    assert not status.spool_alarm and status.spool_alarm_since is None


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('type = "sftp"\npath = "x"\n', 'type = "sftp" needs host'),
        ('type = "local"\n', "fleet.shipper.path is required"),
        ('type = "local"\npath = "x"\noptions = { pass = "x" }\n', "is a secret"),
        ('type = "ftp"\npath = "x"\n', "fleet.shipper.type"),
        ('type = "local"\npath = "x"\nbwlimit = "fast"\n', "fleet.shipper.bwlimit"),
    ],
)
def test_bad_config_is_one_line_exit_2(tmp_path: Path, toml: str, message: str) -> None:
    done = ship_cli(config_file(tmp_path, toml))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_sftp_with_password_never_shows_it(tmp_path: Path, sftp: SftpServer) -> None:
    arch, central = tmp_path / "archive", tmp_path / "central"
    for i in range(2):
        write_segment(arch, f"{SEG}/g1-{i}.jsonl.gz", 20_000)
    expected = {f"fleet/raw/{k}": v for k, v in tree(arch / "raw").items()}
    cfg = config_file(tmp_path, sftp_toml(tmp_path, sftp.port))
    ok = ship_cli(cfg)
    assert ok.returncode == 0, ok.stderr
    assert tree(central) == expected
    # a wrong password: the pass fails, the error is recorded, no secret anywhere
    write_segment(arch, f"{SEG}/g1-7.jsonl.gz", 1000)
    (tmp_path / "creds").write_text("pass = Wr0ng-Pw-1234\n")
    bad = ship_cli(cfg)
    assert bad.returncode == 1 and "ship failed" in bad.stderr
    status_text = (arch / shipper.STATUS_FILE).read_text()
    assert shipper.Status.load(arch / shipper.STATUS_FILE).consecutive_errors == 1
    for secret in (PW, "Wr0ng-Pw-1234"):
        for text in (ok.stdout, ok.stderr, bad.stdout, bad.stderr, status_text):
            assert secret not in text
    # a world-readable credentials file is refused, in one line
    (tmp_path / "creds").chmod(0o644)
    loose = ship_cli(cfg)
    assert loose.returncode == 1 and "readable by others" in loose.stderr


def test_webdav_against_rclone_serve_webdav(tmp_path: Path) -> None:
    """A real WebDAV server (``rclone serve webdav``, basic auth): it gives no checksum,
    so the shipper downloads each staged copy to hash it before the move."""
    arch, central = tmp_path / "archive", tmp_path / "central"
    central.mkdir()
    for i in range(3):
        write_segment(arch, f"{SEG}/g1-{i}.jsonl.gz", 30_000 + i)
    expected = {f"fleet/raw/{k}": v for k, v in tree(arch / "raw").items()}
    server, port = start_logged(
        lambda out: subprocess.Popen(
            ["rclone", "serve", "webdav", str(central), "--addr", "127.0.0.1:0", "--user", "gw",
             "--pass", PW, "--config", os.devnull], stderr=out, text=True),
        tmp_path / "webdav.log", r"http://127\.0\.0\.1:(\d+)/", "rclone serve webdav")
    try:
        creds = creds_file(tmp_path, f"pass = {PW}\n")
        cfg = config_file(tmp_path, (
            f'type = "webdav"\nurl = "http://127.0.0.1:{port}/"\nuser = "gw"\n'
            f'path = "fleet/raw"\ncredentials_file = "{creds}"\nio_timeout = "10s"\n'))
        done = ship_cli(cfg)
        assert done.returncode == 0, done.stderr
        assert "shipped 3 segments" in done.stdout
        assert tree(central) == expected
        assert shipper.sealed_segments(arch / "raw") == []
        assert PW not in done.stdout + done.stderr + (arch / shipper.STATUS_FILE).read_text()
    finally:
        server.kill()
        server.wait()


def test_s3_against_moto_server(tmp_path: Path) -> None:
    """An S3-compatible HTTP server (moto's ``moto.server``, the S3 API over real
    sockets; MinIO is in neither Debian 12 nor PyPI, and Debian's rclone 1.60 has no
    ``serve s3``). Keys from the credentials file, never shown; the bucket is made by
    rclone; the checksum is the object's MD5 ETag."""
    arch = tmp_path / "archive"
    for i in range(3):
        write_segment(arch, f"{SEG}/g1-{i}.jsonl.gz", 30_000 + i)
    sent = {k: v for k, v in tree(arch / "raw").items()}
    server, port = start_logged(
        lambda out: subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
            stdout=out, stderr=subprocess.STDOUT, text=True),
        tmp_path / "moto.log", r"http://127\.0\.0\.1:(\d+)", "moto.server")
    try:
        secret = "s3-SECRET-key-0815"
        creds = creds_file(
            tmp_path, f"access_key_id = AKIAFLEETTEST\nsecret_access_key = {secret}\n")
        cfg = config_file(tmp_path, (
            f'type = "s3"\nurl = "http://127.0.0.1:{port}"\nregion = "us-east-1"\n'
            f'path = "fleet-bucket/raw"\ncredentials_file = "{creds}"\nio_timeout = "10s"\n'))
        # rclone 1.60's S3 client fails with "unsupported transport" when AWS_CA_BUNDLE
        # is set (some CI images set it); docs/fleet.md says so
        done = ship_cli(cfg, drop_env=("AWS_CA_BUNDLE",))
        assert done.returncode == 0, done.stderr
        assert "shipped 3 segments" in done.stdout
        assert shipper.sealed_segments(arch / "raw") == []
        # what the bucket holds, read back through rclone: the same names and bytes
        env, _ = shipper.remote_env(load_config(cfg).fleet.shipper)
        env.pop("AWS_CA_BUNDLE", None)
        listed = json.loads(subprocess.run(
            ["rclone", "lsjson", "-R", "--files-only", "--hash", "fleet:fleet-bucket/raw"],
            env=env, capture_output=True, text=True, check=True, timeout=60).stdout)
        assert {e["Path"]: e["Hashes"]["md5"] for e in listed} == sent
        assert secret not in done.stdout + done.stderr + (arch / shipper.STATUS_FILE).read_text()
    finally:
        server.kill()
        server.wait()


@pytest.fixture
def uplink() -> Iterator[Uplink]:
    link = Uplink()
    yield link
    link.close()


@pytest.mark.slow
def test_kill_9_and_uplink_cut_during_a_transfer_then_resume(
    tmp_path: Path, uplink: Uplink
) -> None:
    """The central store is Debian's OpenSSH sshd (internal-sftp, key login) in a
    network namespace behind a veth pair. A pass killed with SIGKILL mid-copy, then a
    pass whose link is cut mid-copy (nft drops every packet in the namespace: no RST,
    rclone's I/O timeout fires): nothing final is partial, nothing local is lost, the
    status records the failure, and the next pass after the link is back delivers every
    byte once."""
    arch, central = tmp_path / "archive", tmp_path / "central"
    central.mkdir()
    server = Sshd(central, tmp_path / "ssh", uplink)
    try:
        _kill_and_cut(tmp_path, arch, central, server, uplink)
    finally:
        server.stop()


def _kill_and_cut(tmp_path: Path, arch: Path, central: Path, server: Sshd,
                  uplink: Uplink) -> None:
    for i in range(3):
        write_segment(arch, f"{SEG}/g1-{i}.jsonl.gz", 400_000)
    expected = {f"fleet/raw/{k}": v for k, v in tree(arch / "raw").items()}

    def toml(extra: str = "") -> Path:
        return config_file(tmp_path, (
            f'type = "sftp"\nhost = "{server.host}"\nport = {server.port}\n'
            f'user = "{server.user}"\nkey_file = "{server.client_key}"\npath = "fleet/raw"\n'
            f'io_timeout = "2s"\n{extra}'))

    killed = subprocess.Popen(
        [sys.executable, "-m", "gateway.fleet", "ship", "-c", str(toml('bwlimit = "256KB/s"\n'))],
        env={**os.environ, "PYTHONPATH": os.getcwd()}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    staging = central / "fleet/raw/.incoming/s1/g1" / SEG
    until("the copy to begin", lambda: killed.poll() is not None
          or (staging.is_dir() and any(staging.iterdir())))
    assert killed.poll() is None, "the shipper ended before its copy began"
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    assert tree(central) == {}  # nothing half-copied is visible
    assert len(shipper.sealed_segments(arch / "raw")) == 3
    # the uplink is cut during the next pass
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.fleet", "ship", "-c", str(toml('bwlimit = "512KB/s"\n'))],
        env={**os.environ, "PYTHONPATH": os.getcwd()}, stderr=subprocess.PIPE, text=True,
    )
    def staged() -> int:
        return sum(p.stat().st_size for p in staging.iterdir())

    # the killed pass left partial files in staging: wait for 100 kB *more* (the copy
    # of this pass is under way; 1.2 MB at 512 KB/s leaves it about 2 s to go)
    left = staged()
    until("100 kB of the next pass", lambda: proc.poll() is not None
          or staged() > left + 100_000)
    assert proc.poll() is None, "the pass ended before the uplink was cut"
    uplink.cut()
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        uplink.restore()
    assert proc.returncode == 1 and "ship failed: rclone copy failed" in err, err
    status = shipper.Status.load(arch / shipper.STATUS_FILE)
    assert status.last_error and status.consecutive_errors == 1
    assert status.pending_segments == 3 - status.shipped_segments_total
    done = ship_cli(toml())
    assert done.returncode == 0, done.stderr
    assert tree(central) == expected
    assert shipper.sealed_segments(arch / "raw") == []
    assert shipper.Status.load(arch / shipper.STATUS_FILE).consecutive_errors == 0


def test_gatewayctl_status_shows_the_shipper(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli.ctl import status as status_cmd

    data = status_view(fleet_shipper={
        "destination": "sftp:central:raw", "last_success": None, "pending_segments": 3,
        "pending_bytes": 3 << 20, "spool_alarm": True, "consecutive_errors": 2,
        "last_error": "rclone copy failed"})
    status_cmd.render(data)
    out = capsys.readouterr().out
    assert "Fleet ship" in out and "never shipped" in out and "3 pending (3.0 MiB)" in out
    assert "SPOOL ALARM" in out and "2 failed: rclone copy failed" in out
    data["fleet_shipper"] = None
    status_cmd.render(data)
    assert "Fleet ship" not in capsys.readouterr().out
