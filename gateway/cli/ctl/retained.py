"""``gatewayctl retained list|show|delete``: the retained messages.

    gatewayctl retained list [--topic FILTER] [--json]
    gatewayctl retained show TOPIC [--json]       # payload as text (or hex), or JSON base64
    gatewayctl retained delete TOPIC
"""

from __future__ import annotations

import base64
from pathlib import Path

import click

from gateway.cli.ctl import fmt
from gateway.cli.ctl.apiclient import config_option, connect, emit_json, json_option, path_arg


@click.group(name="retained", help="List, show and delete retained messages.")
def retained() -> None:
    pass


@retained.command(name="list")
@config_option
@json_option
@click.option("--topic", metavar="FILTER", help="Only topics matching FILTER.")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True)
def list_cmd(config_path: Path | None, as_json: bool, topic: str | None, limit: int) -> None:
    """List retained messages (without payloads)."""
    items, count = connect(config_path).get_all("/retainer/messages", limit=limit, topic=topic)
    if as_json:
        emit_json(items)
        return
    fmt.console().print(fmt.table(
        ["Topic", "QoS", "Size", "From", "Published"],
        [(m["topic"], m["qos"], m["payload_size"], m["from_clientid"], fmt.when(m["publish_at"]))
         for m in items],
    ))
    click.echo(f"{count} retained message{'s' if count != 1 else ''}")


@retained.command(name="show")
@config_option
@json_option
@click.argument("topic")
def show_cmd(config_path: Path | None, as_json: bool, topic: str) -> None:
    """Show one retained message with its payload."""
    m = connect(config_path).get(f"/retainer/messages/{path_arg(topic)}")
    if as_json:
        emit_json(m)
        return
    payload = base64.b64decode(m["payload"])
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        text = "0x" + payload.hex()
    fmt.console().print(fmt.pairs([
        ("Topic", m["topic"]), ("QoS", m["qos"]), ("Size", m["payload_size"]),
        ("From", m["from_clientid"]), ("Published", fmt.when(m["publish_at"])),
        ("Expires", fmt.when(m["expires_at"])), ("Payload", text),
    ]))


@retained.command(name="delete")
@config_option
@click.argument("topic")
def delete_cmd(config_path: Path | None, topic: str) -> None:
    """Delete the retained message on TOPIC."""
    connect(config_path).delete(f"/retainer/messages/{path_arg(topic)}")
    click.echo(f"deleted the retained message on {topic}")
