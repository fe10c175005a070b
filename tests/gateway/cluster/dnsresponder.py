"""A tiny authoritative DNS responder on loopback UDP for discovery tests (dnspython
builds and parses the messages). ``records`` maps ``(name, type)`` to rdata texts, e.g.
``("gw.test.", "A"): ["127.0.0.2"]`` or ``("_c._tcp.gw.test.", "SRV"): ["0 0 5370 a.gw.test."]``;
anything else is NXDOMAIN."""

from __future__ import annotations

import contextlib
import socket
import threading

import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


class DnsResponder:
    def __init__(self, records: dict[tuple[str, str], list[str]]) -> None:
        self.records = {(n.lower(), t.upper()): v for (n, t), v in records.items()}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.queries: list[tuple[str, str]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self) -> None:
        while not self._stop:
            try:
                data, peer = self.sock.recvfrom(4096)
            except (TimeoutError, OSError):
                continue
            try:
                query = dns.message.from_wire(data)
            except Exception:  # not DNS: ignore
                continue
            response = dns.message.make_response(query)
            response.flags |= dns.flags.AA
            found = False
            for q in query.question:
                name = q.name.to_text().lower()
                rtype = dns.rdatatype.to_text(q.rdtype)
                self.queries.append((name, rtype))
                texts = self.records.get((name, rtype))
                if texts:
                    found = True
                    response.answer.append(dns.rrset.from_text_list(
                        q.name, 5, dns.rdataclass.IN, q.rdtype, texts))
                elif any(n == name for n, _ in self.records):
                    found = True  # the name exists: NOERROR, no answer
            if not found:
                response.set_rcode(dns.rcode.NXDOMAIN)
            with contextlib.suppress(OSError):
                self.sock.sendto(response.to_wire(), peer)

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()
