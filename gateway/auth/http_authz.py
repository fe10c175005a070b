"""HTTP authorization (EMQX's ``http`` authorizer): ``[[authorization.sources]] type = "http"``.

A ``client.authorize`` subscriber. For a publish or subscribe that no cached answer
covers, it sends the source's request (POST with the JSON ``body`` template, or GET with
the template as the query string; ``headers`` as given) and reads the answer:

- 200 with ``{"result": "allow" | "deny" | "ignore"}`` (a missing result is ``ignore``),
  or 204: allow;
- any 4xx: ``ignore``; a timeout, a connection error, a 5xx or an unreadable body: an
  error, decided by ``on_error`` (``deny``, the default, or ``ignore``).

``allow``/``deny`` end the fold (later sources and the per-user rules are not asked);
``ignore`` leaves the decision as it was (the rules file's answer, or ``no_match``).

Invariants:

- Answers ``allow``/``deny`` are cached per (client id, username, peer host, action,
  topic) for ``cache_ttl`` seconds (0: none), at most ``cache_max`` entries, least
  recently used first out; errors and ``ignore`` are not cached.
- **The request is synchronous**: the broker's authorization interface
  (``GatewayContext.authorize``) returns a bool to every protocol channel, so an uncached
  decision waits for the service on the event loop, at most ``request_timeout``. Use a
  service close to the gateway (loopback, LAN) and a short timeout; the cache keeps a
  client's repeated publishes off the network. (An asynchronous authorize needs the
  channels to suspend a PUBLISH/SUBSCRIBE the way they suspend a CONNECT; not done.)
- A failure never raises into the core: every path ends in allow, deny or ignore.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.parse
from collections import OrderedDict
from typing import Any

from gateway.auth.http import Answer, parse_response
from gateway.config.schema import GatewayConfig, HttpAuthzSource
from gateway.core.hooks import Priority, Stop
from gateway.core.node import Node
from protocols.context import ClientInfo

__all__ = ["HttpAuthorizer", "install_http_authz"]

log = logging.getLogger("gateway.auth")

MAX_RESPONSE = 64 * 1024


class HttpAuthorizer:
    """One HTTP source (module docstring). ``incr`` counts metrics."""

    def __init__(self, source: HttpAuthzSource, *, incr: Any = lambda metric: None,
                 clock: Any = time.monotonic) -> None:
        self.source = source
        self.incr = incr
        self.clock = clock
        url = urllib.parse.urlsplit(source.url)
        self._https = url.scheme == "https"
        self._host = url.hostname or "127.0.0.1"
        self._port = url.port or (443 if self._https else 80)
        self._path = url.path or "/"
        self._query = url.query
        self._conn: http.client.HTTPConnection | None = None
        self._cache: OrderedDict[tuple[Any, ...], tuple[float, str]] = OrderedDict()

    def __repr__(self) -> str:
        return f"HttpAuthorizer({self.source.url!r})"

    def __call__(self, client: ClientInfo, action: str, topic: str, acc: bool
                 ) -> Stop[bool] | None:
        key = (client.client_id, client.username, client.peer_host, action, topic)
        now = self.clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            self._cache.move_to_end(key)
            self.incr("authorization.http.cache_hit")
            return Stop(hit[1] == "allow")
        answer = self._ask(client, action, topic)
        self.incr(f"authorization.http.{answer.result}")
        result = answer.result
        if result == "error":
            log.warning("HTTP authorization at %s failed (%s): %s for %s %s %s",
                        self.source.url, answer.why, self.source.on_error, client.client_id,
                        action, topic)
            return Stop(False) if self.source.on_error == "deny" else None
        if result == "ignore":
            return None
        if self.source.cache_ttl > 0:
            self._cache[key] = (now + self.source.cache_ttl, result)
            while len(self._cache) > self.source.cache_max:
                self._cache.popitem(last=False)
        return Stop(result == "allow")

    # -- the request ---------------------------------------------------------------

    def _values(self, client: ClientInfo, action: str, topic: str) -> dict[str, str]:
        return {
            "clientid": client.client_id, "username": client.username or "",
            "peerhost": client.peer_host or "", "action": action, "topic": topic,
            "protocol": client.protocol, "mountpoint": client.mountpoint,
            "qos": "", "retain": "",
        }

    def _render(self, values: dict[str, str]) -> dict[str, str]:
        out = {}
        for k, v in self.source.body.items():
            for name, value in values.items():
                v = v.replace("${" + name + "}", value)
            out[k] = v
        return out

    def _ask(self, client: ClientInfo, action: str, topic: str) -> Answer:
        body = self._render(self._values(client, action, topic))
        headers = dict(self.source.headers)
        if self.source.method == "post":
            data: bytes | None = json.dumps(body).encode()
            headers.setdefault("Content-Type", "application/json")
            path = self._path + (f"?{self._query}" if self._query else "")
        else:
            data = None
            query = urllib.parse.urlencode(body)
            path = self._path + "?" + "&".join(q for q in (self._query, query) if q)
        for attempt in (1, 2):  # a kept-alive connection the server closed: once more
            conn = self._connection()
            try:
                conn.request(self.source.method.upper(), path, body=data, headers=headers)
                response = conn.getresponse()
                payload = response.read(MAX_RESPONSE)
                if response.getheader("Connection", "").lower() == "close":
                    self._drop()
                return parse_response(response.status, payload)
            except TimeoutError:
                self._drop()
                return Answer("error", why=f"no answer within {self.source.request_timeout}s")
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                if attempt == 2 or isinstance(exc, ConnectionRefusedError):
                    return Answer("error", why=f"{type(exc).__name__}: {exc}")
        return Answer("error", why="unreachable")  # pragma: no cover

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            timeout = self.source.request_timeout
            if self._https:
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        self._drop()


def install_http_authz(node: Node, config: GatewayConfig, loop: Any, services: Any) -> None:
    """Register each enabled HTTP source, in order, before the per-user rules."""
    for source in config.authorization.sources:
        if not source.enable:
            continue
        authz = HttpAuthorizer(source, incr=node.metrics.incr)
        node.hooks.add("client.authorize", authz, Priority.AUTHZ)

        async def close(a: HttpAuthorizer = authz) -> None:
            a.close()

        services.closers.append(close)
        log.info("authorization source: http %s (%s, cache %gs, on_error %s)", source.url,
                 source.method, source.cache_ttl, source.on_error)
