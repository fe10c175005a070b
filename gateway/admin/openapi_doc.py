"""The whole OpenAPI 3.1 document of the management API: the core routes
(:mod:`gateway.admin.openapi`) and the rule engine's (:mod:`gateway.admin.rules_openapi`),
put together here so that neither part imports the other."""

from __future__ import annotations

from typing import Any

from gateway.admin import ext_openapi as ext
from gateway.admin import rules_openapi as rules
from gateway.admin.openapi import SCHEMAS, paths

__all__ = ["openapi_document"]


def openapi_document(version: str, *, metrics_public: bool = True) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "gatewayd management API",
            "version": version,
            "description": "Status and control of an edge gateway node. Every route but "
            "/status (and the Prometheus routes unless [api] metrics_auth) needs "
            "`Authorization: Bearer <token>`; the token is [api] token or the file "
            "{node.data_dir}/api.token.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": {**paths(metrics_public), **rules.PATHS, **ext.PATHS},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {**SCHEMAS, **rules.SCHEMAS, **ext.SCHEMAS},
        },
    }
