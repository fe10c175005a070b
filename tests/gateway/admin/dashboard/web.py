"""A cookie-keeping HTTP client for the dashboard's API tests (what a browser sends)."""

from __future__ import annotations

import http.client
import json
import re
from dataclasses import dataclass, field
from typing import Any

from tests.gateway.admin.gatewayd import Gatewayd

SETUP_LINK = re.compile(r"/dashboard/#/setup/([A-Za-z0-9_-]+)")


def setup_tokens(text: str) -> list[str]:
    return SETUP_LINK.findall(text)


@dataclass
class WebSession:
    gw: Gatewayd
    cookies: dict[str, str] = field(default_factory=dict)
    csrf: str | None = None

    def request(self, method: str, path: str, body: Any = None, *, csrf: bool = True,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
        h = dict(headers or {})
        if self.cookies:
            h["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if csrf and self.csrf and method != "GET":
            h["X-CSRF-Token"] = self.csrf
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        conn = http.client.HTTPConnection("127.0.0.1", self.gw.api_port, timeout=30)
        try:
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            raw = r.read()
            for name, value in r.getheaders():
                if name.lower() == "set-cookie":
                    key, _, rest = value.partition("=")
                    self.cookies[key] = rest.split(";", 1)[0]
            got = {k.lower(): v for k, v in r.getheaders()}
            payload = json.loads(raw) if raw and "json" in got.get("content-type", "") else raw
            return r.status, got, payload
        finally:
            conn.close()

    def login(self, username: str, password: str) -> int:
        status, _, body = self.request("POST", "/dashboard/api/login",
                                       {"username": username, "password": password})
        if status == 200:
            self.csrf = body["csrf"]
        return status

    def setup(self, token: str, username: str, password: str) -> tuple[int, Any]:
        status, _, body = self.request("POST", "/dashboard/api/setup",
                                       {"token": token, "username": username,
                                        "password": password})
        if status == 200:
            self.csrf = body["csrf"]
        return status, body
