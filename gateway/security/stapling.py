"""OCSP stapling for a TLS listener (``[listeners.ssl.<name>.ocsp]``, EMQX's names).

The listener's own certificate (the first of ``certfile``) is looked up at
``responder_url`` with ``issuer_pem`` at start and every ``refresh_interval``; a response
that verifies (signed by the issuer or a responder it delegated to, about this
certificate) is stapled to every handshake whose ClientHello asks for it
(``status_request``; ``openssl s_client -status``) through
:class:`gateway.net.openssl_ext.Stapler`.

Invariants:
- A failed refresh keeps the previous response until its nextUpdate, then staples nothing
  (a stale response is worse than none: clients reject it).
- Python's ssl module has no stapling API; without :func:`openssl_ext.available` the
  listener starts without stapling and says so (ERROR).
"""

from __future__ import annotations

import asyncio
import logging
import time

from cryptography import x509

from gateway.config.schema import SslListener
from gateway.net import openssl_ext
from gateway.net.tls import ReloadableContext, load_certificates
from gateway.security.ocsp import ocsp_answer, ocsp_request
from gateway.security.sources import fetch

__all__ = ["OcspStapling"]

log = logging.getLogger("gateway.security.stapling")


class OcspStapling:
    def __init__(self, name: str, listener: SslListener, tls: ReloadableContext) -> None:
        cfg = listener.ocsp
        assert listener.certfile is not None and cfg.issuer_pem is not None
        self.name = name
        self.cfg = cfg
        self.cert: x509.Certificate = load_certificates("certfile", listener.certfile)[0]
        self.issuer = load_certificates("ocsp.issuer_pem", cfg.issuer_pem)[0]
        self.stapler = openssl_ext.Stapler()
        self.valid_until = 0.0
        self._task: asyncio.Task[None] | None = None
        if not openssl_ext.available():
            log.error("listener %s: OCSP stapling is not possible with this Python/OpenSSL",
                      name)
            return
        tls.install(self.stapler.install)
        tls.closers.append(self.close)

    async def refresh(self) -> bool:
        """Fetch a new response now; True when one was stapled."""
        try:
            der = await fetch(self.cfg.responder_url, self.cfg.refresh_http_timeout,
                              ocsp_request(self.cert, self.issuer))
            status, next_update = ocsp_answer(der, self.cert, self.issuer)
        except (OSError, ValueError) as exc:
            log.warning("listener %s: OCSP staple not refreshed: %s", self.name, exc)
            if self.valid_until and time.time() > self.valid_until:
                self.stapler.response = None
            return False
        self.stapler.response = der
        self.valid_until = next_update or time.time() + self.cfg.refresh_interval
        log.info("listener %s: stapling OCSP response (%s) for serial %x", self.name, status,
                 self.cert.serial_number)
        return True

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        async def run() -> None:
            while True:
                await self.refresh()
                await asyncio.sleep(self.cfg.refresh_interval)

        self._task = loop.create_task(run())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
