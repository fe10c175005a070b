"""Topic names, topic filters and shared subscriptions."""

from __future__ import annotations

import pytest
from hypothesis import given

from protocols.mqtt.errors import RemoteProtocolError, Violation
from protocols.mqtt.topics import (
    is_shared,
    is_wildcard,
    parse_shared,
    validate_topic_filter,
    validate_topic_name,
)
from tests.protocols.mqtt.strategies import plain_filters, shared_filters, topic_names

VALID_NAMES = ["a", "a/b", "/", "a//b", "/a", "a/", "$SYS/broker", "sport/tennis player1", "€/ü"]
INVALID_NAMES = ["", "+", "#", "a/+", "a/#", "a+b", "a#"]


@pytest.mark.parametrize("name", VALID_NAMES)
def test_valid_topic_names(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize("name", INVALID_NAMES)
def test_invalid_topic_names(name: str) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        validate_topic_name(name)
    assert info.value.violation is Violation.TOPIC_NAME_INVALID


VALID_FILTERS = [
    "#",
    "+",
    "/",
    "a/#",
    "a/+/b",
    "+/+",
    "/+",
    "+/",
    "a//b",
    "sport/tennis/#",
    "$SYS/#",
    "$share",  # not a shared subscription, an ordinary filter
    "$share/g/a",
    "$share/g/#",
    "$share/g/+/b",
    "$share/g//",
    "$queue/a/+",
    "$sharex/a",
]
INVALID_FILTERS = [
    "",
    "a#",
    "#/a",
    "a/#/b",
    "a/b#",
    "a+",
    "+a",
    "a/+b/c",
    "##",
    "$share/g",
    "$share/g/",
    "$share//a",
    "$share/",
    "$share/g+/a",
    "$share/#/a",
    "$share/g/a#",
    "$queue/",
    "$queue/a/#/b",
]


@pytest.mark.parametrize("topic_filter", VALID_FILTERS)
def test_valid_filters(topic_filter: str) -> None:
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize("topic_filter", INVALID_FILTERS)
def test_invalid_filters(topic_filter: str) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        validate_topic_filter(topic_filter)
    assert info.value.violation is Violation.TOPIC_FILTER_INVALID


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("$share/g/a/b", ("g", "a/b")),
        ("$share/g/#", ("g", "#")),
        ("$share/group-1//", ("group-1", "/")),
        ("$queue/a/+", ("$queue", "a/+")),
        ("a/b", (None, "a/b")),
        ("$share", (None, "$share")),
        ("$SYS/#", (None, "$SYS/#")),
    ],
)
def test_parse_shared(topic_filter: str, expected: tuple[str | None, str]) -> None:
    assert parse_shared(topic_filter) == expected


@pytest.mark.parametrize("topic_filter", ["$share/g", "$share//a", "$share/g/", "$queue/"])
def test_parse_shared_refuses_incomplete_shares(topic_filter: str) -> None:
    with pytest.raises(RemoteProtocolError):
        parse_shared(topic_filter)


def test_is_wildcard_and_is_shared() -> None:
    assert is_wildcard("a/+") and is_wildcard("#") and is_wildcard("$share/g/a/#")
    assert not is_wildcard("a/b") and not is_wildcard("$share/g/a")
    assert is_shared("$share/g/a") and is_shared("$queue/a")
    assert not is_shared("$share") and not is_shared("a/$share/g")


@given(topic_names)
def test_generated_names_are_valid_names_and_filters(name: str) -> None:
    validate_topic_name(name)
    validate_topic_filter(name)
    assert not is_wildcard(name)


@given(plain_filters)
def test_generated_filters_are_valid(topic_filter: str) -> None:
    validate_topic_filter(topic_filter)
    assert parse_shared(topic_filter) == (None, topic_filter)


@given(shared_filters)
def test_generated_shared_filters_split(topic_filter: str) -> None:
    validate_topic_filter(topic_filter)
    group, real = parse_shared(topic_filter)
    assert group and f"$share/{group}/{real}" == topic_filter


def test_null_character_is_refused_in_names_and_filters() -> None:
    # Front-ends other than MQTT (MQTT-SN, CoAP) hand topics straight to these checks;
    # the broker's topic index refuses U+0000, so the checks must agree with it.
    import pytest

    from protocols.mqtt.errors import RemoteProtocolError
    from protocols.mqtt.topics import validate_topic_filter, validate_topic_name

    for bad in ("\x00", "a/\x00", "\x00\x00"):
        with pytest.raises(RemoteProtocolError):
            validate_topic_filter(bad)
        with pytest.raises(RemoteProtocolError):
            validate_topic_name(bad)
