"""Boot the unit for real: a minimal Debian rootfs (mmdebstrap, cached by a hash of its
inputs) with the project installed in /opt/gateway, booted with
``systemd-nspawn -q --keep-unit --register=no -D ROOTFS --boot``.

Checks: gatewayd reaches READY (active, STATUS= set by sd_notify), ``gatewayctl status``
works inside, a client from outside connects (the container shares the host's network),
``systemctl reload`` re-reads the TLS certificate without a restart, the store's writer
thread gets SCHED_BATCH inside the unit's sandbox, and a hung event loop (SIGSTOP) is
killed by the watchdog and restarted.

Slow (minutes the first time, while the rootfs is built); skipped when not root or when
mmdebstrap / systemd-nspawn are missing or the Debian mirror cannot be reached.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.admin.gatewayd import free_port
from tests.nspawn import Container, base_rootfs, copy_tree, nspawn_run, skip_unless_possible, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
NODE = "nspawn@127.0.0.1"


def build_wheels(dest: Path) -> Path:
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(dest),
                        f"{REPO}[systemd]"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return dest


def server_cert_serial(port: int) -> int:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    from cryptography import x509

    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


@pytest.fixture(scope="module")
def container(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Container, dict[str, int]]]:
    skip_unless_possible()
    base = base_rootfs()
    work = tmp_path_factory.mktemp("nspawn")
    wheels = build_wheels(work / "wheels")
    root = copy_tree(base, work / "root")
    nspawn_run(root, "/bin/sh", "-c",
               "python3 -m venv /opt/gateway && /opt/gateway/bin/pip install -q --no-index "
               "--find-links /wheels 'edge-gateway[systemd]' && "
               "ln -sf /opt/gateway/bin/gatewayctl /usr/local/bin/gatewayctl",
               binds=(f"{wheels}:/wheels",))
    # the unit, its user and directories, installed as docs/operations.md says
    systemd = REPO / "systemd"
    etc = root / "etc/systemd/system"
    shutil.copy(systemd / "gatewayd.service", etc / "gatewayd.service")
    (etc / "multi-user.target.wants").mkdir(exist_ok=True)
    (etc / "multi-user.target.wants/gatewayd.service").symlink_to(
        "/etc/systemd/system/gatewayd.service")
    for kind in ("sysusers.d", "tmpfiles.d"):
        (root / "usr/lib" / kind).mkdir(parents=True, exist_ok=True)
        shutil.copy(systemd / kind / "gateway.conf", root / "usr/lib" / kind / "gateway.conf")
    subprocess.run(["systemd-sysusers", f"--root={root}"], check=True, capture_output=True)
    entry = next(line for line in (root / "etc/passwd").read_text().splitlines()
                 if line.startswith("gateway:"))
    uid, gid = int(entry.split(":")[2]), int(entry.split(":")[3])
    # test drop-in: a quick watchdog, and what this host's hard limit allows
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 1048576 if hard == resource.RLIM_INFINITY else min(1048576, hard)
    (etc / "gatewayd.service.d").mkdir()
    (etc / "gatewayd.service.d/test.conf").write_text(
        f"[Service]\nWatchdogSec=3s\nTimeoutAbortSec=3s\nRestartSec=1s\nLimitNOFILE={nofile}\n")
    ports = {"mqtt": free_port(), "mqtts": free_port(), "api": free_port()}
    conf = root / "etc/gateway"
    conf.mkdir(exist_ok=True)
    from gateway.security.pki import init_ca, issue

    certs = conf / "certs"
    init_ca(certs)
    issue(certs, "server", server=True)
    (conf / "gateway.toml").write_text(f"""
[node]
name = "{NODE}"
data_dir = "/var/lib/gateway"
[listeners.tcp.default]
bind = "127.0.0.1:{ports['mqtt']}"
max_connections = 1000
[listeners.ssl.default]
bind = "127.0.0.1:{ports['mqtts']}"
max_connections = 1000
certfile = "/etc/gateway/certs/server.crt"
keyfile = "/etc/gateway/certs/server.key"
[api]
bind = "127.0.0.1:{ports['api']}"
""")
    for path in [conf, *conf.rglob("*")]:
        os.chown(path, 0, gid)
        path.chmod(0o750 if path.is_dir() else 0o640)
    c = Container(root, work / "console.log")
    try:
        c.boot()
        yield c, {**ports, "uid": uid, "gid": gid}
    finally:
        c.shutdown()


def test_ready_status_and_gatewayctl_inside(container: tuple[Container, dict[str, int]]) -> None:
    c, _ = container
    props = c.show("ActiveState", "SubState", "Type", "StatusText", "User", "NRestarts")
    assert props["ActiveState"] == "active", c.journal()
    assert props["Type"] == "notify" and props["User"] == "gateway"
    # STATUS= only comes from gatewayd's sd_notify, after READY=1
    assert "connections" in props["StatusText"] and "tcp:default" in props["StatusText"]
    r = c.run("gatewayctl", "status")
    assert r.returncode == 0, r.stderr
    assert f"{NODE} (running, standalone)" in r.stdout
    assert "tcp:default" in r.stdout and "ssl:default" in r.stdout
    token = c.run("stat", "-c", "%a %U", "/var/lib/gateway/api.token").stdout.split()
    assert token == ["600", "gateway"]


def test_a_client_from_outside_connects(container: tuple[Container, dict[str, int]]) -> None:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    c, ports = container
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="from-the-host")
    client.connect("127.0.0.1", ports["mqtt"])
    client.loop_start()
    try:
        until("the host's client in gatewayctl",
              lambda: "from-the-host" in c.run("gatewayctl", "clients", "list").stdout, 30)
    finally:
        client.disconnect()
        client.loop_stop()


def test_reload_rereads_certificates_without_a_restart(
    container: tuple[Container, dict[str, int]],
) -> None:
    from gateway.security.pki import issue

    c, ports = container
    before = c.show("MainPID", "NRestarts")
    old = server_cert_serial(ports["mqtts"])
    certs = c.root / "etc/gateway/certs"
    issue(certs, "server", server=True, force=True)
    for name in ("server.crt", "server.key"):
        os.chown(certs / name, 0, ports["gid"])
        (certs / name).chmod(0o640)
    new = int(subprocess.run(["openssl", "x509", "-noout", "-serial", "-in",
                              str(certs / "server.crt")], capture_output=True, text=True,
                             check=True).stdout.split("=")[1], 16) if shutil.which("openssl") \
        else None
    r = c.run("systemctl", "reload", "gatewayd")
    assert r.returncode == 0, r.stderr
    until("the new certificate", lambda: server_cert_serial(ports["mqtts"]) != old, 30)
    if new is not None:
        assert server_cert_serial(ports["mqtts"]) == new
    assert c.show("MainPID", "NRestarts") == before


def test_the_store_writer_thread_gets_sched_batch_inside_the_sandbox(
    container: tuple[Container, dict[str, int]],
) -> None:
    """The unit's sandbox (SystemCallFilter=@system-service, RestrictRealtime=yes) lets
    the store's writer thread take SCHED_BATCH (gateway/store/writer.py): one thread of
    gatewayd has policy 3 (SCHED_BATCH), and the main thread (the event loop) keeps 0."""
    c, _ = container
    pid = c.show("MainPID")["MainPID"]
    r = c.run("sh", "-c", f"cat /proc/{pid}/task/*/stat")
    assert r.returncode == 0, r.stderr
    # /proc/<pid>/task/<tid>/stat: "tid (comm) state ..."; the policy is field 41
    policy = {int(line.split(" ", 1)[0]): int(line.rsplit(")", 1)[1].split()[38])
              for line in r.stdout.splitlines()}
    assert policy[int(pid)] == 0, policy
    assert 3 in policy.values(), policy


def test_a_hung_event_loop_is_restarted_by_the_watchdog(
    container: tuple[Container, dict[str, int]],
) -> None:
    c, _ = container
    before = c.show("MainPID", "NRestarts")
    # SIGSTOP: the loop no longer runs, so no WATCHDOG=1 arrives
    assert c.run("kill", "-STOP", before["MainPID"]).returncode == 0

    def restarted() -> bool:
        now = c.show("MainPID", "NRestarts", "ActiveState", "StatusText")
        return (now["NRestarts"] == str(int(before["NRestarts"]) + 1)
                and now["MainPID"] not in ("0", before["MainPID"])
                and now["ActiveState"] == "active" and "connections" in now["StatusText"])

    until("a watchdog restart", restarted, 90)
    assert "watchdog timeout" in c.run("journalctl", "-u", "gatewayd", "--no-pager").stdout.lower()
    with contextlib.suppress(Exception):
        assert c.run("gatewayctl", "status").returncode == 0
