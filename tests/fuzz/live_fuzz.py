"""A long fuzz campaign against a live gatewayd (not run in CI).

    .venv/bin/python -m tests.fuzz.live_fuzz --cases 100000 --workers 64 --out fuzz-out/

Starts its own gatewayd (``packet_timeout`` and ``idle_timeout`` 1 s, so stalled inputs
end quickly) unless ``--addr host:port`` names a running one, then throws ``--cases``
inputs at it, one connection each, from several generators:

- ``random``: random bytes on a fresh connection (before CONNECT);
- ``random-connected``: random bytes after a valid CONNECT (3.1.1 or 5.0);
- ``mutated``: a valid packet or short packet sequence (a corpus of every packet type,
  with properties, wills, shared and wildcard filters) mutated: bytes flipped, inserted,
  deleted, the stream cut short, chunks duplicated, two inputs spliced, the remaining
  length replaced; sent before or after a CONNECT;
- ``grammar``: well-formed-looking packets built field by field with hostile values
  (random property ids and values, weird topics, huge counts, invalid UTF-8, zero
  packet ids), after a CONNECT;
- ``split``: a valid or mutated stream sent in random small pieces.

Each outcome is classified: closed by the broker (with the DISCONNECT/CONNACK it sent
first, if any), still open after the observation window (the input was a valid stream),
or a failure: the broker's bytes were not well-formed MQTT, a DISCONNECT carried a code a
server may not send, the connection could not even be opened, or the broker died. Every
``--check-every`` cases a healthy client makes a QoS 1 round trip and VmRSS is sampled.
At the end a JSON summary (cases per generator and outcome, DISCONNECT reason codes,
failures with their inputs in hex, RSS start/peak/end, tracebacks in the broker's log)
is printed and written to ``--out``; inputs that failed are saved there too.

Exit status 0 when nothing failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import random
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.conformance import raw
from tests.fuzz.broker import SERVER_DISCONNECT_CODES, Gatewayd, Outcome, decode_reply

V311, V5 = raw.V311, raw.V5
WINDOW = 2.5  # seconds to watch one connection (the broker's stall limits are 1 s)


# ---------------------------------------------------------------- inputs


def _prop_items(rng: random.Random) -> list[tuple[int, object]]:
    ids = list(raw._PROP_TYPES)
    out: list[tuple[int, object]] = []
    for _ in range(rng.randint(0, 4)):
        pid = rng.choice(ids)
        kind = raw._PROP_TYPES[pid]
        value: object
        if kind == "byte":
            value = rng.choice([0, 1, 2, 255])
        elif kind == "u16":
            value = rng.choice([0, 1, 10, 65535])
        elif kind == "u32":
            value = rng.choice([0, 1, 3600, 0xFFFFFFFF])
        elif kind == "varint":
            value = rng.choice([0, 1, 268_435_455])
        elif kind in ("utf8", "bin"):
            value = _text(rng)
            if kind == "bin" and isinstance(value, str):
                value = value.encode()
        else:
            value = (_text(rng), _text(rng))
        out.append((pid, value))
    return out


def _text(rng: random.Random) -> str | bytes:
    choice = rng.randrange(8)
    if choice == 0:
        return rng.randbytes(rng.randint(0, 12))  # very likely invalid UTF-8
    if choice == 1:
        return "\x00" + "x" * rng.randint(0, 5)
    if choice == 2:
        return "/".join("l" for _ in range(rng.randint(1, 300)))
    if choice == 3:
        return rng.choice(["#", "+", "a/#", "+/+", "$SYS/x", "$share/g/t", "$share//t", "#/a"])
    if choice == 4:
        return "é€😀\ufeff\uffff"
    if choice == 5:
        return ""
    return "".join(rng.choice("ab/+#$ ") for _ in range(rng.randint(1, 20)))


def corpus(proto: int, rng: random.Random) -> list[bytes]:
    """Valid (or nearly valid) packets of every kind at ``proto``."""
    p5 = proto == V5
    props = [(raw.USER_PROPERTY, ("k", "v")), (raw.CONTENT_TYPE, "text/plain")] if p5 else []
    return [
        raw.publish("f/t", b"payload", proto=proto, properties=props),
        raw.publish("f/t", b"q1", qos=1, mid=1, proto=proto),
        raw.publish("f/t", b"q2", qos=2, mid=2, retain=True, proto=proto),
        raw.publish("f/a", b"alias", proto=proto, properties=[(raw.TOPIC_ALIAS, 1)] if p5 else []),
        raw.puback(1, proto=proto),
        raw.pubrec(2, proto=proto),
        raw.pubrel(2, proto=proto),
        raw.pubcomp(2, proto=proto),
        raw.subscribe(3, [("f/#", 2), ("$share/g/f/+", 1), ("+/x", 0)], proto=proto),
        raw.unsubscribe(4, ["f/#", "nothing"], proto=proto),
        raw.pingreq(),
        raw.disconnect(0x04 if p5 else 0, proto=proto),
        raw.packet(raw.AUTH, 0, bytes([0x19]) + raw.props([(raw.AUTHENTICATION_METHOD, "X")])),
        raw.connect("again", proto=proto),
    ]


def connects(rng: random.Random) -> list[bytes]:
    return [
        raw.connect("c", proto=V311),
        raw.connect("c5", proto=V5, properties=[(raw.SESSION_EXPIRY_INTERVAL, 60)]),
        raw.connect("w", proto=V5, will=raw.Will("w/t", b"bye", 1, True,
                                                 [(raw.WILL_DELAY_INTERVAL, 1)])),
        raw.connect("u", proto=V311, username="user", password=b"pw"),
        raw.connect("", proto=V5),
        raw.connect("old", proto=raw.V31),
        raw.connect("auth", proto=V5, properties=[(raw.AUTHENTICATION_METHOD, "SCRAM-SHA-256"),
                                                   (raw.AUTHENTICATION_DATA, b"n,,n=u,r=x")]),
    ]


def mutate(data: bytes, rng: random.Random, other: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(8)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(i, len(b) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            b[min(i, len(b) - 1)] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif op == 2:
            b[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 3 and b:
            del b[i : i + rng.randint(1, 8)]
        elif op == 4:
            del b[rng.randint(0, len(b)) :]  # cut short
        elif op == 5 and b:
            j = rng.randrange(len(b))
            b[i:i] = b[j : j + rng.randint(1, 16)]  # duplicate a chunk
        elif op == 6:
            cut = rng.randint(0, len(other))
            b = b[:i] + bytearray(other[cut:])  # splice
        elif b:  # a new remaining length for the first packet
            b[1:2] = raw.varint(rng.choice([0, 1, 2, 127, 128, 16383, 2_097_151, 268_435_455]))
    return bytes(b)


def grammar(proto: int, rng: random.Random) -> bytes:
    """One packet assembled from hostile field values."""
    kind = rng.randrange(6)
    p5 = proto == V5
    mid = rng.choice([0, 1, 65535])
    if kind == 0:
        props = _prop_items(rng) if p5 else []
        return raw.publish(_text(rng), rng.randbytes(rng.randint(0, 64)), qos=rng.randrange(4) % 3,
                           mid=mid, retain=rng.random() < 0.3, dup=rng.random() < 0.3,
                           proto=proto, properties=props)
    if kind == 1:
        n = rng.choice([1, 2, 50, 1000])
        pairs = [(_text(rng), rng.randrange(256)) for _ in range(n)]
        return raw.subscribe(mid, pairs, proto=proto, properties=_prop_items(rng) if p5 else [])
    if kind == 2:
        return raw.unsubscribe(mid, [_text(rng) for _ in range(rng.randint(0, 5))], proto=proto)
    if kind == 3:
        builder = rng.choice([raw.puback, raw.pubrec, raw.pubrel, raw.pubcomp])
        return builder(mid, proto=proto, reason=rng.choice([0, 0x10, 0x80, 0x92, 0xFF]),
                       properties=_prop_items(rng) if p5 else [])
    if kind == 4:
        return raw.disconnect(rng.randrange(256), proto=proto,
                              properties=_prop_items(rng) if p5 else [])
    body = bytes([rng.randrange(256)]) + (raw.props(_prop_items(rng)) if p5 else b"")
    return raw.packet(raw.AUTH, rng.randrange(16), body)


def make_case(n: int, seed: int) -> tuple[str, int | None, list[bytes]]:
    """(generator, protocol to CONNECT with first or None, chunks to send)."""
    rng = random.Random(seed * 1_000_003 + n)
    proto = rng.choice([V311, V5])
    roll = rng.random()
    if roll < 0.15:
        return "random", None, [rng.randbytes(rng.randint(1, 4096))]
    if roll < 0.30:
        return "random-connected", proto, [rng.randbytes(rng.randint(1, 4096))]
    if roll < 0.65:
        pool = corpus(proto, rng)
        seq = b"".join(rng.choice(pool) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.3:  # a mutated CONNECT on a fresh connection
            c = connects(rng)
            return "mutated", None, [mutate(rng.choice(c), rng, seq) + seq]
        return "mutated", proto, [mutate(seq, rng, rng.choice(pool))]
    if roll < 0.85:
        return "grammar", proto, [b"".join(grammar(proto, rng) for _ in range(rng.randint(1, 3)))]
    pool = corpus(proto, rng)
    stream = b"".join(rng.choice(pool) for _ in range(rng.randint(1, 6)))
    if rng.random() < 0.5:
        stream = mutate(stream, rng, rng.choice(pool))
    chunks, pos = [], 0
    while pos < len(stream):
        step = rng.randint(1, 7)
        chunks.append(stream[pos : pos + step])
        pos += step
    return "split", proto, chunks or [b""]


# ---------------------------------------------------------------- running a case


class Failure(Exception):
    pass


def run_case(addr: tuple[str, int], proto: int | None, chunks: list[bytes], cid: str) -> Outcome:
    try:
        sock = socket.create_connection(addr, timeout=WINDOW * 2)
    except OSError as exc:
        raise Failure(f"cannot connect: {exc}") from None
    with sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        level = proto or V311
        if proto is not None:
            sock.sendall(raw.connect(cid, proto=proto, keepalive=0))
            try:
                ack = raw.decode(raw.read_packet(sock, WINDOW * 2), proto)
            except (raw.Timeout, raw.ConnectionClosed, AssertionError) as exc:
                raise Failure(f"no CONNACK for a valid CONNECT: {exc}") from None
            if ack.type != raw.CONNACK or ack.reason != 0:
                raise Failure(f"valid CONNECT refused: {ack!r}")
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except OSError:
            pass
        data = bytearray()
        closed = False
        deadline = time.monotonic() + WINDOW
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                got = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                closed = True
                break
            if not got:
                closed = True
                break
            data += got
    packets, rest = decode_reply(bytes(data), proto)
    if proto is None and packets and packets[0].proto == V5:
        level = V5
    out = Outcome(closed, packets, rest)
    if rest:
        raise Failure(f"broker sent bytes that are not MQTT: {rest[:64].hex(' ')}")
    d = out.disconnect
    disconnect = d is not None and d.type == raw.DISCONNECT
    if disconnect and level == V5 and d.reason not in SERVER_DISCONNECT_CODES:  # type: ignore[union-attr]
        raise Failure(f"DISCONNECT with a code a server may not send: {d!r}")
    return out


def classify(out: Outcome) -> tuple[str, str | None]:
    d = out.disconnect
    if not out.closed:
        return "open", None
    if d is None:
        return "closed", None
    return "closed", f"{raw.NAMES[d.type]} 0x{d.reason:02x}"


# ---------------------------------------------------------------- the campaign


def healthy_roundtrip(addr: tuple[str, int], n: int) -> None:
    raw.assert_broker_healthy(addr, V5 if n % 2 else V311)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--check-every", type=int, default=2000)
    ap.add_argument("--addr", help="host:port of a running broker (default: start one)")
    ap.add_argument("--out", type=Path, default=Path("fuzz-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    proc: Gatewayd | None = None
    if args.addr:
        host, _, port = args.addr.rpartition(":")
        addr = (host, int(port))
    else:
        proc = Gatewayd(
            Path(tempfile.mkdtemp(prefix="live-fuzz-")),
            GATEWAY_MQTT__PACKET_TIMEOUT="1s",
            GATEWAY_MQTT__IDLE_TIMEOUT="1s",
            GATEWAY_LOG__LEVEL="error",  # a warning per offender would flood the log
        ).start()
        addr = proc.addr

    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    failures: list[dict[str, object]] = []
    rss: list[int] = []
    lock = threading.Lock()
    started = time.monotonic()
    if proc is not None:
        healthy_roundtrip(addr, 0)
        rss.append(proc.rss_kb())

    def one(n: int) -> None:
        gen, proto, chunks = make_case(n, args.seed)
        try:
            out = run_case(addr, proto, chunks, f"fz{n}")
        except Failure as exc:
            with lock:
                counts[(gen, "FAILED")] += 1
                data = b"".join(chunks)
                failures.append({"case": n, "generator": gen, "proto": proto,
                                 "why": str(exc), "input": data[:4096].hex()})
                (args.out / f"failure-{n}.bin").write_bytes(data)
            return
        outcome, reason = classify(out)
        with lock:
            counts[(gen, outcome)] += 1
            if reason:
                reasons[reason] += 1

    done = 0
    checks = 0

    def check() -> None:
        nonlocal checks
        checks += 1
        if proc is not None:
            if not proc.alive():
                raise SystemExit(f"gatewayd died:\n{proc.log_tail()}")
            rss.append(proc.rss_kb())
        healthy_roundtrip(addr, checks)

    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        while done < args.cases:
            batch = range(done, min(done + args.check_every, args.cases))
            list(pool.map(one, batch))
            done = batch.stop
            check()
            elapsed = time.monotonic() - started
            print(
                f"{done}/{args.cases} cases, {len(failures)} failures, "
                f"{done / elapsed:.0f} cases/s"
                + (f", VmRSS {rss[-1]} kB" if rss else ""),
                file=sys.stderr,
                flush=True,
            )

    summary: dict[str, object] = {
        "cases": args.cases,
        "seed": args.seed,
        "seconds": round(time.monotonic() - started, 1),
        "health_checks": checks,
        "by_generator": {
            gen: {o: n for (g, o), n in sorted(counts.items()) if g == gen}
            for gen in sorted({g for g, _ in counts})
        },
        "first_reply_before_close": dict(reasons.most_common()),
        "failures": failures[:50],
        "failure_count": len(failures),
    }
    if proc is not None:
        summary["rss_kb"] = {"start": rss[0], "peak": max(rss), "end": rss[-1]}
        summary["broker_alive"] = proc.alive()
        summary["tracebacks_in_log"] = proc.log_count("Traceback")
        summary["errors_in_log"] = proc.log_count(" ERROR ")
        proc.stop()
    text = json.dumps(summary, indent=2)
    print(text)
    (args.out / "summary.json").write_text(text + "\n")
    ok = not failures and summary.get("tracebacks_in_log", 0) == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
