"""``gatewayctl metrics [--json]``: the node's statistics and counters."""

from __future__ import annotations

from pathlib import Path

import click

from gateway.cli.ctl import fmt
from gateway.cli.ctl.apiclient import config_option, connect, emit_json, json_option


@click.command(name="metrics")
@config_option
@json_option
def metrics(config_path: Path | None, as_json: bool) -> None:
    """Show statistics (counts and high-water marks) and counters."""
    api = connect(config_path)
    stats = api.get("/stats")
    counters = api.get("/metrics")
    if as_json:
        emit_json({"stats": stats, "metrics": counters})
        return
    out = fmt.console()
    out.print(fmt.table(["Statistic", "Value"], sorted(stats.items()), title="Statistics"))
    out.print(fmt.table(["Counter", "Value"], sorted(counters.items()), title="Counters"))
