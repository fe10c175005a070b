"""What each worker process of a multi-worker node is: its name, ports, files, environment.

With ``node.workers = N > 1`` a node is N ``gatewayd --worker I`` processes that form a
private cluster over loopback (docs/workers.md). This module holds the pure part of that
plan; the supervisor (:mod:`gateway.workers.supervisor`) only starts what it says.

Invariants:

- Everything is deterministic from the configuration and ``I``: a restarted worker gets
  the same name, cluster port, data directory and certificate, so its siblings (which
  keep it in ``cluster_members``) find it where it was.
- Worker ``I`` is named ``<local>-w<I>@<host>`` for a node named ``<local>@<host>``
  (``<name>-w<I>`` without ``@``): certificate names allow no ``#``, and cluster seeds are
  ``name@host[:port]``.
- The node's own ``{data_dir}/gateway.db`` holds what every worker shares: the built-in
  users and the banned clients (:func:`node_data_dir`).
- Its cluster link listens on ``127.0.0.1:<cluster.bind port + I>`` (loopback only), its
  data (the SQLite store) is in ``{data_dir}`` for worker 0 and ``{data_dir}/worker-<I>``
  for the others (:func:`worker_data_dir`), the private worker CA and the
  workers' certificates in ``{data_dir}/workers-pki``. The management API of worker
  ``I`` is on ``<api.bind port + I>`` (port 0 stays 0), all with the node's API token.
- A worker's configuration is the node's plus ``GATEWAY_*`` overrides (the environment
  comes after the file), so everything else (listeners, limits, authentication) is the
  same in every worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.admin.tokens import token_path
from gateway.config import GatewayConfig
from gateway.config.schema import parse_bind
from gateway.security import pki

PKI_DIR = "workers-pki"
WORKER_CA_NAME = "gateway workers CA"


def worker_data_dir(data_dir: Path, index: int) -> Path:
    """Worker 0 keeps the node's ``data_dir`` (so going from one process to several, or
    back, keeps its sessions and retained messages); worker I > 0 has
    ``{data_dir}/worker-<I>``."""
    return data_dir if index == 0 else data_dir / f"worker-{index}"


def node_data_dir(own_data_dir: Path, index: int | None) -> Path:
    """The node's ``data_dir`` seen from worker ``index`` (None: a single process).

    The built-in users and the banned clients live there, in the node's ``gateway.db``,
    shared by every worker and ``gatewayctl users``/``ban`` (those stores are made for
    several processes: each reader notices others' commits by ``PRAGMA data_version``).
    """
    own = Path(own_data_dir)
    return own if not index else own.parent


def worker_name(node_name: str, index: int) -> str:
    local, at, host = node_name.partition("@")
    return f"{local}-w{index}@{host}" if at else f"{node_name}-w{index}"


def _with_port(bind: str, offset: int) -> str:
    host, port = parse_bind(bind)
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port + offset if port else 0}"


@dataclass(frozen=True)
class WorkerPlan:
    index: int
    name: str
    cluster_port: int
    data_dir: Path


@dataclass(frozen=True)
class NodePlan:
    """The workers of one node and where their shared files are."""

    config: GatewayConfig
    workers: tuple[WorkerPlan, ...]
    data_dir: Path

    @classmethod
    def of(cls, config: GatewayConfig) -> NodePlan:
        data_dir = Path(config.node.data_dir).absolute()
        base = parse_bind(config.cluster.bind)[1]
        workers = tuple(
            WorkerPlan(
                i,
                worker_name(config.node.name, i),
                base + i,
                worker_data_dir(data_dir, i),
            )
            for i in range(config.node.workers)
        )
        return cls(config, workers, data_dir)

    @property
    def pki_dir(self) -> Path:
        return self.data_dir / PKI_DIR

    def ensure_pki(self) -> None:
        """The private worker CA and a server+client certificate per worker, made once."""
        directory = self.pki_dir
        if not (directory / pki.CA_CERT).exists():
            pki.init_ca(directory, common_name=WORKER_CA_NAME, force=True)
        for w in self.workers:
            if not (directory / f"{w.name}.crt").exists():
                pki.issue(directory, w.name, server=True, client=True, force=True)

    def environment(self, index: int) -> dict[str, str]:
        """The ``GATEWAY_*`` overrides that make worker ``index`` of this node."""
        config = self.config
        me = self.workers[index]
        seeds = [f"{w.name}:{w.cluster_port}" for w in self.workers if w.index != index]
        env = {
            "GATEWAY_NODE__WORKERS": "1",
            "GATEWAY_NODE__NAME": me.name,
            "GATEWAY_NODE__DATA_DIR": str(me.data_dir),
            "GATEWAY_CLUSTER__ENABLE": "true",
            "GATEWAY_CLUSTER__BIND": f"127.0.0.1:{me.cluster_port}",
            "GATEWAY_CLUSTER__ADVERTISE": f"127.0.0.1:{me.cluster_port}",
            "GATEWAY_CLUSTER__DISCOVERY": "static",
            "GATEWAY_CLUSTER__SEEDS": ",".join(seeds),
            "GATEWAY_CLUSTER__RAFT": "false",
            "GATEWAY_CLUSTER__TLS__CERTFILE": str(self.pki_dir / f"{me.name}.crt"),
            "GATEWAY_CLUSTER__TLS__KEYFILE": str(self.pki_dir / f"{me.name}.key"),
            "GATEWAY_CLUSTER__TLS__CACERTFILE": str(self.pki_dir / pki.CA_CERT),
            "GATEWAY_CLUSTER__TLS__VERIFY_NODE_NAME": "true",
            "GATEWAY_API__BIND": _with_port(config.api.bind, index),
        }
        if not config.api.token:  # every worker answers with the node's token
            env["GATEWAY_API__TOKEN_FILE"] = str(token_path(config).absolute())
        return env
