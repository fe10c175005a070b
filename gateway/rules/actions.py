"""Rule actions: what happens to each output of a rule.

- ``republish``: ``args = {topic, payload, qos, retain, user_properties,
  mqtt_properties}``, each a ``${var}`` template (qos/retain may be plain values); an empty
  or absent ``payload`` publishes the whole output as JSON. The message is published as
  the rule (publisher = the rule id, no authorization check, as in EMQX).
- ``console``: the output (and the event's name) logged at INFO on ``gateway.rules``.
- ``bridge:NAME``: ``args = {topic, payload, qos, retain}`` as republish, put on the
  durable outbox of the upstream bridge ``[bridges.mqtt.NAME]`` (forwarded like any
  message its forward rules match; a full outbox drops by its own policy, counted there).
- ``webhook:NAME``: a request built from ``[webhooks.NAME]`` (``args.body``/``args.path``
  may override its body template and append to its URL path) put on that webhook's
  durable queue; refused by a full queue = the action failed (counted, alarmed).
- ``postgresql:NAME``, ``redis:NAME``, ``rabbitmq:NAME``, ``influxdb:NAME``: an item rendered
  from the action's template (``sql``, ``command``, ``routing_key``/``payload``,
  ``write_syntax``) put on the durable buffer of ``[connectors.KIND.NAME]``
  (:mod:`gateway.rules.sinks`); refused by a full buffer = the action failed.

:func:`check_action` validates a function name and its args at load time (ValueError
with a one-line reason); :func:`build_action` makes the callable. An action raises on a
per-output failure; the engine counts it and goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gateway.core.topic_index import is_valid_topic_name
from gateway.rules.functions import to_json
from gateway.rules.sinks import SINK_KINDS
from gateway.rules.sinks import check_args as check_sink_args
from gateway.rules.sinks import make_action as make_sink_action
from gateway.rules.template import Template
from protocols.context import Message
from protocols.mqtt.packets import Properties

__all__ = ["Action", "ActionContext", "build_action", "check_action"]

log = logging.getLogger("gateway.rules")

Action = Callable[[dict[str, Any], Mapping[str, Any]], None]

_REPUBLISH_KEYS = {"topic", "payload", "qos", "retain", "user_properties", "mqtt_properties"}
_MQTT_PROPS = {
    "Payload-Format-Indicator": "payload_format_indicator",
    "Message-Expiry-Interval": "message_expiry_interval",
    "Content-Type": "content_type",
    "Response-Topic": "response_topic",
    "Correlation-Data": "correlation_data",
}


class ActionContext(Protocol):
    """What actions need from the running engine."""

    def publish(self, rule_id: str, message: Message) -> None: ...
    def webhook(self, name: str) -> Any: ...  # a gateway.rules.webhook.Webhook
    def bridge(self, name: str) -> Any: ...  # a gateway.bridge.bridge.Bridge
    def now(self) -> float: ...

    # running sinks by "KIND:NAME" (gateway.rules.sinks.base.Sink)
    sinks: Mapping[str, Any]


def _tpl(value: Any, what: str) -> Template | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what}: expected a string template, got {value!r}")
    return Template(value)


def check_action(function: str, args: Mapping[str, Any]) -> None:
    """ValueError (one line) when ``function``/``args`` cannot make an action."""
    if function == "republish":
        unknown = set(args) - _REPUBLISH_KEYS
        if unknown:
            raise ValueError(f"republish: unknown argument(s) {', '.join(sorted(unknown))}")
        topic = args.get("topic")
        if not isinstance(topic, str) or not topic:
            raise ValueError("republish: args.topic (a template) is required")
        t = Template(topic)
        if t.constant and not is_valid_topic_name(topic):
            raise ValueError(f"republish: {topic!r} is not a valid topic name")
        _tpl(args.get("payload"), "republish: args.payload")
        qos = args.get("qos", 0)
        if not (qos in (0, 1, 2) and not isinstance(qos, bool)) and not (
            isinstance(qos, str) and "${" in qos
        ):
            raise ValueError(f"republish: args.qos must be 0, 1, 2 or a template, got {qos!r}")
        retain = args.get("retain", False)
        if not isinstance(retain, bool) and not (isinstance(retain, str) and "${" in retain):
            raise ValueError(
                f"republish: args.retain must be a boolean or a template, got {retain!r}"
            )
        up = args.get("user_properties")
        if up is not None and not isinstance(up, str | dict):
            raise ValueError("republish: args.user_properties must be a template or a table")
        if isinstance(up, dict):
            for k, v in up.items():
                _tpl(v, f"republish: args.user_properties.{k}")
        mp = args.get("mqtt_properties", {})
        if not isinstance(mp, dict):
            raise ValueError("republish: args.mqtt_properties must be a table")
        for k, v in mp.items():
            if k not in _MQTT_PROPS:
                raise ValueError(f"republish: unknown MQTT property {k!r}")
            _tpl(v, f"republish: args.mqtt_properties.{k}")
        return
    if function == "console":
        if args:
            raise ValueError("console: takes no arguments")
        return
    if function.startswith("bridge:"):
        if not function[7:]:
            raise ValueError("bridge: expected bridge:NAME")
        unknown = set(args) - {"topic", "payload", "qos", "retain"}
        if unknown:
            raise ValueError(f"bridge: unknown argument(s) {', '.join(sorted(unknown))}")
        check_action("republish", args)
        return
    if function.startswith("webhook:"):
        name = function.split(":", 1)[1]
        if not name:
            raise ValueError("webhook: expected webhook:NAME")
        unknown = set(args) - {"body", "path", "headers"}
        if unknown:
            raise ValueError(f"webhook: unknown argument(s) {', '.join(sorted(unknown))}")
        _tpl(args.get("body"), "webhook: args.body")
        _tpl(args.get("path"), "webhook: args.path")
        return
    kind, _, name = function.partition(":")
    if kind in SINK_KINDS:
        if not name:
            raise ValueError(f"{kind}: expected {kind}:NAME")
        check_sink_args(kind, args)
        return
    raise ValueError(
        f"unknown action function {function!r} (republish, console, bridge:NAME, "
        "webhook:NAME, postgresql:NAME, redis:NAME, rabbitmq:NAME or influxdb:NAME)"
    )


def _int_arg(v: Any, output: Mapping[str, Any], columns: Mapping[str, Any]) -> int:
    if isinstance(v, Template):
        v = v.value(output, columns)
    return int(v)


def _bool_arg(v: Any, output: Mapping[str, Any], columns: Mapping[str, Any]) -> bool:
    if isinstance(v, Template):
        v = v.value(output, columns)
    if isinstance(v, str):
        return v.lower() == "true"
    return bool(v)


def _republish(rule_id: str, args: Mapping[str, Any], ctx: ActionContext) -> Action:
    topic = Template(args["topic"])
    payload = Template(args.get("payload") or "")
    qos: Any = args.get("qos", 0)
    qos = Template(qos) if isinstance(qos, str) else qos
    retain: Any = args.get("retain", False)
    retain = Template(retain) if isinstance(retain, str) else retain
    up = args.get("user_properties")
    up_t: Template | dict[str, Template] | None = (
        Template(up) if isinstance(up, str) else {k: Template(v) for k, v in up.items()}
        if isinstance(up, dict) else None
    )
    mprops = {_MQTT_PROPS[k]: Template(v) for k, v in args.get("mqtt_properties", {}).items()}

    def republish(output: dict[str, Any], columns: Mapping[str, Any]) -> None:
        t = topic.render(output, columns)
        if not is_valid_topic_name(t):
            raise ValueError(f"republish: {t!r} is not a valid topic name")
        body = payload.render(output, columns) if payload.text else to_json(output)
        q = _int_arg(qos, output, columns)
        if q not in (0, 1, 2):
            raise ValueError(f"republish: qos {q!r}")
        props: dict[str, Any] = {}
        if isinstance(up_t, Template):
            v = up_t.value(output, columns)
            if isinstance(v, dict):
                props["user_properties"] = tuple((str(k), str(x)) for k, x in v.items())
        elif isinstance(up_t, dict):
            props["user_properties"] = tuple(
                (k, tpl.render(output, columns)) for k, tpl in up_t.items()
            )
        for attr, tpl in mprops.items():
            v = tpl.render(output, columns)
            if attr in ("payload_format_indicator", "message_expiry_interval"):
                props[attr] = int(v)
            elif attr == "correlation_data":
                props[attr] = v.encode()
            else:
                props[attr] = v
        message = Message(
            t,
            body.encode(),
            q,
            _bool_arg(retain, output, columns),
            Properties(**props) if props else Properties(),
            publisher=rule_id,
            timestamp=ctx.now(),
        )
        if message.properties.message_expiry_interval:
            message.expires_at = message.timestamp + message.properties.message_expiry_interval
        ctx.publish(rule_id, message)

    return republish


def _bridge(name: str, args: Mapping[str, Any], ctx: ActionContext) -> Action:
    def publish(rule_id: str, message: Message) -> None:
        bridge = ctx.bridge(name)
        if bridge is None:
            raise ValueError(f"bridge {name!r} is not running")
        entry = bridge.outbox.put(message.topic, message.payload, message.qos, message.retain,
                                  message.properties, message.expires_at)
        if entry is None:
            raise ValueError(f"bridge {name!r}: outbox full")
        bridge.queued += 1
        bridge.client.wake()

    class _Ctx:
        def publish(self, rule_id: str, message: Message) -> None:
            publish(rule_id, message)

        def webhook(self, name: str) -> Any:
            return None

        def bridge(self, name: str) -> Any:
            return None

        def now(self) -> float:
            return ctx.now()

        sinks: Mapping[str, Any] = {}

    return _republish(f"bridge:{name}", args, _Ctx())


def _console(rule_id: str) -> Action:
    def console(output: dict[str, Any], columns: Mapping[str, Any]) -> None:
        log.info("rule %s: %s (event %s)", rule_id, to_json(output), columns.get("event"))

    return console


def _webhook(name: str, args: Mapping[str, Any], ctx: ActionContext) -> Action:
    body = Template(args["body"]) if args.get("body") else None
    path = Template(args["path"]) if args.get("path") else None

    def webhook(output: dict[str, Any], columns: Mapping[str, Any]) -> None:
        hook = ctx.webhook(name)
        if hook is None:
            raise ValueError(f"webhook {name!r} is not configured")
        hook.send(output, columns, body=body, path=path)

    return webhook


def build_action(
    rule_id: str, function: str, args: Mapping[str, Any], ctx: ActionContext
) -> Action:
    check_action(function, args)
    if function == "republish":
        return _republish(rule_id, args, ctx)
    if function == "console":
        return _console(rule_id)
    if function.startswith("bridge:"):
        return _bridge(function[7:], args, ctx)
    if function.partition(":")[0] in SINK_KINDS:
        return make_sink_action(function, args, lambda: ctx.sinks)
    return _webhook(function.split(":", 1)[1], args, ctx)


