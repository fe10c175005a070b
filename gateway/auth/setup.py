"""Assemble the authentication chain and per-user authorization from the configuration.

Order of the ``client.authenticate`` chain (all at priority AUTHN, in this order): the
built-in database, then the HTTP service; ``Node.authenticate`` falls back to
``allow_anonymous`` for clients neither claimed. Enhanced authentication methods go into
``node.auth_methods``; per-user rules and superusers into ``client.authorize``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from gateway.auth.builtin import BuiltinAuthenticator, ScramExchange, ThreadOffload
from gateway.auth.http import AiohttpPoster, HttpAuthenticator, HttpAuthSettings
from gateway.auth.jwt import JwksKeys, JwtAcl, JwtAuthenticator, JwtExpiry
from gateway.auth.user_rules import UserRulesAuthorizer
from gateway.config import GatewayConfig
from gateway.core.hooks import Priority
from gateway.core.node import Node
from gateway.store.db import db_path
from gateway.store.users import UserStore
from protocols.context import AuthExchange, ClientInfo
from protocols.mqtt.reason_codes import ReasonCode as RC

__all__ = ["AuthServices", "install_auth"]

log = logging.getLogger("gateway.auth")


@dataclass(slots=True)
class AuthServices:
    """What :func:`install_auth` started, to close at shutdown."""

    store: UserStore | None = None
    offload: ThreadOffload | None = None
    posters: list[AiohttpPoster] = field(default_factory=list)
    jwks: JwksKeys | None = None
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def close(self) -> None:
        if self.jwks is not None:
            self.jwks.close()
        for closer in self.closers:
            await closer()
        for poster in self.posters:
            await poster.close()
        if self.offload is not None:
            self.offload.close()
        if self.store is not None:
            self.store.close()


def install_auth(
    node: Node,
    config: GatewayConfig,
    loop: asyncio.AbstractEventLoop,
    *,
    data_dir: Path | None = None,
) -> AuthServices:
    """Authentication as configured; the user store in ``data_dir`` (default
    ``node.data_dir``; a worker of a multi-worker node passes the node's)."""
    a = config.authentication
    services = AuthServices()
    chain: list[str] = []
    # the store also holds per-user rules, which apply whichever backend authenticated
    store = services.store = UserStore.open(
        db_path(config.node.data_dir if data_dir is None else data_dir)
    )
    if a.builtin_db.enable:
        db = a.builtin_db
        offload = services.offload = ThreadOffload(loop, db.hash_workers)
        node.hooks.add(
            "client.authenticate",
            BuiltinAuthenticator(store, offload, max_pending=db.max_pending),
            Priority.AUTHN,
        )
        chain.append("builtin_db")
        if a.scram.enable:
            secret = os.urandom(32)
            iterations = db.iteration_count

            def scram(client: ClientInfo) -> AuthExchange:
                return ScramExchange(
                    store, client, fake_secret=secret, fake_iterations=iterations
                )

            node.auth_methods["SCRAM-SHA-256"] = scram
    if a.http.enable:
        h = a.http
        poster = AiohttpPoster(
            h.url, headers=h.headers, pool_size=h.pool_size, timeout=h.request_timeout, loop=loop
        )
        services.posters.append(poster)
        settings = HttpAuthSettings(
            url=h.url,
            headers=dict(h.headers),
            body=dict(h.body),
            request_timeout=h.request_timeout,
            cache_ttl=h.cache_ttl,
            cache_max=h.cache_max,
            on_error=h.on_error,
            pool_size=h.pool_size,
        )
        node.hooks.add(
            "client.authenticate",
            HttpAuthenticator(settings, node.scheduler, poster, incr=node.metrics.incr),
            Priority.AUTHN,
        )
        chain.append(f"http ({h.url})")
    if a.jwt.enable:
        chain.append(_install_jwt(node, config, loop, services))
    if config.authorization.sources:
        from gateway.auth.http_authz import install_http_authz

        install_http_authz(node, config, loop, services)
    node.hooks.add("client.authorize", UserRulesAuthorizer(services.store), Priority.AUTHZ)
    log.info(
        "authentication: %s, then allow_anonymous=%s%s",
        " -> ".join(chain) or "no backend",
        str(a.allow_anonymous).lower(),
        "; enhanced: SCRAM-SHA-256" if node.auth_methods else "",
    )
    return services


def _install_jwt(
    node: Node, config: GatewayConfig, loop: asyncio.AbstractEventLoop, services: AuthServices
) -> str:
    """The JWT authenticator, its ACL claim authorizer and its expiry disconnects."""
    j = config.authentication.jwt
    if j.use_jwks:
        ssl_context, sni = None, None
        if j.ssl.enable:  # checked by the loader (one --check line per mistake)
            from gateway.bridge.tls import client_context, server_hostname

            ssl_context = client_context(j.ssl)
            host = urllib.parse.urlsplit(j.endpoint).hostname or ""
            sni = server_hostname(j.ssl, host) if j.ssl.server_name_indication else None
        services.jwks = JwksKeys(j.endpoint, refresh=j.refresh_interval, timeout=j.http_timeout,
                                 ssl_context=ssl_context, server_hostname=sni)
        services.jwks.start(loop)
    node.hooks.add("client.authenticate", JwtAuthenticator(j, services.jwks,
                                                           incr=node.metrics.incr),
                   Priority.AUTHN)
    # before the per-user rules (same priority, added first): the token's ACL decides first
    node.hooks.add("client.authorize", JwtAcl(), Priority.AUTHZ)
    if j.disconnect_after_expire:
        def kick(client: ClientInfo) -> bool:
            session = node.sessions.get(client.client_id)
            if session is None or session.info is not client or session.handle is None:
                return False
            handle = session.handle
            client.set_attr("disconnect_reason", "jwt_expired")
            node.close(client, handle, send_will=True)
            handle.kick(RC.NOT_AUTHORIZED)
            node.metrics.incr("authentication.jwt.expired_disconnect")
            return True

        expiry = JwtExpiry(node.scheduler, kick)
        node.hooks.add("client.connected", expiry.connected)
        node.hooks.add("client.disconnected", expiry.disconnected)
    return "jwt (JWKS " + j.endpoint + ")" if j.use_jwks else f"jwt ({j.algorithm})"
