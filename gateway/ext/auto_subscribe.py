"""Subscription by broker (EMQX's auto-subscribe): a ``client.connected`` hook subscriber.

When a client of any front-end connects (a new or a resumed session), the broker
subscribes it to:

1. the configured topics (``[[auto_subscribe.topics]]``), in order, then
2. the client's own entries in the built-in store (``auto_subscribe`` table of
   ``gateway.db``, managed with the API and ``gatewayctl auto-subscribe``).

Rules:

- Placeholders ``${clientid}``, ``${username}``, ``${host}`` (the peer's address) and
  ``${port}`` are filled from the connection; a topic whose placeholder has no value (no
  username) is skipped and counted in ``auto_subscribe.skipped``.
- Each subscription goes through authorization as a SUBSCRIBE would (a denied one is
  skipped, counted in ``auto_subscribe.denied``) and through the core's ``subscribe``
  (topic rewrite, exclusive subscriptions apply; a refused one counts as denied).
- ``qos``/``nl``/``rap``/``rh`` become the subscription's options. Subscribing a resumed
  session again replaces the options of the subscription it already has: never two.
- Subscriptions are made while the connection is being accepted (so they exist when the
  client sees its CONNACK); retained messages for them are queued on the next loop turn,
  after the CONNACK and the resumed session's own messages (retain handling as for a
  SUBSCRIBE: ``rh`` 1 sends them only for a subscription that did not exist).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from gateway.core.node import Node
from protocols.context import RESUBSCRIBED, ClientInfo, SubOptions, subscribe_refused

__all__ = ["AutoSubscribe", "TopicTemplate", "fill"]

log = logging.getLogger("gateway.ext.auto_subscribe")


@dataclass(frozen=True, slots=True)
class TopicTemplate:
    topic: str
    qos: int = 0
    rh: int = 0
    rap: int = 0
    nl: int = 0

    def options(self) -> SubOptions:
        return SubOptions(self.qos, bool(self.nl), bool(self.rap), self.rh)


def fill(template: str, client: ClientInfo) -> str | None:
    """``template`` with its placeholders filled for ``client``; None when one has no
    value (no username, no peer address)."""
    out = template
    for name, value in (
        ("${clientid}", client.client_id),
        ("${username}", client.username),
        ("${host}", client.peer_host),
        ("${port}", None if client.peer_port is None else str(client.peer_port)),
    ):
        if name in out:
            if not value:
                return None
            out = out.replace(name, value)
    return out


class AutoSubscribe:
    """The hook subscriber (see module docstring). ``per_client(clientid)`` gives the
    client's stored entries (the store's ``for_client``), or nothing."""

    def __init__(
        self,
        node: Node,
        topics: Sequence[TopicTemplate],
        per_client: Callable[[str], Sequence[TopicTemplate]] | None = None,
    ) -> None:
        self.node = node
        self.topics = tuple(topics)
        self.per_client = per_client
        self._attached = False

    def attach(self) -> None:
        self.node.hooks.add("client.connected", self._connected)
        self._attached = True

    def detach(self) -> None:
        if self._attached:
            self.node.hooks.remove("client.connected", self._connected)
            self._attached = False

    def templates_for(self, client_id: str) -> Sequence[TopicTemplate]:
        """The configured topics, then the client's own (per CONNECT: no list is built
        for a client without topics of its own)."""
        own: Sequence[TopicTemplate] = ()
        if self.per_client is not None:
            try:
                own = self.per_client(client_id)
            except Exception:
                log.exception("reading the auto-subscribe entries of %s failed", client_id)
        return [*self.topics, *own] if own else self.topics

    def _connected(self, client: ClientInfo) -> None:
        templates = self.templates_for(client.client_id)
        if not templates:
            return
        node = self.node
        made: list[tuple[str, SubOptions, bool]] = []
        for t in templates:
            topic = fill(t.topic, client)
            if topic is None:
                node.metrics.incr("auto_subscribe.skipped")
                continue
            opts = t.options()
            allowed = node.authorize(client, "subscribe", topic, wait=True)
            if allowed is True or allowed is False:
                entry = self._subscribe(client, topic, opts, allowed)
                if entry is not None:
                    made.append(entry)
            else:  # an authorization service is being asked: subscribe when it answers
                allowed.add_callback(partial(self._answered, client, topic, opts))
        if made:
            node.scheduler.call_later(0, lambda: self._retained(client, made))

    def _subscribe(self, client: ClientInfo, topic: str, opts: SubOptions,
                   allowed: bool) -> tuple[str, SubOptions, bool] | None:
        metrics = self.node.metrics
        if not allowed:
            metrics.incr("auto_subscribe.denied")
            return None
        existed = self.node.subscribe(client, topic, opts)
        if subscribe_refused(existed):
            metrics.incr("auto_subscribe.denied")
            return None
        metrics.incr("auto_subscribe.subscribed")
        return topic, opts, existed == RESUBSCRIBED

    def _answered(self, client: ClientInfo, topic: str, opts: SubOptions, ok: bool) -> None:
        """A decision that came later: subscribe if the same connection still holds the
        session, and send the retained messages at once (we are past connect)."""
        session = self.node.sessions.get(client.client_id)
        if session is None or session.info is not client:
            return
        entry = self._subscribe(client, topic, opts, ok)
        if entry is not None:
            self._retained(client, [entry])

    def _retained(self, client: ClientInfo, made: list[tuple[str, SubOptions, bool]]) -> None:
        session = self.node.sessions.get(client.client_id)
        if session is None or session.info is not client:
            return  # gone, or another connection has it now
        for topic, opts, existed in made:
            self.node.deliver_retained(client, topic, opts, existed)
