"""A real multi-worker ``gatewayd`` (``node.workers = N``) on free loopback ports.

Configured only through ``GATEWAY_*`` variables and run as a
:class:`tests.harness.gatewayd.GatewaydProcess`; ``NOTIFY_SOCKET`` points at a datagram
socket of the test, so what the supervisor tells "systemd" is recorded (readiness is
therefore every worker meshed, polled through the API). Worker ``I``'s management API is
on ``api_port + I``. Every wait is a bounded poll of a condition.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.gateway.cluster.harness import WAIT, Client, wait_until
from tests.harness.gatewayd import (
    GatewaydProcess,
    NotifySocket,
    free_port,
    gatewayd_command,
    gatewayd_env,
)
from tests.harness.gatewayd import free_port_run as free_ports


class WorkerNode:
    """The supervisor process; ``worker(i)`` gives a handle on worker ``i``."""

    def __init__(self, workdir: Path, workers: int = 2, extra: dict[str, str] | None = None,
                 config: str | None = None) -> None:
        self.workdir = workdir
        self.config_args: list[str] = []
        if config is not None:
            (workdir / "gateway.toml").write_text(config)
            self.config_args = ["--config", str(workdir / "gateway.toml")]
        self.n = workers
        self.mqtt_port = free_port()
        self.api_port = free_ports(workers)
        self.cluster_port = free_ports(workers)
        self.extra = dict(extra or {})
        self.process: GatewaydProcess | None = None
        self.killed = False  # the test killed the supervisor itself
        self.notify = NotifySocket()

    @property
    def env(self) -> dict[str, str]:
        return {
            "GATEWAY_NODE__NAME": "multi@127.0.0.1",
            "GATEWAY_NODE__WORKERS": str(self.n),
            "GATEWAY_NODE__DATA_DIR": str(self.workdir / "data"),
            "GATEWAY_LISTENERS__TCP__DEFAULT__BIND": f"127.0.0.1:{self.mqtt_port}",
            "GATEWAY_API__BIND": f"127.0.0.1:{self.api_port}",
            "GATEWAY_CLUSTER__BIND": f"127.0.0.1:{self.cluster_port}",
            "GATEWAY_CLUSTER__HEARTBEAT_INTERVAL": "0.25s",
            "GATEWAY_CLUSTER__HEARTBEAT_TIMEOUT": "4s",
            "GATEWAY_CLUSTER__RECONNECT_MAX": "0.5s",
            "GATEWAY_SYS_TOPICS__SYS_MSG_INTERVAL": "0",
            "GATEWAY_SYS_TOPICS__SYS_HEARTBEAT_INTERVAL": "0",
            "NOTIFY_SOCKET": self.notify.name,
            "WATCHDOG_USEC": "2000000",
            **self.extra,
        }

    @property
    def log_path(self) -> Path:
        return self.workdir / "gatewayd.log"

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc if self.process is not None else None

    def start(self) -> WorkerNode:
        for attempt in range(3):
            self.log_path.unlink(missing_ok=True)  # the log of this attempt only
            self.process = GatewaydProcess(
                self.workdir, gatewayd_env(self.env),
                command=gatewayd_command(*self.config_args),
                ready=self.ready, ready_timeout=120, what="every worker ready and meshed",
            )
            try:
                self.process.start()
                return self
            except RuntimeError:
                # a port picked free was taken meanwhile (by another test's connection):
                # the node refuses to start (exit 1); pick new ports
                if attempt == 2 or "address already in use" not in self.log():
                    raise
                self.process.stop()
                self.mqtt_port = free_port()
                self.api_port = free_ports(self.n)
                self.cluster_port = free_ports(self.n)
        return self

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"gatewayd exited {self.proc.returncode}:\n{self.log()}")
        if self.n == 1:  # one process, no cluster
            return self.http(0, "GET", "/status", auth=False)[0] == 200
        return all(self.worker_meshed(i) for i in range(self.n))

    def worker_meshed(self, i: int) -> bool:
        members = [m for m in self.cluster(i)["members"] if m["node"] != self.worker_name(i)]
        return len(members) == self.n - 1 and all(m["status"] == "up" for m in members)

    def stop(self) -> int | None:
        """SIGTERM and the supervisor's exit status (or the one it already had)."""
        code = self.process.stop(60) if self.process is not None else None
        self.notify.close()
        return code

    def log(self) -> str:
        return self.process.log() if self.process is not None else ""

    # ------------------------------------------------------------ workers

    def worker_name(self, i: int) -> str:
        return f"multi-w{i}@127.0.0.1"

    def worker_pids(self) -> list[int]:
        assert self.proc is not None
        pid = self.proc.pid
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]

    def worker_pid(self, i: int) -> int:
        for pid in self.worker_pids():
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if b"--worker" in args and args[args.index(b"--worker") + 1] == str(i).encode():
                return pid
        raise KeyError(i)

    def kill_worker(self, i: int) -> int:
        pid = self.worker_pid(i)
        os.kill(pid, signal.SIGKILL)
        return pid

    @property
    def token(self) -> str:
        return (self.workdir / "data" / "api.token").read_text().strip()

    def http(self, i: int, method: str, path: str, *, auth: bool = True) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {self.token}"} if auth else {}
        conn = http.client.HTTPConnection("127.0.0.1", self.api_port + i, timeout=10)
        try:
            conn.request(method, path, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def get(self, i: int, path: str) -> Any:
        status, body = self.http(i, "GET", path)
        assert status == 200, body
        return json.loads(body)

    def cluster(self, i: int) -> dict[str, Any]:
        result: dict[str, Any] = self.get(i, "/api/v5/cluster")
        return result

    def connected(self, i: int) -> set[str]:
        """Client ids connected to worker ``i``."""
        body = self.get(i, "/api/v5/clients?conn_state=connected&limit=1000")
        return {c["clientid"] for c in body["data"]}

    def where(self, clientid: str) -> int | None:
        for i in range(self.n):
            if clientid in self.connected(i):
                return i
        return None

    def routes_of(self, i: int, j: int) -> int:
        """How many route keys worker ``i`` holds for worker ``j``."""
        for m in self.cluster(i)["members"]:
            if m["node"] == self.worker_name(j):
                return int(m["routes"])
        return 0

    def client_on(self, i: int, clientid: str, tries: int = 60, **kwargs: Any) -> Client:
        """A client connected to worker ``i`` (reconnects until the kernel picks it)."""
        for _ in range(tries):
            c = Client(self, clientid, **kwargs)  # type: ignore[arg-type]
            at = wait_until(lambda: self.where(clientid) is not None and (self.where(clientid),),
                            WAIT, f"{clientid} listed")[0]
            if at == i:
                return c
            c.close()
            wait_until(lambda: self.where(clientid) is None, WAIT, f"{clientid} gone")
        raise AssertionError(f"{clientid} never landed on worker {i}")
