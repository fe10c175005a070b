"""JWT authentication and HTTP authorization against a real gatewayd (TOML configuration,
loopback), with tokens signed by PyJWT in the test, a JWKS and an authorization service
served locally over HTTP, paho-mqtt and our own codec as clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import paho.mqtt.client as mqtt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from paho.mqtt.enums import CallbackAPIVersion

from protocols.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from tests.gateway.auth.live import TIMEOUT, Gatewayd, RawClient, http_service
from tests.harness.gatewayd import GatewaydProcess, gatewayd_command
from tests.harness.wait import until

pytestmark = [pytest.mark.slow, pytest.mark.security]

SECRET = "a-long-enough-hmac-secret-for-tests"


def start(tmp_path: Path, toml: str, **env: str) -> Gatewayd:
    conf = tmp_path / "gateway.toml"
    conf.write_text(toml)
    g = Gatewayd(tmp_path, **env)
    g.process = GatewaydProcess(tmp_path, g.env, command=gatewayd_command("--config", str(conf)),
                                log_path=g.log, ready_timeout=TIMEOUT)
    g.process.start()
    return g


@pytest.fixture
def gateways() -> Iterator[list[Gatewayd]]:
    started: list[Gatewayd] = []
    yield started
    for g in started:
        g.stop()


def hs256(**claims: Any) -> str:
    return jwt.encode(claims, SECRET, algorithm="HS256")


def connack(g: Gatewayd, client_id: str, token: str | None, username: str = "u") -> int:
    with RawClient(g.addr) as c:
        c.send(Connect(client_id, protocol_level=MQTT_5, username=username,
                       password=token.encode() if token is not None else None))
        ack = c.recv()
    assert isinstance(ack, ConnAck)
    return ack.reason_code


class Session:
    """A connected MQTT 5 client on our codec: publish/subscribe return reason codes."""

    def __init__(self, g: Gatewayd, client_id: str, token: str | None = None,
                 username: str = "u") -> None:
        self.c = RawClient(g.addr)
        self.c.send(Connect(client_id, protocol_level=MQTT_5, username=username,
                            password=token.encode() if token is not None else None))
        ack = self.c.recv()
        assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
        self.pid = 0

    def publish(self, topic: str) -> int:
        self.pid += 1
        self.c.send(Publish(topic, b"x", qos=1, packet_id=self.pid))
        ack = self.c.recv()
        assert isinstance(ack, PubAck)
        return ack.reason_code

    def subscribe(self, topic: str) -> int:
        self.pid += 1
        self.c.send(Subscribe(self.pid, [Subscription(topic, qos=1)]))
        ack = self.c.recv()
        assert isinstance(ack, SubAck)
        return ack.reason_codes[0]

    def close(self) -> None:
        self.c.close()


# ------------------------------------------------------------------ JWT

# a node where only a JWT lets a client in; with the HMAC secret of hs256()
JWT_ONLY = """
[authentication]
allow_anonymous = false
[authentication.jwt]
enable = true
"""
JWT_HS256 = JWT_ONLY + f'secret = "{SECRET}"\n'


def test_jwt_hs256_claims_expiry_and_acl(tmp_path, gateways):
    g = start(tmp_path, JWT_HS256 + """
verify_claims = { sub = "${clientid}", name = "${username}" }
""")
    gateways.append(g)
    later = int(time.time()) + 3600
    assert connack(g, "dev1", hs256(sub="dev1", name="u", exp=later)) == 0
    # wrong claim, expired, not yet valid: bad user name or password
    assert connack(g, "dev2", hs256(sub="dev1", name="u", exp=later)) == 0x86
    assert connack(g, "dev1", hs256(sub="dev1", name="u", exp=int(time.time()) - 60)) == 0x86
    assert connack(g, "dev1", hs256(sub="dev1", name="u", nbf=later)) == 0x86
    # a wrong signature is ignored by the authenticator; no one else accepts: refused
    forged = jwt.encode({"sub": "dev1", "name": "u"}, SECRET[::-1], algorithm="HS256")
    assert connack(g, "dev1", forged) in (0x86, 0x87)
    assert "JWT of dev1 ignored" in g.log.read_text()
    # ACL claim: the rules of the token, first match wins
    acl = [
        {"permission": "allow", "action": "publish", "topic": "dev/${clientid}/#"},
        {"permission": "allow", "action": "subscribe", "topic": "cmd/${clientid}"},
        {"permission": "deny", "action": "all", "topic": "#"},
    ]
    s = Session(g, "dev1", hs256(sub="dev1", name="u", exp=later, acl=acl))
    try:
        assert s.publish("dev/dev1/temp") in (0, 0x10)
        assert s.publish("dev/dev2/temp") == 0x87
        assert s.subscribe("cmd/dev1") == 1
        assert s.subscribe("cmd/dev2") == 0x87
    finally:
        s.close()


def test_jwt_expiry_disconnects_the_session(tmp_path, gateways):
    g = start(tmp_path, JWT_HS256)
    gateways.append(g)
    gone = threading.Event()
    reasons: list[int] = []
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="short", protocol=mqtt.MQTTv5,
                    reconnect_on_failure=False)
    c.username_pw_set("u", hs256(exp=int(time.time()) + 3))
    connected = threading.Event()
    c.on_connect = lambda *a: connected.set()

    def on_disconnect(client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        reasons.append(rc.value)
        gone.set()

    c.on_disconnect = on_disconnect
    c.connect(*g.addr)
    c.loop_start()
    try:
        assert connected.wait(TIMEOUT)
        assert gone.wait(15), "still connected after the token expired"
        assert reasons == [0x87]
        # the line is logged just after the DISCONNECT is written: a bounded poll
        until("the 'its JWT expired' line", lambda: "its JWT expired" in g.log.read_text(),
              TIMEOUT)
    finally:
        c.loop_stop()


def _rsa() -> tuple[Any, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    return key, pem.decode()


def test_jwt_rs256_public_key_file(tmp_path, gateways):
    key, pub = _rsa()
    (tmp_path / "jwt.pub").write_text(pub)
    g = start(tmp_path, JWT_ONLY + f"""
algorithm = "public-key"
public_key = "{tmp_path / 'jwt.pub'}"
""")
    gateways.append(g)
    assert connack(g, "r1", jwt.encode({"sub": "r1"}, key, algorithm="RS256")) == 0
    other, _ = _rsa()
    assert connack(g, "r1", jwt.encode({"sub": "r1"}, other, algorithm="RS256")) in (0x86, 0x87)
    # HS256 signed with the public key's text (the classic confusion): not accepted
    with pytest.raises(jwt.InvalidKeyError):
        jwt.encode({"sub": "r1"}, pub, algorithm="HS256")  # PyJWT refuses to even make it
    assert connack(g, "r1", hs256(sub="r1")) in (0x86, 0x87)


@contextlib.contextmanager
def serve_jwks(ssl_context: Any = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """Serves ``state["jwks"]`` as JSON at /jwks (https with ``ssl_context``); counts
    requests in ``state["hits"]``."""
    from aiohttp import web

    state: dict[str, Any] = {"jwks": {"keys": []}, "hits": 0}
    ready = threading.Event()

    async def handle(request: web.Request) -> web.Response:
        state["hits"] += 1
        return web.json_response(state["jwks"])

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/jwks", handle)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        state["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        state["stop"] = asyncio.Event()
        state["loop"] = asyncio.get_running_loop()
        ready.set()
        await state["stop"].wait()
        await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(TIMEOUT)
    scheme = "https" if ssl_context is not None else "http"
    try:
        yield f"{scheme}://127.0.0.1:{state['port']}/jwks", state
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(TIMEOUT)


@pytest.fixture
def jwks_server() -> Iterator[tuple[str, dict[str, Any]]]:
    with serve_jwks() as served:
        yield served


def _jwk(key: Any, kid: str) -> dict[str, Any]:
    data = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return {**data, "kid": kid, "use": "sig", "alg": "RS256"}


def test_jwt_jwks_fetched_cached_and_refetched_for_a_new_kid(tmp_path, gateways, jwks_server):
    url, state = jwks_server
    k1, _ = _rsa()
    k2, _ = _rsa()
    state["jwks"] = {"keys": [_jwk(k1, "one")]}
    g = start(tmp_path, JWT_ONLY + f"""
use_jwks = true
endpoint = "{url}"
refresh_interval = "1h"
""")
    gateways.append(g)
    tok1 = jwt.encode({"sub": "j"}, k1, algorithm="RS256", headers={"kid": "one"})
    assert connack(g, "j1", tok1) == 0
    assert connack(g, "j2", tok1) == 0
    hits = state["hits"]
    assert hits == 1  # fetched once at start, then cached
    # key rotation: the service now signs with "two"; an unknown kid makes us fetch again
    state["jwks"] = {"keys": [_jwk(k1, "one"), _jwk(k2, "two")]}
    tok2 = jwt.encode({"sub": "j"}, k2, algorithm="RS256", headers={"kid": "two"})
    assert connack(g, "j3", tok2) == 0
    assert state["hits"] == hits + 1
    # a token for a kid the JWKS does not have: ignored (not refetched within 10 s)
    k3, _ = _rsa()
    tok3 = jwt.encode({"sub": "j"}, k3, algorithm="RS256", headers={"kid": "three"})
    assert connack(g, "j4", tok3) in (0x86, 0x87)
    assert state["hits"] == hits + 1


def test_jwks_over_https_with_a_private_ca(tmp_path, gateways):
    """[authentication.jwt.ssl] cacertfile: the JWKS of an https endpoint whose
    certificate comes from a private CA is fetched; without it (the system's CAs) the
    fetch fails and a token is not accepted; a bad cacertfile is one --check line."""
    import ssl
    import subprocess

    from gateway.security.pki import init_ca, issue

    pki = tmp_path / "pki"
    init_ca(pki)
    issue(pki, "jwks")  # SANs localhost, 127.0.0.1, ::1
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(pki / "jwks.crt", pki / "jwks.key")
    key, _ = _rsa()
    token = jwt.encode({"sub": "j"}, key, algorithm="RS256", headers={"kid": "k"})
    conf = """
[authentication]
allow_anonymous = false
[authentication.jwt]
enable = true
use_jwks = true
endpoint = "{url}"
refresh_interval = "1h"
"""
    with serve_jwks(server_ctx) as (url, state):
        state["jwks"] = {"keys": [_jwk(key, "k")]}
        (tmp_path / "a").mkdir()
        g = start(tmp_path / "a", conf.format(url=url) + f"""
[authentication.jwt.ssl]
enable = true
cacertfile = "{pki / 'ca.crt'}"
""")
        gateways.append(g)
        assert connack(g, "j1", token) == 0
        (tmp_path / "b").mkdir()
        without = start(tmp_path / "b", conf.format(url=url))
        gateways.append(without)
        assert connack(without, "j2", token) in (0x86, 0x87)
        assert "JWKS from" in without.log.read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(conf.format(url="https://127.0.0.1:1/jwks") + """
[authentication.jwt.ssl]
enable = true
cacertfile = "/nonexistent/ca.crt"
""")
    r = subprocess.run(gatewayd_command("--config", str(bad), "--check"), capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "authentication.jwt.ssl.cacertfile" in lines[0], r.stderr


def test_jwt_config_errors_are_one_line(tmp_path):
    import subprocess
    import sys

    conf = tmp_path / "bad.toml"
    conf.write_text('[authentication.jwt]\nenable = true\nalgorithm = "public-key"\n')
    r = subprocess.run([sys.executable, "-m", "gateway.cli.gatewayd", "--config", str(conf),
                        "--check"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2
    assert "public_key" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ HTTP authorization


async def _authz(body: dict[str, Any]) -> tuple[int, Any]:
    topic = body["topic"]
    if topic.startswith("allowed/"):
        return 200, {"result": "allow"}
    if topic.startswith("denied/"):
        return 200, {"result": "deny"}
    if topic.startswith("slow/"):
        await asyncio.sleep(3)
        return 200, {"result": "allow"}
    if topic.startswith("gone/"):
        return 404, None
    return 200, {"result": "ignore"}


def test_http_authorization_allow_deny_ignore_timeout_cache(tmp_path, gateways):
    with http_service(_authz) as (url, received):
        g = start(tmp_path, f"""
[authorization]
no_match = "allow"
[[authorization.rules]]
permission = "deny"
action = "all"
topics = ["ruled/#"]
[[authorization.sources]]
type = "http"
url = "{url}"
request_timeout = "500ms"
[authorization.sources.body]
clientid = "${{clientid}}"
username = "${{username}}"
action = "${{action}}"
topic = "${{topic}}"
""", GATEWAY_AUTHENTICATION__ALLOW_ANONYMOUS="true")
        gateways.append(g)
        s = Session(g, "h1", username="hu")
        try:
            assert s.publish("allowed/x") in (0, 0x10)
            assert received[-1] == {"clientid": "h1", "username": "hu", "action": "publish",
                                    "topic": "allowed/x"}
            assert s.publish("denied/x") == 0x87
            assert s.subscribe("denied/y") == 0x87
            assert s.subscribe("allowed/y") == 1
            n = len(received)
            assert s.subscribe("allowed/y") == 1  # cached: the service is not asked again
            assert len(received) == n
            # ignore and 4xx: the rules decide (no_match allow; the rule denies ruled/#)
            assert s.publish("other/x") in (0, 0x10)
            assert s.publish("gone/x") in (0, 0x10)
            assert s.subscribe("ruled/x") == 0x87
            # timeout: on_error = deny (the default)
            t0 = time.monotonic()
            assert s.subscribe("slow/x") == 0x87
            assert time.monotonic() - t0 < 2.5
            assert "HTTP authorization at" in g.log.read_text()
        finally:
            s.close()


def test_http_authorization_waits_without_stalling_the_broker(tmp_path, gateways):
    """One client's decision is held by the service; meanwhile another client's publishes
    (each asking the service too) go through, and the held client's packets keep their
    order: its PUBACKs and its messages come after the answer, first to last."""
    asked = threading.Event()
    held: dict[str, Any] = {}

    async def handler(body: dict[str, Any]) -> tuple[int, Any]:
        if body["topic"].startswith("hold/"):
            held["loop"] = asyncio.get_running_loop()
            held["release"] = release = asyncio.Event()
            asked.set()
            await release.wait()
        return 200, {"result": "allow"}

    with http_service(handler) as (url, received):
        g = start(tmp_path, f"""
[authorization]
no_match = "allow"
[[authorization.sources]]
type = "http"
url = "{url}"
request_timeout = "60s"
""", GATEWAY_AUTHENTICATION__ALLOW_ANONYMOUS="true")
        gateways.append(g)
        watcher, a, b = Session(g, "w"), Session(g, "a"), Session(g, "b")
        try:
            assert watcher.subscribe("#") == 1
            a.pid = 2
            a.c.send(Publish("hold/1", b"first", qos=1, packet_id=1))
            a.c.send(Publish("next/2", b"second", qos=1, packet_id=2))
            assert asked.wait(TIMEOUT)
            for i in range(20):  # served while a's decision is pending
                assert b.publish(f"b/{i}") == 0
            assert not held["release"].is_set()
            a.c.sock.setblocking(False)
            with pytest.raises(BlockingIOError):  # nothing for a yet: it waits
                a.c.sock.recv(1)
            a.c.sock.setblocking(True)
            held["loop"].call_soon_threadsafe(held["release"].set)
            assert [a.c.recv(), a.c.recv()] == [PubAck(1), PubAck(2)]
            topics = []
            while len(topics) < 22:
                p = watcher.c.recv()
                if isinstance(p, Publish):
                    topics.append(p.topic)
            assert topics == [f"b/{i}" for i in range(20)] + ["hold/1", "next/2"]
            assert [r["topic"] for r in received].count("hold/1") == 1
        finally:
            for s in (watcher, a, b):
                s.close()


def test_jwt_client_attrs_reach_the_http_authorization_template(tmp_path, gateways):
    """EMQX 5.7's ``client_attrs`` claim: ``${client_attrs.role}`` in the HTTP source's
    body carries the token's attribute (empty when the token has none); a claim that is
    not an object of strings refuses the token (0x86)."""
    async def by_role(body: dict[str, Any]) -> tuple[int, Any]:
        return 200, {"result": "allow" if body["role"] == "admin" else "deny"}

    with http_service(by_role) as (url, received):
        g = start(tmp_path, JWT_HS256 + f"""
[[authorization.sources]]
type = "http"
url = "{url}"
[authorization.sources.body]
clientid = "${{clientid}}"
topic = "${{topic}}"
role = "${{client_attrs.role}}"
""")
        gateways.append(g)
        admin = Session(g, "a1", hs256(sub="a1", client_attrs={"role": "admin", "sn": "7"}))
        viewer = Session(g, "v1", hs256(sub="v1", client_attrs={"role": "viewer"}))
        plain = Session(g, "p1", hs256(sub="p1"))
        try:
            assert admin.publish("cmd/x") in (0, 0x10)
            assert received[-1] == {"clientid": "a1", "topic": "cmd/x", "role": "admin"}
            assert viewer.publish("cmd/x") == 0x87
            assert plain.publish("cmd/x") == 0x87
            assert received[-1]["role"] == ""
        finally:
            for s in (admin, viewer, plain):
                s.close()
        assert connack(g, "b1", hs256(sub="b1", client_attrs=["role", "admin"])) == 0x86
        assert connack(g, "b2", hs256(sub="b2", client_attrs={"n": 1})) == 0x86


def test_jwt_client_attrs_in_authorization_rule_topics(tmp_path, gateways):
    """``${client_attrs.NAME}`` in ``[[authorization.rules]]`` topics and in a token's
    ``acl`` claim: the token's attribute picks the client's subtree; a client whose token
    has no such attribute matches no such rule (denied by the rule after it)."""
    g = start(tmp_path, JWT_HS256 + """
[authorization]
no_match = "deny"
[[authorization.rules]]
permission = "allow"
action = "all"
topics = ["sites/${client_attrs.site}/#"]
""")
    gateways.append(g)
    s7 = Session(g, "a1", hs256(sub="a1", client_attrs={"site": "s7"}))
    bare = Session(g, "b1", hs256(sub="b1"))
    wild = Session(g, "w1", hs256(sub="w1", client_attrs={"site": "+"}))
    acl = [{"permission": "allow", "action": "publish", "topic": "own/${client_attrs.site}"},
           {"permission": "deny", "action": "all", "topic": "#"}]
    claim = Session(g, "c1", hs256(sub="c1", client_attrs={"site": "s9"}, acl=acl))
    try:
        assert s7.publish("sites/s7/temp") in (0, 0x10)
        assert s7.subscribe("sites/s7/#") == 1
        assert s7.publish("sites/s8/temp") == 0x87
        assert s7.subscribe("sites/+/temp") == 0x87
        assert bare.publish("sites/s7/temp") == 0x87
        assert wild.subscribe("sites/+/temp") == 0x87  # a value is never a wildcard
        assert claim.publish("own/s9") in (0, 0x10)
        assert claim.publish("own/s7") == 0x87
    finally:
        for s in (s7, bare, wild, claim):
            s.close()
