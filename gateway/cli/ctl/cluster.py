"""``gatewayctl cluster [status|join|leave|force-leave] [--json]``: cluster members, their
states, link health and replication lag; membership by hand.

A node without clustering reports ``not configured`` and itself as the only member.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gateway.cli.ctl import fmt
from gateway.cli.ctl.apiclient import API, config_option, connect, emit_json, json_option


@click.group(name="cluster", invoke_without_command=True,
             help="Cluster membership (alone: `gatewayctl cluster` = `cluster status`).")
@config_option
@json_option
@click.pass_context
def cluster(ctx: click.Context, config_path: Path | None, as_json: bool) -> None:
    if ctx.invoked_subcommand is None:
        ctx.invoke(status_cmd, config_path=config_path, as_json=as_json)


def _links(m: dict[str, Any]) -> str | None:
    links = m.get("links")
    if not links:
        return None
    up = [k for k, v in links.items() if v == "up"]
    return "all up" if len(up) == len(links) else (", ".join(up) + " up" if up else "down")


@cluster.command(name="status")
@config_option
@json_option
def status_cmd(config_path: Path | None = None, as_json: bool = False) -> None:
    """Show the cluster: its state, this node's role, the members, their links and lag."""
    c = connect(config_path).get("/cluster")
    if as_json:
        emit_json(c)
        return
    out = fmt.console()
    pairs = [
        ("Cluster", c["status"] if not c["enabled"] else c["name"]),
        ("This node", f"{c['self']} ({c['role']})"),
    ]
    rep = c.get("replicant")
    if rep:  # a replicant: the one core it is attached to
        pairs.append(("Attached to", f"{rep.get('core') or '(none)'}: {rep.get('state')}, "
                                     f"lag {rep.get('lag')}, {rep.get('switches')} switches"))
    if c.get("replicants"):
        pairs.append(("Replicants", ", ".join(c["replicants"])))
    raft = c.get("raft")
    if raft and raft.get("term") is not None:
        pairs.append(("Raft", f"leader {raft.get('leader')}, term {raft.get('term')}, "
                              f"commit {raft.get('commit_index')}, "
                              f"voters {', '.join(raft.get('members') or [])}"))
    out.print(fmt.pairs(pairs))
    out.print()
    out.print(fmt.table(
        ["Member", "Role", "Status", "Links", "RTT ms", "Routes", "Outbox", "Lag",
         "Version", "Connections"],
        [(m["node"] + (" (self)" if m.get("self") else ""), m["role"], m["status"],
          _links(m), m.get("rtt_ms"), m.get("routes"),
          (m.get("outbox") or {}).get("len"),
          (m.get("replication") or {}).get("lag"),
          m["version"], m.get("connections")) for m in c["members"]],
    ))
    tables = c.get("tables")
    if tables:  # the replicated tables: rows and sync state with each linked peer
        out.print()
        out.print(fmt.table(
            ["Table", "Rows", "Tombstones", "State", "Peers", "Local", "Remote"],
            [(name, t.get("rows"), t.get("tombstones"), t.get("state"),
              ", ".join(f"{p} {s}" for p, s in sorted((t.get("peers") or {}).items())),
              t.get("local_changes"), t.get("remote_changes"))
             for name, t in sorted(tables.items())],
        ))


@cluster.command(name="join")
@config_option
@click.argument("node")
def join_cmd(node: str, config_path: Path | None = None) -> None:
    """Join the cluster of NODE (name@host:port, or host:port)."""
    r = connect(config_path).request("POST", API + "/cluster/join", body={"node": node})
    click.echo(f"joining {r['joining']}")


@cluster.command(name="leave")
@config_option
def leave_cmd(config_path: Path | None = None) -> None:
    """Leave the cluster: every member is told and forgotten."""
    r = connect(config_path).request("POST", API + "/cluster/leave")
    click.echo(f"left the cluster ({r['told']} members told)")


@cluster.command(name="force-leave")
@config_option
@click.argument("node")
def force_leave_cmd(node: str, config_path: Path | None = None) -> None:
    """Remove NODE (a dead member) from this node's view of the cluster."""
    connect(config_path).delete(f"/cluster/nodes/{node}")
    click.echo(f"{node} removed")
