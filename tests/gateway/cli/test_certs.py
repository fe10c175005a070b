"""``gatewayctl certs``: the console script end to end, in temporary directories."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from gateway.cli.gatewayctl import main

GATEWAYCTL = [sys.executable, "-m", "gateway.cli.gatewayctl"]


def ctl(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GATEWAYCTL, *map(str, args)], capture_output=True, text=True, check=False, timeout=60
    )


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_init_ca_and_issue_server_and_client(tmp_path):
    pki = tmp_path / "pki"
    r = ctl("certs", "init-ca", pki)
    assert r.returncode == 0, r.stderr
    assert f"wrote {pki / 'ca.crt'}" in r.stdout
    r = ctl("certs", "issue", pki, "server", "--server", "--san", "edge1.local", "--san", "::1")
    assert r.returncode == 0, r.stderr
    r = ctl("certs", "issue", pki, "dev1", "--client", "--days", "7")
    assert r.returncode == 0, r.stderr
    assert "subject CN=dev1" in r.stdout
    assert sorted(p.name for p in pki.iterdir()) == [
        "ca.crt", "ca.key", "dev1.crt", "dev1.key", "index.txt", "server.crt", "server.key",
    ]
    for key in ("ca.key", "server.key", "dev1.key"):
        assert stat.S_IMODE(os.stat(pki / key).st_mode) == 0o600
    ca = load(pki / "ca.crt")
    server, dev1 = load(pki / "server.crt"), load(pki / "dev1.crt")
    server.verify_directly_issued_by(ca)
    dev1.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(v) for v in san.get_values_for_type(x509.DNSName)] == ["edge1.local"]
    assert [str(v) for v in san.get_values_for_type(x509.IPAddress)] == ["::1"]
    eku = dev1.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    days = (dev1.not_valid_after_utc - dev1.not_valid_before_utc).days
    assert days == 7


def test_issue_defaults_to_a_server_certificate(tmp_path):
    assert ctl("certs", "init-ca", tmp_path).returncode == 0
    assert ctl("certs", "issue", tmp_path, "gw").returncode == 0
    cert = load(tmp_path / "gw.crt")
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(n.value) for n in san] == ["localhost", "127.0.0.1", "::1"]


def test_server_client_gives_both_usages(tmp_path):
    main(["certs", "init-ca", str(tmp_path)])
    assert main(["certs", "issue", str(tmp_path), "node1", "--server-client"]) == 0
    eku = load(tmp_path / "node1.crt").extensions.get_extension_for_class(
        x509.ExtendedKeyUsage
    ).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


def test_refuses_to_overwrite_and_force_replaces(tmp_path):
    assert ctl("certs", "init-ca", tmp_path).returncode == 0
    before = (tmp_path / "ca.crt").read_bytes()
    r = ctl("certs", "init-ca", tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"Error: {tmp_path / 'ca.crt'} already exists (use --force to replace it)"
    ]
    assert (tmp_path / "ca.crt").read_bytes() == before
    assert ctl("certs", "issue", tmp_path, "s").returncode == 0
    r = ctl("certs", "issue", tmp_path, "s")
    assert r.returncode == 2 and "already exists" in r.stderr
    first = load(tmp_path / "s.crt").serial_number
    assert ctl("certs", "issue", tmp_path, "s", "--force").returncode == 0
    assert load(tmp_path / "s.crt").serial_number != first
    assert ctl("certs", "init-ca", tmp_path, "--force", "--cn", "new CA").returncode == 0
    assert load(tmp_path / "ca.crt").subject.rfc4514_string() == "CN=new CA"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["issue", "{dir}/nope", "server"], "ca.crt: no such file"),
        (["issue", "{dir}", "server", "--san", "IP:999.1.1.1"], "invalid SAN 'IP:999.1.1.1'"),
        (["issue", "{dir}", "../x"], "invalid certificate name"),
    ],
)
def test_errors_are_one_line_without_traceback(tmp_path, args, message):
    assert ctl("certs", "init-ca", tmp_path).returncode == 0
    r = ctl("certs", *[a.format(dir=tmp_path) for a in args])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("Error: ") and message in lines[0]
    assert "Traceback" not in r.stderr


def test_garbage_ca_key_is_one_line(tmp_path):
    assert ctl("certs", "init-ca", tmp_path).returncode == 0
    (tmp_path / "ca.key").write_text("garbage")
    r = ctl("certs", "issue", tmp_path, "server")
    assert r.returncode == 2
    assert r.stderr.strip() == f"Error: {tmp_path / 'ca.key'}: not an unencrypted PEM private key"


def test_usage_errors_exit_2(tmp_path):
    assert ctl("certs", "issue", tmp_path).returncode == 2  # NAME missing
    assert ctl("certs", "issue", tmp_path, "x", "--days", "0").returncode == 2


def test_init_ca_into_a_file_fails_cleanly(tmp_path):
    target = tmp_path / "file"
    target.write_text("")
    r = ctl("certs", "init-ca", target)
    assert r.returncode == 2
    assert "not a directory" in r.stderr and "Traceback" not in r.stderr


def test_help_lists_certs():
    r = ctl("--help")
    assert r.returncode == 0 and "certs" in r.stdout
    r = ctl("certs", "--help")
    assert "init-ca" in r.stdout and "issue" in r.stdout
