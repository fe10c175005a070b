"""The API's window on the stores other parts own: users (:mod:`gateway.store.users`)
and banned clients (:mod:`gateway.store.banned`).

Each adapter answers ``status`` ``"enabled"`` when its store module is installed and
``"not configured"`` when it is not; then lists are empty and changes are refused with
501 NOT_CONFIGURED, so the API's shape never depends on what this node has. Store calls
run in a worker thread with a connection of their own (hashing a password takes a
while), never on the event loop.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from pathlib import Path
from typing import Any

from gateway.admin.errors import ApiError, bad_request, not_configured, not_found
from gateway.store.db import db_path

ENABLED = "enabled"
NOT_CONFIGURED = "not configured"


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


class UsersAdapter:
    """``/api/v5/users``: the built-in user database (``gatewayctl users`` writes it too)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = db_path(data_dir)
        self.module = _module("gateway.store.users")

    @property
    def status(self) -> str:
        return ENABLED if self.module is not None else NOT_CONFIGURED

    def _store(self) -> Any:
        return self.module.UserStore.open(self.path)

    async def list(self) -> tuple[list[dict[str, Any]], str]:
        if self.module is None:
            return [], NOT_CONFIGURED

        def read() -> list[dict[str, Any]]:
            store = self._store()
            try:
                counts = store.rule_counts()
                return [
                    {
                        "user_id": u.username,
                        "is_superuser": u.is_superuser,
                        "algorithm": u.credential.hash_name,
                        "created_at": u.created_at,
                        "updated_at": u.updated_at,
                        "rules": counts.get(u.username, 0),
                    }
                    for u in store.users()
                ]
            finally:
                store.close()

        return await asyncio.to_thread(read), ENABLED

    async def add(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.module is None:
            raise not_configured("the user database")
        user_id = body.get("user_id")
        password = body.get("password")
        superuser = body.get("is_superuser", False)
        if not isinstance(user_id, str) or not isinstance(password, str):
            raise bad_request("user_id and password (strings) are required")
        if not isinstance(superuser, bool):
            raise bad_request("is_superuser must be true or false")
        error = self.module.UserError

        def write() -> Any:
            store = self._store()
            try:
                return store.add(user_id, password, superuser=superuser)
            finally:
                store.close()

        try:
            user = await asyncio.to_thread(write)
        except error as exc:
            status = 409 if "already exists" in str(exc) else 400
            raise ApiError(status, "CONFLICT" if status == 409 else "BAD_REQUEST",
                           str(exc)) from None
        return {"user_id": user.username, "is_superuser": user.is_superuser,
                "created_at": user.created_at}

    async def delete(self, user_id: str) -> None:
        if self.module is None:
            raise not_configured("the user database")

        def write() -> bool:
            store = self._store()
            try:
                return bool(store.delete(user_id))
            finally:
                store.close()

        if not await asyncio.to_thread(write):
            raise not_found(f"no user {user_id!r}")


BANNED_AS = ("clientid", "username", "peerhost", "cidr")
AS_ALIASES = {"peerhost_net": "cidr"}  # EMQX's name for a network ban


class BannedAdapter:
    """``/api/v5/banned``: bans by client id, username, peer address or network
    (:class:`gateway.store.banned.BannedStore`; ``gatewayctl ban`` writes the same table
    and ``gatewayd`` picks changes up by itself). Items are EMQX-shaped:
    ``{as, who, by, reason, at, until, active}``; ``as`` is ``clientid``, ``username``,
    ``peerhost`` or ``cidr`` (``peerhost_net`` is accepted for ``cidr``)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = db_path(data_dir)
        self.module = _module("gateway.store.banned")

    @property
    def status(self) -> str:
        if self.module is None or not hasattr(self.module, "BannedStore"):
            return NOT_CONFIGURED
        return ENABLED

    async def _run(self, fn: Any) -> Any:
        def work() -> Any:
            store = self.module.BannedStore.open(self.path)
            try:
                return fn(store)
            finally:
                store.close()

        return await asyncio.to_thread(work)

    async def list(self) -> tuple[list[dict[str, Any]], str]:
        if self.status != ENABLED:
            return [], NOT_CONFIGURED
        now = time.time()
        bans = await self._run(lambda store: store.all())
        return [_banned_view(b, now) for b in bans], ENABLED

    async def add(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.status != ENABLED:
            raise not_configured("banning")
        as_ = AS_ALIASES.get(str(body.get("as")), body.get("as"))
        who = body.get("who")
        if as_ not in BANNED_AS:
            raise bad_request(f"as must be one of {', '.join(BANNED_AS)}")
        if not isinstance(who, str) or not who:
            raise bad_request("who (a non-empty string) is required")
        until = body.get("until")
        if until is not None and (isinstance(until, bool) or not isinstance(until, int | float)):
            raise bad_request("until must be epoch seconds")
        reason = body.get("reason", "")
        if not isinstance(reason, str):
            raise bad_request("reason must be a string")
        error = self.module.BanError
        try:
            ban = await self._run(
                lambda store: store.add(as_, who, reason=reason, created_by="api",
                                        expires_at=until)
            )
        except error as exc:
            raise bad_request(str(exc)) from None
        return _banned_view(ban, time.time())

    async def delete(self, as_: str, who: str) -> None:
        if self.status != ENABLED:
            raise not_configured("banning")
        kind = AS_ALIASES.get(as_, as_)
        if kind not in BANNED_AS:
            raise bad_request(f"as must be one of {', '.join(BANNED_AS)}")
        error = self.module.BanError
        try:
            lifted = await self._run(lambda store: store.delete(kind, who))
        except error as exc:
            raise bad_request(str(exc)) from None
        if not lifted:
            raise not_found(f"{kind} {who!r} is not banned")


def _banned_view(ban: Any, now: float) -> dict[str, Any]:
    return {
        "as": ban.kind,
        "who": ban.value,
        "by": ban.created_by or None,
        "reason": ban.reason,
        "at": ban.created_at,
        "until": ban.expires_at,
        "active": ban.expires_at is None or ban.expires_at > now,
    }
