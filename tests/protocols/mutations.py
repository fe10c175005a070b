"""Byte-level mutations of valid datagrams for the fuzz tests (CoAP, MQTT-SN).

``MUTATIONS`` draws up to four edits (flip a bit, set a byte, insert one, delete one) and
:func:`mutate` applies them; an edit other than insert is skipped on empty data. (The
MQTT stream fuzz test keeps its own variant, which turns an edit of empty data into an
insert.)
"""

from __future__ import annotations

from hypothesis import strategies as st

MUTATIONS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "set", "insert", "delete"]), st.integers(0), st.integers(0, 255)
    ),
    min_size=1,
    max_size=4,
)


def mutate(data: bytes, mutations: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, where, value in mutations:
        if not out and kind != "insert":
            continue
        i = where % (len(out) + (1 if kind == "insert" else 0))
        if kind == "flip":
            out[i] ^= 1 << (value % 8)
        elif kind == "set":
            out[i] = value
        elif kind == "insert":
            out.insert(i, value)
        else:
            del out[i]
    return bytes(out)
