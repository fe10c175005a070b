"""Configuration of the rule engine and the webhooks (pydantic models, plain data).

Shapes (EMQX 5's)::

    [rule_engine.rules.high_temp]
    sql = '''SELECT payload.t AS t, clientid FROM "sensors/+/temp" WHERE payload.t > 30'''
    [[rule_engine.rules.high_temp.actions]]
    function = "republish"
    args = { topic = "alerts/${clientid}", payload = "${t}", qos = 1, retain = false }

    [webhooks.alerts]
    url = "https://example.com/hook"

Every rule is compiled when the configuration loads: bad SQL, an unknown function or an
action with bad arguments is a validation error naming the rule and the position
(``rule_engine.rules.high_temp.sql: line 1, column 24: ...``), so ``gatewayd --check``
exits 2 on it. :mod:`gateway.config.schema` imports this module (at its end), so this one
imports nothing of the schema at import time.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)


def _duration(value: object) -> float:
    from gateway.config.values import parse_duration  # at validation time: no import cycle

    return parse_duration(value)


def _size(value: object) -> int:
    from gateway.config.values import parse_size

    return parse_size(value)


# the schema's Duration and Size, without importing it (it imports this module)
Duration = Annotated[float, BeforeValidator(_duration), Field(ge=0)]
Size = Annotated[int, BeforeValidator(_size), Field(ge=0)]

__all__ = [
    "ActionConfig", "RuleConfig", "RuleEngineConfig", "RuleEngineField", "WebhookConfig",
    "WebhookTls",
]

_NAME_RE = re.compile(r"[A-Za-z0-9_\-]{1,64}")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ActionConfig(_Section):
    """One action of a rule: ``republish``, ``console`` or ``webhook:NAME``."""

    function: str
    args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _valid(self) -> ActionConfig:
        from gateway.rules.actions import check_action

        check_action(self.function, self.args)
        return self


class RuleConfig(_Section):
    sql: str
    enable: bool = True
    description: str = ""
    actions: list[ActionConfig] = Field(default_factory=list)

    @field_validator("sql")
    @classmethod
    def _compiles(cls, sql: str) -> str:
        from gateway.rules.compiler import compile_sql

        compile_sql(sql)  # SqlError is a ValueError: "line L, column C: ..."
        return sql


class RuleEngineConfig(_Section):
    """``[rule_engine]``."""

    enable: bool = True
    # events waiting for the rules (off the publish path); past this many, new events are
    # counted as dropped (rules.dropped) and a warning logged
    max_pending: Annotated[int, Field(ge=1)] = 100_000
    rules: dict[str, RuleConfig] = Field(default_factory=dict)

    @field_validator("rules")
    @classmethod
    def _names(cls, rules: dict[str, RuleConfig]) -> dict[str, RuleConfig]:
        for name in rules:
            if not _NAME_RE.fullmatch(name):
                raise ValueError(f"rule name {name!r}: letters, digits, '_' and '-', at most 64")
        return rules


class WebhookTls(_Section):
    enable: bool = False
    verify: Literal["verify_peer", "verify_none"] = "verify_peer"
    cacertfile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    server_name_indication: str | None = None


class WebhookConfig(_Section):
    """``[webhooks.NAME]``: an HTTP endpoint fed through a durable queue."""

    enable: bool = True
    url: str
    method: Literal["post", "put", "get", "delete", "patch"] = "post"
    headers: dict[str, str] = Field(default_factory=lambda: {"content-type": "application/json"})
    body: str = ""  # a ${var} template; "" = the rule's output as JSON
    timeout: Duration = 15.0
    concurrency: Annotated[int, Field(ge=1, le=1024)] = 8
    max_retries: Annotated[int, Field(ge=0)] = 0  # 0: retry until delivered
    retry_interval: Duration = 1.0  # first backoff; doubles up to max_retry_interval
    max_retry_interval: Duration = 60.0
    max_queue_bytes: Size = 64 << 20
    tls: WebhookTls = Field(default_factory=WebhookTls)

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        if not re.match(r"https?://[^/\s]+", url):
            raise ValueError("expected an http:// or https:// URL")
        return url

    @field_validator("method", mode="before")
    @classmethod
    def _lower(cls, v: object) -> object:
        return v.lower() if isinstance(v, str) else v

    @field_validator("body")
    @classmethod
    def _template(cls, body: str) -> str:
        from gateway.rules.template import Template

        Template(body)
        return body


def _refs_ok(value: RuleEngineConfig, info: ValidationInfo) -> RuleEngineConfig:
    webhooks = info.data.get("webhooks")
    bridges = getattr(info.data.get("bridges"), "mqtt", None)
    connectors = info.data.get("connectors")
    for rname, rule in value.rules.items():
        for i, action in enumerate(rule.actions):
            kind, _, name = action.function.partition(":")
            if kind == "webhook" and isinstance(webhooks, dict) and name not in webhooks:
                raise ValueError(f"rules.{rname}.actions[{i}]: no [webhooks.{name}] configured")
            if kind == "bridge" and isinstance(bridges, dict) and name not in bridges:
                raise ValueError(
                    f"rules.{rname}.actions[{i}]: no [bridges.mqtt.{name}] configured"
                )
            if kind in ("postgresql", "redis", "rabbitmq", "influxdb") and connectors is not None \
                    and name not in getattr(connectors, kind):
                raise ValueError(
                    f"rules.{rname}.actions[{i}]: no [connectors.{kind}.{name}] configured"
                )
    return value


# the root schema's field type: declared after ``webhooks``, it checks the references
RuleEngineField = Annotated[RuleEngineConfig, AfterValidator(_refs_ok)]
