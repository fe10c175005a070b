"""The MQTT extensions' part of the management API's OpenAPI document
(:mod:`gateway.admin.ext_api`); merged by :func:`gateway.admin.openapi_doc.openapi_document`.
"""

from __future__ import annotations

from typing import Any

from gateway.admin.openapi import NULLABLE_STR, PAGING, _error, _ok, _op, _p, obj, page_of, ref

__all__ = ["PATHS", "SCHEMAS"]

A = "/api/v5/mqtt"
NODE = _p("node", "The node name (this node).")
MSGID = _p("msgid", "The delayed message's id.")
CLIENTID = _p("clientid", "The client id.")
TAG = "mqtt extensions"
_INT = {"type": "integer"}
_OPT = {"type": "integer", "minimum": 0, "maximum": 2}
_TOPIC_Q = {"name": "topic", "in": "query", "required": False, "schema": {"type": "string"},
            "description": "Only this topic (else every topic of the client)."}

SCHEMAS: dict[str, Any] = {
    "DelayedSettings": obj({"enable": {"type": "boolean"}, "max_delayed_messages": _INT,
                            "count": _INT}),
    "DelayedMessage": obj({
        "msgid": {"type": "string"}, "node": {"type": "string"}, "topic": {"type": "string"},
        "qos": _OPT, "retain": {"type": "boolean"}, "from_clientid": {"type": "string"},
        "from_username": NULLABLE_STR, "publish_at": {"type": "number"},
        "delayed_interval": {"type": "number"}, "expected_at": {"type": "number"},
        "delayed_remaining": {"type": "number"}, "payload_size": _INT,
        "payload": {"type": "string", "contentEncoding": "base64"},
    }, required=["msgid", "node", "topic", "qos", "expected_at", "delayed_remaining"]),
    "DelayedMessagePage": page_of("DelayedMessage"),
    "RewriteRule": obj({"action": {"enum": ["publish", "subscribe", "all"]},
                        "source_topic": {"type": "string"}, "dest_topic": {"type": "string"},
                        "re": {"type": "string"}}),
    "AutoSubscribeTopic": obj({"topic": {"type": "string"}, "qos": _OPT,
                               "rh": _OPT, "rap": {"type": "integer"},
                               "nl": {"type": "integer"}}, required=["topic"]),
    "ClientAutoSubscribe": obj({"clientid": {"type": "string"}, "topic": {"type": "string"},
                                "qos": _OPT, "rh": _OPT, "rap": _INT, "nl": _INT}),
    "ClientAutoSubscribePage": page_of("ClientAutoSubscribe"),
    "ExclusiveHolder": obj({"topic": {"type": "string"}, "clientid": NULLABLE_STR,
                            "node": {"type": "string"}}),
    "ExclusiveHolderPage": page_of("ExclusiveHolder"),
}

_OFF = {"501": _error("The feature is switched off")}

PATHS: dict[str, Any] = {
    f"{A}/delayed": {"get": _op(
        "Delayed publish: settings and the number of waiting messages", TAG,
        {"200": _ok(ref("DelayedSettings"))}, op_id="delayed")},
    f"{A}/delayed/messages": {"get": _op(
        "Delayed messages, soonest first", TAG,
        {"200": _ok(ref("DelayedMessagePage")), **_OFF}, params=PAGING,
        op_id="delayed_messages")},
    f"{A}/delayed/messages/{{node}}/{{msgid}}": {
        "get": _op("One delayed message, with its payload", TAG,
                   {"200": _ok(ref("DelayedMessage")), "404": _error("No such message"),
                    **_OFF}, params=[NODE, MSGID], op_id="delayed_message"),
        "delete": _op("Cancel a delayed message", TAG,
                      {"204": {"description": "Cancelled"},
                       "404": _error("No such message"), **_OFF},
                      params=[NODE, MSGID], op_id="delayed_cancel"),
    },
    f"{A}/topic_rewrite": {"get": _op(
        "Topic rewrite rules, in the order they apply", TAG,
        {"200": _ok({"type": "array", "items": ref("RewriteRule")})}, op_id="topic_rewrite")},
    f"{A}/auto_subscribe": {"get": _op(
        "Auto-subscribe topics of the configuration", TAG,
        {"200": _ok({"type": "array", "items": ref("AutoSubscribeTopic")})},
        op_id="auto_subscribe")},
    f"{A}/auto_subscribe/clients": {"get": _op(
        "Per-client auto-subscribe topics (built-in store)", TAG,
        {"200": _ok(ref("ClientAutoSubscribePage"))}, params=PAGING,
        op_id="auto_subscribe_clients")},
    f"{A}/auto_subscribe/clients/{{clientid}}": {
        "get": _op("One client's auto-subscribe topics", TAG,
                   {"200": _ok({"type": "array", "items": ref("ClientAutoSubscribe")})},
                   params=[CLIENTID], op_id="auto_subscribe_client"),
        "post": _op("Add or replace one of a client's auto-subscribe topics (applies from "
                    "its next connect)", TAG,
                    {"201": _ok(ref("ClientAutoSubscribe"), "Saved")},
                    params=[CLIENTID], body="AutoSubscribeTopic",
                    op_id="auto_subscribe_client_add"),
        "delete": _op("Delete a client's auto-subscribe topic (?topic=) or all of them", TAG,
                      {"204": {"description": "Deleted"}, "404": _error("None found")},
                      params=[CLIENTID, _TOPIC_Q], op_id="auto_subscribe_client_delete"),
    },
    f"{A}/exclusive": {"get": _op(
        "Exclusive subscriptions held on this node", TAG,
        {"200": _ok(ref("ExclusiveHolderPage")), **_OFF}, params=PAGING, op_id="exclusive")},
}
