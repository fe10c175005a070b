"""Certificate revocation for a TLS listener: CRL files, CRL distribution points, OCSP.

One :class:`RevocationGuard` per ssl/wss/dtls listener that asks for it; the connections
it judges are :class:`Peer` s (a TLS stream shell, or a DTLS session:
``gateway.net.dtls.DtlsChannel``, which checks CRL files through the guard too, after its
handshake). Where each source is checked:

The OCSP request and the checks of its answer are in :mod:`gateway.security.ocsp`; the
certificates' distribution points and OCSP URLs, and the HTTP fetch, in
:mod:`gateway.security.sources`. This module holds the guard.

- **CRL files** (``crlfile``) are loaded into the listener's OpenSSL context
  (:func:`gateway.net.tls.add_crls`), so a revoked client fails the TLS handshake itself
  (alert ``certificate_revoked``). The guard watches the files (``[crl_cache]
  file_check_interval``) and SIGHUP re-reads them: the listener's context is rebuilt
  (new handshakes) and every live connection is checked against the new CRLs.
- **Distribution points** (``enable_crl_check``) and **OCSP** (``ocsp_check``) need a
  network round trip, which OpenSSL's handshake cannot wait for from Python. They are
  checked right after the handshake, before the first byte of MQTT is read: the
  connection's reading is paused until the answer is known (a cached answer decides at
  once), then resumed, or the connection is cut. With TLS 1.3 this is where a client
  learns of a refusal anyway (the client certificate is sent after the server's
  Finished).

Invariants:

- A CRL is used only when its signature checks against a CA of the listener's
  ``cacertfile``; a fetched CRL that does not is an error (``fail_mode`` applies), never
  "not revoked". OCSP responses are used only when signed by the issuing CA or by a
  responder certificate it issued with the OCSPSigning purpose.
- A certificate is checked against its issuer: a CA of ``cacertfile``, or an
  intermediate CA from the chain OpenSSL verified for that very connection
  (:func:`gateway.net.openssl_ext.verified_chain`; remembered, at most ``capacity`` of
  them, so their CRLs can be checked and their live certificates asked about again). A
  certificate whose issuer is neither is ``unknown`` (``fail_mode``); so are all those
  of an intermediate when the chain cannot be read (another Python or OpenSSL).
- ``fail_mode`` "closed": a connection whose status cannot be learnt is cut; "open": it
  is admitted, and cut later if the answer, once it comes, says revoked.
- Every refusal and cut is logged (WARNING, with the certificate's subject and serial)
  and counted: ``tls.revoked.refused``, ``tls.revoked.disconnected``,
  ``tls.revocation.unknown`` (metrics of the node).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from gateway.net.openssl_ext import verified_chain
from gateway.net.tls import TlsError, check_crl, crl_status, load_certificates, load_crls
from gateway.security.ocsp import Status, ocsp_answer, ocsp_query, ocsp_request
from gateway.security.sources import distribution_points, fetch, ocsp_url

# (the OCSP and fetching parts live in gateway.security.ocsp and .sources; their names
# stay importable from here)
__all__ = [
    "GuardSettings",
    "Peer",
    "RevocationGuard",
    "Status",
    "crl_status",
    "distribution_points",
    "fetch",
    "ocsp_answer",
    "ocsp_query",
    "ocsp_request",
    "ocsp_url",
]

log = logging.getLogger("gateway.security.revocation")


# ------------------------------------------------------------------ the guard


@dataclass(slots=True)
class GuardSettings:
    crlfile: list[Path]
    cacertfile: Path
    enable_crl_check: bool = False
    refresh_interval: float = 900.0
    http_timeout: float = 15.0
    capacity: int = 100
    crl_fail_mode: str = "closed"
    file_check_interval: float = 5.0
    ocsp_enable: bool = False
    ocsp_url: str = ""
    ocsp_ttl: float = 300.0
    ocsp_timeout: float = 5.0
    ocsp_fail_mode: str = "closed"


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


class Peer(Protocol):
    """One connection the guard watches: a TLS stream (:class:`_ShellPeer`) or a DTLS
    session (``gateway.net.dtls``). ``hold``/``resume`` stop and restart its input while
    a verdict is fetched; ``cut(live)`` ends it (``live``: it had been admitted, so it is
    told why first, e.g. MQTT DISCONNECT 0x98)."""

    def certificate(self) -> x509.Certificate | None: ...
    def gone(self) -> bool: ...
    def address(self) -> str: ...
    def ssl_object(self) -> Any: ...
    def hold(self) -> None: ...
    def resume(self) -> None: ...
    def cut(self, live: bool, why: str) -> None: ...


class _ShellPeer:
    """A TLS stream shell as a :class:`Peer`."""

    __slots__ = ("shell",)

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def certificate(self) -> x509.Certificate | None:
        return _peer_cert(self.shell)

    def gone(self) -> bool:
        t = self.shell.transport
        return t is None or t.is_closing() or bool(getattr(self.shell, "closed", False))

    def address(self) -> str:
        return _peer(self.shell)

    def ssl_object(self) -> Any:
        t = self.shell.transport
        return t.get_extra_info("ssl_object") if t is not None else None

    def hold(self) -> None:
        self.shell.transport.pause_reading()

    def resume(self) -> None:
        self.shell.transport.resume_reading()

    def cut(self, live: bool, why: str) -> None:
        shell = self.shell
        transport = shell.transport
        if live:
            try:
                shell.kick(0x98)  # administrative action (MQTT 5 DISCONNECT)
            except Exception:  # pragma: no cover - a channel bug must not keep it open
                log.exception("kick failed")
        if transport is not None and not transport.is_closing():
            transport.abort()


class RevocationGuard:
    """The revocation state of one listener and its live TLS connections.

    ``on_files_changed`` is called when a CRL file changed on disk (the owner rebuilds
    its OpenSSL context, then calls :meth:`reload_files`); ``incr`` counts metrics.
    Call :meth:`start` on the loop, :meth:`admit` for each new connection (a stream
    shell; :meth:`admit_peer` for any :class:`Peer`), :meth:`close` at the end.
    """

    def __init__(
        self,
        name: str,
        settings: GuardSettings,
        *,
        incr: Callable[[str], None] = lambda metric: None,
        on_files_changed: Callable[[], object] | None = None,
        kind: str = "listener",
    ) -> None:
        self.kind = kind  # what ``name`` is, in log lines: "listener", "bridge", "cluster"
        self.name = name
        self.s = settings
        self.incr = incr
        self.on_files_changed = on_files_changed
        self.cas = load_certificates("cacertfile", settings.cacertfile)
        self.file_crls: list[x509.CertificateRevocationList] = []
        self._stats = {p: _stat(p) for p in settings.crlfile}
        self.reload_files(rescan=False)
        # url -> (CRL, fetched at); failures are not cached
        self.dp: OrderedDict[str, tuple[x509.CertificateRevocationList, float]] = OrderedDict()
        self._dp_pending: dict[str, asyncio.Future[None]] = {}
        # (issuer subject DER, serial) -> (status, valid until)
        self.ocsp: dict[tuple[bytes, int], tuple[Status, float]] = {}
        self.live: dict[int, Peer] = {}  # id(peer) -> peer
        # intermediate CAs from verified peer chains: subject DER -> certificate
        self.learned: OrderedDict[bytes, x509.Certificate] = OrderedDict()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: list[asyncio.TimerHandle] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- life cycle ----------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if self.s.crlfile:
            self._every(self.s.file_check_interval, self.check_files)
        if self.s.enable_crl_check:
            self._every(self.s.refresh_interval, self._refresh_dp)
        if self.s.ocsp_enable:
            self._every(self.s.ocsp_ttl, self._recheck_ocsp)

    def _every(self, seconds: float, fn: Callable[[], None]) -> None:
        assert self._loop is not None
        loop = self._loop

        def tick() -> None:
            fn()
            self._timers.append(loop.call_later(seconds, tick))

        self._timers.append(loop.call_later(seconds, tick))

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for task in self._tasks:
            task.cancel()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- CRL files -----------------------------------------------------------------

    def check_files(self) -> None:
        """Reload when a CRL file changed (mtime or size) since last looked at."""
        now = {p: _stat(p) for p in self.s.crlfile}  # inode, mtime, size: a rename too
        if now != self._stats:
            self._stats = now
            log.info("%s %s: CRL file changed", self.kind, self.name)
            if self.on_files_changed is not None:
                self.on_files_changed()
            else:
                self.reload_files()

    def reload_files(self, *, rescan: bool = True) -> bool:
        """Re-read the CRL files; on an error keep the previous CRLs (logged)."""
        try:
            loaded = load_crls("crlfile", list(self.s.crlfile))
            for path, crl in loaded:
                check_crl("crlfile", path, crl, self.cas)
        except TlsError as exc:
            log.error("%s %s: CRLs not reloaded, keeping the previous ones: %s",
                      self.kind, self.name, exc)
            return False
        self._stats = {p: _stat(p) for p in self.s.crlfile}
        self.file_crls = [crl for _, crl in loaded]
        if loaded:
            total = sum(len(list(crl)) for crl in self.file_crls)
            log.info("%s %s: %d CRL(s) loaded, %d revoked serials",
                     self.kind, self.name, len(loaded), total)
        if rescan:
            self.rescan("CRL file")
        return True

    # -- connections ---------------------------------------------------------------

    def admit(self, shell: Any) -> None:
        """A new TLS connection (its shell, after the handshake): :meth:`admit_peer`."""
        self.admit_peer(_ShellPeer(shell))

    def admit_peer(self, peer: Peer) -> None:
        """A new connection: check its certificate; hold its input while an answer is
        fetched (a known revocation cuts it at once, through ``peer.cut``)."""
        cert = peer.certificate()
        if cert is None:
            return
        self._prune()
        self.live[id(peer)] = peer
        if (self.s.enable_crl_check or self.s.ocsp_enable) and self._issuer(cert) is None:
            self._learn(peer)
        status = self._known_status(cert)
        if status == "revoked":
            self._cut(peer, cert, "refused", "revoked")
            return
        pending = self._lookups(cert)
        if not pending:
            return
        peer.hold()
        self._spawn(self._decide_later(peer, cert, pending))

    async def _decide_later(self, peer: Peer, cert: x509.Certificate,
                            pending: list[tuple[str, Any]]) -> None:
        failed: list[str] = []
        for kind, awaitable in pending:
            try:
                await awaitable
            except (OSError, ValueError, TlsError) as exc:
                failed.append(f"{kind}: {exc}")
        if peer.gone():
            return
        status = self._known_status(cert)
        if status == "revoked":
            self._cut(peer, cert, "refused", "revoked")
            return
        for why in failed:
            kind = why.split(":", 1)[0]
            mode = self.s.ocsp_fail_mode if kind == "ocsp" else self.s.crl_fail_mode
            self.incr("tls.revocation.unknown")
            if mode == "closed":
                self._cut(peer, cert, "refused", f"status unknown ({why}), fail_mode closed")
                return
            log.warning("%s %s: revocation status of %s unknown (%s), admitted "
                        "(fail_mode open)", self.kind, self.name, _who(cert), why)
        peer.resume()

    def _lookups(self, cert: x509.Certificate) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        issuer = self._issuer(cert)
        if self.s.enable_crl_check:
            for url in distribution_points(cert):
                if url not in self.dp:
                    out.append(("crl", self._fetch_dp(url)))
        if self.s.ocsp_enable:
            key = (cert.issuer.public_bytes(), cert.serial_number)
            hit = self.ocsp.get(key)
            if hit is None or hit[1] <= time.time():
                if issuer is None:
                    unknown = ValueError("issuer neither in cacertfile nor in the verified chain")
                    out.append(("ocsp", _fail(unknown)))
                else:
                    out.append(("ocsp", self._ask_ocsp(cert, issuer)))
        return out

    def _known_status(self, cert: x509.Certificate) -> Status:
        crls = self.file_crls + [crl for crl, _ in self.dp.values()]
        status = crl_status(cert, crls)
        if status == "revoked":
            return status
        hit = self.ocsp.get((cert.issuer.public_bytes(), cert.serial_number))
        if hit is not None and hit[0] == "revoked":
            return "revoked"
        return status

    def _issuer(self, cert: x509.Certificate) -> x509.Certificate | None:
        """The CA (of ``cacertfile``, or learnt) whose key signed ``cert``."""
        for ca in (*self.cas, *self.learned.values()):
            if ca.subject != cert.issuer:
                continue
            try:
                cert.verify_directly_issued_by(ca)
            except (ValueError, TypeError, InvalidSignature):
                continue
            return ca
        return None

    def _learn(self, peer: Peer) -> None:
        """Remember the intermediate CAs of the chain OpenSSL verified for ``peer``."""
        ssl_object = peer.ssl_object()
        chain = verified_chain(ssl_object) if ssl_object is not None else None
        for der in (chain or [])[1:-1]:  # not the peer's own, not the trust anchor
            ca = x509.load_der_x509_certificate(der)
            key = ca.subject.public_bytes()
            if key not in self.learned:
                log.info("%s %s: intermediate CA %s learnt from a verified chain",
                         self.kind, self.name, ca.subject.rfc4514_string())
            self.learned[key] = ca
            self.learned.move_to_end(key)
            while len(self.learned) > self.s.capacity:
                self.learned.popitem(last=False)

    def rescan(self, why: str) -> int:
        """Check every live connection against what is known now; cut the revoked ones.
        Returns how many were cut."""
        self._prune()
        cut = 0
        for peer in list(self.live.values()):
            cert = peer.certificate()
            if cert is not None and self._known_status(cert) == "revoked":
                self._cut(peer, cert, "disconnected", f"revoked ({why})")
                cut += 1
        return cut

    def _prune(self) -> None:
        for key, peer in list(self.live.items()):
            if peer.gone():
                del self.live[key]

    def _cut(self, peer: Peer, cert: x509.Certificate, what: str, why: str) -> None:
        self.live.pop(id(peer), None)
        self.incr(f"tls.revoked.{what}" if why.startswith("revoked") else "tls.revocation.refused")
        log.warning("%s %s: %s %s from %s: certificate %s", self.kind, self.name, what, _who(cert),
                    peer.address(), why)
        peer.cut(what == "disconnected", why)

    # -- distribution points -------------------------------------------------------

    def _fetch_dp(self, url: str) -> asyncio.Future[None]:
        fut = self._dp_pending.get(url)
        if fut is None:
            fut = self._dp_pending[url] = self._spawn(self._load_dp(url))
            fut.add_done_callback(lambda _f: self._dp_pending.pop(url, None))
        return fut

    async def _load_dp(self, url: str) -> None:
        data = await fetch(url, self.s.http_timeout)
        try:
            crl = (x509.load_pem_x509_crl(data) if data.lstrip().startswith(b"-----")
                   else x509.load_der_x509_crl(data))
        except ValueError:
            self.incr("tls.crl.fetch_failed")
            raise ValueError(f"no CRL at {url}") from None
        check_crl("crl", url, crl, [*self.cas, *self.learned.values()])
        self.dp[url] = (crl, time.time())
        self.dp.move_to_end(url)
        while len(self.dp) > self.s.capacity:
            self.dp.popitem(last=False)
        self.incr("tls.crl.fetched")
        log.info("%s %s: CRL from %s: %d revoked, next update %s", self.kind, self.name, url,
                 len(list(crl)), _when(crl.next_update_utc))

    def _refresh_dp(self) -> None:
        urls = list(self.dp)

        async def all_of() -> None:
            changed = False
            for url in urls:
                before = self.dp.get(url)
                try:
                    await self._fetch_dp(url)
                except (OSError, ValueError, TlsError) as exc:
                    log.warning("%s %s: CRL refresh from %s failed, keeping the "
                                "cached one: %s", self.kind, self.name, url, exc)
                    continue
                changed = changed or self.dp.get(url) is not before
            if changed:
                self.rescan("CRL distribution point")

        if urls:
            self._spawn(all_of())

    # -- OCSP ----------------------------------------------------------------------

    async def _ask_ocsp(self, cert: x509.Certificate, issuer: x509.Certificate) -> None:
        url = self.s.ocsp_url or ocsp_url(cert)
        if not url:
            raise ValueError("no OCSP responder (responder_url, or the certificate's AIA)")
        status, next_update = await ocsp_query(url, cert, issuer, self.s.ocsp_timeout)
        until = time.time() + self.s.ocsp_ttl
        if next_update is not None:
            until = min(until, next_update)
        self.ocsp[(cert.issuer.public_bytes(), cert.serial_number)] = (status, until)
        self.incr(f"tls.ocsp.{status}")
        if status == "unknown":
            raise ValueError("OCSP responder does not know the certificate")

    def _recheck_ocsp(self) -> None:
        """Ask again about every live connection's certificate; cut the revoked ones."""
        self._prune()
        certs: dict[tuple[bytes, int], x509.Certificate] = {}
        for peer in self.live.values():
            cert = peer.certificate()
            if cert is not None:
                certs[(cert.issuer.public_bytes(), cert.serial_number)] = cert

        async def ask_all() -> None:
            for cert in certs.values():
                issuer = self._issuer(cert)
                if issuer is None:
                    continue
                try:
                    await self._ask_ocsp(cert, issuer)
                except (OSError, ValueError) as exc:
                    log.warning("%s %s: OCSP re-check of %s failed: %s", self.kind, self.name,
                                _who(cert), exc)
            self.rescan("OCSP")

        if certs:
            self._spawn(ask_all())


async def _fail(exc: Exception) -> None:
    raise exc


def _peer_cert(shell: Any) -> x509.Certificate | None:
    transport = shell.transport
    if transport is None:
        return None
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der) if der else None


def _who(cert: x509.Certificate) -> str:
    return f"{cert.subject.rfc4514_string()} (serial {cert.serial_number:x})"


def _peer(shell: Any) -> str:
    t = shell.transport
    peer = t.get_extra_info("peername") if t is not None else None
    return f"{peer[0]}:{peer[1]}" if peer else "?"


def _when(value: datetime.datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "none"
