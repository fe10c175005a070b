from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.gateway.admin.gatewayd import Client, Gatewayd

# rules given the way a configuration file gives them (as GATEWAY_* TOML values)
CONFIG_RULES = {
    "GATEWAY_RULE_ENGINE__RULES__HIGH_TEMP__SQL":
        'SELECT payload.t AS t, clientid, payload.unit AS unit FROM "sensors/+/temp" '
        "WHERE payload.t > 30",
    "GATEWAY_RULE_ENGINE__RULES__HIGH_TEMP__ACTIONS":
        '[{function = "republish", args = {topic = "alerts/${clientid}", payload = "${t}", '
        'qos = 1, retain = false, user_properties = {unit = "${unit}", src = "rule"}}}, '
        '{function = "console"}]',
    "GATEWAY_RULE_ENGINE__RULES__SPLIT__SQL":
        'FOREACH payload.sensors AS s DO s.name AS name, s.value AS value, clientid '
        'INCASE s.value >= 10 FROM "batch/#"',
    "GATEWAY_RULE_ENGINE__RULES__SPLIT__ACTIONS":
        '[{function = "republish", args = {topic = "split/${name}", payload = ""}}]',
    "GATEWAY_RULE_ENGINE__RULES__LEVEL__SQL":
        "SELECT CASE WHEN payload.t > 30 THEN 'hot' WHEN payload.t > 15 THEN 'warm' "
        "ELSE 'cold' END AS level, topic FROM \"level/#\"",
    "GATEWAY_RULE_ENGINE__RULES__LEVEL__ACTIONS":
        '[{function = "republish", args = {topic = "levels/${level}", payload = "${topic}"}}]',
    "GATEWAY_RULE_ENGINE__RULES__DIV__SQL": 'SELECT 10 / payload.x AS v FROM "div/#"',
    "GATEWAY_RULE_ENGINE__RULES__DIV__ACTIONS":
        '[{function = "republish", args = {topic = "divout", payload = "${v}"}}]',
}


@pytest.fixture(scope="module")
def gatewayd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gatewayd]:
    gw = Gatewayd(tmp_path_factory.mktemp("rules"), dict(CONFIG_RULES))
    gw.start()
    yield gw
    gw.stop()


def event_rules(**sqls: str) -> dict[str, str]:
    """GATEWAY_* settings for rules that republish what each SQL selects (as JSON) to
    ``<rule name>/${clientid}``: ``event_rules(dis='SELECT ... FROM "$events/..."')``."""
    env = {}
    for name, sql in sqls.items():
        key = f"GATEWAY_RULE_ENGINE__RULES__{name.upper()}"
        env[f"{key}__SQL"] = sql
        topic = name + "/${clientid}"
        env[f"{key}__ACTIONS"] = (
            '[{function = "republish", args = {topic = "' + topic + '", payload = ""}}]')
    return env


def event_watcher(gw: Gatewayd, *names: str) -> Client:
    """A client subscribed to the topics of :func:`event_rules`' rules ``names``."""
    w = Client(gw, f"watch-{time.monotonic_ns()}")
    for name in names:
        w.subscribe(f"{name}/#", 0)
    return w


def event(w: Client, topic: str) -> dict[str, Any]:
    """The next event a rule of :func:`event_rules` republished to ``topic``."""
    out: dict[str, Any] = json.loads(w.wait_for(topic).payload)
    return out
