"""Authentication by an HTTP service (EMQX's HTTP authenticator, POST only).

For each client the authenticator POSTs a JSON body (by default ``{"clientid",
"username", "password", "peerhost", "protocol"}``; the ``body`` setting is a template
whose values may hold ``${clientid}``, ``${username}``, ``${password}``, ``${peerhost}``,
``${protocol}``) and reads the answer:

- 200 with ``{"result": "allow" | "deny" | "ignore", "is_superuser": bool}`` (a missing
  result is ``ignore``), or 204 (allow);
- any 4xx: ``ignore`` (EMQX's rule: the next backend decides);
- a timeout, a connection error, a 5xx or an unreadable body: an error, which is
  ``ignore`` or a refusal with 0x88 (server unavailable), per ``on_error``.

``allow`` accepts (0) and sets ``client.attrs["is_superuser"]``; ``deny`` refuses with
0x86, bad user name or password (3.1.1 return code 4), the same code as a wrong password
in the built-in database; ``ignore`` leaves the decision to the rest of the chain.

Invariants:
- The request timeout is a scheduler timer (virtual in tests): when it fires first the
  request is cancelled and the answer is the error ``timeout``.
- ``allow`` and ``deny`` answers are cached for ``cache_ttl`` seconds (0: no cache),
  keyed by every value the request carries, the password only as an HMAC under a
  per-process random key; at most ``cache_max`` entries (least recently used go first).
  ``ignore`` and errors are never cached.
- Identical requests in flight at the same time share one HTTP request.
- A network failure never raises into the core: every path ends in one answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gateway.core.clock import Scheduler, TimerHandle
from gateway.core.deferred import Deferred
from gateway.core.hooks import Stop
from protocols.context import ClientInfo
from protocols.mqtt.reason_codes import ReasonCode as RC

__all__ = [
    "DEFAULT_BODY",
    "AiohttpPoster",
    "Answer",
    "HttpAuthSettings",
    "HttpAuthenticator",
    "Poster",
    "parse_response",
]

log = logging.getLogger("gateway.auth")

DEFAULT_BODY: dict[str, str] = {
    "clientid": "${clientid}",
    "username": "${username}",
    "password": "${password}",
    "peerhost": "${peerhost}",
    "protocol": "${protocol}",
}
MAX_RESPONSE = 64 * 1024  # bytes of response body read at most


@dataclass(slots=True)
class HttpAuthSettings:
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_BODY))
    request_timeout: float = 5.0
    cache_ttl: float = 60.0
    cache_max: int = 10_000
    on_error: Literal["ignore", "deny"] = "ignore"
    pool_size: int = 8


@dataclass(frozen=True, slots=True)
class Answer:
    """What the service said: ``allow``, ``deny``, ``ignore`` or ``error``."""

    result: Literal["allow", "deny", "ignore", "error"]
    is_superuser: bool = False
    why: str = ""


def parse_response(status: int, body: bytes | None) -> Answer:
    """The EMQX HTTP authenticator's response rules (module docstring)."""
    if status == 204:
        return Answer("allow")
    if 400 <= status < 500:
        return Answer("ignore", why=f"HTTP {status}")
    if status != 200:
        return Answer("error", why=f"HTTP {status}")
    try:
        data = json.loads(body or b"")
    except ValueError:
        return Answer("error", why="response is not JSON")
    if not isinstance(data, dict):
        return Answer("error", why="response is not a JSON object")
    result = data.get("result", "ignore")
    if result not in ("allow", "deny", "ignore"):
        return Answer("error", why=f"unknown result {result!r}")
    superuser = data.get("is_superuser", False)
    if isinstance(superuser, str):
        superuser = superuser.lower() == "true"
    return Answer(result, bool(superuser) if result == "allow" else False)


class Poster(Protocol):
    """Sends one request. ``post(body, done)`` calls ``done(status, body, error)`` once
    (``error`` is a string when no HTTP answer came) and returns a cancel function."""

    def post(
        self, body: dict[str, Any], done: Callable[[int, bytes | None, str | None], None]
    ) -> Callable[[], None]: ...


def ask(scheduler: Scheduler, poster: Poster, body: dict[str, Any], timeout: float,
        timed_out: Callable[[], None], finish: Callable[[Answer], None]) -> None:
    """POST ``body`` and call ``finish`` exactly once: with the service's answer, or an
    ``error`` answer when no HTTP answer came, the request could not start, or
    ``timeout`` seconds passed (then ``timed_out`` runs first and the request is
    cancelled). Shared by HTTP authentication and authorization."""
    done = False
    timer: TimerHandle | None = None
    cancel: Callable[[], None] | None = None

    def once(answer: Answer) -> None:
        nonlocal done
        if done:
            return
        done = True
        if timer is not None:
            timer.cancel()
        finish(answer)

    def answered(status: int, data: bytes | None, error: str | None) -> None:
        once(Answer("error", why=error) if error else parse_response(status, data))

    def expired() -> None:
        timed_out()
        if cancel is not None:
            cancel()
        once(Answer("error", why=f"no answer within {timeout}s"))

    timer = scheduler.call_later(timeout, expired)
    try:
        cancel = poster.post(body, answered)
    except Exception as exc:  # a poster that fails to even start
        once(Answer("error", why=f"request not sent: {exc}"))


class HttpAuthenticator:
    """``client.authenticate`` subscriber (module docstring)."""

    def __init__(
        self,
        settings: HttpAuthSettings,
        scheduler: Scheduler,
        poster: Poster,
        *,
        incr: Callable[[str], None] = lambda metric: None,
    ) -> None:
        self.settings = settings
        self.scheduler = scheduler
        self.poster = poster
        self.incr = incr
        self._key = os.urandom(32)
        self._cache: OrderedDict[tuple[Any, ...], tuple[float, Answer]] = OrderedDict()
        self._inflight: dict[tuple[Any, ...], Deferred[Answer]] = {}

    def __repr__(self) -> str:
        return f"HttpAuthenticator({self.settings.url!r})"

    def __call__(
        self, client: ClientInfo, password: bytes | None, acc: object
    ) -> Stop[int] | Deferred[Stop[int] | None] | None:
        values = {
            "clientid": client.client_id,
            "username": client.username or "",
            "password": "" if password is None else password.decode("utf-8", "replace"),
            "peerhost": client.peer_host or "",
            "protocol": client.protocol,
        }
        digest = hmac.new(self._key, password or b"", hashlib.sha256).digest()
        key = (client.client_id, client.username, digest, client.peer_host, client.protocol)
        cached = self._cached(key)
        if cached is not None:
            self.incr("authentication.http.cache_hit")
            return self._decide(client, cached)
        shared = self._inflight.get(key)
        if shared is None:
            shared = self._inflight[key] = Deferred()
            self._request(key, _render(self.settings.body, values), shared)
        if shared.done:
            return self._decide(client, shared.value)
        mine: Deferred[Stop[int] | None] = Deferred()
        shared.add_callback(lambda answer: mine.resolve(self._decide(client, answer)))
        return mine

    # -- the request --------------------------------------------------------------

    def _request(self, key: tuple[Any, ...], body: dict[str, Any], out: Deferred[Answer]) -> None:
        def finish(answer: Answer) -> None:
            self._inflight.pop(key, None)
            self.incr(f"authentication.http.{answer.result}")
            if answer.result == "error":
                log.warning("HTTP authentication at %s failed: %s", self.settings.url, answer.why)
            elif answer.result in ("allow", "deny") and self.settings.cache_ttl > 0:
                self._store(key, answer)
            out.resolve(answer)

        ask(self.scheduler, self.poster, body, self.settings.request_timeout,
            lambda: self.incr("authentication.http.timeout"), finish)

    def _decide(self, client: ClientInfo, answer: Answer) -> Stop[int] | None:
        result = answer.result
        if result == "allow":
            client.set_attr("is_superuser", answer.is_superuser)
            client.set_attr("authn", "http")
            return Stop(0)
        if result == "deny":
            return Stop(RC.BAD_USER_NAME_OR_PASSWORD)
        if result == "error" and self.settings.on_error == "deny":
            return Stop(RC.SERVER_UNAVAILABLE)
        return None

    # -- cache ------------------------------------------------------------------

    def _cached(self, key: tuple[Any, ...]) -> Answer | None:
        entry = self._cache.get(key)
        if entry is None:
            return None
        expires, answer = entry
        if expires <= self.scheduler.time():
            del self._cache[key]
            return None
        self._cache.move_to_end(key)
        return answer

    def _store(self, key: tuple[Any, ...], answer: Answer) -> None:
        self._cache[key] = (self.scheduler.time() + self.settings.cache_ttl, answer)
        self._cache.move_to_end(key)
        while len(self._cache) > self.settings.cache_max:
            self._cache.popitem(last=False)


def _render(template: Mapping[str, Any], values: Mapping[str, str]) -> dict[str, Any]:
    def one(v: Any) -> Any:
        if isinstance(v, str):
            for name, value in values.items():
                v = v.replace("${" + name + "}", value)
            return v
        if isinstance(v, Mapping):
            return {k: one(x) for k, x in v.items()}
        return v

    return {k: one(v) for k, v in template.items()}


class AiohttpPoster:
    """A :class:`Poster` on aiohttp: one client session (connection pool) per backend.
    ``method="get"`` sends the body as the query string instead (added to the URL's)."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        pool_size: int = 8,
        timeout: float = 5.0,
        loop: asyncio.AbstractEventLoop | None = None,
        method: Literal["post", "get"] = "post",
    ) -> None:
        self.url = url
        self.method = method
        self.headers = dict(headers or {})
        self.pool_size = pool_size
        self.timeout = timeout
        self.loop = loop
        self._session: Any = None
        self._tasks: set[asyncio.Task[tuple[int, bytes]]] = set()

    def post(
        self, body: dict[str, Any], done: Callable[[int, bytes | None, str | None], None]
    ) -> Callable[[], None]:
        loop = self.loop or asyncio.get_running_loop()
        task = loop.create_task(self._post(body))
        self._tasks.add(task)

        def finished(t: asyncio.Task[tuple[int, bytes]]) -> None:
            self._tasks.discard(t)
            if t.cancelled():
                return
            exc = t.exception()
            if exc is not None:
                done(0, None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            else:
                status, data = t.result()
                done(status, data, None)

        task.add_done_callback(finished)

        def cancel() -> None:
            task.cancel()

        return cancel

    async def _post(self, body: dict[str, Any]) -> tuple[int, bytes]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.pool_size),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                headers=self.headers,
            )
        if self.method == "get":
            query = urllib.parse.urlencode(body)
            url = self.url + ("&" if "?" in self.url else "?") + query if query else self.url
            request = self._session.get(url)
        else:
            request = self._session.post(self.url, json=body)
        async with request as response:
            data = await response.content.read(MAX_RESPONSE)
            return int(response.status), bytes(data)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None
