"""Request and response helpers shared by the management API's route modules
(:mod:`gateway.admin.api`, :mod:`gateway.admin.rules_api`): JSON answers, query
parameters checked with one-line 400s, pagination, JSON bodies."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from gateway.admin import introspect
from gateway.admin.errors import bad_request

MAX_LIMIT = 10_000
DEFAULT_LIMIT = 100


def error_response(status: int, code: str, message: str, **headers: str) -> web.Response:
    return web.json_response({"code": code, "message": message}, status=status,
                             headers=headers or None)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=_dumps)


def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def query_int(request: web.Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"{name} must be an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise bad_request(f"{name} must be in {lo}..{hi}, got {value}")
    return value


def query_bool(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise bad_request(f"{name} must be true or false, got {raw!r}")


def query_choice(request: web.Request, name: str, choices: tuple[str, ...]) -> str | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    if raw not in choices:
        raise bad_request(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


def page_body(request: web.Request, items: list[Any]) -> dict[str, Any]:
    p = query_int(request, "page", 1, 1, 1 << 31)
    limit = query_int(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    assert p is not None and limit is not None
    return introspect.paginate(items, p, limit)


def page(request: web.Request, items: list[Any]) -> web.Response:
    return _json(page_body(request, items))


async def read_json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise bad_request("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body
