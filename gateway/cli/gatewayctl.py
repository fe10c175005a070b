"""``gatewayctl``: status and control of a gateway node.

The root is a click group; each family of subcommands lives in its own module under
``gateway/cli/ctl/`` and is registered in :data:`SUBCOMMANDS` (one line each), so
families can grow independently. Errors are one line on stderr and a non-zero exit
status, never a traceback. A reader that stops early (``gatewayctl clients | head``,
``| grep -q``) is not an error: the rest of the output is dropped and the status is 0,
so a ``pipefail`` script does not fail on it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

import click

from gateway.cli import version

PROG = "gatewayctl"

# module path -> attribute holding a click command or group
SUBCOMMANDS: list[tuple[str, str]] = [
    ("gateway.cli.ctl.certs", "certs"),
    ("gateway.cli.ctl.status", "status"),
    ("gateway.cli.ctl.clients", "clients"),
    ("gateway.cli.ctl.kick", "kick"),
    ("gateway.cli.ctl.subscriptions", "subscriptions"),
    ("gateway.cli.ctl.routes", "routes"),
    ("gateway.cli.ctl.listeners", "listeners"),
    ("gateway.cli.ctl.cluster", "cluster"),
    ("gateway.cli.ctl.retained", "retained"),
    ("gateway.cli.ctl.alarms", "alarms"),
    ("gateway.cli.ctl.metrics", "metrics"),
    ("gateway.cli.ctl.trace", "trace"),
    ("gateway.cli.ctl.config", "config"),
    ("gateway.cli.ctl.ban", "ban"),
    ("gateway.cli.ctl.users", "users"),
    ("gateway.cli.ctl.rules", "rules"),
    ("gateway.cli.ctl.store", "store"),
    ("gateway.cli.ctl.admin", "admin"),
    ("gateway.cli.ctl.ext", "delayed"),
    ("gateway.cli.ctl.ext", "auto_subscribe"),
    ("gateway.cli.ctl.ext", "exclusive"),
    ("gateway.cli.ctl.ext", "rewrite"),
]


class _ReaderGone(Exception):
    """stdout's reader closed the pipe (raised past click, which would exit 1)."""


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise _ReaderGone from None


@click.group(
    name=PROG,
    cls=_Group,
    help="Status and control of an edge gateway node.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(version(), "--version", prog_name=PROG, message="%(prog)s %(version)s")
def cli() -> None:
    pass


def _register() -> None:
    for module, attr in SUBCOMMANDS:
        cli.add_command(getattr(importlib.import_module(module), attr))


def main(argv: Sequence[str] | None = None) -> int:
    _register()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        click.echo(cli.get_help(click.Context(cli, info_name=PROG)), err=True)
        return 2
    try:
        # with standalone_mode=False click returns ctx.exit(N)'s N instead of raising
        rv = cli.main(args=args, prog_name=PROG, standalone_mode=False)
        if isinstance(rv, int) and not isinstance(rv, bool):
            return rv
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 1
    except _ReaderGone:
        _drop_stdout()
        return 0
    except OSError as exc:  # e.g. stdout unwritable (a full disk): one line, no traceback
        _drop_stdout()
        click.echo(f"{PROG}: {exc}", err=True)
        return 1
    return 0


def _drop_stdout() -> None:
    """What is still buffered for stdout goes nowhere, so the exit's flush raises
    nothing."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
