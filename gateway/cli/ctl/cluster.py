"""``gatewayctl cluster [status] [--json]``: cluster members and their states.

A node without clustering reports ``not configured`` and itself as the only member.
"""

from __future__ import annotations

from pathlib import Path

import click

from gateway.cli.ctl import fmt
from gateway.cli.ctl.apiclient import config_option, connect, emit_json, json_option


@click.group(name="cluster", invoke_without_command=True,
             help="Cluster membership (alone: `gatewayctl cluster` = `cluster status`).")
@config_option
@json_option
@click.pass_context
def cluster(ctx: click.Context, config_path: Path | None, as_json: bool) -> None:
    if ctx.invoked_subcommand is None:
        ctx.invoke(status_cmd, config_path=config_path, as_json=as_json)


@cluster.command(name="status")
@config_option
@json_option
def status_cmd(config_path: Path | None = None, as_json: bool = False) -> None:
    """Show the cluster: its state, this node's role, the members."""
    c = connect(config_path).get("/cluster")
    if as_json:
        emit_json(c)
        return
    out = fmt.console()
    out.print(fmt.pairs([
        ("Cluster", c["status"] if not c["enabled"] else c["name"]),
        ("This node", f"{c['self']} ({c['role']})"),
    ]))
    out.print()
    out.print(fmt.table(
        ["Member", "Role", "Status", "Version", "Connections"],
        [(m["node"] + (" (self)" if m.get("self") else ""), m["role"], m["status"],
          m["version"], m.get("connections")) for m in c["members"]],
    ))
