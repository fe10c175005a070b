"""Hypothesis strategies for every MQTT packet type at each protocol level.

``packets(level)`` draws ``(packet, from_client)``: a packet that the given side may
send at ``level`` and that holds only fields that level can carry (3.x packets use
neutral defaults for every 5.0-only field), so ``decode(encode(p)) == p`` must hold.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from protocols.mqtt.packets import (
    MQTT_5,
    NO_PROPERTIES,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from protocols.mqtt.properties import (
    ACK_PROPS,
    AUTH_PROPS,
    CONNACK_PROPS,
    CONNECT_PROPS,
    DISCONNECT_PROPS,
    PROPERTY_TABLE,
    PUBLISH_PROPS,
    SUBACK_PROPS,
    SUBSCRIBE_PROPS,
    UNSUBACK_PROPS,
    UNSUBSCRIBE_PROPS,
    VALUE_RANGES,
    WILL_PROPS,
)
from protocols.mqtt.rules import (
    AUTH_CODES,
    CONNACK_CODES,
    DISCONNECT_CODES,
    PUBACK_CODES,
    PUBREL_CODES,
    SUBACK_CODES,
    SUBACK_V3_CODES,
    UNSUBACK_CODES,
)

_CHARS = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
_LEVEL_CHARS = st.characters(exclude_categories=["Cs"], exclude_characters="\x00+#/")

texts = st.text(_CHARS, max_size=12)
topic_levels = st.text(_LEVEL_CHARS, max_size=6)
packet_ids = st.integers(1, 0xFFFF)
qos_levels = st.integers(0, 2)


def _not_shared(topic: str) -> bool:
    return not (topic.startswith("$share/") or topic.startswith("$queue/"))


topic_names = (
    st.lists(topic_levels, min_size=1, max_size=4).map("/".join).filter(bool).filter(_not_shared)
)
plain_filters = (
    st.builds(
        lambda levels, tail: "/".join(levels + (["#"] if tail else [])),
        st.lists(topic_levels | st.just("+"), max_size=4),
        st.booleans(),
    )
    .filter(bool)
    .filter(_not_shared)
)
share_groups = st.text(_LEVEL_CHARS, min_size=1, max_size=5)
shared_filters = st.builds(lambda g, f: f"$share/{g}/{f}", share_groups, plain_filters)
topic_filters = plain_filters | shared_filters


def _value(name: str, kind_max: int) -> st.SearchStrategy[Any]:
    low, high = VALUE_RANGES.get(name, (0, kind_max))
    return st.integers(low, high)


def _property_value(name: str, kind: int) -> st.SearchStrategy[Any]:
    # kinds as in protocols.mqtt.properties: BYTE, U16, U32, VARINT, STRING, BINARY, PAIR
    if name == "response_topic":
        return topic_names
    return [
        _value(name, 0xFF),
        _value(name, 0xFFFF),
        _value(name, 0xFFFF_FFFF),
        st.lists(_value(name, 0), min_size=1, max_size=3).map(tuple),
        texts,
        st.binary(max_size=10),
        st.lists(st.tuples(texts, texts), min_size=1, max_size=3).map(tuple),
    ][kind]


def properties(
    allowed: frozenset[int], *, max_subscription_ids: int = 3
) -> st.SearchStrategy[Properties]:
    """Properties holding any subset of the ``allowed`` identifiers, valid values only."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for pid, name, kind in PROPERTY_TABLE:
        if pid not in allowed:
            continue
        value = _property_value(name, kind)
        if name == "subscription_identifiers":
            if max_subscription_ids == 0:
                continue
            value = st.lists(
                st.integers(1, 268_435_455), min_size=1, max_size=max_subscription_ids
            ).map(tuple)
        fields[name] = value
    return st.builds(_build_properties, st.fixed_dictionaries({}, optional=fields))


def _build_properties(values: dict[str, Any]) -> Properties:
    if "authentication_data" in values and "authentication_method" not in values:
        values["authentication_method"] = "SCRAM"
    return Properties(**values) if values else NO_PROPERTIES


def _props(v5: bool, allowed: frozenset[int], **kwargs: int) -> st.SearchStrategy[Properties]:
    return properties(allowed, **kwargs) if v5 else st.just(NO_PROPERTIES)


def _codes(v5: bool, allowed: frozenset[int]) -> st.SearchStrategy[int]:
    return st.sampled_from(sorted(allowed)) if v5 else st.just(0)


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    v5 = level == MQTT_5
    username = draw(st.none() | texts)
    password = draw(st.none() | st.binary(max_size=10))
    if not v5 and username is None:
        password = None
    will = draw(
        st.none()
        | st.builds(
            Will,
            topic_names,
            st.binary(max_size=10),
            qos_levels,
            st.booleans(),
            _props(v5, WILL_PROPS),
        )
    )
    return Connect(
        draw(texts),
        level,
        draw(st.booleans()),
        draw(st.integers(0, 0xFFFF)),
        username,
        password,
        will,
        draw(_props(v5, CONNECT_PROPS)),
    )


@st.composite
def connacks(draw: st.DrawFn, level: int) -> ConnAck:
    v5 = level == MQTT_5
    code = draw(st.sampled_from(sorted(CONNACK_CODES)) if v5 else st.integers(0, 5))
    present = draw(st.booleans()) if code == 0 else False
    return ConnAck(present, code, draw(_props(v5, CONNACK_PROPS)))


@st.composite
def publishes(draw: st.DrawFn, level: int, from_client: bool) -> Publish:
    v5 = level == MQTT_5
    qos = draw(qos_levels)
    props = draw(_props(v5, PUBLISH_PROPS, max_subscription_ids=0 if from_client else 3))
    topic = draw(topic_names)
    if v5 and props.topic_alias is not None and draw(st.booleans()):
        topic = ""
    return Publish(
        topic,
        draw(st.binary(max_size=300)),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(packet_ids) if qos else None,
        props,
    )


@st.composite
def subscriptions(draw: st.DrawFn, level: int) -> Subscription:
    topic_filter = draw(topic_filters)
    if level != MQTT_5:
        return Subscription(topic_filter, draw(qos_levels))
    shared = topic_filter.startswith("$share/")
    return Subscription(
        topic_filter,
        draw(qos_levels),
        False if shared else draw(st.booleans()),
        draw(st.booleans()),
        draw(st.integers(0, 2)),
    )


def _acks(cls: Any, level: int, codes: frozenset[int]) -> st.SearchStrategy[Packet]:
    v5 = level == MQTT_5
    result: st.SearchStrategy[Packet] = st.builds(
        cls, packet_ids, _codes(v5, codes), _props(v5, ACK_PROPS)
    )
    return result


def client_packets(level: int) -> st.SearchStrategy[Packet]:
    v5 = level == MQTT_5
    options: list[st.SearchStrategy[Packet]] = [
        connects(level),
        publishes(level, from_client=True),
        _acks(PubAck, level, PUBACK_CODES),
        _acks(PubRec, level, PUBACK_CODES),
        _acks(PubRel, level, PUBREL_CODES),
        _acks(PubComp, level, PUBREL_CODES),
        st.builds(
            Subscribe,
            packet_ids,
            st.lists(subscriptions(level), min_size=1, max_size=3).map(tuple),
            _props(v5, SUBSCRIBE_PROPS, max_subscription_ids=1),
        ),
        st.builds(
            Unsubscribe,
            packet_ids,
            st.lists(topic_filters, min_size=1, max_size=3).map(tuple),
            _props(v5, UNSUBSCRIBE_PROPS),
        ),
        st.just(PingReq()),
        st.builds(Disconnect, _codes(v5, DISCONNECT_CODES), _props(v5, DISCONNECT_PROPS)),
    ]
    if v5:
        options.append(st.builds(Auth, _codes(v5, AUTH_CODES), _props(v5, AUTH_PROPS)))
    return st.one_of(options)


def server_packets(level: int) -> st.SearchStrategy[Packet]:
    v5 = level == MQTT_5
    suback_codes = SUBACK_CODES if v5 else SUBACK_V3_CODES
    options: list[st.SearchStrategy[Packet]] = [
        connacks(level),
        publishes(level, from_client=False),
        _acks(PubAck, level, PUBACK_CODES),
        _acks(PubRec, level, PUBACK_CODES),
        _acks(PubRel, level, PUBREL_CODES),
        _acks(PubComp, level, PUBREL_CODES),
        st.builds(
            SubAck,
            packet_ids,
            st.lists(st.sampled_from(sorted(suback_codes)), min_size=1, max_size=4).map(tuple),
            _props(v5, SUBACK_PROPS),
        ),
        st.builds(
            UnsubAck,
            packet_ids,
            (
                st.lists(st.sampled_from(sorted(UNSUBACK_CODES)), min_size=1, max_size=4)
                if v5
                else st.just([])
            ).map(tuple),
            _props(v5, UNSUBACK_PROPS),
        ),
        st.just(PingResp()),
    ]
    if v5:
        server_disconnect = DISCONNECT_PROPS - {0x11}  # MQTT-3.14.2-2
        options.append(
            st.builds(Disconnect, _codes(v5, DISCONNECT_CODES), _props(v5, server_disconnect))
        )
        options.append(st.builds(Auth, _codes(v5, AUTH_CODES), _props(v5, AUTH_PROPS)))
    return st.one_of(options)


def packets(level: int) -> st.SearchStrategy[tuple[Packet, bool]]:
    """``(packet, from_client)`` for either direction at ``level``."""
    return st.one_of(
        client_packets(level).map(lambda p: (p, True)),
        server_packets(level).map(lambda p: (p, False)),
    )
