"""LwM2M content formats: TLV round trips (hypothesis), decoders on known payloads."""

from __future__ import annotations

import base64
import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.lwm2m import content
from protocols.lwm2m.objects import ObjectModel

_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "Integer": st.integers(-(2**63), 2**63 - 1),
    "Time": st.integers(0, 2**40),
    "Float": st.floats(allow_nan=False),
    "Boolean": st.booleans(),
    "String": st.text(max_size=300),
    "Opaque": st.binary(max_size=300).map(lambda b: base64.b64encode(b).decode()),
    "Objlnk": st.tuples(st.integers(0, 65535), st.integers(0, 65535)).map(
        lambda t: f"{t[0]}:{t[1]}"),
}


@st.composite
def resources(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    used: set[int] = set()
    for _ in range(draw(st.integers(1, 6))):
        rid = draw(st.integers(0, 65535).filter(lambda r: r not in used))
        used.add(rid)
        typ = draw(st.sampled_from(sorted(_VALUES)))
        if draw(st.booleans()):
            for ri in draw(st.lists(st.integers(0, 300), min_size=1, max_size=3, unique=True)):
                out.append({"path": f"/9/0/{rid}/{ri}", "value": draw(_VALUES[typ]),
                            "type": typ})
        else:
            out.append({"path": f"/9/0/{rid}", "value": draw(_VALUES[typ]), "type": typ})
    return out


@settings(max_examples=200, deadline=None)
@given(resources(), st.booleans())
def test_tlv_round_trip(entries: list[dict[str, Any]], whole_object: bool) -> None:
    types = {"/".join(e["path"].split("/")[:4]): e["type"] for e in entries}
    raw = content.encode_tlv(entries, "/9" if whole_object else "/9/0")
    got = content.decode_tlv(raw, "/9" if whole_object else "/9/0", types.get)
    # multiple-resource instances are grouped after single resources by the encoder
    key = lambda e: e["path"]  # noqa: E731
    assert sorted(got, key=key) == sorted(
        ({"path": e["path"], "value": e["value"]} for e in entries), key=key
    )


def test_tlv_spec_example() -> None:
    # LwM2M 1.0 TS 6.4.3.1 example: device object instance fragments
    raw = bytes.fromhex("C800144F70656E204D6F62696C6520416C6C69616E6365")
    model = ObjectModel.shipped()
    assert content.decode_tlv(raw, "/3/0", model.type_of) == [
        {"path": "/3/0/0", "value": "Open Mobile Alliance"}
    ]
    multi = bytes.fromhex("86 06 41 00 01 41 01 05".replace(" ", ""))
    assert content.decode_tlv(multi, "/3/0", model.type_of) == [
        {"path": "/3/0/6/0", "value": 1}, {"path": "/3/0/6/1", "value": 5}
    ]


@pytest.mark.parametrize("fmt", [content.TLV, content.SENML_JSON, content.SENML_CBOR,
                                 content.OMA_JSON, content.TEXT, content.LINK_FORMAT])
@pytest.mark.parametrize("raw", [b"\xff", b"\xc8\x00\x14ab", b"[{", b"{\"e\": 3}", b"\x80"])
def test_malformed_raises_content_error_only(fmt: int, raw: bytes) -> None:
    with contextlib.suppress(content.ContentError):
        content.decode(fmt, raw, "/3/0/9", ObjectModel.shipped().type_of)


def test_links() -> None:
    assert content.parse_links(b'</>;rt="oma.lwm2m";ct="60 110",</3/0>') == [
        ("/", {"rt": "oma.lwm2m", "ct": "60 110"}), ("/3/0", {})
    ]
    with pytest.raises(content.ContentError):
        content.parse_links(b"3/0")


def test_object_model_core_objects() -> None:
    m = ObjectModel.shipped()
    assert sorted(m.objects) == list(range(8))
    assert m.objects[3].name == "Device" and m.resource("/3/0/4").operations == "E"
    assert m.type_of("/5/0/0") == "Opaque" and m.type_of("/99/0/0") is None


def test_unknown_resources_printable_text_else_base64() -> None:
    raw = content.tlv_header(content.RESOURCE, 1, 1) + b"7" + content.tlv_header(
        content.RESOURCE, 3, 4) + b"\x00\x00\x00\x00"
    assert content.decode_tlv(raw, "/31024/13") == [
        {"path": "/31024/13/1", "value": "7"}, {"path": "/31024/13/3", "value": "AAAAAA=="}
    ]
