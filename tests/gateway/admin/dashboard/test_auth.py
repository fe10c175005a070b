"""Who may use the dashboard, against a real gatewayd: no default credentials, the
one-time setup token, sessions reaching /api/v5, CSRF, roles, audit lines, the login
rate limit. (Expiry is tested on a virtual clock: tests/gateway/admin/test_sessions.py.)
The tests run in file order and share one gatewayd: setup first, the lockout last."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.gateway.admin.dashboard.web import WebSession, setup_tokens
from tests.gateway.admin.gatewayd import Client, Gatewayd, clean_environ, clients

pytestmark = pytest.mark.dashboard
API = "/api/v5"
ADMIN_PW = "first-admin-pw"


def gatewayctl(gw: Gatewayd, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli.gatewayctl", *args],
                          env={**clean_environ(), **gw.env}, capture_output=True, text=True,
                          timeout=60, check=False)


def test_no_default_credentials_and_the_setup_token_works_once(gatewayd: Gatewayd) -> None:
    web = WebSession(gatewayd)
    status, _, body = web.request("GET", "/dashboard/api/session")
    assert status == 401 and body["setup_required"] is True
    for user, pw in (("admin", "admin"), ("admin", "public")):  # (3 would lock out)
        assert web.login(user, pw) == 401
    logged = setup_tokens(gatewayd.log())
    assert len(logged) == 1  # gatewayd's one-time link
    ctl = gatewayctl(gatewayd, "admin", "setup")
    assert ctl.returncode == 0, ctl.stderr
    printed = setup_tokens(ctl.stdout)
    assert len(printed) == 1 and ctl.stdout.startswith(f"http://127.0.0.1:{gatewayd.api_port}/")
    # the new link replaced the logged one
    assert web.setup(logged[0], "root", ADMIN_PW)[0] == 403
    assert web.setup(printed[0], "root", "short")[0] == 400  # a password of 8 or more
    status, body = web.setup(printed[0], "root", ADMIN_PW)
    assert status == 200 and body["role"] == "administrator"
    other = WebSession(gatewayd)
    assert other.setup(printed[0], "mallory", "mallory-pw")[0] == 409  # spent, admin exists
    assert gatewayctl(gatewayd, "admin", "setup").returncode == 1
    assert "audit user=root role=administrator POST /dashboard/api/setup -> 200" in gatewayd.log()
    # the cookie is HttpOnly and SameSite=Strict
    status, headers, _ = WebSession(gatewayd).request(
        "POST", "/dashboard/api/login", {"username": "root", "password": ADMIN_PW})
    assert status == 200
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie


def test_a_session_reaches_the_api_and_changes_need_the_csrf_token(gatewayd: Gatewayd) -> None:
    web = WebSession(gatewayd)
    assert web.login("root", ADMIN_PW) == 200
    assert web.request("GET", f"{API}/status")[0] == 200
    assert WebSession(gatewayd).request("GET", f"{API}/status")[0] == 401  # no cookie
    with clients() as made:
        made.append(Client(gatewayd, "dash-kick-me"))
        path = f"{API}/clients/dash-kick-me"
        status, _, body = web.request("DELETE", path, csrf=False)
        assert status == 403 and body["code"] == "CSRF"
        status, _, body = web.request("DELETE", path, headers={"X-CSRF-Token": "forged"},
                                      csrf=False)
        assert status == 403 and body["code"] == "CSRF"
        status, _, body = web.request("DELETE", path,
                                      headers={"Origin": "http://evil.example"})
        assert status == 403 and body["code"] == "CSRF"
        assert gatewayd.get(f"{API}/clients/dash-kick-me")["connected"] is True
        status, _, body = web.request("DELETE", path)
        assert status == 200 and body["result"] == "kicked"
    log = gatewayd.log()
    assert "audit user=root role=administrator DELETE /api/v5/clients/dash-kick-me -> 200" in log
    # a login form posted cross-site (not JSON) is refused
    status, _, _ = WebSession(gatewayd).request(
        "POST", "/dashboard/api/login", None,
        headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 403
    # the API token still works, its changes audited too; a session cannot mint setup tokens
    status, _, _ = gatewayd.http("DELETE", f"{API}/retainer/messages/nothing-here")
    assert status == 404
    assert "audit user=api-token role=administrator DELETE /api/v5/retainer/messages/" \
        "nothing-here -> 404" in gatewayd.log()
    assert web.request("POST", f"{API}/dashboard/setup_token")[0] == 403
    # logout ends the session
    assert web.request("POST", "/dashboard/api/logout")[0] == 204
    assert web.request("GET", f"{API}/status")[0] == 401


def test_a_viewer_reads_but_cannot_kick_or_add_accounts(gatewayd: Gatewayd) -> None:
    root = WebSession(gatewayd)
    assert root.login("root", ADMIN_PW) == 200
    status, _, _ = root.request("POST", "/dashboard/api/accounts",
                                {"username": "watcher", "password": "watcher-pw",
                                 "role": "viewer"})
    assert status == 201
    viewer = WebSession(gatewayd)
    assert viewer.login("watcher", "watcher-pw") == 200
    with clients() as made:
        made.append(Client(gatewayd, "dash-viewer-target"))
        assert viewer.request("GET", f"{API}/clients/dash-viewer-target")[0] == 200
        status, _, body = viewer.request("DELETE", f"{API}/clients/dash-viewer-target")
        assert status == 403 and body["code"] == "FORBIDDEN"
        assert gatewayd.get(f"{API}/clients/dash-viewer-target")["connected"] is True
    status, _, _ = viewer.request("POST", "/dashboard/api/accounts",
                                  {"username": "x", "password": "xxxxxxxxx",
                                   "role": "administrator"})
    assert status == 403
    assert viewer.request("GET", "/dashboard/api/accounts")[2]["data"] == [
        {"username": "root", "role": "administrator"},
        {"username": "watcher", "role": "viewer"}]
    # deleting the account ends its sessions
    assert root.request("DELETE", "/dashboard/api/accounts/watcher")[0] == 204
    assert viewer.request("GET", f"{API}/status")[0] == 401


def test_failed_logins_are_rate_limited(gatewayd: Gatewayd) -> None:
    web = WebSession(gatewayd)
    for _ in range(3):
        assert web.login("root", "wrong-password") == 401
    status, headers, body = web.request("POST", "/dashboard/api/login",
                                        {"username": "root", "password": ADMIN_PW})
    assert status == 429 and body["code"] == "TOO_MANY_REQUESTS"
    assert 1 <= int(headers["retry-after"]) <= 300
    assert "login refused: too many attempts" in gatewayd.log()
