"""How ``gatewayctl`` reaches a node: the same configuration as ``gatewayd`` (file and
``GATEWAY_*`` environment), then HTTP to its management API with its token.

- The file is ``--config FILE``, else ``$GATEWAY_CONFIG``, else
  ``/etc/gateway/gateway.toml`` when it exists, else the embedded defaults.
- The API address is ``[api] bind`` (a wildcard bind is reached on loopback); the token is
  ``[api] token`` or the token file (:mod:`gateway.admin.tokens`).
- A node that does not answer is reported in one line, exit status 3 (LSB's "program is
  not running"); other errors are one line, exit status 1 (2 for an invalid
  configuration). Never a traceback.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click

from gateway.admin.tokens import TokenError, read_token
from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.config.schema import parse_bind

DEFAULT_CONFIG = Path("/etc/gateway/gateway.toml")
API = "/api/v5"
TIMEOUT = 10.0
EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_NODE_DOWN = 3

F = TypeVar("F", bound=Callable[..., Any])


class CtlError(click.ClickException):
    """One line on stderr (``gatewayctl: ...``) and exit status 1."""

    exit_code = EXIT_ERROR

    def show(self, file: Any = None) -> None:
        click.echo(f"gatewayctl: {self.format_message()}", err=True)


class ConfigInvalid(CtlError):
    """Exit status 2: the configuration is invalid or unreadable."""

    exit_code = EXIT_CONFIG


class NodeDown(CtlError):
    """Exit status 3 (LSB "program is not running"): nothing answers at the API."""

    exit_code = EXIT_NODE_DOWN


def config_option(f: F) -> F:
    """``-c/--config FILE`` (also ``$GATEWAY_CONFIG``)."""
    return click.option(
        "-c",
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="GATEWAY_CONFIG",
        help=f"gatewayd's configuration file (default: $GATEWAY_CONFIG, or {DEFAULT_CONFIG} "
        "when it exists). GATEWAY_* variables override it, as for gatewayd.",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(f)


def load(config_path: Path | None, *, environ: Any = None) -> GatewayConfig:
    path = config_path
    if path is None and DEFAULT_CONFIG.is_file():
        path = DEFAULT_CONFIG
    try:
        return load_config(path, os.environ if environ is None else environ)
    except ConfigError as exc:
        raise ConfigInvalid(f"invalid configuration: {exc.message}") from None
    except OSError as exc:
        raise ConfigInvalid(f"cannot read {path}: {exc.strerror}") from None


def connect(config_path: Path | None) -> ApiClient:
    config = load(config_path)
    if not config.api.enable:
        raise CtlError("the management API is disabled ([api] enable = false)")
    host, port = parse_bind(config.api.bind)
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    try:
        token: str | None = read_token(config)
        token_error = ""
    except TokenError as exc:
        token, token_error = None, str(exc)
    client = ApiClient(host, port, token, node=config.node.name, token_error=token_error)
    if config.api.certfile is not None:
        # trust exactly the node's own certificate (self-signed or a CA's leaf); the
        # loopback address we dial is rarely among its names
        ctx = ssl.create_default_context(cafile=str(config.api.certfile))
        ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        ctx.check_hostname = False
        client.ssl_context = ctx
    return client


class ApiClient:
    def __init__(self, host: str, port: int, token: str | None, *, node: str,
                 token_error: str = "", timeout: float = TIMEOUT) -> None:
        self.host = host
        self.port = port
        self.token = token
        self.node = node
        self.token_error = token_error
        self.timeout = timeout
        self.ssl_context: ssl.SSLContext | None = None  # [api] certfile: HTTPS

    @property
    def where(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def _down(self, exc: BaseException | None = None) -> CtlError:
        why = ": timed out" if isinstance(exc, TimeoutError) else ""
        return NodeDown(f"node {self.node} is not running (nothing answers at {self.where}{why})")

    def _connection(self, timeout: float | None) -> http.client.HTTPConnection:
        if self.ssl_context is not None:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=self.ssl_context)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _send(self, method: str, path: str, params: dict[str, Any] | None, body: Any,
              *, auth: bool = True, timeout: float | None = None
              ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        query = {k: _q(v) for k, v in (params or {}).items() if v is not None}
        url = path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = {"Accept": "application/json"}
        if auth:
            if self.token is None:
                self.request("GET", "/status", auth=False)  # node down? say so first
                raise CtlError(self.token_error)
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = self._connection(self.timeout if timeout is None else timeout)
        try:
            conn.request(method, url, body=data, headers=headers)
            response = conn.getresponse()
        except (TimeoutError, ConnectionRefusedError, ConnectionResetError,
                http.client.RemoteDisconnected) as exc:
            conn.close()
            raise self._down(exc) from None
        except OSError as exc:
            conn.close()
            if exc.errno in (101, 113, 99):  # unreachable, no route, cannot assign
                raise self._down(exc) from None
            raise CtlError(f"cannot reach {self.where}: {exc.strerror or exc}") from None
        return conn, response

    def request(self, method: str, path: str, params: dict[str, Any] | None = None,
                body: Any = None, *, auth: bool = True) -> Any:
        conn, response = self._send(method, path, params, body, auth=auth)
        try:
            raw = response.read()
        finally:
            conn.close()
        if response.status == 204:
            return None
        ctype = response.getheader("Content-Type", "")
        if ctype.startswith("application/json"):
            payload = json.loads(raw or b"null")
        else:
            payload = raw.decode("utf-8", "replace")
        if response.status >= 400:
            raise _api_error(response.status, payload)
        return payload

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", API + path, params)

    def delete(self, path: str, **params: Any) -> Any:
        return self.request("DELETE", API + path, params)

    def get_all(self, path: str, *, limit: int | None = None, **params: Any) -> tuple[
            list[Any], int]:
        """Every item of a paginated list (up to ``limit``) and the total count."""
        items: list[Any] = []
        page = 1
        per_page = min(limit or 1000, 1000)
        while True:
            body = self.get(path, page=page, limit=per_page, **params)
            items.extend(body["data"])
            count = int(body["meta"]["count"])
            if not body["meta"]["hasnext"] or (limit is not None and len(items) >= limit):
                return (items[:limit] if limit is not None else items), count
            page += 1

    def stream(self, path: str, params: dict[str, Any], *,
               deadline: float | None = None) -> Iterator[dict[str, Any]]:
        """Server-sent events of ``path`` as dicts, until the server ends the stream or
        ``deadline`` (``time.monotonic()``) passes."""
        import time

        conn, response = self._send("GET", API + path, params, None, timeout=None)
        try:
            if response.status >= 400:
                raw = response.read()
                try:
                    payload = json.loads(raw)
                except ValueError:
                    payload = raw.decode("utf-8", "replace")
                raise _api_error(response.status, payload)
            sock = conn.sock
            while True:
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    if sock is not None:
                        sock.settimeout(left)
                try:
                    line = response.readline()
                except TimeoutError:
                    return
                if not line:
                    return
                if line.startswith(b"data:"):
                    yield json.loads(line[5:].strip())
        finally:
            conn.close()


def _q(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _api_error(status: int, payload: Any) -> CtlError:
    if isinstance(payload, dict) and "message" in payload:
        message = str(payload["message"])
        if status == 401:
            message += " (check [api] token or the token file)"
        return CtlError(message)
    return CtlError(f"HTTP {status}: {str(payload)[:200]}")


def path_arg(value: str) -> str:
    """A topic or client id as one percent-encoded path segment."""
    return urllib.parse.quote(value, safe="")


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()
