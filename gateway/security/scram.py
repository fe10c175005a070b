"""SCRAM (RFC 5802, RFC 7677): credentials, a server and a client, all sans-IO.

The mechanism is generic: it knows nothing of MQTT. The MQTT channel carries its
messages in CONNECT/AUTH Authentication Data; the bridge and the tests use
:class:`ScramClient`. ``hash_name`` is a :mod:`hashlib` name (``"sha256"`` for
SCRAM-SHA-256, ``"sha1"`` for SCRAM-SHA-1, ``"sha512"`` for SCRAM-SHA-512).

One stored :class:`Credential` (salt, iteration count, StoredKey, ServerKey) serves both
SCRAM and a plain password check (:func:`verify_password` recomputes StoredKey from the
password and compares in constant time), so the server never keeps the password or
anything that lets it log in as the user (RFC 5802 section 9).

Invariants:
- Messages are ``bytes`` (UTF-8) in and out; every malformed or unexpected message raises
  :class:`ScramError` carrying an RFC 5802 ``server-error-value``.
- A :class:`ScramServer` goes first -> final -> done exactly once; it never reveals
  whether a user exists: for an unknown user it answers with a fake but stable salt and
  fails at the proof, like a wrong password.
- No channel binding: the GS2 header must be ``n,,`` or ``y,,`` (``p=`` is refused with
  ``channel-binding-not-supported``).
- Passwords are prepared with :func:`saslprep` (RFC 4013) before hashing, on both sides.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stringprep
import unicodedata
from dataclasses import dataclass

__all__ = [
    "MECHANISMS",
    "MIN_ITERATIONS",
    "Credential",
    "ScramClient",
    "ScramError",
    "ScramServer",
    "make_credential",
    "prepare_password",
    "saslprep",
    "verify_password",
]

MECHANISMS = {"SCRAM-SHA-1": "sha1", "SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MIN_ITERATIONS = 4096  # RFC 7677 section 4
MAX_ITERATIONS = 10_000_000  # a client refuses more: a hostile server could burn its CPU
NONCE_BYTES = 18
SALT_BYTES = 16


class ScramError(Exception):
    """A failed or malformed exchange; ``error`` is the RFC 5802 server-error-value."""

    def __init__(self, error: str, detail: str = "") -> None:
        super().__init__(f"{error}: {detail}" if detail else error)
        self.error = error
        self.detail = detail


# ----------------------------------------------------------------------- SASLprep


def saslprep(text: str, *, allow_unassigned: bool = True) -> str:
    """RFC 4013 SASLprep of a password or user name (``ValueError`` if prohibited).

    ``allow_unassigned`` is True for queries (what a client sends) and False for stored
    strings (RFC 3454 section 7)."""
    if text.isascii() and all(0x20 <= ord(c) < 0x7F for c in text):
        return text  # the common case: printable ASCII maps to itself
    mapped = "".join(
        " " if stringprep.in_table_c12(c) else c for c in text if not stringprep.in_table_b1(c)
    )
    out = unicodedata.normalize("NFKC", mapped)
    prohibited = (
        stringprep.in_table_c12,
        stringprep.in_table_c21_c22,
        stringprep.in_table_c3,
        stringprep.in_table_c4,
        stringprep.in_table_c5,
        stringprep.in_table_c6,
        stringprep.in_table_c7,
        stringprep.in_table_c8,
        stringprep.in_table_c9,
    )
    for c in out:
        if any(f(c) for f in prohibited):
            raise ValueError(f"SASLprep: prohibited character U+{ord(c):04X}")
        if not allow_unassigned and stringprep.in_table_a1(c):
            raise ValueError(f"SASLprep: unassigned code point U+{ord(c):04X}")
    if any(stringprep.in_table_d1(c) for c in out):
        if any(stringprep.in_table_d2(c) for c in out):
            raise ValueError("SASLprep: mixed right-to-left and left-to-right text")
        if not (stringprep.in_table_d1(out[0]) and stringprep.in_table_d1(out[-1])):
            raise ValueError("SASLprep: right-to-left text must start and end with RTL")
    return out


def prepare_password(password: str | bytes) -> bytes:
    """The bytes that are hashed: SASLprep of the UTF-8 text, or the raw bytes when the
    password is not valid UTF-8 or SASLprep refuses it (MQTT passwords are binary)."""
    if isinstance(password, bytes):
        try:
            text = password.decode("utf-8")
        except UnicodeDecodeError:
            return password
    else:
        text = password
    try:
        return saslprep(text).encode("utf-8")
    except ValueError:
        return text.encode("utf-8", "surrogatepass")


# ------------------------------------------------------------------- primitives


def _hmac(hash_name: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hash_name).digest()


def _h(hash_name: str, data: bytes) -> bytes:
    return hashlib.new(hash_name, data).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ScramError("invalid-encoding", f"{what} is not base64") from None


def salted_password(hash_name: str, password: bytes, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) of RFC 5802: PBKDF2 with HMAC and one block."""
    return hashlib.pbkdf2_hmac(hash_name, password, salt, iterations)


def _nonce() -> str:
    return _b64(os.urandom(NONCE_BYTES))


@dataclass(frozen=True, slots=True)
class Credential:
    """What the server stores for one user (RFC 5802 section 3)."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes
    hash_name: str = "sha256"


def make_credential(
    password: str | bytes,
    *,
    iterations: int = 100_000,
    salt: bytes | None = None,
    hash_name: str = "sha256",
) -> Credential:
    """A new credential for ``password`` (a fresh random salt unless one is given)."""
    if iterations < 1:
        raise ValueError("iterations must be positive")
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    salted = salted_password(hash_name, prepare_password(password), salt, iterations)
    client_key = _hmac(hash_name, salted, b"Client Key")
    return Credential(
        salt=salt,
        iterations=iterations,
        stored_key=_h(hash_name, client_key),
        server_key=_hmac(hash_name, salted, b"Server Key"),
        hash_name=hash_name,
    )


def verify_password(credential: Credential, password: str | bytes) -> bool:
    """True when ``password`` is the one ``credential`` was made from (constant-time
    comparison; costs ``credential.iterations`` rounds of HMAC)."""
    h = credential.hash_name
    salted = salted_password(h, prepare_password(password), credential.salt, credential.iterations)
    stored = _h(h, _hmac(h, salted, b"Client Key"))
    return hmac.compare_digest(stored, credential.stored_key)


# ------------------------------------------------------------------- message syntax


def _attributes(message: str, what: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha():
            raise ScramError("other-error", f"malformed attribute {part[:16]!r} in {what}")
        out.append((part[0], part[2:]))
    return out


def _decode(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("invalid-encoding", f"{what} is not UTF-8") from None


def _escape_name(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _unescape_name(name: str) -> str:
    rest = name.replace("=2C", "").replace("=3D", "")
    if "=" in rest:
        raise ScramError("invalid-username-encoding", "bad '=' escape in user name")
    return name.replace("=2C", ",").replace("=3D", "=")


def _printable_nonce(nonce: str) -> bool:
    return bool(nonce) and all(0x21 <= ord(c) <= 0x7E and c != "," for c in nonce)


# ----------------------------------------------------------------------- server


class ScramServer:
    """The server side of one exchange (see the module docstring).

    ``server = ScramServer("sha256")``; ``user = server.receive_client_first(data)``;
    look the user up; ``server.server_first(credential or None)`` -> bytes to send;
    ``server.receive_client_final(data)`` -> server-final bytes, or :class:`ScramError`.
    """

    def __init__(
        self,
        hash_name: str = "sha256",
        *,
        nonce: str | None = None,
        fake_secret: bytes | None = None,
        fake_iterations: int = 100_000,
    ) -> None:
        self.hash_name = hash_name
        self.username: str | None = None
        self._nonce = nonce  # the server's part; random unless given (test vectors)
        self._fake_secret = fake_secret if fake_secret is not None else os.urandom(32)
        self._fake_iterations = fake_iterations
        self._client_first_bare = ""
        self._server_first = ""
        self._combined_nonce = ""
        self._gs2_header = ""
        self._credential: Credential | None = None
        self._known = False
        self._state = "first"

    def receive_client_first(self, data: bytes) -> str:
        """Parse client-first-message; returns the user name (SASLprep'd, unescaped)."""
        if self._state != "first":
            raise ScramError("other-error", "client-first received twice")
        self._state = "lookup"
        text = _decode(data, "client-first-message")
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise ScramError("other-error", "malformed client-first-message")
        cbind, authzid, bare = parts
        if cbind.startswith("p="):
            raise ScramError("channel-binding-not-supported")
        if cbind not in ("n", "y"):
            raise ScramError("other-error", "bad GS2 channel binding flag")
        if authzid and not authzid.startswith("a="):
            raise ScramError("other-error", "bad GS2 authzid")
        attrs = _attributes(bare, "client-first-message")
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r":
            if attrs and attrs[0][0] == "m":
                raise ScramError("extensions-not-supported")
            raise ScramError("other-error", "client-first-message needs n= then r=")
        username = _unescape_name(attrs[0][1])
        try:
            username = saslprep(username)
        except ValueError:
            raise ScramError("invalid-username-encoding") from None
        if not username:
            raise ScramError("other-error", "empty user name")
        if authzid and _unescape_name(authzid[2:]) != username:
            raise ScramError("other-error", "authorization identity differs from user")
        client_nonce = attrs[1][1]
        if not _printable_nonce(client_nonce):
            raise ScramError("other-error", "bad client nonce")
        self.username = username
        self._gs2_header = f"{cbind},{authzid},"
        self._client_first_bare = bare
        self._combined_nonce = client_nonce + (self._nonce or _nonce())
        return username

    def server_first(self, credential: Credential | None) -> bytes:
        """server-first-message for the user's credential; None (unknown user) gets a
        stable fake salt and will fail at the proof."""
        if self._state != "lookup":
            raise ScramError("other-error", "server-first out of order")
        self._state = "final"
        if credential is None or credential.hash_name != self.hash_name:
            assert self.username is not None
            salt = _hmac(self.hash_name, self._fake_secret, self.username.encode())[:SALT_BYTES]
            self._credential = Credential(salt, self._fake_iterations, b"", b"", self.hash_name)
            self._known = False
        else:
            self._credential = credential
            self._known = True
        c = self._credential
        self._server_first = f"r={self._combined_nonce},s={_b64(c.salt)},i={c.iterations}"
        return self._server_first.encode()

    def receive_client_final(self, data: bytes) -> bytes:
        """Check client-final-message; returns server-final-message (``v=...``)."""
        if self._state != "final":
            raise ScramError("other-error", "client-final out of order")
        self._state = "done"
        text = _decode(data, "client-final-message")
        attrs = _attributes(text, "client-final-message")
        if len(attrs) < 3 or attrs[0][0] != "c" or attrs[1][0] != "r" or attrs[-1][0] != "p":
            raise ScramError("other-error", "client-final-message needs c=, r=, ..., p=")
        if _unb64(attrs[0][1], "channel binding") != self._gs2_header.encode():
            raise ScramError("channel-bindings-dont-match")
        if attrs[1][1] != self._combined_nonce:
            raise ScramError("other-error", "nonce mismatch")
        proof = _unb64(attrs[-1][1], "proof")
        without_proof = text[: text.rindex(",p=")]
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        c = self._credential
        assert c is not None
        h = self.hash_name
        signature = _hmac(h, c.stored_key, auth_message) if self._known else b""
        if not self._known or len(proof) != len(signature):
            raise ScramError("invalid-proof")
        client_key = _xor(proof, signature)
        if not hmac.compare_digest(_h(h, client_key), c.stored_key):
            raise ScramError("invalid-proof")
        server_signature = _hmac(h, c.server_key, auth_message)
        return f"v={_b64(server_signature)}".encode()

    @staticmethod
    def server_error(error: str) -> bytes:
        """A server-final-message reporting ``error`` (``e=...``)."""
        return f"e={error}".encode()


# ----------------------------------------------------------------------- client


class ScramClient:
    """The client side: ``first()``, then ``final(server_first)``, then
    ``verify(server_final)`` (raises :class:`ScramError` if the server is not genuine)."""

    def __init__(
        self,
        username: str,
        password: str | bytes,
        hash_name: str = "sha256",
        *,
        nonce: str | None = None,
        min_iterations: int = MIN_ITERATIONS,
    ) -> None:
        self.username = username
        self.hash_name = hash_name
        self._password = prepare_password(password)
        self._nonce = nonce or _nonce()
        self._min_iterations = min_iterations
        self._client_first_bare = f"n={_escape_name(saslprep(username))},r={self._nonce}"
        self._server_signature = b""
        self._state = "first"

    def first(self) -> bytes:
        if self._state != "first":
            raise ScramError("other-error", "client-first already sent")
        self._state = "final"
        return f"n,,{self._client_first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        if self._state != "final":
            raise ScramError("other-error", "client-final out of order")
        self._state = "verify"
        text = _decode(server_first, "server-first-message")
        attrs = dict(_attributes(text, "server-first-message"))
        if "e" in attrs:
            raise ScramError(attrs["e"], "server refused")
        try:
            nonce, salt_b64, iterations = attrs["r"], attrs["s"], int(attrs["i"])
        except (KeyError, ValueError):
            raise ScramError("other-error", "server-first-message needs r=, s=, i=") from None
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise ScramError("other-error", "server nonce does not extend ours")
        if not self._min_iterations <= iterations <= MAX_ITERATIONS:
            raise ScramError("other-error", f"iteration count {iterations} out of range")
        salt = _unb64(salt_b64, "salt")
        h = self.hash_name
        salted = salted_password(h, self._password, salt, iterations)
        client_key = _hmac(h, salted, b"Client Key")
        server_key = _hmac(h, salted, b"Server Key")
        without_proof = f"c={_b64(b'n,,')},r={nonce}"
        auth_message = f"{self._client_first_bare},{text},{without_proof}".encode()
        signature = _hmac(h, _h(h, client_key), auth_message)
        self._server_signature = _hmac(h, server_key, auth_message)
        return f"{without_proof},p={_b64(_xor(client_key, signature))}".encode()

    def verify(self, server_final: bytes) -> None:
        if self._state != "verify":
            raise ScramError("other-error", "server-final out of order")
        self._state = "done"
        text = _decode(server_final, "server-final-message")
        attrs = dict(_attributes(text, "server-final-message"))
        if "e" in attrs:
            raise ScramError(attrs["e"], "server refused")
        got = _unb64(attrs.get("v", ""), "server signature")
        if not hmac.compare_digest(got, self._server_signature):
            raise ScramError("invalid-server-signature")
