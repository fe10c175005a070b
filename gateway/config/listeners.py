"""The stream listeners' sections: ``[listeners.tcp|ssl|ws|wss.<name>]``."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    field_validator,
    model_validator,
)

from gateway.config.values import (
    Bind,
    ByteRate,
    Duration,
    Network,
    Rate,
    Size,
    _lower,
    _Section,
    _split_commas,
    parse_bind,
)

# The default listen backlog: a reconnect storm of 5,000 devices at once is absorbed
# without a SYN retransmit on a 2-core unit (bench/README.md, "Connection rate"); the kernel
# caps it at net.core.somaxconn (4096 since Linux 5.4; systemd/sysctl.d profiles set it).
DEFAULT_BACKLOG = 4096
MAX_BACKLOG = 65535  # listen(2) stores it in 16 bits; somaxconn cannot exceed it either
# The transport of plain-TCP listeners (tcp, ws): gateway/net/lean.py, or the event loop's.
# "lean": it halves idle memory (0.94 KiB a connection at 10,000, issue 23's target) and
# connects ~20 % cheaper, for +3 to +6 % CPU per message (bench/README.md, "Lean
# transport"). An edge unit runs out of memory with many idle devices and meets reconnect
# storms before it runs out of message throughput; "asyncio" is one setting away.
DEFAULT_TRANSPORT: Literal["lean", "asyncio"] = "lean"


class TcpListener(_Section):
    enable: bool = True
    bind: Bind = "0.0.0.0:1883"
    max_connections: int = Field(default=1_024_000, ge=1)
    # listen(2) backlog: connections the kernel completes and queues before we accept
    # them (EMQX's tcp_options.backlog); the kernel caps it at net.core.somaxconn
    backlog: int = Field(default=DEFAULT_BACKLOG, ge=1, le=MAX_BACKLOG)
    allow: Annotated[list[Network], BeforeValidator(_split_commas)] = Field(default_factory=list)
    deny: Annotated[list[Network], BeforeValidator(_split_commas)] = Field(default_factory=list)
    mountpoint: str = ""
    # protection: new connections per second accepted (beyond: closed at accept; 0 = no
    # limit), and per-client rates overriding [mqtt]'s (None: [mqtt]'s)
    max_conn_rate: Rate = 0.0
    messages_rate: Rate | None = None
    bytes_rate: ByteRate | None = None
    # slow readers: a client that leaves our writes blocked for send_timeout (0 = never),
    # or with more than max_send_buffer bytes unsent (0 = no limit), is disconnected
    send_timeout: Duration = 15.0
    max_send_buffer: Size = 64 << 20
    # the connection's transport: "lean" (gateway/net/lean.py: one epoll per listener,
    # ~0.1 KiB per connection) or "asyncio" (the event loop's own, uvloop's ~1.2 KiB)
    transport: Literal["lean", "asyncio"] = DEFAULT_TRANSPORT

    @property
    def host(self) -> str:
        """The bind host without IPv6 brackets (``"0.0.0.0"``, ``"::1"``, ``"localhost"``)."""
        return parse_bind(self.bind)[0]

    @property
    def port(self) -> int:
        return parse_bind(self.bind)[1]

    @property
    def allow_networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        """``allow`` as networks; empty means every peer is allowed (unless denied)."""
        return [ipaddress.ip_network(n, strict=False) for n in self.allow]

    @property
    def deny_networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(n, strict=False) for n in self.deny]


def _default_tcp_listeners() -> dict[str, TcpListener]:
    return {"default": TcpListener()}


# ------------------------------------------------------------------ TLS listeners

TLS_VERSIONS = ("tlsv1", "tlsv1.1", "tlsv1.2", "tlsv1.3")  # oldest first
TlsVersion = Literal["tlsv1", "tlsv1.1", "tlsv1.2", "tlsv1.3"]
DEFAULT_TLS_VERSIONS: tuple[TlsVersion, ...] = ("tlsv1.2", "tlsv1.3")
TlsVerify = Literal["verify_none", "verify_peer"]
PeerCertField = Literal["none", "cn", "dn", "san", "crt", "pem", "md5"]
FailMode = Literal["open", "closed"]


class KeyPassword(_Section):
    """Mixin for sections with an encrypted ``keyfile``: ``password`` or ``password_file``
    (EMQX's ``password``; the file's first line, so the secret stays out of the
    configuration). At most one of them."""

    password: str | None = None
    password_file: Path | None = None

    @model_validator(mode="after")
    def _one_password(self) -> KeyPassword:
        if self.password is not None and self.password_file is not None:
            raise ValueError("give password or password_file, not both")
        return self


class OcspStapling(_Section):
    """``[listeners.ssl.<name>.ocsp]`` (EMQX's names): staple an OCSP response for our own
    certificate, fetched from ``responder_url`` (issuer: ``issuer_pem``) every
    ``refresh_interval``, to every handshake that asks for it (``openssl s_client
    -status``)."""

    enable_ocsp_stapling: bool = False
    responder_url: str = ""
    issuer_pem: Path | None = None
    refresh_interval: Annotated[Duration, Field(ge=60)] = 300.0
    refresh_http_timeout: Annotated[Duration, Field(gt=0)] = 15.0

    @model_validator(mode="after")
    def _needs(self) -> OcspStapling:
        if self.enable_ocsp_stapling and (not self.responder_url or self.issuer_pem is None):
            raise ValueError("enable_ocsp_stapling needs responder_url and issuer_pem")
        return self


class OcspCheck(_Section):
    """``[listeners.ssl.<name>.ocsp_check]`` (ours): ask an OCSP responder about each
    client certificate (``responder_url``, or "" for the certificate's own AIA URL);
    answers are cached for ``cache_ttl`` (or until the response's nextUpdate when
    earlier) and live connections are asked again each ``cache_ttl``."""

    enable: bool = False
    responder_url: str = ""
    cache_ttl: Annotated[Duration, Field(gt=0)] = 300.0
    http_timeout: Annotated[Duration, Field(gt=0)] = 5.0
    fail_mode: FailMode = "closed"


def _join_ciphers(value: object) -> object:
    # EMQX writes ciphers as a list; OpenSSL wants one colon-separated string.
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ":".join(value)
    return value


def _no_peer_keys(listener: Any, *more: str) -> None:
    """Without ``verify = "verify_peer"`` no client certificate is asked for, so the keys
    that use one must stay off (the first one set is named)."""
    for key in ("fail_if_no_peer_cert", "peer_cert_as_clientid", "peer_cert_as_username", *more):
        if getattr(listener, key) not in (False, "none"):
            raise ValueError(f'{key} needs verify = "verify_peer"')


class SslListener(TcpListener, KeyPassword):
    """``[listeners.ssl.<name>]``: a TCP listener that speaks TLS (MQTT over TLS, 8883).

    Cross-field rules are checked here; that the files exist and load (and that the key
    matches the certificate) is checked by the loader, which also resolves relative paths
    against the configuration file's directory. ``verify = "verify_peer"`` asks clients
    for a certificate signed by ``cacertfile``; ``fail_if_no_peer_cert`` makes it
    mandatory (mutual TLS). ``peer_cert_as_clientid``/``peer_cert_as_username`` replace
    the CONNECT's client id/username by the certificate's ``cn``, ``dn`` (RFC 4514) or
    ``san`` (first DNS or URI subject alternative name). ``peer_cert_authenticates``: a
    verified client certificate alone authenticates a client that sends no password
    (mosquitto's ``use_identity_as_username``); the authentication chain and
    ``allow_anonymous`` then do not apply to it.
    """

    bind: Bind = "0.0.0.0:8883"
    # TLS runs on the event loop's transport (the lean one speaks plain TCP only)
    transport: Literal["asyncio"] = "asyncio"
    certfile: Path | None = None
    keyfile: Path | None = None
    cacertfile: Path | None = None
    verify: Annotated[TlsVerify, BeforeValidator(_lower)] = "verify_none"
    fail_if_no_peer_cert: bool = False
    versions: Annotated[
        list[Annotated[TlsVersion, BeforeValidator(_lower)]],
        BeforeValidator(_split_commas),
        Field(min_length=1),
    ] = Field(default_factory=lambda: list(DEFAULT_TLS_VERSIONS))
    ciphers: Annotated[str, BeforeValidator(_join_ciphers)] = ""  # "": OpenSSL's defaults
    peer_cert_as_clientid: Annotated[PeerCertField, BeforeValidator(_lower)] = "none"
    peer_cert_as_username: Annotated[PeerCertField, BeforeValidator(_lower)] = "none"
    peer_cert_authenticates: bool = False
    # chain depth: intermediate CAs allowed between a client certificate and cacertfile
    depth: int = Field(default=10, ge=0, le=100)
    # revocation (docs/security.md "Revocation"): CRL files checked at the handshake and
    # re-read on change and SIGHUP; enable_crl_check: the client certificates' CRL
    # distribution points, fetched and cached as [crl_cache] says
    crlfile: Annotated[list[Path], BeforeValidator(_split_commas)] = Field(default_factory=list)
    enable_crl_check: bool = False
    ocsp: OcspStapling = Field(default_factory=OcspStapling)
    ocsp_check: OcspCheck = Field(default_factory=OcspCheck)

    @model_validator(mode="after")
    def _consistent_tls(self) -> SslListener:
        if self.enable and (self.certfile is None or self.keyfile is None):
            raise ValueError("an enabled ssl listener needs certfile and keyfile")
        if self.verify == "verify_peer":
            if self.cacertfile is None:
                raise ValueError('verify = "verify_peer" needs cacertfile (the clients\' CA)')
        else:
            _no_peer_keys(self, "peer_cert_authenticates")
            if self.crlfile or self.enable_crl_check or self.ocsp_check.enable:
                raise ValueError('revocation checks (crlfile, enable_crl_check, ocsp_check) '
                                 'need verify = "verify_peer"')
        indexes = sorted({TLS_VERSIONS.index(v) for v in self.versions})
        if indexes != list(range(indexes[0], indexes[-1] + 1)):
            raise ValueError(f"versions must be a contiguous range, got {self.versions}")
        return self

    @property
    def min_version(self) -> TlsVersion:
        return min(self.versions, key=TLS_VERSIONS.index)

    @property
    def max_version(self) -> TlsVersion:
        return max(self.versions, key=TLS_VERSIONS.index)


# ------------------------------------------------------------------ WebSocket listeners

MQTT_WS_SUBPROTOCOLS = ("mqtt", "mqtt-v3.1.1", "mqtt-v3", "mqtt-v5")


def _check_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError('expected an absolute path such as "/mqtt"')
    return value


class WebSocketOptions(_Section):
    """``[listeners.ws.<name>.websocket]`` (and ``wss``): EMQX's ``websocket`` options.

    ``proxy_address_header``/``proxy_port_header`` ("" turns them off) are believed only
    from peers in ``trusted_proxies``; ``max_frame_size`` 0 means no limit of its own (the
    MQTT ``max_packet_size`` still holds); ``handshake_timeout`` bounds the HTTP upgrade.
    """

    mqtt_path: Annotated[str, AfterValidator(_check_path)] = "/mqtt"
    supported_subprotocols: Annotated[
        list[str], BeforeValidator(_split_commas), Field(min_length=1)
    ] = Field(default_factory=lambda: list(MQTT_WS_SUBPROTOCOLS))
    fail_if_no_subprotocol: bool = True
    check_origin_enable: bool = False
    allow_origin_absence: bool = True
    check_origins: Annotated[list[str], BeforeValidator(_split_commas)] = Field(
        default_factory=list
    )
    proxy_address_header: str = "x-forwarded-for"
    proxy_port_header: str = "x-forwarded-port"
    trusted_proxies: Annotated[list[Network], BeforeValidator(_split_commas)] = Field(
        default_factory=lambda: ["127.0.0.0/8", "::1/128"]
    )
    max_frame_size: Size = 0
    handshake_timeout: Annotated[Duration, Field(gt=0)] = 15.0


class WsListener(TcpListener):
    """``[listeners.ws.<name>]``: MQTT over WebSocket (8083)."""

    bind: Bind = "0.0.0.0:8083"
    websocket: WebSocketOptions = Field(default_factory=WebSocketOptions)


class WssListener(SslListener):
    """``[listeners.wss.<name>]``: MQTT over secure WebSocket (8084); the TLS keys of an
    ssl listener plus ``websocket``."""

    bind: Bind = "0.0.0.0:8084"
    websocket: WebSocketOptions = Field(default_factory=WebSocketOptions)


class Listeners(_Section):
    tcp: dict[str, TcpListener] = Field(default_factory=_default_tcp_listeners)
    # No ssl listener by default: there are no certificates by default.
    ssl: dict[str, SslListener] = Field(default_factory=dict)
    # No WebSocket listener by default either (EMQX opens 8083/8084): add one with
    # [listeners.ws.default] or GATEWAY_LISTENERS__WS__DEFAULT__ENABLE=true.
    ws: dict[str, WsListener] = Field(default_factory=dict)
    wss: dict[str, WssListener] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _distinct_binds_across_kinds(self) -> Listeners:
        seen: dict[str, str] = {}
        tables: tuple[tuple[str, Mapping[str, TcpListener]], ...] = (
            ("tcp", self.tcp), ("ssl", self.ssl), ("ws", self.ws), ("wss", self.wss)
        )
        for kind, table in tables:
            for name, listener in table.items():
                if not listener.enable or listener.port == 0:
                    continue
                where = f"{kind}.{name}"
                if listener.bind in seen:  # (two tcp listeners were refused above)
                    raise ValueError(
                        f"listeners {seen[listener.bind]} and {where} both bind {listener.bind}"
                    )
                seen.setdefault(listener.bind, where)
        return self

    @field_validator("tcp")
    @classmethod
    def _distinct_binds(cls, tcp: dict[str, TcpListener]) -> dict[str, TcpListener]:
        seen: dict[str, str] = {}
        for name, listener in tcp.items():
            if not listener.enable or listener.port == 0:
                continue
            if listener.bind in seen:
                raise ValueError(
                    f"listeners {seen[listener.bind]!r} and {name!r} both bind {listener.bind}"
                )
            seen[listener.bind] = name
        return tcp


