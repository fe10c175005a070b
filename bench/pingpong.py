"""Ping-pong latency probe: one QoS 0 message at a time through a broker.

    taskset -c 1 .venv/bin/python -m bench.pingpong PORT [COUNT [GAP_SECONDS]]

A subscriber and a publisher (MQTT 3.1.1 on raw blocking sockets, no client library)
connect to 127.0.0.1:PORT; the publisher sends one 8-byte message to ``p/a`` and waits
until the subscriber has it, COUNT times (3,000), sleeping GAP_SECONDS (0.001; 0 for
back to back) between round trips. Prints the round trip's p50 / p90 / p99 / p99.9 /
max / min in µs.
Read the broker's ``/proc/<pid>/stat`` utime and stime before and after to get its user
and kernel CPU per message taken alone (bench/README.md, "Latency tails").
"""

from __future__ import annotations

import socket
import sys
import time

from bench import wire


def connect(port: int, client_id: str) -> socket.socket:
    try:
        s = socket.create_connection(("127.0.0.1", port))
    except OSError as exc:
        raise SystemExit(f"pingpong: no broker on 127.0.0.1:{port}: {exc.strerror}") from None
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(wire.connect(client_id))
    if s.recv(4)[:2] != b"\x20\x02":
        raise SystemExit(f"pingpong: {client_id}: no CONNACK from port {port}")
    return s


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    port = int(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    gap = float(sys.argv[3]) if len(sys.argv) > 3 else 0.001
    sub, pub = connect(port, "ppsub"), connect(port, "pppub")
    sub.sendall(wire.subscribe(1, "p/a", 0))
    sub.recv(5)  # SUBACK
    pkt = wire.publish("p/a", b"x" * 8)
    time.sleep(0.2)  # the subscription is in place before the first message
    rtts = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        pub.sendall(pkt)
        got = 0
        while got < len(pkt):
            got += len(sub.recv(4096))
        rtts.append((time.perf_counter_ns() - t0) / 1000)
        if gap:
            time.sleep(gap)
    rtts.sort()

    def q(p: float) -> float:
        return rtts[int(p * (len(rtts) - 1))]

    print(f"n={n} p50={q(.5):.0f}us p90={q(.9):.0f} p99={q(.99):.0f} p99.9={q(.999):.0f} "
          f"max={rtts[-1]:.0f} min={rtts[0]:.0f}")


if __name__ == "__main__":
    main()
