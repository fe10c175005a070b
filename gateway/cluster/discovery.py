"""DNS discovery of cluster members (``cluster.discovery = "dns"``), through dnspython.

- ``record_type = "a"`` (or ``"aaaa"``): every address of ``cluster.dns.name`` is a node,
  dialled on this node's own cluster port (every node of such a cluster uses the same
  one).
- ``record_type = "srv"``: every SRV record of the name gives a target host and a port;
  the target is resolved (A, else AAAA) and dialled on that port.

Discovery yields addresses only: the node's name is learnt from its WELCOME when it is
first dialled (as for a ``host:port`` seed), so DNS needs no knowledge of node names, and
the certificate check is unchanged. The name is resolved at start and every
``refresh`` seconds; addresses already known (members, this node) are skipped, and a
member that disappears from DNS is not removed (autoclean does that when it is down).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import dns.asyncresolver
import dns.exception
import dns.rdatatype
import dns.resolver

log = logging.getLogger("gateway.cluster")


@dataclass
class DnsSettings:
    name: str
    record_type: str = "a"  # a | aaaa | srv
    nameservers: list[str] = field(default_factory=list)  # host[:port]; empty: system
    refresh: float = 60.0
    timeout: float = 3.0


def _resolver(settings: DnsSettings) -> dns.asyncresolver.Resolver:
    if not settings.nameservers:
        res = dns.asyncresolver.Resolver()
    else:
        res = dns.asyncresolver.Resolver(configure=False)
        hosts: list[str] = []
        port = 53
        for ns in settings.nameservers:
            host, sep, p = ns.rpartition(":")
            if sep and p.isdigit() and host:
                hosts.append(host.strip("[]"))
                port = int(p)
            else:
                hosts.append(ns)
        res.nameservers = hosts
        res.port = port
    res.lifetime = settings.timeout
    return res


async def discover(settings: DnsSettings, default_port: int) -> list[str]:
    """The ``host:port`` addresses ``settings`` gives now (empty on a DNS failure, logged)."""
    res = _resolver(settings)
    kind = settings.record_type.lower()
    try:
        if kind == "srv":
            answer = await res.resolve(settings.name, dns.rdatatype.SRV)
            out: list[str] = []
            for rr in sorted(answer, key=lambda r: (r.priority, -r.weight, str(r.target))):
                for host in await _addresses(res, str(rr.target)):
                    out.append(_join(host, int(rr.port)))
            return out
        rtype = dns.rdatatype.AAAA if kind == "aaaa" else dns.rdatatype.A
        answer = await res.resolve(settings.name, rtype)
        return [_join(rr.address, default_port) for rr in answer]
    except (dns.exception.DNSException, OSError) as exc:
        log.warning("cluster: DNS discovery of %s (%s) failed: %s", settings.name, kind, exc)
        return []


async def _addresses(res: dns.asyncresolver.Resolver, host: str) -> list[str]:
    for rtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
        try:
            answer = await res.resolve(host, rtype)
        except (dns.resolver.NoAnswer, dns.resolver.NXDOMAIN):
            continue
        return [rr.address for rr in answer]
    return []


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
