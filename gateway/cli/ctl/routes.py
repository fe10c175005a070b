"""``gatewayctl routes [--topic FILTER] [--json]``: topic filter -> node.

Until clustering every route points at this node; the shape stays when it does not.
"""

from __future__ import annotations

from pathlib import Path

import click

from gateway.cli.ctl import fmt
from gateway.cli.ctl.apiclient import config_option, connect, emit_json, json_option


@click.command(name="routes")
@config_option
@json_option
@click.option("--topic", help="Exact topic filter.")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True)
def routes(config_path: Path | None, as_json: bool, topic: str | None, limit: int) -> None:
    """List routes: each subscribed topic filter and the node(s) it leads to."""
    items, count = connect(config_path).get_all("/routes", limit=limit, topic=topic)
    if as_json:
        emit_json(items)
        return
    fmt.console().print(fmt.table(
        ["Topic filter", "Node", "Subscribers", "Shared groups"],
        [(r["topic"], r["node"], r["subscribers"], ", ".join(r["shared_groups"]) or None)
         for r in items],
    ))
    click.echo(f"{count} route{'s' if count != 1 else ''}")
