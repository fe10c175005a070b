"""The dashboard: a web console served by the management API's aiohttp app.

``/dashboard/`` is one page (``static/index.html``, ``app.js``, ``app.css``: plain JS and
CSS written here, shipped as package data, nothing fetched from elsewhere) that reads
and changes the node through the same ``/api/v5`` routes ``gatewayctl`` uses. What this
module adds is who may do it:

- ``/dashboard/api/setup`` makes the first administrator with the one-time setup token
  (:class:`~gateway.admin.sessions.SetupToken`; logged at start while there is no
  administrator, reissued by ``POST /api/v5/dashboard/setup_token``, which only the API
  token may call: ``gatewayctl admin setup``);
- ``/dashboard/api/login`` checks a password (scrypt, off the loop), rate limited per
  address and per user name, and sets the session cookie (``HttpOnly``,
  ``SameSite=Strict``, ``Secure`` over HTTPS); ``/dashboard/api/session`` tells the page
  who it is and its CSRF token;
- :meth:`Dashboard.guard` (called by the API's auth middleware) lets an ``/api/v5``
  request through with the API token, or with a live session cookie: a ``viewer`` only
  reads (GET), and a request that changes something must carry the session's
  ``X-CSRF-Token`` and, when the browser sends one, an ``Origin`` of this host;
- every change (any method but GET/HEAD, by token or by session) is one line of the
  ``gateway.audit`` log: who, role, method, path, status, peer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.admin.dashboard.history import COUNTERS, History
from gateway.admin.errors import ApiError, bad_request, not_found
from gateway.admin.host import AdminView
from gateway.admin.requests import _json, error_response, read_json
from gateway.admin.sessions import (
    AccountError,
    Accounts,
    LoginLimiter,
    Session,
    Sessions,
    SetupToken,
    check_new_password,
    check_password,
    hash_password,
)

log = logging.getLogger("gateway.admin")
audit_log = logging.getLogger("gateway.audit")

STATIC = Path(__file__).parent / "static"
COOKIE = "gw_session"
SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
PREFIX = "/dashboard"
# a valid-looking hash to compare against for unknown users (same time as a real check)
_DUMMY_HASH = hash_password("not a password", salt=b"0" * 16)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Dashboard:
    def __init__(self, admin: AdminView, now: Callable[[], float] = time.monotonic) -> None:
        self.admin = admin
        conf = admin.config.dashboard
        self.accounts = Accounts.in_dir(admin.gateway.shared_dir)
        self.setup_token = SetupToken(now, conf.setup_token_ttl)
        self.sessions = Sessions(now, conf.session_idle, conf.session_max)
        self.limiter = LoginLimiter(now, conf.login_attempts, conf.login_window)
        self.history = History(conf.sample_interval, self._counters)
        self.secure = False  # set when the API serves HTTPS

    # -- wiring ------------------------------------------------------------------------

    def register(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/", self.root)
        r.add_get(PREFIX, self.root)
        r.add_get(f"{PREFIX}/", self.index)
        r.add_static(f"{PREFIX}/static/", STATIC, append_version=False)
        r.add_get(f"{PREFIX}/api/session", self.session_info)
        r.add_post(f"{PREFIX}/api/setup", self.setup)
        r.add_post(f"{PREFIX}/api/login", self.login)
        r.add_post(f"{PREFIX}/api/logout", self.logout)
        r.add_get(f"{PREFIX}/api/history", self.history_view)
        r.add_get(f"{PREFIX}/api/accounts", self.accounts_list)
        r.add_post(f"{PREFIX}/api/accounts", self.accounts_add)
        r.add_delete(f"{PREFIX}/api/accounts/{{username}}", self.accounts_delete)
        r.add_post("/api/v5/dashboard/setup_token", self.issue_setup_token)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)

    async def _on_startup(self, app: web.Application) -> None:
        self.history.start()
        if not self.accounts.has_administrator():
            token = self.setup_token.issue()
            api = self.admin.config.api
            host = "127.0.0.1" if api.host in ("0.0.0.0", "::", "") else api.host
            scheme = "https" if self.secure else "http"
            log.warning(
                "no dashboard administrator yet: open %s://%s:%d%s/#/setup/%s (one-time "
                "setup link; `gatewayctl admin setup` prints a new one)",
                scheme, host, api.port, PREFIX, token,
            )

    async def _on_cleanup(self, app: web.Application) -> None:
        self.history.stop()

    def _counters(self) -> dict[str, int]:
        node = self.admin.gateway.node
        if node is None:
            return {"connections": 0, **dict.fromkeys(COUNTERS, 0)}
        return {"connections": node.connections,
                **{k: node.metrics.get(v) for k, v in COUNTERS.items()}}

    # -- the API's gate ----------------------------------------------------------------

    def own(self, path: str) -> bool:
        """Paths the dashboard guards itself (the page, its assets, login)."""
        return path == "/" or path == PREFIX or path.startswith(PREFIX + "/")

    def session_of(self, request: web.Request) -> Session | None:
        return self.sessions.get(request.cookies.get(COOKIE))

    async def guard(self, request: web.Request, handler: Handler,
                    bearer: bool) -> web.StreamResponse:
        """Authorize one ``/api/v5`` request (see the module docstring) and audit it."""
        if bearer:
            request["actor"] = ("api-token", "administrator")
        else:
            session = self.session_of(request)
            if session is None:
                return error_response(401, "UNAUTHORIZED", "missing or wrong API token",
                                      **{"WWW-Authenticate": 'Bearer realm="gatewayd"'})
            refusal = self._check_change(request, session)
            if refusal is not None:
                return refusal
            request["actor"] = (session.username, session.role)
        if request.method in SAFE:
            return await handler(request)
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except ApiError as exc:
            status = exc.status
            raise
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            self.audit(request, status)

    def _check_change(self, request: web.Request, session: Session) -> web.Response | None:
        if request.method in SAFE:
            return None
        if session.role != "administrator":
            return error_response(403, "FORBIDDEN", "the viewer role can only read")
        if request.headers.get("X-CSRF-Token") != session.csrf:
            return error_response(403, "CSRF", "missing or wrong X-CSRF-Token")
        origin = request.headers.get("Origin")
        if origin is not None and origin.split("://", 1)[-1] != request.host:
            return error_response(403, "CSRF", f"cross-origin request from {origin}")
        return None

    def audit(self, request: web.Request, status: int, what: str = "") -> None:
        user, role = request.get("actor", ("-", "-"))
        audit_log.info("audit user=%s role=%s %s %s -> %d from %s%s", user, role,
                       request.method, request.path_qs, status, request.remote,
                       f" ({what})" if what else "")

    # -- the page ----------------------------------------------------------------------

    async def root(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(f"{PREFIX}/")

    async def index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html", headers={
            "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                       "frame-ancestors 'none'; form-action 'self'",
            "X-Frame-Options": "DENY",
            "Referrer-Policy": "no-referrer",
        })

    # -- login -------------------------------------------------------------------------

    def _origin_ok(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        return origin is None or origin.split("://", 1)[-1] == request.host

    def _require_json_post(self, request: web.Request) -> None:
        # a cross-site form cannot send application/json without a CORS preflight
        if request.content_type != "application/json" or not self._origin_ok(request):
            raise ApiError(403, "CSRF", "expected a same-origin application/json request")

    def _start_session(self, username: str, role: Any) -> web.Response:
        session = self.sessions.create(username, role)
        response = _json({"authenticated": True, "username": username, "role": role,
                          "csrf": session.csrf, "node": self.admin.node_name,
                          "version": self.admin.version})
        response.set_cookie(COOKIE, session.id, httponly=True, samesite="Strict",
                            secure=self.secure, path="/")
        return response

    async def session_info(self, request: web.Request) -> web.Response:
        session = self.session_of(request)
        setup = not self.accounts.has_administrator()
        if session is None:
            return _json({"authenticated": False, "setup_required": setup}, status=401)
        return _json({"authenticated": True, "username": session.username,
                      "role": session.role, "csrf": session.csrf, "setup_required": setup,
                      "node": self.admin.node_name, "version": self.admin.version})

    async def setup(self, request: web.Request) -> web.Response:
        self._require_json_post(request)
        body = await read_json(request)
        peer = request.remote or "?"
        wait = self.limiter.retry_after(f"setup:{peer}")
        if wait > 0:
            return _too_many(wait)
        if self.accounts.has_administrator():
            raise ApiError(409, "CONFLICT", "an administrator exists already: log in")
        try:
            password = check_new_password(body.get("password"))
        except AccountError as exc:
            raise bad_request(str(exc)) from None
        if not self.setup_token.consume(body.get("token")):
            self.limiter.failed(f"setup:{peer}")
            request["actor"] = ("-", "-")
            self.audit(request, 403, "bad setup token")
            raise ApiError(403, "FORBIDDEN", "the setup token is wrong, used or expired")
        digest = await asyncio.get_running_loop().run_in_executor(None, hash_password, password)
        username = body.get("username") or "admin"
        try:
            self.accounts.add(username, digest, "administrator")
        except AccountError as exc:
            raise bad_request(str(exc)) from None
        request["actor"] = (username, "administrator")
        self.audit(request, 200, "first administrator created")
        return self._start_session(username, "administrator")

    async def login(self, request: web.Request) -> web.Response:
        self._require_json_post(request)
        body = await read_json(request)
        username, password = body.get("username"), body.get("password")
        if not isinstance(username, str) or not isinstance(password, str):
            raise bad_request("give username and password")
        keys = (f"ip:{request.remote}", f"user:{username}")
        wait = self.limiter.retry_after(*keys)
        if wait > 0:
            request["actor"] = (username, "-")
            self.audit(request, 429, "login refused: too many attempts")
            return _too_many(wait)
        account = self.accounts.get(username)
        stored = account.password_hash if account is not None else _DUMMY_HASH
        ok = await asyncio.get_running_loop().run_in_executor(
            None, check_password, password, stored)
        request["actor"] = (username, account.role if account is not None else "-")
        if not ok or account is None:
            self.limiter.failed(*keys)
            self.audit(request, 401, "login failed")
            raise ApiError(401, "UNAUTHORIZED", "wrong user name or password")
        self.limiter.succeeded(*keys)
        self.audit(request, 200, "login")
        return self._start_session(account.username, account.role)

    async def logout(self, request: web.Request) -> web.Response:
        session = self.session_of(request)
        if session is not None:
            if request.headers.get("X-CSRF-Token") != session.csrf:
                raise ApiError(403, "CSRF", "missing or wrong X-CSRF-Token")
            self.sessions.end(session.id)
        response = web.Response(status=204)
        response.del_cookie(COOKIE, path="/")
        return response

    # -- data the API has not got -----------------------------------------------------

    def _need(self, request: web.Request, *, admin: bool = False) -> Session:
        session = self.session_of(request)
        if session is None:
            raise ApiError(401, "UNAUTHORIZED", "log in first")
        if admin:
            refusal = self._check_change(request, session)
            if refusal is not None:
                raise ApiError(refusal.status, "FORBIDDEN" if refusal.status == 403 and
                               session.role != "administrator" else "CSRF",
                               "administrators only, with the session's X-CSRF-Token")
        request["actor"] = (session.username, session.role)
        return session

    async def history_view(self, request: web.Request) -> web.Response:
        self._need(request)
        return _json(self.history.view())

    async def accounts_list(self, request: web.Request) -> web.Response:
        self._need(request)
        return _json({"data": self.accounts.list()})

    async def accounts_add(self, request: web.Request) -> web.Response:
        self._need(request, admin=True)
        body = await read_json(request)
        try:
            password = check_new_password(body.get("password"))
            digest = await asyncio.get_running_loop().run_in_executor(
                None, hash_password, password)
            account = self.accounts.add(body.get("username"), digest,
                                        body.get("role", "viewer"))
        except AccountError as exc:
            raise bad_request(str(exc)) from None
        self.sessions.end_user(account.username)  # a new password ends the old sessions
        self.audit(request, 201, f"account {account.username} ({account.role}) set")
        return _json({"username": account.username, "role": account.role}, status=201)

    async def accounts_delete(self, request: web.Request) -> web.Response:
        self._need(request, admin=True)
        name = request.match_info["username"]
        try:
            found = self.accounts.delete(name)
        except AccountError as exc:
            raise ApiError(409, "CONFLICT", str(exc)) from None
        if not found:
            raise not_found(f"no dashboard user {name!r}")
        self.sessions.end_user(name)
        self.audit(request, 204, f"account {name} deleted")
        return web.Response(status=204)

    async def issue_setup_token(self, request: web.Request) -> web.Response:
        """``gatewayctl admin setup``: the API token only (not a session)."""
        if request.get("actor", ("",))[0] != "api-token":
            raise ApiError(403, "FORBIDDEN", "only the API token may issue a setup token")
        if self.accounts.has_administrator():
            raise ApiError(409, "CONFLICT", "an administrator exists already")
        token = self.setup_token.issue()
        return _json({"token": token, "path": f"{PREFIX}/#/setup/{token}",
                      "expires_in": self.setup_token.ttl}, status=201)


def _too_many(wait: float) -> web.Response:
    seconds = max(1, int(wait + 0.999))
    return error_response(429, "TOO_MANY_REQUESTS",
                          f"too many failed logins: try again in {seconds} s",
                          **{"Retry-After": str(seconds)})


__all__ = ["Dashboard"]
