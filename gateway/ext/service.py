"""The MQTT extensions inside a running ``gatewayd``: assembly and operations.

:func:`start_extensions` (called by :class:`gateway.app.Gateway` after the store and the
core are up, before the listeners open) attaches to the node's hooks:

- topic rewrite, when ``[[rewrite]]`` rules exist;
- delayed publish, when ``delayed.enable`` (the default), journaled in ``gateway.db``
  through the node's group commit when durability is on (memory only otherwise), its
  stored messages restored;
- exclusive subscriptions, when ``mqtt.exclusive_subscription``;
- auto-subscribe, always (the configured topics and the per-client entries of
  ``gateway.db``'s ``auto_subscribe`` table, which the API manages; held in memory by
  :class:`~gateway.ext.client_topics.ClientTopics`, read again when it may have changed).

The management API (:mod:`gateway.admin.ext_api`) and ``gatewayctl`` work through
:class:`Extensions`.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from gateway.config import GatewayConfig
from gateway.core.node import Node
from gateway.ext.auto_subscribe import AutoSubscribe, TopicTemplate
from gateway.ext.client_topics import ClientTopics
from gateway.ext.delayed import DelayedPublisher, Pending
from gateway.ext.exclusive import ExclusiveSubscriptions
from gateway.ext.rewrite import Rewriter, compile_rules
from gateway.store.db import db_path
from gateway.store.extensions import AutoSubscribeEntry, AutoSubscribeStore, DelayedStore

__all__ = ["Extensions", "start_extensions"]

log = logging.getLogger("gateway.ext")


class Gateway(Protocol):
    """What the extensions use of :class:`gateway.app.Gateway`."""

    @property
    def config(self) -> GatewayConfig: ...

    @property
    def node(self) -> Node | None: ...

    @property
    def shared_dir(self) -> str | Path: ...


class Extensions:
    def __init__(self, node: Node, config: GatewayConfig) -> None:
        self.node = node
        self.config = config
        self.rewriter: Rewriter | None = None
        self.delayed: DelayedPublisher | None = None
        self.exclusive: ExclusiveSubscriptions | None = None
        self.auto_subscribe: AutoSubscribe | None = None
        self.auto_store: AutoSubscribeStore | None = None
        self.client_cache: ClientTopics | None = None  # auto_store's table, in memory

    # -- auto-subscribe entries (API, gatewayctl) ---------------------------------------

    def _store(self) -> AutoSubscribeStore:
        if self.auto_store is None:
            raise RuntimeError("the auto-subscribe store is not open")
        return self.auto_store

    def _cache(self) -> ClientTopics:
        if self.client_cache is None:
            raise RuntimeError("the auto-subscribe store is not open")
        return self.client_cache

    def client_topics(self, clientid: str | None = None) -> list[dict[str, Any]]:
        store = self._store()
        rows = store.all() if clientid is None else store.for_client(clientid)
        return [e.view() for e in rows]

    def put_client_topic(self, entry: AutoSubscribeEntry) -> None:
        self._cache().put(entry)  # the next CONNECT sees it

    def delete_client_topic(self, clientid: str, topic: str | None) -> int:
        return self._cache().delete(clientid, topic)

    def _per_client(self, clientid: str) -> Sequence[TopicTemplate]:
        """Per CONNECT: from memory (:mod:`gateway.ext.client_topics`), no SQL."""
        cache = self.client_cache
        return () if cache is None else cache.for_client(clientid)

    # -- life cycle ---------------------------------------------------------------------

    def stop(self) -> None:
        for part in (self.auto_subscribe, self.exclusive, self.delayed, self.rewriter):
            if part is not None:
                part.detach()
        self.client_cache = None
        if self.auto_store is not None:
            self.auto_store.close()
            self.auto_store = None


def start_extensions(gateway: Gateway) -> Extensions:
    node = gateway.node
    assert node is not None
    config = gateway.config
    ext = Extensions(node, config)
    if config.rewrite:
        ext.rewriter = Rewriter(compile_rules(config.rewrite))
        ext.rewriter.attach(node.hooks)
        log.info("topic rewrite: %d rules", len(config.rewrite))
    if config.delayed.enable:
        journal: DelayedStore | None = None
        store: Any = node.store
        if store is not None and getattr(store, "committer", None) is not None:
            journal = DelayedStore(store.conn, store.committer)
        ext.delayed = DelayedPublisher(
            node, max_messages=config.delayed.max_delayed_messages, journal=journal,
            first_id=(journal.max_id() + 1) if journal is not None else 1,
        )
        if journal is not None:
            ext.delayed.restore(Pending(r.id, r.due, r.message) for r in journal.load())
        ext.delayed.attach()
    if config.mqtt.exclusive_subscription:
        ext.exclusive = ExclusiveSubscriptions(node)
        ext.exclusive.attach()
    path = db_path(gateway.shared_dir)
    try:
        ext.auto_store = AutoSubscribeStore.open(path)
        ext.client_cache = ClientTopics(ext.auto_store)
    except (OSError, sqlite3.Error) as exc:
        log.error("per-client auto-subscribe topics unavailable: cannot open %s: %s", path, exc)
    topics = [TopicTemplate(t.topic, t.qos, t.rh, t.rap, t.nl)
              for t in config.auto_subscribe.topics]
    ext.auto_subscribe = AutoSubscribe(node, topics, ext._per_client)
    ext.auto_subscribe.attach()
    return ext
