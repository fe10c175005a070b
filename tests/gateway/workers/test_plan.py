"""The worker plan: names, ports, files and overrides are deterministic; the worker PKI
is made once and verifies; ``workers > 1`` with a configured cluster is refused."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config
from gateway.workers.plan import NodePlan, node_data_dir, worker_name


def test_worker_names() -> None:
    assert worker_name("edge1@10.0.0.5", 0) == "edge1-w0@10.0.0.5"
    assert worker_name("plain", 3) == "plain-w3"


def _config(tmp_path: Path, **env: str) -> NodePlan:
    environ = {
        "GATEWAY_NODE__WORKERS": "3",
        "GATEWAY_NODE__DATA_DIR": str(tmp_path / "data"),
        "GATEWAY_CLUSTER__BIND": "0.0.0.0:6000",
        "GATEWAY_API__BIND": "127.0.0.1:18100",
        **env,
    }
    return NodePlan.of(load_config(None, environ))


def test_environment_of_each_worker(tmp_path: Path) -> None:
    plan = _config(tmp_path)
    assert [w.cluster_port for w in plan.workers] == [6000, 6001, 6002]
    env = plan.environment(1)
    assert env["GATEWAY_NODE__NAME"] == "gateway-w1@127.0.0.1"
    assert env["GATEWAY_NODE__WORKERS"] == "1"
    assert env["GATEWAY_NODE__DATA_DIR"] == str(tmp_path / "data" / "worker-1")
    # worker 0 keeps the node's data_dir: one process -> several (and back) keeps its store
    assert plan.environment(0)["GATEWAY_NODE__DATA_DIR"] == str(tmp_path / "data")
    assert node_data_dir(tmp_path / "data" / "worker-1", 1) == tmp_path / "data"
    assert node_data_dir(tmp_path / "data", 0) == tmp_path / "data"
    assert node_data_dir(tmp_path / "data", None) == tmp_path / "data"
    assert env["GATEWAY_CLUSTER__BIND"] == "127.0.0.1:6001"
    assert env["GATEWAY_CLUSTER__SEEDS"] == (
        "gateway-w0@127.0.0.1:6000,gateway-w2@127.0.0.1:6002"
    )
    assert env["GATEWAY_API__BIND"] == "127.0.0.1:18101"
    assert env["GATEWAY_API__TOKEN_FILE"] == str(tmp_path / "data" / "api.token")
    # a worker's configuration is valid: the cluster is on, workers back to 1
    config = load_config(None, {**env, "GATEWAY_LISTENERS__TCP__DEFAULT__BIND": "127.0.0.1:1"})
    assert config.cluster.enable and config.node.workers == 1
    assert _config(tmp_path, GATEWAY_API__BIND="127.0.0.1:0").environment(2)[
        "GATEWAY_API__BIND"] == "127.0.0.1:0"
    assert "GATEWAY_API__TOKEN_FILE" not in _config(
        tmp_path, GATEWAY_API__TOKEN="a-token-of-twenty-chars").environment(0)


def test_pki_made_once_and_verifies(tmp_path: Path) -> None:
    plan = _config(tmp_path)
    plan.ensure_pki()
    d = plan.pki_dir
    before = (d / "gateway-w2@127.0.0.1.crt").read_bytes()
    plan.ensure_pki()  # a restart reuses them
    assert (d / "gateway-w2@127.0.0.1.crt").read_bytes() == before
    assert (d / "gateway-w0@127.0.0.1.key").stat().st_mode & 0o077 == 0
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(d / "ca.crt"))
    ctx.load_cert_chain(d / "gateway-w0@127.0.0.1.crt", d / "gateway-w0@127.0.0.1.key")


def test_workers_refused_with_a_cluster(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="workers > 1 cannot be combined"):
        load_config(None, {"GATEWAY_NODE__WORKERS": "2", "GATEWAY_CLUSTER__ENABLE": "true"})
    with pytest.raises(ConfigError, match=r"node\.workers"):
        load_config(None, {"GATEWAY_NODE__WORKERS": "0"})
