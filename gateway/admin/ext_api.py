"""Management API routes of the MQTT extensions (EMQX 5's shapes where EMQX has them).

- ``GET /api/v5/mqtt/delayed``: settings and the number of waiting messages
- ``GET /api/v5/mqtt/delayed/messages`` (paginated, soonest first),
  ``GET|DELETE /api/v5/mqtt/delayed/messages/{node}/{msgid}`` (one, with its payload in
  base64; DELETE cancels it)
- ``GET /api/v5/mqtt/topic_rewrite``: the rules, in order (read-only: from the config)
- ``GET /api/v5/mqtt/auto_subscribe``: the configured topics
- ``GET /api/v5/mqtt/auto_subscribe/clients`` (paginated),
  ``GET|POST /api/v5/mqtt/auto_subscribe/clients/{clientid}``,
  ``DELETE /api/v5/mqtt/auto_subscribe/clients/{clientid}[?topic=T]``: per-client topics
  in the built-in store (ours: EMQX has only the configured list). POST adds or replaces
  one ``{"topic", "qos", "rh", "rap", "nl"}``; it applies from the client's next connect.
- ``GET /api/v5/mqtt/exclusive``: who holds which exclusive subscription (paginated)

A feature that is switched off answers 501 ``NOT_CONFIGURED``; bad input 400 with one
line naming the problem.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import ValidationError

from gateway.admin.errors import ApiError, bad_request, not_configured, not_found

if TYPE_CHECKING:
    from gateway.admin.host import AdminView
    from gateway.ext.delayed import DelayedPublisher
    from gateway.ext.service import Extensions

__all__ = ["ROUTES", "register"]

API = "/api/v5/mqtt"

ROUTES: list[tuple[str, str, str]] = [
    ("GET", f"{API}/delayed", "delayed"),
    ("GET", f"{API}/delayed/messages", "delayed_messages"),
    ("GET", f"{API}/delayed/messages/{{node}}/{{msgid}}", "delayed_message"),
    ("DELETE", f"{API}/delayed/messages/{{node}}/{{msgid}}", "delayed_cancel"),
    ("GET", f"{API}/topic_rewrite", "topic_rewrite"),
    ("GET", f"{API}/auto_subscribe", "auto_subscribe"),
    ("GET", f"{API}/auto_subscribe/clients", "auto_clients"),
    ("GET", f"{API}/auto_subscribe/clients/{{clientid}}", "auto_client"),
    ("POST", f"{API}/auto_subscribe/clients/{{clientid}}", "auto_client_add"),
    ("DELETE", f"{API}/auto_subscribe/clients/{{clientid}}", "auto_client_delete"),
    ("GET", f"{API}/exclusive", "exclusive"),
]


class _Handlers:
    def __init__(self, admin: AdminView) -> None:
        self.admin = admin

    def _ext(self) -> Extensions:
        ext: Extensions | None = getattr(self.admin.gateway, "ext", None)
        if ext is None:
            raise ApiError(503, "NOT_RUNNING", "the MQTT extensions are not running")
        return ext

    def _delayed(self) -> DelayedPublisher:
        d = self._ext().delayed
        if d is None:
            raise not_configured("delayed publish (delayed.enable)")
        return d

    async def delayed(self, request: web.Request) -> web.Response:
        ext = self._ext()
        cfg = ext.config.delayed
        count = len(ext.delayed.pending) if ext.delayed is not None else 0
        return web.json_response({"enable": cfg.enable,
                                  "max_delayed_messages": cfg.max_delayed_messages,
                                  "count": count})

    async def delayed_messages(self, request: web.Request) -> web.Response:
        from gateway.admin.requests import page

        return page(request, self._delayed().views())

    def _pending_id(self, request: web.Request) -> int:
        node, msgid = request.match_info["node"], request.match_info["msgid"]
        if node != self.admin.node_name:
            raise not_found(f"node {node!r} is not this node ({self.admin.node_name})")
        try:
            return int(msgid)
        except ValueError:
            raise bad_request(f"msgid must be an integer, got {msgid!r}") from None

    async def delayed_message(self, request: web.Request) -> web.Response:
        d = self._delayed()
        id_ = self._pending_id(request)
        p = d.pending.get(id_)
        if p is None:
            raise not_found(f"no delayed message {id_}")
        view: dict[str, Any] = d.view(p)
        view["payload"] = base64.b64encode(p.message.payload).decode()
        return web.json_response(view)

    async def delayed_cancel(self, request: web.Request) -> web.Response:
        id_ = self._pending_id(request)
        if not self._delayed().cancel(id_):
            raise not_found(f"no delayed message {id_}")
        return web.Response(status=204)

    async def topic_rewrite(self, request: web.Request) -> web.Response:
        rules = [r.model_dump() for r in self._ext().config.rewrite]
        return web.json_response(rules)

    async def auto_subscribe(self, request: web.Request) -> web.Response:
        topics = [t.model_dump() for t in self._ext().config.auto_subscribe.topics]
        return web.json_response(topics)

    def _clientid(self, request: web.Request) -> str:
        return request.match_info["clientid"]

    def _store_call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except RuntimeError as exc:
            raise ApiError(503, "STORE_UNAVAILABLE", str(exc)) from None

    async def auto_clients(self, request: web.Request) -> web.Response:
        from gateway.admin.requests import page

        return page(request, self._store_call(self._ext().client_topics))

    async def auto_client(self, request: web.Request) -> web.Response:
        rows = self._store_call(self._ext().client_topics, self._clientid(request))
        return web.json_response(rows)

    async def auto_client_add(self, request: web.Request) -> web.Response:
        from gateway.admin.requests import read_json
        from gateway.config.extensions import AutoSubscribeTopic
        from gateway.store.extensions import AutoSubscribeEntry

        body = await read_json(request)
        try:
            t = AutoSubscribeTopic.model_validate(body)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err["loc"]) or "body"
            raise bad_request(f"{where}: {err['msg']}") from None
        entry = AutoSubscribeEntry(self._clientid(request), t.topic, t.qos, t.rh, t.rap, t.nl)
        self._store_call(self._ext().put_client_topic, entry)
        return web.json_response(entry.view(), status=201)

    async def auto_client_delete(self, request: web.Request) -> web.Response:
        topic = request.query.get("topic") or None
        n = self._store_call(self._ext().delete_client_topic, self._clientid(request), topic)
        if not n:
            what = f"topic {topic!r} of " if topic else "topics of "
            raise not_found(f"no auto-subscribe {what}client {self._clientid(request)!r}")
        return web.Response(status=204)

    async def exclusive(self, request: web.Request) -> web.Response:
        from gateway.admin.requests import page

        ex = self._ext().exclusive
        if ex is None:
            raise not_configured("exclusive subscription (mqtt.exclusive_subscription)")
        return page(request, ex.views())


def register(app: web.Application, admin: AdminView) -> None:
    """Add the routes to the management API's application (before it starts)."""
    h = _Handlers(admin)
    for method, path, name in ROUTES:
        app.router.add_route(method, path, getattr(h, name))
