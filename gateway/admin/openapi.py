"""The OpenAPI 3.1 document of the management API, written by hand.

Served at ``/api/v5/openapi.json``. ``tests/gateway/admin`` checks that it lists exactly
the routes of :data:`gateway.admin.api.ROUTES` and that real responses validate against
its schemas, so it stays true as the API grows (schemathesis can also run against it).
"""

from __future__ import annotations

from typing import Any

API = "/api/v5"

JSON = "application/json"
NULLABLE_STR = {"type": ["string", "null"]}
NULLABLE_INT = {"type": ["integer", "null"]}
NULLABLE_NUM = {"type": ["number", "null"]}


def ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": props}
    schema["required"] = list(props) if required is None else required
    schema.update(extra)
    return schema


def page_of(item: str) -> dict[str, Any]:
    return obj({"data": {"type": "array", "items": ref(item)}, "meta": ref("Meta")})


SCHEMAS: dict[str, Any] = {
    "Error": obj({"code": {"type": "string", "examples": ["NOT_FOUND"]},
                  "message": {"type": "string"}}),
    "Meta": obj({"page": {"type": "integer", "minimum": 1},
                 "limit": {"type": "integer", "minimum": 1},
                 "count": {"type": "integer", "minimum": 0},
                 "hasnext": {"type": "boolean"}}),
    "Health": obj({"node": {"type": "string"}, "status": {"const": "running"},
                   "version": {"type": "string"}}),
    "Node": obj({
        "node": {"type": "string"}, "node_status": {"type": "string"},
        "version": {"type": "string"}, "role": {"type": "string"},
        "uptime": {"type": "number"}, "started_at": {"type": "number"},
        "sysdescr": {"type": "string"}, "pid": {"type": "integer"},
        "python": {"type": "string"}, "connections": {"type": "integer"},
        "memory_rss": NULLABLE_INT,
        "load": {"type": ["array", "null"], "items": {"type": "number"}},
        "open_fds": NULLABLE_INT, "max_fds": {"type": "integer"},
        "data_dir": {"type": "string"},
    }),
    "Counts": {"type": "object", "additionalProperties": {"type": "integer"}},
    "Client": obj({
        "clientid": {"type": "string"}, "node": {"type": "string"},
        "connected": {"type": "boolean"}, "username": NULLABLE_STR,
        "ip_address": NULLABLE_STR, "port": NULLABLE_INT, "protocol": NULLABLE_STR,
        "proto_name": NULLABLE_STR, "proto_ver": NULLABLE_INT, "listener": NULLABLE_STR,
        "mountpoint": {"type": "string"}, "keepalive": {"type": "integer"},
        "clean_start": {"type": "boolean"}, "connected_at": NULLABLE_NUM,
        "created_at": {"type": "number"},
        "expiry_interval": {**NULLABLE_INT,
                            "description": "seconds; null: the session never expires"},
        "subscriptions_cnt": {"type": "integer"}, "inflight_cnt": {"type": "integer"},
        "inflight_max": {"type": "integer"}, "mqueue_len": {"type": "integer"},
        "mqueue_max": {"type": "integer"}, "awaiting_rel_cnt": {"type": "integer"},
    }),
    "KickResult": obj({"clientid": {"type": "string"},
                       "result": {"enum": ["kicked", "discarded"]}}),
    "Subscription": obj({
        "node": {"type": "string"}, "clientid": {"type": "string"},
        "topic": {"type": "string", "description": "as subscribed ($share/... included)"},
        "filter": {"type": "string"}, "share_group": NULLABLE_STR,
        "qos": {"type": "integer", "minimum": 0, "maximum": 2},
        "nl": {"enum": [0, 1]}, "rap": {"enum": [0, 1]}, "rh": {"enum": [0, 1, 2]},
        "subid": NULLABLE_INT,
    }),
    "Route": obj({"topic": {"type": "string"}, "node": {"type": "string"},
                  "subscribers": {"type": "integer"},
                  "shared_groups": {"type": "array", "items": {"type": "string"}}}),
    "RetainedMessage": obj({
        "topic": {"type": "string"}, "qos": {"type": "integer"},
        "payload_size": {"type": "integer"}, "from_clientid": NULLABLE_STR,
        "from_username": NULLABLE_STR, "publish_at": NULLABLE_NUM, "expires_at": NULLABLE_NUM,
    }),
    "RetainedMessageWithPayload": {"allOf": [
        ref("RetainedMessage"),
        obj({"payload": {"type": "string", "contentEncoding": "base64"}}),
    ]},
    "Listener": obj({
        "id": {"type": "string", "examples": ["tcp:default"]}, "type": {"type": "string"},
        "name": {"type": "string"}, "protocol": {"type": "string"},
        "bind": {"type": "string"},
        "addresses": {"type": "array", "items": {"type": "string"}},
        "status": {"enum": ["running", "disabled", "unknown"]},
        "current_connections": {"type": "integer"}, "max_connections": {"type": "integer"},
        "refused_connections": {"type": "integer"},
    }),
    "Gateway": obj({"name": {"enum": ["mqtt", "mqttsn", "coap", "lwm2m"]},
                    "status": {"enum": ["running", "not configured"]},
                    "listeners": {"type": "array", "items": {"type": "string"}},
                    "current_connections": {"type": "integer"}}),
    "ClusterMember": obj({"node": {"type": "string"}, "status": {"type": "string"},
                          "role": {"type": "string"}, "version": {"type": "string"},
                          "self": {"type": "boolean"}, "connections": {"type": "integer"}}),
    "Cluster": obj({"enabled": {"type": "boolean"},
                    "status": {"type": "string", "examples": ["not configured", "running"]},
                    "name": NULLABLE_STR, "role": {"type": "string"},
                    "self": {"type": "string"},
                    "members": {"type": "array", "items": ref("ClusterMember")}}),
    "Bridge": obj({"name": {"type": "string"}, "type": {"type": "string"},
                   "upstream": {"type": "string", "examples": ["mqtts://cloud.example:8883"]},
                   "status": {"enum": ["connected", "connecting", "disconnected", "stopped"]},
                   "connected": {"type": "boolean"}, "connected_at": NULLABLE_NUM,
                   "session_present": {"type": ["boolean", "null"]},
                   "clientid": {"type": "string"}, "proto_ver": {"enum": ["v3", "v4", "v5"]},
                   "queue_len": {"type": "integer"}, "queue_bytes": {"type": "integer"},
                   "inflight": {"type": "integer"}, "oldest_age": NULLABLE_NUM,
                   "queued": {"type": "integer"}, "forwarded": {"type": "integer"},
                   "acked": {"type": "integer"}, "received": {"type": "integer"},
                   "dropped": {"type": "object", "additionalProperties": {"type": "integer"}},
                   "loops_prevented": {"type": "integer"},
                   "rates": obj({"forwarded": {"type": "number"},
                                 "received": {"type": "number"}}),
                   "connects": {"type": "integer"}, "attempts": {"type": "integer"},
                   "next_attempt_in": NULLABLE_NUM, "last_error": NULLABLE_STR}),
    "Bridges": obj({"enabled": {"type": "boolean"}, "status": {"type": "string"},
                    "bridges": {"type": "array", "items": ref("Bridge")}}),
    "Alarm": obj({"name": {"type": "string"}, "message": {"type": "string"},
                  "details": {"type": "object"}, "activated": {"type": "boolean"},
                  "activated_at": {"type": "number"}, "deactivated_at": NULLABLE_NUM}),
    "Status": obj({
        "node": {"type": "string"}, "version": {"type": "string"},
        "status": {"const": "running"}, "role": {"type": "string"},
        "uptime": {"type": "number"}, "started_at": {"type": "number"},
        "cluster": ref("Cluster"),
        "listeners": {"type": "array", "items": ref("Listener")},
        "gateways": {"type": "array", "items": ref("Gateway")},
        "connections": obj({"count": {"type": "integer"}, "by_protocol": ref("Counts")}),
        "sessions": {"type": "integer"}, "subscriptions": {"type": "integer"},
        "topics": {"type": "integer"}, "retained": {"type": "integer"},
        "stats": ref("Counts"),
        "rates": {"type": "object", "additionalProperties": {"type": "number"}},
        "image": {"oneOf": [{"type": "null"}, obj({"version": {"type": "string"},
                                                   "slot": {"type": "string"}})]},
        "bridges": ref("Bridges"),
        "alarms": {"type": "array", "items": ref("Alarm")},
        "limits": obj({"max_connections": {"type": "integer"}, "nofile": {"type": "object"}}),
        "durability": obj({"enabled": {"type": "boolean"}, "path": NULLABLE_STR}),
        "store": {"anyOf": [ref("Store"), {"type": "null"}]},
        "fleet_shipper": {"anyOf": [ref("FleetShipper"), {"type": "null"}]},
    }, required=["node", "version", "status", "role", "uptime", "started_at", "cluster",
                 "listeners", "gateways", "connections", "sessions", "subscriptions",
                 "topics", "retained", "stats", "rates", "bridges", "alarms", "limits",
                 "durability"]),
    "FleetShipper": obj({
        "destination": {"type": "string"}, "last_run": NULLABLE_NUM,
        "last_success": NULLABLE_NUM, "last_error": NULLABLE_STR,
        "last_error_at": NULLABLE_NUM, "consecutive_errors": {"type": "integer"},
        "errors_total": {"type": "integer"}, "pending_segments": {"type": "integer"},
        "pending_bytes": {"type": "integer"}, "spool_max": {"type": "integer"},
        "spool_alarm": {"type": "boolean"}, "spool_alarm_bytes": {"type": "integer"},
        "shipped_segments_total": {"type": "integer"}, "shipped_bytes_total": {"type": "integer"},
        "dropped_segments_total": {"type": "integer"}, "dropped_bytes_total": {"type": "integer"},
    }),
    "Store": obj({
        "path": {"type": "string"},
        "writable": {"type": "boolean"},
        "refusing": {"anyOf": [{"enum": ["disk full", "size cap"]},
                               {"type": "string", "pattern": "^write error"},
                               {"type": "null"}],
                     "description": "Why QoS 1/2 publishes and new persistent sessions are "
                                    "refused (0x97) now; null: accepting."},
        "fault": {"anyOf": [obj({"kind": {"enum": ["full", "io", "readonly", "corrupt",
                                                   "busy", "other"]},
                                 "message": {"type": "string"}}), {"type": "null"}]},
        "disk_total": {"type": ["integer", "null"]},
        "disk_free": {"type": ["integer", "null"]},
        "disk_usage": {"type": ["number", "null"]},
        "db_bytes": {"type": ["integer", "null"]},
        "wal_bytes": {"type": ["integer", "null"]},
        "max_size": {"type": "integer"},
        "disk_high_watermark": {"type": "number"},
        "reserve_size": {"type": "integer"},
        "reserve_held": {"type": "boolean"},
        "commit_failures": {"type": "integer"},
        "pages_freed": {"type": "integer"},
        "salvaged": {"type": "array", "items": {"type": "object"}},
    }),
    "User": obj({"user_id": {"type": "string"}, "is_superuser": {"type": "boolean"},
                 "algorithm": {"type": "string"}, "created_at": {"type": "number"},
                 "updated_at": {"type": "number"}, "rules": {"type": "integer"}}),
    "NewUser": obj({"user_id": {"type": "string", "minLength": 1},
                    "password": {"type": "string", "minLength": 1},
                    "is_superuser": {"type": "boolean", "default": False}},
                   required=["user_id", "password"]),
    "UserCreated": obj({"user_id": {"type": "string"}, "is_superuser": {"type": "boolean"},
                        "created_at": {"type": "number"}}),
    "Banned": obj({"as": {"enum": ["clientid", "username", "peerhost", "cidr"]},
                   "who": {"type": "string"}, "by": NULLABLE_STR, "reason": {"type": "string"},
                   "at": {"type": "number"}, "until": NULLABLE_NUM,
                   "active": {"type": "boolean"}}),
    "ClusterJoin": obj({"node": {"type": "string", "minLength": 1,
                                 "examples": ["b@10.0.0.2:5370"]}}),
    "NewBanned": obj({"as": {"enum": ["clientid", "username", "peerhost", "cidr", "peerhost_net"],
                             "description": "peerhost_net is EMQX's name for cidr"},
                      "who": {"type": "string", "minLength": 1},
                      "reason": {"type": "string"},
                      "until": {"type": "number", "description": "epoch seconds"}},
                     required=["as", "who"]),
    "StoreStatus": {"enum": ["enabled", "not configured"]},
}
SCHEMAS["UsersPage"] = {"allOf": [page_of("User"), obj({"status": ref("StoreStatus")})]}
SCHEMAS["BannedPage"] = {"allOf": [page_of("Banned"), obj({"status": ref("StoreStatus")})]}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": ref("Error")}}}


def _ok(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _q(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}


def _p(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"},
            "description": description}


PAGING = [
    _q("page", {"type": "integer", "minimum": 1, "default": 1}, "Page number, from 1."),
    _q("limit", {"type": "integer", "minimum": 1, "maximum": 10000, "default": 100},
       "Items per page."),
]
TOPIC_PATH = _p("topic", "Topic name or filter, percent-encoded (a/b as a%2Fb, # as %23).")


def _op(summary: str, tag: str, responses: dict[str, Any], *, params: list[Any] | None = None,
        body: str | None = None, public: bool = False, op_id: str) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "tags": [tag], "operationId": op_id,
                          "responses": {**responses}}
    if params:
        op["parameters"] = params
    if body:
        op["requestBody"] = {"required": True, "content": {JSON: {"schema": ref(body)}}}
    if public:
        op["security"] = []
    else:
        op["responses"]["401"] = _error("Missing or wrong token")
    if params or body:
        op["responses"].setdefault("400", _error("Invalid parameter or body"))
    return op


PROMETHEUS = {"description": "Prometheus text exposition format 0.0.4",
              "content": {"text/plain": {"schema": {"type": "string"}}}}


def paths(metrics_public: bool = True) -> dict[str, Any]:
    a = API
    return {
        "/status": {"get": _op("Health check (no token)", "node",
                               {"200": _ok(ref("Health"))}, public=True, op_id="health")},
        "/metrics": {"get": _op("Prometheus metrics (no token unless [api] metrics_auth)",
                                "metrics", {"200": PROMETHEUS}, public=metrics_public,
                                op_id="prometheus")},
        f"{a}/openapi.json": {"get": _op("This document", "node",
                                         {"200": _ok({"type": "object"})}, op_id="openapi")},
        f"{a}/status": {"get": _op("Everything `gatewayctl status` shows", "node",
                                   {"200": _ok(ref("Status"))}, op_id="status")},
        f"{a}/nodes": {"get": _op("Nodes (this one until clustering)", "node",
                                  {"200": _ok({"type": "array", "items": ref("Node")})},
                                  op_id="nodes")},
        f"{a}/nodes/{{node}}": {"get": _op(
            "One node", "node", {"200": _ok(ref("Node")), "404": _error("No such node")},
            params=[_p("node", "Node name")], op_id="node")},
        f"{a}/stats": {"get": _op("Counts and their high-water marks (connections.count, "
                                  "connections.max, sessions.count, ...)", "metrics",
                                  {"200": _ok(ref("Counts"))}, op_id="stats")},
        f"{a}/metrics": {"get": _op("Counters (messages.received, messages.dropped.<reason>, "
                                    "...)", "metrics", {"200": _ok(ref("Counts"))},
                                    op_id="metrics")},
        f"{a}/prometheus/stats": {"get": _op(
            "Prometheus metrics (same as /metrics)", "metrics", {"200": PROMETHEUS},
            public=metrics_public, op_id="prometheus_stats")},
        f"{a}/clients": {"get": _op(
            "Clients (sessions, connected or not), filtered", "clients",
            {"200": _ok(page_of("Client"))},
            params=[
                _q("clientid", {"type": "string"}, "Exact client id."),
                _q("username", {"type": "string"}, "Exact username."),
                _q("ip_address", {"type": "string"}, "Exact peer address."),
                _q("conn_state", {"enum": ["connected", "disconnected"]}, "Connection state."),
                _q("proto_ver", {"type": "integer", "minimum": 3, "maximum": 5},
                   "Protocol version (3, 4, 5)."),
                _q("protocol", {"type": "string"}, "mqtt, mqttsn, coap, lwm2m."),
                _q("listener", {"type": "string"}, "Listener id, e.g. tcp:default."),
                _q("like_clientid", {"type": "string"}, "Client id substring (any case)."),
                _q("like_username", {"type": "string"}, "Username substring (any case)."),
                *PAGING,
            ], op_id="clients")},
        f"{a}/clients/{{clientid}}": {
            "get": _op("One client", "clients",
                       {"200": _ok(ref("Client")), "404": _error("No such client")},
                       params=[_p("clientid", "Client id, percent-encoded")], op_id="client"),
            "delete": _op(
                "Kick a client (DISCONNECT 0x98); its will goes unless will=false; "
                "discard=true also ends its session (and ends an offline session)",
                "clients",
                {"200": _ok(ref("KickResult")), "404": _error("No such client"),
                 "409": _error("Not connected (and discard not given)")},
                params=[_p("clientid", "Client id, percent-encoded"),
                        _q("will", {"type": "boolean", "default": True},
                           "Publish the client's will."),
                        _q("discard", {"type": "boolean", "default": False},
                           "Also end the session.")],
                op_id="kick"),
        },
        f"{a}/clients/{{clientid}}/subscriptions": {"get": _op(
            "A client's subscriptions", "subscriptions",
            {"200": _ok({"type": "array", "items": ref("Subscription")}),
             "404": _error("No such client")},
            params=[_p("clientid", "Client id, percent-encoded")],
            op_id="client_subscriptions")},
        f"{a}/subscriptions": {"get": _op(
            "Subscriptions of every session", "subscriptions",
            {"200": _ok(page_of("Subscription"))},
            params=[
                _q("clientid", {"type": "string"}, "Exact client id."),
                _q("topic", {"type": "string"}, "Exact filter as subscribed."),
                _q("qos", {"type": "integer", "minimum": 0, "maximum": 2}, "Granted QoS."),
                _q("share_group", {"type": "string"}, "Shared subscription group."),
                _q("match_topic", {"type": "string"},
                   "A topic name: the filters that match it."),
                *PAGING,
            ], op_id="subscriptions")},
        f"{a}/routes": {"get": _op(
            "Routes: topic filter -> node", "routes", {"200": _ok(page_of("Route"))},
            params=[_q("topic", {"type": "string"}, "Exact filter."), *PAGING],
            op_id="routes")},
        f"{a}/routes/{{topic}}": {"get": _op(
            "The route of one filter", "routes",
            {"200": _ok({"type": "array", "items": ref("Route")}),
             "404": _error("No route")}, params=[TOPIC_PATH], op_id="route")},
        f"{a}/retainer/messages": {"get": _op(
            "Retained messages (without payloads)", "retainer",
            {"200": _ok(page_of("RetainedMessage"))},
            params=[_q("topic", {"type": "string"}, "A topic filter (wildcards allowed)."),
                    *PAGING], op_id="retained")},
        f"{a}/retainer/messages/{{topic}}": {
            "get": _op("One retained message, payload in base64", "retainer",
                       {"200": _ok(ref("RetainedMessageWithPayload")),
                        "404": _error("No retained message")},
                       params=[TOPIC_PATH], op_id="retained_message"),
            "delete": _op("Delete a retained message", "retainer",
                          {"204": {"description": "Deleted"},
                           "404": _error("No retained message")},
                          params=[TOPIC_PATH], op_id="retained_delete"),
        },
        f"{a}/banned": {
            "get": _op("Banned clients", "banned", {"200": _ok(ref("BannedPage"))},
                       params=PAGING, op_id="banned"),
            "post": _op("Ban a client id, username, peer address or network", "banned",
                        {"201": _ok(ref("Banned"), "Banned"),
                         "501": _error("Banning is not configured on this node")},
                        body="NewBanned", op_id="banned_add"),
        },
        f"{a}/banned/{{as}}/{{who}}": {"delete": _op(
            "Lift a ban", "banned",
            {"204": {"description": "Lifted"}, "404": _error("Not banned"),
             "501": _error("Banning is not configured on this node")},
            params=[_p("as", "clientid, username, peerhost or cidr"),
                    _p("who", "The banned value, percent-encoded")],
            op_id="banned_delete")},
        f"{a}/users": {
            "get": _op("Users of the built-in database", "users",
                       {"200": _ok(ref("UsersPage"))}, params=PAGING, op_id="users"),
            "post": _op("Add a user", "users",
                        {"201": _ok(ref("UserCreated"), "Added"),
                         "409": _error("The user exists"),
                         "501": _error("No user database on this node")},
                        body="NewUser", op_id="user_add"),
        },
        f"{a}/users/{{user_id}}": {"delete": _op(
            "Delete a user and its rules", "users",
            {"204": {"description": "Deleted"}, "404": _error("No such user"),
             "501": _error("No user database on this node")},
            params=[_p("user_id", "User name")], op_id="user_delete")},
        f"{a}/listeners": {"get": _op(
            "Listeners with their connection counts", "listeners",
            {"200": _ok({"type": "array", "items": ref("Listener")})}, op_id="listeners")},
        f"{a}/gateways": {"get": _op(
            "Protocol front-ends (mqtt, mqttsn, coap, lwm2m)", "listeners",
            {"200": _ok({"type": "array", "items": ref("Gateway")})}, op_id="gateways")},
        f"{a}/cluster": {"get": _op(
            "Cluster members and their states", "cluster", {"200": _ok(ref("Cluster"))},
            op_id="cluster")},
        f"{a}/cluster/join": {"post": _op(
            "Join the cluster of a node (name@host:port, or host:port)", "cluster",
            {"202": _ok(obj({"joining": {"type": "string"}})),
             "501": _error("Clustering is off on this node")},
            body="ClusterJoin", op_id="cluster_join")},
        f"{a}/cluster/leave": {"post": _op(
            "Leave the cluster: tell every member, forget them", "cluster",
            {"200": _ok(obj({"left": {"type": "boolean"}, "told": {"type": "integer"}})),
             "501": _error("Clustering is off on this node")},
            op_id="cluster_leave")},
        f"{a}/cluster/nodes/{{node}}": {"delete": _op(
            "Remove a (dead) member from this node's view (force-leave)", "cluster",
            {"204": {"description": "Removed"}, "404": _error("No such member"),
             "501": _error("Clustering is off on this node")},
            params=[_p("node", "Node name")], op_id="cluster_forget")},
        f"{a}/bridges": {"get": _op(
            "Upstream bridges and their queues", "bridges", {"200": _ok(ref("Bridges"))},
            op_id="bridges")},
        f"{a}/alarms": {"get": _op(
            "Active alarms (activated=false: cleared ones)", "alarms",
            {"200": _ok(page_of("Alarm"))},
            params=[_q("activated", {"type": "boolean", "default": True},
                       "Active (true) or cleared (false) alarms."), *PAGING],
            op_id="alarms")},
        f"{a}/trace": {"get": _op(
            "Live trace of one client or topic filter (server-sent events until the "
            "client closes; the first event is trace.started)", "trace",
            {"200": {"description": "An event stream: `event: <name>` and `data: <json>` "
                                    "per event",
                     "content": {"text/event-stream": {"schema": {"type": "string"}}}}},
            params=[_q("clientid", {"type": "string"}, "The client to follow."),
                    _q("topic", {"type": "string"}, "The topic filter to follow.")],
            op_id="trace")},
    }
