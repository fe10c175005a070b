"""``gatewayctl trace client CLIENTID`` / ``gatewayctl trace topic FILTER``: follow a
client or a topic filter live (connects, subscriptions, messages published, delivered,
dropped), one line per event, until Ctrl-C, ``--count`` events or ``--duration``.

The stream is ``GET /api/v5/trace`` (server-sent events); the first event says the
trace is in place, so what happens after ``trace started`` is printed is not missed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from gateway.cli.ctl import fmt
from gateway.cli.ctl.apiclient import config_option, connect


@click.group(name="trace", help="Follow a client or a topic filter live.")
def trace() -> None:
    pass


def _options(f: Any) -> Any:
    f = click.option("--count", type=click.IntRange(min=1),
                     help="Stop after this many events (trace.* excluded).")(f)
    f = click.option("--duration", type=click.FloatRange(min=0, min_open=True),
                     help="Stop after this many seconds.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")(f)
    return config_option(f)


@trace.command(name="client")
@_options
@click.argument("clientid")
def client_cmd(clientid: str, **opts: Any) -> None:
    """Follow CLIENTID: its connection, subscriptions and messages."""
    _follow({"clientid": clientid}, **opts)


@trace.command(name="topic")
@_options
@click.argument("topic_filter", metavar="FILTER")
def topic_cmd(topic_filter: str, **opts: Any) -> None:
    """Follow messages whose topic matches FILTER (wildcards allowed)."""
    _follow({"topic": topic_filter}, **opts)


def _follow(params: dict[str, str], *, config_path: Path | None, count: int | None,
            duration: float | None, as_json: bool) -> None:
    api = connect(config_path)
    deadline = time.monotonic() + duration if duration is not None else None
    seen = 0
    try:
        for event in api.stream("/trace", params, deadline=deadline):
            click.echo(json.dumps(event, ensure_ascii=False) if as_json else line(event))
            sys.stdout.flush()
            if not str(event.get("event", "")).startswith("trace."):
                seen += 1
                if count is not None and seen >= count:
                    return
    except KeyboardInterrupt:
        return


def line(e: dict[str, Any]) -> str:
    """One event as a line: time, event, then what matters for it."""
    name = e.get("event", "?")
    head = f"{fmt.clock(e.get('ts'))} {name}"
    if name == "trace.started":
        subject = e.get("subject", {})
        return f"{head} {subject.get('type')}={subject.get('value')} on {e.get('node')}"
    if name == "trace.dropped":
        return f"{head} {e.get('count')} events lost (reader too slow)"
    parts = []
    if e.get("clientid") is not None:
        parts.append(f"client={e['clientid']}")
    if "topic" in e:
        parts.append(f"topic={e['topic']}")
    if "qos" in e:
        parts.append(f"qos={e['qos']}")
    if e.get("retain"):
        parts.append("retain")
    if e.get("from_clientid") and e.get("from_clientid") != e.get("clientid"):
        parts.append(f"from={e['from_clientid']}")
    if "reason" in e:
        parts.append(f"reason={e['reason']}")
    if name == "client.connected":
        parts.append(f"peer={e.get('ip_address')}:{e.get('port')} "
                     f"listener={e.get('listener')} v{e.get('proto_ver')}")
    if "payload" in e:
        more = "..." if e.get("truncated") else ""
        parts.append(f"payload={e['payload']!r}{more}")
    elif "payload_hex" in e:
        parts.append(f"payload=0x{e['payload_hex']}{'...' if e.get('truncated') else ''}")
    return f"{head} {' '.join(parts)}".rstrip()
