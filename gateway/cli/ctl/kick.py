"""``gatewayctl kick CLIENTID [--no-will] [--discard-session]``: disconnect a client.

The client gets DISCONNECT 0x98 (administrative action, MQTT 5). Its will is published
unless ``--no-will``; its session stays for its expiry interval unless
``--discard-session`` (which also ends the session of a client that is offline).
"""

from __future__ import annotations

from pathlib import Path

import click

from gateway.cli.ctl.apiclient import config_option, connect, path_arg


@click.command(name="kick")
@config_option
@click.argument("clientid")
@click.option("--no-will", is_flag=True, help="Do not publish the client's will message.")
@click.option("--discard-session", "discard", is_flag=True,
              help="Also end the session (queued messages and subscriptions go).")
def kick(config_path: Path | None, clientid: str, no_will: bool, discard: bool) -> None:
    """Disconnect CLIENTID (DISCONNECT 0x98, administrative action)."""
    result = connect(config_path).delete(
        f"/clients/{path_arg(clientid)}", will=not no_will, discard=discard
    )
    if result["result"] == "discarded":
        click.echo(f"discarded the session of {clientid}")
    else:
        click.echo(f"kicked {clientid}" + (" and discarded its session" if discard else ""))
