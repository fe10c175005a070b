"""Scenarios: what devices do, which faults happen when, and what must hold (YAML).

A scenario file is data (docs/hil.md lists every field). Invariants the model enforces:
group names are unique and made of ``[a-z0-9-]``; ``payload`` is large enough for the
message id the rig writes into every payload; MQTT-only fields (``version``,
``transport``) are only set on MQTT groups; a fault's ``at`` is an absolute duration or a
percentage of ``duration`` and every fault ends before publishing stops; LwM2M and CoAP
sessions cannot be persistent (their front-ends keep no session after the peer goes).

``load_scenario(path, overrides)`` applies ``--set a.b=value`` overrides to the raw YAML
before validation (so CI can shorten ``duration`` or cut ``count``), then validates;
any problem raises :class:`hil.yamlmarks.BadInput` naming file, field and line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway.config.schema import Duration, Size
from hil import SCENARIO_DIR
from hil.yamlmarks import BadInput, from_validation, load

MIN_PAYLOAD = 64  # the JSON head: {"id":"<group>:<device>:<seq>","ts":<float>,...}
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Subscriptions(_Model):
    """Commands the rig sends each device of the group on ``hil/<run>/c/<device>``."""

    qos: int = Field(default=1, ge=0, le=2)
    rate: float = Field(default=0.1, ge=0, le=100)  # commands per device per second


class Group(_Model):
    name: str
    enable: bool = True  # false: the group is left out (e.g. a target without that port)
    protocol: Literal["mqtt", "mqtt-sn", "coap", "lwm2m"]
    count: int = Field(ge=1, le=100_000)
    rate: float = Field(default=0.2, ge=0, le=1000)  # messages per device per second
    payload: Size = Field(default=128)
    qos: int = Field(default=1, ge=0, le=2)
    session: Literal["clean", "persistent"] = "clean"
    subscriptions: Subscriptions | None = None
    version: Literal["3.1.1", "5.0"] | None = None  # MQTT only; default 5.0
    transport: Literal["tcp", "tls", "ws", "wss"] | None = None  # MQTT only; default tcp
    keepalive: Annotated[Duration, Field(ge=1, le=3600)] = 10.0

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError("expected 1-32 of a-z 0-9 - (starting with a letter or digit)")
        return v

    @field_validator("payload")
    @classmethod
    def _payload(cls, v: int) -> int:
        if not MIN_PAYLOAD <= v <= 1 << 20:
            raise ValueError(f"expected {MIN_PAYLOAD} to 1048576 bytes (the message id needs"
                             f" {MIN_PAYLOAD})")
        return v

    @model_validator(mode="after")
    def _protocol_fields(self) -> Group:
        if self.protocol != "mqtt" and (self.version or self.transport):
            raise ValueError("version and transport are for mqtt groups only")
        if self.protocol in ("coap", "lwm2m") and self.session == "persistent":
            raise ValueError(f"{self.protocol} sessions cannot be persistent")
        if self.protocol == "lwm2m" and self.qos:
            raise ValueError("lwm2m uplink is notifications: qos must be 0")
        return self

    @property
    def mqtt_version(self) -> str:
        return self.version or "5.0"

    @property
    def mqtt_transport(self) -> str:
        return self.transport or "tcp"


class _Fault(_Model):
    at: str | Duration  # "40%" of duration, or a duration from the start of publishing

    @field_validator("at", mode="before")
    @classmethod
    def _check_at(cls, v: object) -> object:
        if isinstance(v, str) and v.strip().endswith("%"):
            pct = float(v.strip()[:-1])
            if not 0 <= pct <= 100:
                raise ValueError("a percentage is 0% to 100%")
            return v.strip()
        return v

    def start(self, duration: float) -> float:
        if isinstance(self.at, str):
            return duration * float(self.at[:-1]) / 100.0
        return float(self.at)

    def length(self, duration: float) -> float:
        return 0.0


class PowerCut(_Fault):
    kind: Literal["power-cut"]
    off_for: Duration = 2.0

    def length(self, duration: float) -> float:
        return self.off_for


class ProcessKill(_Fault):
    kind: Literal["process-kill"]


class Network(_Fault):
    kind: Literal["network"]
    mode: Literal["loss", "delay", "partition"]
    for_: Annotated[Duration, Field(alias="for")] = 10.0
    loss: float = Field(default=10.0, ge=0, le=100)  # percent, mode loss
    delay: Duration = 0.2  # mode delay (needs sch_netem in the kernel)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def length(self, duration: float) -> float:
        return self.for_


class DiskFull(_Fault):
    kind: Literal["disk-full"]
    for_: Annotated[Duration, Field(alias="for")] = 10.0
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def length(self, duration: float) -> float:
        return self.for_


class UpstreamOutage(_Fault):
    kind: Literal["upstream-outage"]
    for_: Annotated[Duration, Field(alias="for")] = 10.0
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def length(self, duration: float) -> float:
        return self.for_


Fault = Annotated[
    PowerCut | ProcessKill | Network | DiskFull | UpstreamOutage, Field(discriminator="kind")
]


class Bridge(_Model):
    """Forward ``hil/<run>/t/#`` to a real mosquitto the rig runs as the upstream."""

    enable: bool = True
    qos: int = Field(default=1, ge=0, le=2)


class Expect(_Model):
    """Bounds checked from the records; ``null`` switches a check off."""

    no_acked_loss: bool = True
    no_qos2_duplicates: bool = True
    all_connected: bool = True  # every device connected within connect_timeout
    reconnect_p99: Duration | None = 30.0
    latency_p50: Duration | None = None
    latency_p95: Duration | None = None
    latency_p99: Duration | None = 5.0
    bridge_drain: Duration | None = None
    rss_max: Size | None = None
    unit_back: Duration | None = 60.0


class Scenario(_Model):
    name: str
    description: str = ""
    duration: Annotated[Duration, Field(gt=0)]
    settle: Duration = 15.0  # after publishing stops: time for deliveries and drains
    connect_timeout: Annotated[Duration, Field(gt=0)] = 60.0
    ramp: Duration = 5.0  # connects spread over this long
    groups: list[Group] = Field(min_length=1)
    faults: list[Fault] = Field(default_factory=list)
    bridge: Bridge | None = None
    expect: Expect = Field(default_factory=Expect)

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if not self.active:
            raise ValueError("groups: every group is disabled")
        names = [g.name for g in self.groups]
        for i, n in enumerate(names):
            if n in names[:i]:
                raise ValueError(f"groups.{i}.name: group name {n!r} used twice")
        for i, f in enumerate(self.faults):
            end = f.start(self.duration) + f.length(self.duration)
            if end > self.duration:
                raise ValueError(f"faults.{i}.at: the fault ends at {end:g}s, after "
                                 f"duration {self.duration:g}s")
            if f.kind == "upstream-outage" and not (self.bridge and self.bridge.enable):
                raise ValueError(f"faults.{i}.kind: an upstream-outage needs bridge.enable")
        if self.expect.bridge_drain is not None and not (self.bridge and self.bridge.enable):
            raise ValueError("expect.bridge_drain: needs bridge.enable")
        return self

    @property
    def active(self) -> list[Group]:
        """The groups that take part (``enable`` true)."""
        return [g for g in self.groups if g.enable]

    @property
    def device_count(self) -> int:
        return sum(g.count for g in self.active)


def _set(data: Any, dotted: str, raw: str) -> None:
    """Apply one ``a.b.c=value`` override; list items by index or by group ``name``."""
    parts = dotted.split(".")
    here = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(here, list):
            idx = next((j for j, it in enumerate(here)
                        if isinstance(it, dict) and it.get("name") == part), None)
            if idx is None and part.isdigit():
                idx = int(part)
            if idx is None or idx >= len(here):
                raise KeyError(dotted)
            if last:
                here[idx] = yaml.safe_load(raw)
            else:
                here = here[idx]
        elif isinstance(here, dict):
            if last:
                here[part] = yaml.safe_load(raw)
            else:
                here = here.setdefault(part, {})
        else:
            raise KeyError(dotted)


def resolve(name_or_path: str) -> Path:
    """A shipped scenario's name, or a path to a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return SCENARIO_DIR / f"{name_or_path}.yaml"


def load_scenario(name_or_path: str, overrides: list[str] | None = None) -> Scenario:
    path = resolve(name_or_path)
    data, lines = load(path)
    if not isinstance(data, dict):
        raise BadInput(path, 1, "", "expected a mapping (name, duration, groups, ...)")
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInput("--set", None, item, "expected FIELD=VALUE")
        try:
            _set(data, key, value)
        except (KeyError, yaml.YAMLError):
            raise BadInput("--set", None, key, "no such field to override") from None
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise from_validation(path, e, lines, data) from None


def shipped() -> list[Path]:
    return sorted(SCENARIO_DIR.glob("*.yaml"))
