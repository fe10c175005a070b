"""Authentication against the built-in user database (:mod:`gateway.store.users`).

Two entry points share one stored SCRAM credential per user:

- :class:`BuiltinAuthenticator`, a ``client.authenticate`` hook subscriber for user name
  and password: an unknown user is not decided (the next backend, then
  ``allow_anonymous``, decides), a wrong or missing password is 0x86 (3.1.1 return code
  4), the right one is 0 and sets ``client.attrs["is_superuser"]``. The slow hash runs on
  a worker thread (an :data:`Offload`), so the event loop never waits for it; beyond
  ``max_pending`` hashes in flight a new client is refused with 0x89 (server busy)
  rather than queued behind a storm.
- :class:`ScramExchange`, an MQTT 5 enhanced authentication exchange for
  ``SCRAM-SHA-256`` (:mod:`gateway.security.scram`): the client does the slow hash, the
  server only HMACs, so it runs on the loop.

Both set ``client.attrs["authn"] = "builtin_db"`` on success: per-user rules apply only
to clients a backend authenticated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from gateway.core.deferred import Deferred
from gateway.core.hooks import Stop
from gateway.security.scram import ScramError, ScramServer, verify_password
from gateway.store.users import User, UserStore
from protocols.context import AuthStep, ClientInfo
from protocols.mqtt.reason_codes import ReasonCode as RC

__all__ = ["BuiltinAuthenticator", "Offload", "ScramExchange", "ThreadOffload"]

log = logging.getLogger("gateway.auth")

T = TypeVar("T")

Offload = Callable[[Callable[[], Any], Callable[[Any], None]], None]
"""``offload(fn, done)``: run ``fn`` off the event loop, then ``done(result)`` on it."""


class ThreadOffload:
    """An :data:`Offload` on a thread pool (hashlib releases the GIL while hashing)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, workers: int) -> None:
        self.loop = loop
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="authn-hash")

    def __call__(self, fn: Callable[[], T], done: Callable[[T], None]) -> None:
        future = self.executor.submit(fn)

        def finished(f: Future[T]) -> None:
            if f.cancelled():
                return
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self.loop.call_soon_threadsafe(done, f.result())

        future.add_done_callback(finished)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def _succeeded(client: ClientInfo, user: User) -> None:
    client.set_attr("is_superuser", user.is_superuser)
    client.set_attr("authn", "builtin_db")


class BuiltinAuthenticator:
    """``client.authenticate`` subscriber (module docstring)."""

    def __init__(
        self, store: UserStore, offload: Offload | None = None, *, max_pending: int = 256
    ) -> None:
        self.store = store
        self.offload = offload
        self.max_pending = max_pending
        self.pending = 0

    def __repr__(self) -> str:
        return "BuiltinAuthenticator()"

    def __call__(
        self, client: ClientInfo, password: bytes | None, acc: object
    ) -> Stop[int] | Deferred[Stop[int]] | None:
        username = client.username
        if not username:
            return None
        user = self.store.get(username)
        if user is None:
            return None
        if not password:
            return Stop(RC.BAD_USER_NAME_OR_PASSWORD)
        credential = user.credential

        def check() -> bool | None:
            try:
                return verify_password(credential, password)
            except Exception:
                log.exception("password check of %r failed", username)
                return None

        if self.offload is None:
            return self._decide(client, user, check())
        if self.pending >= self.max_pending:
            log.warning("%d password checks pending: %r refused (busy)", self.pending, username)
            return Stop(RC.SERVER_BUSY)
        self.pending += 1
        deferred: Deferred[Stop[int]] = Deferred()

        def done(ok: bool | None) -> None:
            self.pending -= 1
            deferred.resolve(self._decide(client, user, ok))

        self.offload(check, done)
        return deferred

    @staticmethod
    def _decide(client: ClientInfo, user: User, ok: bool | None) -> Stop[int]:
        if ok is None:
            return Stop(RC.UNSPECIFIED_ERROR)
        if not ok:
            return Stop(RC.BAD_USER_NAME_OR_PASSWORD)
        _succeeded(client, user)
        return Stop(0)


class ScramExchange:
    """One SCRAM server exchange as an MQTT 5 :class:`~protocols.context.AuthExchange`.

    The SCRAM user must be the CONNECT's user name when one was given (and, when
    re-authenticating, the connection's); otherwise it becomes the client's user name.
    Every failure is 0x86 with ``e=<error>`` as Authentication Data.
    """

    def __init__(
        self,
        store: UserStore,
        client: ClientInfo,
        *,
        hash_name: str = "sha256",
        fake_secret: bytes | None = None,
        fake_iterations: int = 100_000,
    ) -> None:
        self.store = store
        self.client = client
        self.server = ScramServer(
            hash_name, fake_secret=fake_secret, fake_iterations=fake_iterations
        )
        self.user: User | None = None
        self.stage = 0

    def step(self, data: bytes | None) -> AuthStep:
        try:
            if data is None:
                raise ScramError("other-error", "no Authentication Data")
            self.stage += 1
            if self.stage == 1:
                return self._first(data)
            if self.stage == 2:
                return self._final(data)
            raise ScramError("other-error", "exchange already finished")
        except ScramError as exc:
            return AuthStep(
                RC.BAD_USER_NAME_OR_PASSWORD, ScramServer.server_error(exc.error), f"SCRAM: {exc}"
            )

    def _first(self, data: bytes) -> AuthStep:
        username = self.server.receive_client_first(data)
        expected = self.client.username
        if expected is not None and expected != username:
            raise ScramError("other-error", "SCRAM user is not the MQTT user name")
        self.user = self.store.get(username)
        server_first = self.server.server_first(self.user.credential if self.user else None)
        return AuthStep(RC.CONTINUE_AUTHENTICATION, server_first)

    def _final(self, data: bytes) -> AuthStep:
        server_final = self.server.receive_client_final(data)
        user = self.user
        assert user is not None  # an unknown user never passes the proof
        if self.client.username is None:
            self.client.username = user.username
        _succeeded(self.client, user)
        return AuthStep(0, server_final)
