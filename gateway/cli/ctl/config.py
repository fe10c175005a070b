"""``gatewayctl config check FILE`` and ``gatewayctl config show``: offline, no node needed.

``check`` validates FILE exactly as ``gatewayd --config FILE --check`` would (with the
``GATEWAY_*`` environment applied unless ``--no-env``): ``FILE: configuration OK`` and
exit 0, or one line naming the key and exit 2. ``show`` prints the effective
configuration (defaults, file, environment) as JSON, with the API token masked.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from gateway.cli.ctl.apiclient import ConfigInvalid, config_option, load


@click.group(name="config", help="Validate or show a configuration (offline).")
def config() -> None:
    pass


@config.command(name="check")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--no-env", is_flag=True, help="Ignore GATEWAY_* environment variables.")
def check(file: Path, no_env: bool) -> None:
    """Validate FILE (exit 0 if valid, 2 if not, with the key and problem)."""
    if not file.is_file():
        raise ConfigInvalid(f"{file}: no such file")
    load(file, environ={} if no_env else None)
    click.echo(f"{file}: configuration OK")


@config.command(name="show")
@config_option
def show(config_path: Path | None) -> None:
    """Print the effective configuration as JSON (defaults + file + environment)."""
    cfg = load(config_path)
    data = cfg.model_dump(mode="json")
    if data.get("api", {}).get("token"):
        data["api"]["token"] = "********"
    click.echo(json.dumps(data, indent=2))
