"""``python -m gateway.fleet`` and ``spark-submit gateway/fleet/__main__.py``: the CLI."""

from gateway.fleet.cli import main

if __name__ == "__main__":
    main(prog_name="gateway-fleet")
