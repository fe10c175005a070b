"""protocols.empties: the shared empty containers stay empty, and say so loudly."""

from __future__ import annotations

from collections import deque

import pytest

from protocols.empties import EMPTY_DEQUE, EMPTY_DICT, NOT_BUSY


def test_reads_work_as_on_an_empty_container() -> None:
    assert isinstance(EMPTY_DICT, dict) and isinstance(EMPTY_DEQUE, deque)
    assert isinstance(NOT_BUSY, list)
    assert EMPTY_DICT.get("x") is None and EMPTY_DICT.pop("x", 7) == 7 and not EMPTY_DICT
    assert list(EMPTY_DEQUE) == [] and len(NOT_BUSY) == 0
    assert EMPTY_DICT == {}  # a rare attribute's default compares equal to a new {}
    EMPTY_DICT.clear()
    EMPTY_DEQUE.clear()


@pytest.mark.parametrize(
    "write",
    [
        lambda: EMPTY_DICT.__setitem__("k", 1),
        lambda: EMPTY_DICT.setdefault("k", 1),
        lambda: EMPTY_DICT.update(k=1),
        lambda: EMPTY_DEQUE.append(1),
        lambda: EMPTY_DEQUE.appendleft(1),
        lambda: EMPTY_DEQUE.extend([1]),
        lambda: NOT_BUSY.append(1),
        lambda: NOT_BUSY.extend([1]),
    ],
)
def test_every_write_raises_and_leaves_it_empty(write: object) -> None:
    with pytest.raises(RuntimeError):
        write()  # type: ignore[operator]
    assert not EMPTY_DICT and not EMPTY_DEQUE and not NOT_BUSY


def test_a_compiled_channel_still_finds_effects_made_outside_an_entry_point() -> None:
    """Compiled, list.append is inlined past NotBusy.append: the channel finds such an
    effect in the shared list when its next entry point ends, and raises there."""
    from protocols.mqtt import channel

    list.append(NOT_BUSY, b"stray")  # what compiled code's append does
    with pytest.raises(RuntimeError, match="outside an entry point"):
        channel._effects_outside_an_entry_point()
    assert not NOT_BUSY
