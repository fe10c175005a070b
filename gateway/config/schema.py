"""The configuration schema: pydantic models shaped like EMQX's configuration.

Invariants:

- Every model forbids unknown keys, so a typo is an error, never a silently ignored key.
- Durations are stored as ``float`` seconds and sizes as ``int`` bytes; the file and the
  environment may write them as numbers or with units (``"500ms"``, ``"30s"``, ``"5m"``,
  ``"2h"``, ``"1d"``; ``"64KB"``, ``"1MB"``, ``"1GB"``, 1024-based).
- Attribute names are a contract read by the rest of the code base; the defaults here are
  the embedded defaults documented in docs/configuration.md.

The models are plain data (no I/O). Reading files and the environment is the loader's job.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    field_validator,
    model_validator,
)

# ------------------------------------------------------------------ value syntaxes

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
}
_SIZE_RE = re.compile(r"(\d+)\s*([kmg]?b?)", re.IGNORECASE)

DURATION_HINT = 'expected a duration such as 30, "500ms", "30s", "5m", "2h" or "1d"'
SIZE_HINT = 'expected a size such as 1024, "64KB", "1MB" or "1GB"'


def parse_duration(value: object) -> float:
    """Seconds from an int/float of seconds or a string with a unit (ms, s, m, h, d).

    A string without a unit is seconds. Raises ``ValueError`` for anything else; the
    range (non-negative) is checked by the field that uses it.
    """
    if isinstance(value, bool):
        raise ValueError(DURATION_HINT)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        match = _DURATION_RE.fullmatch(value.strip())
        if match:
            number, unit = match.groups()
            return float(number) * _DURATION_UNITS[(unit or "s").lower()]
    raise ValueError(DURATION_HINT)


def parse_size(value: object) -> int:
    """Bytes from an int of bytes or a string with a unit (B, KB, MB, GB; 1024-based)."""
    if isinstance(value, bool):
        raise ValueError(SIZE_HINT)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        match = _SIZE_RE.fullmatch(value.strip())
        if match:
            number, unit = match.groups()
            return int(number) * _SIZE_UNITS[unit.lower()]
    raise ValueError(SIZE_HINT)


_HOSTNAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?")
BIND_HINT = 'expected "host:port"'


def parse_bind(bind: str) -> tuple[str, int]:
    """Split ``"host:port"`` (IPv6 as ``"[::1]:1883"``) into ``(host, port)``.

    The host comes back without brackets. Raises ``ValueError`` with a short reason.
    """
    host, sep, port_text = bind.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(BIND_HINT)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{BIND_HINT} with a valid IPv6 address in brackets") from None
    elif ":" in host:
        raise ValueError(f'{BIND_HINT} with IPv6 addresses in brackets, as in "[::1]:1883"')
    elif not _HOSTNAME_RE.fullmatch(host):
        raise ValueError(f"{BIND_HINT} with a valid host name or IPv4 address")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"{BIND_HINT} with a port in 0..65535")
    return host, port


def _normalise_bind(value: object) -> object:
    # EMQX accepts a bare port (bind = 1883) meaning every IPv4 interface.
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= 65535:
            raise ValueError(f"{BIND_HINT} or a port in 0..65535")
        return f"0.0.0.0:{value}"
    if isinstance(value, str):
        parse_bind(value)
    return value


def _check_network(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError('expected an IP address or CIDR such as "10.0.0.0/8"') from None
    return value


def _split_commas(value: object) -> object:
    # Convenient from the environment: GATEWAY_..._ALLOW=10.0.0.0/8,192.168.0.0/16
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _check_topic_filter(value: str) -> str:
    """An authorization topic: an MQTT topic filter, or ``"eq <filter>"`` (literal match)."""
    filter_ = value[3:] if value.startswith("eq ") else value
    if not filter_:
        raise ValueError("expected a non-empty topic filter")
    levels = filter_.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            raise ValueError('"#" must be a whole level and the last one')
        if "+" in level and level != "+":
            raise ValueError('"+" must be a whole level')
    return value


Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
"""Seconds, as float; written as a number of seconds or ``"500ms"``, ``"30s"``, ``"2h"``..."""
Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
"""Bytes, as int; written as a number of bytes or ``"64KB"``, ``"1MB"``, ``"1GB"``."""
Bind = Annotated[str, BeforeValidator(_normalise_bind)]
Network = Annotated[str, AfterValidator(_check_network)]
TopicFilter = Annotated[str, AfterValidator(_check_topic_filter)]

_RATE_RE = re.compile(
    r"(\d+(?:\.\d+)?)\s*([kmg]?b?)\s*/\s*(\d+(?:\.\d+)?)?\s*(ms|s|m|h|d)", re.IGNORECASE
)
RATE_HINT = 'expected a rate such as 100, "100/s", "1000/m", "50/10s" or "infinity"'
BYTE_RATE_HINT = 'expected a byte rate such as 1048576, "1MB/s", "512KB/s" or "infinity"'


def _parse_rate(value: object, *, sizes: bool, hint: str) -> float:
    if isinstance(value, bool):
        raise ValueError(hint)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("infinity", "0"):
            return 0.0
        match = _RATE_RE.fullmatch(text)
        if match:
            number, unit, per, per_unit = match.groups()
            if unit and not sizes:
                raise ValueError(hint)
            seconds = float(per or 1) * _DURATION_UNITS[per_unit.lower()]
            if seconds > 0:
                return float(number) * _SIZE_UNITS[unit.lower()] / seconds
    raise ValueError(hint)


def parse_rate(value: object) -> float:
    """Events per second from a number (per second), ``"N/s"``, ``"N/m"``, ``"N/10s"``...;
    ``"infinity"`` (or 0) is 0.0, meaning no limit."""
    return _parse_rate(value, sizes=False, hint=RATE_HINT)


def parse_byte_rate(value: object) -> float:
    """Bytes per second from a number or ``"1MB/s"``, ``"512KB/s"``, ``"10MB/m"`` (sizes
    are 1024-based, as for sizes); ``"infinity"`` (or 0) is 0.0, meaning no limit."""
    return _parse_rate(value, sizes=True, hint=BYTE_RATE_HINT)


Rate = Annotated[float, BeforeValidator(parse_rate), Field(ge=0)]
"""Events per second, as float (0: no limit); written ``100``, ``"100/s"``, ``"6000/m"``."""
ByteRate = Annotated[float, BeforeValidator(parse_byte_rate), Field(ge=0)]
"""Bytes per second, as float (0: no limit); written ``1048576``, ``"1MB/s"``."""

LogLevel = Literal["debug", "info", "warning", "error"]
MqueueOverflow = Literal["drop_oldest", "drop_newest"]
SharedStrategy = Literal[
    "random",
    "round_robin",
    "round_robin_per_group",
    "sticky",
    "local",
    "hash_clientid",
    "hash_topic",
]
Permission = Literal["allow", "deny"]
AuthzAction = Literal["publish", "subscribe", "all"]

# MQTT's largest packet: 1 byte header + 4 bytes remaining length + 268,435,455 bytes.
MAX_MQTT_PACKET = 268_435_460
# MQTT 5 session expiry is a four-byte integer of seconds (0xFFFFFFFF: never expires).
MAX_SESSION_EXPIRY = 0xFFFF_FFFF


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        coerce_numbers_to_str=True,
    )


# ------------------------------------------------------------------ sections


def _lower_role(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


class NodeConfig(_Section):
    name: str = "gateway@127.0.0.1"
    data_dir: Path = Path("data")  # relative paths are relative to the working directory
    # cluster role (EMQX 5 / Mria): core nodes own the cluster's shared tables; replicants
    # follow one core (see docs/cluster.md)
    role: Annotated[Literal["core", "replicant"], BeforeValidator(_lower_role)] = "core"
    # worker processes behind SO_REUSEPORT listeners, meshed as a private cluster over
    # loopback (docs/workers.md); 1 = one process, as before
    workers: int = Field(default=1, ge=1, le=64)


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


class LogConfig(_Section):
    level: Annotated[LogLevel, BeforeValidator(_lower)] = "info"


class TcpListener(_Section):
    enable: bool = True
    bind: Bind = "0.0.0.0:1883"
    max_connections: int = Field(default=1_024_000, ge=1)
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
PeerCertField = Literal["none", "cn", "dn", "san"]


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


class SslListener(TcpListener):
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

    @model_validator(mode="after")
    def _consistent_tls(self) -> SslListener:
        if self.enable and (self.certfile is None or self.keyfile is None):
            raise ValueError("an enabled ssl listener needs certfile and keyfile")
        if self.verify == "verify_peer":
            if self.cacertfile is None:
                raise ValueError('verify = "verify_peer" needs cacertfile (the clients\' CA)')
        else:
            _no_peer_keys(self, "peer_cert_authenticates")
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


# ------------------------------------------------------------------ protocol gateways


def _check_topic_name(value: str) -> str:
    if not value or "+" in value or "#" in value:
        raise ValueError("expected a topic name without wildcards")
    return value


class MqttSnPredefined(_Section):
    """One predefined topic: the same id means the same topic on both sides."""

    id: int = Field(ge=1, le=0xFFFE)
    topic: Annotated[str, AfterValidator(_check_topic_name)]


class UdpListener(_Section):
    enable: bool = True
    bind: Bind = "0.0.0.0:1884"
    max_connections: int = Field(default=1_024_000, ge=1)  # peers (addresses) at once
    allow: Annotated[list[Network], BeforeValidator(_split_commas)] = Field(default_factory=list)
    deny: Annotated[list[Network], BeforeValidator(_split_commas)] = Field(default_factory=list)

    @property
    def host(self) -> str:
        return parse_bind(self.bind)[0]

    @property
    def port(self) -> int:
        return parse_bind(self.bind)[1]


def _default_udp_listeners() -> dict[str, UdpListener]:
    return {"default": UdpListener()}


class MqttSnListeners(_Section):
    udp: dict[str, UdpListener] = Field(default_factory=_default_udp_listeners)


class MqttSnConfig(_Section):
    """``[gateway.mqttsn]`` (EMQX's shape): MQTT-SN 1.2 over UDP. The table's presence
    enables the gateway (``enable = false`` keeps it configured but off).

    ``broadcast`` sends ADVERTISE to ``broadcast_address``:``broadcast_port`` every
    ``advertise_interval``; ``enable_qos3`` accepts QoS -1 publishes without a connection;
    ``retry_interval``/``max_retries`` govern retransmission of unacknowledged messages;
    ``max_sleep_buffer`` bounds the QoS 0 messages kept for a sleeping client.
    """

    enable: bool = True
    gateway_id: int = Field(default=1, ge=0, le=255)
    broadcast: bool = False
    broadcast_address: str = "255.255.255.255"
    broadcast_port: int = Field(default=0, ge=0, le=65535)  # 0: the listener's port
    advertise_interval: Annotated[Duration, Field(gt=0, le=65535)] = 900.0
    enable_qos3: bool = True
    mountpoint: str = ""
    predefined: list[MqttSnPredefined] = Field(default_factory=list)
    idle_timeout: Annotated[Duration, Field(gt=0)] = 30.0
    retry_interval: Annotated[Duration, Field(gt=0)] = 10.0
    max_retries: int = Field(default=4, ge=0)
    max_sleep_buffer: int = Field(default=1000, ge=0)
    listeners: MqttSnListeners = Field(default_factory=MqttSnListeners)

    @field_validator("predefined")
    @classmethod
    def _unique_ids(cls, value: list[MqttSnPredefined]) -> list[MqttSnPredefined]:
        seen: set[int] = set()
        for p in value:
            if p.id in seen:
                raise ValueError(f"predefined topic id {p.id} given twice")
            seen.add(p.id)
        return value


def _default_coap_udp() -> dict[str, UdpListener]:
    return {"default": UdpListener(bind="0.0.0.0:5683")}


class DtlsListener(UdpListener):
    """A UDP listener with DTLS 1.2: pre-shared keys (``psk_file``: ``identity:secret``
    lines, EMQX's PSK file format), certificates (``certfile``/``keyfile``, and
    ``cacertfile`` with ``verify = "verify_peer"`` for client certificates; EMQX's key
    names and meanings, as on ``[listeners.ssl.<name>]``), or both on one listener.

    Identity: ``peer_cert_as_clientid``/``peer_cert_as_username`` (``cn``, ``dn``, ``san``)
    take the client id/username from a verified client certificate;
    ``psk_identity_as_clientid``/``psk_identity_as_username`` from the PSK identity. The
    peer may then name no other (CoAP: a different ``clientid``/``username`` in the query
    is refused 4.03; LwM2M: the client id is the endpoint name, so the registration's
    ``ep`` must equal it). Files are checked and loaded by the loader, relative paths
    resolved against the configuration file's directory.
    """

    bind: Bind = "0.0.0.0:5684"
    psk_file: Path | None = None
    certfile: Path | None = None
    keyfile: Path | None = None
    cacertfile: Path | None = None
    verify: Annotated[TlsVerify, BeforeValidator(_lower)] = "verify_none"
    fail_if_no_peer_cert: bool = False
    peer_cert_as_clientid: Annotated[PeerCertField, BeforeValidator(_lower)] = "none"
    peer_cert_as_username: Annotated[PeerCertField, BeforeValidator(_lower)] = "none"
    psk_identity_as_clientid: bool = False
    psk_identity_as_username: bool = False
    handshake_timeout: Annotated[Duration, Field(gt=0)] = 30.0

    @model_validator(mode="after")
    def _consistent_dtls(self) -> DtlsListener:
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("certfile and keyfile go together")
        if self.enable and self.psk_file is None and self.certfile is None:
            raise ValueError("a DTLS listener needs psk_file, or certfile and keyfile")
        if self.verify == "verify_peer":
            if self.certfile is None:
                raise ValueError('verify = "verify_peer" needs certfile and keyfile')
            if self.cacertfile is None:
                raise ValueError('verify = "verify_peer" needs cacertfile (the clients\' CA)')
        else:
            _no_peer_keys(self)
        if self.psk_file is None:
            for key in ("psk_identity_as_clientid", "psk_identity_as_username"):
                if getattr(self, key):
                    raise ValueError(f"{key} needs psk_file")
        return self


class CoapListeners(_Section):
    udp: dict[str, UdpListener] = Field(default_factory=_default_coap_udp)
    dtls: dict[str, DtlsListener] = Field(default_factory=dict)


class CoapConfig(_Section):
    """``[gateway.coap]`` (EMQX's shape): CoAP over UDP with the ``/ps`` publish/subscribe
    mapping and ``/mqtt/connection``. ``connection_required`` refuses requests without a
    connection token; ``heartbeat`` is how often a connected client must PUT; a
    connectionless peer with nothing observed is forgotten after ``idle_timeout``."""

    enable: bool = True
    mountpoint: str = ""
    connection_required: bool = False
    heartbeat: Annotated[Duration, Field(gt=0)] = 30.0
    idle_timeout: Annotated[Duration, Field(gt=0)] = 30.0
    ack_timeout: Annotated[Duration, Field(gt=0)] = 2.0
    max_retransmit: int = Field(default=4, ge=0, le=10)
    block_size: Literal[16, 32, 64, 128, 256, 512, 1024] = 1024
    max_body: int = Field(default=4 * 1024 * 1024, ge=1)
    listeners: CoapListeners = Field(default_factory=CoapListeners)


def _default_lwm2m_udp() -> dict[str, UdpListener]:
    return {"default": UdpListener(bind="0.0.0.0:5783")}


class Lwm2mListeners(_Section):
    udp: dict[str, UdpListener] = Field(default_factory=_default_lwm2m_udp)
    dtls: dict[str, DtlsListener] = Field(default_factory=dict)


class Lwm2mBootstrapWrite(_Section):
    """One Bootstrap-Write: the resources of object instance ``path`` (``"/0/1"``)."""

    path: Annotated[str, Field(pattern=r"^/\d+/\d+$")]
    content: list[dict[str, Any]]

    @field_validator("content")
    @classmethod
    def _entries(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for e in v:
            if "path" not in e or "value" not in e:
                raise ValueError("each entry needs a path and a value")
        return v


class Lwm2mBootstrapPlan(_Section):
    """What one endpoint (or every endpoint: ``"*"``) is told when it bootstraps."""

    delete: bool = True
    writes: list[Lwm2mBootstrapWrite] = Field(default_factory=list)


class Lwm2mBootstrap(_Section):
    """``[gateway.lwm2m.bootstrap]``: a bootstrap server on the LwM2M listeners (``POST
    /bs?ep=``); off unless ``enable``; endpoints without a plan (and no ``"*"``) get 4.00."""

    enable: bool = False
    endpoints: dict[str, Lwm2mBootstrapPlan] = Field(default_factory=dict)


class Lwm2mConfig(_Section):
    """``[gateway.lwm2m]`` (EMQX's shape): LwM2M 1.0/1.1 over CoAP. ``mountpoint`` may use
    ``{ep}`` (the endpoint name); ``xml_dir`` adds object definitions (OMA XML) to the
    shipped core objects 0-7; ``qmode_time_window`` is how long a queue-mode device
    listens after each message it sends; ``max_queue`` bounds the commands waiting for
    one device (the oldest is dropped)."""

    enable: bool = True
    mountpoint: str = "lwm2m/{ep}/"
    lifetime_min: Annotated[Duration, Field(gt=0)] = 1.0
    lifetime_max: Annotated[Duration, Field(gt=0)] = 86400.0
    qmode_time_window: Annotated[Duration, Field(gt=0)] = 22.0
    response_timeout: Annotated[Duration, Field(gt=0)] = 60.0
    idle_timeout: Annotated[Duration, Field(gt=0)] = 30.0
    publish_qos: int = Field(default=0, ge=0, le=2)
    max_queue: int = Field(default=1000, ge=1)
    xml_dir: str = ""
    bootstrap: Lwm2mBootstrap = Field(default_factory=Lwm2mBootstrap)
    listeners: Lwm2mListeners = Field(default_factory=Lwm2mListeners)


class GatewaysConfig(_Section):
    """``[gateway.<protocol>]``: the non-MQTT front-ends; absent means off."""

    mqttsn: MqttSnConfig | None = None
    coap: CoapConfig | None = None
    lwm2m: Lwm2mConfig | None = None


class MqttConfig(_Section):
    max_packet_size: Annotated[Size, Field(ge=16, le=MAX_MQTT_PACKET)] = 1 << 20
    max_clientid_len: int = Field(default=65535, ge=23, le=65535)
    max_topic_levels: int = Field(default=128, ge=1)
    max_topic_alias: int = Field(default=65535, ge=0, le=65535)
    max_qos_allowed: int = Field(default=2, ge=0, le=2)
    retain_available: bool = True
    wildcard_subscription: bool = True
    shared_subscription: bool = True
    ignore_loop_deliver: bool = False
    idle_timeout: Annotated[Duration, Field(gt=0)] = 15.0
    keepalive_multiplier: float = Field(default=1.5, ge=1.0)
    server_keepalive: int = Field(default=0, ge=0, le=65535)
    max_keepalive: int = Field(default=0, ge=0, le=65535)
    session_expiry_interval: Annotated[Duration, Field(le=MAX_SESSION_EXPIRY)] = 7200.0
    max_session_expiry_interval: Annotated[Duration, Field(le=MAX_SESSION_EXPIRY)] = 0.0
    max_inflight: int = Field(default=32, ge=1, le=65535)
    retry_interval: Annotated[Duration, Field(gt=0)] = 30.0
    max_awaiting_rel: int = Field(default=100, ge=0)
    await_rel_timeout: Annotated[Duration, Field(gt=0)] = 300.0
    max_mqueue_len: int = Field(default=1000, ge=0)
    mqueue_store_qos0: bool = True
    mqueue_overflow: MqueueOverflow = "drop_oldest"
    shared_subscription_strategy: SharedStrategy = "round_robin"
    max_subscriptions: int = Field(default=0, ge=0)
    upgrade_qos: bool = False
    response_information: str = ""
    strict_mode: bool = False
    # protection, per client (0 = no limit): PUBLISH packets and bytes per second read;
    # beyond them reading pauses until the client is back under the rate. packet_timeout:
    # how long one packet may take to arrive once its first byte is in (slowloris).
    messages_rate: Rate = 0.0
    bytes_rate: ByteRate = 0.0
    packet_timeout: Duration = 60.0


class RetainerConfig(_Section):
    enable: bool = True
    max_retained_messages: int = Field(default=0, ge=0)
    max_payload_size: Size = 1 << 20


def _parse_ratio(value: object) -> object:
    """``0.9`` or ``"90%"`` -> 0.9."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return float(value.strip()[:-1]) / 100
        except ValueError:
            raise ValueError(f"expected a share such as 0.9 or \"90%\", got {value!r}") from None
    return value


class DurabilityConfig(_Section):
    # true: persistent sessions, their queued/inflight QoS 1/2 messages and retained
    # messages live in {data_dir}/gateway.db and survive a restart or kill -9;
    # false: memory only, everything is lost when the process ends.
    enable: bool = True
    # space management (docs/operations.md "Storage faults"): a file of this size is
    # kept in data_dir and released when the disk fills, so the store can still delete
    # and checkpoint; QoS 1/2 publishes and persistent sessions are refused (0x97) while
    # less than this is free besides it (0: no reserve, refuse below 256KB free)
    reserve_size: Size = 1024 * 1024
    # cap on gateway.db + its WAL (0: none); at the cap the same refusals
    max_size: Size = 0
    # alarm high_disk_usage at this share of the data_dir file system used
    # (0.9 or "90%"), cleared below it
    disk_high_watermark: Annotated[float, BeforeValidator(_parse_ratio), Field(gt=0, le=1)] = 0.9
    # how often the file system and the store's size are looked at (also after commits)
    check_interval: Annotated[float, BeforeValidator(parse_duration), Field(gt=0)] = 5.0
    # on start: PRAGMA quick_check; a malformed file is moved aside and salvaged
    check_on_start: bool = True


_NAME_RE = re.compile(r"[A-Za-z0-9._@-]+")


def _check_path_name(value: str) -> str:
    # site and gw become directory names (site=S/gw=G) that Spark reads back as values.
    if value and not _NAME_RE.fullmatch(value):
        raise ValueError("expected letters, digits and . _ @ - only")
    return value


PathName = Annotated[str, AfterValidator(_check_path_name)]


class FleetArchiverConfig(_Section):
    """``[fleet.archiver]``: spool telemetry and connection events for the fleet job.

    ``dir`` None means ``{node.data_dir}/archive``; ``gw`` empty means the node name with
    characters other than letters, digits and ``. _ @ -`` replaced by ``_``.
    """

    enable: bool = False
    dir: Path | None = None
    site: PathName = "default"
    gw: PathName = ""
    topics: Annotated[list[TopicFilter], BeforeValidator(_split_commas)] = Field(
        default_factory=lambda: ["#"]
    )
    events: bool = True
    rotate_interval: Annotated[Duration, Field(gt=0)] = 300.0
    rotate_size: Annotated[Size, Field(ge=1024)] = 16 << 20
    flush_interval: Annotated[Duration, Field(gt=0)] = 1.0
    max_pending: Annotated[Size, Field(ge=1024)] = 64 << 20
    ts_field: str = "ts"
    max_payload_text: Size = 256


class FleetConfig(_Section):
    archiver: FleetArchiverConfig = Field(default_factory=FleetArchiverConfig)


class BuiltinDbAuthnConfig(_Section):
    """The built-in user database (``gatewayctl users``), tried first."""

    enable: bool = True
    # PBKDF2-HMAC-SHA256 rounds for passwords set from now on (RFC 7677: >= 4096); each
    # plain-password CONNECT costs this many rounds on a worker thread
    iteration_count: int = Field(default=100_000, ge=4096, le=10_000_000)
    hash_workers: int = Field(default=2, ge=1, le=64)
    max_pending: int = Field(default=256, ge=1)


class ScramAuthnConfig(_Section):
    """MQTT 5 enhanced authentication ``SCRAM-SHA-256`` against the built-in database."""

    enable: bool = True


def _check_http_url(value: str) -> str:
    if not re.fullmatch(r"https?://[^\s/?#]+[^\s]*", value):
        raise ValueError('expected an http:// or https:// URL such as "http://127.0.0.1:8080/auth"')
    return value


HttpUrl = Annotated[str, AfterValidator(_check_http_url)]


def _default_http_body() -> dict[str, str]:
    return {
        "clientid": "${clientid}",
        "username": "${username}",
        "password": "${password}",
        "peerhost": "${peerhost}",
        "protocol": "${protocol}",
    }


class HttpAuthnConfig(_Section):
    """An HTTP authentication service, tried after the built-in database (EMQX-shaped)."""

    enable: bool = False
    url: HttpUrl = "http://127.0.0.1:8080/auth"
    headers: dict[str, str] = Field(default_factory=dict)
    body: dict[str, str] = Field(default_factory=_default_http_body)
    request_timeout: Annotated[Duration, Field(gt=0)] = 5.0
    pool_size: int = Field(default=8, ge=1)
    cache_ttl: Duration = 60.0
    cache_max: int = Field(default=10_000, ge=1)
    on_error: Literal["ignore", "deny"] = "ignore"


class AuthenticationConfig(_Section):
    allow_anonymous: bool = True
    builtin_db: BuiltinDbAuthnConfig = Field(default_factory=BuiltinDbAuthnConfig)
    scram: ScramAuthnConfig = Field(default_factory=ScramAuthnConfig)
    http: HttpAuthnConfig = Field(default_factory=HttpAuthnConfig)


class AuthzRule(_Section):
    """One authorization rule; rules are tried in order and the first match decides.

    ``topics`` are topic filters that may contain ``${clientid}`` and ``${username}``;
    ``"eq <filter>"`` matches the filter literally (``"eq t/#"`` only matches a
    subscription to ``t/#`` itself). At most one of ``clientid``, ``username`` and
    ``ipaddress`` (an address or CIDR) says whom the rule is for; none means everyone.
    """

    permission: Permission
    action: AuthzAction = "all"
    topics: list[TopicFilter] = Field(min_length=1)
    clientid: str | None = None
    username: str | None = None
    ipaddress: Network | None = None

    @model_validator(mode="after")
    def _one_subject(self) -> AuthzRule:
        given = [k for k in ("clientid", "username", "ipaddress") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of clientid, username, ipaddress (got {given})")
        return self

    @staticmethod
    def split_topic(topic: str) -> tuple[bool, str]:
        """``(literal, filter)``: ``"eq t/#"`` gives ``(True, "t/#")``."""
        if topic.startswith("eq "):
            return True, topic[3:]
        return False, topic


class AuthzCacheConfig(_Section):
    # EMQX's authorization cache: each client remembers its last decisions for ``ttl``;
    # replacing the rules (SIGHUP) drops every cached decision at once.
    enable: bool = True
    max_size: int = Field(default=32, ge=1)
    ttl: Annotated[Duration, Field(gt=0)] = 60.0


class AuthorizationConfig(_Section):
    no_match: Permission = "allow"
    deny_action: Literal["ignore", "disconnect"] = "ignore"
    # The SUBACK code a denied MQTT 5 subscription gets: 0x87 (not_authorized) or the
    # generic 0x80 (unspecified_error) that some 3.1.1-minded test suites expect.
    subscribe_deny_reason: Literal["not_authorized", "unspecified_error"] = "not_authorized"
    cache: AuthzCacheConfig = Field(default_factory=AuthzCacheConfig)
    # Rules are evaluated in order, first match wins: ``rules`` (inline) first, then the
    # rules of ``rules_file``. load_config() resolves ``rules_file`` (relative to the
    # configuration file) and validates it, but does not copy its rules into ``rules``.
    rules_file: Path | None = None
    rules: list[AuthzRule] = Field(default_factory=list)


class RulesFile(_Section):
    """The shape of an authorization rules file: a list of ``[[rules]]`` tables."""

    rules: list[AuthzRule] = Field(default_factory=list)


# ------------------------------------------------------------------ operations


def _check_token(value: str) -> str:
    if value and (len(value) < 16 or any(c.isspace() for c in value)):
        raise ValueError("expected at least 16 characters without spaces (or empty)")
    return value


class ApiConfig(_Section):
    """``[api]``: the HTTP management API (``/api/v5/...``), Prometheus metrics
    (``/metrics``) and live trace, on one aiohttp server inside ``gatewayd``.

    Every request but ``/status`` (and ``/metrics`` unless ``metrics_auth``) carries
    ``Authorization: Bearer <token>``. ``token`` empty means the token kept in
    ``token_file`` (None: ``{node.data_dir}/api.token``), generated with mode 0600 at
    the first start; ``gatewayctl`` reads the same file.
    """

    enable: bool = True
    bind: Bind = "127.0.0.1:18083"
    token: Annotated[str, AfterValidator(_check_token)] = ""
    token_file: Path | None = None
    metrics_auth: bool = False

    @property
    def host(self) -> str:
        return parse_bind(self.bind)[0]

    @property
    def port(self) -> int:
        return parse_bind(self.bind)[1]


class SysEventMessages(_Section):
    """Which client events go to ``$SYS/brokers/<node>/clients/<clientid>/<event>``."""

    client_connected: bool = True
    client_disconnected: bool = True
    client_subscribed: bool = False
    client_unsubscribed: bool = False


class SysTopicsConfig(_Section):
    """``[sys_topics]`` (EMQX's names): ``$SYS/brokers/<node>/...`` messages.

    Every ``sys_msg_interval``: version, sysdescr, ``$SYS/brokers``, stats/..., metrics/...;
    every ``sys_heartbeat_interval``: uptime and datetime. 0 turns either off.
    """

    sys_msg_interval: Duration = 60.0
    sys_heartbeat_interval: Duration = 30.0
    sys_event_messages: SysEventMessages = Field(default_factory=SysEventMessages)


class FlappingDetectConfig(_Section):
    """``[flapping_detect]`` (EMQX's): a client id that connects ``max_count`` times
    within ``window_time`` is banned for ``ban_time``."""

    enable: bool = False
    max_count: int = Field(default=15, ge=2)
    window_time: Annotated[Duration, Field(gt=0)] = 60.0
    ban_time: Annotated[Duration, Field(gt=0)] = 300.0


class ClusterTlsConfig(_Section):
    """``[cluster.tls]``: the node's certificate (issued by the cluster CA with
    ``gatewayctl certs issue DIR <node name> --server-client``) and the CA every peer's
    certificate must chain to."""

    certfile: Path | None = None
    keyfile: Path | None = None
    cacertfile: Path | None = None
    # the peer certificate's CN must be the node name the peer claims
    verify_node_name: bool = True


class ClusterDnsConfig(_Section):
    """``[cluster.dns]``: DNS discovery (``discovery = "dns"``): A/AAAA records give node
    addresses on this node's cluster port, SRV records give host and port."""

    name: str = ""
    record_type: Literal["a", "aaaa", "srv"] = "a"
    # host[:port] of the DNS servers to ask (comma-separated in the environment); empty:
    # the system's resolver configuration
    nameservers: Annotated[list[str], BeforeValidator(_split_commas)] = Field(
        default_factory=list
    )
    refresh: Annotated[Duration, Field(gt=0)] = 60.0


class ClusterConfig(_Section):
    """``[cluster]``: links to other nodes over mutual TLS (docs/cluster.md).

    Clustering is on when ``enable`` is true, or when it is not given and
    ``tls.certfile`` is. ``seeds`` are ``name@host[:port]`` (port 5370 when absent).
    """

    enable: bool = False
    name: str = "gateway"
    bind: Bind = "0.0.0.0:5370"
    advertise: str | None = None  # host:port peers dial; default: bind (or node host)
    discovery: Literal["manual", "static", "dns"] = "static"
    seeds: Annotated[list[str], BeforeValidator(_split_commas)] = Field(default_factory=list)
    tls: ClusterTlsConfig = Field(default_factory=ClusterTlsConfig)
    dns: ClusterDnsConfig = Field(default_factory=ClusterDnsConfig)
    heartbeat_interval: Annotated[Duration, Field(gt=0)] = 1.0
    heartbeat_timeout: Annotated[Duration, Field(gt=0)] = 5.0
    connect_timeout: Annotated[Duration, Field(gt=0)] = 5.0
    reconnect_max: Annotated[Duration, Field(gt=0)] = 5.0
    forward_batch: int = Field(default=1000, ge=1)
    outbox_max: int = Field(default=1_000_000, ge=0)  # per peer; 0 = unbounded
    autoheal: bool = True
    autoclean: Duration = 300.0  # forget nodes down this long; 0 = never
    # core nodes agree on the session registry through Raft (pysyncobj over the control
    # links; docs/cluster.md); off: each node announces its own sessions only
    raft: bool = False
    # with raft: the log is journalled in the node's data_dir and compacted (a full dump)
    # once it holds this many entries
    raft_compact_entries: int = Field(default=5000, ge=2)

    @model_validator(mode="after")
    def _auto_enable(self) -> ClusterConfig:
        if "enable" not in self.model_fields_set and self.tls.certfile is not None:
            object.__setattr__(self, "enable", True)
        return self


# ------------------------------------------------------------------ bridges

_BRIDGE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def _check_bridge_filter(value: str) -> str:
    """A topic filter of a bridge rule (``$share/...`` allowed upstream)."""
    real = value
    if value.startswith("$share/"):
        group, slash, real = value[len("$share/"):].partition("/")
        if not group or not slash or "+" in group or "#" in group:
            raise ValueError('expected "$share/<group>/<filter>"')
    elif value.startswith("$queue/"):
        real = value[len("$queue/"):]
    if not real:
        raise ValueError("expected a non-empty topic filter")
    if real.startswith("eq "):
        raise ValueError('"eq " is for authorization rules, not bridge topics')
    _check_topic_filter(real)
    return value


def _check_topic_template(value: str) -> str:
    """A topic name in which ``${topic}`` is replaced by the message's topic."""
    if not value:
        raise ValueError("expected a non-empty topic")
    if "+" in value or "#" in value:
        raise ValueError('a topic (template) may not contain "+" or "#"')
    if "${" in value.replace("${topic}", ""):
        raise ValueError("the only placeholder is ${topic}")
    return value


def _bridge_qos(value: object) -> int | str:
    if value == "${qos}" or (type(value) is int and 0 <= value <= 2):
        return value
    raise ValueError('expected 0, 1, 2 or "${qos}" (the message\'s QoS)')


def _bridge_retain(value: object) -> bool | str:
    if value == "${retain}" or type(value) is bool:
        return value
    raise ValueError('expected true, false or "${retain}" (the message\'s retain flag)')


BridgeFilter = Annotated[str, AfterValidator(_check_bridge_filter)]
TopicTemplate = Annotated[str, AfterValidator(_check_topic_template)]
BridgeQos = Annotated[int | str, PlainValidator(_bridge_qos)]
BridgeRetain = Annotated[bool | str, PlainValidator(_bridge_retain)]


class BridgeForward(_Section):
    """``[[bridges.mqtt.<name>.forwards]]``: local messages on ``local`` (a topic filter)
    go upstream to ``remote`` (``${topic}`` is the local topic)."""

    local: BridgeFilter
    remote: TopicTemplate = "${topic}"
    qos: BridgeQos = "${qos}"
    retain: BridgeRetain = "${retain}"


class BridgeSubscription(_Section):
    """``[[bridges.mqtt.<name>.subscriptions]]``: subscribe upstream to ``remote`` and
    publish what arrives locally on ``local`` (``${topic}`` is the remote topic)."""

    remote: BridgeFilter
    local: TopicTemplate = "${topic}"
    qos: int = Field(default=1, ge=0, le=2)


class BridgeTls(_Section):
    """``[bridges.mqtt.<name>.tls]``: TLS (and mutual TLS) to the upstream broker."""

    enable: bool = False
    cacertfile: Path | None = None  # None: the system's CA certificates
    certfile: Path | None = None  # our client certificate, for mutual TLS
    keyfile: Path | None = None
    verify: Annotated[TlsVerify, BeforeValidator(_lower)] = "verify_peer"
    server_name_indication: str = ""  # "": the server's host; "disable": no SNI, no name check
    versions: Annotated[
        list[Annotated[TlsVersion, BeforeValidator(_lower)]],
        BeforeValidator(_split_commas),
        Field(min_length=1),
    ] = Field(default_factory=lambda: list(DEFAULT_TLS_VERSIONS))
    ciphers: Annotated[str, BeforeValidator(_join_ciphers)] = ""

    @model_validator(mode="after")
    def _cert_and_key(self) -> BridgeTls:
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("certfile and keyfile go together")
        return self


class BridgeOutbox(_Section):
    """``[bridges.mqtt.<name>.outbox]``: the durable queue in front of the upstream."""

    max_messages: int = Field(default=1_000_000, ge=0)  # 0: no limit
    max_bytes: Size = 256 << 20  # topic + payload bytes; 0: no limit
    max_age: Duration = 0.0  # 0: no limit
    overflow: MqueueOverflow = "drop_oldest"
    drain_rate: float = Field(default=0.0, ge=0)  # messages per second upstream; 0: no limit


class BridgeReconnect(_Section):
    """``[bridges.mqtt.<name>.reconnect]``: exponential backoff with jitter."""

    initial: Annotated[Duration, Field(gt=0)] = 1.0
    max: Annotated[Duration, Field(gt=0)] = 60.0
    jitter: float = Field(default=0.2, ge=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> BridgeReconnect:
        if self.max < self.initial:
            raise ValueError(f"max ({self.max}s) is below initial ({self.initial}s)")
        return self


def _check_server(value: str) -> str:
    if parse_bind(value)[1] == 0:
        raise ValueError('expected "host:port" with a port in 1..65535')
    return value


class MqttBridge(_Section):
    """``[bridges.mqtt.<name>]``: an upstream MQTT broker (see docs/bridge.md)."""

    enable: bool = True
    server: Annotated[str, AfterValidator(_check_server)]
    proto_ver: Literal["v3", "v4", "v5"] = "v4"
    clientid: str = ""  # "": "<node.name>:bridge:<name>"
    username: str | None = None
    password: str | None = None
    clean_start: bool = False
    keepalive: Annotated[Duration, Field(le=65535)] = 60.0
    session_expiry_interval: Annotated[Duration, Field(le=MAX_SESSION_EXPIRY)] = 7 * 86400.0
    bridge_mode: bool = False
    connect_timeout: Annotated[Duration, Field(gt=0)] = 10.0
    max_inflight: int = Field(default=32, ge=1, le=65535)
    tls: BridgeTls = Field(default_factory=BridgeTls)
    reconnect: BridgeReconnect = Field(default_factory=BridgeReconnect)
    outbox: BridgeOutbox = Field(default_factory=BridgeOutbox)
    forwards: list[BridgeForward] = Field(default_factory=list)
    subscriptions: list[BridgeSubscription] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> MqttBridge:
        if self.bridge_mode and self.proto_ver == "v5":
            raise ValueError('bridge_mode is for proto_ver "v3"/"v4" (MQTT 5 uses No Local)')
        return self


class BridgesConfig(_Section):
    mqtt: dict[str, MqttBridge] = Field(default_factory=dict)

    @field_validator("mqtt")
    @classmethod
    def _names(cls, mqtt: dict[str, MqttBridge]) -> dict[str, MqttBridge]:
        for name in mqtt:
            if not _BRIDGE_NAME_RE.fullmatch(name):
                raise ValueError(
                    f"bridge name {name!r}: letters, digits, '_' and '-', at most 64"
                )
        return mqtt


from gateway.rules.config import RuleEngineConfig, RuleEngineField, WebhookConfig  # noqa: E402


class GatewayConfig(_Section):
    node: NodeConfig = Field(default_factory=NodeConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    listeners: Listeners = Field(default_factory=Listeners)
    mqtt: MqttConfig = Field(default_factory=MqttConfig)
    retainer: RetainerConfig = Field(default_factory=RetainerConfig)
    durability: DurabilityConfig = Field(default_factory=DurabilityConfig)
    authentication: AuthenticationConfig = Field(default_factory=AuthenticationConfig)
    authorization: AuthorizationConfig = Field(default_factory=AuthorizationConfig)
    fleet: FleetConfig = Field(default_factory=FleetConfig)
    gateway: GatewaysConfig = Field(default_factory=GatewaysConfig)
    flapping_detect: FlappingDetectConfig = Field(default_factory=FlappingDetectConfig)
    api: ApiConfig = Field(default_factory=ApiConfig)
    sys_topics: SysTopicsConfig = Field(default_factory=SysTopicsConfig)
    bridges: BridgesConfig = Field(default_factory=BridgesConfig)
    webhooks: dict[str, WebhookConfig] = Field(default_factory=dict)  # gateway.rules
    rule_engine: RuleEngineField = Field(default_factory=RuleEngineConfig)

    @model_validator(mode="after")
    def _workers_alone(self) -> GatewayConfig:
        if self.node.workers > 1 and self.cluster.enable:
            raise ValueError(
                "node.workers > 1 cannot be combined with a configured cluster yet "
                "(the workers form their own private cluster; docs/workers.md)"
            )
        return self
