"""Configuration of EMQX's MQTT extensions (pydantic models, plain data).

Shapes (EMQX 5's names)::

    [auto_subscribe]
    [[auto_subscribe.topics]]
    topic = "cmd/${clientid}"
    qos = 1
    rh = 0      # retain handling
    rap = 0     # retain as published
    nl = 0      # no local

    [delayed]
    enable = true
    max_delayed_messages = 0    # 0: no limit

    [[rewrite]]
    action = "all"              # publish | subscribe | all
    source_topic = "x/#"
    dest_topic = "x/y/z/$1"
    re = "^x/y/(.+)$"

    [mqtt]
    exclusive_subscription = false

Every regular expression is compiled when the configuration loads, so a bad one is a
validation error naming the rule (``rewrite.1.re: rule 1 (source_topic 'x/#'): ...``) and
``gatewayd --check`` exits 2 on it. :mod:`gateway.config.schema` imports this module; it
imports nothing of the gateway at import time.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from gateway.config.values import _check_topic_filter

__all__ = ["AutoSubscribeConfig", "AutoSubscribeTopic", "DelayedConfig", "RewriteRule"]

# placeholders EMQX substitutes in auto-subscribe topics
AUTO_SUBSCRIBE_PLACEHOLDERS = ("${clientid}", "${username}", "${host}", "${port}")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _check_filter(value: str) -> str:
    return _check_topic_filter(value)


class AutoSubscribeTopic(_Section):
    """One topic the broker subscribes a client to when it connects."""

    topic: str = Field(min_length=1)
    qos: int = Field(default=0, ge=0, le=2)
    rh: int = Field(default=0, ge=0, le=2)
    rap: int = Field(default=0, ge=0, le=1)
    nl: int = Field(default=0, ge=0, le=1)

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        bare = value
        for p in AUTO_SUBSCRIBE_PLACEHOLDERS:
            bare = bare.replace(p, "x")
        if "${" in bare:
            known = ", ".join(AUTO_SUBSCRIBE_PLACEHOLDERS)
            raise ValueError(f"unknown placeholder in {value!r} (known: {known})")
        _check_filter(bare)
        return value


class AutoSubscribeConfig(_Section):
    topics: list[AutoSubscribeTopic] = Field(default_factory=list)


# EMQX 5's largest delay interval, seconds (~497 days); a larger number is a Unix time
MAX_DELAY_INTERVAL = 42949669


class DelayedConfig(_Section):
    enable: bool = True
    max_delayed_messages: int = Field(default=0, ge=0)


class RewriteRule(_Section):
    """One topic rewrite rule (EMQX 5's ``rewrite`` list; rules apply in order)."""

    action: Literal["publish", "subscribe", "all"] = "all"
    source_topic: str = Field(min_length=1)
    dest_topic: str = Field(min_length=1)
    re: str = Field(min_length=1)

    @field_validator("source_topic")
    @classmethod
    def _source(cls, value: str) -> str:
        return _check_filter(value)

    @field_validator("re")
    @classmethod
    def _regex(cls, value: str, info: ValidationInfo) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            source = info.data.get("source_topic", "?")
            raise ValueError(
                f"rule with source_topic {source!r}: bad regular expression {value!r}: {exc}"
            ) from None
        return value
