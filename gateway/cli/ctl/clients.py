"""``gatewayctl clients list|show``: connected clients and offline sessions.

    gatewayctl clients list [--username U] [--ip ADDR] [--state connected|disconnected]
                            [--listener tcp:default] [--protocol mqtt] [--like TEXT]
                            [--limit N] [--json]
    gatewayctl clients show CLIENTID [--json]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gateway.cli.ctl import fmt
from gateway.cli.ctl.apiclient import (
    config_option,
    connect,
    emit_json,
    json_option,
    path_arg,
)


@click.group(name="clients", help="List and inspect clients (sessions, online or not).")
def clients() -> None:
    pass


@clients.command(name="list")
@config_option
@json_option
@click.option("--username", help="Exact username.")
@click.option("--ip", "ip_address", help="Exact peer address.")
@click.option("--state", "conn_state", type=click.Choice(["connected", "disconnected"]),
              help="Connection state.")
@click.option("--listener", help="Listener id, e.g. tcp:default.")
@click.option("--protocol", help="mqtt, mqttsn, coap, lwm2m.")
@click.option("--like", "like_clientid", metavar="TEXT", help="Client id contains TEXT.")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Show at most this many.")
def list_cmd(config_path: Path | None, as_json: bool, limit: int, **filters: Any) -> None:
    """List clients, sorted by client id."""
    api = connect(config_path)
    items, count = api.get_all("/clients", limit=limit, **filters)
    if as_json:
        emit_json(items)
        return
    out = fmt.console()
    out.print(fmt.table(
        ["Client ID", "Username", "Address", "Proto", "Listener", "State", "Connected at",
         "Subs", "Queued", "Inflight"],
        [
            (c["clientid"], c["username"],
             f"{c['ip_address']}:{c['port']}" if c["ip_address"] else None,
             fmt.protocol(c),
             c["listener"], "connected" if c["connected"] else "disconnected",
             fmt.when(c["connected_at"]), c["subscriptions_cnt"], c["mqueue_len"],
             c["inflight_cnt"])
            for c in items
        ],
    ))
    shown = f"{len(items)} of {count}" if len(items) < count else str(count)
    click.echo(f"{shown} client{'s' if count != 1 else ''}")


@clients.command(name="show")
@config_option
@json_option
@click.argument("clientid")
def show_cmd(config_path: Path | None, as_json: bool, clientid: str) -> None:
    """Show one client and its subscriptions."""
    api = connect(config_path)
    c = api.get(f"/clients/{path_arg(clientid)}")
    subs = api.get(f"/clients/{path_arg(clientid)}/subscriptions")
    if as_json:
        emit_json({**c, "subscriptions": subs})
        return
    out = fmt.console()
    expiry = c["expiry_interval"]
    out.print(fmt.pairs([
        ("Client ID", c["clientid"]),
        ("State", "connected" if c["connected"] else "disconnected"),
        ("Username", c["username"]),
        ("Address", f"{c['ip_address']}:{c['port']}" if c["ip_address"] else None),
        ("Protocol", fmt.protocol(c)),
        ("Listener", c["listener"]),
        ("Keepalive", f"{c['keepalive']}s"),
        ("Clean start", c["clean_start"]),
        ("Connected at", fmt.when(c["connected_at"])),
        ("Session created", fmt.when(c["created_at"])),
        ("Session expiry", "never" if expiry is None else f"{expiry}s"),
        ("Inflight", f"{c['inflight_cnt']} / {c['inflight_max']}"),
        ("Queued", f"{c['mqueue_len']} / {c['mqueue_max'] or 'unlimited'}"),
        ("Awaiting PUBREL", c["awaiting_rel_cnt"]),
    ]))
    if subs:
        out.print()
        out.print(fmt.table(["Topic filter", "QoS", "No local", "Retain as published",
                             "Retain handling"],
                            [(s["topic"], s["qos"], bool(s["nl"]), bool(s["rap"]), s["rh"])
                             for s in subs], title="Subscriptions"))
