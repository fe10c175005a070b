"""TLS listeners end to end: a real gatewayd, certificates from ``gatewayctl certs``, and
independent clients (paho-mqtt, mosquitto_pub/mosquitto_sub). In-process tests of
``gateway.net.tls`` (contexts, versions, ciphers, identities, reload) come first."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from cryptography import x509

from gateway.config import SslListener
from gateway.net.tls import (
    ReloadableContext,
    TlsError,
    build_context,
    identity_of,
    peer_identity,
)

from .clients import (
    HAVE_MOSQUITTO_CLIENTS,
    Client,
    MosquittoSub,
    Refused,
    mosquitto_pub,
    tls_peer_serial,
)
from .conftest import GatewayFactory, Pki, gatewayctl

needs_mosquitto = pytest.mark.skipif(
    not HAVE_MOSQUITTO_CLIENTS, reason="mosquitto_pub/mosquitto_sub not installed"
)


def serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def listener(pki: Pki, **kw: object) -> SslListener:
    fields: dict[str, object] = {"certfile": pki.crt("server"), "keyfile": pki.key("server")}
    return SslListener.model_validate({**fields, **kw})


def server_ssl(pki: Pki, **kw: str) -> dict[str, str]:
    return {"certfile": str(pki.crt("server")), "keyfile": str(pki.key("server")), **kw}


def mtls(pki: Pki, **kw: str) -> dict[str, str]:
    """Mutual TLS: a client certificate from our CA is required."""
    required = {"cacertfile": str(pki.ca), "verify": "verify_peer", "fail_if_no_peer_cert": "true"}
    return server_ssl(pki, **{**required, **kw})


# ------------------------------------------------------------------ in process


def client_context(pki: Pki, name: str | None = None, **kw: object) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if name is not None:
        ctx.load_cert_chain(pki.crt(name), pki.key(name))
    for k, v in kw.items():
        setattr(ctx, k, v)
    return ctx


async def _handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> dict[str, object]:
    """One TLS connection to an in-process server; what each side saw."""
    seen: dict[str, object] = {}
    done = asyncio.Event()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["identity"] = peer_identity(writer.transport)
        seen["server_version"] = writer.get_extra_info("ssl_object").version()
        writer.write(b"x")
        await writer.drain()
        await reader.read()
        writer.close()
        done.set()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname="localhost"
        )
        if await reader.read(1) != b"x":  # TLS 1.3: a refused client certificate shows here
            raise ConnectionError("closed by the server")
        obj = writer.get_extra_info("ssl_object")
        seen["cipher"] = obj.cipher()[0]
        seen["version"] = obj.version()
        seen["serial"] = x509.load_der_x509_certificate(obj.getpeercert(True)).serial_number
        writer.close()
        await asyncio.wait_for(done.wait(), 5)
    finally:
        server.close()
    return seen


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> dict[str, object]:
    return asyncio.run(asyncio.wait_for(_handshake(server_ctx, client_ctx), 10))


def test_default_context_serves_tls12_and_13_without_client_certificates(pki):
    ctx = build_context(listener(pki))
    assert ctx.verify_mode == ssl.CERT_NONE
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.maximum_version == ssl.TLSVersion.TLSv1_3
    seen = handshake(ctx, client_context(pki))
    assert seen["version"] == "TLSv1.3"
    assert seen["identity"] is None
    assert seen["serial"] == serial(pki.crt("server"))
    tls12 = client_context(pki, maximum_version=ssl.TLSVersion.TLSv1_2)
    assert handshake(ctx, tls12)["version"] == "TLSv1.2"


def test_versions_restrict_the_protocol(pki):
    ctx = build_context(listener(pki, versions=["tlsv1.3"]))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        handshake(ctx, client_context(pki, maximum_version=ssl.TLSVersion.TLSv1_2))
    ctx = build_context(listener(pki, versions=["tlsv1.2"]))
    assert handshake(ctx, client_context(pki))["version"] == "TLSv1.2"


def test_ciphers_apply_to_tls12(pki):
    ctx = build_context(
        listener(pki, versions="tlsv1.2", ciphers=["ECDHE-ECDSA-CHACHA20-POLY1305"])
    )
    assert handshake(ctx, client_context(pki))["cipher"] == "ECDHE-ECDSA-CHACHA20-POLY1305"
    with pytest.raises(TlsError) as err:
        build_context(listener(pki, ciphers="NO-SUCH-CIPHER"))
    assert err.value.key == "ciphers"


def test_verify_modes(pki):
    optional = build_context(
        listener(pki, verify="verify_peer", cacertfile=pki.ca)
    )
    assert optional.verify_mode == ssl.CERT_OPTIONAL
    required = build_context(
        listener(pki, verify="verify_peer", cacertfile=pki.ca, fail_if_no_peer_cert=True)
    )
    assert required.verify_mode == ssl.CERT_REQUIRED
    assert handshake(optional, client_context(pki))["identity"] is None
    seen = handshake(required, client_context(pki, "dev3"))
    assert seen["identity"] == {"cn": "dev3", "dn": "CN=dev3", "san": "dev3.plant.local"}
    with pytest.raises((ssl.SSLError, ConnectionError)):
        handshake(required, client_context(pki))
    intruder = client_context(pki)
    intruder.load_cert_chain(pki.other / "intruder.crt", pki.other / "intruder.key")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        handshake(optional, intruder)


@pytest.mark.parametrize(
    ("change", "key", "reason"),
    [
        ({"certfile": "missing.crt"}, "certfile", "no such file"),
        ({"certfile": "@server.key"}, "certfile", "no PEM certificate"),
        ({"keyfile": "@server.crt"}, "keyfile", "not a PEM private key"),
        ({"keyfile": "@dev1.key"}, "keyfile", "does not match certfile"),
        ({"cacertfile": "@dev1.key", "verify": "verify_peer"}, "cacertfile", "no PEM certificate"),
    ],
)
def test_build_context_names_the_bad_key(pki, tmp_path, change, key, reason):
    fields: dict[str, object] = {}
    for k, v in change.items():
        if k == "verify":
            fields[k] = v
        else:
            fields[k] = pki.dir / v[1:] if v.startswith("@") else tmp_path / v
    with pytest.raises(TlsError) as err:
        build_context(listener(pki, **fields))
    assert err.value.key == key
    assert reason in err.value.reason


def test_encrypted_keys_need_their_password(pki, tmp_path):
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.key("server").read_bytes(), None)
    encrypted = tmp_path / "enc.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(TlsError, match="is encrypted: give password or password_file"):
        build_context(listener(pki, keyfile=encrypted))
    with pytest.raises(TlsError, match="wrong password") as err:
        build_context(listener(pki, keyfile=encrypted, password="nope"))
    assert err.value.key == "password"
    build_context(listener(pki, keyfile=encrypted, password="secret"))  # opens
    with pytest.raises(TlsError, match="is not encrypted"):
        build_context(listener(pki, password="secret"))


def test_identity_of_reads_cn_dn_and_first_dns_or_uri_san(pki, tmp_path):
    assert identity_of(x509.load_pem_x509_certificate(pki.crt("dev1").read_bytes())) == {
        "cn": "dev1",
        "dn": "CN=dev1",
    }
    gatewayctl("certs", "init-ca", tmp_path)
    gatewayctl(
        "certs", "issue", tmp_path, "d", "--client", "--san", "10.0.0.1", "--san",
        "URI:spiffe://plant/d", "--san", "d.local",
    )
    ident = identity_of(x509.load_pem_x509_certificate((tmp_path / "d.crt").read_bytes()))
    assert ident["san"] == "spiffe://plant/d"  # the IP address is skipped


def test_reloadable_context_swaps_for_new_handshakes_only(pki, tmp_path):
    shutil.copy(pki.crt("server"), tmp_path / "s.crt")
    shutil.copy(pki.key("server"), tmp_path / "s.key")
    holder = ReloadableContext(
        "ssl:test", SslListener(certfile=tmp_path / "s.crt", keyfile=tmp_path / "s.key")
    )
    first = handshake(holder.server_context, client_context(pki))["serial"]
    assert first == serial(pki.crt("server"))
    shutil.copy(pki.crt("dev3"), tmp_path / "s.crt")  # any certificate of ours will do
    shutil.copy(pki.key("dev3"), tmp_path / "s.key")
    assert holder.reload()
    # dev3's certificate has no serverAuth/localhost: check only which one is served
    anything = client_context(pki, check_hostname=False, verify_mode=ssl.CERT_NONE)
    assert handshake(holder.server_context, anything)["serial"] == serial(pki.crt("dev3"))
    (tmp_path / "s.key").write_text("broken")
    assert not holder.reload()  # logged, and the previous context stays
    assert handshake(holder.server_context, anything)["serial"] == serial(pki.crt("dev3"))


# ------------------------------------------------------------------ configuration


def check(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    full = {"PATH": "/usr/bin:/bin", **env}
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.gatewayd", "--check"],
        capture_output=True, text=True, env=full, cwd=cwd, timeout=60, check=False,
    )


def test_config_file_paths_are_relative_to_the_file(pki, tmp_path):
    conf = tmp_path / "gw.toml"
    for name in ("server.crt", "server.key", "ca.crt"):
        shutil.copy(pki.dir / name, tmp_path / name)
    conf.write_text(
        '[listeners.ssl.default]\ncertfile = "server.crt"\nkeyfile = "server.key"\n'
        'cacertfile = "ca.crt"\nverify = "verify_peer"\nfail_if_no_peer_cert = true\n'
        'peer_cert_as_clientid = "cn"\nversions = ["tlsv1.3"]\n'
    )
    from gateway.config import load_config

    cfg = load_config(conf, environ={})
    ssl_default = cfg.listeners.ssl["default"]
    assert ssl_default.certfile == tmp_path / "server.crt"
    assert ssl_default.cacertfile == tmp_path / "ca.crt"
    assert ssl_default.port == 8883
    assert load_config(None, environ={}).listeners.ssl == {}  # none by default


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CERTFILE": "{dir}/nope.crt", "KEYFILE": "{dir}/server.key"},
         'listeners.ssl.default.certfile: no such file "{dir}/nope.crt"'),
        ({"CERTFILE": "{dir}/server.crt", "KEYFILE": "{dir}/dev1.key"},
         'listeners.ssl.default.keyfile: "{dir}/dev1.key" does not match certfile'),
        ({"CERTFILE": "{dir}/server.crt"},
         "listeners.ssl.default: an enabled ssl listener needs certfile and keyfile"),
        ({"CERTFILE": "{dir}/server.crt", "KEYFILE": "{dir}/server.key", "VERIFY": "verify_peer"},
         'listeners.ssl.default: verify = "verify_peer" needs cacertfile'),
        ({"CERTFILE": "{dir}/server.crt", "KEYFILE": "{dir}/server.key",
          "PEER_CERT_AS_USERNAME": "cn"},
         'listeners.ssl.default: peer_cert_as_username needs verify = "verify_peer"'),
        ({"CERTFILE": "{dir}/server.crt", "KEYFILE": "{dir}/server.key",
          "VERSIONS": "tlsv1.1,tlsv1.3"},
         "listeners.ssl.default: versions must be a contiguous range"),
        ({"CERTFILE": "{dir}/server.crt", "KEYFILE": "{dir}/server.key",
          "CIPHERS": "BOGUS"},
         'listeners.ssl.default.ciphers: no cipher matches "BOGUS"'),
        ({"CERTFILE": "{dir}/server.crt", "KEYFILE": "{dir}/server.key",
          "PEER_CERT_AS_CLIENTID": "email"},
         "listeners.ssl.default.peer_cert_as_clientid: Input should be"),
        ({"CERTFILE": "{dir}/server.crt", "KEYFILE": "{dir}/server.key",
          "BIND": "0.0.0.0:1883"},
         "listeners: listeners tcp.default and ssl.default both bind 0.0.0.0:1883"),
    ],
)
def test_invalid_tls_configuration_exits_2_with_one_line(pki, tmp_path, env, message):
    full = {
        f"GATEWAY_LISTENERS__SSL__DEFAULT__{k}": v.format(dir=pki.dir) for k, v in env.items()
    }
    r = check(full, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("gatewayd: invalid configuration: " + message.format(dir=pki.dir))


def test_a_disabled_ssl_listener_needs_no_files(tmp_path):
    r = check({"GATEWAY_LISTENERS__SSL__SPARE__ENABLE": "false"}, tmp_path)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------ a real gatewayd: TLS


def test_paho_over_tls_reaches_a_plain_tcp_subscriber(pki, gatewayd: GatewayFactory):
    gw = gatewayd(server_ssl(pki))
    sub = Client(gw.tcp).connect()
    sub.subscribe("tls/#")
    pub = Client(gw.ssl, cafile=pki.ca, protocol=mqtt.MQTTv5).connect()
    pub.publish("tls/a", b"over TLS")
    assert sub.receive() == ("tls/a", b"over TLS")
    tls_sub = Client(gw.ssl, cafile=pki.ca).connect()
    tls_sub.subscribe("back/#")
    Client(gw.tcp).connect().publish("back/1", b"to TLS")
    assert tls_sub.receive() == ("back/1", b"to TLS")
    for c in (sub, pub, tls_sub):
        c.close()
    # a client that does not trust our CA refuses the server
    with pytest.raises(Refused):
        Client(gw.ssl, cafile=pki.other / "ca.crt").connect()
    # plain MQTT on the TLS port gets nowhere
    with pytest.raises(Refused):
        Client(gw.ssl).connect()


@pytest.mark.interop
@needs_mosquitto
def test_mosquitto_clients_over_tls(pki, gatewayd: GatewayFactory):
    gw = gatewayd(server_ssl(pki))
    sub = MosquittoSub(gw.ssl, pki.ca, "-t", "m/#", "-v", "-q", "1")
    try:
        r = mosquitto_pub(gw.ssl, pki.ca, "-t", "m/1", "-m", "hello", "-q", "1", "-V", "mqttv5")
        assert r.returncode == 0, r.stderr
        assert sub.next_message() == "m/1 hello"
    finally:
        sub.close()
    r = mosquitto_pub(gw.ssl, pki.other / "ca.crt", "-t", "m/1", "-m", "x")
    assert r.returncode != 0


# ------------------------------------------------------------------ mutual TLS

OWN_TOPICS = (
    '[{permission="allow", action="publish", topics=["devices/${clientid}/#"]},'
    ' {permission="deny", action="publish", topics=["devices/#"]}]'
)


@pytest.fixture
def mtls_gw(pki, gatewayd: GatewayFactory):
    return gatewayd(
        mtls(pki, peer_cert_as_clientid="cn"), {"GATEWAY_AUTHORIZATION__RULES": OWN_TOPICS}
    )


def test_mutual_tls_with_paho(pki, mtls_gw):
    c = Client(mtls_gw.ssl, cafile=pki.ca, cert=pki.crt("dev1"), key=pki.key("dev1")).connect()
    assert c.connected
    c.close()
    with pytest.raises(Refused):  # no client certificate
        Client(mtls_gw.ssl, cafile=pki.ca).connect()
    with pytest.raises(Refused):  # a certificate from another CA
        Client(
            mtls_gw.ssl, cafile=pki.ca,
            cert=pki.other / "intruder.crt", key=pki.other / "intruder.key",
        ).connect()


def test_certificate_cn_becomes_the_client_id(pki, mtls_gw):
    """The client says it is "spoofed"; its certificate says dev1, and dev1 it is: it may
    publish under devices/dev1/ only (a ${clientid} rule)."""
    watcher = Client(mtls_gw.tcp).connect()
    watcher.subscribe("devices/#")
    dev1 = Client(
        mtls_gw.ssl, client_id="spoofed", cafile=pki.ca, cert=pki.crt("dev1"),
        key=pki.key("dev1"),
    ).connect()
    dev1.publish("devices/spoofed/up", b"denied")  # acknowledged, dropped
    dev1.publish("devices/dev1/up", b"allowed")
    assert watcher.receive() == ("devices/dev1/up", b"allowed")
    # the same certificate under another client id takes the session over
    again = Client(
        mtls_gw.ssl, client_id="other", cafile=pki.ca, cert=pki.crt("dev1"),
        key=pki.key("dev1"), protocol=mqtt.MQTTv5,
    ).connect()
    assert dev1._gone.wait(10), "dev1's first connection was not taken over"
    again.close()
    watcher.close()


@pytest.mark.interop
@needs_mosquitto
def test_mutual_tls_with_mosquitto_clients(pki, mtls_gw):
    """mosquitto_sub/mosquitto_pub with --cert/--key; the CN (dev2) is the client id, so
    dev2 may only publish under devices/dev2/, whatever -i says."""
    dev2 = {"cert": pki.crt("dev2"), "key": pki.key("dev2")}
    sub = MosquittoSub(
        mtls_gw.ssl, pki.ca, "-t", "devices/#", "-v", cert=pki.crt("dev3"), key=pki.key("dev3")
    )
    try:
        for topic, text in (("devices/x/up", "denied"), ("devices/dev2/up", "allowed")):
            r = mosquitto_pub(mtls_gw.ssl, pki.ca, "-t", topic, "-m", text, "-q", "1",
                              "-i", "x", **dev2)
            assert r.returncode == 0, r.stderr
        assert sub.next_message() == "devices/dev2/up allowed"
    finally:
        sub.close()
    r = mosquitto_pub(mtls_gw.ssl, pki.ca, "-t", "t", "-m", "no cert")
    assert r.returncode != 0
    r = mosquitto_pub(mtls_gw.ssl, pki.ca, "-t", "t", "-m", "other CA",
                      cert=pki.other / "intruder.crt", key=pki.other / "intruder.key")
    assert r.returncode != 0


def test_optional_client_certificates_and_san_username(pki, gatewayd: GatewayFactory):
    """verify_peer without fail_if_no_peer_cert: clients may come without a certificate;
    those with one are named by it (here: client id from the SAN, username from the CN)."""
    rules = (
        '[{permission="deny", action="publish", username="dev3", topics=["secret/#"]},'
        ' {permission="allow", action="publish", topics=["san/${clientid}"]},'
        ' {permission="deny", action="publish", topics=["san/#"]}]'
    )
    gw = gatewayd(
        server_ssl(
            pki, cacertfile=str(pki.ca), verify="verify_peer",
            peer_cert_as_clientid="san", peer_cert_as_username="cn",
        ),
        {"GATEWAY_AUTHORIZATION__RULES": rules},
    )
    watcher = Client(gw.tcp).connect()
    watcher.subscribe("#")
    anonymous = Client(gw.ssl, cafile=pki.ca, client_id="anon").connect()
    anonymous.publish("secret/1", b"anon may")
    assert watcher.receive() == ("secret/1", b"anon may")
    dev3 = Client(
        gw.ssl, client_id="x", username="someone", cafile=pki.ca, cert=pki.crt("dev3"),
        key=pki.key("dev3"),
    ).connect()
    dev3.publish("secret/2", b"dev3 may not")  # username dev3, from the CN
    dev3.publish("san/x", b"nor here")
    dev3.publish("san/dev3.plant.local", b"but here")  # client id from the SAN
    assert watcher.receive() == ("san/dev3.plant.local", b"but here")
    # dev1's certificate has no SAN: refused with 0x85 (client identifier not valid)
    v5 = Client(gw.ssl, cafile=pki.ca, cert=pki.crt("dev1"), key=pki.key("dev1"),
                protocol=mqtt.MQTTv5)
    with pytest.raises(Refused, match="reason code 133"):
        v5.connect()
    for c in (watcher, anonymous, dev3):
        c.close()


def test_a_certificate_authenticates_when_anonymous_access_is_off(pki, gatewayd: GatewayFactory):
    """``peer_cert_authenticates``: with allow_anonymous off, a client with a certificate
    from our CA and no password is in (user name from the CN); one without a certificate
    is refused with 0x87 (not authorized); a certificate plus a password still goes
    through the authentication chain (no such user: 0x86)."""
    gw = gatewayd(
        server_ssl(
            pki, cacertfile=str(pki.ca), verify="verify_peer",
            peer_cert_as_username="cn", peer_cert_authenticates="true",
        ),
        {"GATEWAY_AUTHENTICATION__ALLOW_ANONYMOUS": "false"},
    )
    dev1 = Client(gw.ssl, client_id="d1", cafile=pki.ca, cert=pki.crt("dev1"),
                  key=pki.key("dev1"), protocol=mqtt.MQTTv5).connect()
    assert dev1.connected
    dev1.close()
    with pytest.raises(Refused, match="reason code 135"):
        Client(gw.ssl, client_id="nocert", cafile=pki.ca, protocol=mqtt.MQTTv5).connect()
    with pytest.raises(Refused, match="reason code 134"):
        Client(gw.ssl, client_id="d1", username="x", password="guess", cafile=pki.ca,
               cert=pki.crt("dev1"), key=pki.key("dev1"), protocol=mqtt.MQTTv5).connect()


# ------------------------------------------------------------------ SIGHUP reload


def test_sighup_reloads_the_certificate_without_dropping_connections(
    pki, gatewayd: GatewayFactory, tmp_path
):
    certs = tmp_path / "pki"
    shutil.copytree(pki.dir, certs)
    gw = gatewayd({"certfile": str(certs / "server.crt"), "keyfile": str(certs / "server.key")})
    old = serial(certs / "server.crt")
    assert tls_peer_serial(gw.ssl, certs / "ca.crt") == old
    established = Client(gw.ssl, cafile=certs / "ca.crt").connect()
    established.subscribe("reload/#")

    gatewayctl("certs", "issue", certs, "server", "--force")
    new = serial(certs / "server.crt")
    assert new != old
    gw.hup("TLS reloaded")
    assert tls_peer_serial(gw.ssl, certs / "ca.crt") == new
    fresh = Client(gw.ssl, cafile=certs / "ca.crt").connect()  # a new connection: new cert
    fresh.publish("reload/1", b"after")
    assert established.receive() == ("reload/1", b"after")  # the old connection lives on
    assert established.connected
    established.publish("reload/2", b"old conn")
    assert established.receive() == ("reload/2", b"old conn")

    # a broken file: the error is logged, the previous certificate stays in service
    (certs / "server.key").write_text("half-copied")
    gw.hup("TLS reload failed")
    assert "keyfile: not a PEM private key" in gw.log()
    assert tls_peer_serial(gw.ssl, certs / "ca.crt") == new
    assert established.connected and fresh.connected
    established.close()
    fresh.close()


def test_sighup_reloads_the_client_ca(pki, gatewayd: GatewayFactory, tmp_path):
    bundle = tmp_path / "clients-ca.pem"
    shutil.copy(pki.ca, bundle)
    gw = gatewayd(mtls(pki, cacertfile=str(bundle)))
    intruder = {"cert": pki.other / "intruder.crt", "key": pki.other / "intruder.key"}
    with pytest.raises(Refused):
        Client(gw.ssl, cafile=pki.ca, **intruder).connect()
    dev1 = Client(gw.ssl, cafile=pki.ca, cert=pki.crt("dev1"), key=pki.key("dev1")).connect()
    bundle.write_bytes(pki.ca.read_bytes() + (pki.other / "ca.crt").read_bytes())
    gw.hup("TLS reloaded")
    Client(gw.ssl, cafile=pki.ca, **intruder).connect().close()  # the other CA now trusted
    assert dev1.connected
    dev1.close()


def test_sighup_rebuilds_the_authorizer_from_the_rules_file(gatewayd: GatewayFactory, tmp_path):
    rules = tmp_path / "acl.toml"
    rules.write_text('[[rules]]\npermission = "deny"\naction = "publish"\ntopics = ["a/#"]\n')
    gw = gatewayd({"enable": "false"}, {"GATEWAY_AUTHORIZATION__RULES_FILE": str(rules)})
    watcher = Client(gw.tcp).connect()
    watcher.subscribe("#")
    pub = Client(gw.tcp).connect()
    pub.publish("a/1", b"denied")
    pub.publish("b/1", b"marker")
    assert watcher.receive() == ("b/1", b"marker")
    rules.write_text('[[rules]]\npermission = "deny"\naction = "publish"\ntopics = ["b/#"]\n')
    gw.hup("authorization reloaded")
    pub.publish("b/2", b"denied now")
    pub.publish("a/2", b"allowed now")
    assert watcher.receive() == ("a/2", b"allowed now")
    rules.write_text("[[rules]]\npermission = 1\n")  # broken: the previous rules stay
    gw.hup("authorization rules not reloaded")
    pub.publish("b/3", b"still denied")
    pub.publish("a/3", b"still allowed")
    assert watcher.receive() == ("a/3", b"still allowed")
    pub.close()
    watcher.close()


def test_wss_client_certificate_names_the_client(pki, gatewayd: GatewayFactory):
    """peer_cert_as_clientid/username on a wss listener (paho over WebSocket and TLS with
    dev3's certificate): the client id and user name come from the CN, whatever the
    CONNECT says, so the ``${clientid}`` rule lets it publish under its own name only."""
    from paho.mqtt.enums import CallbackAPIVersion

    from tests.harness.gatewayd import free_port

    port = free_port()
    rules = ('[{permission="allow", action="publish", topics=["wss/${clientid}/${username}"]},'
             ' {permission="deny", action="publish", topics=["wss/#"]}]')
    env = {"GATEWAY_LISTENERS__WSS__DEFAULT__BIND": f"127.0.0.1:{port}",
           "GATEWAY_AUTHORIZATION__RULES": rules}
    env.update({f"GATEWAY_LISTENERS__WSS__DEFAULT__{k.upper()}": v for k, v in server_ssl(
        pki, cacertfile=str(pki.ca), verify="verify_peer", fail_if_no_peer_cert="true",
        peer_cert_as_clientid="cn", peer_cert_as_username="cn").items()})
    gw = gatewayd(server_ssl(pki), env)
    gw._wait(lambda: "listener wss:default" in gw.log(), "opening wss:default")
    watcher = Client(gw.tcp).connect()
    watcher.subscribe("wss/#")
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="someone-else",
                    transport="websockets", reconnect_on_failure=False)
    c.ws_set_options(path="/mqtt")
    c.username_pw_set("not-me")
    c.tls_set(ca_certs=str(pki.ca), certfile=str(pki.crt("dev3")), keyfile=str(pki.key("dev3")))
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        for topic in ("wss/someone-else/not-me", "wss/dev3/dev3"):
            assert c.publish(topic, b"x", qos=1).wait_for_publish(10) is None
        assert watcher.receive() == ("wss/dev3/dev3", b"x")
    finally:
        c.loop_stop()
        c.disconnect()
        watcher.close()
