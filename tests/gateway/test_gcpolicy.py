"""gatewayd's garbage-collector policy: survivors of a full collection are frozen, cycles
among them wait for the next thaw, and closing leaves the collector as it was."""

from __future__ import annotations

import asyncio
import gc
import weakref

from gateway.gcpolicy import GcPolicy


class Cell:
    """A tracked object that can point at itself (a garbage cycle once dropped)."""

    other: object = None


def cycle() -> tuple[Cell, weakref.ref[Cell]]:
    cell = Cell()
    cell.other = cell
    return cell, weakref.ref(cell)


def test_survivors_of_a_full_collection_are_frozen_and_a_thaw_collects_their_cycles() -> None:
    async def main() -> None:
        policy = GcPolicy(asyncio.get_running_loop())
        policy.install()
        try:
            kept, kept_ref = cycle()
            gc.collect()
            assert policy.full == 1 and policy.longest > 0
            assert gc.get_freeze_count() > 0
            del kept
            gc.collect()  # frozen: a full collection no longer walks it
            assert kept_ref() is not None
            young, young_ref = cycle()  # made after the freeze: collected as usual
            del young
            gc.collect()
            assert young_ref() is None
            policy.thaw()
            assert kept_ref() is None
            assert gc.get_freeze_count() > 0  # the thaw's survivors, frozen again
        finally:
            policy.close()
        assert gc.get_freeze_count() == 0 and policy._on_gc not in gc.callbacks

    asyncio.run(main())


def test_the_thaw_runs_on_its_timer() -> None:
    async def main() -> None:
        policy = GcPolicy(asyncio.get_running_loop(), thaw_every=0.0)
        freed = asyncio.Event()
        try:
            frozen, _ = cycle()
            weakref.finalize(frozen, freed.set)
            policy.install()  # frozen with the rest of what exists now
            del frozen
            gc.collect()
            assert not freed.is_set()
            await asyncio.wait_for(freed.wait(), 10)  # the timer's thaw found it
            assert policy.timer is not None  # and the next one is set
        finally:
            policy.close()
        assert policy.timer is None

    asyncio.run(main())
