"""Loading the configuration: embedded defaults, then the TOML file, then the environment.

Layers, each deep-merged over the previous one:

1. embedded defaults (the schema's defaults, plus the ``listeners.tcp.default`` listener,
   so a file or variable that names another listener adds to it rather than replacing it);
2. the TOML file given to ``gatewayd --config`` (optional);
3. environment variables ``GATEWAY_A__B__C=value`` setting key ``a.b.c`` (lowercased; a
   double underscore nests). Only names with at least one ``__`` after the prefix count,
   so unrelated variables such as CGI's ``GATEWAY_INTERFACE`` are left alone. The value
   is read as a TOML value when it parses as one (``true``, ``123``, ``"x"``, ``[1, 2]``),
   otherwise it is taken as a plain string (``127.0.0.1:1883``, ``30s``).

pydantic validates the merged tree; its errors become one :class:`ConfigError` whose
message is a single line naming each dotted key and its problem.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gateway.config.schema import AuthzRule, GatewayConfig, RulesFile

ENV_PREFIX = "GATEWAY_"
_MAX_REPORTED = 5

Tree = dict[str, Any]
Loc = tuple[str | int, ...]


class ConfigError(Exception):
    """An invalid configuration; ``message`` is one line naming the key and the problem."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def load_config(
    path: str | Path | None = None,
    environ: Mapping[str, str] = os.environ,
    *,
    first_run: bool = False,
) -> GatewayConfig:
    """The validated configuration from defaults, the file at ``path`` and ``environ``.

    ``first_run`` puts :data:`gateway.config.first_run.FIRST_RUN` (every front-end on its
    standard port) between the embedded defaults and the file.

    ``authorization.rules_file`` comes back resolved (a relative path is taken relative to
    the configuration file) and already validated; ``authorization.rules`` holds only the
    inline rules, so the authorizer evaluates ``rules`` then ``load_rules_file(rules_file)``.
    """
    tree: Tree = {"listeners": {"tcp": {"default": {}}}}
    if first_run:
        from gateway.config.first_run import FIRST_RUN

        _merge(tree, copy.deepcopy(FIRST_RUN))
    if path is not None:
        _merge(tree, _read_toml(Path(path)))
    env_keys = _apply_environment(tree, environ)
    try:
        config = GatewayConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc, env_keys)) from None

    authz = config.authorization
    if authz.rules_file is not None:
        rules_path = authz.rules_file
        if not rules_path.is_absolute() and path is not None:
            rules_path = Path(path).parent / rules_path  # relative to the config file
        if not rules_path.is_file():
            raise ConfigError(f'authorization.rules_file: no such file "{rules_path}"')
        load_rules_file(rules_path)  # validate now, before anything opens
        authz.rules_file = rules_path
    _check_ssl_listeners(config, path)
    _check_dtls_listeners(config, path)
    _check_bridge_tls(config, path)
    _check_jwks_tls(config, path)
    _check_api_tls(config, path)
    return config


def _resolve(section: Any, keys: tuple[str, ...], path: str | Path | None) -> None:
    """Make the relative file paths among ``keys`` of ``section`` relative to the
    configuration file's directory (they stay as given without a file)."""
    for key in keys:
        value = getattr(section, key)
        if path is None or value is None:
            continue
        if isinstance(value, list):  # crlfile
            setattr(section, key, [v if v.is_absolute() else Path(path).parent / v
                                   for v in value])
        elif not value.is_absolute():
            setattr(section, key, Path(path).parent / value)


def _check_ssl_listeners(config: GatewayConfig, path: str | Path | None) -> None:
    """Resolve each ssl listener's files (relative to the configuration file, like
    ``rules_file``) and load every enabled one, so a missing or broken certificate stops
    gatewayd with one line naming the key, before any listener opens."""
    from gateway.net.tls import TlsError, build_context  # lazy: gateway.net imports config

    tls_listeners = [("ssl", n, lst) for n, lst in config.listeners.ssl.items()]
    tls_listeners += [("wss", n, lst) for n, lst in config.listeners.wss.items()]
    for kind, name, listener in tls_listeners:
        _resolve(listener, ("certfile", "keyfile", "cacertfile", "password_file", "crlfile"),
                 path)
        _resolve(listener.ocsp, ("issuer_pem",), path)
        if listener.enable:
            try:
                build_context(listener)
            except TlsError as exc:
                raise ConfigError(f"listeners.{kind}.{name}.{exc.key}: {exc.reason}") from None


def _check_api_tls(config: GatewayConfig, path: str | Path | None) -> None:
    """``[api] certfile``/``keyfile`` (and ``password``/``password_file``): resolved like
    an ssl listener's and loaded now."""
    api = config.api
    _resolve(api, ("certfile", "keyfile", "password_file"), path)
    _resolve(api.ocsp, ("issuer_pem",), path)
    if api.enable and api.certfile is not None:
        from gateway.net.tls import TlsError, build_context

        try:
            build_context(api_tls_listener(config))
        except TlsError as exc:
            raise ConfigError(f"api.{exc.key}: {exc.reason}") from None


def api_tls_listener(config: GatewayConfig) -> Any:
    """The API's TLS settings as an ssl listener section, for :mod:`gateway.net.tls`."""
    from gateway.config.listeners import SslListener

    api = config.api
    return SslListener(bind=api.bind, certfile=api.certfile, keyfile=api.keyfile,
                       password=api.password, password_file=api.password_file,
                       ocsp=api.ocsp)


def _check_dtls_listeners(config: GatewayConfig, path: str | Path | None) -> None:
    """As :func:`_check_ssl_listeners` for the CoAP and LwM2M DTLS listeners (their
    ``psk_file`` too): a bad file stops gatewayd with one line naming the key."""
    from gateway.net.dtls import DtlsError, build_dtls_context  # lazy, as above

    gateways = {"coap": config.gateway.coap, "lwm2m": config.gateway.lwm2m}
    for gw_name, gw in gateways.items():
        if gw is None:
            continue
        for name, listener in gw.listeners.dtls.items():
            _resolve(listener, ("psk_file", "certfile", "keyfile", "cacertfile", "crlfile",
                                "password_file"), path)
            if listener.enable and gw.enable:
                try:
                    build_dtls_context(listener)
                except DtlsError as exc:
                    raise ConfigError(
                        exc.where(f"gateway.{gw_name}.listeners.dtls.{name}")
                    ) from None


def _check_bridge_tls(config: GatewayConfig, path: str | Path | None) -> None:
    """The same for each bridge's ``tls`` files: relative to the configuration file, and
    loaded now when the bridge and its TLS are enabled."""
    from gateway.bridge.tls import client_context  # lazy: gateway.bridge imports config
    from gateway.net.tls import TlsError

    for name, bridge in config.bridges.mqtt.items():
        tls = bridge.tls
        _resolve(tls, ("certfile", "keyfile", "cacertfile", "password_file", "crlfile"), path)
        if bridge.enable and tls.enable:
            try:
                client_context(tls)
            except TlsError as exc:
                raise ConfigError(f"bridges.mqtt.{name}.tls.{exc.key}: {exc.reason}") from None


def _check_jwks_tls(config: GatewayConfig, path: str | Path | None) -> None:
    """``[authentication.jwt.ssl]`` (TLS for the JWKS fetch), as a bridge's ``tls``."""
    from gateway.bridge.tls import client_context
    from gateway.net.tls import TlsError

    jwt = config.authentication.jwt
    tls = jwt.ssl
    _resolve(tls, ("certfile", "keyfile", "cacertfile", "password_file", "crlfile"), path)
    if jwt.enable and jwt.use_jwks and tls.enable:
        try:
            client_context(tls)
        except TlsError as exc:
            raise ConfigError(f"authentication.jwt.ssl.{exc.key}: {exc.reason}") from None


def load_rules_file(path: str | Path) -> list[AuthzRule]:
    """The rules of an authorization rules file (``[[rules]]`` tables), in file order.

    Errors name the file and the rule, e.g. ``acl.toml: rules[2].permission: ...``.
    """
    data = _read_toml(Path(path))
    try:
        return RulesFile.model_validate(data).rules
    except ValidationError as exc:
        raise ConfigError(f"{path}: {describe_errors(exc)}") from None


# ------------------------------------------------------------------ layers


def _read_toml(path: Path) -> Tree:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def _merge(base: Tree, override: Mapping[str, Any]) -> None:
    """Deep-merge ``override`` into ``base``: tables merge, every other value replaces."""
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def _apply_environment(tree: Tree, environ: Mapping[str, str]) -> dict[Loc, str]:
    """Set every ``GATEWAY_A__B=value`` key in ``tree``; returns key path -> variable name."""
    applied: dict[Loc, str] = {}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or "__" not in name[len(ENV_PREFIX) :]:
            continue
        keys = name[len(ENV_PREFIX) :].lower().split("__")
        if not all(keys):
            raise ConfigError(f"{name}: empty key between double underscores")
        table = tree
        for key in keys[:-1]:
            child = table.get(key)
            if not isinstance(child, dict):
                child = table[key] = {}
            table = child
        table[keys[-1]] = parse_env_value(environ[name])
        applied[tuple(keys)] = name
    return applied


def parse_env_value(text: str) -> Any:
    """A TOML value when ``text`` is one (``true``, ``12``, ``"x"``, ``[1]``), else ``text``."""
    if "\n" in text or "\r" in text:
        return text
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    if isinstance(value, datetime.date | datetime.time):
        return text  # a date-like string is meant as a string
    return value


# ------------------------------------------------------------------ error messages


def describe_errors(exc: ValidationError, env_keys: Mapping[Loc, str] | None = None) -> str:
    """pydantic's errors as one line: ``key: problem (got value)``, joined by ``"; "``."""
    parts = []
    errors = exc.errors(include_url=False)
    for error in errors[:_MAX_REPORTED]:
        loc: Loc = tuple(error["loc"])
        line = _describe_one(error["type"], dotted_key(loc), error["msg"], error.get("input"))
        source = _env_source(loc, env_keys or {})
        if source:
            line += f" [from {source}]"
        parts.append(line)
    if len(errors) > _MAX_REPORTED:
        parts.append(f"and {len(errors) - _MAX_REPORTED} more")
    return "; ".join(parts)


def dotted_key(loc: Loc) -> str:
    """``("authorization", "rules", 2, "permission")`` -> ``authorization.rules[2].permission``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _describe_one(kind: str, key: str, msg: str, value: Any) -> str:
    if kind == "extra_forbidden":
        return f"unknown key {key}"
    if kind == "missing":
        return f"{key}: missing required key"
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    prefix = f"{key}: " if key else ""
    shown = _show(value)
    if shown is None:
        return f"{prefix}{msg}"
    if kind in ("value_error", "assertion_error"):
        return f"{prefix}{msg}, got {shown}"
    return f"{prefix}{msg} (got {shown})"


def _show(value: Any) -> str | None:
    """A short TOML-like rendering of an offending value; None for tables and lists."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        text = str(value)
        if len(text) > 60:
            text = text[:57] + "..."
        return json.dumps(text)
    return None


def _env_source(loc: Loc, env_keys: Mapping[Loc, str]) -> str | None:
    for keys, name in env_keys.items():
        if loc[: len(keys)] == keys:
            return name
    return None
