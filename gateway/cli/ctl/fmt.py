"""Readable output for ``gatewayctl``: rich tables and small formatters.

Tables go to stdout through one :class:`rich.console.Console`; when stdout is not a
terminal (a pipe, a test) the width is generous and colour is off, so lines are not
folded and can be grepped.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table


class Output:
    """Prints renderables; off a terminal, without the padding rich leaves at line ends."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.console = Console(width=None if self.tty else 200, no_color=not self.tty,
                               highlight=False)

    def print(self, *renderables: Any) -> None:
        if self.tty:
            self.console.print(*renderables)
            return
        with self.console.capture() as capture:
            self.console.print(*renderables)
        text = "\n".join(line.rstrip() for line in capture.get().splitlines())
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def console() -> Output:
    return Output()


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None
          ) -> Table:
    t = Table(*columns, box=box.SIMPLE_HEAD, title=title, title_justify="left",
              pad_edge=False, show_edge=False)
    for row in rows:
        t.add_row(*(cell(v) for v in row))
    return t


def pairs(rows: Iterable[tuple[str, Any]]) -> Table:
    """A two-column key/value table without a header."""
    t = Table(box=None, show_header=False, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    for key, value in rows:
        t.add_row(key, cell(value))
    return t


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    parts = [f"{days}d"] if days else []
    if days or hours:
        parts.append(f"{hours}h")
    if days or hours or minutes:
        parts.append(f"{minutes}m")
    parts.append(f"{s}s")
    return " ".join(parts)


def when(epoch: float | None) -> str:
    if not epoch:
        return "-"
    return dt.datetime.fromtimestamp(epoch).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def clock(epoch: float | None) -> str:
    if not epoch:
        return "--:--:--"
    return dt.datetime.fromtimestamp(epoch).astimezone().strftime("%H:%M:%S.%f")[:-3]


def rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}/s"


MQTT_VERSIONS = {3: "3.1", 4: "3.1.1", 5: "5.0"}


def protocol(client: dict[str, Any]) -> str | None:
    """``MQTT 3.1.1``, ``MQTT 5.0``, ``MQTTSN``... for a client view."""
    if client.get("protocol") is None:
        return None
    if client["protocol"] in ("mqtt", "ws"):
        version = MQTT_VERSIONS.get(client.get("proto_ver") or 0, str(client.get("proto_ver")))
        return f"MQTT {version}" + (" (ws)" if client["protocol"] == "ws" else "")
    return str(client.get("proto_name") or client["protocol"]).upper()
