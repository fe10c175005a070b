"""The API token: from ``[api] token``, or a file generated at the first start.

The file (``[api] token_file``, default ``{node.data_dir}/api.token``) holds one line:
the token. ``gatewayd`` creates it with mode 0600 (owner read/write only) when it does not
exist and never rewrites it; to rotate the token, delete the file and restart, or set
``[api] token``. ``gatewayctl`` reads the same file, so it must run as the gateway's user
(or root), or be given the token through ``GATEWAY_API__TOKEN``.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from pathlib import Path
from typing import Any

TOKEN_FILE_NAME = "api.token"

log = logging.getLogger("gateway.admin")


class TokenError(Exception):
    """The token cannot be had; the message is one line for humans."""


def token_path(config: Any) -> Path:
    api = config.api
    if api.token_file is not None:
        return Path(api.token_file)
    return Path(config.node.data_dir) / TOKEN_FILE_NAME


def ensure_token(config: Any) -> str:
    """The configured token, or the token file's (created with mode 0600 if missing)."""
    if config.api.token:
        return str(config.api.token)
    path = token_path(config)
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    except TokenError:
        # empty: a power cut or a file-system error between its creation and its data
        # reaching the disk; a new token replaces it (clients read the file again)
        log.warning("the API token file %s is empty: writing a new token", path)
        token = secrets.token_urlsafe(32)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process won the race: use its token
        return _read(path)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
        f.flush()
        os.fsync(f.fileno())  # or a power cut may leave it empty
    return token


def read_token(config: Any) -> str:
    """The token for a client (``gatewayctl``): configured, or read from the file."""
    if config.api.token:
        return str(config.api.token)
    path = token_path(config)
    try:
        return _read(path)
    except FileNotFoundError:
        raise TokenError(
            f"no API token: {path} does not exist (it is created when gatewayd starts)"
        ) from None
    except PermissionError:
        raise TokenError(
            f"cannot read the API token {path}: permission denied "
            "(run as the gateway's user or root, or set GATEWAY_API__TOKEN)"
        ) from None
    except OSError as exc:
        raise TokenError(f"cannot read the API token {path}: {exc.strerror}") from None


def _read(path: Path) -> str:
    token = path.read_text(encoding="utf-8").strip()
    if not token:
        raise TokenError(f"the API token file {path} is empty")
    return token


def check_bearer(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries the token (constant time)."""
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), token.encode())
