"""Hypothesis strategies for every MQTT-SN 1.2 message."""

from __future__ import annotations

from hypothesis import strategies as st

from protocols.mqttsn.packets import (
    NORMAL,
    PREDEFINED,
    SHORT,
    Advertise,
    ConnAck,
    Connect,
    Disconnect,
    Encapsulated,
    GwInfo,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    RegAck,
    Register,
    SearchGw,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    WillMsg,
    WillMsgReq,
    WillMsgResp,
    WillMsgUpd,
    WillTopic,
    WillTopicReq,
    WillTopicResp,
    WillTopicUpd,
)

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
qos = st.sampled_from([-1, 0, 1, 2])
text = st.text(min_size=1, max_size=40)
short = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=2, max_size=2
)
data = st.binary(max_size=600)  # past 255 bytes: the three-byte length header


@st.composite
def publish(draw: st.DrawFn) -> Publish:
    kind = draw(st.sampled_from([NORMAL, PREDEFINED, SHORT]))
    topic: int | str = draw(short) if kind == SHORT else draw(u16)
    return Publish(
        topic, draw(data), draw(qos), draw(u16), draw(st.booleans()), draw(st.booleans()), kind
    )


@st.composite
def subscribe_like(draw: st.DrawFn, cls: type) -> Packet:
    kind = draw(st.sampled_from([NORMAL, PREDEFINED, SHORT]))
    topic: int | str
    if kind == SHORT:
        topic = draw(short)
    elif kind == PREDEFINED:
        topic = draw(u16)
    else:
        topic = draw(text)
    if cls is Subscribe:
        return Subscribe(draw(u16), topic, draw(qos), draw(st.booleans()), kind)
    return Unsubscribe(draw(u16), topic, kind)


def will_topic(cls: type) -> st.SearchStrategy[Packet]:
    return st.one_of(
        st.just(cls()),
        st.builds(cls, text, st.sampled_from([0, 1, 2]), st.booleans()),
    )


packets: st.SearchStrategy[Packet] = st.one_of(
    st.builds(Advertise, u8, u16),
    st.builds(SearchGw, u8),
    st.builds(GwInfo, u8, st.binary(max_size=16)),
    st.builds(Connect, st.text(max_size=23), u16, st.booleans(), st.booleans(), u8),
    st.builds(ConnAck, u8),
    st.just(WillTopicReq()),
    will_topic(WillTopic),
    st.just(WillMsgReq()),
    st.builds(WillMsg, data),
    st.builds(Register, u16, u16, text),
    st.builds(RegAck, u16, u16, u8),
    publish(),
    st.builds(PubAck, u16, u16, u8),
    st.builds(PubRec, u16),
    st.builds(PubRel, u16),
    st.builds(PubComp, u16),
    subscribe_like(Subscribe),
    st.builds(SubAck, u16, u16, st.sampled_from([-1, 0, 1, 2]), u8),
    subscribe_like(Unsubscribe),
    st.builds(UnsubAck, u16),
    st.builds(PingReq, st.one_of(st.none(), text)),
    st.just(PingResp()),
    st.builds(Disconnect, st.one_of(st.none(), u16)),
    will_topic(WillTopicUpd),
    st.builds(WillTopicResp, u8),
    st.builds(WillMsgUpd, data),
    st.builds(WillMsgResp, u8),
    st.builds(Encapsulated, st.integers(0, 3), st.binary(max_size=8), st.binary(min_size=2)),
)
