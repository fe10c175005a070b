"""``[fleet.shipper]``: how ``gateway-fleet ship`` delivers sealed segments (rclone).

Invariants: secrets are never in this model's plain fields: they come from
``credentials_file`` (read by the shipper, never by the loader) or from the process
environment (rclone's ``RCLONE_CONFIG_FLEET_*``); ``options`` is for non-secret backend
options and refuses the names rclone uses for secrets, so a secret cannot end up in a
config dump, a log line or a command line. :mod:`gateway.config.schema` imports this module.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from gateway.config.values import ByteRate, Duration, Size, _Section

SECRET_OPTIONS = frozenset(
    {"pass", "password", "key_pem", "secret_access_key", "session_token", "bearer_token",
     "key_file_pass", "sse_customer_key", "token", "client_secret"}
)
"""rclone backend options that hold secrets: only from ``credentials_file`` or the env."""

_OPTION_RE = re.compile(r"[a-z][a-z0-9_]*")


def _parse_ratio(value: object) -> object:
    if isinstance(value, str) and value.strip().endswith("%"):
        return float(value.strip()[:-1]) / 100
    return value


class FleetShipperConfig(_Section):
    """Where sealed segments go. ``type`` picks the rclone backend: ``local`` (``path`` is
    a directory, e.g. a mounted share), ``sftp`` (``host``, ``port``, ``user``,
    ``key_file``), ``webdav`` and ``s3`` (``url``: the endpoint, ``path``: bucket/prefix).
    """

    enable: bool = False
    type: Literal["local", "sftp", "webdav", "s3"] = "local"
    path: str = ""
    host: str = ""
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    user: str = ""
    key_file: Path | None = None
    url: str = ""
    provider: str = "Other"  # s3: AWS, Minio, Ceph, ... (rclone's provider names)
    region: str = ""
    options: dict[str, str] = Field(default_factory=dict)
    credentials_file: Path | None = None
    bwlimit: ByteRate = 0.0
    io_timeout: Annotated[Duration, Field(gt=0)] = 60.0
    spool_max: Annotated[Size, Field(ge=1 << 20)] = 1 << 30
    spool_alarm: Annotated[float, BeforeValidator(_parse_ratio), Field(gt=0, le=1)] = 0.8
    when_full: Literal["delete_oldest", "keep"] = "delete_oldest"
    verify_download: bool = True

    @field_validator("options")
    @classmethod
    def _no_secret_options(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _OPTION_RE.fullmatch(name):
                raise ValueError(f"option {name!r}: expected rclone's lower_case option name")
            if name in SECRET_OPTIONS:
                raise ValueError(
                    f"option {name!r} is a secret: put it in credentials_file or the "
                    "environment (RCLONE_CONFIG_FLEET_" + name.upper() + ")"
                )
        return value

    @model_validator(mode="after")
    def _complete(self) -> FleetShipperConfig:
        if not self.enable:
            return self
        if not self.path.strip("/"):
            raise ValueError("fleet.shipper.path is required (the central raw root)")
        if self.type == "sftp" and not self.host:
            raise ValueError("fleet.shipper.type = \"sftp\" needs host")
        if self.type in ("webdav", "s3") and not self.url:
            raise ValueError(f"fleet.shipper.type = \"{self.type}\" needs url")
        return self
