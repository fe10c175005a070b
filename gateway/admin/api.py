"""The HTTP management API (aiohttp, on the gateway's own event loop).

Routes are listed in :data:`ROUTES` and documented one for one in
:mod:`gateway.admin.openapi` (a test keeps the two equal). JSON everywhere except
``/metrics`` (Prometheus text) and ``/api/v5/trace`` (server-sent events).

Rules:
- Every route needs ``Authorization: Bearer <token>`` except ``/status`` (a health
  check) and, unless ``[api] metrics_auth``, ``/metrics`` and
  ``/api/v5/prometheus/stats``. A missing or wrong token is 401 with
  ``WWW-Authenticate: Bearer``.
- Errors are ``{"code": "NOT_FOUND", "message": "..."}`` with the matching status
  (400 BAD_REQUEST, 401 UNAUTHORIZED, 404 NOT_FOUND, 405 METHOD_NOT_ALLOWED,
  409 CONFLICT, 501 NOT_CONFIGURED, 500 INTERNAL_ERROR); a handler's bug is logged
  with its traceback and answered 500, never a dropped connection.
- Lists are paginated: ``?page=1&limit=100`` (limit 1..10000) and answered as
  ``{"data": [...], "meta": {"page", "limit", "count", "hasnext"}}``.
- Topic names and filters inside a path are percent-encoded by the client
  (``/api/v5/retainer/messages/a%2Fb``); unencoded slashes work too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.admin import ext_api, introspect, rules_api
from gateway.admin.dashboard import Dashboard
from gateway.admin.errors import ApiError, bad_request, conflict, not_found
from gateway.admin.host import AdminView
from gateway.admin.openapi_doc import openapi_document
from gateway.admin.prometheus import CONTENT_TYPE_LATEST, exposition
from gateway.admin.registry import format_address
from gateway.admin.requests import (
    _dumps,
    _json,
    error_response,
    page,
    page_body,
    query_bool,
    query_choice,
    query_int,
    read_json,
)
from gateway.admin.tokens import check_bearer
from gateway.core.topic_index import is_valid_filter

log = logging.getLogger("gateway.admin")

API = "/api/v5"
TRACE_KEEPALIVE = 15.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ManagementApi:
    """The aiohttp application over one :class:`~gateway.admin.admin.Admin`."""

    def __init__(self, admin: AdminView, token: str) -> None:
        self.admin = admin
        self.token = token
        self.public = {"/status"}
        if not admin.config.api.metrics_auth:
            self.public |= {"/metrics", f"{API}/prometheus/stats"}
        self.app = web.Application(middlewares=[self._errors, self._auth])
        for method, path, name in ROUTES:
            self.app.router.add_route(method, path, getattr(self, name))
        rules_api.register(self.app, admin)  # /api/v5/rules, rule_test, webhooks
        ext_api.register(self.app, admin)  # /api/v5/mqtt/{delayed,auto_subscribe,...}
        # /dashboard/ and its logins; sessions may then use /api/v5 (dashboard.guard)
        self.dashboard: Dashboard | None = None
        if admin.config.dashboard.enable:
            self.dashboard = Dashboard(admin)
            self.dashboard.register(self.app)
        self.runner: web.AppRunner | None = None
        self.addresses: list[str] = []
        self.tls: Any = None  # the ReloadableContext when the API speaks HTTPS
        self.stapling: Any = None  # OCSP stapling of the HTTPS certificate ([api.ocsp])

    # -- serving -----------------------------------------------------------------------

    async def start(self, host: str, port: int) -> None:
        ssl_context = None
        if self.admin.config.api.certfile is not None:  # HTTPS (checked by the loader)
            from gateway.config.loader import api_tls_listener
            from gateway.net.tls import ReloadableContext

            lst = api_tls_listener(self.admin.config)
            self.tls = ReloadableContext("api", lst)
            ssl_context = self.tls.server_context
            if lst.ocsp.enable_ocsp_stapling:  # as an ssl listener (gateway.security.stapling)
                from gateway.security.stapling import OcspStapling

                self.stapling = OcspStapling("api", lst, self.tls)
                self.stapling.start(asyncio.get_running_loop())
            if self.dashboard is not None:
                self.dashboard.secure = True  # Secure cookies, https:// setup link
        self.runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                                    shutdown_timeout=5.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, reuse_address=True,
                           ssl_context=ssl_context)
        await site.start()
        self.addresses = [format_address(a) for a in self.runner.addresses]

    async def stop(self) -> None:
        if self.stapling is not None:
            self.stapling.close()
            self.stapling = None
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    # -- middlewares -------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return error_response(exc.status, exc.code, exc.message)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(
                exc.status, exc.reason.upper().replace(" ", "_")
            )
            message = {404: f"no such resource: {request.path}",
                       405: f"{request.method} is not allowed on {request.path}"}.get(
                exc.status, exc.text or exc.reason)
            headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else {}
            return error_response(exc.status, code, message, **headers)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            log.exception("API %s %s failed", request.method, request.path)
            return error_response(500, "INTERNAL_ERROR", "internal error (see the node's log)")

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in self.public:
            return await handler(request)
        bearer = check_bearer(request.headers.get("Authorization"), self.token)
        if self.dashboard is not None:
            if self.dashboard.own(request.path):  # the page and its logins guard themselves
                return await handler(request)
            return await self.dashboard.guard(request, handler, bearer)  # token or session
        if not bearer:
            return error_response(401, "UNAUTHORIZED", "missing or wrong API token",
                                  **{"WWW-Authenticate": 'Bearer realm="gatewayd"'})
        return await handler(request)

    # -- node --------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        a = self.admin
        return _json({"node": a.node_name, "status": "running", "version": a.version})

    async def openapi(self, request: web.Request) -> web.Response:
        return _json(openapi_document(
            self.admin.version, metrics_public=not self.admin.config.api.metrics_auth
        ))

    async def status(self, request: web.Request) -> web.Response:
        return _json(self.admin.status())

    async def nodes(self, request: web.Request) -> web.Response:
        return _json([self.admin.node_view()])

    async def node(self, request: web.Request) -> web.Response:
        name = request.match_info["node"]
        if name != self.admin.node_name:
            raise not_found(f"no node {name!r} (this node is {self.admin.node_name!r})")
        return _json(self.admin.node_view())

    async def stats(self, request: web.Request) -> web.Response:
        return _json(self.admin.stats())

    async def metrics(self, request: web.Request) -> web.Response:
        return _json(self.admin.metrics())

    async def prometheus(self, request: web.Request) -> web.Response:
        body = exposition(self.admin.prometheus_registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- clients -----------------------------------------------------------------------

    async def clients(self, request: web.Request) -> web.Response:
        q = request.query
        sessions = introspect.filter_clients(
            self.admin.node,
            clientid=q.get("clientid") or None,
            username=q.get("username") or None,
            ip_address=q.get("ip_address") or None,
            conn_state=query_choice(request, "conn_state", ("connected", "disconnected")),
            proto_ver=query_int(request, "proto_ver", None, 3, 5),
            protocol=q.get("protocol") or None,
            listener=q.get("listener") or None,
            like_clientid=q.get("like_clientid") or None,
            like_username=q.get("like_username") or None,
        )
        node = self.admin.node
        body = page_body(request, sessions)  # the page first: views of 20, not of all
        body["data"] = [introspect.client_view(node, s) for s in body["data"]]
        return _json(body)

    def _session(self, request: web.Request) -> Any:
        cid = request.match_info["clientid"]
        session = self.admin.node.sessions.get(cid)
        if session is None:
            raise not_found(f"no client {cid!r}")
        return session

    async def client(self, request: web.Request) -> web.Response:
        return _json(introspect.client_view(self.admin.node, self._session(request)))

    async def kick(self, request: web.Request) -> web.Response:
        cid = request.match_info["clientid"]
        will = query_bool(request, "will", True)
        discard = query_bool(request, "discard", False)
        result = self.admin.kick(cid, will=will, discard=discard)
        if result is None:
            raise not_found(f"no client {cid!r}")
        if result == "offline":
            raise conflict(f"client {cid!r} is not connected (discard=true ends its session)")
        return _json({"clientid": cid, "result": result})

    async def client_subscriptions(self, request: web.Request) -> web.Response:
        session = self._session(request)
        subs = list(introspect.iter_subscriptions(self.admin.node, clientid=session.client_id))
        return _json(subs)

    async def subscriptions(self, request: web.Request) -> web.Response:
        q = request.query
        match = q.get("match_topic") or None
        if match is not None and ("+" in match or "#" in match):
            raise bad_request("match_topic must be a topic name, without wildcards")
        subs = list(
            introspect.iter_subscriptions(
                self.admin.node,
                clientid=q.get("clientid") or None,
                topic=q.get("topic") or None,
                qos=query_int(request, "qos", None, 0, 2),
                share_group=q.get("share_group") or None,
                match_topic=match,
            )
        )
        return page(request, subs)

    async def routes(self, request: web.Request) -> web.Response:
        topic = request.query.get("topic") or None
        return page(request, introspect.routes(self.admin.node, topic=topic))

    async def route(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        found = introspect.routes(self.admin.node, topic=topic)
        if not found:
            raise not_found(f"no route for {topic!r}")
        return _json(found)

    # -- retained messages -------------------------------------------------------------

    async def retained(self, request: web.Request) -> web.Response:
        topic = request.query.get("topic") or None
        if topic is not None and not is_valid_filter(topic):
            raise bad_request(f"topic {topic!r} is not a valid topic filter")
        return page(request, introspect.retained_messages(self.admin.node, topic=topic))

    async def retained_message(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        message = self.admin.node.retainer.get(topic)
        if message is None:
            raise not_found(f"no retained message on {topic!r}")
        return _json(introspect.retained_view(message, payload=True))

    async def retained_delete(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        if not self.admin.node.retainer.delete(topic):
            raise not_found(f"no retained message on {topic!r}")
        return web.Response(status=204)

    # -- banned, users -----------------------------------------------------------------

    async def banned(self, request: web.Request) -> web.Response:
        items, status = await self.admin.banned.list()
        return _json({**page_body(request, items), "status": status})

    async def banned_add(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        return _json(await self.admin.banned.add(body), status=201)

    async def banned_delete(self, request: web.Request) -> web.Response:
        await self.admin.banned.delete(request.match_info["as"], request.match_info["who"])
        return web.Response(status=204)

    async def users(self, request: web.Request) -> web.Response:
        items, status = await self.admin.users.list()
        return _json({**page_body(request, items), "status": status})

    async def user_add(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        return _json(await self.admin.users.add(body), status=201)

    async def user_delete(self, request: web.Request) -> web.Response:
        await self.admin.users.delete(request.match_info["user_id"])
        return web.Response(status=204)

    # -- listeners, front-ends, cluster, bridges, alarms -------------------------------

    async def listeners(self, request: web.Request) -> web.Response:
        return _json(self.admin.listeners_view())

    async def gateways(self, request: web.Request) -> web.Response:
        return _json(self.admin.gateways_view())

    async def cluster(self, request: web.Request) -> web.Response:
        return _json(self.admin.cluster_view())

    # cluster membership (gateway.cluster): join, leave, force-leave
    def _cluster(self) -> Any:
        cluster = self.admin.gateway.cluster
        if cluster is None:
            from gateway.admin.errors import not_configured

            raise not_configured("the cluster")
        return cluster

    async def cluster_join(self, request: web.Request) -> web.Response:
        cluster = self._cluster()
        body = await read_json(request)
        node = body.get("node")
        if not isinstance(node, str) or not node:
            raise bad_request('"node" must be "name@host:port" or "host:port"')
        try:
            joined = cluster.join(node)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        return _json({"joining": joined}, status=202)

    async def cluster_leave(self, request: web.Request) -> web.Response:
        told = await self._cluster().leave()
        return _json({"left": True, "told": told})

    async def cluster_forget(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        if not self._cluster().forget(node, "force-leave"):
            raise not_found(f"no member {node}")
        return web.Response(status=204)

    async def bridges(self, request: web.Request) -> web.Response:
        return _json(self.admin.bridges_view())

    async def alarms(self, request: web.Request) -> web.Response:
        activated = query_bool(request, "activated", True)
        alarms = self.admin.alarms.active() if activated else self.admin.alarms.history()
        return page(request, [a.as_dict() for a in alarms])

    # -- trace -------------------------------------------------------------------------

    async def trace(self, request: web.Request) -> web.StreamResponse:
        clientid = request.query.get("clientid") or None
        topic = request.query.get("topic") or None
        if (clientid is None) == (topic is None):
            raise bad_request("give exactly one of clientid or topic")
        if topic is not None and not is_valid_filter(topic):
            raise bad_request(f"topic {topic!r} is not a valid topic filter")
        hub = self.admin.trace_hub
        if hub is None:
            raise ApiError(503, "UNAVAILABLE", "the node is starting or stopping")
        trace = hub.start(clientid=clientid, topic=topic)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                     "X-Accel-Buffering": "no"}
        )
        try:
            await response.prepare(request)
            started = {"event": "trace.started", "trace_id": trace.id,
                       "subject": trace.subject, "node": self.admin.node_name,
                       "ts": self.admin.node.now()}
            await response.write(_sse(started))
            while True:
                try:
                    event = await asyncio.wait_for(trace.queue.get(), TRACE_KEEPALIVE)
                except TimeoutError:
                    await response.write(b": keepalive\n\n")
                    continue
                if event is None:
                    break
                await response.write(_sse(event))
            await response.write(_sse({"event": "trace.stopped", "trace_id": trace.id,
                                       "ts": self.admin.node.now()}))
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            hub.stop(trace)
        return response


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['event']}\ndata: {_dumps(event)}\n\n".encode()


# (method, path, handler name); openapi.py documents each one.
ROUTES: list[tuple[str, str, str]] = [
    ("GET", "/status", "health"),
    ("GET", "/metrics", "prometheus"),
    ("GET", f"{API}/openapi.json", "openapi"),
    ("GET", f"{API}/status", "status"),
    ("GET", f"{API}/nodes", "nodes"),
    ("GET", f"{API}/nodes/{{node}}", "node"),
    ("GET", f"{API}/stats", "stats"),
    ("GET", f"{API}/metrics", "metrics"),
    ("GET", f"{API}/prometheus/stats", "prometheus"),
    ("GET", f"{API}/clients", "clients"),
    ("GET", f"{API}/clients/{{clientid}}", "client"),
    ("DELETE", f"{API}/clients/{{clientid}}", "kick"),
    ("GET", f"{API}/clients/{{clientid}}/subscriptions", "client_subscriptions"),
    ("GET", f"{API}/subscriptions", "subscriptions"),
    ("GET", f"{API}/routes", "routes"),
    ("GET", f"{API}/routes/{{topic:.+}}", "route"),
    ("GET", f"{API}/retainer/messages", "retained"),
    ("GET", f"{API}/retainer/messages/{{topic:.+}}", "retained_message"),
    ("DELETE", f"{API}/retainer/messages/{{topic:.+}}", "retained_delete"),
    ("GET", f"{API}/banned", "banned"),
    ("POST", f"{API}/banned", "banned_add"),
    ("DELETE", f"{API}/banned/{{as}}/{{who:.+}}", "banned_delete"),
    ("GET", f"{API}/users", "users"),
    ("POST", f"{API}/users", "user_add"),
    ("DELETE", f"{API}/users/{{user_id}}", "user_delete"),
    ("GET", f"{API}/listeners", "listeners"),
    ("GET", f"{API}/gateways", "gateways"),
    ("GET", f"{API}/cluster", "cluster"),
    ("POST", f"{API}/cluster/join", "cluster_join"),
    ("POST", f"{API}/cluster/leave", "cluster_leave"),
    ("DELETE", f"{API}/cluster/nodes/{{node}}", "cluster_forget"),
    ("GET", f"{API}/bridges", "bridges"),
    ("GET", f"{API}/alarms", "alarms"),
    ("GET", f"{API}/trace", "trace"),
]
