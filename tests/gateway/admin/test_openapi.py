"""The OpenAPI document: valid, one entry per route, and true to real responses."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gateway.admin.api import ROUTES
from gateway.admin.ext_api import ROUTES as EXT
from gateway.admin.openapi_doc import openapi_document
from gateway.admin.rules_api import ROUTES as RULES
from tests.gateway.admin.gatewayd import Client, Gatewayd, clients, q

jsonschema = pytest.importorskip("jsonschema")


def _documented() -> set[tuple[str, str]]:
    doc = openapi_document("0")
    return {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}


def _routes() -> set[tuple[str, str]]:
    return {(m, re.sub(r"\{(\w+):[^}]*\}", r"{\1}", p)) for m, p, _ in [*ROUTES, *RULES, *EXT]}


def test_every_route_is_documented_and_nothing_else() -> None:
    assert _routes() == _documented()


def test_the_document_is_valid_openapi() -> None:
    validator = pytest.importorskip("openapi_spec_validator")
    validator.validate(openapi_document("0.1.0"))


def _validator(status_schema: dict[str, Any]) -> Any:
    doc = openapi_document("0")
    schema = {**status_schema, "components": doc["components"]}
    return jsonschema.Draft202012Validator(schema)


def _check(gw: Gatewayd, method: str, doc_path: str, url: str, status: int = 200) -> Any:
    got, _, body = gw.http(method, url)
    assert got == status, (url, got, body)
    op = openapi_document("0")["paths"][doc_path][method.lower()]
    content = op["responses"][str(status)].get("content", {})
    if "application/json" not in content:
        return None
    data = json.loads(body)
    errors = list(_validator(content["application/json"]["schema"]).iter_errors(data))
    assert not errors, (url, [e.message for e in errors[:5]])
    return data


def test_responses_match_the_document(gatewayd: Gatewayd) -> None:
    a = "/api/v5"
    with clients() as made:
        c = Client(gatewayd, "oas-client", version=5, username="oas").subscribe("oas/#", qos=1)
        made.append(c)
        c.publish("oas/retained", b"r", retain=True, qos=1)
        c.wait_for("oas/retained")
        for doc_path, url in [
            ("/status", "/status"),
            (f"{a}/status", f"{a}/status"),
            (f"{a}/nodes", f"{a}/nodes"),
            (f"{a}/nodes/{{node}}", f"{a}/nodes/{q(gatewayd.node_name)}"),
            (f"{a}/stats", f"{a}/stats"),
            (f"{a}/metrics", f"{a}/metrics"),
            (f"{a}/clients", f"{a}/clients"),
            (f"{a}/clients/{{clientid}}", f"{a}/clients/oas-client"),
            (f"{a}/clients/{{clientid}}/subscriptions", f"{a}/clients/oas-client/subscriptions"),
            (f"{a}/subscriptions", f"{a}/subscriptions"),
            (f"{a}/routes", f"{a}/routes"),
            (f"{a}/routes/{{topic}}", f"{a}/routes/{q('oas/#')}"),
            (f"{a}/retainer/messages", f"{a}/retainer/messages"),
            (f"{a}/retainer/messages/{{topic}}", f"{a}/retainer/messages/{q('oas/retained')}"),
            (f"{a}/banned", f"{a}/banned"),
            (f"{a}/users", f"{a}/users"),
            (f"{a}/listeners", f"{a}/listeners"),
            (f"{a}/gateways", f"{a}/gateways"),
            (f"{a}/cluster", f"{a}/cluster"),
            (f"{a}/bridges", f"{a}/bridges"),
            (f"{a}/alarms", f"{a}/alarms"),
        ]:
            _check(gatewayd, "GET", doc_path, url)
        _check(gatewayd, "GET", f"{a}/clients/{{clientid}}", f"{a}/clients/nobody", 404)
        _check(gatewayd, "DELETE", f"{a}/clients/{{clientid}}", f"{a}/clients/oas-client")
    served = json.loads(gatewayd.http("GET", f"{a}/openapi.json")[2])
    assert served["openapi"] == "3.1.0" and served["paths"].keys() == openapi_document(
        "0")["paths"].keys()
