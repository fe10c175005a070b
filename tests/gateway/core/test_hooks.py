"""Tests for gateway.core.hooks: registration, ordering, run and run_fold."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gateway.core.hooks import HOOK_NAMES, Hooks, Priority, Stop


def test_hook_names() -> None:
    assert {
        "client.connect",
        "client.connack",
        "client.connected",
        "client.disconnected",
        "client.authenticate",
        "client.authorize",
        "client.subscribe",
        "client.unsubscribe",
        "session.created",
        "session.subscribed",
        "session.unsubscribed",
        "session.resumed",
        "session.discarded",
        "session.takenover",
        "session.terminated",
        "message.publish",
        "message.delivered",
        "message.acked",
        "message.dropped",
        "topic.rewrite",
        "topic.authorize",
    } == HOOK_NAMES


def test_priorities_order() -> None:
    assert (
        Priority.HIGHEST
        > Priority.AUTHN
        > Priority.AUTHZ
        > Priority.RETAINER
        > Priority.NORMAL
        > Priority.LOWEST
    )
    assert int(Priority.NORMAL) == 0


def test_unknown_names_raise() -> None:
    hooks = Hooks()
    with pytest.raises(ValueError):
        hooks.add("client.connectd", print)
    with pytest.raises(ValueError):
        hooks.run("nope")
    with pytest.raises(ValueError):
        hooks.run_fold("nope", (), 1)
    with pytest.raises(ValueError):
        hooks.has("nope")
    with pytest.raises(ValueError):
        hooks.remove("nope", print)
    with pytest.raises(ValueError):
        hooks.callbacks("nope")


def test_extra_names() -> None:
    hooks = Hooks(extra_names=["gateway.custom"])
    assert "gateway.custom" in hooks.names
    calls: list[int] = []
    hooks.add("gateway.custom", lambda x: calls.append(x))
    hooks.run("gateway.custom", 3)
    assert calls == [3]
    assert "gateway.custom" not in Hooks().names


def test_has_and_empty_run() -> None:
    hooks = Hooks()
    assert not hooks.has("client.connect")
    hooks.run("client.connect", "x")  # nothing registered: nothing happens
    assert hooks.run_fold("client.authorize", ("c",), True) is True

    def cb(*args: Any) -> None:
        pass

    hooks.add("client.connect", cb)
    assert hooks.has("client.connect")
    assert not hooks.has("client.connected")
    assert hooks.remove("client.connect", cb)
    assert not hooks.has("client.connect")
    assert hooks.callbacks("client.connect") == ()


def test_run_order_by_priority_then_registration() -> None:
    hooks = Hooks()
    calls: list[str] = []

    def make(tag: str) -> Any:
        def cb(*args: Any) -> None:
            calls.append(tag)

        return cb

    hooks.add("message.publish", make("normal1"))
    hooks.add("message.publish", make("lowest"), Priority.LOWEST)
    hooks.add("message.publish", make("authz"), Priority.AUTHZ)
    hooks.add("message.publish", make("normal2"))
    hooks.add("message.publish", make("highest"), Priority.HIGHEST)
    hooks.add("message.publish", make("custom"), 850)
    hooks.add("message.publish", make("normal3"), Priority.NORMAL)
    hooks.run("message.publish")
    assert calls == ["highest", "custom", "authz", "normal1", "normal2", "normal3", "lowest"]


def test_run_passes_args() -> None:
    hooks = Hooks()
    got: list[tuple[Any, ...]] = []
    hooks.add("session.subscribed", lambda *a: got.append(a))
    hooks.run("session.subscribed", "client", "t/#", {"qos": 1})
    assert got == [("client", "t/#", {"qos": 1})]


def test_duplicate_registration_rejected_but_other_hooks_ok() -> None:
    hooks = Hooks()

    def cb(*args: Any) -> None:
        pass

    hooks.add("client.connect", cb)
    with pytest.raises(ValueError):
        hooks.add("client.connect", cb, Priority.HIGHEST)
    hooks.add("client.connected", cb)
    assert hooks.callbacks("client.connect") == (cb,)


def test_remove() -> None:
    hooks = Hooks()
    calls: list[str] = []

    def a(*args: Any) -> None:
        calls.append("a")

    def b(*args: Any) -> None:
        calls.append("b")

    hooks.add("client.connect", a)
    hooks.add("client.connect", b)
    assert not hooks.remove("client.connect", print)
    assert not hooks.remove("client.connected", a)
    assert hooks.remove("client.connect", a)
    assert not hooks.remove("client.connect", a)
    hooks.run("client.connect")
    assert calls == ["b"]
    hooks.add("client.connect", a)  # re-added: after b (registration order)
    calls.clear()
    hooks.run("client.connect")
    assert calls == ["b", "a"]


def test_bound_methods_can_be_removed() -> None:
    class Plugin:
        def __init__(self) -> None:
            self.n = 0

        def on_connect(self, *args: Any) -> None:
            self.n += 1

    hooks = Hooks()
    p = Plugin()
    hooks.add("client.connect", p.on_connect)
    hooks.run("client.connect")
    assert hooks.remove("client.connect", p.on_connect)
    hooks.run("client.connect")
    assert p.n == 1


def test_run_exception_is_logged_and_others_run(caplog: pytest.LogCaptureFixture) -> None:
    hooks = Hooks()
    calls: list[str] = []

    def boom(*args: Any) -> None:
        raise RuntimeError("kaput")

    hooks.add("client.connected", boom, Priority.HIGHEST)
    hooks.add("client.connected", lambda *a: calls.append("after"))
    with caplog.at_level(logging.ERROR, logger="gateway.core.hooks"):
        hooks.run("client.connected", "c1")
    assert calls == ["after"]
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert "client.connected" in record.getMessage()
    assert record.exc_info is not None


def test_mutation_during_run_uses_snapshot() -> None:
    hooks = Hooks()
    calls: list[str] = []

    def second(*args: Any) -> None:
        calls.append("second")

    def first(*args: Any) -> None:
        calls.append("first")
        hooks.remove("client.connect", second)
        hooks.add("client.connect", lambda *a: calls.append("late"))

    hooks.add("client.connect", first, Priority.HIGHEST)
    hooks.add("client.connect", second)
    hooks.run("client.connect")
    assert calls == ["first", "second"]
    calls.clear()
    hooks.remove("client.connect", first)
    hooks.run("client.connect")
    assert calls == ["late"]


# ---------------------------------------------------------------- run_fold


def test_fold_chains_accumulator() -> None:
    hooks = Hooks()
    hooks.add("message.publish", lambda msg: [*msg, "a"])
    hooks.add("message.publish", lambda msg: [*msg, "b"], Priority.LOWEST)
    hooks.add("message.publish", lambda msg: [*msg, "h"], Priority.HIGHEST)
    assert hooks.run_fold("message.publish", (), []) == ["h", "a", "b"]


def test_fold_gets_args_then_acc() -> None:
    hooks = Hooks()
    seen: list[tuple[Any, ...]] = []

    def cb(client: str, action: str, topic: str, acc: bool) -> bool:
        seen.append((client, action, topic, acc))
        return not acc

    hooks.add("client.authorize", cb)
    assert hooks.run_fold("client.authorize", ("c1", "publish", "t"), True) is False
    assert seen == [("c1", "publish", "t", True)]


def test_fold_none_means_unchanged() -> None:
    hooks = Hooks()
    hooks.add("client.authenticate", lambda client, pw, acc: None, Priority.HIGHEST)
    hooks.add("client.authenticate", lambda client, pw, acc: acc + 1)
    hooks.add("client.authenticate", lambda client, pw, acc: None, Priority.LOWEST)
    assert hooks.run_fold("client.authenticate", ("c", b"pw"), 1) == 2


def test_fold_stop_ends_chain() -> None:
    hooks = Hooks()
    calls: list[str] = []

    def deny(client: str, action: str, topic: str, acc: bool) -> Stop[bool]:
        calls.append("deny")
        return Stop(False)

    def later(client: str, action: str, topic: str, acc: bool) -> bool:
        calls.append("later")
        return True

    hooks.add("client.authorize", deny, Priority.AUTHZ)
    hooks.add("client.authorize", later)
    assert hooks.run_fold("client.authorize", ("c", "publish", "t"), True) is False
    assert calls == ["deny"]


def test_fold_stop_none_returns_none() -> None:
    hooks = Hooks()
    hooks.add("message.publish", lambda msg: Stop(None))
    assert hooks.run_fold("message.publish", (), "msg") is None


def test_fold_stop_keeps_value_after_changes() -> None:
    hooks = Hooks()
    hooks.add("message.publish", lambda acc: acc * 2, Priority.HIGHEST)
    hooks.add("message.publish", lambda acc: Stop(acc + 1))
    hooks.add("message.publish", lambda acc: acc * 100, Priority.LOWEST)
    assert hooks.run_fold("message.publish", (), 5) == 11


def test_fold_exception_keeps_acc_and_continues(caplog: pytest.LogCaptureFixture) -> None:
    hooks = Hooks()

    def boom(acc: int) -> int:
        raise ValueError("bad")

    hooks.add("message.publish", lambda acc: acc + 1, Priority.HIGHEST)
    hooks.add("message.publish", boom)
    hooks.add("message.publish", lambda acc: acc * 10, Priority.LOWEST)
    with caplog.at_level(logging.ERROR, logger="gateway.core.hooks"):
        assert hooks.run_fold("message.publish", (), 1) == 20
    assert len(caplog.records) == 1


def test_stop_repr_and_eq() -> None:
    assert Stop(1) == Stop(1)
    assert Stop(1) != Stop(2)
    assert Stop(1) != 1
    assert repr(Stop("x")) == "Stop('x')"
    assert hash(Stop(1)) == hash(Stop(1))
