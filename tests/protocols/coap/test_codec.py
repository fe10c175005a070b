"""The CoAP codec: round trips (hypothesis) and malformed input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from protocols.coap.codec import CON, Code, Message, RemoteProtocolError, decode, encode, make
from tests.protocols.coap.strategies import messages


def _same(a: Message, b: Message) -> None:
    assert (a.mtype, a.code, a.mid, a.token, a.payload) == (b.mtype, b.code, b.mid, b.token,
                                                             b.payload)
    assert a.opt.uri_path == b.opt.uri_path and a.opt.uri_query == b.opt.uri_query
    assert a.opt.observe == b.opt.observe
    assert a.opt.block1 == b.opt.block1 and a.opt.block2 == b.opt.block2
    assert a.opt.content_format == b.opt.content_format


@settings(max_examples=300, deadline=None)
@given(messages())
def test_round_trip(m: Message) -> None:
    raw = encode(m)
    got = decode(raw)
    _same(got, m)
    assert encode(got) == raw


@pytest.mark.parametrize(
    ("raw", "has_header"),
    [
        (b"", False),
        (b"\x40\x01\x00", False),
        (b"\x49\x01\x00\x01", False),  # token length 9
        (b"\x80\x01\x00\x01", False),  # version 2
        (b"\x41\x01\x00\x07t\xd0", True),  # option extension missing
        (b"\x41\x01\x00\x07t\xf0", True),  # option nibble 15
        (b"\x40\x00\x00\x07\xff\x01", True),  # empty message with payload
        (b"\x40\x01\x00\x00\xe0\xff\xff", True),  # option number 65804 (found by the fuzz test)
    ],
)
def test_malformed(raw: bytes, has_header: bool) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode(raw)
    assert (info.value.mid is not None) is has_header


def test_make_sets_message_layer_fields() -> None:
    m = decode(encode(make(CON, Code.GET, 0xBEEF, b"tk")))
    assert m.mid == 0xBEEF and m.token == b"tk" and m.mtype == CON
