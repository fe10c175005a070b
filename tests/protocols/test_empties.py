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



def test_a_channel_finds_an_effect_made_outside_an_entry_point() -> None:
    """Compiled, list.append is inlined past NotBusy.append and the effect lands in the
    shared list: the channel's next entry point raises when it ends, and empties it."""
    from gateway.core.clock import VirtualScheduler
    from gateway.core.node import CoreSettings, Node
    from protocols.mqtt.packets import PingReq
    from tests.protocols.mqtt.test_channel import client

    clock = VirtualScheduler()
    w = client(Node(CoreSettings(), clock), clock, "c")
    list.append(NOT_BUSY, b"stray")  # what compiled code's self._out.append does
    with pytest.raises(RuntimeError, match="outside an entry point"):
        w.send(PingReq())
    assert not NOT_BUSY
    w.send(PingReq())  # the next one is fine again
