"""SenML JSON and CBOR (LwM2M 1.1): property round trips of resource values and of the
path lists of composite operations (hypothesis), and the format choice's invariants."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.lwm2m import content
from protocols.lwm2m.formats import MULTI, SENML, candidates

ids = st.integers(min_value=0, max_value=65534).map(str)
resource_paths = st.lists(ids, min_size=3, max_size=4).map(lambda p: "/" + "/".join(p))
values = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
entries = st.dictionaries(resource_paths, values, min_size=1, max_size=12).map(
    lambda d: [{"path": p, "value": v} for p, v in d.items()])


@settings(max_examples=300, deadline=None)
@given(entries, st.booleans())
def test_senml_round_trip(items: list[dict[str, Any]], cbor: bool) -> None:
    raw = content.encode_senml(items, "/", cbor=cbor)
    fmt = content.SENML_CBOR if cbor else content.SENML_JSON
    back = content.decode(fmt, raw, "/")
    assert back == items
    for a, b in zip(back, items, strict=True):
        assert type(a["value"]) is type(b["value"])  # 1 stays 1, 1.0 stays 1.0, True


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(ids, min_size=1, max_size=4), min_size=1, max_size=10),
       st.booleans(), st.booleans())
def test_composite_paths_round_trip(paths: list[list[str]], cbor: bool, slashes: bool
                                    ) -> None:
    given_paths = [("/" if slashes else "") + "/".join(p) + ("/" if slashes else "")
                   for p in paths]
    raw = content.encode_senml_names(given_paths, cbor=cbor)
    fmt = content.SENML_CBOR if cbor else content.SENML_JSON
    back = content.decode(fmt, raw, "/")
    assert [e["path"] for e in back] == ["/" + "/".join(p) for p in paths]
    assert all(e["value"] is None for e in back)


@pytest.mark.parametrize("bad", ["", "/", "/3/a", "/1/2/3/4/5", "x"])
def test_composite_paths_refused(bad: str) -> None:
    with pytest.raises(content.ContentError):
        content.encode_senml_names(["/3/0", bad])


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["1.0", "1.1", "1.2", ""]),
       st.lists(st.sampled_from([0, 40, 42, 110, 112, 11542, 11543, 60]), max_size=6),
       st.one_of(st.none(), st.sampled_from(MULTI)), st.booleans())
def test_candidates_invariants(version: str, listed: list[int], learned: int | None,
                               composite: bool) -> None:
    out = candidates(version, listed, learned, composite=composite)
    assert out and len(out) == len(set(out))
    assert set(out) <= set(SENML if composite else MULTI)
    if learned is not None and (not composite or learned in SENML):
        assert out[0] == learned
