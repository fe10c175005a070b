"""Benchmarks of gatewayd against mosquitto and amqtt: see bench/README.md."""

from __future__ import annotations

import argparse


def key_value(text: str) -> tuple[str, str]:
    """An argparse ``type`` for ``KEY=VALUE`` options (``--gatewayd-set``, ``--conf``):
    bad input is argparse's one-line error and exit 2."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value
