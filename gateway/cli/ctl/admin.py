"""``gatewayctl admin setup``: a new one-time link that makes the dashboard's first
administrator.

Asks the running gatewayd (with the API token, which only the node's own files give)
for a new setup token and prints the link; the previous token stops working. Refused
once an administrator exists (exit status 1, one line).
"""

from __future__ import annotations

from pathlib import Path

import click

from gateway.cli.ctl.apiclient import config_option, connect, load


@click.group(name="admin")
def admin() -> None:
    """The dashboard's administrators."""


@admin.command(name="setup")
@config_option
def setup(config_path: Path | None) -> None:
    """Print a one-time setup link for the dashboard's first administrator."""
    client = connect(config_path)
    result = client.request("POST", "/api/v5/dashboard/setup_token")
    config = load(config_path)
    scheme = "https" if getattr(config.api, "certfile", None) else "http"
    hours = int(result["expires_in"] // 3600)
    click.echo(f"{scheme}://{client.where}{result['path']}")
    click.echo(f"one-time setup link, valid {hours} h: open it and choose the "
               "administrator's password", err=True)
