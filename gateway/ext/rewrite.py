"""Topic rewrite (EMQX's ``rewrite`` rules): a ``topic.rewrite`` hook subscriber.

A rule is ``(action, source_topic, re, dest_topic)``. For a topic of a PUBLISH
(``action`` "publish" or "all") or a filter of a SUBSCRIBE/UNSUBSCRIBE ("subscribe" or
"all"), the rules are tried in their configured order:

- the first rule whose ``source_topic`` filter matches the topic decides; later rules are
  not tried (EMQX's semantics), even when its ``re`` does not match;
- when ``re`` matches (``re.search``, as Erlang's ``re:run``), the topic becomes
  ``dest_topic`` with ``$1`` .. ``$9`` replaced by the capture groups (an unmatched group
  by nothing) and ``${clientid}`` / ``${username}`` by the client's (an absent username by
  nothing); otherwise it is unchanged.

For a shared subscription (``$share/g/t``, ``$queue/t``) only the real filter ``t`` is
matched and rewritten; the prefix stays. A SUBSCRIBE filter is matched word by word as if
it were a topic (its ``+`` and ``#`` are plain words against the source filter).

The function is pure, so the core applies it wherever a topic enters (authorization,
routing, subscribing, retained delivery) and always gets the same answer. The core runs
it before authorization, so authorization sees the rewritten topic (EMQX authorizes the
original one: see docs/mqtt-extensions.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.core.hooks import Hooks, Priority
from protocols.context import ClientInfo

__all__ = ["CompiledRule", "Rewriter", "compile_rules", "filter_matches"]

_DOLLAR = re.compile(r"\$(\d)|\$\{(clientid|username)\}")


@dataclass(frozen=True, slots=True)
class CompiledRule:
    action: str  # publish | subscribe | all
    source: tuple[str, ...]  # the source filter's words
    regex: re.Pattern[str]
    dest: str

    def applies_to(self, action: str) -> bool:
        return self.action == "all" or self.action == action


class RuleSpec(Protocol):
    """A configured rule (:class:`gateway.config.extensions.RewriteRule`)."""

    @property
    def action(self) -> str: ...
    @property
    def source_topic(self) -> str: ...
    @property
    def dest_topic(self) -> str: ...
    @property
    def re(self) -> str: ...


def compile_rules(rules: Sequence[RuleSpec]) -> list[CompiledRule]:
    """Compile configuration rules (objects with ``action``, ``source_topic``,
    ``dest_topic``, ``re``); raises ``ValueError`` naming the rule on a bad regex."""
    out: list[CompiledRule] = []
    for i, r in enumerate(rules):
        action = str(r.action)
        source = str(r.source_topic)
        try:
            regex = re.compile(str(r.re))
        except re.error as exc:
            raise ValueError(f"rewrite rule {i} (source_topic {source!r}): {exc}") from None
        dest = str(r.dest_topic)
        out.append(CompiledRule(action, tuple(source.split("/")), regex, dest))
    return out


def filter_matches(filter_words: tuple[str, ...], topic: str) -> bool:
    """MQTT matching of ``topic`` against a filter given as its words; a topic starting
    with ``$`` matches no filter starting with a wildcard (MQTT 4.7.2)."""
    words = topic.split("/")
    if topic.startswith("$") and filter_words and filter_words[0] in ("+", "#"):
        return False
    n = len(filter_words)
    for i, f in enumerate(filter_words):
        if f == "#":
            return i == n - 1
        if i >= len(words):
            return False
        if f != "+" and f != words[i]:
            return False
    return len(words) == n


def _substitute(dest: str, groups: Sequence[str | None], client: ClientInfo) -> str:
    if "$" not in dest:
        return dest
    def one(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            k = int(m.group(1))
            if 1 <= k <= len(groups):
                return groups[k - 1] or ""
            return ""
        return client.client_id if m.group(2) == "clientid" else (client.username or "")

    return _DOLLAR.sub(one, dest)


def _split_share(topic: str) -> tuple[str, str]:
    """(prefix, real filter) of a shared subscription filter; ("", topic) otherwise."""
    if topic.startswith("$share/"):
        parts = topic.split("/", 2)
        if len(parts) == 3:
            return f"$share/{parts[1]}/", parts[2]
    elif topic.startswith("$queue/"):
        return "$queue/", topic[7:]
    return "", topic


_CACHE_MAX = 4096
_MISS: Any = object()
_Decision = tuple[CompiledRule, tuple[str | None, ...], str]  # rule, groups, share prefix


class Rewriter:
    """The ``topic.rewrite`` hook subscriber over compiled rules (see module docstring).

    Which rule decides a topic, and the regex groups, depend on (action, topic) only, so
    they are cached per action and topic (at most 4096 each, then a cache starts over): a
    topic published again costs one dict lookup, and only the substitution of
    ``${clientid}``/``${username}`` is done per call."""

    def __init__(self, rules: list[CompiledRule]) -> None:
        self.rules = rules
        self._publish = [r for r in rules if r.applies_to("publish")]
        self._subscribe = [r for r in rules if r.applies_to("subscribe")]
        self._hooks: Hooks | None = None
        # topic -> None (unchanged) or (rule, groups, share prefix), per action
        self._pub_cache: dict[str, _Decision | None] = {}
        self._sub_cache: dict[str, _Decision | None] = {}

    def rewrite(self, client: ClientInfo, action: str, topic: str) -> str:
        cache = self._pub_cache if action == "publish" else self._sub_cache
        hit: _Decision | None = cache.get(topic, _MISS)
        if hit is None:
            return topic
        if hit is _MISS:
            hit = self._decide(action, topic)
            if len(cache) >= _CACHE_MAX:
                cache.clear()
            cache[topic] = hit
            if hit is None:
                return topic
        rule, groups, prefix = hit
        return prefix + _substitute(rule.dest, groups, client)

    def _decide(self, action: str, topic: str) -> _Decision | None:
        if action == "publish":
            prefix, real, rules = "", topic, self._publish
        else:
            prefix, real = _split_share(topic)
            rules = self._subscribe
        for rule in rules:
            if filter_matches(rule.source, real):
                m = rule.regex.search(real)
                return None if m is None else (rule, m.groups(), prefix)
        return None

    def attach(self, hooks: Hooks) -> None:
        if self.rules:
            hooks.add("topic.rewrite", self.rewrite, Priority.HIGHEST)
            self._hooks = hooks

    def detach(self) -> None:
        if self._hooks is not None:
            self._hooks.remove("topic.rewrite", self.rewrite)
            self._hooks = None
