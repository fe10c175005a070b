"""Fixtures for the multi-node tests: one PKI per session (our CLI), and a factory of
gatewayd nodes that stops them all at the end and prints their logs when a test fails."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.cluster.harness import Node, make_pki

NAMES = [f"{n}@127.0.0.1" for n in "abcde"]


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"), NAMES)


@pytest.fixture
def nodes(tmp_path: Path, pki: Path, request: pytest.FixtureRequest
          ) -> Iterator[Callable[..., Node]]:
    made: list[Node] = []

    def make(short: str, **kwargs: Any) -> Node:
        node = Node(tmp_path, short, kwargs.pop("pki", pki), **kwargs)
        made.append(node)
        return node.start()

    yield make
    for node in made:
        node.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for node in made:
            print(f"----- {node.name} -----\n{node.log()[-6000:]}")


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, "rep_" + rep.when, rep)
