"""The authentication chain as hook subscribers: the deferred fold, the built-in database,
the HTTP service (fake transport, virtual clock: no sockets, no sleeps), the
``allow_anonymous`` fallback, and per-user authorization."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.auth.builtin import BuiltinAuthenticator
from gateway.auth.http import Answer, HttpAuthenticator, HttpAuthSettings, parse_response
from gateway.auth.user_rules import UserRulesAuthorizer
from gateway.core.authz import Authorizer, Rule
from gateway.core.clock import VirtualScheduler
from gateway.core.deferred import Deferred, fold_deferred
from gateway.core.hooks import Priority, Stop
from gateway.core.node import CoreSettings, Node
from gateway.store.db import db_path
from gateway.store.users import UserStore
from protocols.context import AUTH_PENDING, ClientInfo, Message, SubOptions

# ------------------------------------------------------------------------ fold_deferred


def test_fold_without_waiting_is_run_fold() -> None:
    calls = [lambda x, acc: None, lambda x, acc: (acc or 0) + x, lambda x, acc: Stop(acc * 10)]
    assert fold_deferred("t", calls, (2,), None, lambda r: pytest.fail("no wait")) == (True, 20)


def test_fold_waits_and_resumes_with_the_next_callback() -> None:
    d: Deferred[Any] = Deferred()
    seen: list[Any] = []
    calls = [lambda acc: d, lambda acc: Stop(("after", acc))]
    assert fold_deferred("t", calls, (), "start", seen.append) == (False, None)
    assert seen == []
    d.resolve(None)  # "ignore": the fold goes on with the accumulator unchanged
    assert seen == [("after", "start")]


def test_fold_stops_on_a_deferred_stop_and_survives_a_raising_callback() -> None:
    d: Deferred[Any] = Deferred()
    seen: list[Any] = []

    def boom(acc: Any) -> Any:
        raise RuntimeError("bug")

    calls = [boom, lambda acc: d, lambda acc: pytest.fail("not reached")]
    fold_deferred("t", calls, (), None, seen.append)
    d.resolve(Stop(0x86))
    d.resolve(Stop(0))  # a second resolution is ignored
    assert seen == [0x86]


def test_an_already_resolved_deferred_does_not_wait() -> None:
    d: Deferred[Any] = Deferred()
    d.resolve(Stop(7))
    assert fold_deferred("t", [lambda acc: d], (), None, lambda r: None) == (True, 7)


# ------------------------------------------------------------------------ node + fallback


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler()


def make_node(clock: VirtualScheduler, *, anonymous: bool) -> Node:
    return Node(CoreSettings(allow_anonymous=anonymous), clock)


def test_allow_anonymous_fallback_codes(clock: VirtualScheduler) -> None:
    open_node = make_node(clock, anonymous=True)
    assert open_node.authenticate(ClientInfo("a", username="x"), b"y") == 0
    closed = make_node(clock, anonymous=False)
    assert closed.authenticate(ClientInfo("a"), None) == 0x87  # presented nothing
    assert closed.authenticate(ClientInfo("a", username="x"), b"y") == 0x86  # unknown creds
    assert closed.authenticate(ClientInfo("a"), b"y") == 0x86
    assert closed.metrics.get("authentication.failure") == 3


def test_pending_without_done_is_refused_not_hung(clock: VirtualScheduler) -> None:
    node = make_node(clock, anonymous=True)
    node.hooks.add("client.authenticate", lambda c, p, acc: Deferred(), Priority.AUTHN)
    assert node.authenticate(ClientInfo("a"), None) == 0x88


# ------------------------------------------------------------------------ built-in database


@pytest.fixture
def store(tmp_path: Path) -> UserStore:
    store = UserStore.open(db_path(tmp_path))
    store.add("alice", "wonderland", iterations=4096)
    store.add("root", "toor", iterations=4096, superuser=True)
    return store


class ManualOffload:
    """Runs the job when the test says so (stands in for the worker thread)."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[[], Any], Callable[[Any], None]]] = []

    def __call__(self, fn: Callable[[], Any], done: Callable[[Any], None]) -> None:
        self.jobs.append((fn, done))

    def run_all(self) -> None:
        jobs, self.jobs = self.jobs, []
        for fn, done in jobs:
            done(fn())


def test_builtin_decisions(clock: VirtualScheduler, store: UserStore) -> None:
    node = make_node(clock, anonymous=False)
    node.hooks.add("client.authenticate", BuiltinAuthenticator(store), Priority.AUTHN)
    alice = ClientInfo("c", username="alice")
    assert node.authenticate(alice, b"wonderland") == 0
    assert alice.attrs == {"is_superuser": False, "authn": "builtin_db"}
    assert node.authenticate(ClientInfo("c", username="alice"), b"nope") == 0x86
    assert node.authenticate(ClientInfo("c", username="alice"), None) == 0x86
    root = ClientInfo("c", username="root")
    assert node.authenticate(root, b"toor") == 0 and root.attrs["is_superuser"]
    # unknown user: not decided by the database, so allow_anonymous (false) refuses
    assert node.authenticate(ClientInfo("c", username="bob"), b"x") == 0x86
    open_node = make_node(clock, anonymous=True)
    open_node.hooks.add("client.authenticate", BuiltinAuthenticator(store), Priority.AUTHN)
    assert open_node.authenticate(ClientInfo("c", username="bob"), b"x") == 0
    assert open_node.authenticate(ClientInfo("c", username="alice"), b"x") == 0x86


def test_builtin_hash_off_the_loop(clock: VirtualScheduler, store: UserStore) -> None:
    node = make_node(clock, anonymous=False)
    offload = ManualOffload()
    node.hooks.add("client.authenticate", BuiltinAuthenticator(store, offload), Priority.AUTHN)
    results: list[int] = []
    good = node.authenticate(ClientInfo("c", username="alice"), b"wonderland", results.append)
    bad = node.authenticate(ClientInfo("d", username="alice"), b"bad", results.append)
    assert good == bad == AUTH_PENDING
    assert results == []
    offload.run_all()
    assert results == [0, 0x86]


def test_builtin_refuses_when_too_many_hashes_are_pending(
    clock: VirtualScheduler, store: UserStore
) -> None:
    node = make_node(clock, anonymous=False)
    offload = ManualOffload()
    auth = BuiltinAuthenticator(store, offload, max_pending=2)
    node.hooks.add("client.authenticate", auth, Priority.AUTHN)
    for _ in range(2):
        node.authenticate(ClientInfo("c", username="alice"), b"wonderland", lambda code: None)
    assert node.authenticate(ClientInfo("c", username="alice"), b"x", lambda c: None) == 0x89
    offload.run_all()
    assert auth.pending == 0


def test_user_added_later_is_seen_without_restart(tmp_path: Path, clock: VirtualScheduler) -> None:
    gatewayd = UserStore.open(db_path(tmp_path))
    node = make_node(clock, anonymous=False)
    node.hooks.add("client.authenticate", BuiltinAuthenticator(gatewayd), Priority.AUTHN)
    assert node.authenticate(ClientInfo("c", username="new"), b"pw") == 0x86
    UserStore.open(db_path(tmp_path)).add("new", "pw", iterations=4096)  # gatewayctl
    assert node.authenticate(ClientInfo("c", username="new"), b"pw") == 0


# ------------------------------------------------------------------------ HTTP service


class FakePoster:
    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, Any], Callable[..., None]]] = []
        self.cancelled = 0

    def post(self, body: dict[str, Any], done: Callable[..., None]) -> Callable[[], None]:
        self.requests.append((body, done))

        def cancel() -> None:
            self.cancelled += 1

        return cancel

    def reply(self, status: int, body: Any = None, index: int = 0) -> None:
        data = json.dumps(body).encode() if body is not None else None
        self.requests.pop(index)[1](status, data, None)

    def fail(self, error: str, index: int = 0) -> None:
        self.requests.pop(index)[1](0, None, error)


def http_node(
    clock: VirtualScheduler, *, anonymous: bool = False, **settings: Any
) -> tuple[Node, FakePoster]:
    node = make_node(clock, anonymous=anonymous)
    poster = FakePoster()
    auth = HttpAuthenticator(
        HttpAuthSettings(url="http://x/auth", **settings), clock, poster, incr=node.metrics.incr
    )
    node.hooks.add("client.authenticate", auth, Priority.AUTHN)
    return node, poster


def ask(node: Node, client: ClientInfo, password: bytes | None = b"pw") -> list[int]:
    results: list[int] = []
    code = node.authenticate(client, password, results.append)
    if code != AUTH_PENDING:
        results.append(code)
    return results


def test_http_request_body_and_allow(clock: VirtualScheduler) -> None:
    node, poster = http_node(clock)
    client = ClientInfo("dev1", username="u1", peer_host="10.0.0.9")
    results = ask(node, client, b"s3cret")
    assert results == []
    assert poster.requests[0][0] == {
        "clientid": "dev1",
        "username": "u1",
        "password": "s3cret",
        "peerhost": "10.0.0.9",
        "protocol": "mqtt",
    }
    poster.reply(200, {"result": "allow", "is_superuser": True})
    assert results == [0] and client.attrs == {"is_superuser": True, "authn": "http"}


@pytest.mark.parametrize(
    "status, body, anonymous, expected",
    [
        (200, {"result": "deny"}, True, 0x86),
        (200, {"result": "ignore"}, False, 0x86),  # then allow_anonymous=false refuses
        (200, {"result": "ignore"}, True, 0),
        (200, {}, True, 0),  # no result: ignore
        (204, None, False, 0),
        (403, {"result": "allow"}, False, 0x86),  # 4xx: ignore, the body is not read
        (403, None, True, 0),
    ],
)
def test_http_answers(
    clock: VirtualScheduler, status: int, body: Any, anonymous: bool, expected: int
) -> None:
    node, poster = http_node(clock, anonymous=anonymous)
    results = ask(node, ClientInfo("c", username="u"))
    poster.reply(status, body)
    assert results == [expected]


@pytest.mark.parametrize("on_error, expected", [("ignore", 0), ("deny", 0x88)])
def test_http_timeout_per_on_error(clock: VirtualScheduler, on_error: str, expected: int) -> None:
    node, poster = http_node(clock, anonymous=True, on_error=on_error, request_timeout=2.0)
    results = ask(node, ClientInfo("c", username="u"))
    clock.advance(1.9)
    assert results == []
    clock.advance(0.1)
    assert results == [expected] and poster.cancelled == 1
    assert node.metrics.get("authentication.http.timeout") == 1
    poster.reply(200, {"result": "deny"})  # the late answer changes nothing
    assert results == [expected]


@pytest.mark.parametrize(
    "reply",
    [
        lambda p: p.reply(500, {"result": "allow"}),
        lambda p: p.fail("ConnectionRefusedError"),
        lambda p: p.requests.pop(0)[1](200, b"not json", None),
        lambda p: p.reply(200, {"result": "maybe"}),
        lambda p: p.reply(200, ["allow"]),
    ],
)
def test_http_errors_follow_on_error(clock: VirtualScheduler, reply: Callable[..., None]) -> None:
    node, poster = http_node(clock, anonymous=False, on_error="deny")
    results = ask(node, ClientInfo("c", username="u"))
    reply(poster)
    assert results == [0x88]
    assert node.metrics.get("authentication.http.error") == 1


def test_http_cache(clock: VirtualScheduler) -> None:
    node, poster = http_node(clock, cache_ttl=60.0)
    results = ask(node, ClientInfo("c", username="u"))
    poster.reply(200, {"result": "allow"})
    assert ask(node, ClientInfo("c", username="u")) == [0]  # from the cache, at once
    assert poster.requests == []
    assert node.metrics.get("authentication.http.cache_hit") == 1
    assert ask(node, ClientInfo("c", username="u"), b"other") == []  # other password: asked
    poster.reply(200, {"result": "deny"})
    assert ask(node, ClientInfo("c", username="u"), b"other") == [0x86]  # deny cached too
    clock.advance(60)
    assert ask(node, ClientInfo("c", username="u")) == []  # expired
    assert results == [0]


def test_http_ignore_and_errors_are_not_cached(clock: VirtualScheduler) -> None:
    node, poster = http_node(clock, anonymous=True)
    ask(node, ClientInfo("c", username="u"))
    poster.reply(200, {"result": "ignore"})
    ask(node, ClientInfo("c", username="u"))
    assert len(poster.requests) == 1


def test_http_cache_is_bounded(clock: VirtualScheduler) -> None:
    node, poster = http_node(clock, cache_max=2)
    for name in ("a", "b", "c"):
        ask(node, ClientInfo("c", username=name))
        poster.reply(200, {"result": "allow"})
    assert ask(node, ClientInfo("c", username="c")) == [0]
    assert ask(node, ClientInfo("c", username="a")) == []  # the oldest went


def test_http_identical_requests_in_flight_share_one(clock: VirtualScheduler) -> None:
    node, poster = http_node(clock, cache_ttl=0)
    one, two = ClientInfo("c", username="u"), ClientInfo("c", username="u")
    r1, r2 = ask(node, one), ask(node, two)
    assert len(poster.requests) == 1
    poster.reply(200, {"result": "allow", "is_superuser": False})
    assert r1 == r2 == [0]
    assert one.attrs["authn"] == two.attrs["authn"] == "http"


def test_chain_order_builtin_then_http(clock: VirtualScheduler, store: UserStore) -> None:
    node = make_node(clock, anonymous=False)
    node.hooks.add("client.authenticate", BuiltinAuthenticator(store), Priority.AUTHN)
    poster = FakePoster()
    node.hooks.add(
        "client.authenticate",
        HttpAuthenticator(HttpAuthSettings(url="http://x"), clock, poster),
        Priority.AUTHN,
    )
    assert ask(node, ClientInfo("c", username="alice"), b"wonderland") == [0]
    assert ask(node, ClientInfo("c", username="alice"), b"bad") == [0x86]
    assert poster.requests == []  # the database decided both: HTTP never asked
    results = ask(node, ClientInfo("c", username="remote"), b"pw")
    assert len(poster.requests) == 1
    poster.reply(200, {"result": "allow"})
    assert results == [0]


def test_body_template(clock: VirtualScheduler) -> None:
    node, poster = http_node(
        clock, body={"user": "${username}", "who": "${clientid}@${peerhost}", "fixed": "x"}
    )
    ask(node, ClientInfo("dev", username="u", peer_host="1.2.3.4"))
    assert poster.requests[0][0] == {"user": "u", "who": "dev@1.2.3.4", "fixed": "x"}


def test_parse_response_superuser_forms() -> None:
    assert parse_response(200, b'{"result":"allow","is_superuser":"true"}') == Answer("allow", True)
    assert parse_response(200, b'{"result":"deny","is_superuser":true}') == Answer("deny", False)


# ------------------------------------------------------------------------ authorization


def authz_node(clock: VirtualScheduler, store: UserStore | None, rules: list[Rule]) -> Node:
    node = Node(CoreSettings(), clock, authorizer=Authorizer(rules, "allow"))
    node.hooks.add("client.authorize", UserRulesAuthorizer(store), Priority.AUTHZ)
    return node


def authed(username: str | None, superuser: bool = False) -> ClientInfo:
    return ClientInfo(
        "c", username=username, attrs={"authn": "builtin_db", "is_superuser": superuser}
    )


def test_user_rules_come_before_the_rules_file(clock: VirtualScheduler, store: UserStore) -> None:
    file_rules = [Rule("deny", "publish", ("secret/#",)), Rule("allow", "all", ("#",))]
    node = authz_node(clock, store, file_rules)
    store.add_rule("alice", "allow", "publish", "secret/alice/#")
    store.add_rule("alice", "deny", "subscribe", "public/#")
    alice = authed("alice")
    assert node.authorize(alice, "publish", "secret/alice/x")  # her rule beats the file
    assert not node.authorize(alice, "publish", "secret/bob")  # no rule of hers: the file
    assert not node.authorize(alice, "subscribe", "$share/g/public/a")  # share stripped
    assert node.authorize(alice, "subscribe", "other")
    assert node.metrics.get("authorization.deny") == 2  # still counted by the node


def test_superuser_skips_authorization(clock: VirtualScheduler, store: UserStore) -> None:
    node = authz_node(clock, store, [Rule("deny", "all", ("#",))])
    assert node.authorize(authed("root", superuser=True), "publish", "anything")
    assert not node.authorize(authed("alice"), "publish", "anything")


def test_claimed_but_unauthenticated_user_gets_no_user_rules(
    clock: VirtualScheduler, store: UserStore
) -> None:
    node = authz_node(clock, store, [Rule("deny", "all", ("#",))])
    store.add_rule("alice", "allow", "all", "#")
    assert node.authorize(authed("alice"), "publish", "x")
    anonymous = ClientInfo("c", username="alice")  # allow_anonymous let it in, unverified
    assert not node.authorize(anonymous, "publish", "x")
    not_super = ClientInfo("c", username="root", attrs={"is_superuser": True})
    assert not node.authorize(not_super, "publish", "x")  # no backend said so


def test_a_will_is_authorized_as_its_client(clock: VirtualScheduler, store: UserStore) -> None:
    """A will goes out under its client's own authentication: her per-user rule allows
    what the rules file denies, and an unverified claim of her name does not."""
    from tests.gateway.core.test_node import FakeHandle

    node = authz_node(clock, store, [Rule("deny", "publish", ("lastwill/#",)),
                                     Rule("allow", "all", ("#",))])
    store.add_rule("alice", "allow", "publish", "lastwill/alice")
    watcher = ClientInfo("watcher")
    wh = FakeHandle()
    r = node.open_session(watcher, wh, clean_start=True, expiry_interval=0,
                          receive_maximum=10, will=None, will_delay=0)
    assert r.session is not None
    r.session.resume()
    node.subscribe(watcher, "lastwill/#", SubOptions(qos=0))
    for who, info in (("alice", authed("alice")), ("mallory", ClientInfo("c", username="alice"))):
        will = Message("lastwill/alice", who.encode(), 0, False, publisher="c", username="alice")
        h = FakeHandle()
        r = node.open_session(info, h, clean_start=True, expiry_interval=0, receive_maximum=10,
                              will=will, will_delay=0)
        assert r.session is not None
        r.session.resume()
        node.close(info, h, send_will=True)
    assert [d.message.payload for d in wh.delivered] == [b"alice"]
