"""``gatewayctl certs``: a private certificate authority for TLS listeners and the cluster.

    gatewayctl certs init-ca DIR [--cn NAME] [--days N] [--force]
    gatewayctl certs issue DIR NAME [--server|--client] [--san DNS/IP/URI ...] [--days N] [--force]
                                    [--crl-url URL ...] [--ocsp-url URL]
    gatewayctl certs revoke DIR NAME|CERTFILE [--reason REASON]
    gatewayctl certs crl DIR [--days N] [--out FILE]

Writes DIR/ca.crt, DIR/ca.key, DIR/NAME.crt, DIR/NAME.key (keys mode 0600); see
:mod:`gateway.security.pki` for the certificates' contents. Nothing is overwritten without
``--force``. Errors (bad input: a missing CA, a file in the way, an unknown certificate)
are one line on stderr and exit status 2, like usage errors.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from gateway.security.ca_revoke import REASONS, make_crl, revoke, revoked
from gateway.security.pki import (
    CA_DAYS,
    LEAF_DAYS,
    AlreadyExists,
    Issued,
    PkiError,
    init_ca,
    issue,
)


class CertsError(click.ClickException):
    """One line on stderr, exit status 2 (bad input)."""

    exit_code = 2


@click.group(name="certs", help="Create a CA and issue TLS certificates (EC P-256).")
def certs() -> None:
    pass


@certs.command(name="init-ca")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--cn", "common_name", default="gateway CA", show_default=True,
              help="Common name of the CA.")
@click.option("--days", type=click.IntRange(min=1), default=CA_DAYS, show_default=True,
              help="Validity in days.")
@click.option("--force", is_flag=True, help="Replace an existing ca.crt/ca.key.")
def init_ca_cmd(directory: Path, common_name: str, days: int, force: bool) -> None:
    """Create DIRECTORY/ca.crt and DIRECTORY/ca.key (a new certificate authority)."""
    _report(_run(lambda: init_ca(directory, common_name=common_name, days=days, force=force)))


@certs.command(name="issue")
@click.argument("directory", type=click.Path(path_type=Path))
@click.argument("name")
@click.option("--server", "role", flag_value="server", default=True,
              help="A server certificate (serverAuth; the default).")
@click.option("--client", "role", flag_value="client",
              help="A client certificate (clientAuth), e.g. for mutual TLS.")
@click.option("--server-client", "role", flag_value="both",
              help="Both serverAuth and clientAuth (a cluster node).")
@click.option("--san", "sans", multiple=True, metavar="DNS/IP",
              help="Subject alternative name: a DNS name, an IP address or URI:...; "
              "repeatable. Server default: localhost, 127.0.0.1, ::1.")
@click.option("--days", type=click.IntRange(min=1), default=LEAF_DAYS, show_default=True,
              help="Validity in days (never beyond the CA's).")
@click.option("--force", is_flag=True, help="Replace an existing NAME.crt/NAME.key.")
@click.option("--crl-url", "crl_urls", multiple=True, metavar="URL",
              help="A CRL distribution point (http URL) to put in the certificate.")
@click.option("--ocsp-url", default=None, metavar="URL",
              help="The OCSP responder to name in the certificate (authorityInfoAccess).")
def issue_cmd(
    directory: Path, name: str, role: str, sans: tuple[str, ...], days: int, force: bool,
    crl_urls: tuple[str, ...], ocsp_url: str | None,
) -> None:
    """Issue DIRECTORY/NAME.crt and NAME.key (subject CN=NAME) from the CA in DIRECTORY."""
    server = role in ("server", "both")
    client = role in ("client", "both")
    _report(
        _run(
            lambda: issue(
                directory, name, server=server, client=client, sans=sans, days=days,
                force=force, crl_urls=crl_urls, ocsp_url=ocsp_url,
            )
        )
    )


@certs.command(name="revoke")
@click.argument("directory", type=click.Path(path_type=Path))
@click.argument("which", metavar="NAME|CERTFILE")
@click.option("--reason", type=click.Choice(sorted(REASONS)), default="unspecified",
              show_default=True)
def revoke_cmd(directory: Path, which: str, reason: str) -> None:
    """Mark a certificate of the CA in DIRECTORY revoked (then run `certs crl`)."""
    try:
        r = revoke(directory, which, reason)
    except (PkiError, OSError) as exc:
        raise CertsError(str(exc)) from None
    click.echo(f"revoked {r.subject} serial {r.serial:x} at {r.at:%Y-%m-%dT%H:%M:%SZ} "
               f"({r.reason}); now run: gatewayctl certs crl {directory}")


@certs.command(name="crl")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--days", type=click.IntRange(min=1), default=7, show_default=True,
              help="Validity (nextUpdate) in days.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Where to write the CRL (PEM); default DIRECTORY/crl.pem.")
def crl_cmd(directory: Path, days: int, out: Path | None) -> None:
    """Sign a CRL of every certificate revoked in DIRECTORY."""
    try:
        path = make_crl(directory, days=days, out=out)
    except (PkiError, OSError) as exc:
        raise CertsError(str(exc)) from None
    click.echo(f"wrote {path} ({len(revoked(directory))} revoked)")


def _run(action: Callable[[], Issued]) -> Issued:
    try:
        return action()
    except AlreadyExists as exc:
        raise CertsError(f"{exc} (use --force to replace it)") from None
    except (PkiError, OSError) as exc:
        raise CertsError(str(exc)) from None


def _report(issued: Issued) -> None:
    cert = issued.certificate
    click.echo(f"wrote {issued.cert_path}")
    click.echo(f"wrote {issued.key_path} (mode 0600)")
    click.echo(f"subject {cert.subject.rfc4514_string()}, "
               f"valid until {cert.not_valid_after_utc:%Y-%m-%d}")
