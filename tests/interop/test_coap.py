"""CoAP interop: libcoap's ``coap-client-openssl`` (Debian ``libcoap3-bin``) and the
aiocoap library against a real gatewayd, with paho-mqtt on the MQTT side.

Every wait is on a process, a queue or a future with a timeout. An observation is known to
be established when the retained message published before it arrives.
"""

from __future__ import annotations

import asyncio
import queue
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from aiocoap import GET, POST, PUT, Context
from aiocoap import Message as CoapMessage
from aiocoap.numbers.codes import Code

from protocols.coap.codec import CON, decode, encode, make
from tests.interop.clients import PahoEnd
from tests.interop.conftest import Gateway, free_port, start_gateway, stop

TIMEOUT = 10.0
COAP_CLIENT = shutil.which("coap-client-openssl") or shutil.which("coap-client")
needs_libcoap = pytest.mark.skipif(COAP_CLIENT is None, reason="libcoap3-bin not installed")
try:
    import mbedtls.tls  # noqa: F401

    HAVE_MBEDTLS = True
except ImportError:  # pragma: no cover
    HAVE_MBEDTLS = False
needs_dtls = pytest.mark.skipif(
    not HAVE_MBEDTLS or not shutil.which("coap-client-openssl"),
    reason="python-mbedtls or coap-client-openssl missing",
)


PSK_ID, PSK_KEY = "dev-psk", "s3cret-key"


class CoapGateway:
    def __init__(self, gw: Gateway, coap: int, coaps: int, certs: int, pki: Path) -> None:
        self.gw = gw
        self.coap = coap
        self.coaps = coaps
        self.certs = certs  # the DTLS listener with certificates (and PSK)
        self.pki = pki  # made by gatewayctl certs: ca.crt, server, dev1; other/intruder

    def uri(self, path: str) -> str:
        return f"coap://127.0.0.1:{self.coap}{path}"

    def suri(self, path: str) -> str:
        return f"coaps://127.0.0.1:{self.coaps}{path}"

    def curi(self, path: str) -> str:
        return f"coaps://127.0.0.1:{self.certs}{path}"

    def cert_args(self, name: str = "dev1", directory: Path | None = None) -> tuple[str, ...]:
        """libcoap's PKI options: our certificate and key, and the CA to check the server."""
        d = directory or self.pki
        return ("-c", str(d / f"{name}.crt"), "-j", str(d / f"{name}.key"),
                "-R", str(self.pki / "ca.crt"))


def gatewayctl(*args: str | Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "gateway.cli.gatewayctl", *map(str, args)],
        check=True, capture_output=True, timeout=60,
    )


def make_pki(directory: Path) -> Path:
    """Our own PKI (``gatewayctl certs``): the gateway's CA with a server certificate and
    a client "dev1"; in ``other`` a second CA with its client "intruder"."""
    gatewayctl("certs", "init-ca", directory)
    gatewayctl("certs", "issue", directory, "server", "--server")
    gatewayctl("certs", "issue", directory, "dev1", "--client")
    gatewayctl("certs", "init-ca", directory / "other", "--cn", "someone else's CA")
    gatewayctl("certs", "issue", directory / "other", "intruder", "--client")
    return directory


def _wait_udp_ready(port: int) -> None:
    """CoAP ping (an empty CON) until the RST comes back."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.2)
        for i in range(int(TIMEOUT / 0.2)):
            s.sendto(encode(make(CON, Code.EMPTY, i)), ("127.0.0.1", port))
            try:
                s.recvfrom(64)
                return
            except OSError:
                continue
    raise RuntimeError("CoAP listener not ready")


@pytest.fixture(scope="module")
def cgw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoapGateway]:
    port = free_port(socket.SOCK_DGRAM)
    dport = free_port(socket.SOCK_DGRAM)
    cport = free_port(socket.SOCK_DGRAM)
    workdir = tmp_path_factory.mktemp("gatewayd-coap")
    (workdir / "psk.txt").write_text(f"{PSK_ID}:{PSK_KEY}\n")
    pki = workdir / "pki"
    extra = {"GATEWAY_GATEWAY__COAP__LISTENERS__UDP__DEFAULT__BIND": f"127.0.0.1:{port}"}
    if HAVE_MBEDTLS:
        extra["GATEWAY_GATEWAY__COAP__LISTENERS__DTLS__DEFAULT__BIND"] = f"127.0.0.1:{dport}"
        extra["GATEWAY_GATEWAY__COAP__LISTENERS__DTLS__DEFAULT__PSK_FILE"] = str(
            workdir / "psk.txt"
        )
        make_pki(pki)
        certs = {
            "bind": f"127.0.0.1:{cport}",
            "certfile": str(pki / "server.crt"),
            "keyfile": str(pki / "server.key"),
            "cacertfile": str(pki / "ca.crt"),
            "verify": "verify_peer",
            "fail_if_no_peer_cert": "true",
            "peer_cert_as_clientid": "cn",
            "psk_file": str(workdir / "psk.txt"),  # PSK devices on the same port
            "psk_identity_as_clientid": "true",
        }
        for key, value in certs.items():
            extra[f"GATEWAY_GATEWAY__COAP__LISTENERS__DTLS__CERTS__{key.upper()}"] = value
    proc, gw = start_gateway(workdir, **extra)
    try:
        _wait_udp_ready(port)
        yield CoapGateway(gw, port, dport, cport, pki)
    finally:
        stop(proc)


def paho(cgw: CoapGateway, cid: str) -> PahoEnd:
    return PahoEnd(cgw.gw, "tcp", cid, mqtt.MQTTv5)


class Output:
    """A process's stdout read by a thread into a buffer; wait for substrings."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.chunks: queue.Queue[bytes] = queue.Queue()
        self.buf = b""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := self.proc.stdout.read1(65536):  # type: ignore[attr-defined]
            self.chunks.put(chunk)
        self.chunks.put(b"")

    def wait_for(self, needle: bytes) -> None:
        while needle not in self.buf:
            chunk = self.chunks.get(timeout=TIMEOUT)
            if not chunk:
                raise AssertionError(f"process ended before {needle[:40]!r}: {self.buf[-200:]!r}")
            self.buf += chunk


def observe_with_libcoap(
    uri: str, args: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], Output]:
    assert COAP_CLIENT is not None
    client = "coap-client-openssl" if args else COAP_CLIENT
    cmd = [client, "-m", "get", "-s", "60", "-B", "60", *args, uri]
    if shutil.which("stdbuf"):
        cmd = ["stdbuf", "-o0", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, Output(proc)


def end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


# ------------------------------------------------------------------ libcoap


@needs_libcoap
def test_libcoap_post_reaches_mqtt(cgw: CoapGateway, uid: str) -> None:
    sub = paho(cgw, f"s-{uid}")
    try:
        sub.subscribe(f"lc/{uid}/#", 2)
        assert COAP_CLIENT is not None
        for mtype, want_qos in (([], 1), (["-N"], 0)):
            subprocess.run(
                [COAP_CLIENT, "-m", "post", *mtype, "-e", f"hi{want_qos}",
                 cgw.uri(f"/ps/lc/{uid}/t?clientid=lc-{uid}")],
                check=True, timeout=TIMEOUT, capture_output=True,
            )
            assert sub.next_message() == (f"lc/{uid}/t", f"hi{want_qos}".encode(), want_qos)
        subprocess.run(
            [COAP_CLIENT, "-m", "post", "-e", "r", cgw.uri(f"/ps/lc/{uid}/r?qos=0&retain=true")],
            check=True, timeout=TIMEOUT, capture_output=True,
        )
        assert sub.next_message() == (f"lc/{uid}/r", b"r", 0)
    finally:
        sub.close()


@needs_libcoap
def test_libcoap_blockwise_post(cgw: CoapGateway, uid: str, tmp_path: Path) -> None:
    body = bytes(range(256)) * 40  # 10240 bytes: ten 1024-byte blocks
    f = tmp_path / "body"
    f.write_bytes(body)
    sub = paho(cgw, f"s-{uid}")
    try:
        sub.subscribe(f"blk/{uid}", 1)
        assert COAP_CLIENT is not None
        for size in ("1024", "64"):
            subprocess.run(
                [COAP_CLIENT, "-m", "post", "-b", size, "-f", str(f), cgw.uri(f"/ps/blk/{uid}")],
                check=True, timeout=TIMEOUT, capture_output=True,
            )
            topic, payload, _ = sub.next_message()
            assert topic == f"blk/{uid}" and payload == body
    finally:
        sub.close()


@needs_libcoap
def test_libcoap_observe_receives_mqtt_publishes(cgw: CoapGateway, uid: str) -> None:
    pub = paho(cgw, f"p-{uid}")
    topic = f"obs/{uid}"
    pub.publish(topic, f"ready-{uid};".encode(), 1)
    pub.client.publish(topic, f"ready-{uid};".encode(), 1, retain=True).wait_for_publish(TIMEOUT)
    proc, out = observe_with_libcoap(cgw.uri(f"/ps/{topic}?qos=1"))
    try:
        out.wait_for(f"ready-{uid};".encode())
        for i, qos in enumerate((0, 1, 2, 0)):
            pub.publish(topic, f"m{i}-{uid};".encode(), qos)
        out.wait_for(b"".join(f"m{i}-{uid};".encode() for i in range(4)))
        big = b"".join(b"%05d," % i for i in range(700))  # 4200 bytes: Block2
        pub.publish(topic, big, 1)
        out.wait_for(big)
    finally:
        end(proc)
        pub.client.publish(topic, b"", 1, retain=True).wait_for_publish(TIMEOUT)
        pub.close()


# ------------------------------------------------------------------ aiocoap


async def _aiocoap(cgw: CoapGateway, uid: str, sub: PahoEnd, pub: PahoEnd) -> None:
    ctx = await Context.create_client_context()
    try:
        # publish, CON -> QoS 1 (and a 4 KB body, sent by aiocoap with Block1)
        big = b"x" * 4096
        for payload in (b"small", big):
            r = await asyncio.wait_for(ctx.request(CoapMessage(
                code=POST, uri=cgw.uri(f"/ps/ac/{uid}?clientid=ac-{uid}"), payload=payload
            )).response, TIMEOUT)
            assert r.code == Code.CHANGED
            assert await asyncio.to_thread(sub.next_message) == (f"ac/{uid}", payload, 1)
        # observe: MQTT publishes arrive as notifications with increasing Observe numbers
        topic = f"aco/{uid}"
        await asyncio.to_thread(
            lambda: pub.client.publish(topic, b"ready", 1, retain=True).wait_for_publish(TIMEOUT)
        )
        req = ctx.request(CoapMessage(code=GET, uri=cgw.uri(f"/ps/{topic}?qos=1"), observe=0))
        it = req.observation.__aiter__()  # before the answer: the retained message follows it
        first = await asyncio.wait_for(req.response, TIMEOUT)
        assert first.code == Code.CONTENT and first.opt.observe is not None
        got: list[bytes] = []
        seqs: list[int] = [first.opt.observe]
        want = [b"ready", b"n0", b"n1", b"y" * 3000]
        for i, p in enumerate(want):
            if i:  # one at a time: aiocoap's iterator may skip to the latest notification
                await asyncio.to_thread(pub.publish, topic, p, 1)
            note = await asyncio.wait_for(it.__anext__(), TIMEOUT)
            got.append(note.payload)
            seqs.append(note.opt.observe)
        assert got == want
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        req.observation.cancel()
        await asyncio.to_thread(
            lambda: pub.client.publish(topic, b"", 1, retain=True).wait_for_publish(TIMEOUT)
        )
        # connection mode: token, wrong token 4.01, missing 4.00, heartbeat, close
        base = "/mqtt/connection"
        r = await ctx.request(CoapMessage(
            code=POST, uri=cgw.uri(f"{base}?clientid=cm-{uid}&username=u&password=p"))).response
        assert r.code == Code.CREATED and r.payload
        token = r.payload.decode()
        ok = f"clientid=cm-{uid}&token={token}"
        for query, code in ((ok, Code.CHANGED), (f"clientid=cm-{uid}&token=x", Code.UNAUTHORIZED),
                            (f"clientid=cm-{uid}", Code.BAD_REQUEST)):
            r = await ctx.request(CoapMessage(
                code=POST, uri=cgw.uri(f"/ps/cm/{uid}?{query}"), payload=b"c")).response
            assert r.code == code, (query, r.code)
        r = await ctx.request(CoapMessage(code=PUT, uri=cgw.uri(f"{base}?{ok}"))).response
        assert r.code == Code.CHANGED
        from aiocoap import DELETE

        r = await ctx.request(CoapMessage(code=DELETE, uri=cgw.uri(f"{base}?{ok}"))).response
        assert r.code == Code.DELETED
    finally:
        await ctx.shutdown()


def test_aiocoap_publish_observe_blockwise_connection(cgw: CoapGateway, uid: str) -> None:
    sub = paho(cgw, f"s-{uid}")
    pub = paho(cgw, f"p-{uid}")
    try:
        sub.subscribe(f"ac/{uid}", 1)
        asyncio.run(_aiocoap(cgw, uid, sub, pub))
    finally:
        sub.close()
        pub.close()


def test_malformed_gets_4_00_and_others_carry_on(cgw: CoapGateway, uid: str) -> None:
    sub = paho(cgw, f"s-{uid}")
    try:
        sub.subscribe(f"mal/{uid}", 1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(TIMEOUT)
            s.sendto(b"\x41\x02\x12\x34T\xd0", ("127.0.0.1", cgw.coap))
            reply = decode(s.recvfrom(2048)[0])
            assert reply.code == Code.BAD_REQUEST and reply.mid == 0x1234 and reply.token == b"T"
            good = make(CON, Code.POST, 0x1235, b"G", b"fine")
            good.opt.uri_path = ("ps", "mal", uid)
            s.sendto(encode(good), ("127.0.0.1", cgw.coap))
            assert decode(s.recvfrom(2048)[0]).code == Code.CHANGED
        assert sub.next_message() == (f"mal/{uid}", b"fine", 1)
    finally:
        sub.close()


# ------------------------------------------------------------------ DTLS (PSK)


@needs_dtls
def test_libcoap_dtls_psk_both_directions(cgw: CoapGateway, uid: str) -> None:
    psk = ("-u", PSK_ID, "-k", PSK_KEY)
    sub = paho(cgw, f"s-{uid}")
    pub = paho(cgw, f"p-{uid}")
    topic = f"dtls/{uid}"
    try:
        sub.subscribe(f"{topic}/up", 1)
        subprocess.run(
            ["coap-client-openssl", "-m", "post", *psk, "-e", "over dtls",
             cgw.suri(f"/ps/{topic}/up?clientid=d-{uid}")],
            check=True, timeout=TIMEOUT, capture_output=True,
        )
        assert sub.next_message() == (f"{topic}/up", b"over dtls", 1)
        pub.client.publish(f"{topic}/down", b"ready;", 1, retain=True).wait_for_publish(TIMEOUT)
        proc, out = observe_with_libcoap(cgw.suri(f"/ps/{topic}/down?qos=1"), psk)
        try:
            out.wait_for(b"ready;")
            pub.publish(f"{topic}/down", b"sealed notification;", 1)
            out.wait_for(b"sealed notification;")
        finally:
            end(proc)
        # a wrong key gets no answer, and the listener carries on
        bad = subprocess.run(
            ["coap-client-openssl", "-m", "post", "-u", PSK_ID, "-k", "wrong", "-B", "3",
             "-e", "x", cgw.suri(f"/ps/{topic}/up")],
            timeout=TIMEOUT, capture_output=True,
        )
        assert b"2.04" not in bad.stdout
        subprocess.run(
            ["coap-client-openssl", "-m", "post", *psk, "-e", "again",
             cgw.suri(f"/ps/{topic}/up")],
            check=True, timeout=TIMEOUT, capture_output=True,
        )
        assert sub.next_message() == (f"{topic}/up", b"again", 1)
    finally:
        pub.client.publish(f"{topic}/down", b"", 1, retain=True).wait_for_publish(TIMEOUT)
        sub.close()
        pub.close()


# ------------------------------------------------------------------ DTLS (certificates)


@needs_dtls
def test_libcoap_dtls_certificates_both_directions(cgw: CoapGateway, uid: str) -> None:
    """coap-client-openssl with a client certificate from ``gatewayctl certs issue``: POST
    reaches paho, observe receives MQTT publishes; the client id is the certificate's CN,
    so naming another is refused 4.03."""
    sub = paho(cgw, f"s-{uid}")
    pub = paho(cgw, f"p-{uid}")
    topic = f"dtlscert/{uid}"
    certs = cgw.cert_args()
    try:
        sub.subscribe(f"{topic}/up", 1)
        subprocess.run(
            ["coap-client-openssl", "-m", "post", *certs, "-B", "10", "-e", "over dtls, certified",
             cgw.curi(f"/ps/{topic}/up")],
            check=True, timeout=TIMEOUT, capture_output=True,
        )
        assert sub.next_message() == (f"{topic}/up", b"over dtls, certified", 1)
        pub.client.publish(f"{topic}/down", b"ready;", 1, retain=True).wait_for_publish(TIMEOUT)
        proc, out = observe_with_libcoap(cgw.curi(f"/ps/{topic}/down?qos=1"), certs)
        try:
            out.wait_for(b"ready;")
            pub.publish(f"{topic}/down", b"certified notification;", 1)
            out.wait_for(b"certified notification;")
        finally:
            end(proc)
        other = subprocess.run(
            ["coap-client-openssl", "-m", "post", *certs, "-B", "10", "-e", "x",
             cgw.curi(f"/ps/{topic}/up?clientid=someone-else")],
            timeout=TIMEOUT, capture_output=True,
        )
        assert b"4.03 client id 'someone-else' does not match the certificate cn 'dev1'" in (
            other.stdout + other.stderr
        )
    finally:
        pub.client.publish(f"{topic}/down", b"", 1, retain=True).wait_for_publish(TIMEOUT)
        sub.close()
        pub.close()


@needs_dtls
def test_libcoap_dtls_refused_certificates_and_garbage(cgw: CoapGateway, uid: str) -> None:
    """A certificate of another CA and a client without one are refused in the handshake;
    garbage datagrams from another port change nothing; a PSK device shares the port."""
    sub = paho(cgw, f"s-{uid}")
    topic = f"dtlsrefuse/{uid}"
    try:
        sub.subscribe(f"{topic}/#", 1)
        intruder = cgw.cert_args("intruder", cgw.pki / "other")
        for args in (intruder, ("-R", str(cgw.pki / "ca.crt"))):
            bad = subprocess.run(
                ["coap-client-openssl", "-m", "post", *args, "-B", "3", "-e", "x",
                 cgw.curi(f"/ps/{topic}/bad")],
                timeout=TIMEOUT, capture_output=True,
            )
            assert b"2.04" not in bad.stdout
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for junk in (b"\x16\xfe\xfd" + bytes(range(64)), b"\x17\xfe\xfd\x00\x01" + bytes(40),
                         b"\xff" * 300):
                s.sendto(junk, ("127.0.0.1", cgw.certs))
        subprocess.run(
            ["coap-client-openssl", "-m", "post", *cgw.cert_args(), "-B", "10", "-e", "fine",
             cgw.curi(f"/ps/{topic}/good")],
            check=True, timeout=TIMEOUT, capture_output=True,
        )
        assert sub.next_message() == (f"{topic}/good", b"fine", 1)
        subprocess.run(
            ["coap-client-openssl", "-m", "post", "-u", PSK_ID, "-k", PSK_KEY, "-B", "10",
             "-e", "psk too", cgw.curi(f"/ps/{topic}/psk")],
            check=True, timeout=TIMEOUT, capture_output=True,
        )
        assert sub.next_message() == (f"{topic}/psk", b"psk too", 1)
    finally:
        sub.close()
