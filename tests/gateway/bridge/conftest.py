"""Fixtures of the bridge tests: ``procs`` stops every process and client a test
registered, and prints their logs when the test failed."""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


class Procs:
    def __init__(self) -> None:
        self.things: list[Any] = []

    def add(self, thing: Any) -> Any:
        self.things.append(thing)
        return thing


@pytest.fixture
def procs(request: pytest.FixtureRequest) -> Generator[Procs, None, None]:
    p = Procs()
    yield p
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for t in p.things:
            log = getattr(t, "log", None)
            if callable(log):
                print(f"===== {type(t).__name__} log =====\n{log()[-20000:]}")
    for t in reversed(p.things):
        for method in ("close", "stop"):
            fn = getattr(t, method, None)
            if fn is not None:
                with contextlib.suppress(Exception):
                    fn()
                break
