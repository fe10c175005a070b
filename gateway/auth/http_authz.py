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
- **The request never blocks the event loop**: a cached answer is given at once (a
  :class:`~gateway.core.hooks.Stop`); otherwise the subscriber returns a
  :class:`~gateway.core.deferred.Deferred` that the HTTP answer (aiohttp, a pool of
  ``pool_size`` connections) resolves, and the protocol channel suspends that client's
  input (its later publishes and subscriptions stay behind, in order) until it does;
  every other client is served meanwhile (``GatewayContext.authorize`` with ``wait``).
- The request timeout is a scheduler timer: when it fires first the request is
  cancelled and the answer is the error ``timeout``. Identical requests in flight at
  the same time share one HTTP request.
- A failure never raises into the core: every path ends in allow, deny or ignore.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from gateway.auth.http import AiohttpPoster, Answer, Poster, ask
from gateway.config.schema import GatewayConfig, HttpAuthzSource
from gateway.core.clock import Scheduler
from gateway.core.deferred import Deferred
from gateway.core.hooks import Priority, Stop
from gateway.core.node import Node
from protocols.context import ClientInfo

__all__ = ["HttpAuthorizer", "install_http_authz"]

log = logging.getLogger("gateway.auth")

Decision = Stop[bool] | None
_PLACEHOLDER = re.compile(r"\$\{([^}]+)\}")


class HttpAuthorizer:
    """One HTTP source (module docstring). ``incr`` counts metrics."""

    def __init__(self, source: HttpAuthzSource, scheduler: Scheduler, poster: Poster, *,
                 incr: Callable[[str], None] = lambda metric: None) -> None:
        self.source = source
        self.scheduler = scheduler
        self.poster = poster
        self.incr = incr
        self._cache: OrderedDict[tuple[Any, ...], tuple[float, str]] = OrderedDict()
        self._inflight: dict[tuple[Any, ...], Deferred[Answer]] = {}

    def __repr__(self) -> str:
        return f"HttpAuthorizer({self.source.url!r})"

    def __call__(self, client: ClientInfo, action: str, topic: str, acc: bool
                 ) -> Decision | Deferred[Decision]:
        key = (client.client_id, client.username, client.peer_host, action, topic)
        hit = self._cache.get(key)
        if hit is not None:
            if hit[0] > self.scheduler.time():
                self._cache.move_to_end(key)
                self.incr("authorization.http.cache_hit")
                return Stop(hit[1] == "allow")
            del self._cache[key]
        shared = self._inflight.get(key)
        if shared is None:
            shared = self._inflight[key] = Deferred()
            self._request(key, self._render(self._values(client, action, topic)), shared)
        if shared.done:  # (a poster that failed at once)
            return self._decide(client, action, topic, shared.value)
        mine: Deferred[Decision] = Deferred()
        shared.add_callback(
            lambda answer: mine.resolve(self._decide(client, action, topic, answer)))
        return mine

    def _decide(self, client: ClientInfo, action: str, topic: str, answer: Answer) -> Decision:
        result = answer.result
        if result == "error":
            log.warning("HTTP authorization at %s failed (%s): %s for %s %s %s",
                        self.source.url, answer.why, self.source.on_error, client.client_id,
                        action, topic)
            return Stop(False) if self.source.on_error == "deny" else None
        if result == "ignore":
            return None
        return Stop(result == "allow")

    # -- the request ---------------------------------------------------------------

    def _values(self, client: ClientInfo, action: str, topic: str) -> dict[str, str]:
        values = {
            "clientid": client.client_id, "username": client.username or "",
            "peerhost": client.peer_host or "", "action": action, "topic": topic,
            "protocol": client.protocol, "mountpoint": client.mountpoint,
            "qos": "", "retain": "",
        }
        attrs = client.attrs.get("client_attrs")
        if attrs:  # a JWT's client_attrs: ${client_attrs.NAME}
            values.update({f"client_attrs.{k}": v for k, v in attrs.items()})
        return values

    def _render(self, values: dict[str, str]) -> dict[str, Any]:
        """The body template with its placeholders replaced, in one pass (a value is
        never substituted into again); ``${client_attrs.NAME}`` the client does not have
        is empty, any other unknown placeholder stays as it is."""

        def one(m: re.Match[str]) -> str:
            name = m.group(1)
            default = "" if name.startswith("client_attrs.") else m.group(0)
            return values.get(name, default)

        return {k: _PLACEHOLDER.sub(one, v) for k, v in self.source.body.items()}

    def _request(self, key: tuple[Any, ...], body: dict[str, Any],
                 out: Deferred[Answer]) -> None:
        def finish(answer: Answer) -> None:
            self._inflight.pop(key, None)
            self.incr(f"authorization.http.{answer.result}")
            if answer.result in ("allow", "deny") and self.source.cache_ttl > 0:
                self._cache[key] = (self.scheduler.time() + self.source.cache_ttl,
                                    answer.result)
                self._cache.move_to_end(key)
                while len(self._cache) > self.source.cache_max:
                    self._cache.popitem(last=False)
            out.resolve(answer)

        ask(self.scheduler, self.poster, body, self.source.request_timeout,
            lambda: self.incr("authorization.http.timeout"), finish)


def install_http_authz(node: Node, config: GatewayConfig, loop: Any, services: Any) -> None:
    """Register each enabled HTTP source, in order, before the per-user rules."""
    for source in config.authorization.sources:
        if not source.enable:
            continue
        poster = AiohttpPoster(str(source.url), headers=source.headers,
                               pool_size=source.pool_size,
                               timeout=source.request_timeout + 1.0, loop=loop,
                               method=source.method)
        authz = HttpAuthorizer(source, node.scheduler, poster, incr=node.metrics.incr)
        node.hooks.add("client.authorize", authz, Priority.AUTHZ)
        services.closers.append(poster.close)
        log.info("authorization source: http %s (%s, cache %gs, on_error %s)", source.url,
                 source.method, source.cache_ttl, source.on_error)
