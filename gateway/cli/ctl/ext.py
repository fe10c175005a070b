"""``gatewayctl delayed|auto-subscribe|exclusive|rewrite``: the MQTT extensions.

    gatewayctl delayed list [--json]                  # waiting delayed messages
    gatewayctl delayed cancel MSGID                   # on this node
    gatewayctl auto-subscribe list [CLIENTID] [--json]   # configured + per-client topics
    gatewayctl auto-subscribe add CLIENTID TOPIC [--qos N] [--rh N] [--rap] [--nl]
    gatewayctl auto-subscribe delete CLIENTID [TOPIC]
    gatewayctl exclusive list [--json]                # who holds which $exclusive topic
    gatewayctl rewrite list [--json]                  # the topic rewrite rules, in order
"""

from __future__ import annotations

from pathlib import Path

import click

from gateway.cli.ctl import fmt
from gateway.cli.ctl.apiclient import API, config_option, connect, emit_json, json_option, path_arg

__all__ = ["auto_subscribe", "delayed", "exclusive", "rewrite"]

M = "/mqtt"


@click.group(name="delayed", help="List and cancel delayed messages ($delayed/N/topic).")
def delayed() -> None:
    pass


@delayed.command(name="list")
@config_option
@json_option
def delayed_list(config_path: Path | None, as_json: bool) -> None:
    """List the delayed messages waiting on this node, soonest first."""
    items, count = connect(config_path).get_all(f"{M}/delayed/messages")
    if as_json:
        emit_json(items)
        return
    fmt.console().print(fmt.table(
        ["Id", "Topic", "QoS", "From", "Due", "In"],
        [(m["msgid"], m["topic"], m["qos"], m["from_clientid"], fmt.when(m["expected_at"]),
          fmt.duration(m["delayed_remaining"])) for m in items],
    ))
    click.echo(f"{count} delayed message{'s' if count != 1 else ''}")


@delayed.command(name="cancel")
@config_option
@click.argument("msgid")
def delayed_cancel(config_path: Path | None, msgid: str) -> None:
    """Cancel the delayed message MSGID (it is never published)."""
    api = connect(config_path)
    api.delete(f"{M}/delayed/messages/{path_arg(api.node)}/{path_arg(msgid)}")
    click.echo(f"cancelled delayed message {msgid}")


@click.group(name="auto-subscribe",
             help="Topics the broker subscribes clients to when they connect.")
def auto_subscribe() -> None:
    pass


@auto_subscribe.command(name="list")
@config_option
@json_option
@click.argument("clientid", required=False)
def auto_list(config_path: Path | None, as_json: bool, clientid: str | None) -> None:
    """The configured topics (every client) and the per-client ones (of CLIENTID)."""
    api = connect(config_path)
    configured = api.get(f"{M}/auto_subscribe")
    if clientid is None:
        own, _ = api.get_all(f"{M}/auto_subscribe/clients")
    else:
        own = api.get(f"{M}/auto_subscribe/clients/{path_arg(clientid)}")
    if as_json:
        emit_json({"configured": configured, "clients": own})
        return
    rows = [("(all)", t["topic"], t["qos"], t["rh"], t["rap"], t["nl"]) for t in configured]
    rows += [(t["clientid"], t["topic"], t["qos"], t["rh"], t["rap"], t["nl"]) for t in own]
    fmt.console().print(fmt.table(["Client", "Topic", "QoS", "RH", "RAP", "NL"], rows))


@auto_subscribe.command(name="add")
@config_option
@click.argument("clientid")
@click.argument("topic")
@click.option("--qos", type=click.IntRange(0, 2), default=0, show_default=True)
@click.option("--rh", type=click.IntRange(0, 2), default=0, show_default=True,
              help="Retain handling.")
@click.option("--rap", is_flag=True, help="Retain as published.")
@click.option("--nl", is_flag=True, help="No local.")
def auto_add(config_path: Path | None, clientid: str, topic: str, qos: int, rh: int,
             rap: bool, nl: bool) -> None:
    """Subscribe CLIENTID to TOPIC from its next connect (kept in the built-in store)."""
    body = {"topic": topic, "qos": qos, "rh": rh, "rap": int(rap), "nl": int(nl)}
    connect(config_path).request(
        "POST", f"{API}{M}/auto_subscribe/clients/{path_arg(clientid)}", body=body)
    click.echo(f"{clientid} will be subscribed to {topic} (qos {qos}) when it connects")


@auto_subscribe.command(name="delete")
@config_option
@click.argument("clientid")
@click.argument("topic", required=False)
def auto_delete(config_path: Path | None, clientid: str, topic: str | None) -> None:
    """Delete one of CLIENTID's auto-subscribe topics, or all of them."""
    connect(config_path).delete(f"{M}/auto_subscribe/clients/{path_arg(clientid)}",
                                topic=topic)
    click.echo(f"deleted {'topic ' + topic if topic else 'every topic'} of {clientid}")


@click.group(name="exclusive", help="Exclusive subscriptions ($exclusive/topic).")
def exclusive() -> None:
    pass


@exclusive.command(name="list")
@config_option
@json_option
def exclusive_list(config_path: Path | None, as_json: bool) -> None:
    """Who holds which exclusive subscription on this node."""
    items, count = connect(config_path).get_all(f"{M}/exclusive")
    if as_json:
        emit_json(items)
        return
    fmt.console().print(fmt.table(["Topic", "Client", "Node"],
                                  [(h["topic"], h["clientid"] or "-", h["node"]) for h in items]))
    click.echo(f"{count} exclusive subscription{'s' if count != 1 else ''}")


@click.group(name="rewrite", help="Topic rewrite rules.")
def rewrite() -> None:
    pass


@rewrite.command(name="list")
@config_option
@json_option
def rewrite_list(config_path: Path | None, as_json: bool) -> None:
    """The rules, in the order they apply (from the configuration)."""
    rules = connect(config_path).get(f"{M}/topic_rewrite")
    if as_json:
        emit_json(rules)
        return
    fmt.console().print(fmt.table(
        ["#", "Action", "Source", "Regex", "Destination"],
        [(i, r["action"], r["source_topic"], r["re"], r["dest_topic"])
         for i, r in enumerate(rules)],
    ))
