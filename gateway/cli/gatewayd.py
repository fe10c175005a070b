"""``gatewayd``: load and validate the configuration, set up logging, run the gateway.

Exit status: 0 after a clean shutdown or a successful ``--check``; 2 for an invalid
configuration or command line, reported on one line before any listener opens.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from gateway.cli import build, version
from gateway.config import ConfigError, GatewayConfig, load_config

PROG = "gatewayd"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Edge IoT gateway: MQTT broker with protocol front-ends.",
        epilog="Every key can also be set from the environment: "
        "GATEWAY_LISTENERS__TCP__DEFAULT__BIND=127.0.0.1:1883 sets "
        "listeners.tcp.default.bind. See docs/configuration.md.",
    )
    parser.add_argument(
        "-c",
        "--config",
        metavar="FILE",
        help="TOML configuration file (default: embedded defaults)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate the configuration and exit (0 valid, 2 invalid)",
    )
    parser.add_argument(
        "--first-run",
        action="store_true",
        help="every front-end on its standard port (MQTT 1883, WebSocket 8083, MQTT-SN "
        "1884/udp, CoAP 5683/udp, LwM2M 5783/udp, API and dashboard 18083); a taken port "
        "is reported and skipped (scripts/run passes this)",
    )
    # internal: run as worker I of a multi-worker node (started by the supervisor)
    parser.add_argument("--worker", type=int, metavar="I", help=argparse.SUPPRESS)
    parser.add_argument("--supervisor", type=int, metavar="PID", help=argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"{PROG} {version()} ({build()})")
    return parser


def configure_logging(config: GatewayConfig, worker: int | None = None) -> None:
    fmt = LOG_FORMAT if worker is None else LOG_FORMAT.replace(
        "%(name)s", f"[w{worker}] %(name)s"
    )
    logging.basicConfig(
        stream=sys.stderr,
        level=config.log.level.upper(),
        format=fmt,
        force=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else 2
    try:
        config = load_config(args.config, first_run=args.first_run)
    except ConfigError as exc:
        print(f"{PROG}: invalid configuration: {exc.message}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{PROG}: configuration OK")
        return 0
    configure_logging(config, args.worker)
    if args.supervisor is not None:
        from gateway.workers.supervisor import die_with_supervisor

        die_with_supervisor(args.supervisor)
    if args.worker is None and config.node.workers > 1:
        from gateway.workers.supervisor import run as supervise

        return supervise(config, args.config, args.first_run)
    from gateway.app import run

    status: int = run(config, worker=args.worker)
    return status


if __name__ == "__main__":
    sys.exit(main())
