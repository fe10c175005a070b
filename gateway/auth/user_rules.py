"""Per-user authorization: superusers and the rules kept in the user database.

A ``client.authorize`` subscriber (priority AUTHZ). ``Node.authorize`` first asks the
rules file's :class:`~gateway.core.authz.Authorizer`, then folds this subscriber over its
answer, so what is decided here wins, which makes the order of evaluation:

1. a superuser (``client.attrs["is_superuser"]``, set by the backend that authenticated
   the client) may do anything;
2. the client's own rules (``gatewayctl users allow|deny``), first match wins;
3. the rules file and inline rules, then ``no_match``.

Only clients that a backend authenticated (``client.attrs["authn"]`` set) get their
user's rules: an anonymous client that merely claims a user name does not. Denials are
still logged and counted by ``Node.authorize``.
"""

from __future__ import annotations

from gateway.core.hooks import Stop
from gateway.store.users import UserStore
from protocols.context import ClientInfo
from protocols.mqtt.topics import parse_shared

__all__ = ["UserRulesAuthorizer"]


class UserRulesAuthorizer:
    def __init__(self, store: UserStore | None) -> None:
        self.store = store

    def __repr__(self) -> str:
        return "UserRulesAuthorizer()"

    def __call__(
        self, client: ClientInfo, action: str, topic: str, acc: bool
    ) -> Stop[bool] | None:
        attrs = client.attrs
        if not attrs or "authn" not in attrs:
            return None
        if attrs.get("is_superuser"):
            return Stop(True)
        username = client.username
        if self.store is None or not username:
            return None
        authz = self.store.authorizer_for(username)
        if authz is None:
            return None
        checked = parse_shared(topic)[1] if action == "subscribe" else topic
        decided = authz.decide(
            action,  # type: ignore[arg-type]
            checked,
            clientid=client.client_id,
            username=username,
            peer_ip=client.peer_host,
            client_attrs=attrs.get("client_attrs"),
        )
        return None if decided is None else Stop(decided)
