"""Scenario files: the shipped ones validate; bad ones give one line naming file, field
and line; overrides apply before validation."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from hil.scenario import load_scenario, shipped
from hil.yamlmarks import BadInput

GOOD = textwrap.dedent("""\
    name: t
    duration: 20s
    groups:
      - name: a
        protocol: mqtt
        count: 3
        rate: 1
        qos: 1
    faults:
      - {kind: power-cut, at: 50%, off_for: 1s}
""")


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def test_every_shipped_scenario_validates() -> None:
    names = {p.stem for p in shipped()}
    assert {"smoke", "power-cut", "network", "bridge-outage", "disk-full", "soak"} <= names
    for p in shipped():
        sc = load_scenario(str(p))
        assert sc.name == p.stem


def test_smoke_covers_every_front_end_and_a_thousand_devices() -> None:
    sc = load_scenario("smoke")
    assert {g.protocol for g in sc.groups} == {"mqtt", "mqtt-sn", "coap", "lwm2m"}
    assert {g.mqtt_transport for g in sc.groups if g.protocol == "mqtt"} == {
        "tcp", "tls", "ws", "wss"}
    assert {g.mqtt_version for g in sc.groups if g.protocol == "mqtt"} == {"3.1.1", "5.0"}
    assert sc.device_count >= 1000


@pytest.mark.parametrize(("edit", "line", "field", "problem"), [
    (("    rate: 1", "    rate: -1"), 7, "groups.0.rate", "greater than or equal"),
    (("    qos: 1", "    qos: 3"), 8, "groups.0.qos", "less than or equal"),
    (("    count: 3", "    count: 3\n    colour: red"), 7, "groups.0.colour",
     "unknown field"),
    (("    protocol: mqtt", "    protocol: amqp"), 5, "groups.0.protocol", "Input should"),
    (("{kind: power-cut, at: 50%, off_for: 1s}", "{kind: meteor, at: 50%}"), 10, "faults.0",
     "kind"),
    (("at: 50%", "at: 99%"), 10, "faults.0.at", "after duration"),  # ends after duration
    (("duration: 20s", "duration: soon"), 2, "duration", "duration"),
    (("name: t\n", ""), 1, "name", "required field missing"),
])
def test_bad_field_names_file_field_and_line(tmp_path: Path, edit: tuple[str, str],
                                             line: int, field: str, problem: str) -> None:
    p = write(tmp_path, GOOD.replace(*edit))
    with pytest.raises(BadInput) as e:
        load_scenario(str(p))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{p}:{line}: "), msg
    assert field in msg and problem.lower() in msg.lower(), msg


def test_not_yaml_names_the_line(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD + "  - [unclosed\n")
    with pytest.raises(BadInput) as e:
        load_scenario(str(p))
    assert str(e.value).startswith(f"{p}:") and "not YAML" in str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="No such file"):
        load_scenario(str(tmp_path / "none.yaml"))


def test_overrides_apply_before_validation(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD)
    sc = load_scenario(str(p), ["duration=40s", "groups.a.count=7", "expect.rss_max=1MB"])
    assert sc.duration == 40 and sc.groups[0].count == 7 and sc.expect.rss_max == 1 << 20
    assert sc.faults[0].start(sc.duration) == 20.0  # 50 % of the new duration
    with pytest.raises(BadInput, match=r"groups\.nope"):
        load_scenario(str(p), ["groups.nope.count=1"])
    with pytest.raises(BadInput, match=r"groups\.0\.count"):
        load_scenario(str(p), ["groups.a.count=0"])


def test_protocol_rules(tmp_path: Path) -> None:
    bad = GOOD.replace("protocol: mqtt", "protocol: coap").replace(
        "qos: 1", "qos: 1\n    session: persistent")
    with pytest.raises(BadInput, match="cannot be persistent"):
        load_scenario(str(write(tmp_path, bad)))
    bad = GOOD.replace("protocol: mqtt", "protocol: mqtt-sn\n    transport: tls")
    with pytest.raises(BadInput, match="mqtt groups only"):
        load_scenario(str(write(tmp_path, bad)))


_values = st.one_of(st.integers(-5, 5000), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=8), st.booleans(), st.none())
_fields = st.sampled_from(["count", "rate", "payload", "qos", "session", "version",
                           "transport", "keepalive", "protocol", "name", "bogus"])


@given(st.dictionaries(_fields, _values, max_size=4))
def test_any_group_edit_either_validates_or_names_a_line(edits: dict[str, object]) -> None:
    import tempfile

    data = yaml.safe_load(GOOD)
    data["groups"][0].update(edits)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "s.yaml"
        p.write_text(yaml.safe_dump(data, sort_keys=False))
        try:
            load_scenario(str(p))
        except BadInput as e:
            assert e.line is not None and e.line >= 1
            assert "\n" not in str(e) and e.field


def test_disabled_groups_are_left_out(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace("  - name: a\n", "  - name: b\n    protocol: coap\n"
                                      "    count: 5\n  - name: a\n"))
    sc = load_scenario(str(p), ["groups.b.enable=false"])
    assert [g.name for g in sc.active] == ["a"] and sc.device_count == 3
    with pytest.raises(BadInput, match="every group is disabled"):
        load_scenario(str(p), ["groups.b.enable=false", "groups.a.enable=false"])
