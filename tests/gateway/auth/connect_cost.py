"""Measure what password hashing costs a CONNECT (not a test; run it by hand):

    .venv/bin/python -m tests.gateway.auth.connect_cost [N]

Starts gatewayd with users at 4,096, 100,000 and 310,000 PBKDF2 rounds and reports the
CONNECT -> CONNACK time (MQTT 3.1.1, plain password) per user, SCRAM-SHA-256 CONNECTs
(where the client does the hashing), a burst of 40 simultaneous CONNECTs, and how long an
anonymous CONNECT takes while such a burst is being hashed (the event loop must stay free).
Numbers depend on the machine and its load: quote them with ``uptime``.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from gateway.security.scram import ScramClient
from protocols.mqtt.packets import Auth, ConnAck, Connect, Disconnect, Properties
from tests.gateway.auth.live import Gatewayd, RawClient

USERS = (("fast", 4096), ("default", 100_000), ("slow", 310_000))


def main(n: int = 30) -> None:
    print(f"load average {os.getloadavg()}, {os.cpu_count()} CPUs")
    for _, rounds in USERS:
        t = time.perf_counter()
        hashlib.pbkdf2_hmac("sha256", b"pw", os.urandom(16), rounds)
        print(f"PBKDF2-HMAC-SHA256 x {rounds:>7}: {(time.perf_counter() - t) * 1000:7.1f} ms")
    workdir = Path(tempfile.mkdtemp())
    g = Gatewayd(workdir, GATEWAY_AUTHENTICATION__ALLOW_ANONYMOUS="true").start()
    try:
        for user, rounds in USERS:
            r = g.ctl("users", "add", user, "--password", "pw", "--iterations", str(rounds))
            assert r.returncode == 0, r.stderr

        def connect(user: str | None) -> float:
            t = time.perf_counter()
            with RawClient(g.addr, level=4) as c:
                pw = b"pw" if user else None
                c.send(Connect("m", protocol_level=4, username=user, password=pw))
                ack = c.recv()
                assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
                c.send(Disconnect())
            return time.perf_counter() - t

        def scram(user: str) -> float:
            t = time.perf_counter()
            with RawClient(g.addr) as c:
                client = ScramClient(user, "pw")
                props = Properties(
                    authentication_method="SCRAM-SHA-256", authentication_data=client.first()
                )
                c.send(Connect("s", protocol_level=5, properties=props))
                challenge = c.recv()
                assert isinstance(challenge, Auth)
                final = client.final(challenge.properties.authentication_data or b"")
                c.send(Auth(0x18, Properties(authentication_method="SCRAM-SHA-256",
                                             authentication_data=final)))
                ack = c.recv()
                assert isinstance(ack, ConnAck) and ack.reason_code == 0
                c.send(Disconnect())
            return time.perf_counter() - t

        def ms(xs: list[float]) -> str:
            xs = sorted(xs)
            median, p90 = statistics.median(xs) * 1000, xs[int(len(xs) * 0.9)] * 1000
            return f"median {median:7.1f} ms, p90 {p90:7.1f} ms"

        for user in (None, *(u for u, _ in USERS)):
            times = [connect(user) for _ in range(n)]
            print(f"plain CONNECT {user or 'anonymous':>9}: {ms(times)}")
        for user in ("fast", "default"):
            print(f"SCRAM CONNECT {user:>9}: {ms([scram(user) for _ in range(max(5, n // 3))])}")

        def burst(user: str, k: int = 40) -> float:
            threads = [threading.Thread(target=connect, args=(user,)) for _ in range(k)]
            t = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            return time.perf_counter() - t

        for user in ("fast", "default"):
            total = burst(user)
            print(f"burst of 40 x {user:>7}: {total * 1000:7.0f} ms ({40 / total:5.1f} CONNECTs/s)")
        probes: list[float] = []
        stop = threading.Event()

        def probe() -> None:
            while not stop.is_set():
                probes.append(connect(None))

        prober = threading.Thread(target=probe)
        prober.start()
        burst("default")
        stop.set()
        prober.join()
        print(f"anonymous CONNECT during that burst: {ms(probes)} ({len(probes)} probes)")
    finally:
        g.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
