"""``gatewayctl``: status and control of a running gateway.

Only ``--version`` exists so far; the status and control commands come with the
operations tooling.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gateway.cli import version

PROG = "gatewayctl"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Status and control of a running edge gateway.",
        epilog="No commands yet: status and control commands come with the operations "
        "tooling. Start the server with gatewayd.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else 2
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
