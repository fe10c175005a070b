"""``QemuGatewayDriver``: the appliance image (image/) booted under QEMU by ``image/qemu``.

Written against the image branch's interface: ``image/qemu IMG --mqtt-port N --ssh-port N
--api-port N`` forwards those host ports (loopback) to the guest. The driver copies the
image into the run directory once, so a power cut (SIGKILL of QEMU) followed by a cold
boot finds the disk as the crash left it (no ``--snapshot``, which would discard every
write and make durability untestable). Process kill goes through SSH (``root@localhost``
on the forwarded port): ``systemctl kill -s KILL gatewayd``, systemd restarts it.
Network, disk and bridge faults are :class:`hil.unit.Unsupported` on this target.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any, ClassVar

import attr
from labgrid.driver.common import Driver
from labgrid.factory import target_factory

from hil.drivers.common import api_get, wait_ready
from hil.faults.upstream import free_port
from hil.unit import Endpoints, Unsupported


@target_factory.reg_driver
@attr.s(eq=False)
class QemuGatewayDriver(Driver):
    bindings: ClassVar[dict[str, Any]] = {"image": "GatewayImage"}

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.proc: subprocess.Popen[bytes] | None = None
        self.disk: Path | None = None
        self.run_dir: Path | None = None
        self._ep: Endpoints | None = None
        self.boots = 0

    def on_deactivate(self) -> None:
        self.teardown()

    def _resolve(self, p: str) -> str:
        return str(self.target.env.config.resolve_path(p)) if self.target.env else p

    def prepare(self, run_dir: Path, env: dict[str, str]) -> None:
        if env:
            raise Unsupported("the qemu target cannot take extra gatewayd settings "
                              f"({', '.join(sorted(env))}): bake them into the image")
        image = Path(self._resolve(self.image.image))
        if not image.exists():
            raise Unsupported(f"no image at {image} (build it with image/build)")
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.disk = run_dir / image.name
        # sparse copy: the 2.6 GB image holds about 0.6 GB of data
        subprocess.run(["cp", "--sparse=always", str(image), str(self.disk)], check=True)
        ports = {"mqtt": free_port("127.0.0.1"), "ssh": free_port("127.0.0.1"),
                 "api": free_port("127.0.0.1")}
        self._ep = Endpoints("127.0.0.1", "127.0.0.1", ports, api_token=self.image.api_token,
                             extra={"ssh_port": str(ports["ssh"])})

    def configure(self, env: dict[str, str]) -> None:
        if env:
            raise Unsupported("the qemu target cannot take extra gatewayd settings "
                              f"({', '.join(sorted(env))}): bake them into the image")

    def power_on(self) -> None:
        assert self.disk is not None and self._ep is not None and self.run_dir is not None
        p = self._ep.ports
        # one serial console file per power-on (QEMU truncates it when it starts)
        self.boots += 1
        serial = self.run_dir / f"serial-{self.boots}.log"
        log = (self.run_dir / "qemu.log").open("ab")
        self.proc = subprocess.Popen(
            [self._resolve(self.image.script), str(self.disk), "--mqtt-port", str(p["mqtt"]),
             "--ssh-port", str(p["ssh"]), "--api-port", str(p["api"]),
             "--serial-log", str(serial)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()

    def power_cut(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def kill_process(self) -> None:
        assert self._ep is not None
        subprocess.run(["ssh", "-o", "StrictHostKeyChecking=no", "-o",
                        "UserKnownHostsFile=/dev/null", "-p", self._ep.extra["ssh_port"],
                        "root@127.0.0.1", "systemctl", "kill", "-s", "KILL", "gatewayd"],
                       check=True, capture_output=True, timeout=60)

    def wait_ready(self, timeout: float) -> float:
        return wait_ready(self.endpoints(), max(timeout, self.image.boot_timeout))

    def endpoints(self) -> Endpoints:
        if self._ep is None:
            raise RuntimeError("prepare() first")
        return self._ep

    def rss_bytes(self) -> int | None:
        try:
            nodes = api_get(self.endpoints(), "/api/v5/nodes")
        except (OSError, ValueError):
            return None
        # GET /api/v5/nodes: [{"node": ..., "memory_rss": bytes or null, ...}]
        if isinstance(nodes, list) and nodes and isinstance(nodes[0], dict):
            rss = nodes[0].get("memory_rss")
            return int(rss) if isinstance(rss, int) and rss > 0 else None
        return None

    def network_fault(self, mode: str, loss: float, delay: float) -> None:
        raise Unsupported("network faults are not implemented on the qemu target yet")

    def network_heal(self) -> None:
        pass

    def disk_fill(self) -> str | None:
        raise Unsupported("disk-full is not implemented on the qemu target yet")

    def disk_free(self) -> None:
        pass

    def teardown(self) -> None:
        self.power_cut()
