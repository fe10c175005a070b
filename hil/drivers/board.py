"""``BoardGatewayDriver``: gatewayd on a real board, reached over the network.

Bindings: a power driver (labgrid's ``PowerProtocol``: ``NetworkPowerDriver`` for a PDU,
``USBPowerDriver``, ``ExternalPowerDriver`` for a USB relay's command line, ...), an
``SSHDriver`` for process kills and faults made on the board itself, and the
``GatewayService`` resource (its ports and API token). A serial console (``SerialDriver``
+ ``ShellDriver``) may be bound too; the driver only uses it to log the boot when given.
Network faults run ``nft`` on the board over SSH against the device-facing address; disk
full fills ``/var/lib/gateway`` with ``fallocate``. Validated here, not run (no board).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import attr
from labgrid.driver.common import Driver
from labgrid.factory import target_factory
from labgrid.protocol import PowerProtocol

from hil.drivers.common import api_get, wait_ready
from hil.unit import Endpoints, Unsupported


@target_factory.reg_driver
@attr.s(eq=False)
class BoardGatewayDriver(Driver):
    bindings: ClassVar[dict[str, Any]] = {
        "power": PowerProtocol, "ssh": "SSHDriver", "service": "GatewayService"}
    data_dir: str = attr.ib(default="/var/lib/gateway",
                            validator=attr.validators.instance_of(str))

    def prepare(self, run_dir: Path, env: dict[str, str]) -> None:
        if env:
            raise Unsupported("configure the board's gatewayd yourself: "
                              + ", ".join(sorted(env)))
        self.target.activate(self.ssh)

    def configure(self, env: dict[str, str]) -> None:
        if env:
            raise Unsupported("configure the board's gatewayd yourself: "
                              + ", ".join(sorted(env)))

    def power_on(self) -> None:
        self.target.activate(self.power)
        self.power.on()

    def power_cut(self) -> None:
        self.target.activate(self.power)
        self.power.off()

    def kill_process(self) -> None:
        self.ssh.run_check("systemctl kill -s KILL gatewayd")

    def wait_ready(self, timeout: float) -> float:
        return wait_ready(self.endpoints(), timeout)

    def endpoints(self) -> Endpoints:
        s = self.service
        ports = {"mqtt": s.mqtt_port, "mqtts": s.mqtts_port, "ws": s.ws_port,
                 "wss": s.wss_port, "mqttsn": s.mqttsn_port, "coap": s.coap_port,
                 "lwm2m": s.lwm2m_port, "api": s.api_port}
        ca = Path(s.ca_file) if s.ca_file else None
        return Endpoints(s.address, s.address, ports, s.api_token, ca,
                         s.rig_address or "127.0.0.1")

    def rss_bytes(self) -> int | None:
        out = self.ssh.run_check("ps -o rss= -C gatewayd")
        return int(out[0].split()[0]) * 1024 if out else None

    def network_fault(self, mode: str, loss: float, delay: float) -> None:
        if mode == "delay":
            self.ssh.run_check(f"tc qdisc add dev eth0 root netem delay {int(delay * 1000)}ms")
        elif mode in ("loss", "partition"):
            n = 100 if mode == "partition" else int(loss)
            self.ssh.run_check(
                "nft add table inet hil && nft add chain inet hil in "
                "'{ type filter hook input priority 0; }' && nft add rule inet hil in "
                f"tcp dport != 22 numgen random mod 100 '<' {n} drop")
        else:
            raise Unsupported(mode)

    def network_heal(self) -> None:
        self.ssh.run("nft delete table inet hil; tc qdisc del dev eth0 root")

    def disk_fill(self) -> str | None:
        self.ssh.run(f"dd if=/dev/zero of={self.data_dir}/hil-filler bs=64k")
        out = self.ssh.run_check(f"df -B1 --output=avail {self.data_dir}")
        return f"data file system: {out[-1].strip()} bytes free"

    def disk_free(self) -> None:
        self.ssh.run_check(f"rm -f {self.data_dir}/hil-filler")

    def teardown(self) -> None:
        pass

    def api(self, path: str) -> object:
        return api_get(self.endpoints(), path)
