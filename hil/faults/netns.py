"""A network namespace for the unit, a veth pair to the rig, and faults on that link.

Layout (``/24`` picked at random in 10.213.0.0/16 so runs do not meet)::

    rig (root namespace)  X.1  ==veth==  X.2 devices' address  (unit's namespace)
                                         X.3 control address (collector, API, bridge)

Faults act on the unit's device address only (nftables in the unit's namespace), so the
rig's collector, the management API and the bridge's upstream link are untouched:

- ``partition``: drop everything to and from X.2;
- ``loss``: drop that percentage of packets at random (``numgen random``) both ways;
- ``delay``: ``tc netem`` on the unit's veth when the kernel has ``sch_netem``; otherwise
  :class:`hil.unit.Unsupported` (this sandbox's kernel lacks it: docs/hil.md).

Everything made here is removed by :meth:`Netns.close` (the namespace, hence the veth).
"""

from __future__ import annotations

import random
import subprocess

from hil.unit import Unsupported

TABLE = "hil"


def _run(*cmd: str, input: str | None = None,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), input=input, text=True, capture_output=True, check=check)


def netem_available() -> bool:
    """Whether ``tc qdisc ... netem`` works in this kernel (probed on a scratch veth)."""
    name = f"hilp{random.randrange(1 << 20):x}"
    if _run("ip", "link", "add", name, "type", "veth", "peer", "name", name + "p",
            check=False).returncode:
        return False
    try:
        return _run("tc", "qdisc", "add", "dev", name, "root", "netem", "delay", "1ms",
                    check=False).returncode == 0
    finally:
        _run("ip", "link", "del", name, check=False)


class Netns:
    def __init__(self) -> None:
        tag = f"{random.randrange(1 << 24):06x}"
        self.name = f"hil-{tag}"
        self.host_if, self.unit_if = f"hilh{tag}", f"hilu{tag}"
        net = random.randrange(1, 255)
        self.prefix = f"10.213.{net}"
        self.rig_addr, self.device_addr, self.control_addr = (
            f"{self.prefix}.1", f"{self.prefix}.2", f"{self.prefix}.3")
        self._netem = False
        self.created = False

    def create(self) -> None:
        _run("ip", "netns", "add", self.name)
        self.created = True
        _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.unit_if)
        _run("ip", "link", "set", self.unit_if, "netns", self.name)
        _run("ip", "addr", "add", f"{self.rig_addr}/24", "dev", self.host_if)
        _run("ip", "link", "set", self.host_if, "up")
        for cmd in (
            ("addr", "add", f"{self.device_addr}/24", "dev", self.unit_if),
            ("addr", "add", f"{self.control_addr}/24", "dev", self.unit_if),
            ("link", "set", self.unit_if, "up"),
            ("link", "set", "lo", "up"),
        ):
            _run("ip", "-n", self.name, *cmd)

    def exec_prefix(self) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.name}"]

    def _nft(self, script: str) -> None:
        _run("ip", "netns", "exec", self.name, "nft", "-f", "-", input=script)

    def fault(self, mode: str, loss: float, delay: float) -> None:
        self.heal()
        d = self.device_addr
        if mode == "partition":
            rule_in, rule_out = f"ip daddr {d} drop", f"ip saddr {d} drop"
        elif mode == "loss":
            n = max(0, min(100, round(loss)))
            if n >= 100:  # nft refuses "mod 100 < 100"; it is a partition anyway
                rule_in, rule_out = f"ip daddr {d} drop", f"ip saddr {d} drop"
            elif n <= 0:
                rule_in, rule_out = f"ip daddr {d} counter", f"ip saddr {d} counter"
            else:
                rule_in = f"ip daddr {d} numgen random mod 100 < {n} drop"
                rule_out = f"ip saddr {d} numgen random mod 100 < {n} drop"
        elif mode == "delay":
            res = _run("ip", "netns", "exec", self.name, "tc", "qdisc", "add", "dev",
                       self.unit_if, "root", "netem", "delay", f"{int(delay * 1000)}ms",
                       check=False)
            if res.returncode:
                raise Unsupported("network delay needs sch_netem, which this kernel lacks ("
                                  + res.stderr.strip() + ")")
            self._netem = True
            return
        else:
            raise ValueError(mode)
        self._nft(
            f"table inet {TABLE} {{\n"
            f"  chain in {{ type filter hook input priority 0; {rule_in}; }}\n"
            f"  chain out {{ type filter hook output priority 0; {rule_out}; }}\n"
            f"}}\n")

    def heal(self) -> None:
        _run("ip", "netns", "exec", self.name, "nft", "delete", "table", "inet", TABLE,
             check=False)
        if self._netem:
            _run("ip", "netns", "exec", self.name, "tc", "qdisc", "del", "dev", self.unit_if,
                 "root", check=False)
            self._netem = False

    def close(self) -> None:
        if self.created:
            _run("ip", "link", "del", self.host_if, check=False)
            _run("ip", "netns", "del", self.name, check=False)
            self.created = False
