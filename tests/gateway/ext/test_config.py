"""The extensions' configuration: EMQX 5's names, defaults, and one-line errors."""

from __future__ import annotations

import pytest

from gateway.config.loader import ConfigError, load_config


def test_defaults() -> None:
    c = load_config(None, environ={})
    assert c.auto_subscribe.topics == [] and c.rewrite == []
    assert c.delayed.enable and c.delayed.max_delayed_messages == 0
    assert c.mqtt.exclusive_subscription is False


def test_from_the_environment() -> None:
    c = load_config(None, environ={
        "GATEWAY_AUTO_SUBSCRIBE__TOPICS": '[{topic = "c/${clientid}", qos = 2, rh = 1, nl = 1}]',
        "GATEWAY_DELAYED__MAX_DELAYED_MESSAGES": "10",
        "GATEWAY_MQTT__EXCLUSIVE_SUBSCRIPTION": "true",
    })
    (t,) = c.auto_subscribe.topics
    assert (t.topic, t.qos, t.rh, t.rap, t.nl) == ("c/${clientid}", 2, 1, 0, 1)
    assert c.delayed.max_delayed_messages == 10 and c.mqtt.exclusive_subscription


@pytest.mark.parametrize(("env", "expect"), [
    ({"GATEWAY_AUTO_SUBSCRIBE__TOPICS": '[{topic = "a/#/b"}]'},
     'auto_subscribe.topics[0].topic: "#" must be a whole level'),
    ({"GATEWAY_AUTO_SUBSCRIBE__TOPICS": '[{topic = "a/${nope}"}]'},
     "auto_subscribe.topics[0].topic: unknown placeholder"),
    ({"GATEWAY_AUTO_SUBSCRIBE__TOPICS": '[{topic = "a", qos = 3}]'},
     "auto_subscribe.topics[0].qos"),
    ({"GATEWAY_DELAYED__MAX_DELAYED_MESSAGES": "-1"}, "delayed.max_delayed_messages"),
    ({"GATEWAY_DELAYED__MAX": "1"}, "delayed.max"),
])
def test_bad_values_are_one_line_naming_the_key(env: dict[str, str], expect: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, environ=env)
    msg = str(err.value)
    assert expect in msg and "\n" not in msg, msg


def test_rewrite_rules_from_a_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "g.toml"
    f.write_text('[[rewrite]]\nsource_topic = "a/#"\ndest_topic = "b/$1"\nre = "^a/(.*)$"\n'
                 '[[rewrite]]\naction = "subscribe"\nsource_topic = "+/x"\ndest_topic = "y"\n'
                 're = "."\n')
    c = load_config(f, environ={})
    assert [(r.action, r.source_topic) for r in c.rewrite] == [("all", "a/#"), ("subscribe", "+/x")]
    f.write_text('[[rewrite]]\naction = "both"\nsource_topic = "a"\ndest_topic = "b"\nre = "."\n')
    with pytest.raises(ConfigError, match=r"rewrite\[0\]\.action"):
        load_config(f, environ={})
