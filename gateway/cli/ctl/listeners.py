"""``gatewayctl listeners [--json]``: every listener with its connection counts."""

from __future__ import annotations

from pathlib import Path

import click

from gateway.cli.ctl import fmt
from gateway.cli.ctl.apiclient import config_option, connect, emit_json, json_option


@click.command(name="listeners")
@config_option
@json_option
def listeners(config_path: Path | None, as_json: bool) -> None:
    """List listeners: protocol, address, state, connections, limits."""
    api = connect(config_path)
    items = api.get("/listeners")
    fronts = api.get("/gateways")
    if as_json:
        emit_json({"listeners": items, "gateways": fronts})
        return
    out = fmt.console()
    out.print(fmt.table(
        ["Listener", "Type", "Protocol", "Address", "Status", "Connections", "Max", "Refused"],
        [(lst["id"], lst["type"], lst["protocol"], ", ".join(lst["addresses"]) or lst["bind"],
          lst["status"], lst["current_connections"], lst["max_connections"] or "unlimited",
          lst["refused_connections"]) for lst in items],
    ))
    out.print(fmt.table(
        ["Front-end", "Status", "Listeners", "Connections"],
        [(g["name"], g["status"], ", ".join(g["listeners"]) or None, g["current_connections"])
         for g in fronts],
    ))
