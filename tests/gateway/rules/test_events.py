"""gateway/rules/events.py: message ids."""

from __future__ import annotations

import gc

from gateway.rules.events import message_id
from protocols.context import Message


def test_ids_are_unique_even_when_python_reuses_the_object_address() -> None:
    seen: set[str] = set()
    addresses: set[int] = set()
    for i in range(2000):
        m = Message("t", b"x", 1, timestamp=1_700_000_000.0)  # one millisecond for all
        addresses.add(id(m))
        seen.add(message_id(m))
        del m
        if i % 100 == 0:
            gc.collect()
    assert len(addresses) < 2000  # the situation that broke the old id: addresses reused
    assert len(seen) == 2000


def test_one_message_keeps_its_id_and_it_is_emqx_shaped() -> None:
    m = Message("t", b"x", 2, timestamp=1_700_000_000.0)
    first = message_id(m)
    message_id(Message("u", b"y"))  # another message in between
    assert message_id(m) == first
    assert len(first) == 32 and int(first, 16) >= 0
