"""Hypothesis strategies for CoAP messages (requests, responses, empty messages)."""

from __future__ import annotations

from hypothesis import strategies as st

from protocols.coap.codec import ACK, CON, NON, RST, Block, Code, Message, make

_segment = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    mtype = draw(st.sampled_from([CON, NON, ACK, RST]))
    code = draw(st.sampled_from([Code.GET, Code.POST, Code.PUT, Code.DELETE, Code.CONTENT,
                                 Code.CHANGED, Code.BAD_REQUEST, Code.CONTINUE]))
    m = make(mtype, code, draw(st.integers(0, 0xFFFF)), draw(st.binary(max_size=8)),
             draw(st.binary(max_size=64)))
    m.opt.uri_path = tuple(draw(st.lists(_segment, max_size=4)))
    m.opt.uri_query = tuple(draw(st.lists(_segment, max_size=3)))
    if draw(st.booleans()):
        m.opt.observe = draw(st.integers(0, (1 << 24) - 1))
    if draw(st.booleans()):
        m.opt.block1 = Block(draw(st.integers(0, (1 << 20) - 1)), draw(st.booleans()),
                             draw(st.integers(0, 6)))
    if draw(st.booleans()):
        m.opt.block2 = Block(draw(st.integers(0, (1 << 20) - 1)), draw(st.booleans()),
                             draw(st.integers(0, 6)))
    if draw(st.booleans()):
        m.opt.content_format = draw(st.integers(0, 0xFFFF))
    return m
