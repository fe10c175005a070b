"""Authorization: ordered allow/deny rules on publish and subscribe.

Rules are tried in order; the first rule that applies decides, and when none does the
authorizer's ``no_match`` permission decides. A rule applies to a check when all of:

- **who**: every one of ``clientid`` (equality), ``username`` (equality) and
  ``ipaddress`` (the peer address lies in the network) that the rule sets matches; a rule
  that sets none of them is for everyone. A rule with ``username`` or ``ipaddress`` does
  not apply to a client without a username or a known peer address. An IPv4-mapped IPv6
  peer (``::ffff:10.0.0.1``) also matches the IPv4 network.
- **action**: the rule's action is the checked one, or ``"all"``.
- **topic**: one of the rule's topics matches:

  - ``"eq X"``: the checked string is exactly ``X`` (no wildcard meaning, no
    placeholders: ``"eq t/#"`` only matches a subscription to ``t/#`` itself);
  - otherwise a topic filter, in which ``${clientid}``, ``${username}`` and
    ``${client_attrs.NAME}`` (an attribute a JWT's ``client_attrs`` claim gave the
    client, :mod:`gateway.auth.jwt`) are replaced by the client's values (in one pass: a
    value is never substituted into again). A filter whose placeholder has no value (no
    username, no such attribute), an empty value, or a value holding ``+`` or ``#``
    (which would turn a client's value into a wildcard) does not match.
  - publish: the filter matches the topic name (:func:`topic_matches`);
  - subscribe: the requested filter equals the rule's filter or is covered by it
    (:func:`filter_covers`): ``"a/#"`` allows subscribing to ``"a/+/c"``, ``"a/+"`` does
    not allow ``"a/#"``.

  The MQTT ``$`` rule holds: a rule topic ``"#"`` or ``"+/..."`` neither matches a
  publish to ``$SYS/x`` nor covers a subscription to ``$SYS/#``; name ``$SYS/...``
  explicitly. Callers pass subscription filters with any ``$share/<group>/`` prefix
  removed.

Invariants: a :class:`Rule` is validated when built (permission, action, non-empty topics
that are valid filters, ``ipaddress`` normalized to an ``ip_network``). An
:class:`Authorizer` compiles its rules once: topics without placeholders are stored ready
to match; only placeholder topics are rendered per check.
"""

from __future__ import annotations

import ipaddress as _ip
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from gateway.core.topic_index import filter_covers, is_valid_filter, topic_matches

__all__ = ["Action", "Authorizer", "Permission", "Rule", "RuleAction", "from_config"]

Permission = Literal["allow", "deny"]
RuleAction = Literal["publish", "subscribe", "all"]
Action = Literal["publish", "subscribe"]
Network = _ip.IPv4Network | _ip.IPv6Network

_PLACEHOLDERS = ("${clientid}", "${username}")
_ATTR_PREFIX = "${client_attrs."
# every placeholder of a rule topic (an attribute name: 1 to 64 characters, no "}")
_PLACEHOLDER_RE = re.compile(r"\$\{(?:clientid|username|client_attrs\.[^}]{1,64})\}")
_EQ_PREFIX = "eq "


@dataclass(frozen=True, slots=True)
class Rule:
    """One authorization rule (see module docstring).

    ``ipaddress`` may be given as a string (``"10.0.0.0/8"``, ``"192.168.1.7"``,
    ``"fd00::/8"``) or a network; it is stored as an ``ipaddress.ip_network`` (host bits
    are cleared: ``"10.1.2.3/8"`` is ``10.0.0.0/8``). ``topics`` may be given as any
    sequence and is stored as a tuple.
    """

    permission: Permission
    action: RuleAction
    topics: tuple[str, ...]
    clientid: str | None = None
    username: str | None = None
    ipaddress: str | Network | None = None

    def __post_init__(self) -> None:
        if self.permission not in ("allow", "deny"):
            raise ValueError(f"permission must be 'allow' or 'deny', not {self.permission!r}")
        if self.action not in ("publish", "subscribe", "all"):
            raise ValueError(f"action must be 'publish', 'subscribe' or 'all', not {self.action!r}")
        raw: object = self.topics
        if isinstance(raw, str):
            raise TypeError("topics must be a sequence of strings, not a string")
        topics = tuple(self.topics)
        if not topics:
            raise ValueError("a rule needs at least one topic")
        for topic in topics:
            _check_rule_topic(topic)
        object.__setattr__(self, "topics", topics)
        if isinstance(self.ipaddress, str):
            object.__setattr__(self, "ipaddress", _ip.ip_network(self.ipaddress, strict=False))

    @property
    def network(self) -> Network | None:
        """``ipaddress`` as the network it is stored as."""
        assert not isinstance(self.ipaddress, str)
        return self.ipaddress


def _check_rule_topic(topic: str) -> None:
    if topic.startswith(_EQ_PREFIX):
        if not topic[len(_EQ_PREFIX) :]:
            raise ValueError(f"empty topic after 'eq': {topic!r}")
        return
    probe = _PLACEHOLDER_RE.sub("x", topic)
    if not is_valid_filter(probe):
        raise ValueError(f"invalid topic filter in rule: {topic!r}")


def from_config(rules: Iterable[Any]) -> list[Rule]:
    """Rules from config objects with attributes ``permission``, ``action``, ``topics``,
    ``clientid``, ``username`` and ``ipaddress`` (such as the config schema's
    ``AuthzRule``), or from mappings with those keys (``action`` defaults to ``"all"``,
    the who-fields to None)."""
    out: list[Rule] = []
    for item in rules:
        if isinstance(item, Mapping):
            fields = {
                "permission": item["permission"],
                "action": item.get("action", "all"),
                "topics": item["topics"],
                "clientid": item.get("clientid"),
                "username": item.get("username"),
                "ipaddress": item.get("ipaddress"),
            }
        else:
            fields = {
                "permission": item.permission,
                "action": item.action,
                "topics": item.topics,
                "clientid": item.clientid,
                "username": item.username,
                "ipaddress": item.ipaddress,
            }
        ip = fields["ipaddress"]
        if ip is not None and not isinstance(ip, (str, _ip.IPv4Network, _ip.IPv6Network)):
            fields["ipaddress"] = str(ip)
        fields["topics"] = tuple(fields["topics"])
        out.append(Rule(**fields))
    return out


# ---------------------------------------------------------------- compiled form

_STATIC, _EQ, _TEMPLATE = 0, 1, 2


class _Topic:
    """A rule topic ready to match: a fixed filter, an ``eq`` literal, or a template."""

    __slots__ = ("kind", "parts", "text")

    def __init__(self, topic: str) -> None:
        # parts: the template split into literal text and placeholder names, e.g.
        # "d/${clientid}/#" -> ("d/", "${clientid}", "/#").
        self.parts: tuple[str, ...] = ()
        if topic.startswith(_EQ_PREFIX):
            self.kind = _EQ
            self.text = topic[len(_EQ_PREFIX) :]
        elif "${" in topic and _PLACEHOLDER_RE.search(topic):
            self.kind = _TEMPLATE
            self.text = topic
            self.parts = _split_template(topic)
        else:
            self.kind = _STATIC
            self.text = topic

    def render(self, clientid: str, username: str | None,
               attrs: Mapping[str, str] | None = None) -> str | None:
        """The filter for this client, or None when a placeholder has no usable value."""
        out: list[str] = []
        for part in self.parts:
            if part == "${clientid}":
                value: str | None = clientid
            elif part == "${username}":
                value = username
            elif part.startswith(_ATTR_PREFIX) and part.endswith("}"):
                value = attrs.get(part[len(_ATTR_PREFIX) : -1]) if attrs else None
            else:
                out.append(part)
                continue
            if not value or "+" in value or "#" in value:
                return None
            out.append(value)
        return "".join(out)


def _split_template(topic: str) -> tuple[str, ...]:
    """Literal text and placeholders, in order: ``"d/${clientid}/#"`` ->
    ``("d/", "${clientid}", "/#")``."""
    parts: list[str] = []
    pos = 0
    for m in _PLACEHOLDER_RE.finditer(topic):
        if m.start() > pos:
            parts.append(topic[pos : m.start()])
        parts.append(m.group(0))
        pos = m.end()
    if pos < len(topic):
        parts.append(topic[pos:])
    return tuple(parts)


class _Compiled:
    __slots__ = ("allow", "clientid", "network", "publish", "subscribe", "topics", "username")

    # network: (version, first address, last address) as ints, for a cheap range test.

    def __init__(self, rule: Rule) -> None:
        self.allow = rule.permission == "allow"
        self.publish = rule.action in ("publish", "all")
        self.subscribe = rule.action in ("subscribe", "all")
        self.clientid = rule.clientid
        self.username = rule.username
        net = rule.network
        self.network: tuple[int, int, int] | None = (
            None
            if net is None
            else (net.version, int(net.network_address), int(net.broadcast_address))
        )
        self.topics = tuple(_Topic(t) for t in rule.topics)


@lru_cache(maxsize=4096)
def _parse_peer(peer_ip: str) -> tuple[tuple[int, int], ...]:
    """``(version, address as int)`` of the peer, plus the IPv4 form of an IPv4-mapped
    IPv6 address; () if unparsable."""
    try:
        addr = _ip.ip_address(peer_ip)
    except ValueError:
        return ()
    if isinstance(addr, _ip.IPv6Address) and addr.ipv4_mapped is not None:
        return ((6, int(addr)), (4, int(addr.ipv4_mapped)))
    return ((addr.version, int(addr)),)


class Authorizer:
    """Decides publish and subscribe requests by first matching rule (module docstring)."""

    __slots__ = ("_compiled", "_no_match", "rules")

    def __init__(self, rules: Sequence[Rule], no_match: Permission) -> None:
        if no_match not in ("allow", "deny"):
            raise ValueError(f"no_match must be 'allow' or 'deny', not {no_match!r}")
        self.rules: tuple[Rule, ...] = tuple(rules)
        self._compiled = tuple(_Compiled(r) for r in self.rules)
        self._no_match = no_match == "allow"

    @property
    def no_match(self) -> Permission:
        return "allow" if self._no_match else "deny"

    def check(
        self,
        action: Action,
        topic: str,
        *,
        clientid: str,
        username: str | None,
        peer_ip: str | None,
        client_attrs: Mapping[str, str] | None = None,
    ) -> bool:
        """True to allow ``action`` on ``topic`` (a topic name to publish to, or a topic
        filter to subscribe to) for this client. ``peer_ip`` is the peer's address as a
        string (IPv4 or IPv6, no port); None or unparsable matches no ``ipaddress`` rule.
        ``client_attrs``: the values of ``${client_attrs.NAME}``.
        """
        decided = self.decide(
            action, topic, clientid=clientid, username=username, peer_ip=peer_ip,
            client_attrs=client_attrs,
        )
        return self._no_match if decided is None else decided

    def decide(
        self,
        action: Action,
        topic: str,
        *,
        clientid: str,
        username: str | None,
        peer_ip: str | None,
        client_attrs: Mapping[str, str] | None = None,
    ) -> bool | None:
        """Like :meth:`check`, but None when no rule applies (``no_match`` not used)."""
        if action == "publish":
            publish = True
        elif action == "subscribe":
            publish = False
        else:
            raise ValueError(f"action must be 'publish' or 'subscribe', not {action!r}")
        peer: tuple[tuple[int, int], ...] | None = None
        for rule in self._compiled:
            if not (rule.publish if publish else rule.subscribe):
                continue
            if rule.clientid is not None and rule.clientid != clientid:
                continue
            if rule.username is not None and rule.username != username:
                continue
            network = rule.network
            if network is not None:
                if peer is None:
                    peer = _parse_peer(peer_ip) if peer_ip else ()
                version, first, last = network
                for v, a in peer:
                    if v == version and first <= a <= last:
                        break
                else:
                    continue
            for t in rule.topics:
                kind = t.kind
                if kind == _EQ:
                    if t.text == topic:
                        return rule.allow
                    continue
                if kind == _STATIC:
                    rule_filter = t.text
                else:
                    rendered = t.render(clientid, username, client_attrs)
                    if rendered is None:
                        continue
                    rule_filter = rendered
                if publish:
                    if topic_matches(rule_filter, topic):
                        return rule.allow
                elif rule_filter == topic or filter_covers(rule_filter, topic):
                    return rule.allow
        return None
