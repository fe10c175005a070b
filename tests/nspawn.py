"""Shared helpers for tests that boot a Debian root file system with systemd-nspawn.

- :func:`base_rootfs`: a minimal Debian 12 rootfs built by mmdebstrap, cached outside the
  work tree (``$EDGE_GATEWAY_CACHE``, default /var/cache/edge-gateway as root) under a
  name derived from a hash of its inputs (suite, mirror, packages), so a change of inputs
  builds a new one and never reuses a stale one. The cached tree is never modified: tests
  copy it (``cp -a --reflink=auto``) before changing anything.
- :class:`Container`: ``systemd-nspawn --boot`` of a rootfs (sharing the host's network),
  commands run inside through ``nsenter`` into the container's init.
- :func:`nspawn_run`: one command in a rootfs (not booted).
- :func:`until`: bounded polling of state that is only visible by asking.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from tests.harness import wait
from tests.harness.cache import cache_dir

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("systemd", "systemd-sysv", "dbus", "procps", "python3", "python3-venv",
            "libsystemd0")
WAIT = 120.0


def skip_unless_possible() -> None:
    if os.geteuid() != 0:
        pytest.skip("booting a container needs root")
    for tool, package in (("mmdebstrap", "mmdebstrap"), ("systemd-nspawn", "systemd-container"),
                          ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (Debian package {package})")



def base_rootfs(packages: Sequence[str] = PACKAGES) -> Path:
    """The cached minimal rootfs with ``packages``, built once per set of inputs."""
    args = ["--variant=minbase", f"--include={','.join(packages)}", SUITE, MIRROR]
    key = hashlib.sha256(repr(args).encode()).hexdigest()[:16]
    final = cache_dir() / f"rootfs-{SUITE}-{key}"
    if (final / "usr/lib/systemd/systemd").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    building = final.with_name(final.name + f".tmp{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    r = subprocess.run(["mmdebstrap", *args[:2], args[2], str(building), args[3]],
                       capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        pytest.skip(f"mmdebstrap failed (no Debian mirror?): {r.stderr.strip()[-300:]}")
    building.rename(final)
    return final


def copy_tree(src: Path, dest: Path) -> Path:
    """A private copy of a (cached) rootfs that a test may change."""
    subprocess.run(["cp", "-a", "--reflink=auto", str(src), str(dest)], check=True)
    return dest


def nspawn_run(root: Path, *cmd: str, binds: tuple[str, ...] = ()) -> None:
    r = subprocess.run(["systemd-nspawn", "-q", "--keep-unit", "--register=no",
                        "--machine=gateway-setup", "-D", str(root),
                        *(f"--bind-ro={b}" for b in binds), *cmd],
                       capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def until(what: str, check: Callable[[], bool], timeout: float = WAIT) -> None:
    """Poll ``check`` (bounded): for states only visible by asking (systemctl show)."""
    wait.until(what, check, timeout, 0.2)


def container_init(nspawn: int) -> int:
    """The PID (in our namespace) of the container's init among ``nspawn``'s children."""
    r = subprocess.run(["pgrep", "-P", str(nspawn)], capture_output=True, text=True)
    for pid in r.stdout.split():
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("NSpid:") and line.split()[1:] == [pid, "1"]:
                    return int(pid)
    return 0


class Container:
    """A rootfs booted with ``systemd-nspawn --boot``; it shares the host's network."""

    def __init__(self, root: Path, log: Path, machine: str = "gateway-test") -> None:
        self.root = root
        self.log = log
        self.machine = machine
        self.proc: subprocess.Popen[bytes] | None = None
        self.leader = 0

    def boot(self) -> None:
        out = open(self.log, "wb")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            ["systemd-nspawn", "-q", "--keep-unit", "--register=no", "-D", str(self.root),
             f"--machine={self.machine}", "--boot"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        out.close()

        def leader() -> bool:
            # nspawn's first child (the "outer child") lives only until it has cloned the
            # container's init; only a child that is PID 1 in its own namespace will do.
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            self.leader = container_init(self.proc.pid)
            return self.leader != 0

        until("the container's init", leader, 30)
        state, failure = "", ""

        def booted() -> bool:  # "offline" until the container's manager is reachable
            nonlocal state, failure
            leader()
            r = self.run("systemctl", "is-system-running", "--wait", timeout=WAIT)
            state, failure = r.stdout.strip(), r.stderr.strip()
            return state not in ("offline", "")

        try:
            until("the container's boot", booted, WAIT)
        except AssertionError as e:
            console = self.log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"{e}: state {state!r}, nsenter said {failure!r}; "
                                 f"console:\n{console}") from None
        assert state in ("running", "degraded"), (state, self.journal())

    def run(self, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["nsenter", "-t", str(self.leader), "-a", *cmd],
                              capture_output=True, text=True, timeout=timeout)

    def show(self, *props: str) -> dict[str, str]:
        r = self.run("systemctl", "show", "gatewayd", *(f"-p{p}" for p in props))
        return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)

    def journal(self) -> str:
        return self.run("journalctl", "-u", "gatewayd", "--no-pager", "-n", "80").stdout

    def shutdown(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # nspawn powers the container off
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
