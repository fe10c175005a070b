"""The rule engine's part of the management API's OpenAPI document (gateway.admin.rules_api).

:func:`gateway.admin.openapi_doc.openapi_document` merges :data:`PATHS` and :data:`SCHEMAS`
into the node's document; the admin tests check every route of
:data:`gateway.admin.rules_api.ROUTES` is documented and real answers validate.
"""

from __future__ import annotations

from typing import Any

from gateway.admin.openapi import (
    NULLABLE_STR,
    PAGING,
    _error,
    _ok,
    _op,
    _p,
    obj,
    page_of,
    ref,
)

__all__ = ["PATHS", "SCHEMAS"]

A = "/api/v5"
ID = _p("id", "The rule id.")
_COUNTS = {"type": "object", "additionalProperties": {"type": "integer"}}

SCHEMAS: dict[str, Any] = {
    "RuleAction": obj({"function": {"type": "string", "examples": ["republish",
                                                                   "webhook:alerts"]},
                       "args": {"type": "object"}}, required=["function"]),
    "Rule": obj({
        "id": {"type": "string"}, "name": {"type": "string"}, "sql": {"type": "string"},
        "actions": {"type": "array", "items": ref("RuleAction")},
        "enable": {"type": "boolean"}, "description": {"type": "string"},
        "created_at": {"type": "string"}, "from": {"type": "array", "items": {"type": "string"}},
        "origin": {"enum": ["config", "api"]}, "metrics": _COUNTS,
        "node_metrics": {"type": "array", "items": obj({"node": {"type": "string"},
                                                        "metrics": _COUNTS})},
        "action_metrics": {"type": "array", "items": obj(
            {"function": {"type": "string"}, "success": {"type": "integer"},
             "failed": {"type": "integer"}, "queue_depth": {"type": "integer"}},
            required=["function", "success", "failed"])},
        "last_error": NULLABLE_STR,
    }),
    "RulePage": page_of("Rule"),
    "NewRule": obj({
        "id": {"type": "string"}, "name": {"type": "string"}, "sql": {"type": "string"},
        "actions": {"type": "array", "items": {"oneOf": [ref("RuleAction"),
                                                          {"type": "string"}]}},
        "enable": {"type": "boolean"}, "description": {"type": "string"},
    }, required=["sql"]),
    "RuleChange": obj({
        "sql": {"type": "string"}, "actions": {"type": "array", "items": ref("RuleAction")},
        "enable": {"type": "boolean"}, "description": {"type": "string"},
    }, required=[]),
    "RuleMetrics": obj({
        "id": {"type": "string"}, "metrics": _COUNTS,
        "node_metrics": {"type": "array", "items": {"type": "object"}},
        "action_metrics": {"type": "array", "items": {"type": "object"}},
        "last_error": NULLABLE_STR,
    }),
    "RuleTest": obj({"sql": {"type": "string"}, "context": {"type": "object"}},
                    required=["sql"]),
    "Webhooks": obj({"data": {"type": "array", "items": obj({
        "name": {"type": "string"}, "url": {"type": "string"},
        "success": {"type": "integer"}, "failed": {"type": "integer"},
        "dropped": {"type": "integer"}, "last_error": NULLABLE_STR,
        "queue": _COUNTS,
    })}}),
    "Connectors": obj({"data": {"type": "array", "items": obj({
        "id": {"type": "string", "examples": ["postgresql:pg1"]},
        "type": {"enum": ["postgresql", "redis", "rabbitmq", "influxdb"]},
        "name": {"type": "string"}, "server": {"type": "string"},
        "status": {"enum": ["connected", "connecting", "disconnected"]},
        "success": {"type": "integer"}, "failed": {"type": "integer"},
        "dropped": {"type": "integer"}, "batches": {"type": "integer"},
        "connects": {"type": "integer"}, "last_error": NULLABLE_STR,
        "last_health_check": {"type": ["number", "null"]},
        "buffer": _COUNTS,
    })}}),
}

PATHS: dict[str, Any] = {
    f"{A}/rules": {
        "get": _op("Rules, with their metrics", "rules", {"200": _ok(ref("RulePage"))},
                   params=PAGING, op_id="rules"),
        "post": _op("Create a rule (kept across restarts)", "rules",
                    {"201": _ok(ref("Rule"), "Created"), "409": _error("The id exists")},
                    body="NewRule", op_id="rule_create"),
    },
    f"{A}/rules/{{id}}": {
        "get": _op("One rule", "rules", {"200": _ok(ref("Rule")), "404": _error("No rule")},
                   params=[ID], op_id="rule"),
        "put": _op("Change a rule (sql, actions, enable, description)", "rules",
                   {"200": _ok(ref("Rule")), "404": _error("No rule")}, params=[ID],
                   body="RuleChange", op_id="rule_update"),
        "delete": _op("Delete a rule", "rules", {"204": {"description": "Deleted"},
                                                 "404": _error("No rule")},
                      params=[ID], op_id="rule_delete"),
    },
    f"{A}/rules/{{id}}/metrics": {"get": _op(
        "A rule's metrics", "rules", {"200": _ok(ref("RuleMetrics")), "404": _error("No rule")},
        params=[ID], op_id="rule_metrics")},
    f"{A}/rules/{{id}}/metrics/reset": {"put": _op(
        "Reset a rule's metrics", "rules", {"204": {"description": "Reset"},
                                             "404": _error("No rule")},
        params=[ID], op_id="rule_metrics_reset")},
    f"{A}/rule_test": {"post": _op(
        "Run SQL over a sample event (EMQX's test SQL)", "rules",
        {"200": _ok({"oneOf": [{"type": "object"}, {"type": "array"}]}, "The output"),
         "412": _error("The SQL gives no output for this context")},
        body="RuleTest", op_id="rule_test")},
    f"{A}/webhooks": {"get": _op("Webhooks: counters and queues", "rules",
                                 {"200": _ok(ref("Webhooks"))}, op_id="webhooks")},
    f"{A}/connectors": {"get": _op("Data-integration sinks: health, counters, buffers",
                                   "rules", {"200": _ok(ref("Connectors"))},
                                   op_id="connectors")},
}
