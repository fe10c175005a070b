"""``gatewayctl status [--json]``: the node at a glance.

Node, version, uptime, role, cluster members and their states, listeners with their
connection counts, connections per protocol, sessions, subscriptions, retained
messages, message rates, bridges and active alarms, from ``GET /api/v5/status``.
Exit status 0 when the node answers, 3 when it does not (one line on stderr).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gateway.cli.ctl import fmt
from gateway.cli.ctl.apiclient import config_option, connect, emit_json, json_option


@click.command(name="status")
@config_option
@json_option
def status(config_path: Path | None, as_json: bool) -> None:
    """Show the node's state: listeners, clients, sessions, rates, cluster, alarms."""
    data = connect(config_path).get("/status")
    if as_json:
        emit_json(data)
        return
    render(data)


def _store_line(st: dict[str, Any] | None) -> str:
    """The store's state in one line: writable or why not, disk use, size."""
    if not st:
        return "memory only"
    state = "accepting" if not st.get("refusing") else f"REFUSING ({st['refusing']})"
    usage = st.get("disk_usage")
    disk = f"disk {usage:.0%} used, {(st.get('disk_free') or 0) / 1048576:.1f} MiB free" \
        if usage is not None else "disk ?"
    size = f"{(st.get('db_bytes') or 0) / 1048576:.1f} MiB"
    cap = f" of {st['max_size'] / 1048576:.1f} MiB cap" if st.get("max_size") else ""
    reserve = "" if st.get("reserve_held") or not st.get("reserve_size") else ", reserve released"
    return f"{state}; {disk}; {size}{cap}{reserve}"


def _shipper_line(sh: dict[str, Any]) -> str:
    """gateway-fleet ship in one line: last success, pending, errors."""
    import time

    last = sh.get("last_success")
    when = f"last ok {fmt.duration(time.time() - last)} ago" if last else "never shipped"
    pending = f"{sh['pending_segments']} pending ({sh['pending_bytes'] / 1048576:.1f} MiB)"
    alarm = " SPOOL ALARM" if sh.get("spool_alarm") else ""
    errors = (f"; {sh['consecutive_errors']} failed: {sh['last_error']}"
              if sh.get("consecutive_errors") else "")
    return f"{sh['destination']}: {when}; {pending}{alarm}{errors}"


def render(s: dict[str, Any]) -> None:
    out = fmt.console()
    conns = s["connections"]
    by_proto = ", ".join(f"{p} {n}" for p, n in sorted(conns["by_protocol"].items()))
    rates = s.get("rates", {})
    cluster = s["cluster"]
    bridges = s["bridges"]
    alarms = s["alarms"]
    rows: list[tuple[str, Any]] = [
        ("Node", f"{s['node']} ({s['status']}, {s['role']})"),
        ("Version", s["version"]),
        ("Uptime", fmt.duration(s["uptime"])),
        ("Cluster", cluster["status"] if not cluster["enabled"]
         else f"{cluster['name']}: {len(cluster['members'])} members"),
        ("Connections", f"{conns['count']}" + (f" ({by_proto})" if by_proto else "")),
        ("Sessions", s["sessions"]),
        ("Subscriptions", s["subscriptions"]),
        ("Topics", s["topics"]),
        ("Retained", s["retained"]),
        ("Messages", f"in {fmt.rate(rates.get('messages.received'))}, "
                     f"out {fmt.rate(rates.get('messages.sent'))}, "
                     f"dropped {fmt.rate(rates.get('messages.dropped'))}"),
        ("Bridges", bridges["status"] if not bridges["enabled"]
         else ", ".join(f"{b['name']} {b['status']}" for b in bridges["bridges"])),
        ("Store", _store_line(s.get("store"))),
        *([("Fleet ship", _shipper_line(s["fleet_shipper"]))] if s.get("fleet_shipper") else []),
        ("Alarms", f"{len(alarms)} active" if alarms else "none"),
    ]
    image = s.get("image")
    if image:
        rows.insert(2, ("Image", f"edge-gateway {image['version']} (slot {image['slot']})"))
    out.print(fmt.pairs(rows))
    out.print()
    out.print(fmt.table(
        ["Listener", "Protocol", "Address", "Status", "Connections", "Max", "Refused"],
        [
            (lst["id"], lst["protocol"], ", ".join(lst["addresses"]) or lst["bind"],
             lst["status"], lst["current_connections"], lst["max_connections"] or "unlimited",
             lst["refused_connections"])
            for lst in s["listeners"]
        ],
        title="Listeners",
    ))
    if cluster["enabled"] or len(cluster["members"]) > 1:
        out.print()
        out.print(fmt.table(
            ["Member", "Role", "Status", "Version", "Connections"],
            [(m["node"] + (" (self)" if m.get("self") else ""), m["role"], m["status"],
              m["version"], m.get("connections")) for m in cluster["members"]],
            title="Cluster",
        ))
    if bridges["enabled"] and bridges["bridges"]:
        out.print()
        out.print(fmt.table(
            ["Bridge", "Upstream", "Status", "Queued", "Bytes", "Oldest", "Out", "In",
             "Dropped", "Last error"],
            [(b["name"], b["upstream"], b["status"], b["queue_len"], b.get("queue_bytes"),
              fmt.duration(b.get("oldest_age")),
              fmt.rate(b.get("rates", {}).get("forwarded")),
              fmt.rate(b.get("rates", {}).get("received")),
              sum(b.get("dropped", {}).values()), b.get("last_error"))
             for b in bridges["bridges"]],
            title="Bridges",
        ))
    connectors = s.get("connectors") or []
    if connectors:
        out.print()
        out.print(fmt.table(
            ["Connector", "Server", "Status", "Buffered", "Bytes", "Stored", "Failed",
             "Dropped", "Last error"],
            [(c["id"], c["server"], c["status"], c["buffer"]["depth"], c["buffer"]["bytes"],
              c["success"], c["failed"], c["dropped"], c["last_error"]) for c in connectors],
            title="Connectors",
        ))
    if alarms:
        out.print()
        out.print(fmt.table(
            ["Alarm", "Since", "Message"],
            [(a["name"], fmt.when(a["activated_at"]), a["message"]) for a in alarms],
            title="Alarms",
        ))
