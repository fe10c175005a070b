"""JWT authentication (EMQX's ``jwt`` authenticator) on PyJWT.

:class:`JwtAuthenticator` is a ``client.authenticate`` subscriber. The token is the
CONNECT's password (or username, ``from``). Outcomes, as EMQX decides them:

- not a JWT (no two dots, undecodable header), an unknown ``kid``, or a signature that
  does not verify: ``ignore`` (the next backend, then ``allow_anonymous``, decide);
- a verified token that has expired (``exp``), is not yet valid (``nbf``), or whose
  ``verify_claims`` do not match: refused with 0x86, bad user name or password (3.1.1:
  return code 4);
- otherwise accepted: ``client.attrs`` gets ``authn = "jwt"``, ``jwt_exp`` (when the
  token has ``exp``), ``jwt_acl`` (the compiled rules of the ACL claim, if any) and
  ``client_attrs`` (EMQX 5.7's claim of that name: an object of string keys and values,
  at most :data:`MAX_CLIENT_ATTRS` of them; a claim of another shape refuses the token,
  0x86). The HTTP authorization source's templates read them as
  ``${client_attrs.NAME}``.

:class:`JwtAcl` (``client.authorize``) applies ``jwt_acl``: the first matching rule
decides; no match leaves the decision to the other sources. :class:`JwtExpiry`
(``client.connected``/``client.disconnected``) disconnects a client at its token's
``exp`` with 0x87 (not authorized) when ``disconnect_after_expire``.

Invariants:

- Algorithms are fixed by ``algorithm`` (hmac-based: HS256/384/512; public-key: RS, PS,
  ES and EdDSA families), never taken from the token alone: a token cannot switch an RSA
  key into an HMAC secret.
- JWKS keys (:class:`JwksKeys`) are fetched at start and every ``refresh_interval``, and
  at once when a token names an unknown ``kid`` (such fetches at most every
  ``MIN_REFETCH`` s); the
  CONNECT waits for that fetch (a ``Deferred``). A failed fetch keeps the previous keys.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import jwt as pyjwt

from gateway.config.schema import JwtAuthnConfig
from gateway.core.authz import Authorizer, Rule
from gateway.core.clock import Scheduler, TimerHandle
from gateway.core.deferred import Deferred
from gateway.core.hooks import Stop
from protocols.context import ClientInfo
from protocols.mqtt.reason_codes import ReasonCode as RC

__all__ = ["JwksKeys", "JwtAcl", "JwtAuthenticator", "JwtExpiry", "parse_acl"]

log = logging.getLogger("gateway.auth")

HMAC_ALGS = ["HS256", "HS384", "HS512"]
PUBLIC_ALGS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
               "ES256", "ES384", "ES512", "EdDSA"]
MIN_REFETCH = 10.0
MAX_CLIENT_ATTRS = 32  # attributes a token may set (client_attrs)
_ACTIONS = {"publish": "publish", "pub": "publish", "subscribe": "subscribe",
            "sub": "subscribe", "all": "all"}


def parse_acl(claim: Any) -> list[Rule]:
    """EMQX's two ACL claim shapes: a list of ``{"permission", "action", "topic" |
    "topics"}`` (action publish/subscribe/all, or pub/sub), or the older
    ``{"pub": [...], "sub": [...], "all": [...]}`` (allow rules). ValueError when bad."""
    rules: list[Rule] = []
    if isinstance(claim, dict):
        for key in ("pub", "sub", "all"):
            topics = claim.get(key) or []
            if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
                raise ValueError(f"acl.{key} must be a list of topics")
            if topics:
                rules.append(Rule("allow", _ACTIONS[key], tuple(topics)))  # type: ignore[arg-type]
        return rules
    if not isinstance(claim, list):
        raise ValueError("acl must be a list of rules or {pub, sub, all}")
    for n, item in enumerate(claim):
        if not isinstance(item, dict):
            raise ValueError(f"acl[{n}] is not an object")
        permission = item.get("permission", "allow")
        action = _ACTIONS.get(str(item.get("action", "all")))
        topics = item.get("topics", [item["topic"]] if "topic" in item else [])
        if permission not in ("allow", "deny") or action is None or not topics:
            raise ValueError(f"acl[{n}]: needs permission allow|deny, action and topic")
        rules.append(Rule(permission, action, tuple(topics)))  # type: ignore[arg-type]
    return rules


class JwksKeys:
    """The keys of a JWKS endpoint, by ``kid`` (keys without one under ``""``)."""

    def __init__(self, url: str, *, refresh: float, timeout: float,
                 loop: asyncio.AbstractEventLoop | None = None,
                 ssl_context: Any = None, server_hostname: str | None = None) -> None:
        self.url = url
        # TLS for an https endpoint ([authentication.jwt.ssl]); None: aiohttp's default
        # (the system's CAs, the URL's host name)
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname
        self.refresh = refresh
        self.timeout = timeout
        self.loop = loop
        self.keys: dict[str, Any] = {}
        self.fetched_at = 0.0
        self.on_demand_at = -MIN_REFETCH  # the last fetch an unknown kid asked for
        self._pending: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.fetch_now()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._pending is not None:
            self._pending.cancel()

    def fetch_now(self) -> asyncio.Task[None]:
        assert self.loop is not None
        if self._pending is None or self._pending.done():
            self._pending = self.loop.create_task(self._fetch())
        return self._pending

    async def _fetch(self) -> None:
        import aiohttp

        self.fetched_at = time.monotonic()  # (the time of the last fetch, for the API)
        try:
            tls: dict[str, Any] = {}
            if self.ssl_context is not None:
                tls["ssl"] = self.ssl_context
                if self.server_hostname:
                    tls["server_hostname"] = self.server_hostname
            async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout)
            ) as s, s.get(self.url, **tls) as r:
                if r.status != 200:
                    raise OSError(f"HTTP {r.status}")
                data = json.loads(await r.content.read(1 << 20))
            jwks = pyjwt.PyJWKSet.from_dict(data)
        except (OSError, ValueError, aiohttp.ClientError, TimeoutError,
                pyjwt.PyJWKSetError) as exc:
            log.warning("JWKS from %s not loaded, keeping %d keys: %s", self.url,
                        len(self.keys), exc or type(exc).__name__)
        else:
            self.keys = {k.key_id or "": k.key for k in jwks.keys}
            log.info("JWKS from %s: %d keys", self.url, len(self.keys))
        finally:
            if self.loop is not None:
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = self.loop.call_later(self.refresh, self.fetch_now)

    def get(self, kid: str | None) -> Any | None:
        if kid is None and len(self.keys) == 1:
            return next(iter(self.keys.values()))
        return self.keys.get(kid or "")

    def may_refetch(self) -> bool:
        """A fetch is under way (wait for it), or the last one an unknown ``kid`` asked
        for began ``MIN_REFETCH`` ago or more (then it counts as begun now)."""
        if self._pending is not None and not self._pending.done():
            return True
        now = time.monotonic()
        if now - self.on_demand_at < MIN_REFETCH:
            return False
        self.on_demand_at = now
        return True


def _static_key(cfg: JwtAuthnConfig) -> Any:
    if cfg.algorithm == "hmac-based":
        return base64.b64decode(cfg.secret) if cfg.secret_base64_encoded else cfg.secret.encode()
    text = cfg.public_key
    if "-----BEGIN" not in text:
        with open(text, "rb") as f:  # a path to a PEM file
            return f.read()
    return text.encode()


class JwtAuthenticator:
    """``client.authenticate`` subscriber (module docstring)."""

    def __init__(self, cfg: JwtAuthnConfig, jwks: JwksKeys | None = None, *,
                 incr: Callable[[str], None] = lambda metric: None) -> None:
        self.cfg = cfg
        self.jwks = jwks
        self.incr = incr
        self.key = None if cfg.use_jwks else _static_key(cfg)
        self.algorithms = HMAC_ALGS if (cfg.algorithm == "hmac-based" and not cfg.use_jwks) \
            else PUBLIC_ALGS

    def __repr__(self) -> str:
        return "JwtAuthenticator()"

    def __call__(
        self, client: ClientInfo, password: bytes | None, acc: object
    ) -> Stop[int] | Deferred[Stop[int] | None] | None:
        if self.cfg.from_ == "password":
            token = password.decode("utf-8", "replace") if password else ""
        else:
            token = client.username or ""
        if token.count(".") != 2:
            return None
        try:
            header = pyjwt.get_unverified_header(token)
        except pyjwt.DecodeError:
            return None
        if self.jwks is None:
            return self._verify(client, token, self.key)
        kid = header.get("kid")
        key = self.jwks.get(kid)
        if key is not None or not self.jwks.may_refetch():
            return self._verify(client, token, key)
        out: Deferred[Stop[int] | None] = Deferred()
        task = self.jwks.fetch_now()
        task.add_done_callback(
            lambda _t: out.resolve(self._verify(client, token, self.jwks.get(kid)
                                                if self.jwks else None))
        )
        return out

    def _verify(self, client: ClientInfo, token: str, key: Any) -> Stop[int] | None:
        if key is None:
            self.incr("authentication.jwt.ignore")
            log.info("JWT of %s: no key for it, ignored", client.client_id)
            return None
        try:
            claims = pyjwt.decode(token, key, algorithms=self.algorithms,
                                  options={"verify_aud": False, "require": []})
        except pyjwt.ExpiredSignatureError:
            return self._deny(client, "expired")
        except pyjwt.ImmatureSignatureError:
            return self._deny(client, "not valid yet (nbf/iat)")
        except (pyjwt.InvalidSignatureError, pyjwt.InvalidAlgorithmError,
                pyjwt.InvalidKeyError, pyjwt.DecodeError) as exc:
            self.incr("authentication.jwt.ignore")
            log.info("JWT of %s ignored: %s", client.client_id, exc)
            return None
        except pyjwt.InvalidTokenError as exc:
            return self._deny(client, str(exc))
        values = {"${clientid}": client.client_id, "${username}": client.username or ""}
        for name, want in self.cfg.verify_claims.items():
            for placeholder, value in values.items():
                want = want.replace(placeholder, value)
            got = claims.get(name)
            if got is None or str(got) != want:
                return self._deny(client, f"claim {name!r} is {got!r}, expected {want!r}")
        acl_claim = claims.get(self.cfg.acl_claim_name)
        if acl_claim is not None:
            try:
                client.set_attr("jwt_acl", Authorizer(parse_acl(acl_claim), "deny"))
            except (ValueError, TypeError) as exc:
                return self._deny(client, f"bad {self.cfg.acl_claim_name} claim: {exc}")
        attrs = claims.get("client_attrs")
        if attrs is not None:
            if (not isinstance(attrs, dict) or len(attrs) > MAX_CLIENT_ATTRS
                    or not all(isinstance(k, str) and isinstance(v, str) and k
                               and len(k) <= 64 and len(v) <= 1024
                               for k, v in attrs.items())):
                return self._deny(client, "client_attrs must be an object of at most "
                                  f"{MAX_CLIENT_ATTRS} strings (names up to 64 characters, "
                                  "values up to 1024)")
            client.set_attr("client_attrs", dict(attrs))
        if isinstance(claims.get("exp"), int | float):
            client.set_attr("jwt_exp", float(claims["exp"]))
        client.set_attr("authn", "jwt")
        if claims.get("is_superuser") is True:
            client.set_attr("is_superuser", True)
        self.incr("authentication.jwt.allow")
        return Stop(0)

    def _deny(self, client: ClientInfo, why: str) -> Stop[int]:
        self.incr("authentication.jwt.deny")
        log.info("JWT of %s refused: %s", client.client_id, why)
        return Stop(RC.BAD_USER_NAME_OR_PASSWORD)


class JwtAcl:
    """``client.authorize`` subscriber: the token's ACL claim, first match decides."""

    def __repr__(self) -> str:
        return "JwtAcl()"

    def __call__(self, client: ClientInfo, action: str, topic: str, acc: bool
                 ) -> Stop[bool] | None:
        authz = client.attrs.get("jwt_acl") if client.attrs else None
        if authz is None:
            return None
        from protocols.mqtt.topics import parse_shared

        checked = parse_shared(topic)[1] if action == "subscribe" else topic
        decided = authz.decide(action, checked, clientid=client.client_id,
                               username=client.username, peer_ip=client.peer_host,
                               client_attrs=client.attrs.get("client_attrs"))
        return None if decided is None else Stop(decided)


class JwtExpiry:
    """Disconnects clients at their token's ``exp`` (``client.connected`` starts the
    timer, ``client.disconnected`` drops it). ``kick(client)`` ends the connection."""

    def __init__(self, scheduler: Scheduler, kick: Callable[[ClientInfo], bool]) -> None:
        self.scheduler = scheduler
        self.kick = kick
        self.timers: dict[int, TimerHandle] = {}

    def connected(self, client: ClientInfo) -> None:
        exp = client.attrs.get("jwt_exp") if client.attrs else None
        if exp is None:
            return

        def fire() -> None:
            self.timers.pop(id(client), None)
            if self.kick(client):
                log.info("client %s disconnected: its JWT expired", client.client_id)

        self.timers[id(client)] = self.scheduler.call_later(exp - self.scheduler.time(), fire)

    def disconnected(self, client: ClientInfo) -> None:
        timer = self.timers.pop(id(client), None)
        if timer is not None:
            timer.cancel()
