"""Tests for gateway.core.authz: rule validation, matching and first-match-wins."""

from __future__ import annotations

import ipaddress
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.authz import Authorizer, Rule, from_config


def check(
    authz: Authorizer,
    action: str,
    topic: str,
    clientid: str = "c1",
    username: str | None = None,
    peer_ip: str | None = None,
) -> bool:
    return authz.check(
        action,  # type: ignore[arg-type]
        topic,
        clientid=clientid,
        username=username,
        peer_ip=peer_ip,
    )


# ---------------------------------------------------------------- Rule


def test_rule_normalizes_topics_and_network() -> None:
    r = Rule("allow", "all", ["a/#"], ipaddress="10.1.2.3/8")  # type: ignore[arg-type]
    assert r.topics == ("a/#",)
    assert r.ipaddress == ipaddress.ip_network("10.0.0.0/8")
    assert r.network == ipaddress.ip_network("10.0.0.0/8")
    single = Rule("allow", "all", ("a",), ipaddress="192.168.1.7")
    assert single.network == ipaddress.ip_network("192.168.1.7/32")
    v6 = Rule("allow", "all", ("a",), ipaddress=ipaddress.ip_network("fd00::/8"))
    assert v6.network == ipaddress.ip_network("fd00::/8")
    assert Rule("deny", "publish", ("a",)).network is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"permission": "maybe", "action": "all", "topics": ("a",)},
        {"permission": "allow", "action": "read", "topics": ("a",)},
        {"permission": "allow", "action": "all", "topics": ()},
        {"permission": "allow", "action": "all", "topics": ("a/#/b",)},
        {"permission": "allow", "action": "all", "topics": ("a+",)},
        {"permission": "allow", "action": "all", "topics": ("",)},
        {"permission": "allow", "action": "all", "topics": ("eq ",)},
        {"permission": "allow", "action": "all", "topics": ("${clientid}#",)},
        {"permission": "allow", "action": "all", "topics": ("a",), "ipaddress": "not-an-ip"},
    ],
)
def test_rule_rejects_invalid(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Rule(**kwargs)  # type: ignore[arg-type]


def test_rule_rejects_a_bare_string_for_topics() -> None:
    with pytest.raises(TypeError):
        Rule("allow", "all", "a/b")  # type: ignore[arg-type]


def test_rule_is_frozen() -> None:
    r = Rule("allow", "all", ("a",))
    with pytest.raises(AttributeError):
        r.permission = "deny"  # type: ignore[misc]


# ---------------------------------------------------------------- basics


@pytest.mark.parametrize("no_match", ["allow", "deny"])
def test_no_rules_uses_no_match(no_match: str) -> None:
    authz = Authorizer([], no_match)  # type: ignore[arg-type]
    assert authz.no_match == no_match
    assert check(authz, "publish", "a") is (no_match == "allow")
    assert check(authz, "subscribe", "#") is (no_match == "allow")


@pytest.mark.parametrize("no_match", ["allow", "deny"])
def test_unmatched_topic_uses_no_match(no_match: str) -> None:
    authz = Authorizer(
        [Rule("allow", "all", ("x/#",)), Rule("deny", "all", ("y/#",))],
        no_match,  # type: ignore[arg-type]
    )
    assert check(authz, "publish", "x/1") is True
    assert check(authz, "publish", "y/1") is False
    assert check(authz, "publish", "z/1") is (no_match == "allow")
    assert check(authz, "subscribe", "z/#") is (no_match == "allow")


def test_invalid_no_match_and_action() -> None:
    with pytest.raises(ValueError):
        Authorizer([], "maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        check(Authorizer([], "allow"), "all", "a")


def test_first_match_wins() -> None:
    authz = Authorizer(
        [
            Rule("deny", "publish", ("a/secret",)),
            Rule("allow", "all", ("a/#",)),
            Rule("deny", "all", ("#",)),
        ],
        "allow",
    )
    assert check(authz, "publish", "a/secret") is False
    assert check(authz, "subscribe", "a/secret") is True  # first rule is publish-only
    assert check(authz, "publish", "a/other") is True
    assert check(authz, "publish", "b") is False
    reordered = Authorizer(
        [Rule("allow", "all", ("a/#",)), Rule("deny", "publish", ("a/secret",))], "deny"
    )
    assert check(reordered, "publish", "a/secret") is True


def test_action_filtering() -> None:
    authz = Authorizer(
        [Rule("allow", "publish", ("p/#",)), Rule("allow", "subscribe", ("s/#",))], "deny"
    )
    assert check(authz, "publish", "p/1")
    assert not check(authz, "subscribe", "p/1")
    assert check(authz, "subscribe", "s/1")
    assert not check(authz, "publish", "s/1")


def test_any_of_several_topics() -> None:
    authz = Authorizer([Rule("allow", "all", ("a/+", "b/#", "eq c/#"))], "deny")
    assert check(authz, "publish", "a/1")
    assert check(authz, "publish", "b/1/2")
    assert check(authz, "subscribe", "c/#")
    assert not check(authz, "publish", "c/1")
    assert not check(authz, "publish", "d")


# ---------------------------------------------------------------- publish / subscribe


def test_publish_uses_topic_matching() -> None:
    authz = Authorizer([Rule("allow", "publish", ("a/+/c", "x/#"))], "deny")
    assert check(authz, "publish", "a/b/c")
    assert check(authz, "publish", "a//c")
    assert not check(authz, "publish", "a/b/d")
    assert check(authz, "publish", "x")
    assert check(authz, "publish", "x/y/z")


def test_subscribe_uses_coverage() -> None:
    authz = Authorizer([Rule("allow", "subscribe", ("a/#", "b/+"))], "deny")
    assert check(authz, "subscribe", "a/#")
    assert check(authz, "subscribe", "a/+/c")
    assert check(authz, "subscribe", "a")
    assert check(authz, "subscribe", "b/+")
    assert check(authz, "subscribe", "b/x")
    assert not check(authz, "subscribe", "b/#")  # b/# also matches b and b/x/y
    assert not check(authz, "subscribe", "#")
    assert not check(authz, "subscribe", "+/x")


def test_deny_rule_with_coverage_does_not_catch_wider_subscriptions() -> None:
    # A deny on "a/secret" does not apply to a subscription to "a/#": that is decided by
    # later rules (deny a/# explicitly, or deny "eq a/#", to stop it).
    authz = Authorizer([Rule("deny", "subscribe", ("a/secret",))], "allow")
    assert not check(authz, "subscribe", "a/secret")
    assert check(authz, "subscribe", "a/#")


# ---------------------------------------------------------------- eq


def test_eq_is_literal_for_subscribe_and_publish() -> None:
    authz = Authorizer([Rule("deny", "all", ("eq t/#",)), Rule("allow", "all", ("t/#",))], "deny")
    assert not check(authz, "subscribe", "t/#")
    assert check(authz, "subscribe", "t/+")
    assert check(authz, "subscribe", "t/1")
    assert check(authz, "publish", "t/1")


def test_eq_does_not_substitute_placeholders() -> None:
    authz = Authorizer([Rule("allow", "all", ("eq ${clientid}/x",))], "deny")
    assert not check(authz, "publish", "c1/x")
    assert check(authz, "publish", "${clientid}/x")


def test_eq_with_plain_topic() -> None:
    authz = Authorizer([Rule("allow", "publish", ("eq a/b",))], "deny")
    assert check(authz, "publish", "a/b")
    assert not check(authz, "publish", "a/b/c")


# ---------------------------------------------------------------- placeholders


def test_clientid_placeholder() -> None:
    authz = Authorizer([Rule("allow", "all", ("devices/${clientid}/#",))], "deny")
    assert check(authz, "publish", "devices/c1/temp", clientid="c1")
    assert not check(authz, "publish", "devices/c2/temp", clientid="c1")
    assert check(authz, "subscribe", "devices/c2/+", clientid="c2")
    assert not check(authz, "subscribe", "devices/+/x", clientid="c2")


def test_username_placeholder_and_missing_username() -> None:
    authz = Authorizer(
        [Rule("allow", "all", ("users/${username}/#",)), Rule("deny", "all", ("#",))], "allow"
    )
    assert check(authz, "publish", "users/bob/x", username="bob")
    assert not check(authz, "publish", "users/bob/x", username="alice")
    assert not check(authz, "publish", "users/bob/x", username=None)
    assert not check(authz, "publish", "users//x", username="")
    # a rule with ${username} does not match a client without one: falls through
    skip = Authorizer([Rule("deny", "all", ("users/${username}/#",))], "allow")
    assert check(skip, "publish", "users/x/y", username=None)


def test_both_placeholders_and_within_a_level() -> None:
    authz = Authorizer([Rule("allow", "all", ("t/${username}-${clientid}/+",))], "deny")
    assert check(authz, "publish", "t/bob-c1/x", clientid="c1", username="bob")
    assert not check(authz, "publish", "t/bob-c2/x", clientid="c1", username="bob")


def test_placeholder_value_with_wildcards_does_not_match() -> None:
    authz = Authorizer([Rule("allow", "all", ("${clientid}/#",))], "deny")
    assert not check(authz, "subscribe", "+/#", clientid="+")
    assert not check(authz, "subscribe", "#", clientid="#")
    assert not check(authz, "publish", "a/#/x", clientid="a/#")
    assert check(authz, "subscribe", "a/b/#", clientid="a/b")  # "/" is plain text


def test_placeholders_are_substituted_in_one_pass() -> None:
    authz = Authorizer([Rule("allow", "all", ("${clientid}/x",))], "deny")
    assert check(authz, "publish", "${username}/x", clientid="${username}", username="bob")
    assert not check(authz, "publish", "bob/x", clientid="${username}", username="bob")


def test_client_attrs_placeholder() -> None:
    authz = Authorizer(
        [Rule("allow", "all", ("sites/${client_attrs.site}/${clientid}/#",)),
         Rule("deny", "all", ("#",))], "allow"
    )

    def ok(action: str, topic: str, attrs: dict[str, str] | None) -> bool:
        return authz.check(action, topic, clientid="c1", username=None,  # type: ignore[arg-type]
                           peer_ip=None, client_attrs=attrs)

    assert ok("publish", "sites/s7/c1/t", {"site": "s7"})
    assert not ok("publish", "sites/s8/c1/t", {"site": "s7"})
    assert not ok("publish", "sites/s7/c1/t", None)  # no attributes: the rule is skipped
    assert not ok("publish", "sites/s7/c1/t", {"other": "s7"})
    assert not ok("publish", "sites//c1/t", {"site": ""})
    assert not ok("subscribe", "sites/+/c1/#", {"site": "+"})  # never a wildcard
    # one pass: an attribute holding a placeholder is plain text
    assert ok("publish", "sites/${clientid}/c1/x", {"site": "${clientid}"})
    assert not ok("publish", "sites/c1/c1/x", {"site": "${clientid}"})
    (compiled, _) = authz._compiled
    assert compiled.topics[0].parts == ("sites/", "${client_attrs.site}", "/",
                                        "${clientid}", "/#")


@pytest.mark.parametrize("topic", ["a/${client_attrs.x}#", "${client_attrs.}/+x"])
def test_client_attrs_placeholder_in_an_invalid_filter_is_refused(topic: str) -> None:
    with pytest.raises(ValueError, match="invalid topic filter"):
        Rule("allow", "all", (topic,))


def test_static_topics_are_precompiled() -> None:
    authz = Authorizer([Rule("allow", "all", ("a/#", "d/${clientid}", "eq x"))], "deny")
    (compiled,) = authz._compiled
    kinds = [(t.kind, t.text, t.parts) for t in compiled.topics]
    assert kinds == [
        (0, "a/#", ()),
        (2, "d/${clientid}", ("d/", "${clientid}")),
        (1, "x", ()),
    ]


# ---------------------------------------------------------------- who


def test_clientid_rule() -> None:
    authz = Authorizer([Rule("allow", "all", ("#",), clientid="admin")], "deny")
    assert check(authz, "subscribe", "#", clientid="admin")
    assert not check(authz, "subscribe", "#", clientid="other")


def test_username_rule() -> None:
    authz = Authorizer([Rule("deny", "all", ("#",), username="guest")], "allow")
    assert not check(authz, "publish", "a", username="guest")
    assert check(authz, "publish", "a", username="bob")
    assert check(authz, "publish", "a", username=None)


def test_cidr_rule() -> None:
    authz = Authorizer(
        [
            Rule("allow", "all", ("#",), ipaddress="10.0.0.0/8"),
            Rule("allow", "all", ("#",), ipaddress="fd00::/8"),
            Rule("allow", "all", ("local/#",), ipaddress="127.0.0.1"),
        ],
        "deny",
    )
    assert check(authz, "publish", "a", peer_ip="10.20.30.40")
    assert not check(authz, "publish", "a", peer_ip="11.0.0.1")
    assert check(authz, "publish", "a", peer_ip="fd12::1")
    assert check(authz, "publish", "a", peer_ip="::ffff:10.1.1.1")  # IPv4-mapped
    assert check(authz, "publish", "local/x", peer_ip="127.0.0.1")
    assert not check(authz, "publish", "local/x", peer_ip="127.0.0.2")
    assert not check(authz, "publish", "a", peer_ip=None)
    assert not check(authz, "publish", "a", peer_ip="garbage")
    assert not check(authz, "publish", "a", peer_ip="")


def test_several_who_fields_must_all_match() -> None:
    authz = Authorizer(
        [Rule("allow", "all", ("#",), clientid="c1", username="bob", ipaddress="10.0.0.0/8")],
        "deny",
    )
    assert check(authz, "publish", "a", clientid="c1", username="bob", peer_ip="10.0.0.1")
    assert not check(authz, "publish", "a", clientid="c1", username="bob", peer_ip="1.1.1.1")
    assert not check(authz, "publish", "a", clientid="c1", username="eve", peer_ip="10.0.0.1")
    assert not check(authz, "publish", "a", clientid="c2", username="bob", peer_ip="10.0.0.1")


# ---------------------------------------------------------------- $ topics


def test_dollar_topics_need_explicit_rules() -> None:
    authz = Authorizer([Rule("allow", "all", ("#",)), Rule("allow", "all", ("+/x",))], "deny")
    assert check(authz, "publish", "a/b")
    assert not check(authz, "publish", "$SYS/x")
    assert not check(authz, "subscribe", "$SYS/#")
    assert not check(authz, "subscribe", "$SYS/x")
    sys_rule = Authorizer([Rule("allow", "subscribe", ("$SYS/#",))], "deny")
    assert check(sys_rule, "subscribe", "$SYS/#")
    assert check(sys_rule, "subscribe", "$SYS/broker/+")
    assert not check(sys_rule, "subscribe", "#")


def test_deny_all_hash_does_not_cover_dollar_topics() -> None:
    authz = Authorizer([Rule("deny", "all", ("#",))], "allow")
    assert not check(authz, "publish", "a")
    assert check(authz, "subscribe", "$SYS/#")  # falls through to no_match


# ---------------------------------------------------------------- from_config


def test_from_config_attribute_objects_and_mappings() -> None:
    items = [
        SimpleNamespace(
            permission="allow",
            action="publish",
            topics=["a/#", "eq b"],
            clientid=None,
            username="bob",
            ipaddress=None,
        ),
        SimpleNamespace(
            permission="deny",
            action="all",
            topics=["#"],
            clientid=None,
            username=None,
            ipaddress="10.0.0.0/8",
        ),
        {"permission": "allow", "topics": ["x"]},
    ]
    rules = from_config(items)
    assert rules == [
        Rule("allow", "publish", ("a/#", "eq b"), username="bob"),
        Rule("deny", "all", ("#",), ipaddress="10.0.0.0/8"),
        Rule("allow", "all", ("x",)),
    ]
    assert rules[1].network == ipaddress.ip_network("10.0.0.0/8")


def test_from_config_rejects_invalid() -> None:
    with pytest.raises(ValueError):
        from_config([{"permission": "allow", "topics": ["a/#/b"]}])


def test_from_config_with_the_config_schema_model() -> None:
    schema = pytest.importorskip("gateway.config.schema")
    model = schema.AuthzRule(
        permission="allow", action="subscribe", topics=["d/${clientid}/#"], ipaddress="10.0.0.0/8"
    )
    (rule,) = from_config([model])
    assert rule == Rule("allow", "subscribe", ("d/${clientid}/#",), ipaddress="10.0.0.0/8")
    authz = Authorizer([rule], "deny")
    assert check(authz, "subscribe", "d/c1/+", clientid="c1", peer_ip="10.9.9.9")


@settings(max_examples=300)
@given(st.lists(st.sampled_from(["a", "/", "+", "#", "$", "{", "}", "${clientid}",
                                 "${username}", "${client_attrs.", "x}", "${client_attrs.k}"]),
                max_size=12))
def test_split_template_keeps_every_character(pieces: list[str]) -> None:
    """The template's parts put back together are the topic, and each part is either a
    known placeholder or text holding none."""
    from gateway.core.authz import _PLACEHOLDER_RE, _split_template

    topic = "".join(pieces)
    parts = _split_template(topic)
    assert "".join(parts) == topic
    for part in parts:
        assert _PLACEHOLDER_RE.fullmatch(part) or not _PLACEHOLDER_RE.search(part)
