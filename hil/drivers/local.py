"""``LocalGatewayDriver``: gatewayd on this host as the unit under test.

Power cut = SIGKILL, and nothing runs until ``power_on``; process kill = SIGKILL, after
which the driver's restart loop (standing in for systemd's ``Restart=always``, with
``restart_delay``) brings it back by itself. The process runs inside the rig's network
namespace (:mod:`hil.faults.netns`) and with its data directory on a tmpfs of
``disk_size`` mounted in a mount namespace the driver keeps alive in a file
(``unshare --mount=FILE``), so the tmpfs and its data outlive every restart of gatewayd
while staying invisible to the rest of the host. ``teardown`` undoes all of it.
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import attr
from labgrid.driver.common import Driver
from labgrid.factory import target_factory

from gateway.security import pki
from hil.drivers.common import wait_ready
from hil.faults.netns import Netns
from hil.unit import Endpoints, Unsupported

INNER_PORTS = {"mqtt": 1883, "mqtts": 8883, "ws": 8083, "wss": 8084, "mqttsn": 1884,
               "coap": 5683, "lwm2m": 5783, "api": 18083}


def _free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@target_factory.reg_driver
@attr.s(eq=False)
class LocalGatewayDriver(Driver):
    bindings: ClassVar[dict[str, Any]] = {"gateway": "LocalGateway"}

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.proc: subprocess.Popen[bytes] | None = None
        self.netns: Netns | None = None
        self.run_dir: Path | None = None
        self._env: dict[str, str] = {}
        self._ep: Endpoints | None = None
        self._want = False  # the restart loop brings the process back while this holds
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._ns_dir: Path | None = None
        self._data: Path | None = None
        self.restarts = 0

    # -- labgrid -------------------------------------------------------------------
    def on_deactivate(self) -> None:
        self.teardown()

    # -- set-up --------------------------------------------------------------------
    def _config_path(self) -> str | None:
        cfg = self.gateway.config
        if cfg and self.target.env:
            return str(self.target.env.config.resolve_path(cfg))
        return str(cfg) if cfg else None

    def prepare(self, run_dir: Path, env: dict[str, str]) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self._data = run_dir / "data"
        self._data.mkdir(exist_ok=True)
        root = os.geteuid() == 0
        if self.gateway.netns:
            if not root:
                raise Unsupported("netns: true needs root (set netns: false to run on loopback)")
            self.netns = Netns()
            self.netns.create()
            ports = dict(INNER_PORTS)
            dev, ctl, rig = self.netns.device_addr, self.netns.control_addr, self.netns.rig_addr
            bind = "0.0.0.0"
        else:
            ports = {k: _free_port(socket.SOCK_DGRAM if k in ("mqttsn", "coap", "lwm2m")
                                   else socket.SOCK_STREAM) for k in INNER_PORTS}
            dev = ctl = rig = bind = "127.0.0.1"
        if self.gateway.disk_size:
            if not root:
                raise Unsupported("disk_size needs root (a tmpfs); set disk_size: \"\"")
            self._mount_tmpfs(run_dir)
        pkidir = run_dir / "pki"
        pki.init_ca(pkidir, common_name="hil CA", force=True)
        issued = pki.issue(pkidir, "server", sans=[f"IP:{dev}", f"IP:{ctl}", "DNS:localhost"],
                           force=True)
        token = secrets.token_hex(16)
        self._env = {
            "GATEWAY_NODE__DATA_DIR": str(self._data),
            "GATEWAY_LISTENERS__TCP__DEFAULT__BIND": f"{bind}:{ports['mqtt']}",
            "GATEWAY_LISTENERS__SSL__DEFAULT__BIND": f"{bind}:{ports['mqtts']}",
            "GATEWAY_LISTENERS__SSL__DEFAULT__CERTFILE": str(issued.cert_path),
            "GATEWAY_LISTENERS__SSL__DEFAULT__KEYFILE": str(issued.key_path),
            "GATEWAY_LISTENERS__WS__DEFAULT__BIND": f"{bind}:{ports['ws']}",
            "GATEWAY_LISTENERS__WSS__DEFAULT__BIND": f"{bind}:{ports['wss']}",
            "GATEWAY_LISTENERS__WSS__DEFAULT__CERTFILE": str(issued.cert_path),
            "GATEWAY_LISTENERS__WSS__DEFAULT__KEYFILE": str(issued.key_path),
            "GATEWAY_GATEWAY__MQTTSN__LISTENERS__UDP__DEFAULT__BIND": f"{bind}:{ports['mqttsn']}",
            "GATEWAY_GATEWAY__COAP__LISTENERS__UDP__DEFAULT__BIND": f"{bind}:{ports['coap']}",
            "GATEWAY_GATEWAY__LWM2M__LISTENERS__UDP__DEFAULT__BIND": f"{bind}:{ports['lwm2m']}",
            "GATEWAY_API__BIND": f"{bind}:{ports['api']}",
            "GATEWAY_API__TOKEN": token,
        }
        self._env.update({k: str(v) for k, v in self.gateway.environment.items()})
        self._env.update(env)
        self._ep = Endpoints(dev, ctl, ports, token, pkidir / "ca.crt", rig)

    def _mount_tmpfs(self, run_dir: Path) -> None:
        ns_dir = run_dir / "ns"
        ns_dir.mkdir(exist_ok=True)
        subprocess.run(["mount", "--bind", str(ns_dir), str(ns_dir)], check=True)
        self._ns_dir = ns_dir
        subprocess.run(["mount", "--make-private", str(ns_dir)], check=True)
        (ns_dir / "mnt").touch()
        subprocess.run(
            ["unshare", f"--mount={ns_dir / 'mnt'}", "--propagation", "private",
             "mount", "-t", "tmpfs", "-o", f"size={self.gateway.disk_size}", "tmpfs",
             str(self._data)], check=True)

    def _prefix(self) -> list[str]:
        p: list[str] = []
        if self.netns or self._ns_dir:
            p = ["nsenter"]
            if self.netns:
                p.append(f"--net=/run/netns/{self.netns.name}")
            if self._ns_dir:
                p.append(f"--mount={self._ns_dir / 'mnt'}")
            p.append("--")
        return p

    def _command(self) -> list[str]:
        cmd = shlex.split(self.gateway.command) or [sys.executable, "-m", "gateway.cli.gatewayd"]
        cfg = self._config_path()
        return [*self._prefix(), *cmd, *(["--config", cfg] if cfg else [])]

    # -- power and process -----------------------------------------------------------
    def _spawn(self) -> None:
        assert self.run_dir is not None
        log = (self.run_dir / "gatewayd.log").open("ab")
        env = {**os.environ, **self._env}
        self.proc = subprocess.Popen(self._command(), env=env, stdout=log, stderr=log,
                                     cwd=self.run_dir, start_new_session=True)
        log.close()

    def _watch(self) -> None:
        while True:
            with self._lock:
                proc, want = self.proc, self._want
            if not want:
                return
            if proc is not None and proc.poll() is None:
                try:
                    proc.wait(0.2)
                except subprocess.TimeoutExpired:
                    continue
            time.sleep(self.gateway.restart_delay)
            with self._lock:
                if self._want and (self.proc is None or self.proc.poll() is not None):
                    self._spawn()
                    self.restarts += 1

    def configure(self, env: dict[str, str]) -> None:
        self._env.update(env)

    def power_on(self) -> None:
        with self._lock:
            self._want = True
            if self.proc is None or self.proc.poll() is not None:
                self._spawn()
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(target=self._watch, daemon=True, name="hil-restart")
            self._watcher.start()

    def power_cut(self) -> None:
        with self._lock:
            self._want = False
            self._kill()

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def kill_process(self) -> None:
        with self._lock:
            self._kill()  # the restart loop notices and restarts after restart_delay

    def wait_ready(self, timeout: float) -> float:
        return wait_ready(self.endpoints(), timeout)

    def endpoints(self) -> Endpoints:
        if self._ep is None:
            raise RuntimeError("prepare() first")
        return self._ep

    def rss_bytes(self) -> int | None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    # -- faults ----------------------------------------------------------------------
    def network_fault(self, mode: str, loss: float, delay: float) -> None:
        if self.netns is None:
            raise Unsupported("network faults need netns: true")
        self.netns.fault(mode, loss, delay)

    def network_heal(self) -> None:
        if self.netns is not None:
            self.netns.heal()

    def _in_mount(self, *cmd: str) -> subprocess.CompletedProcess[Any]:
        assert self._ns_dir is not None
        return subprocess.run(["nsenter", f"--mount={self._ns_dir / 'mnt'}", "--", *cmd],
                              capture_output=True, text=True)

    def disk_fill(self) -> str:
        if self._ns_dir is None or self._data is None:
            raise Unsupported("disk-full needs disk_size (a tmpfs for the data directory)")
        # dd stops at ENOSPC (exit 1): the file system is then full
        self._in_mount("dd", "if=/dev/zero", f"of={self._data / 'hil-filler'}", "bs=64k")
        df = self._in_mount("df", "--output=size,avail", "-B1", str(self._data))
        size, avail = df.stdout.split()[-2:]
        return f"data file system full: {avail} of {size} bytes free"

    def disk_free(self) -> None:
        if self._ns_dir is not None and self._data is not None:
            self._in_mount("rm", "-f", str(self._data / "hil-filler"))

    def teardown(self) -> None:
        with self._lock:
            self._want = False
            self._kill()
        if self._ns_dir is not None:
            subprocess.run(["umount", str(self._ns_dir / "mnt")], check=False)
            subprocess.run(["umount", "-l", str(self._ns_dir)], check=False)
            self._ns_dir = None
        if self.netns is not None:
            self.netns.close()
            self.netns = None
