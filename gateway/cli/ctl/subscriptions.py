"""``gatewayctl subscriptions``: the subscriptions of every session (offline ones too).

    gatewayctl subscriptions [--client ID] [--topic FILTER] [--match TOPIC] [--qos N]
                             [--share-group G] [--limit N] [--json]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gateway.cli.ctl import fmt
from gateway.cli.ctl.apiclient import config_option, connect, emit_json, json_option


@click.command(name="subscriptions")
@config_option
@json_option
@click.option("--client", "clientid", help="Exact client id.")
@click.option("--topic", help="Exact filter as subscribed ($share/... included).")
@click.option("--match", "match_topic", metavar="TOPIC",
              help="Only filters a message on TOPIC would match.")
@click.option("--qos", type=click.IntRange(0, 2), help="Granted QoS.")
@click.option("--share-group", help="Shared subscription group.")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True)
def subscriptions(config_path: Path | None, as_json: bool, limit: int, **filters: Any) -> None:
    """List subscriptions, by client id then filter."""
    items, count = connect(config_path).get_all("/subscriptions", limit=limit, **filters)
    if as_json:
        emit_json(items)
        return
    fmt.console().print(fmt.table(
        ["Client ID", "Topic filter", "QoS", "Share group", "No local", "Retain handling"],
        [(s["clientid"], s["topic"], s["qos"], s["share_group"], bool(s["nl"]), s["rh"])
         for s in items],
    ))
    shown = f"{len(items)} of {count}" if len(items) < count else str(count)
    click.echo(f"{shown} subscription{'s' if count != 1 else ''}")
