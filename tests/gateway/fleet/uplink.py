"""A real uplink for the shipper tests: the central server runs in a network namespace
of its own, reached from the host through a veth pair, and the link can be cut.

``Uplink.cut()`` loads an nftables table *inside the namespace* that drops every packet
in and out: the link goes silent as a dead radio link does (no RST, no ICMP), so the
client's TCP connection stalls and only rclone's I/O timeout ends the transfer.
``restore()`` deletes that table. The host's own firewall is never touched.

Invariants: names carry a random tag (helpers and CI jobs may run at once); the
namespace, and with it both veth ends and the nft table, is deleted on ``close()``; a
process started by :meth:`popen` is ``ip netns exec``'s own pid (it execs), so it can be
killed directly. Needs root (CAP_NET_ADMIN) and iproute2 + nftables (scripts/test).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import secrets
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.harness.wait import until


def _run(*cmd: str, stdin: str | None = None) -> None:
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


class Uplink:
    """Namespace ``ns`` at ``server_ip``; the host side of the veth is ``host_ip``."""

    TABLE = "uplink_cut"

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.ns = f"gwfleet-{tag}"
        self.host_if, self.ns_if = f"gwf{tag}h", f"gwf{tag}n"  # < 16 characters
        net = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(256)}"
        base = 4 * secrets.randbelow(64)
        self.host_ip, self.server_ip = f"{net}.{base + 1}", f"{net}.{base + 2}"
        _run("ip", "netns", "add", self.ns)
        try:
            _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if,
                 "netns", self.ns)
            _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _run("ip", "link", "set", self.host_if, "up")
            _run("ip", "-n", self.ns, "addr", "add", f"{self.server_ip}/30", "dev", self.ns_if)
            _run("ip", "-n", self.ns, "link", "set", self.ns_if, "up")
            _run("ip", "-n", self.ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def popen(self, cmd: list[str], **kwargs: Any) -> subprocess.Popen[str]:
        """``cmd`` started inside the namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.ns, *cmd], text=True, **kwargs)

    def cut(self) -> None:
        """Every packet in and out of the namespace is dropped from now on."""
        rules = (
            f"table inet {self.TABLE} {{\n"
            "  chain input { type filter hook input priority -400; policy drop; }\n"
            "  chain output { type filter hook output priority -400; policy drop; }\n"
            "}\n"
        )
        _run("ip", "netns", "exec", self.ns, "nft", "-f", "-", stdin=rules)

    def restore(self) -> None:
        _run("ip", "netns", "exec", self.ns, "nft", "delete", "table", "inet", self.TABLE)

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=30)


class Sshd:
    """Debian's OpenSSH ``sshd`` in ``uplink``'s namespace: public-key login only, no
    shell (``ForceCommand internal-sftp``), SFTP paths relative to ``root``. The client
    key is ``client_key``; ``user`` is whoever runs the test (sshd authenticates only
    that account when not root, and root logs in by key only)."""

    PORT = 2222  # the namespace is new: every port is free

    def __init__(self, root: Path, workdir: Path, uplink: Uplink) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        host_key, self.client_key = workdir / "ssh_host_ed25519_key", workdir / "client_key"
        for key in (host_key, self.client_key):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        keys = workdir / "authorized_keys"
        keys.write_text(Path(f"{self.client_key}.pub").read_text())
        self.user, self.host, self.port = getpass.getuser(), uplink.server_ip, self.PORT
        config = workdir / "sshd_config"
        config.write_text(
            f"ListenAddress {self.host}:{self.port}\nHostKey {host_key}\nPidFile none\n"
            f"AuthorizedKeysFile {keys}\nPubkeyAuthentication yes\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
            "PermitRootLogin prohibit-password\nStrictModes no\nLogLevel INFO\n"
            f"Subsystem sftp internal-sftp -d {root}\nForceCommand internal-sftp -d {root}\n"
        )
        # sshd's privilege separation directory (Debian's package creates it at boot)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self.log = workdir / "sshd.log"
        with self.log.open("w") as log:  # its own group: the per-session children too
            self.proc = uplink.popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
                                     stderr=log, start_new_session=True)

        def listening() -> bool:
            assert self.proc.poll() is None, f"sshd ended: {self.log.read_text()}"
            return f"Server listening on {self.host} port {self.port}" in self.log.read_text()

        try:
            until("sshd to listen", listening)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
