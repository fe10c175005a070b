"""Management API routes of the rule engine (EMQX 5's shapes), added to the admin app.

- ``GET /api/v5/rules`` (paginated), ``POST /api/v5/rules`` (201; 409 if the id exists)
- ``GET|PUT|DELETE /api/v5/rules/{id}`` (PUT changes any of sql/actions/enable/
  description; ``{"enable": false}`` disables), ``GET /api/v5/rules/{id}/metrics``,
  ``PUT /api/v5/rules/{id}/metrics/reset``
- ``POST /api/v5/rule_test`` ``{"sql": ..., "context": {...}}``: the output for one
  sample event (a list for FOREACH); 412 ``SQL_NOT_MATCH`` when nothing comes out
- ``GET /api/v5/webhooks``: each webhook's counters and queue
- ``GET /api/v5/connectors``: each sink's health (``status``), counters and buffer

Bad SQL, an unknown function or bad action args answer 400 with the same one-line
message ``gatewayd --check`` prints; the running rules are unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.admin.errors import ApiError, bad_request, conflict, not_found
from gateway.rules.parser import parse

if TYPE_CHECKING:
    from gateway.admin.host import AdminView
    from gateway.rules.service import RulesService

__all__ = ["ROUTES", "register"]

API = "/api/v5"

ROUTES: list[tuple[str, str, str]] = [
    ("GET", f"{API}/rules", "list_rules"),
    ("POST", f"{API}/rules", "create_rule"),
    ("GET", f"{API}/rules/{{id}}", "get_rule"),
    ("PUT", f"{API}/rules/{{id}}", "update_rule"),
    ("DELETE", f"{API}/rules/{{id}}", "delete_rule"),
    ("GET", f"{API}/rules/{{id}}/metrics", "rule_metrics"),
    ("PUT", f"{API}/rules/{{id}}/metrics/reset", "reset_metrics"),
    ("POST", f"{API}/rule_test", "rule_test"),
    ("GET", f"{API}/webhooks", "webhooks"),
    ("GET", f"{API}/connectors", "connectors"),
]


class _Handlers:
    def __init__(self, admin: AdminView) -> None:
        self.admin = admin

    def _service(self) -> RulesService:
        service: RulesService | None = getattr(self.admin.gateway, "rules", None)
        if service is None:
            raise ApiError(501, "NOT_CONFIGURED", "the rule engine is not running")
        return service

    async def _body(self, request: web.Request) -> dict[str, Any]:
        from gateway.admin.requests import read_json

        return await read_json(request)

    async def list_rules(self, request: web.Request) -> web.Response:
        from gateway.admin.requests import page

        return page(request, self._service().views())

    async def create_rule(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        try:
            view = self._service().create(body)
        except KeyError as exc:
            raise conflict(f"rule {exc.args[0]!r} exists") from None
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        return web.json_response(view, status=201)

    def _id(self, request: web.Request) -> str:
        return request.match_info["id"]

    async def get_rule(self, request: web.Request) -> web.Response:
        view = self._service().get(self._id(request))
        if view is None:
            raise not_found(f"no rule {self._id(request)!r}")
        return web.json_response(view)

    async def update_rule(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        try:
            view = self._service().update(self._id(request), body)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        if view is None:
            raise not_found(f"no rule {self._id(request)!r}")
        return web.json_response(view)

    async def delete_rule(self, request: web.Request) -> web.Response:
        if not self._service().delete(self._id(request)):
            raise not_found(f"no rule {self._id(request)!r}")
        return web.Response(status=204)

    async def rule_metrics(self, request: web.Request) -> web.Response:
        view = self._service().get(self._id(request))
        if view is None:
            raise not_found(f"no rule {self._id(request)!r}")
        return web.json_response({k: view[k] for k in (
            "id", "metrics", "node_metrics", "action_metrics", "last_error")})

    async def reset_metrics(self, request: web.Request) -> web.Response:
        if not self._service().reset_metrics(self._id(request)):
            raise not_found(f"no rule {self._id(request)!r}")
        return web.Response(status=204)

    async def rule_test(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        sql, context = body.get("sql"), body.get("context") or {}
        if not isinstance(sql, str):
            raise bad_request("sql: missing")
        if not isinstance(context, dict):
            raise bad_request("context: expected an object")
        try:
            outputs = self._service().engine.test(sql, context)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        except Exception as exc:
            raise bad_request(f"the rule failed on this context: {type(exc).__name__}: {exc}"
                              ) from None
        if not outputs:
            raise ApiError(412, "SQL_NOT_MATCH", "the SQL gave no output for this context")
        # FOREACH answers the list, SELECT its one map
        kind = parse(sql).kind
        return web.json_response(outputs if kind == "foreach" else outputs[0], dumps=_dumps)

    async def webhooks(self, request: web.Request) -> web.Response:
        return web.json_response({"data": self._service().webhooks_view()})

    async def connectors(self, request: web.Request) -> web.Response:
        return web.json_response({"data": self._service().connectors_view()})


def _dumps(data: Any) -> str:
    from gateway.rules.functions import to_json

    return to_json(data)


def register(app: web.Application, admin: AdminView) -> None:
    """Add the routes to the management API's application (before it starts)."""
    h = _Handlers(admin)
    for method, path, name in ROUTES:
        app.router.add_route(method, path, getattr(h, name))
