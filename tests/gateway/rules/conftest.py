from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.admin.gatewayd import Gatewayd

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
