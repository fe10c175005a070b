"""The brokers under test, each started by the harness on a free loopback port.

- ``gatewayd``: this project, ``<repo>/.venv/bin/python -m gateway.cli.gatewayd`` with a
  generated TOML file (defaults, except the bind address and a temporary data directory).
- ``mosquitto``: Debian's package (installed with apt-get when missing), generated config:
  one listener on 127.0.0.1, ``allow_anonymous true``, ``persistence false``,
  ``max_queued_messages 0`` (unbounded, as gatewayd's ``max_mqueue_len = 0`` here),
  defaults otherwise.
- ``amqtt``: PyPI's amqtt 0.12 in its own virtualenv ``bench/.venv-amqtt`` (created when
  missing: amqtt pins ``websockets==15.0.1``, which would break gatewayd's WebSocket
  listener in the project's environment); generated YAML config: one TCP listener on
  127.0.0.1 and the anonymous-authentication plugin only.

Each :class:`Broker` is one process whose pid is the broker itself (no shell in between),
so ``/proc/<pid>/status`` (VmRSS) and ``/proc/<pid>/stat`` (CPU ticks) describe it. It
runs as a :class:`tests.harness.gatewayd.GatewaydProcess` (the tests' harness: free
ports, clean stop), ready when it answers an MQTT CONNECT (the same test for every
broker).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.procstat import CLK_TCK, cpu_seconds
from tests.harness.compiled import SOURCES, compiled_tree
from tests.harness.gatewayd import HOST, GatewaydProcess, free_port, free_port_run

__all__ = ["BROKERS", "HOST", "Broker", "free_port", "free_port_run", "running", "setup"]

REPO = Path(__file__).resolve().parents[1]
AMQTT_VENV = REPO / "bench" / ".venv-amqtt"
AMQTT_REQUIREMENT = "amqtt==0.12.*"
READY_TIMEOUT = 20.0


def mqtt_ping(host: str, port: int, client_id: str, timeout: float = 2.0) -> None:
    """CONNECT, wait for CONNACK, DISCONNECT: the broker is up and speaks MQTT."""
    from bench import wire

    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(wire.connect(client_id))
        data = b""
        while len(data) < 4:
            chunk = s.recv(4 - len(data))
            if not chunk:
                raise ConnectionError("closed before CONNACK")
            data += chunk
        if data[0] != 0x20 or data[3] != 0:
            raise ConnectionError(f"bad CONNACK {data!r}")
        s.sendall(wire.DISCONNECT)


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]
    return busy / CLK_TCK


def _say(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ setup


def mosquitto_path() -> str | None:
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)),
        None,
    )


def ensure_mosquitto() -> str:
    path = mosquitto_path()
    if path:
        return path
    _say("installing Debian package mosquitto")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        [*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "mosquitto"],
        check=True,
        env=env,
    )
    # Debian's package starts a system mosquitto on port 1883; we never use that port.
    path = mosquitto_path()
    if not path:
        raise RuntimeError("mosquitto installed but not found")
    return path


def ensure_amqtt() -> Path:
    """The bin directory of ``bench/.venv-amqtt`` (``python`` and ``amqtt``), created and
    amqtt installed when missing. Never the project's environment: amqtt 0.12 pins
    ``websockets==15.0.1``, and gatewayd's WebSocket listener needs websockets 16 or later
    (installing amqtt there downgraded it and broke the WebSocket tests)."""
    python = AMQTT_VENV / "bin" / "python"
    if (AMQTT_VENV / "bin" / "amqtt").exists():
        return python.parent
    _say(f"creating {AMQTT_VENV} and installing {AMQTT_REQUIREMENT} (once)")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(AMQTT_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", AMQTT_REQUIREMENT], check=True)
    return python.parent


# ------------------------------------------------------------------------------ brokers


_CERT: list[tuple[Path, Path]] = []


def bench_certificate() -> tuple[Path, Path]:
    """A self-signed ECDSA P-256 certificate and key for 127.0.0.1 (made once per
    harness with the openssl CLI, removed at exit): every broker's TLS listener uses it."""
    if not _CERT:
        d = Path(tempfile.mkdtemp(prefix="bench-tls-"))
        atexit.register(shutil.rmtree, d, ignore_errors=True)
        cert, key = d / "cert.pem", d / "key.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-keyout", str(key),
             "-out", str(cert)],
            check=True, capture_output=True,
        )
        _CERT.append((cert, key))
    return _CERT[0]


class Broker:
    name = "broker"
    # CPUs the broker process (all its threads) is pinned to with taskset, e.g. "0";
    # None: not pinned (bench.run sets it for the single-process brokers)
    cpus: str | None = None
    pinnable = True  # False: a multi-process broker that must spread over the cores

    def __init__(self, tls: bool = False) -> None:
        self.port = free_port()
        self.tls = tls  # also open a TLS listener on tls_port (bench_certificate)
        self.tls_port = 0
        self.host = HOST
        self.tmp = Path(tempfile.mkdtemp(prefix=f"bench-{self.name}-"))
        self.log_path = self.tmp / "broker.log"
        self.process: GatewaydProcess | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_offset = 0

    # to override
    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    @classmethod
    def version(cls) -> str:
        raise NotImplementedError

    # lifecycle

    def start(self) -> None:
        self.port = free_port()
        if self.tls:
            self.tls_port = free_port()
        self.launch()

    def full_command(self) -> list[str]:
        cmd = self.command()
        if self.cpus is not None and self.pinnable:
            # taskset execs the broker: the pid stays the broker's, and every thread it
            # starts inherits the affinity
            return ["taskset", "-c", self.cpus, *cmd]
        return cmd

    def launch(self) -> None:
        """Start the broker on ``self.port`` and wait until it answers."""
        self.process = GatewaydProcess(
            self.tmp, self.env(), command=self.full_command(), log_path=self.log_path,
            ready=self._answers,
            ready_timeout=READY_TIMEOUT, what=self.name,
        )
        self.process.start()
        self.proc = self.process.proc
        self.log_offset = self.process.log_offset

    def _answers(self) -> bool:
        mqtt_ping(self.host, self.port, "bench-ready")  # raises until it answers
        return True

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(10)
        self.process = None
        self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # measurements

    def rss_kib(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def cpu_seconds(self) -> float:
        return cpu_seconds(f"/proc/{self.pid}/stat")

    def log_since_start(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_since_start().splitlines()[-lines:])


class Gatewayd(Broker):
    name = "gatewayd"
    # Source tree the broker runs from: the working tree, or an extracted commit (see
    # use_gatewayd_commit); the project's .venv provides the dependencies either way.
    src: Path = REPO
    source: str = ""
    # configuration overrides as GATEWAY_* variables (bench.run --gatewayd-set)
    settings: dict[str, str] = {}  # noqa: RUF012 - set once by bench.run, for every run

    # Optional sections, each written only when the version under test knows it (an
    # unknown key is an error): the management API moves off its fixed port 18083 so that
    # it never collides with another gatewayd on the machine.
    # [mqtt] max_mqueue_len = 0: unbounded offline/in-flight queues, like mosquitto's
    # max_queued_messages 0 below (issue 23: both unlimited, so no broker wins by dropping)
    OPTIONAL_CONFIG: tuple[str, ...] = (
        '[api]\nbind = "127.0.0.1:0"\n',
        "[mqtt]\nmax_mqueue_len = 0\n",
    )
    _supported: dict[tuple[Path, str], bool] = {}  # noqa: RUF012 - a cache shared on purpose

    def _gatewayd(self, conf: Path, *extra: str) -> list[str]:
        python = REPO / ".venv" / "bin" / "python"
        exe = str(python if python.exists() else sys.executable)
        return [exe, "-m", "gateway.cli.gatewayd", "--config", str(conf), *extra]

    def _accepts(self, section: str) -> bool:
        key = (self.src, section)
        if key not in self._supported:
            probe = self.tmp / "probe.toml"
            probe.write_text(section)
            check = subprocess.run(  # in self.tmp: python -m puts the cwd first on sys.path
                self._gatewayd(probe, "--check"),
                cwd=self.tmp,
                env=self.env(),
                capture_output=True,
                check=False,
            )
            self._supported[key] = check.returncode == 0
        return self._supported[key]

    def command(self) -> list[str]:
        conf = self.tmp / "gateway.toml"
        conf.write_text(
            "[node]\n"
            'name = "bench@127.0.0.1"\n'
            f'data_dir = "{self.tmp / "data"}"\n'
            "[listeners.tcp.default]\n"
            f'bind = "{self.host}:{self.port}"\n'
            + "".join(section for section in self.OPTIONAL_CONFIG if self._accepts(section))
            + self._tls_section()
        )
        return self._gatewayd(conf)

    def _tls_section(self) -> str:
        if not self.tls:
            return ""
        cert, key = bench_certificate()
        return (
            f'[listeners.ssl.default]\nbind = "{self.host}:{self.tls_port}"\n'
            f'certfile = "{cert}"\nkeyfile = "{key}"\n'
        )

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env["PYTHONPATH"] = str(self.src)
        env.update(self.settings)
        return env

    @classmethod
    def version(cls) -> str:
        python = REPO / ".venv" / "bin" / "python"
        out = subprocess.run(
            [
                str(python if python.exists() else sys.executable),
                "-c",
                "import gateway, uvloop; print(gateway.__version__, uvloop.__version__)",
            ],
            capture_output=True,
            text=True,
            cwd=cls.src,
            env=dict(os.environ, PYTHONPATH=str(cls.src)),
            check=False,
        ).stdout.split()
        version = f"{out[0]} (uvloop {out[1]})" if len(out) == 2 else "?"
        return f"{version}, {cls.source or working_tree_source()}"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    ).stdout.strip()


def working_tree_source() -> str:
    commit = _git("rev-parse", "--short", "HEAD") or "?"
    dirty = _git("status", "--porcelain", "--", "gateway", "protocols")
    return f"working tree at {commit}" + (" with uncommitted changes" if dirty else "")


def use_gatewayd_commit(rev: str) -> str:
    """Run gatewayd from ``rev`` (its sources, :data:`SOURCES`: gateway/, protocols/ and
    what a compiled build needs, extracted with git archive into a temporary directory)
    instead of the working tree; returns the commit's short id."""
    commit = _git("rev-parse", "--short", f"{rev}^{{commit}}")
    if not commit:
        raise RuntimeError(f"unknown revision {rev!r}")
    dest = Path(tempfile.mkdtemp(prefix=f"bench-gatewayd-{commit}-"))
    present = [name for name in SOURCES if subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}:{name}"], capture_output=True,
    ).returncode == 0]  # an older commit may lack setup.py or mypyc.ini
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, *present],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    atexit.register(shutil.rmtree, dest, ignore_errors=True)
    Gatewayd.src = dest
    Gatewayd.source = f"commit {commit}"
    return commit


class Mosquitto(Broker):
    name = "mosquitto"
    # mosquitto.conf lines added for every run (bench.run --mosquitto-set), e.g.
    # "set_tcp_nodelay true"
    extra_lines: list[str] = []  # noqa: RUF012 - set once by bench.run, for every run

    def command(self) -> list[str]:
        conf = self.tmp / "mosquitto.conf"
        lines = [
            "persistence false",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "max_queued_messages 0",
            f"listener {self.port} {self.host}",
            "allow_anonymous true",
        ]
        if self.tls:
            cert, key = bench_certificate()
            lines += [
                f"listener {self.tls_port} {self.host}",
                f"certfile {cert}",
                f"keyfile {key}",
            ]
        lines += self.extra_lines
        if os.geteuid() == 0:
            lines.insert(0, "user root")
        conf.write_text("\n".join(lines) + "\n")
        return [ensure_mosquitto(), "-c", str(conf)]

    @classmethod
    def version(cls) -> str:
        path = mosquitto_path()
        if not path:
            return "?"
        out = subprocess.run([path, "-h"], capture_output=True, text=True, check=False).stdout
        m = re.search(r"version (\S+)", out)
        return m.group(1) if m else "?"


class Amqtt(Broker):
    name = "amqtt"

    def command(self) -> list[str]:
        bindir = ensure_amqtt()
        conf = self.tmp / "amqtt.yaml"
        conf.write_text(
            "listeners:\n"
            "  default:\n"
            "    type: tcp\n"
            f"    bind: {self.host}:{self.port}\n"
            + self._tls_listener()
            + "plugins:\n"
            "  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
            "    allow_anonymous: true\n"
        )
        return [str(bindir / "python"), str(bindir / "amqtt"), "-c", str(conf)]

    def _tls_listener(self) -> str:
        if not self.tls:
            return ""
        cert, key = bench_certificate()
        return (
            "  tls:\n"
            "    type: tcp\n"
            f"    bind: {self.host}:{self.tls_port}\n"
            "    ssl: true\n"
            f"    certfile: {cert}\n"
            f"    keyfile: {key}\n"
        )

    @classmethod
    def version(cls) -> str:
        python = AMQTT_VENV / "bin" / "python"
        if not python.exists():
            return "?"
        out = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('amqtt'))"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return out or "?"


class GatewaydMemory(Gatewayd):
    """gatewayd with ``[durability] enable = false``: the same broker, memory only, to
    measure what durability costs (bench.scenarios.DURABILITY_SCENARIOS)."""

    name = "gatewayd-memory"
    OPTIONAL_CONFIG = (*Gatewayd.OPTIONAL_CONFIG, "[durability]\nenable = false\n")


class GatewaydExt(Gatewayd):
    """gatewayd with the MQTT extensions busy (docs/mqtt-extensions.md): 10 topic rewrite
    rules that every publish and subscribe is matched against (none matches the bench's
    topics, so all 10 are tried each time: the worst case) and an auto-subscribe topic per
    client (issue 20's bench line: >= 0.9x of plain gatewayd)."""

    name = "gatewayd-ext"
    OPTIONAL_CONFIG = (
        *Gatewayd.OPTIONAL_CONFIG,
        '[[auto_subscribe.topics]]\ntopic = "bench-cmd/${clientid}"\nqos = 1\n'
        + "".join(
            f'[[rewrite]]\naction = "all"\nsource_topic = "ext{i}/+/#"\n'
            f'dest_topic = "rewritten{i}/$1"\nre = "^ext{i}/(.+)$"\n'
            for i in range(10)
        ),
    )


class GatewaydWorkers(Gatewayd):
    """gatewayd with ``[node] workers = 2`` (docs/workers.md): a supervisor and two worker
    processes behind SO_REUSEPORT, meshed over loopback cluster links. CPU and memory are
    the sums over the supervisor and its workers."""

    name = "gatewayd-2w"
    WORKERS = 2
    pinnable = False

    def command(self) -> list[str]:
        cmd = super().command()
        conf = self.tmp / "gateway.toml"
        text = conf.read_text().replace("[node]\n", f"[node]\nworkers = {self.WORKERS}\n", 1)
        cluster = free_port_run(self.WORKERS)
        conf.write_text(text + f'[cluster]\nbind = "127.0.0.1:{cluster}"\n')
        return cmd

    def start(self) -> None:
        super().start()  # one worker answers; wait for the supervisor's "all ready"
        deadline = time.monotonic() + READY_TIMEOUT
        while f"all {self.WORKERS} workers ready" not in self.log_since_start():
            if time.monotonic() > deadline or not self.alive():
                self.stop()
                raise RuntimeError(f"{self.name}: workers not ready:\n{self.log_tail()}")
            time.sleep(0.05)

    def _pids(self) -> list[int]:
        pid = self.pid
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                return [pid, *(int(p) for p in f.read().split())]
        except OSError:
            return [pid]

    def rss_kib(self) -> int:
        total = 0
        for pid in self._pids():
            with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        return total

    def cpu_seconds(self) -> float:
        """The supervisor's and its live workers' CPU (a worker restarted during a run
        would lose its share; the run's log says so)."""
        total = 0.0
        for pid in self._pids():
            with contextlib.suppress(OSError):
                total += cpu_seconds(f"/proc/{pid}/stat")
        return total


class GatewaydWorkersMemory(GatewaydWorkers):
    """``gatewayd-2w`` without durability: the cross-worker QoS 1/2 outbox in memory."""

    name = "gatewayd-2w-memory"
    OPTIONAL_CONFIG = GatewaydMemory.OPTIONAL_CONFIG


class GatewaydCompiled(Gatewayd):
    """gatewayd with its hot path compiled with mypyc (setup.py's HOT_PATH), as the image
    and the Ansible wheelhouse ship it on the build host's arch: a compiled copy of
    ``Gatewayd.src`` (so ``--gatewayd-commit`` applies), built once into the build cache
    (tests.harness.compiled)."""

    name = "gatewayd-compiled"

    def __init__(self, tls: bool = False) -> None:
        type(self).use_compiled()
        super().__init__(tls)

    @classmethod
    def use_compiled(cls) -> None:
        if cls.src is Gatewayd.src:
            cls.src = compiled_tree(Gatewayd.src)
            cls.source = f"{Gatewayd.source or working_tree_source()}, compiled"

    @classmethod
    def version(cls) -> str:
        cls.use_compiled()
        return super().version()


class GatewaydCompiledMemory(GatewaydCompiled):
    """gatewayd-compiled, memory only (``[durability] enable = false``)."""

    name = "gatewayd-compiled-memory"
    OPTIONAL_CONFIG = GatewaydMemory.OPTIONAL_CONFIG


BROKERS: dict[str, type[Broker]] = {
    b.name: b for b in (
        Gatewayd, GatewaydMemory, GatewaydExt, GatewaydWorkers, GatewaydWorkersMemory,
        GatewaydCompiled, GatewaydCompiledMemory, Mosquitto, Amqtt,
    )
}


def setup(names: list[str]) -> None:
    """Install what the chosen brokers need (idempotent)."""
    if "mosquitto" in names:
        ensure_mosquitto()
    if "amqtt" in names:
        ensure_amqtt()


@contextlib.contextmanager
def running(cls: type[Broker]) -> Iterator[Broker]:
    broker = cls()
    try:
        broker.start()
        yield broker
    finally:
        broker.cleanup()
