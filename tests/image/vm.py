"""A unit under QEMU for tests (and the HIL rig): boot, watch the serial console, run
commands over SSH, reboot, cut the power.

The serial console goes to a file per power-on (QEMU truncates it when it starts) that
grows across reboots of that QEMU process; every wait looks only at what was written
after a mark (:meth:`Vm.mark`), so a line from an earlier boot never satisfies a later
wait.

A guest reboot is a fresh QEMU process: QEMU runs with ``-no-reboot`` and exits when the
guest resets, and the next wait starts it again on the same disk and UEFI variables (a
cold boot where real hardware would do a warm reset). Resetting in place hung now and
then under KVM on the CI machine: the guest printed "reboot: machine restart" and then
nothing for 15 minutes, with nothing on QEMU's stderr. Waiting polls that file (bounded): the
console of another process offers no event to await.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.gateway.admin.gatewayd import free_port

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "image"))

from edge_image import qemu  # noqa: E402

GOOD = "gateway-health: boot is good"
POWER_DOWN = "reboot: Power down"
BAD = "gateway-health: FAILED"
BOOT_TIMEOUT = float(os.environ.get("EDGE_GATEWAY_BOOT_TIMEOUT", "420"))


class Vm:
    def __init__(self, disk: Path, work: Path, ssh_key: Path, *, snapshot: bool = False,
                 name: str = "unit", arch: str = "amd64") -> None:
        self.disk = disk
        self.arch = arch
        self.work = work
        self.ssh_key = ssh_key
        self.snapshot = snapshot
        self.name = name
        self.starts = 0
        self.log = work / f"{name}-serial-0.log"
        self.vars = qemu.new_vars(work / f"{name}-VARS.fd", arch)
        self.ports = {"mqtt": free_port(), "ssh": free_port(), "api": free_port()}
        self.proc: subprocess.Popen[bytes] | None = None
        self._mark = 0
        self._earlier = ""  # console text since the mark from QEMU processes that ended
        self.boots: list[float] = []
        self.resets = 0  # guest resets that ended a QEMU process (see the module doc)

    # --------------------------------------------------------------- power
    def start(self, *, after_reset: bool = False) -> None:
        """Power on (a cold boot); ``after_reset``: the guest's own reboot, whose time
        counts from the reboot, not from here."""
        assert self.proc is None or self.proc.poll() is not None
        if after_reset:
            self._earlier += self._current()  # the ended process's log, before a new one
        else:
            self._earlier = ""
            self._t0 = time.monotonic()
        # QEMU truncates its serial file when it starts: one file per power-on.
        self.starts += 1
        self.log = self.work / f"{self.name}-serial-{self.starts}.log"
        self._mark = 0
        cmd = qemu.command(self.disk, vars_file=self.vars, ports=self.ports,
                           snapshot=self.snapshot, serial_log=self.log, no_reboot=True,
                           arch=self.arch)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(self.work / "qemu.stderr", "ab"))  # noqa: SIM115

    def power_cut(self) -> None:
        """``kill -9`` of QEMU: nothing the guest had not written reaches the disk file."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(Exception):
            self.ssh("systemctl poweroff", check=False, timeout=20)
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def reboot(self, timeout: float = BOOT_TIMEOUT) -> float:
        """A clean reboot from inside; returns the seconds until the next good boot."""
        self.mark()
        self._t0 = time.monotonic()
        self.ssh("systemctl reboot", check=False, timeout=30)
        return self.wait_good(timeout)

    # --------------------------------------------------------------- console
    def mark(self) -> None:
        self._mark = self.log.stat().st_size if self.log.exists() else 0
        self._earlier = ""

    def console(self) -> str:
        """What the console showed since the mark, across guest resets."""
        return self._earlier + self._current()

    def _current(self) -> str:
        if not self.log.exists():
            return ""
        with open(self.log, "rb") as f:
            f.seek(self._mark)
            return f.read().decode(errors="replace")

    def wait_for(self, pattern: str, timeout: float = BOOT_TIMEOUT) -> re.Match[str]:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            exited = self.proc is not None and self.proc.poll() is not None
            m = rx.search(self.console())  # read after the poll: nothing written is missed
            if m:
                return m
            if exited:
                assert self.proc is not None
                if self.proc.returncode != 0 or POWER_DOWN in self._current()[-400:]:
                    raise AssertionError(f"QEMU exited ({self.proc.returncode}) before "
                                         f"{pattern!r}:\n{self.console()[-3000:]}")
                self.resets += 1  # the guest reset (-no-reboot): boot it again
                self.start(after_reset=True)
                continue
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} on the console within {timeout:.0f} s:"
                                     f"\n{self.console()[-3000:]}")
            time.sleep(0.5)

    def wait_good(self, timeout: float = BOOT_TIMEOUT) -> float:
        """Wait for the health check's verdict of this boot; the boot's seconds if good."""
        m = self.wait_for(f"({re.escape(GOOD)}|{re.escape(BAD)}[^\n]*)", timeout)
        if m.group(1) != GOOD:
            raise AssertionError(f"health check failed: {m.group(1)}\n{self.console()[-3000:]}")
        took = time.monotonic() - self._t0
        self.boots.append(took)
        self.wait_ssh()
        return took

    def wait_ssh(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.ssh("true", check=False, timeout=20).returncode != 0:
            if time.monotonic() > deadline:
                raise AssertionError("SSH did not answer")
            time.sleep(1)

    # --------------------------------------------------------------- commands
    def ssh(self, command: str, *, check: bool = True, timeout: float = 120,
            input: bytes | None = None) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            ["ssh", "-q", "-i", str(self.ssh_key), "-p", str(self.ports["ssh"]),
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
             "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "root@127.0.0.1", command],
            input=input.decode() if input is not None else None,
            capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"{command!r} exit {r.returncode}: {r.stdout[-1500:]}"
                                 f"{r.stderr[-1500:]}")
        return r
