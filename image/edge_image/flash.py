"""``image/flash IMG DEVICE [--yes]``: write an image with ``bmaptool copy``.

Only the blocks the .bmap lists are written (and checked against its SHA-256 sums by
bmaptool). Refused, before anything is written: a DEVICE that is mounted (it or any of
its partitions, per ``lsblk``), that holds the running system (the disk under / or
/boot, per ``findmnt``), or that is in use as swap. A regular file is a valid target
(a file-backed disk for a VM). Asks for confirmation unless ``--yes``.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from edge_image.common import BadInput, main_guard, require_tools, run


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="image/flash", description=__doc__.split("\n")[0])
    p.add_argument("img", type=Path)
    p.add_argument("device", type=Path)
    p.add_argument("--bmap", type=Path, help="default: IMG's .bmap beside it")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    try:
        return p.parse_args(argv)
    except SystemExit as e:
        if e.code == 0:
            raise
        raise BadInput("invalid arguments (see image/flash --help)") from None


def find_bmap(img: Path) -> Path | None:
    for cand in (img.with_name(img.name + ".bmap"), img.with_suffix(".bmap")):
        if cand.exists():
            return cand
    return None


def _disk_of(source: str) -> str | None:
    """The whole disk (``/dev/sda``) under a mounted source (``/dev/sda2``)."""
    if not source.startswith("/dev/"):
        return None
    try:
        out = run(["lsblk", "-nspo", "NAME,TYPE", source])
    except Exception:
        return None
    disks = [line.split()[0] for line in out.splitlines() if line.split()[-1] == "disk"]
    return disks[-1] if disks else None


def refuse_busy(device: Path) -> None:
    """Raise :class:`BadInput` if ``device`` (a block device) is in use."""
    dev = str(device.resolve())
    tree = json.loads(run(["lsblk", "-J", "-p", "-o", "NAME,MOUNTPOINTS,TYPE", dev]))
    def walk(nodes: list[dict[str, Any]]) -> list[str]:
        found: list[str] = []
        for n in nodes:
            points = [m for m in (n.get("mountpoints") or []) if m]
            found += [f"{n['name']} on {m}" for m in points]
            found += walk(n.get("children") or [])
        return found
    mounted = walk(tree.get("blockdevices", []))
    if mounted:
        raise BadInput(f"{dev} is mounted ({', '.join(mounted[:3])}); refusing to flash it")
    for target in ("/", "/boot", "/boot/efi", "/efi", "/usr"):
        src = run(["findmnt", "-n", "-o", "SOURCE", "--target", target]).strip()
        src = src.split("[")[0]
        if src and (src == dev or _disk_of(src) == dev):
            raise BadInput(f"{dev} holds the running system ({target} is on {src}); "
                           "refusing to flash it")
    swaps = Path("/proc/swaps").read_text().split()
    if dev in swaps:
        raise BadInput(f"{dev} is in use as swap; refusing to flash it")


def main(argv: list[str]) -> int:
    args = parse(argv)
    require_tools({"bmaptool": "bmap-tools", "lsblk": "util-linux", "findmnt": "util-linux"})
    if not args.img.is_file():
        raise BadInput(f"no such image: {args.img}")
    bmap = args.bmap or find_bmap(args.img)
    if bmap is None or not bmap.is_file():
        raise BadInput(f"no .bmap beside {args.img} (give --bmap FILE)")
    target = args.device
    if target.exists() and stat.S_ISBLK(target.stat().st_mode):
        refuse_busy(target)
        what = "block device"
    elif target.exists() and not target.is_file():
        raise BadInput(f"{target} is neither a block device nor a regular file")
    elif str(target).startswith("/dev/"):
        raise BadInput(f"no such device: {target}")
    else:
        what = "file"
    if not args.yes:
        if not sys.stdin.isatty():
            raise BadInput("not a terminal: pass --yes to confirm")
        answer = input(f"Write {args.img.name} to {what} {target}? Everything on it is lost. "
                       "Type yes: ")
        if answer.strip() != "yes":
            print("image/flash: not confirmed; nothing written", file=sys.stderr)
            return 1
    run(["bmaptool", "copy", "--bmap", bmap, args.img, target], capture=False)
    if what == "file":
        img_size = args.img.stat().st_size
        if target.stat().st_size < img_size:
            os.truncate(target, img_size)
    print(f"image/flash: wrote and verified {args.img.name} on {target}")
    return 0


if __name__ == "__main__":
    main_guard("image/flash", main)
