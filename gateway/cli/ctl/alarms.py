"""``gatewayctl alarms [--history] [--json]``: active (or cleared) alarms."""

from __future__ import annotations

from pathlib import Path

import click

from gateway.cli.ctl import fmt
from gateway.cli.ctl.apiclient import config_option, connect, emit_json, json_option


@click.command(name="alarms")
@config_option
@json_option
@click.option("--history", is_flag=True, help="Cleared alarms instead of active ones.")
def alarms(config_path: Path | None, as_json: bool, history: bool) -> None:
    """List active alarms (conditions an operator should look at)."""
    items, _ = connect(config_path).get_all("/alarms", activated=not history)
    if as_json:
        emit_json(items)
        return
    if not items:
        click.echo("no cleared alarms" if history else "no active alarms")
        return
    fmt.console().print(fmt.table(
        ["Alarm", "Since", "Cleared", "Message"],
        [(a["name"], fmt.when(a["activated_at"]), fmt.when(a["deactivated_at"]), a["message"])
         for a in items],
    ))
