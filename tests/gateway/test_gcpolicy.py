"""gatewayd's garbage-collector policy: survivors of a full collection are frozen, cycles
among them wait for a full collection that walks everything, and closing leaves the
collector as it was."""

from __future__ import annotations

import gc
import weakref

from gateway import gcpolicy
from gateway.gcpolicy import GcPolicy


class Cell:
    """A tracked object that can point at itself (a garbage cycle once dropped)."""

    other: object = None


def cycle() -> tuple[Cell, weakref.ref[Cell]]:
    cell = Cell()
    cell.other = cell
    return cell, weakref.ref(cell)


def test_survivors_of_a_full_collection_are_frozen_and_later_ones_skip_them() -> None:
    policy = GcPolicy(thaw_every=3600)
    policy.install()
    try:
        kept, kept_ref = cycle()
        gc.collect()
        assert policy.full == 1 and policy.thaws == 0 and policy.longest > 0
        assert gc.get_freeze_count() > 0
        del kept
        gc.collect()  # frozen: this full collection does not walk it
        assert kept_ref() is not None
        young, young_ref = cycle()  # made after the freeze: collected as usual
        del young
        gc.collect()
        assert young_ref() is None
        policy.thaw_every = 0  # time for a full collection of everything
        gc.collect()
        assert kept_ref() is None and policy.thaws == 1
        assert gc.get_freeze_count() > 0  # its survivors, frozen again
        assert gcpolicy.ACTIVE is policy and policy.seconds >= policy.longest
    finally:
        policy.close()
    assert gc.get_freeze_count() == 0 and policy._on_gc not in gc.callbacks
    assert gcpolicy.ACTIVE is None

