"""Real PostgreSQL, Redis, RabbitMQ and InfluxDB servers (Debian's packages) for the sink
tests: each a child process on a free loopback port in a temporary directory, never the
system service. ``start()`` returns when the server answers (bounded poll), ``stop()``
ends it (SIGTERM, SIGKILL after a deadline) and keeps its data directory, so a test can
take a server down and bring it back on the same port with the same data; ``close()``
stops it and removes the directory.

PostgreSQL refuses to run as root: as root the cluster belongs to the ``postgres`` user
(the Debian package makes it) and the server runs as that user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.harness.gatewayd import free_port

__all__ = ["InfluxServer", "PgServer", "RabbitServer", "RedisServer", "Server", "wait_port"]

START_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0


def wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None,
              log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            s.settimeout(1.0)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if proc is not None and proc.poll() is not None:
            text = log.read_text(errors="replace")[-3000:] if log is not None else ""
            raise RuntimeError(f"server exited with {proc.returncode} before listening:\n{text}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on port {port} after {timeout} s")
        time.sleep(0.1)  # bounded poll of another process


class Server:
    """A server process on ``self.port`` with its files under ``self.dir``."""

    name = "server"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"sink-{self.name}-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "server.log"
        self.user: str | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def environ(self) -> dict[str, str]:
        return dict(os.environ)

    def ready(self) -> None:
        wait_port(self.port, START_TIMEOUT, self.proc, self.log)

    def start(self) -> Server:
        assert self.proc is None
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.dir, env=self.environ(), user=self.user, start_new_session=True,
            )
        try:
            self.ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(STOP_TIMEOUT)
        # children of the server's session (workers) go with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def make_pki(directory: Path) -> Path:
    """A CA (``ca.crt``) and a server certificate ``server.crt``/``.key`` for 127.0.0.1."""
    from gateway.security.pki import init_ca, issue

    init_ca(directory)
    issue(directory, "server", sans=["IP:127.0.0.1", "DNS:localhost"])
    return directory


class PgServer(Server):
    """PostgreSQL (``postgres -D``): user ``gateway`` with a password over TCP, with or
    without TLS (``ssl = on``; the CA is ``pki/ca.crt``)."""

    name = "postgresql"
    password = "pg-secret"
    database = "iot"

    def __init__(self) -> None:
        super().__init__()
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
        assert bins, "postgresql is not installed (apt-get install postgresql)"
        self.bin = Path(bins[-1])
        self.data = self.dir / "data"
        if os.geteuid() == 0:
            self.user = "postgres"
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.pki = make_pki(self.dir / "pki")
        if self.user is not None:
            pw = pwd.getpwnam(self.user)
            for f in (self.pki, *self.pki.iterdir()):
                os.chown(f, pw.pw_uid, pw.pw_gid)
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        if self.user is not None:
            os.chown(pwfile, pwd.getpwnam(self.user).pw_uid, -1)
        subprocess.run(
            [str(self.bin / "initdb"), "-D", str(self.data), "-U", "gateway", "--pwfile",
             str(pwfile), "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8",
             "--no-sync"],
            check=True, capture_output=True, user=self.user, cwd=self.dir, timeout=120,
        )

    def command(self) -> list[str]:
        return [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
                "-k", str(self.dir), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                "-c", "max_connections=20", "-c", "shared_buffers=16MB", "-c", "ssl=on",
                "-c", f"ssl_cert_file={self.pki}/server.crt",
                "-c", f"ssl_key_file={self.pki}/server.key"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(STOP_TIMEOUT)
        super().stop()

    def ready(self) -> None:
        super().ready()
        deadline = time.monotonic() + START_TIMEOUT
        while subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p",
                              str(self.port)], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "postgres not ready"
            time.sleep(0.1)  # bounded poll

    def dsn(self, database: str | None = None) -> str:
        return (f"host=127.0.0.1 port={self.port} user=gateway password={self.password} "
                f"dbname={database or self.database}")

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL through the local socket (trust), answer its unaligned output."""
        r = subprocess.run(
            [str(self.bin / "psql"), "-h", str(self.dir), "-p", str(self.port), "-U",
             "gateway", "-d", database, "-At", "-v", "ON_ERROR_STOP=1", "-c", sql],
            capture_output=True, text=True, timeout=60, user=self.user,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout


class RedisServer(Server):
    """redis-server with a password, plain on ``port`` and TLS on ``tls_port``."""

    name = "redis"
    password = "redis-secret"

    def __init__(self) -> None:
        super().__init__()
        self.tls_port = free_port()
        self.pki = make_pki(self.dir / "pki")

    def command(self) -> list[str]:
        p = self.pki
        return ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--tls-port", str(self.tls_port), "--tls-cert-file", f"{p}/server.crt",
                "--tls-key-file", f"{p}/server.key", "--tls-ca-cert-file", f"{p}/ca.crt",
                "--tls-auth-clients", "no",
                "--dir", str(self.dir), "--save", "", "--appendonly", "yes",
                "--appendfsync", "always", "--requirepass", self.password,
                "--daemonize", "no", "--logfile", ""]

    def cli(self, *args: str) -> str:
        r = subprocess.run(["redis-cli", "-p", str(self.port), "--no-auth-warning", "-a",
                            self.password, *args], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout


class RabbitServer(Server):
    """RabbitMQ with its own epmd on free ports; user guest/guest allowed from loopback."""

    name = "rabbitmq"

    def __init__(self) -> None:
        super().__init__()
        self.epmd_port = free_port()
        self.dist_port = free_port()
        self.node = f"sinktest{self.port}@localhost"
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\nloopback_users = none\n"
            "log.console = true\nlog.file = false\n")
        (self.dir / "enabled_plugins").write_text("[].\n")
        self.epmd: subprocess.Popen[bytes] | None = None

    def environ(self) -> dict[str, str]:
        d = str(self.dir)
        return {
            **os.environ, "HOME": d, "RABBITMQ_MNESIA_BASE": f"{d}/mnesia",
            "RABBITMQ_LOG_BASE": f"{d}/log", "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port), "RABBITMQ_CONFIG_FILE": f"{d}/rabbitmq",
            "RABBITMQ_ENABLED_PLUGINS_FILE": f"{d}/enabled_plugins",
            "RABBITMQ_PID_FILE": f"{d}/pid", "RABBITMQ_CONF_ENV_FILE": f"{d}/env.conf",
            "RABBITMQ_ADVANCED_CONFIG_FILE": f"{d}/advanced.config",
        }

    def command(self) -> list[str]:
        return ["/usr/lib/rabbitmq/bin/rabbitmq-server"]

    def start(self) -> Server:
        if self.epmd is None:
            self.epmd = subprocess.Popen(["epmd", "-port", str(self.epmd_port)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
            wait_port(self.epmd_port, 30, self.epmd)
        return super().start()

    def ready(self) -> None:
        super().ready()
        deadline = time.monotonic() + START_TIMEOUT
        while b"completed with" not in self.log.read_bytes():
            assert time.monotonic() < deadline, "rabbitmq did not finish starting"
            assert self.proc is not None and self.proc.poll() is None, \
                self.log.read_text(errors="replace")[-3000:]
            time.sleep(0.1)  # bounded poll

    def close(self) -> None:
        self.stop()
        if self.epmd is not None:
            self.epmd.kill()
            self.epmd.wait(STOP_TIMEOUT)
            self.epmd = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"


class InfluxServer(Server):
    """InfluxDB 1.x (``influxd -config``), HTTP on ``port``; database ``sinkdb``."""

    name = "influxdb"
    database = "sinkdb"

    def __init__(self) -> None:
        super().__init__()
        self.rpc_port = free_port()
        d = self.dir
        (d / "influxdb.conf").write_text(f"""
reporting-disabled = true
bind-address = "127.0.0.1:{self.rpc_port}"
[meta]
  dir = "{d}/meta"
[data]
  dir = "{d}/data"
  wal-dir = "{d}/wal"
  query-log-enabled = false
[monitor]
  store-enabled = false
[http]
  bind-address = "127.0.0.1:{self.port}"
  log-enabled = false
[continuous_queries]
  enabled = false
""")

    def command(self) -> list[str]:
        return ["influxd", "-config", str(self.dir / "influxdb.conf")]

    def ready(self) -> None:
        super().ready()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/ping", timeout=2):
                    return
            except OSError:
                assert time.monotonic() < deadline, "influxd not ready"
                time.sleep(0.1)  # bounded poll

    def query(self, q: str, db: str | None = None) -> Any:
        import json

        params = {"q": q, **({"db": db} if db else {})}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/query",
                                     data=urllib.parse.urlencode(params).encode())
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())
