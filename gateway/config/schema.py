"""The configuration schema: pydantic models shaped like EMQX's configuration.

Invariants:

- Every model forbids unknown keys, so a typo is an error, never a silently ignored key.
- Durations are stored as ``float`` seconds and sizes as ``int`` bytes; the file and the
  environment may write them as numbers or with units (``"500ms"``, ``"30s"``, ``"5m"``,
  ``"2h"``, ``"1d"``; ``"64KB"``, ``"1MB"``, ``"1GB"``, 1024-based).
- Attribute names are a contract read by the rest of the code base; the defaults here are
  the embedded defaults documented in docs/configuration.md.

The models are plain data (no I/O). Reading files and the environment is the loader's job.
The value syntaxes are in :mod:`gateway.config.values`, the stream listeners' sections in
:mod:`gateway.config.listeners`, the datagram front-ends' in :mod:`gateway.config.gateways`;
this module has the rest and re-exports them all.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainValidator,
    field_validator,
    model_validator,
)

from gateway.config.gateways import (
    CoapConfig,
    CoapListeners,
    DtlsListener,
    GatewaysConfig,
    Lwm2mBootstrap,
    Lwm2mBootstrapPlan,
    Lwm2mBootstrapWrite,
    Lwm2mConfig,
    Lwm2mListeners,
    MqttSnConfig,
    MqttSnListeners,
    MqttSnPredefined,
    UdpListener,
)
from gateway.config.listeners import (
    DEFAULT_TLS_VERSIONS,
    MQTT_WS_SUBPROTOCOLS,
    TLS_VERSIONS,
    FailMode,
    KeyPassword,
    Listeners,
    OcspCheck,
    OcspStapling,
    PeerCertField,
    SslListener,
    TcpListener,
    TlsVerify,
    TlsVersion,
    WebSocketOptions,
    WsListener,
    WssListener,
    _join_ciphers,
)
from gateway.config.shipper import FleetShipperConfig
from gateway.config.values import (
    BIND_HINT,
    BYTE_RATE_HINT,
    DURATION_HINT,
    MAX_MQTT_PACKET,
    MAX_SESSION_EXPIRY,
    RATE_HINT,
    SIZE_HINT,
    AuthzAction,
    Bind,
    ByteRate,
    Duration,
    LogLevel,
    MqueueOverflow,
    Network,
    Permission,
    Rate,
    SharedStrategy,
    Size,
    TopicFilter,
    _check_topic_filter,
    _lower,
    _Section,
    _split_commas,
    parse_bind,
    parse_byte_rate,
    parse_duration,
    parse_rate,
    parse_size,
)


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
    # a listener whose port is taken is reported on one line (and an alarm) and skipped,
    # the others still open; off: gatewayd stops (the first run turns it on: first_run.py)
    skip_busy_ports: bool = False


class LogConfig(_Section):
    level: Annotated[LogLevel, BeforeValidator(_lower)] = "info"


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
    exclusive_subscription: bool = False  # $exclusive/... (docs/mqtt-extensions.md)
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
    shipper: FleetShipperConfig = Field(default_factory=FleetShipperConfig)


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


class JwtAuthnConfig(_Section):
    """``[authentication.jwt]`` (EMQX's ``mechanism = "jwt"``; docs/security.md "JWT").

    The token comes in the CONNECT's ``from`` field. ``algorithm = "hmac-based"``:
    HS256/384/512 with ``secret`` (``secret_base64_encoded``: the secret is base64);
    ``"public-key"``: RS/PS/ES with ``public_key`` (PEM text or a path to a PEM file), or
    with ``use_jwks`` the keys of the JWKS at ``endpoint``, fetched at start and every
    ``refresh_interval`` (and at once, at most every 10 s, for an unknown ``kid``).
    ``verify_claims``: claim -> required value, where ``${clientid}`` and ``${username}``
    stand for the client's; ``exp``/``nbf``/``iat`` are always checked.
    ``acl_claim_name``: the claim with the client's publish/subscribe rules.
    ``ssl`` (EMQX's name; the keys of a bridge's ``tls`` table): TLS for the JWKS fetch,
    e.g. a private CA (``cacertfile``) or a client certificate; used when ``enable``.
    """

    enable: bool = False
    from_: Annotated[Literal["password", "username"], Field(alias="from")] = "password"
    use_jwks: bool = False
    algorithm: Literal["hmac-based", "public-key"] = "hmac-based"
    secret: str = ""
    secret_base64_encoded: bool = False
    public_key: str = ""
    endpoint: str = ""
    refresh_interval: Annotated[Duration, Field(gt=0)] = 300.0
    http_timeout: Annotated[Duration, Field(gt=0)] = 5.0
    verify_claims: dict[str, str] = Field(default_factory=dict)
    acl_claim_name: str = "acl"
    disconnect_after_expire: bool = True
    ssl: BridgeTls = Field(default_factory=lambda: BridgeTls())

    @model_validator(mode="after")
    def _keys(self) -> JwtAuthnConfig:
        if not self.enable:
            return self
        if self.use_jwks:
            if not self.endpoint:
                raise ValueError("use_jwks needs endpoint (the JWKS URL)")
        elif self.algorithm == "hmac-based" and not self.secret:
            raise ValueError('algorithm = "hmac-based" needs secret')
        elif self.algorithm == "public-key" and not self.public_key:
            raise ValueError('algorithm = "public-key" needs public_key (or use_jwks)')
        return self


class AuthenticationConfig(_Section):
    allow_anonymous: bool = True
    builtin_db: BuiltinDbAuthnConfig = Field(default_factory=BuiltinDbAuthnConfig)
    scram: ScramAuthnConfig = Field(default_factory=ScramAuthnConfig)
    http: HttpAuthnConfig = Field(default_factory=HttpAuthnConfig)
    jwt: JwtAuthnConfig = Field(default_factory=JwtAuthnConfig)


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


class HttpAuthzSource(_Section):
    """``[[authorization.sources]] type = "http"`` (EMQX's HTTP authorizer).

    ``body`` (POST: JSON) or the URL's query (GET) is a template over ``${clientid}``,
    ``${username}``, ``${peerhost}``, ``${action}``, ``${topic}``, ``${qos}``,
    ``${retain}``, ``${protocol}``, ``${mountpoint}``. The answer: 200 with
    ``{"result": "allow"|"deny"|"ignore"}`` or 204 (allow); 4xx is ``ignore``; a timeout,
    5xx or unreadable answer is ``on_error``. Decisions are cached for ``cache_ttl``."""

    type: Literal["http"]
    enable: bool = True
    method: Literal["post", "get"] = "post"
    url: HttpUrl
    headers: dict[str, str] = Field(default_factory=dict)
    body: dict[str, str] = Field(default_factory=lambda: {
        "clientid": "${clientid}", "username": "${username}", "peerhost": "${peerhost}",
        "action": "${action}", "topic": "${topic}",
    })
    request_timeout: Annotated[Duration, Field(gt=0)] = 5.0
    pool_size: int = Field(default=8, ge=1)
    cache_ttl: Duration = 60.0
    cache_max: int = Field(default=10_000, ge=1)
    on_error: Literal["ignore", "deny"] = "deny"


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
    # external sources after the rules (docs/security.md "HTTP authorization")
    sources: list[HttpAuthzSource] = Field(default_factory=list)


class RulesFile(_Section):
    """The shape of an authorization rules file: a list of ``[[rules]]`` tables."""

    rules: list[AuthzRule] = Field(default_factory=list)


# ------------------------------------------------------------------ operations


def _check_token(value: str) -> str:
    if value and (len(value) < 16 or any(c.isspace() for c in value)):
        raise ValueError("expected at least 16 characters without spaces (or empty)")
    return value


class ApiConfig(KeyPassword):
    """``[api]``: the HTTP management API (``/api/v5/...``), Prometheus metrics
    (``/metrics``) and live trace, on one aiohttp server inside ``gatewayd``.

    Every request but ``/status`` (and ``/metrics`` unless ``metrics_auth``) carries
    ``Authorization: Bearer <token>`` (or a dashboard session: [dashboard]). ``token``
    empty means the token kept in ``token_file`` (None: ``{node.data_dir}/api.token``),
    generated with mode 0600 at the first start; ``gatewayctl`` reads the same file.
    ``certfile`` and ``keyfile`` (PEM, checked at start like an ssl listener's): the port
    speaks HTTPS only, so the dashboard can be opened from the LAN. An encrypted
    ``keyfile`` takes ``password`` or ``password_file`` (its first line), as listeners do.
    ``[api.ocsp]``: OCSP stapling of the API's certificate, as ``[listeners.ssl.<name>.ocsp]``.
    """

    enable: bool = True
    bind: Bind = "127.0.0.1:18083"
    token: Annotated[str, AfterValidator(_check_token)] = ""
    token_file: Path | None = None
    metrics_auth: bool = False
    certfile: Path | None = None
    keyfile: Path | None = None
    ocsp: OcspStapling = Field(default_factory=OcspStapling)

    @model_validator(mode="after")
    def _cert_and_key(self) -> ApiConfig:
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("certfile and keyfile go together")
        if self.ocsp.enable_ocsp_stapling and self.certfile is None:
            raise ValueError("ocsp.enable_ocsp_stapling needs certfile and keyfile (HTTPS)")
        if self.certfile is None and (self.password is not None
                                      or self.password_file is not None):
            raise ValueError("password/password_file are for the keyfile: set certfile "
                             "and keyfile too")
        return self

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


class CrlCacheConfig(_Section):
    """``[crl_cache]`` (EMQX's section, plus ours): CRLs fetched from client
    certificates' distribution points (listeners with ``enable_crl_check``) are kept and
    fetched again every ``refresh_interval``; at most ``capacity`` URLs. ``fail_mode``:
    what a connection gets while its CRL cannot be had ("closed": refused; "open":
    admitted, and cut if the CRL, once fetched, revokes it). ``file_check_interval``:
    how often CRL files are looked at for changes (SIGHUP re-reads them at once)."""

    refresh_interval: Annotated[Duration, Field(ge=1)] = 900.0
    http_timeout: Annotated[Duration, Field(gt=0)] = 15.0
    capacity: int = Field(default=100, ge=1)
    fail_mode: FailMode = "closed"
    file_check_interval: Annotated[Duration, Field(gt=0)] = 5.0


class FlappingDetectConfig(_Section):
    """``[flapping_detect]`` (EMQX's): a client id that connects ``max_count`` times
    within ``window_time`` is banned for ``ban_time``."""

    enable: bool = False
    max_count: int = Field(default=15, ge=2)
    window_time: Annotated[Duration, Field(gt=0)] = 60.0
    ban_time: Annotated[Duration, Field(gt=0)] = 300.0


class ClusterTlsConfig(KeyPassword):
    """``[cluster.tls]``: the node's certificate (issued by the cluster CA with
    ``gatewayctl certs issue DIR <node name> --server-client``) and the CA every peer's
    certificate must chain to."""

    certfile: Path | None = None
    keyfile: Path | None = None
    cacertfile: Path | None = None
    # the peer certificate's CN must be the node name the peer claims
    verify_node_name: bool = True
    # CRLs of the cluster CA: a revoked node is refused at the handshake; re-read on
    # change (its live links are cut) and on SIGHUP
    crlfile: Annotated[list[Path], BeforeValidator(_split_commas)] = Field(default_factory=list)
    # the peer certificate's CRL distribution points ([crl_cache]) and OCSP, checked on
    # both ends after the handshake, before HELLO/WELCOME (gateway/security/linkcheck.py)
    enable_crl_check: bool = False
    ocsp_check: OcspCheck = Field(default_factory=OcspCheck)

    @model_validator(mode="after")
    def _revocation_needs_ca(self) -> ClusterTlsConfig:
        if (self.enable_crl_check or self.ocsp_check.enable) and self.cacertfile is None:
            raise ValueError("enable_crl_check and ocsp_check need cacertfile (the cluster CA)")
        return self


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
    # retained messages, bans, users and run-time rules the same on every node
    # (gateway/cluster/tables.py); the database tables are compared every table_poll
    tables: bool = True
    table_poll: Annotated[Duration, Field(gt=0)] = 0.5

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


class BridgeTls(KeyPassword):
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
    # CRLs of the upstream's CA: a revoked upstream certificate fails the handshake
    crlfile: Annotated[list[Path], BeforeValidator(_split_commas)] = Field(default_factory=list)
    # the upstream certificate's CRL distribution points ([crl_cache]) and OCSP, checked
    # after the handshake and before CONNECT, as on [listeners.ssl.<name>]
    enable_crl_check: bool = False
    ocsp_check: OcspCheck = Field(default_factory=OcspCheck)

    @model_validator(mode="after")
    def _cert_and_key(self) -> BridgeTls:
        if (self.enable_crl_check or self.ocsp_check.enable) and (
            self.verify != "verify_peer" or self.cacertfile is None
        ):
            raise ValueError('enable_crl_check and ocsp_check need verify = "verify_peer" '
                             "and cacertfile (the upstream's CA)")
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("certfile and keyfile go together")
        if self.certfile is None and (self.password is not None
                                      or self.password_file is not None):
            raise ValueError("password/password_file are for the keyfile: set certfile "
                             "and keyfile too")
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


from gateway.config.connectors import ConnectorsConfig  # noqa: E402
from gateway.config.dashboard import DashboardConfig  # noqa: E402
from gateway.config.extensions import (  # noqa: E402
    AutoSubscribeConfig,
    DelayedConfig,
    RewriteRule,
)
from gateway.config.rules import RuleEngineConfig, RuleEngineField, WebhookConfig  # noqa: E402


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
    crl_cache: CrlCacheConfig = Field(default_factory=CrlCacheConfig)
    api: ApiConfig = Field(default_factory=ApiConfig)
    dashboard: DashboardConfig = Field(default_factory=DashboardConfig)  # gateway.admin.dashboard
    sys_topics: SysTopicsConfig = Field(default_factory=SysTopicsConfig)
    bridges: BridgesConfig = Field(default_factory=BridgesConfig)
    webhooks: dict[str, WebhookConfig] = Field(default_factory=dict)  # gateway.rules
    connectors: ConnectorsConfig = Field(default_factory=ConnectorsConfig)  # rules' sinks
    rule_engine: RuleEngineField = Field(default_factory=RuleEngineConfig)
    # EMQX's MQTT extensions (gateway.ext; docs/mqtt-extensions.md)
    auto_subscribe: AutoSubscribeConfig = Field(default_factory=AutoSubscribeConfig)
    delayed: DelayedConfig = Field(default_factory=DelayedConfig)
    rewrite: list[RewriteRule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _workers_alone(self) -> GatewayConfig:
        if self.node.workers > 1 and self.cluster.enable:
            raise ValueError(
                "node.workers > 1 cannot be combined with a configured cluster yet "
                "(the workers form their own private cluster; docs/workers.md)"
            )
        return self


# everything public here, with the sections and value types of values, listeners and gateways
__all__ = [
    "ApiConfig",
    "AuthenticationConfig",
    "AuthorizationConfig",
    "AuthzAction",
    "AuthzCacheConfig",
    "AuthzRule",
    "BIND_HINT",
    "BYTE_RATE_HINT",
    "Bind",
    "BridgeFilter",
    "BridgeForward",
    "BridgeOutbox",
    "BridgeQos",
    "BridgeReconnect",
    "BridgeRetain",
    "BridgeSubscription",
    "BridgeTls",
    "BridgesConfig",
    "BuiltinDbAuthnConfig",
    "ByteRate",
    "ClusterConfig",
    "ClusterDnsConfig",
    "ClusterTlsConfig",
    "CrlCacheConfig",
    "FailMode",
    "HttpAuthzSource",
    "JwtAuthnConfig",
    "KeyPassword",
    "OcspCheck",
    "OcspStapling",
    "CoapConfig",
    "CoapListeners",
    "DEFAULT_TLS_VERSIONS",
    "DURATION_HINT",
    "DtlsListener",
    "DurabilityConfig",
    "Duration",
    "FlappingDetectConfig",
    "FleetArchiverConfig",
    "FleetShipperConfig",
    "FleetConfig",
    "GatewayConfig",
    "GatewaysConfig",
    "HttpAuthnConfig",
    "HttpUrl",
    "Listeners",
    "LogConfig",
    "LogLevel",
    "Lwm2mBootstrap",
    "Lwm2mBootstrapPlan",
    "Lwm2mBootstrapWrite",
    "Lwm2mConfig",
    "Lwm2mListeners",
    "MAX_MQTT_PACKET",
    "MAX_SESSION_EXPIRY",
    "MQTT_WS_SUBPROTOCOLS",
    "MqttBridge",
    "MqttConfig",
    "MqttSnConfig",
    "MqttSnListeners",
    "MqttSnPredefined",
    "MqueueOverflow",
    "Network",
    "NodeConfig",
    "PathName",
    "PeerCertField",
    "Permission",
    "RATE_HINT",
    "Rate",
    "RetainerConfig",
    "RulesFile",
    "SIZE_HINT",
    "ScramAuthnConfig",
    "SharedStrategy",
    "Size",
    "SslListener",
    "SysEventMessages",
    "SysTopicsConfig",
    "TLS_VERSIONS",
    "TcpListener",
    "TlsVerify",
    "TlsVersion",
    "TopicFilter",
    "TopicTemplate",
    "UdpListener",
    "WebSocketOptions",
    "WsListener",
    "WssListener",
    "parse_bind",
    "parse_byte_rate",
    "parse_duration",
    "parse_rate",
    "parse_size",
]
