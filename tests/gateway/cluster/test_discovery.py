"""DNS discovery (A and SRV records) through dnspython, against a tiny DNS responder on
loopback: nodes with no seeds find each other and form the mesh."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gateway.cluster.dnsresponder import DnsResponder
from tests.gateway.cluster.harness import free_port, gatewayctl, wait_mesh, wait_until

pytestmark = pytest.mark.slow


def dns_env(responder: DnsResponder, name: str, kind: str) -> dict[str, str]:
    return {"GATEWAY_CLUSTER__DISCOVERY": "dns", "GATEWAY_CLUSTER__DNS__NAME": name,
            "GATEWAY_CLUSTER__DNS__RECORD_TYPE": kind,
            "GATEWAY_CLUSTER__DNS__NAMESERVERS": responder.addr,
            "GATEWAY_CLUSTER__DNS__REFRESH": "0.5s"}


def test_srv_records_give_hosts_and_ports(nodes) -> None:
    pa, pb = free_port(), free_port()
    dns = DnsResponder({
        ("_cluster._tcp.gw.test.", "SRV"): [f"0 0 {pa} a.gw.test.", f"0 0 {pb} b.gw.test."],
        ("a.gw.test.", "A"): ["127.0.0.1"],
        ("b.gw.test.", "A"): ["127.0.0.1"],
    })
    try:
        env = dns_env(dns, "_cluster._tcp.gw.test", "srv")
        a = nodes("a", cluster_port=pa, extra=env)
        b = nodes("b", cluster_port=pb, extra=env)
        wait_mesh([a, b])
        assert ("_cluster._tcp.gw.test.", "SRV") in dns.queries
    finally:
        dns.close()


def test_a_records_give_addresses_on_the_common_port(nodes, pki: Path) -> None:
    names = ["a@127.0.0.2", "b@127.0.0.3"]
    for n in names:
        if not (pki / f"{n}.crt").exists():
            r = gatewayctl("certs", "issue", pki, n, "--server-client")
            assert r.returncode == 0, r.stderr
    port = free_port()
    dns = DnsResponder({("gw.test.", "A"): ["127.0.0.2", "127.0.0.3"]})
    try:
        env = dns_env(dns, "gw.test", "a")
        a = nodes("a", host="127.0.0.2", cluster_port=port, extra=env)
        b = nodes("b", host="127.0.0.3", cluster_port=port, extra=env)
        wait_mesh([a, b])
        wait_until(lambda: a.member(b.name)["addr"] == f"127.0.0.3:{port}", what="b's address")
    finally:
        dns.close()
