"""DTLS for datagram front-ends: a channel that terminates DTLS and carries an inner one.

:class:`DtlsChannel` sits between the datagram shell and an unchanged inner datagram
channel (CoAP, LwM2M), as the WebSocket framing channel sits between the stream shell and
the MQTT channel. It uses python-mbedtls' sans-IO ``TLSWrappedBuffer`` (``wrap_buffers``):
ciphertext datagrams in, plaintext datagrams to the inner channel; the inner channel's
``bytes`` effects are sealed into DTLS records, one datagram each; every other effect
passes through. The socket stays the shell's, so listener limits, the durability gate and
the effect loop apply unchanged.

Rules:
- A new address gets a HelloVerifyRequest (cookie bound to its address and port) before
  any handshake state is kept for it; a handshake that does not finish within
  ``handshake_timeout`` closes the peer.
- The inner channel is created when the handshake is over (its idle timers start then),
  with the peer's identity: ``{"cn", "dn", "san"}`` of a verified client certificate
  (the fields it has), ``{"psk_identity": ...}`` after a PSK handshake, ``{}`` otherwise.
  :func:`bind_identity` turns it into the channel's
  :class:`~protocols.identity.BoundIdentity` by the listener's ``peer_cert_as_*`` and
  ``psk_identity_as_*`` settings.
- A client certificate that does not chain to ``cacertfile`` never gets an inner channel:
  with ``fail_if_no_peer_cert`` mbedTLS refuses it in the handshake; without (a
  certificate is optional) the handshake ends and the peer is closed at once if it sent
  a certificate that failed verification.
- Its ``ConnectionHandle`` is a proxy: results computed later (``call_channel``) are sealed
  like everything else, never written in the clear.
- A close_notify, a bad record or a failed handshake (unknown PSK identity, wrong key, a
  refused certificate) closes the peer; other peers are not touched.

Keys and certificates (:class:`DtlsContext`, built from a ``DtlsListener``): pre-shared
keys from ``psk_file`` (``identity:secret`` lines, the format of EMQX's PSK file), a
certificate chain and key (``certfile``, ``keyfile``; EC or RSA), and with
``verify = "verify_peer"`` the clients' CA (``cacertfile``). mbedTLS (2.28) speaks DTLS
1.2 only. :class:`DtlsServer` holds a listener's current context; SIGHUP re-reads the
files (:meth:`DtlsServer.reload`): new handshakes use the new context, established
sessions keep theirs, and a reload that fails keeps the previous one; a session whose
client certificate the reloaded CRLs revoke is closed (close_notify, then the inner
channel's end as when the peer goes; logged).

Revocation (``crlfile``, ``enable_crl_check``, ``ocsp_check``): the listener's
:class:`~gateway.security.revocation.RevocationGuard` (``DtlsServer.guard``, set by
``gateway.frontends.listen``; this module does not import it, gateway.security sits above
gateway.net) judges each verified client certificate right after the handshake, with the
channel as its ``Peer``: a known revocation refuses the peer in that very datagram; an
answer that must be fetched holds the peer (no inner channel yet; decrypted datagrams
kept, at most :data:`MAX_HELD`) until ``resume`` (the inner channel starts and gets them
in order) or ``cut`` (closed). Later cuts (a CRL file changed, a refreshed CRL, an OCSP
answer) come through the session's own handle (``call_channel``). The guard watches the
CRL files and calls :meth:`DtlsServer.reload` when they change, as SIGHUP does.

python-mbedtls does not say which PSK identity a handshake used, so the key store is a
:class:`PskStore` that remembers the last identity mbedTLS looked up successfully; every
handshake step runs synchronously inside one peer's ``handle_datagram``, which clears it
before and reads it after, so no other peer's lookup can come in between.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gateway.net.tls import (
    TlsError,
    check_crl,
    crl_status,
    identity_of,
    key_password,
    load_certificates,
    load_crls,
    load_key_pair,
)
from protocols.context import ClientInfo, ConnectionHandle, Delivery
from protocols.effects import Close, Effect, SetTimer, Unheld
from protocols.identity import BoundIdentity, IdentityRefused

if TYPE_CHECKING:
    from gateway.config.schema import DtlsListener

log = logging.getLogger("gateway.net.dtls")

Address = tuple[str, int]
HANDSHAKE_TIMER = "dtls:handshake"
MAX_HELD = 64  # plaintext datagrams kept while a revocation verdict is fetched
NOT_AUTHORIZED = 0x87  # MQTT 5 reason code: what an identity mismatch is refused with


class DtlsError(Exception):
    """A DTLS listener's settings cannot be used; ``key`` names the configuration key
    at fault when one is."""

    def __init__(self, reason: str, key: str | None = None) -> None:
        super().__init__(f"{key}: {reason}" if key else reason)
        self.key = key
        self.reason = reason

    def where(self, section: str) -> str:
        """The message with the listener's section in front (``section.key: reason``)."""
        return f"{section}.{self.key}: {self.reason}" if self.key else f"{section}: {self.reason}"


def load_psk_file(path: str | Path) -> dict[str, bytes]:
    """``identity:secret`` per line (``#`` comments and blank lines ignored)."""
    out: dict[str, bytes] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        ident, sep, secret = line.partition(":")
        if not sep or not ident or not secret:
            raise DtlsError(f"{path}:{n}: expected identity:secret")
        out[ident] = secret.encode()
    return out


class PskStore(Mapping[str, bytes]):
    """Pre-shared keys by identity; remembers the last identity found (see the module
    docstring)."""

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        self._keys = dict(keys)
        self.found: str | None = None

    def __getitem__(self, identity: str) -> bytes:
        key = self._keys[identity]
        self.found = identity
        return key

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def _mbedtls() -> Any:
    try:
        import mbedtls.tls
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise DtlsError("DTLS needs python-mbedtls (pip install python-mbedtls)") from exc
    return mbedtls


@dataclass(frozen=True)
class DtlsContext:
    """One loaded set of a listener's keys: the mbedTLS server context and what the
    channel needs to judge a finished handshake."""

    server: Any  # mbedtls.tls.ServerContext
    psk: PskStore | None
    verify_peer: bool  # client certificates are checked against cacertfile
    description: str  # for the log
    crls: tuple[x509.CertificateRevocationList, ...] = ()  # crlfile, signatures checked


def server_context(psk: Mapping[str, bytes]) -> DtlsContext:
    """A DTLS context for these pre-shared keys only (tests, and PSK-only listeners)."""
    if not psk:
        raise DtlsError("a DTLS listener needs at least one pre-shared key", "psk_file")
    mbedtls = _mbedtls()
    store = PskStore(psk)
    conf = mbedtls.tls.DTLSConfiguration(pre_shared_key_store=store, validate_certificates=False)
    return DtlsContext(mbedtls.tls.ServerContext(conf), store, False, f"PSK ({len(psk)} keys)")


def build_dtls_context(listener: DtlsListener) -> DtlsContext:
    """The DTLS context of ``listener``'s files; :class:`DtlsError` names the bad key."""
    mbedtls = _mbedtls()
    from mbedtls import pk
    from mbedtls import x509 as mx509

    kwargs: dict[str, Any] = {}
    what: list[str] = []
    store: PskStore | None = None
    if listener.psk_file is not None:
        try:
            keys = load_psk_file(listener.psk_file)
        except OSError as exc:
            raise DtlsError(f'cannot read "{listener.psk_file}": {exc.strerror or exc}',
                            "psk_file") from None
        except DtlsError as exc:
            raise DtlsError(exc.reason, "psk_file") from None
        if not keys:
            raise DtlsError(f'no identity:secret line in "{listener.psk_file}"', "psk_file")
        store = kwargs["pre_shared_key_store"] = PskStore(keys)
        what.append(f"PSK ({len(keys)} keys)")
    verify_peer = False
    crls: list[x509.CertificateRevocationList] = []
    if listener.certfile is not None and listener.keyfile is not None:
        try:
            certs, key = load_key_pair(listener.certfile, listener.keyfile,
                                       key_password(listener))
            cas = (
                load_certificates("cacertfile", listener.cacertfile)
                if listener.verify == "verify_peer" and listener.cacertfile is not None
                else []
            )
            for path, crl in load_crls("crlfile", list(listener.crlfile)):
                check_crl("crlfile", path, crl, cas)
                crls.append(crl)
        except TlsError as exc:
            raise DtlsError(exc.reason, exc.key) from None
        cls: type[pk.CipherBase]
        if isinstance(key, ec.EllipticCurvePrivateKey):
            cls = pk.ECC
        elif isinstance(key, rsa.RSAPrivateKey):
            cls = pk.RSA
        else:
            raise DtlsError("DTLS (mbedTLS) takes EC or RSA keys", "keyfile")
        der = key.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        try:
            chain = tuple(
                mx509.CRT.from_DER(c.public_bytes(serialization.Encoding.DER)) for c in certs
            )
            kwargs["certificate_chain"] = (chain, cls.from_DER(der))
            if cas:
                kwargs["trust_store"] = mbedtls.tls.TrustStore(
                    [mx509.CRT.from_DER(c.public_bytes(serialization.Encoding.DER)) for c in cas]
                )
        except Exception as exc:  # mbedtls refuses what cryptography read
            raise DtlsError(f"mbedTLS refused it: {exc!r}", "certfile") from None
        verify_peer = bool(cas)
        what.append(describe_certificate(certs[0], listener.certfile))
        if verify_peer:
            what.append(
                "client certificates required" if listener.fail_if_no_peer_cert
                else "client certificates verified when sent"
            )
    if not what:
        raise DtlsError("a DTLS listener needs psk_file, or certfile and keyfile", "psk_file")
    # python-mbedtls: True is mbedTLS' VERIFY_REQUIRED, False VERIFY_OPTIONAL (the
    # certificate is asked for and checked, the handshake goes on; the channel judges)
    kwargs["validate_certificates"] = verify_peer and listener.fail_if_no_peer_cert
    try:
        server = mbedtls.tls.ServerContext(mbedtls.tls.DTLSConfiguration(**kwargs))
    except Exception as exc:
        raise DtlsError(f"mbedTLS refused the configuration: {exc!r}", "certfile") from None
    if verify_peer and crls:
        what.append(f"{len(crls)} CRL(s)")
    return DtlsContext(server, store, verify_peer, ", ".join(what),
                       tuple(crls) if verify_peer else ())


def describe_certificate(cert: x509.Certificate, path: Path) -> str:
    return (
        f"{cert.subject.rfc4514_string()} serial {cert.serial_number:x} "
        f"valid until {cert.not_valid_after_utc:%Y-%m-%d} ({path})"
    )


class DtlsServer:
    """One DTLS listener's current context, which SIGHUP can refresh (:meth:`reload`)."""

    def __init__(self, name: str, listener: DtlsListener | None, current: DtlsContext) -> None:
        self.name = name
        self.listener = listener
        self.current = current
        # sessions with a verified client certificate, checked again by a reload
        self.live: weakref.WeakSet[DtlsChannel] = weakref.WeakSet()
        # a gateway.security.revocation.RevocationGuard (set by gateway.frontends.listen
        # when crlfile, enable_crl_check or ocsp_check is on): it then judges every
        # verified client certificate, and watches the CRL files
        self.guard: Any = None

    @classmethod
    def from_listener(cls, name: str, listener: DtlsListener) -> DtlsServer:
        return cls(name, listener, build_dtls_context(listener))

    def reload(self) -> bool:
        """Load the files again; on failure log the error and keep the previous context."""
        if self.listener is None:
            return False
        try:
            ctx = build_dtls_context(self.listener)
        except DtlsError as exc:
            log.error(
                "listener %s: DTLS reload failed, keeping the previous keys: %s", self.name, exc
            )
            return False
        self.current = ctx
        log.info("listener %s: DTLS reloaded: %s", self.name, ctx.description)
        if self.guard is not None:
            self.guard.reload_files()  # its CRLs; live sessions checked again, revoked cut
        else:
            self.rescan()
        return True

    def close(self) -> None:
        if self.guard is not None:
            self.guard.close()

    def rescan(self) -> int:
        """Close the live sessions whose client certificate the current CRLs revoke
        (through the session's own handle, so the close is sealed and carried out by its
        shell); how many."""
        crls = list(self.current.crls)
        if not crls:
            return 0
        cut = 0
        for channel in list(self.live):
            cert = channel.peer_cert
            if channel.closed or cert is None or crl_status(cert, crls) != "revoked":
                continue
            log.warning("listener %s: disconnected %s (serial %x) from %s:%d: certificate "
                        "revoked (CRL file)", self.name, cert.subject.rfc4514_string(),
                        cert.serial_number, *channel.addr)
            channel.handle.call_channel(channel.revoked)
            cut += 1
        return cut


# ------------------------------------------------------------------ identity


def bind_identity(listener: DtlsListener, peer: Mapping[str, str]) -> BoundIdentity | None:
    """What ``peer`` (a :class:`DtlsChannel`'s identity) fixes by the listener's rules;
    None when nothing is fixed. As on the MQTT TLS listener, a peer that sent no
    certificate (optional with ``verify_peer`` alone) is not bound by ``peer_cert_as_*``."""
    if "psk_identity" in peer:
        ident = peer["psk_identity"]
        if not (listener.psk_identity_as_clientid or listener.psk_identity_as_username):
            return None
        return BoundIdentity(
            client_id=ident if listener.psk_identity_as_clientid else None,
            username=ident if listener.psk_identity_as_username else None,
            source="PSK identity",
        )
    cid_from, user_from = listener.peer_cert_as_clientid, listener.peer_cert_as_username
    if not peer or (cid_from == "none" and user_from == "none"):
        return None
    for use, field in (("client id", cid_from), ("username", user_from)):
        if field != "none" and not peer.get(field):
            return BoundIdentity(missing=f"client certificate has no {field} for the {use}")
    return BoundIdentity(
        client_id=peer[cid_from] if cid_from != "none" else None,
        username=peer[user_from] if user_from != "none" else None,
        source=f"certificate {cid_from if cid_from != 'none' else user_from}",
    )


class IdentityBoundContext:
    """A gateway context for one peer whose ``authenticate`` first checks the client's
    client id/username against its :class:`BoundIdentity` (filling in the username), and
    refuses a mismatch with 0x87, which an LwM2M registration answers 4.03. Everything
    else is the wrapped context's."""

    def __init__(self, context: Any, bound: BoundIdentity) -> None:
        self._context = context
        self._bound = bound

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def authenticate(
        self, client: ClientInfo, password: bytes | None,
        done: Callable[[int], None] | None = None,
    ) -> int:
        checked = self._bound.check(client.client_id, client.username)
        if isinstance(checked, IdentityRefused):
            log.warning(
                "%s client %s from %s:%s refused: %s", client.protocol, client.client_id,
                client.peer_host, client.peer_port, checked.reason,
            )
            return NOT_AUTHORIZED
        if checked[1] is not None:
            client.username = checked[1]
        code: int = self._context.authenticate(client, password, done)
        return code


class _InnerHandle:
    """The inner channel's ConnectionHandle: everything goes through the DTLS channel."""

    def __init__(self, outer: DtlsChannel) -> None:
        self.outer = outer

    def deliver(self, deliveries: list[Delivery]) -> None:
        self.outer.handle.deliver(deliveries)

    def release(self, packet_id: int) -> None:
        self.outer.handle.release(packet_id)

    def kick(self, reason_code: int) -> None:
        self.outer.handle.kick(reason_code)

    def call_channel(self, fn: Callable[[], list[Effect]]) -> None:
        outer = self.outer
        outer.handle.call_channel(lambda: outer._seal(fn()))

    def sockname(self) -> str | None:
        """The listener's local address, ``host:port`` (the rules' ``sockname``)."""
        get = getattr(self.outer.handle, "sockname", None)
        return get() if get is not None else None


InnerFactory = Callable[[ConnectionHandle, Address, Mapping[str, str]], Any]


class DtlsChannel:
    def __init__(
        self,
        server: DtlsServer | DtlsContext,
        handle: ConnectionHandle,
        addr: Address,
        inner_factory: InnerFactory,
        *,
        handshake_timeout: float = 30.0,
    ) -> None:
        from mbedtls.tls import (
            HandshakeStep,
            HelloVerifyRequest,
            WantReadError,
            WantWriteError,
        )

        self._over = HandshakeStep.HANDSHAKE_OVER
        self._hvr = HelloVerifyRequest
        self._want_read = WantReadError
        self._want_write = WantWriteError
        self.server = server if isinstance(server, DtlsServer) else DtlsServer("", None, server)
        self.context = self.server.current
        self.handle = handle
        self.addr = addr
        self.inner_factory = inner_factory
        self.handshake_timeout = handshake_timeout
        self.buffer = self._new_buffer()
        self.inner: Any = None
        self.identity: dict[str, str] = {}
        self.peer_cert: x509.Certificate | None = None  # a verified client certificate
        self.closed = False
        # while the guard fetches a verdict (distribution point, OCSP): the plaintext
        # datagrams that came meanwhile (at most MAX_HELD), replayed once admitted
        self._held: list[bytes] | None = None
        self._judging = False  # inside the guard's admit_peer: a refusal is returned
        self._refusal: str | None = None

    def _new_buffer(self) -> Any:
        self.context = self.server.current  # a reload applies from the next ClientHello
        buf = self.context.server.wrap_buffers()
        buf.setcookieparam(f"{self.addr[0]}:{self.addr[1]}".encode())
        return buf

    # -- DatagramChannel ------------------------------------------------------------

    def connection_made(self) -> list[Effect]:
        return [SetTimer(HANDSHAKE_TIMER, self.handshake_timeout)]

    def handle_datagram(self, data: bytes) -> list[Effect]:
        if self.closed:
            return []
        out: list[Effect] = []
        buf = self.buffer
        try:
            buf.receive_from_network(data)
            if self.inner is None and self._held is None:
                if not self._handshake(out):
                    return out
                refusal = self._judge_peer()
                if refusal is not None:
                    log.warning("dtls peer %s:%d refused: %s", *self.addr, refusal)
                    out.extend(self._close(f"dtls: {refusal}"))
                    return out
                if self._held is None:
                    out.extend(self._start_inner())
            while not self.closed:
                try:
                    plain = buf.read(65536)
                except self._want_read:
                    break
                if not plain:
                    break
                if self._held is not None:  # a verdict is awaited
                    if len(self._held) < MAX_HELD:
                        self._held.append(bytes(plain))
                    continue
                out.extend(self._seal(self.inner.handle_datagram(bytes(plain))))
        except Exception as exc:  # mbedtls TLSError: close_notify, bad record, bad PSK
            if self._is_tls_error(exc):
                log.info("dtls peer %s:%d: %s", self.addr[0], self.addr[1], exc)
                self._drain(out)
                self.closed = True  # no close_notify after an error
                out.append(Close("dtls: closed by peer or failed"))
                return out
            raise
        return out

    def on_timer(self, name: str) -> list[Effect]:
        if name == HANDSHAKE_TIMER:
            if self.inner is None and not self.closed:
                self.closed = True
                return [Close("dtls: handshake timeout")]
            return []
        if self.inner is None:
            return []
        return self._seal(self.inner.on_timer(name))

    def connection_lost(self) -> None:
        self.closed = True
        if self.inner is not None:
            self.inner.connection_lost()

    def deliver(self, deliveries: list[Delivery]) -> list[Effect]:
        if self.inner is None:
            return []
        return self._seal(self.inner.deliver(deliveries))

    def release(self, packet_id: int) -> list[Effect]:
        return [] if self.inner is None else self._seal(self.inner.release(packet_id))

    def kick(self, reason_code: int) -> list[Effect]:
        if self.inner is None:
            self.closed = True
            return [Close(f"kicked (0x{reason_code:02X})")]
        return self._seal(self.inner.kick(reason_code))

    def _start_inner(self) -> list[Effect]:
        self.inner = self.inner_factory(_InnerHandle(self), self.addr, self.identity)
        return self._seal(self.inner.connection_made())

    def _admit(self) -> list[Effect]:
        """The guard's verdict came and admits the peer: the inner channel starts and
        gets the datagrams held meanwhile, in order."""
        held, self._held = self._held or [], None
        if self.closed or self.inner is not None:
            return []
        out = self._start_inner()
        inner: Any = self.inner
        for plain in held:
            if self.gone():  # the inner channel closed it meanwhile
                break
            out.extend(self._seal(inner.handle_datagram(plain)))
        return out

    # -- gateway.security.revocation.Peer (duck-typed: gateway.net sits below it) -----

    def certificate(self) -> x509.Certificate | None:
        return self.peer_cert

    def gone(self) -> bool:
        return self.closed

    def address(self) -> str:
        return f"{self.addr[0]}:{self.addr[1]}"

    def ssl_object(self) -> None:
        return None  # python-mbedtls does not give the verified chain

    def hold(self) -> None:
        if self._held is None:
            self._held = []

    def resume(self) -> None:
        self.handle.call_channel(self._admit)

    def cut(self, live: bool, why: str) -> None:
        if self._judging:  # during the handshake's datagram: handle_datagram closes it
            self._refusal = f"client certificate {why}"
            return
        reason = f"dtls: client certificate {why}"
        self.handle.call_channel(lambda: [] if self.closed else self._close(reason))

    def revoked(self) -> list[Effect]:
        """The client certificate was revoked (:meth:`DtlsServer.rescan`): close_notify
        and close; the inner channel hears of it as of a peer that went
        (``connection_lost``), so it tells the core."""
        return [] if self.closed else self._close("dtls: client certificate revoked")

    # -- DTLS -------------------------------------------------------------------------

    @staticmethod
    def _is_tls_error(exc: Exception) -> bool:
        return type(exc).__module__.startswith("mbedtls")

    def _handshake(self, out: list[Effect]) -> bool:
        """Advance the handshake; True when it is over."""
        buf = self.buffer
        psk = self.context.psk
        if psk is not None:
            psk.found = None
        try:
            while buf._handshake_state is not self._over:
                try:
                    buf.do_handshake()
                except self._want_read:
                    break
                except self._want_write:
                    self._drain(out)
                except self._hvr:
                    # a ClientHello without a valid cookie: answer, keep no state
                    self._drain(out)
                    self.buffer = self._new_buffer()
                    return False
        finally:
            if psk is not None and psk.found is not None:
                self.identity = {"psk_identity": psk.found}  # this peer's lookup
                psk.found = None
        self._drain(out)
        if buf._handshake_state is self._over:
            log.debug("dtls peer %s:%d: handshake done", *self.addr)
            return True
        return False

    def _judge_peer(self) -> str | None:
        """After the handshake: take the client certificate's identity, or say why the
        peer is refused (a certificate that did not verify, when one is optional)."""
        if "psk_identity" in self.identity:
            return None
        der = self.buffer.getpeercert(binary_form=True)
        if not der or not self.context.verify_peer:
            self.identity = {}  # verify_none: an unchecked certificate names nobody
            return None
        if not self.buffer._verified:
            return "client certificate does not verify against cacertfile"
        cert = x509.load_der_x509_certificate(bytes(der))
        guard = self.server.guard
        if guard is None and self.context.crls and crl_status(
            cert, list(self.context.crls)
        ) == "revoked":
            log.warning("dtls peer %s:%d: refused %s (serial %x): certificate revoked",
                        *self.addr, cert.subject.rfc4514_string(), cert.serial_number)
            return "client certificate revoked (crlfile)"
        self.identity = identity_of(cert)
        self.peer_cert = cert
        self.server.live.add(self)
        if guard is not None:  # CRL files, distribution points, OCSP: may hold the peer
            self._judging = True
            try:
                guard.admit_peer(self)
            finally:
                self._judging = False
            return self._refusal
        return None

    def _drain(self, out: list[Effect]) -> None:
        buf = self.buffer
        while True:
            data = buf.peek_outgoing(65536)
            if not data:
                return
            buf.consume_outgoing(len(data))
            out.append(bytes(data))

    def _seal(self, effects: list[Effect]) -> list[Effect]:
        out: list[Effect] = []
        if self.closed:
            return out
        for e in effects:
            if isinstance(e, bytes):
                self.buffer.write(e)
                self._drain(out)
            elif isinstance(e, Close):
                out.extend(self._close(e.reason))
                break
            elif type(e) is not Unheld:  # it counts records, not what they seal to
                out.append(e)
        return out

    def _close(self, reason: str) -> list[Effect]:
        """close_notify (when the session allows one), then Close."""
        out: list[Effect] = []
        if not self.closed:
            self.closed = True
            try:
                self.buffer.shutdown()
                self._drain(out)
            except Exception:  # nothing to tell a broken peer
                pass
        out.append(Close(reason))
        return out
