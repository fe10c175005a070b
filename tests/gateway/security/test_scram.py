"""SCRAM: the RFC 5802 (SHA-1) and RFC 7677 (SHA-256) test vectors, both directions,
and the ways an exchange fails."""

from __future__ import annotations

import base64

import pytest

from gateway.security.scram import (
    ScramClient,
    ScramError,
    ScramServer,
    make_credential,
    prepare_password,
    saslprep,
    verify_password,
)

# (hash, client nonce, server nonce part, salt, client-first, server-first, client-final,
#  server-final)
VECTORS = [
    pytest.param(
        "sha1",
        "fyko+d2lbbFgONRv9qkxdawL",
        "3rfcNHYJY1ZVvWVs7j",
        "QSXCR+Q6sek8bf92",
        b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL",
        b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096",
        b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
        b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ=",
        id="rfc5802-sha1",
    ),
    pytest.param(
        "sha256",
        "rOprNGfwEbeRWgbNEkqO",
        "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
        "W22ZaJ0SNY7soEsUEjb6gQ==",
        b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
        id="rfc7677-sha256",
    ),
]


@pytest.mark.parametrize(
    "h, cnonce, snonce, salt, cfirst, sfirst, cfinal, sfinal", VECTORS
)
def test_client_matches_vector(h, cnonce, snonce, salt, cfirst, sfirst, cfinal, sfinal):
    client = ScramClient("user", "pencil", h, nonce=cnonce)
    assert client.first() == cfirst
    assert client.final(sfirst) == cfinal
    client.verify(sfinal)


@pytest.mark.parametrize(
    "h, cnonce, snonce, salt, cfirst, sfirst, cfinal, sfinal", VECTORS
)
def test_server_matches_vector(h, cnonce, snonce, salt, cfirst, sfirst, cfinal, sfinal):
    cred = make_credential("pencil", iterations=4096, salt=base64.b64decode(salt), hash_name=h)
    server = ScramServer(h, nonce=snonce)
    assert server.receive_client_first(cfirst) == "user"
    assert server.server_first(cred) == sfirst
    assert server.receive_client_final(cfinal) == sfinal


def test_round_trip_and_plain_check_share_one_credential():
    cred = make_credential("s3cret", iterations=4096)
    assert verify_password(cred, b"s3cret") and verify_password(cred, "s3cret")
    assert not verify_password(cred, b"s3cre") and not verify_password(cred, b"")
    server = ScramServer()
    client = ScramClient("alice", "s3cret")
    assert server.receive_client_first(client.first()) == "alice"
    final = server.receive_client_final(client.final(server.server_first(cred)))
    client.verify(final)


def test_wrong_password_is_invalid_proof():
    cred = make_credential("right", iterations=4096)
    server = ScramServer()
    client = ScramClient("alice", "wrong")
    server.receive_client_first(client.first())
    with pytest.raises(ScramError) as err:
        server.receive_client_final(client.final(server.server_first(cred)))
    assert err.value.error == "invalid-proof"


def test_unknown_user_looks_like_a_known_one_and_fails_at_the_proof():
    secret = b"k" * 32
    a, b = ScramServer(fake_secret=secret, fake_iterations=4096), ScramServer(
        fake_secret=secret, fake_iterations=4096
    )
    client = ScramClient("ghost", "x")
    a.receive_client_first(client.first())
    first = a.server_first(None)
    b.receive_client_first(ScramClient("ghost", "y").first())
    # the same fake salt every time for the same name: no way to tell it is unknown
    assert first.split(b",")[1:] == b.server_first(None).split(b",")[1:]
    with pytest.raises(ScramError, match="invalid-proof"):
        a.receive_client_final(client.final(first))


def test_client_detects_a_forged_server_signature():
    cred = make_credential("pw", iterations=4096)
    server = ScramServer()
    client = ScramClient("u", "pw")
    server.receive_client_first(client.first())
    server.receive_client_final(client.final(server.server_first(cred)))
    with pytest.raises(ScramError, match="invalid-server-signature"):
        client.verify(b"v=" + base64.b64encode(b"\0" * 32))


@pytest.mark.parametrize(
    "message, error",
    [
        (b"p=tls-unique,,n=u,r=abc", "channel-binding-not-supported"),
        (b"x,,n=u,r=abc", "other-error"),
        (b"n,,r=abc", "other-error"),
        (b"n,,m=ext,n=u,r=abc", "extensions-not-supported"),
        (b"n,,n=a=2Db,r=abc", "invalid-username-encoding"),
        (b"n,,n=u,r=a,b", "other-error"),
        (b"\xff", "invalid-encoding"),
        (b"n,,n=,r=abc", "other-error"),
        (b"n,a=other,n=u,r=abc", "other-error"),
    ],
)
def test_malformed_client_first(message, error):
    with pytest.raises(ScramError) as err:
        ScramServer().receive_client_first(message)
    assert err.value.error == error


def test_tampered_client_final():
    cred = make_credential("pw", iterations=4096)
    server = ScramServer()
    client = ScramClient("u", "pw")
    server.receive_client_first(client.first())
    final = client.final(server.server_first(cred))
    tampered = final.replace(b"c=biws", b"c=" + base64.b64encode(b"y,,"))
    with pytest.raises(ScramError, match="channel-bindings-dont-match"):
        server.receive_client_final(tampered)


def test_exchange_is_one_shot():
    server = ScramServer()
    server.receive_client_first(b"n,,n=u,r=abc")
    with pytest.raises(ScramError):
        server.receive_client_first(b"n,,n=u,r=abc")


def test_client_refuses_weak_or_absurd_iteration_counts():
    client = ScramClient("u", "pw", nonce="abc")
    client.first()
    with pytest.raises(ScramError, match="out of range"):
        client.final(b"r=abcdef,s=QSXCR+Q6sek8bf92,i=1000")


def test_escaped_user_names_round_trip():
    cred = make_credential("pw", iterations=4096)
    server = ScramServer()
    client = ScramClient("a,b=c", "pw")
    assert server.receive_client_first(client.first()) == "a,b=c"
    client.verify(server.receive_client_final(client.final(server.server_first(cred))))


def test_saslprep():
    assert saslprep("I\u00adX") == "IX"  # soft hyphen mapped to nothing
    assert saslprep("user") == "user"
    assert saslprep("\u00aa") == "a"  # NFKC
    assert saslprep("\u2168") == "IX"
    assert saslprep("a\u00a0b") == "a b"  # non-ASCII space -> space
    with pytest.raises(ValueError):
        saslprep("\u0007")
    with pytest.raises(ValueError):
        saslprep("\u0627\u0031")  # RTL must start and end with RTL
    # Non-UTF-8 bytes are hashed as they are
    assert prepare_password(b"\xff\xfe") == b"\xff\xfe"
    assert prepare_password("I\u00adX") == b"IX"
