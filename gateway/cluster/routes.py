"""The route table: topic filter -> the other nodes that have subscribers for it.

Each node owns its own routes: it tells every peer, over its control link, the route
keys it has (a full snapshot when the link comes up, then adds and deletes in order), so
the routes of node N on any other node are exactly what N's current control link has
said. When that link goes (N died, or a partition), N's routes go with it; when it comes
back, N re-asserts them with a snapshot. Nothing has to be reconciled after a partition:
the owner is the only writer of its rows.

A route key is a plain topic filter (``a/+/c``) or ``$share/<group>/<filter>`` for a
shared-subscription group with members on that node.

Invariants:
- ``by_node[n]`` is the set of keys node ``n`` announced; ``nodes_of[k]`` is the set of
  nodes that announced ``k``; the two always mirror each other.
- ``index`` holds exactly the plain filters with at least one node; ``shared_index``
  holds exactly the real filters of shared keys with at least one node.
- Lookups never scan all filters (they go through the topic index).
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.core.topic_index import TopicIndex
from protocols.mqtt.topics import parse_shared


class RouteTable:
    def __init__(self) -> None:
        self.by_node: dict[str, set[str]] = {}
        self.nodes_of: dict[str, set[str]] = {}
        self.index = TopicIndex()
        self.shared_index = TopicIndex()
        # real filter -> group -> nodes with members
        self.groups: dict[str, dict[str, set[str]]] = {}

    def __len__(self) -> int:
        return sum(len(k) for k in self.by_node.values())

    def count(self, node: str) -> int:
        return len(self.by_node.get(node, ()))

    def add(self, node: str, key: str) -> bool:
        keys = self.by_node.setdefault(node, set())
        if key in keys:
            return False
        keys.add(key)
        nodes = self.nodes_of.get(key)
        if nodes is None:
            nodes = self.nodes_of[key] = set()
            group, real = parse_shared(key)
            try:
                if group is None:
                    self.index.add(real)
                else:
                    self.shared_index.add(real)
            except ValueError:  # not a valid filter: never matches; keep the books
                pass
        nodes.add(node)
        group, real = parse_shared(key)
        if group is not None:
            self.groups.setdefault(real, {}).setdefault(group, set()).add(node)
        return True

    def remove(self, node: str, key: str) -> bool:
        keys = self.by_node.get(node)
        if keys is None or key not in keys:
            return False
        keys.discard(key)
        if not keys:
            del self.by_node[node]
        nodes = self.nodes_of[key]
        nodes.discard(node)
        group, real = parse_shared(key)
        if group is not None:
            gs = self.groups.get(real, {})
            members = gs.get(group)
            if members is not None:
                members.discard(node)
                if not members:
                    del gs[group]
                if not gs:
                    self.groups.pop(real, None)
        if not nodes:
            del self.nodes_of[key]
            if group is None:
                self.index.remove(real)
            elif real not in self.groups:
                self.shared_index.remove(real)
        return True

    def replace(self, node: str, keys: Iterable[str]) -> None:
        """``node``'s routes are exactly ``keys`` from now on (a snapshot)."""
        new = set(keys)
        old = self.by_node.get(node, set())
        for key in old - new:
            self.remove(node, key)
        for key in new - old:
            self.add(node, key)

    def drop_node(self, node: str) -> int:
        """Forget every route of ``node``; how many there were."""
        keys = list(self.by_node.get(node, ()))
        for key in keys:
            self.remove(node, key)
        return len(keys)

    def match(self, topic: str) -> set[str]:
        """The nodes with a plain route matching ``topic``."""
        filters = self.index.lookup(topic)
        if not filters:
            return set()
        if len(filters) == 1:
            return self.nodes_of[filters[0]]
        out: set[str] = set()
        nodes_of = self.nodes_of
        for f in filters:
            out |= nodes_of[f]
        return out

    def match_groups(self, topic: str) -> list[tuple[str, str, set[str]]]:
        """``(group, real filter, nodes)`` for every shared group matching ``topic``."""
        out: list[tuple[str, str, set[str]]] = []
        for real in self.shared_index.lookup(topic):
            for group, nodes in self.groups.get(real, {}).items():
                out.append((group, real, nodes))
        return out

    def keys_of(self, node: str) -> set[str]:
        return self.by_node.get(node, set())
