"""MQTT round trip through the local gatewayd: subscribe, publish at QoS 1, receive it.

Run with the gateway's own venv (it uses the project's sans-IO MQTT codec, so the host
needs nothing else):  /opt/gateway/bin/python gateway-roundtrip.py --port 1883
Exit 0 when the message came back within --timeout seconds, 1 otherwise (one line).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from protocols.mqtt import (
    ConnAck,
    Connect,
    Connection,
    PubAck,
    Publish,
    Role,
    SubAck,
    Subscribe,
    Subscription,
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args()
    token = os.urandom(6).hex()
    topic = f"ansible/health/{token}"
    deadline = time.monotonic() + args.timeout
    conn = Connection(Role.CLIENT, protocol_level=4)
    try:
        sock = socket.create_connection((args.host, args.port), timeout=args.timeout)
    except OSError as exc:
        print(f"roundtrip: cannot connect to {args.host}:{args.port}: {exc}")
        return 1
    with sock:
        def expect(kind: type) -> object:
            while True:
                event = conn.next_event()
                if event is not None:
                    if isinstance(event, kind):
                        return event
                    continue
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("connection closed")
                conn.receive_data(data)

        try:
            sock.sendall(conn.send(Connect(client_id=f"ansible-health-{token}")))
            ack = expect(ConnAck)
            assert isinstance(ack, ConnAck)
            if ack.reason_code != 0:
                print(f"roundtrip: CONNACK return code {ack.reason_code}")
                return 1
            sock.sendall(conn.send(Subscribe(1, (Subscription(topic, 1),))))
            expect(SubAck)
            sock.sendall(conn.send(Publish(topic, token.encode(), qos=1, packet_id=2)))
            while True:
                got = expect((Publish, PubAck))  # type: ignore[arg-type]
                if isinstance(got, Publish) and got.topic == topic:
                    if got.payload != token.encode():
                        print("roundtrip: wrong payload came back")
                        return 1
                    if got.packet_id is not None:
                        sock.sendall(conn.send(PubAck(got.packet_id)))
                    print(f"roundtrip: ok ({args.host}:{args.port}, topic {topic})")
                    return 0
        except (OSError, ConnectionError) as exc:
            print(f"roundtrip: {exc}")
            return 1


if __name__ == "__main__":
    sys.exit(main())
