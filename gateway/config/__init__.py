"""The gateway's configuration: schema (pydantic models) and loader (TOML + environment).

    from gateway.config import load_config
    config = load_config("gateway.toml")      # or load_config(None) for embedded defaults
    config.mqtt.max_inflight                  # int
    config.mqtt.session_expiry_interval       # float seconds
    config.listeners.tcp["default"].port      # int

See docs/configuration.md for every key.
"""

from gateway.config.loader import (
    ENV_PREFIX,
    ConfigError,
    describe_errors,
    load_config,
    load_rules_file,
    parse_env_value,
)
from gateway.config.schema import (
    AuthenticationConfig,
    AuthorizationConfig,
    AuthzAction,
    AuthzRule,
    GatewayConfig,
    Listeners,
    LogConfig,
    LogLevel,
    MqttConfig,
    MqueueOverflow,
    NodeConfig,
    Permission,
    RetainerConfig,
    SharedStrategy,
    SslListener,
    TcpListener,
    parse_bind,
    parse_duration,
    parse_size,
)

__all__ = [
    "ENV_PREFIX",
    "AuthenticationConfig",
    "AuthorizationConfig",
    "AuthzAction",
    "AuthzRule",
    "ConfigError",
    "GatewayConfig",
    "Listeners",
    "LogConfig",
    "LogLevel",
    "MqttConfig",
    "MqueueOverflow",
    "NodeConfig",
    "Permission",
    "RetainerConfig",
    "SharedStrategy",
    "SslListener",
    "TcpListener",
    "describe_errors",
    "load_config",
    "load_rules_file",
    "parse_bind",
    "parse_duration",
    "parse_env_value",
    "parse_size",
]
