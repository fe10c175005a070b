"""``gatewayctl users``: the built-in user database and per-user authorization rules.

    gatewayctl users add USER [--password P | --password-stdin] [--superuser] [--iterations N]
    gatewayctl users passwd USER [--password P | --password-stdin] [--iterations N]
    gatewayctl users set USER --superuser | --no-superuser
    gatewayctl users delete USER
    gatewayctl users list
    gatewayctl users rules USER
    gatewayctl users allow USER publish|subscribe|all TOPIC
    gatewayctl users deny USER publish|subscribe|all TOPIC
    gatewayctl users unrule USER RULE_ID

Every command takes ``-c/--config FILE`` and finds the database exactly as ``gatewayd``
does: ``{node.data_dir}/gateway.db`` from the embedded defaults, the file and the
``GATEWAY_*`` environment (``GATEWAY_NODE__DATA_DIR``). Changes take effect in a running
``gatewayd`` at the next authentication (rules within a second), without a restart.
Without ``--password`` the password is prompted for (twice, not echoed); on a pipe it is
read from standard input. Errors are one line and exit status 1.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click
from tabulate import tabulate

from gateway.config import ConfigError, load_config
from gateway.store.db import db_path
from gateway.store.users import UserError, UserStore

F = TypeVar("F", bound=Callable[..., Any])

ACTIONS = click.Choice(["publish", "subscribe", "all"])


def _config_option(fn: F) -> F:
    return click.option(
        "-c",
        "--config",
        "config_file",
        metavar="FILE",
        type=click.Path(dir_okay=False, path_type=Path),
        help="gatewayd's configuration file (default: embedded defaults; GATEWAY_* apply).",
    )(fn)


def _db(config_file: Path | None) -> Path:
    try:
        config = load_config(config_file)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc.message}") from None
    return db_path(config.node.data_dir)


def _open(config_file: Path | None, *, create: bool = True) -> UserStore | None:
    path = _db(config_file)
    if not create and not path.exists():
        return None
    try:
        return UserStore.open(path)
    except Exception as exc:  # sqlite3 errors, permissions
        raise click.ClickException(f"cannot open {path}: {exc}") from None


def _iterations(config_file: Path | None) -> int:
    return load_config(config_file).authentication.builtin_db.iteration_count


def _password(password: str | None, from_stdin: bool) -> str:
    if password is not None and from_stdin:
        raise click.UsageError("give --password or --password-stdin, not both")
    if password is not None:
        return password
    if from_stdin or not sys.stdin.isatty():
        line = sys.stdin.readline()
        return line.rstrip("\r\n")
    value: str = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    return value


def _run(action: Callable[[], Any]) -> Any:
    try:
        return action()
    except UserError as exc:
        raise click.ClickException(str(exc)) from None


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@click.group(name="users", help="Users of the built-in database and their rules.")
def users() -> None:
    pass


_password_options = [
    click.option(
        "--password", "-p", metavar="P", help="The password (visible to ps: prefer the prompt)."
    ),
    click.option(
        "--password-stdin", is_flag=True, help="Read the password from one line of stdin."
    ),
]


def _with_password(fn: F) -> F:
    for option in reversed(_password_options):
        fn = option(fn)
    return fn


@users.command(name="add")
@click.argument("username")
@_with_password
@click.option("--superuser", is_flag=True, help="May publish and subscribe anywhere.")
@click.option("--iterations", type=click.IntRange(min=4096), metavar="N",
              help="PBKDF2 rounds (default: authentication.builtin_db.iteration_count).")
@_config_option
def add_cmd(
    username: str,
    password: str | None,
    password_stdin: bool,
    superuser: bool,
    iterations: int | None,
    config_file: Path | None,
) -> None:
    """Add USERNAME with a password."""
    store = _open(config_file)
    assert store is not None
    secret = _password(password, password_stdin)
    rounds = iterations or _iterations(config_file)
    _run(lambda: store.add(username, secret, superuser=superuser, iterations=rounds))
    kind = "superuser" if superuser else "user"
    click.echo(f"{kind} {username!r} added ({rounds} iterations)")


@users.command(name="passwd")
@click.argument("username")
@_with_password
@click.option("--iterations", type=click.IntRange(min=4096), metavar="N",
              help="PBKDF2 rounds (default: keep the user's).")
@_config_option
def passwd_cmd(
    username: str,
    password: str | None,
    password_stdin: bool,
    iterations: int | None,
    config_file: Path | None,
) -> None:
    """Set USERNAME's password."""
    store = _open(config_file)
    assert store is not None
    if store.get(username) is None:
        raise click.ClickException(f"no user {username!r}")
    secret = _password(password, password_stdin)
    _run(lambda: store.set_password(username, secret, iterations=iterations))
    click.echo(f"password of {username!r} changed")


@users.command(name="set")
@click.argument("username")
@click.option("--superuser/--no-superuser", default=None, help="Grant or revoke superuser.")
@_config_option
def set_cmd(username: str, superuser: bool | None, config_file: Path | None) -> None:
    """Change USERNAME's flags."""
    if superuser is None:
        raise click.UsageError("nothing to set: give --superuser or --no-superuser")
    store = _open(config_file)
    assert store is not None
    _run(lambda: store.set_superuser(username, superuser))
    click.echo(f"{username!r} is {'now' if superuser else 'no longer'} a superuser")


@users.command(name="delete")
@click.argument("username")
@_config_option
def delete_cmd(username: str, config_file: Path | None) -> None:
    """Delete USERNAME and its rules."""
    store = _open(config_file)
    assert store is not None
    if not store.delete(username):
        raise click.ClickException(f"no user {username!r}")
    click.echo(f"user {username!r} deleted")


@users.command(name="list")
@_config_option
def list_cmd(config_file: Path | None) -> None:
    """List the users."""
    store = _open(config_file, create=False)
    found = store.users() if store is not None else []
    if not found:
        click.echo(f"no users in {_db(config_file)}")
        return
    counts = store.rule_counts() if store is not None else {}
    rows = [
        (
            u.username,
            "yes" if u.is_superuser else "",
            u.credential.iterations,
            counts.get(u.username, 0),
            _when(u.created_at),
            _when(u.updated_at),
        )
        for u in found
    ]
    headers = ("USER", "SUPERUSER", "ITERATIONS", "RULES", "CREATED", "UPDATED")
    click.echo(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))


@users.command(name="rules")
@click.argument("username")
@_config_option
def rules_cmd(username: str, config_file: Path | None) -> None:
    """List USERNAME's rules in the order they are tried (first match wins)."""
    store = _open(config_file, create=False)
    rules = store.rules(username) if store is not None else []
    if not rules:
        click.echo(f"no rules for {username!r}: the rules file decides")
        return
    rows = [(r.id, r.permission, r.action, r.topic) for r in rules]
    headers = ("ID", "PERMISSION", "ACTION", "TOPIC")
    click.echo(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))


def _add_rule(permission: str) -> Callable[[str, str, str, Path | None], None]:
    def command(username: str, action: str, topic: str, config_file: Path | None) -> None:
        store = _open(config_file)
        assert store is not None
        rule = _run(lambda: store.add_rule(username, permission, action, topic))
        note = ""
        if store.get(username) is None:
            note = " (no local credentials: for a user of another backend)"
        click.echo(f"rule {rule.id}: {permission} {action} {topic!r} for {username!r}{note}")

    return command


for _permission in ("allow", "deny"):
    users.command(
        name=_permission,
        short_help={
            "allow": "Let USERNAME do ACTION on TOPIC (appends a rule).",
            "deny": "Forbid USERNAME to do ACTION on TOPIC (appends a rule).",
        }[_permission],
        help=f"Append a rule: {_permission} USERNAME to ACTION on TOPIC. TOPIC is a filter "
        "as in the rules file (${clientid}, ${username}, 'eq <filter>'); a user's rules are "
        "tried in order before the rules file, first match wins.",
    )(
        click.argument("username")(
            click.argument("action", type=ACTIONS)(
                click.argument("topic")(_config_option(_add_rule(_permission)))
            )
        )
    )


@users.command(name="unrule")
@click.argument("username")
@click.argument("rule_id", type=int)
@_config_option
def unrule_cmd(username: str, rule_id: int, config_file: Path | None) -> None:
    """Delete USERNAME's rule RULE_ID (the ID shown by 'users rules')."""
    store = _open(config_file)
    assert store is not None
    if not store.delete_rule(username, rule_id):
        raise click.ClickException(f"{username!r} has no rule {rule_id}")
    click.echo(f"rule {rule_id} of {username!r} deleted")
