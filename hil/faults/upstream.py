"""A real mosquitto (Debian's /usr/sbin/mosquitto) as the bridge's upstream broker.

It listens on one address of the rig (reachable from the unit), keeps a persistence file
so its queued messages for the rig's upstream collector survive :meth:`stop` (SIGTERM,
which saves the database) and :meth:`start` again on the same port.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Upstream:
    def __init__(self, run_dir: Path, host: str) -> None:
        self.dir = run_dir / "upstream"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.port = free_port(host)
        self.proc: subprocess.Popen[bytes] | None = None
        conf = self.dir / "mosquitto.conf"
        # as root mosquitto drops to user "mosquitto", which cannot write our directory
        user = "user root\n" if os.geteuid() == 0 else ""
        conf.write_text(
            user + f"listener {self.port} {host}\nallow_anonymous true\npersistence true\n"
            f"persistence_location {self.dir}/\nautosave_interval 1\n"
            "max_queued_messages 0\nmax_inflight_messages 100\n"
            f"log_dest file {self.dir}/mosquitto.log\n")
        self.conf = conf

    def start(self, timeout: float = 15.0) -> None:
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection((self.host, self.port), timeout=0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mosquitto exited {self.proc.returncode}") from None
                time.sleep(0.05)
        raise TimeoutError("mosquitto did not listen")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None
