"""``gatewayctl rules``: the rule engine of a running node, through its management API.

    gatewayctl rules list [--json]
    gatewayctl rules show ID [--json]              (SQL, actions, metrics)
    gatewayctl rules create ID --sql SQL [--action JSON]... [--disable] [--description T]
    gatewayctl rules enable ID | disable ID
    gatewayctl rules delete ID
    gatewayctl rules test --sql SQL [--context JSON]   (EMQX's "test SQL")

``--action`` is ``{"function": "republish", "args": {...}}`` or just a function name
(``console``, ``webhook:NAME``). A rule the node refuses (bad SQL, unknown function, bad
action arguments) is reported on one line naming the position; exit status 2. Rules
created here persist across restarts of the node.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from gateway.cli.ctl import fmt
from gateway.cli.ctl.apiclient import (
    API,
    CtlError,
    config_option,
    connect,
    emit_json,
    json_option,
    path_arg,
)


class BadRule(CtlError):
    exit_code = 2


def _refused(call: Any) -> Any:
    try:
        return call()
    except CtlError as exc:
        if type(exc) is CtlError:
            raise BadRule(exc.message) from None
        raise


@click.group(name="rules")
def rules() -> None:
    """Rules of the rule engine (SQL over messages and events, with actions)."""


@rules.command(name="list")
@config_option
@json_option
def list_rules(config_path: Path | None, as_json: bool) -> None:
    """List the rules with their counters."""
    items, _ = connect(config_path).get_all("/rules")
    if as_json:
        emit_json(items)
        return
    if not items:
        click.echo("no rules")
        return
    fmt.console().print(fmt.table(
        ["Rule", "Enabled", "From", "Matched", "Passed", "Failed", "Actions ok/failed"],
        [(r["id"], "yes" if r["enable"] else "no", ", ".join(r["from"]),
          r["metrics"]["matched"], r["metrics"]["passed"], r["metrics"]["failed"],
          f'{r["metrics"]["actions.success"]}/{r["metrics"]["actions.failed"]}')
         for r in items],
    ))


@rules.command(name="show")
@click.argument("rule_id")
@config_option
@json_option
def show(rule_id: str, config_path: Path | None, as_json: bool) -> None:
    """One rule: SQL, actions, metrics (per action too) and its last error."""
    r = connect(config_path).get(f"/rules/{path_arg(rule_id)}")
    if as_json:
        emit_json(r)
        return
    click.echo(f"rule {r['id']} ({'enabled' if r['enable'] else 'disabled'}, {r['origin']})")
    click.echo(f"  sql: {r['sql']}")
    if r["description"]:
        click.echo(f"  description: {r['description']}")
    m = r["metrics"]
    click.echo("  metrics: " + ", ".join(f"{k}={v}" for k, v in m.items()))
    for i, a in enumerate(r["action_metrics"]):
        args = json.dumps(r["actions"][i]["args"], ensure_ascii=False)
        depth = f" queue_depth={a['queue_depth']}" if "queue_depth" in a else ""
        click.echo(f"  action {i}: {a['function']} {args} success={a['success']} "
                   f"failed={a['failed']}{depth}")
    if r["last_error"]:
        click.echo(f"  last error: {r['last_error']}")


def _action(text: str) -> Any:
    text = text.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadRule(f"--action: not JSON: {exc}") from None
    return {"function": text, "args": {}}


@rules.command(name="create")
@click.argument("rule_id")
@click.option("--sql", required=True, help="The rule's SQL.")
@click.option("--action", "actions", multiple=True, help="An action (JSON or a name).")
@click.option("--description", default="", help="Free text.")
@click.option("--disable", is_flag=True, help="Create it disabled.")
@config_option
@json_option
def create(rule_id: str, sql: str, actions: tuple[str, ...], description: str,
           disable: bool, config_path: Path | None, as_json: bool) -> None:
    """Create a rule (kept across restarts)."""
    body = {"id": rule_id, "sql": sql, "actions": [_action(a) for a in actions],
            "description": description, "enable": not disable}
    client = connect(config_path)
    r = _refused(lambda: client.request("POST", f"{API}/rules", body=body))
    if as_json:
        emit_json(r)
    else:
        click.echo(f"rule {r['id']} created (from {', '.join(r['from'])})")


def _set_enable(rule_id: str, enable: bool, config_path: Path | None) -> None:
    client = connect(config_path)
    client.request("PUT", f"{API}/rules/{path_arg(rule_id)}", body={"enable": enable})
    click.echo(f"rule {rule_id} {'enabled' if enable else 'disabled'}")


@rules.command(name="enable")
@click.argument("rule_id")
@config_option
def enable(rule_id: str, config_path: Path | None) -> None:
    """Enable a rule."""
    _set_enable(rule_id, True, config_path)


@rules.command(name="disable")
@click.argument("rule_id")
@config_option
def disable(rule_id: str, config_path: Path | None) -> None:
    """Disable a rule (it stays, with its counters)."""
    _set_enable(rule_id, False, config_path)


@rules.command(name="delete")
@click.argument("rule_id")
@config_option
def delete(rule_id: str, config_path: Path | None) -> None:
    """Delete a rule (a rule of the configuration file stays deleted after restarts)."""
    connect(config_path).delete(f"/rules/{path_arg(rule_id)}")
    click.echo(f"rule {rule_id} deleted")


@rules.command(name="test")
@click.option("--sql", required=True, help="The SQL to test.")
@click.option("--context", default="{}", help='The sample event as JSON, e.g. '
              '\'{"topic": "t/1", "payload": "{\\"x\\": 1}"}\'; "event_type" picks an event.')
@config_option
def test(sql: str, context: str, config_path: Path | None) -> None:
    """Run SQL against a sample event and print the output (as EMQX's "test SQL")."""
    try:
        ctx = json.loads(context)
    except json.JSONDecodeError as exc:
        raise BadRule(f"--context: not JSON: {exc}") from None
    client = connect(config_path)
    try:
        out = client.request("POST", f"{API}/rule_test", body={"sql": sql, "context": ctx})
    except CtlError as exc:
        if "SQL_NOT_MATCH" in exc.message or "no output" in exc.message:
            click.echo("no output (the SQL does not match this context)")
            raise click.exceptions.Exit(1) from None
        if type(exc) is CtlError:
            raise BadRule(exc.message) from None
        raise
    emit_json(out)
