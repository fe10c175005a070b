"""The unit's shipper: sealed segments to the central store with rclone, then freed.

``gateway-fleet ship`` (a systemd timer runs it) does one pass:

1. take ``{archive}/.shipper.lock`` (a second pass waits for none: it exits at once);
2. list the sealed segments under ``{archive}/raw`` (hidden temporary ones are left
   alone) and apply the spool policy: past ``spool_max`` bytes, ``delete_oldest`` deletes
   the oldest segments (counted), ``keep`` keeps them all (the store's disk guard takes
   over);
3. segments already verified at their final remote path (a pass cut between the move
   and the local delete) are deleted locally without a transfer;
4. the others are copied to the unit's hidden staging folder
   ``{path}/.incoming/{site}/{gw}/`` (rclone ``--bwlimit``, ``--timeout``; a copy cut by
   the uplink or ``kill -9`` is redone by the next pass, files already staged intact are
   skipped), verified there (size and MD5 or SHA-1, from the backend or by download),
   moved server-side to their final path and checked there again;
5. only then deleted locally; the pass records its outcome in
   ``{archive}/shipper-status.json``, which ``gatewayd`` reads for ``gatewayctl status``,
   the API and Prometheus.

Invariants:

- A local segment is deleted only after a remote copy with the same size and checksum
  was seen at its final path (or by the spool policy, counted as ``dropped``).
- The central job never sees a partial file: copies land in a hidden folder first, and
  the final name appears through a server-side move of a verified file.
- Secrets (``credentials_file``, the environment) reach rclone only through its
  environment, never its command line, the status file or a log line; rclone's error
  text is scrubbed of them before it is recorded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gateway.config import GatewayConfig
from gateway.config.shipper import FleetShipperConfig
from gateway.fleet.archiver import settings_from_config

log = logging.getLogger("gateway.fleet.shipper")

STATUS_FILE = "shipper-status.json"
LOCK_FILE = ".shipper.lock"
REMOTE = "fleet"
_ENV = "RCLONE_CONFIG_FLEET_"
_STAGING = ".incoming"


class ShipError(Exception):
    """A pass that could not finish; the message is one line, free of secrets."""


class Busy(Exception):
    """Another pass holds the lock."""


@dataclass(slots=True)
class Status:
    """What ``shipper-status.json`` holds (all times epoch seconds, None: never)."""

    last_run: float | None = None
    last_success: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    consecutive_errors: int = 0
    errors_total: int = 0
    shipped_segments_total: int = 0
    shipped_bytes_total: int = 0
    dropped_segments_total: int = 0
    dropped_bytes_total: int = 0
    pending_segments: int = 0
    pending_bytes: int = 0
    spool_max: int = 0
    spool_alarm: bool = False  # pending bytes past spool_alarm x spool_max after the pass
    spool_alarm_since: float | None = None
    destination: str = ""

    @classmethod
    def load(cls, path: Path) -> Status:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls()
        known = {k: v for k, v in data.items() if k in cls.__slots__}
        return cls(**known)

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1, sort_keys=True))
        os.replace(tmp, path)


@dataclass(slots=True)
class Segment:
    rel: str  # path under raw/, "/"-separated
    size: int
    mtime: float


@dataclass(slots=True)
class PassResult:
    shipped: list[str] = field(default_factory=list)
    shipped_bytes: int = 0
    dropped: list[str] = field(default_factory=list)
    dropped_bytes: int = 0
    pending_bytes: int = 0


def archive_root(config: GatewayConfig) -> Path:
    return settings_from_config(config).root


def status_path(config: GatewayConfig) -> Path:
    return archive_root(config) / STATUS_FILE


def sealed_segments(raw: Path) -> list[Segment]:
    """Sealed segments under ``raw``, oldest first (by name: the gateway and open time)."""
    found: list[Segment] = []
    if not raw.is_dir():
        return found
    for dirpath, dirnames, filenames in os.walk(raw):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if name.startswith(".") or not name.endswith(".jsonl.gz"):
                continue
            path = Path(dirpath, name)
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            found.append(Segment(path.relative_to(raw).as_posix(), st.st_size, st.st_mtime))
    found.sort(key=lambda s: (s.mtime, s.rel))
    return found


def read_credentials(path: Path) -> dict[str, str]:
    """``name = value`` lines (rclone option names; ``#`` comments). The file must not be
    readable by others. Errors name the line, never its value."""
    try:
        st = path.stat()
        text = path.read_text()
    except OSError as exc:
        raise ShipError(f"credentials_file {path}: {exc.strerror or exc}") from None
    if st.st_mode & stat.S_IROTH:
        raise ShipError(f"credentials_file {path} is readable by others (chmod o-r)")
    creds: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        name = name.strip().lower()
        if not sep or not name.replace("_", "").isalnum():
            raise ShipError(f"credentials_file {path} line {number}: expected name = value")
        creds[name] = value.strip().strip('"')
    return creds


def _obscure(rclone: str, secret: str) -> str:
    """rclone's reversible obscuring, which it requires for ``pass``; via stdin."""
    done = subprocess.run(
        [rclone, "obscure", "-"], input=secret, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ShipError("rclone obscure failed")
    return done.stdout.strip()


def remote_env(cfg: FleetShipperConfig, rclone: str = "rclone") -> tuple[dict[str, str], list[str]]:
    """The environment defining rclone remote ``fleet:``, and the secret values in it
    (for scrubbing). The process environment's ``RCLONE_CONFIG_FLEET_*`` are kept unless
    ``credentials_file`` names the same option."""
    env = dict(os.environ)
    options: dict[str, str] = {"type": cfg.type}
    if cfg.type == "sftp":
        options |= {"host": cfg.host, "port": str(cfg.port)}
        if cfg.user:
            options["user"] = cfg.user
        if cfg.key_file is not None:
            options["key_file"] = str(cfg.key_file)
    elif cfg.type == "webdav":
        options["url"] = cfg.url
        if cfg.user:
            options["user"] = cfg.user
    elif cfg.type == "s3":
        options |= {"provider": cfg.provider, "endpoint": cfg.url}
        if cfg.region:
            options["region"] = cfg.region
    options |= cfg.options
    for name, value in options.items():
        env[_ENV + name.upper()] = value
    secrets = [v for k, v in env.items() if k.startswith(_ENV) and k[len(_ENV):].lower() in
               _SECRETS and v]
    if cfg.credentials_file is not None:
        for name, value in read_credentials(cfg.credentials_file).items():
            secrets.append(value)
            if name == "pass":
                value = _obscure(rclone, value)
                secrets.append(value)
            env[_ENV + name.upper()] = value
    env.setdefault("RCLONE_CONFIG", os.devnull)  # no config file: the remote is all env
    return env, [s for s in secrets if s]


def _secret_names() -> frozenset[str]:
    from gateway.config.shipper import SECRET_OPTIONS

    return SECRET_OPTIONS | {"access_key_id"}


_SECRETS = _secret_names()


def md5_file(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Shipper:
    """One pass at a time over one archive directory (see the module docstring)."""

    def __init__(self, cfg: FleetShipperConfig, root: Path, *, site: str, gw: str,
                 rclone: str = "rclone") -> None:
        self.cfg = cfg
        self.root = root
        self.raw = root / "raw"
        self.site, self.gw = site, gw
        self.rclone = rclone
        self.dest = f"{REMOTE}:{cfg.path.rstrip('/')}" if cfg.path != "/" else f"{REMOTE}:/"
        self.staging = f"{self.dest}/{_STAGING}/{site}/{gw}"
        self._env: dict[str, str] = {}
        self._secrets: list[str] = []

    # -- rclone --------------------------------------------------------------------------

    def _flags(self) -> list[str]:
        t = self.cfg.io_timeout
        flags = ["--timeout", f"{t:g}s", "--contimeout", f"{min(t, 30.0):g}s",
                 "--retries", "1", "--low-level-retries", "2", "--stats", "0",
                 "--ask-password=false"]
        if self.cfg.bwlimit:
            flags += ["--bwlimit", f"{int(self.cfg.bwlimit)}B"]
        return flags

    def _rclone(self, *args: str, files: list[str] | None = None) -> str:
        with contextlib.ExitStack() as stack:
            argv = [self.rclone, *args, *self._flags()]
            if files is not None:
                listing = stack.enter_context(
                    tempfile.NamedTemporaryFile("w", prefix=".ship-", dir=self.root,
                                                suffix=".list"))
                listing.write("".join(f"{f}\n" for f in files))
                listing.flush()
                argv += ["--files-from-raw", listing.name, "--no-traverse"]
            log.debug("running %s", " ".join(argv[:3]))
            done = subprocess.run(argv, env=self._env, capture_output=True, text=True,
                                  check=False)
        if done.returncode != 0:
            lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
            raise ShipError(f"rclone {args[0]} failed (exit {done.returncode}): "
                            f"{self.scrub(lines[-1] if lines else 'no message')}")
        return done.stdout

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def remote_files(self, base: str, files: list[str], *, hashes: bool) -> dict[str, Any]:
        """``{rel: lsjson entry}`` for those of ``files`` present under ``base``."""
        if not files:
            return {}
        args = ["lsjson", "-R", base, "--files-only", "--no-mimetype", "--no-modtime"]
        if hashes:
            args += ["--hash", "--hash-type", "MD5", "--hash-type", "SHA-1"]
        try:
            out = self._rclone(*args, files=files)
        except ShipError as exc:
            if "directory not found" in str(exc):
                return {}
            raise
        return {e["Path"]: e for e in json.loads(out or "[]")}

    def _download_md5(self, base: str, files: list[str]) -> dict[str, str]:
        out = self._rclone("md5sum", "--download", base, files=files)
        sums: dict[str, str] = {}
        for line in out.splitlines():
            digest, _, rel = line.partition("  ")
            sums[rel.strip()] = digest.strip()
        return sums

    def verified(self, base: str, segs: list[Segment], sums: dict[str, str], *,
                 unhashed_by: str) -> list[Segment]:
        """The segments whose copy under ``base`` has their size and MD5 (or SHA-1).
        Where the backend gives no checksum, ``unhashed_by`` decides: ``"download"``
        (rclone downloads and hashes), ``"size"`` (the size is enough: the content was
        verified before a server-side move), ``"skip"`` (not verified) or ``"error"``."""
        entries = self.remote_files(base, [s.rel for s in segs], hashes=True)
        good: list[Segment] = []
        unhashed: list[Segment] = []
        for seg in segs:
            entry = entries.get(seg.rel)
            if entry is None or entry.get("Size") != seg.size:
                continue
            remote = {k.lower(): v for k, v in (entry.get("Hashes") or {}).items()}
            if remote.get("md5"):
                if remote["md5"] == sums[seg.rel]:
                    good.append(seg)
            elif remote.get("sha1"):
                if remote["sha1"] == _sha1(self.raw / seg.rel):
                    good.append(seg)
            else:
                unhashed.append(seg)
        if unhashed and unhashed_by == "download":
            got = self._download_md5(base, [s.rel for s in unhashed])
            good += [s for s in unhashed if got.get(s.rel) == sums[s.rel]]
        elif unhashed and unhashed_by == "size":
            good += unhashed
        elif unhashed and unhashed_by == "error":
            raise ShipError(f"{base.split(':', 1)[0]}: the remote gives no checksum; "
                            "set verify_download = true")
        return good

    # -- the pass ------------------------------------------------------------------------

    def apply_spool_policy(self, segs: list[Segment]) -> tuple[list[Segment], list[Segment]]:
        """(kept, dropped): past ``spool_max``, ``delete_oldest`` frees the oldest first."""
        total = sum(s.size for s in segs)
        if total <= self.cfg.spool_max or self.cfg.when_full == "keep":
            return segs, []
        dropped: list[Segment] = []
        kept = list(segs)
        while kept and total > self.cfg.spool_max:
            seg = kept.pop(0)
            (self.raw / seg.rel).unlink(missing_ok=True)
            total -= seg.size
            dropped.append(seg)
        log.warning("spool over %d bytes: deleted the %d oldest segments (%d bytes) unshipped",
                    self.cfg.spool_max, len(dropped), sum(s.size for s in dropped))
        return kept, dropped

    def run_pass(self) -> PassResult:
        result = PassResult()
        self._env, self._secrets = remote_env(self.cfg, self.rclone)
        segs, dropped = self.apply_spool_policy(sealed_segments(self.raw))
        result.dropped = [s.rel for s in dropped]
        result.dropped_bytes = sum(s.size for s in dropped)
        result.pending_bytes = sum(s.size for s in segs)
        if not segs:
            return result
        sums = {s.rel: md5_file(self.raw / s.rel) for s in segs}
        # already at the final path (a pass cut between the move and the delete)
        done = {s.rel for s in self.verified(self.dest, segs, sums, unhashed_by="skip")}
        todo = [s for s in segs if s.rel not in done]
        if todo:
            self._rclone("copy", str(self.raw), self.staging, files=[s.rel for s in todo])
            staged = self.verified(
                self.staging, todo, sums,
                unhashed_by="download" if self.cfg.verify_download else "error")
            bad = len(todo) - len(staged)
            if staged:
                self._move(staged)
                final = self.verified(self.dest, staged, sums, unhashed_by="size")
                done |= {s.rel for s in final}
            if bad:
                self._delete_local([s for s in segs if s.rel in done], result)
                raise ShipError(f"{bad} segment(s) failed verification after the copy")
        self._delete_local([s for s in segs if s.rel in done], result)
        return result

    def _move(self, staged: list[Segment]) -> None:
        """Server-side move, one per kind folder (rclone refuses overlapping remotes,
        and the staging folder is inside the destination)."""
        by_kind: dict[str, list[str]] = {}
        for seg in staged:
            kind, _, rest = seg.rel.partition("/")
            by_kind.setdefault(kind, []).append(rest)
        for kind, files in sorted(by_kind.items()):
            self._rclone("move", f"{self.staging}/{kind}", f"{self.dest}/{kind}", files=files)

    def _delete_local(self, segs: list[Segment], result: PassResult) -> None:
        for seg in segs:
            path = self.raw / seg.rel
            path.unlink(missing_ok=True)
            result.shipped.append(seg.rel)
            result.shipped_bytes += seg.size
            result.pending_bytes -= seg.size
            _prune(path.parent, self.raw)


def _sha1(path: Path) -> str:
    digest = hashlib.sha1(usedforsecurity=False)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _prune(folder: Path, stop: Path) -> None:
    """Remove now-empty folders up to (not including) ``stop``; a folder the archiver
    is writing into again is simply not empty."""
    while folder != stop and stop in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with (root / LOCK_FILE).open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(f"another ship pass holds {root / LOCK_FILE}") from None
        yield


def ship(config: GatewayConfig, rclone: str = "rclone") -> tuple[PassResult, Status]:
    """One pass for ``config`` (``[fleet.shipper]`` must be enabled), with the status file
    updated. Raises :class:`ShipError` (after recording it) or :class:`Busy`."""
    cfg = config.fleet.shipper
    arch = settings_from_config(config)
    shipper = Shipper(cfg, arch.root, site=arch.site, gw=arch.gw, rclone=rclone)
    path = arch.root / STATUS_FILE
    with locked(arch.root):
        status = Status.load(path)
        status.last_run = time.time()
        status.spool_max = cfg.spool_max
        status.destination = f"{cfg.type}:{cfg.host + ':' if cfg.host else ''}{cfg.path}"
        try:
            result = shipper.run_pass()
        except (ShipError, OSError) as exc:
            message = shipper.scrub(str(exc))
            status.last_error, status.last_error_at = message, time.time()
            status.consecutive_errors += 1
            status.errors_total += 1
            _measure_spool(status, cfg, shipper.raw)
            status.save(path)
            raise ShipError(message) from None
        status.last_success = time.time()
        status.consecutive_errors = 0
        status.shipped_segments_total += len(result.shipped)
        status.shipped_bytes_total += result.shipped_bytes
        status.dropped_segments_total += len(result.dropped)
        status.dropped_bytes_total += result.dropped_bytes
        _measure_spool(status, cfg, shipper.raw)
        status.save(path)
        return result, status


def _measure_spool(status: Status, cfg: FleetShipperConfig, raw: Path) -> None:
    """Pending segments and bytes after a pass, and the spool alarm judged by the pass
    itself (so it is raised, in the journal and the status file, even when nobody reads
    the status API): a warning when it starts, an info line when it clears."""
    pending = sealed_segments(raw)
    status.pending_segments = len(pending)
    status.pending_bytes = sum(s.size for s in pending)
    threshold = int(cfg.spool_alarm * cfg.spool_max)
    high = status.pending_bytes > threshold
    if high and not status.spool_alarm:
        status.spool_alarm_since = time.time()
        log.warning("fleet_spool_high: %s bytes pending, past the alarm threshold %s "
                    "(spool_max %s)", f"{status.pending_bytes:,}", f"{threshold:,}",
                    f"{cfg.spool_max:,}")
    elif not high and status.spool_alarm:
        status.spool_alarm_since = None
        log.warning("fleet_spool_high cleared: %s bytes pending", f"{status.pending_bytes:,}")
    status.spool_alarm = high


def view(config: GatewayConfig) -> dict[str, Any] | None:
    """The shipper's state for ``gatewayctl status``, the API and Prometheus: the status
    file plus the spool measured now; None when ``[fleet.shipper]`` is off."""
    cfg = config.fleet.shipper
    if not cfg.enable:
        return None
    root = archive_root(config)
    status = Status.load(root / STATUS_FILE)
    pending = sealed_segments(root / "raw")
    pending_bytes = sum(s.size for s in pending)
    data = asdict(status)
    data.pop("spool_alarm_since")  # the pass's own record; the view judges the spool now
    data.update(
        pending_segments=len(pending),
        pending_bytes=pending_bytes,
        spool_max=cfg.spool_max,
        spool_alarm=pending_bytes > cfg.spool_alarm * cfg.spool_max,
        spool_alarm_bytes=int(cfg.spool_alarm * cfg.spool_max),
        destination=f"{cfg.type}:{cfg.host + ':' if cfg.host else ''}{cfg.path}",
    )
    return data
