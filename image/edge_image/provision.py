"""``image/provision IMG --config gateway.toml [--certs DIR] [--ssh-key KEY.pub]
[--hostname N]``: a first-boot provisioning bundle, written into the image's data
partition without booting it and without loop devices.

The data partition of a fresh image is an empty ext4 file system; this tool rebuilds it
(``mkfs.ext4 -d``) with ``/provision/`` holding gateway.toml, certs/, authorized_keys and
hostname, and copies it over the partition (``dd conv=notrunc``). gateway-data.service
applies the bundle at first boot and renames it ``/provision.applied``. A .bmap
beside the image is regenerated (its checksums covered the old data partition). An image whose
data partition already holds a unit's state (it has booted) is refused: provision
before the first boot, or change a running unit with Ansible.
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
import tomllib
from pathlib import Path

from edge_image import layout
from edge_image.common import BadInput, main_guard, require_tools, run
from edge_image.flash import find_bmap

HOSTNAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", re.IGNORECASE)
KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-", "sk-ssh-ed25519", "sk-ecdsa-sha2-")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="image/provision", description=__doc__.split("\n")[0])
    p.add_argument("img", type=Path)
    p.add_argument("--config", type=Path, required=True, help="the unit's gateway.toml")
    p.add_argument("--certs", type=Path, help="directory of certificates and keys "
                   "(installed as /etc/gateway/certs)")
    p.add_argument("--ssh-key", type=Path, action="append", default=[],
                   help="public key allowed to log in as root (repeatable)")
    p.add_argument("--hostname")
    try:
        return p.parse_args(argv)
    except SystemExit as e:
        if e.code == 0:
            raise
        raise BadInput("invalid arguments (see image/provision --help)") from None


def check(args: argparse.Namespace) -> None:
    if not args.img.is_file():
        raise BadInput(f"no such image: {args.img}")
    if not args.config.is_file():
        raise BadInput(f"no such config: {args.config}")
    try:
        tomllib.loads(args.config.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"{args.config} is not valid TOML: {e}") from None
    if args.certs is not None and not args.certs.is_dir():
        raise BadInput(f"--certs {args.certs} is not a directory")
    for key in args.ssh_key:
        if not key.is_file():
            raise BadInput(f"no such SSH public key: {key}")
        text = key.read_text().strip()
        if "PRIVATE KEY" in text:
            raise BadInput(f"{key} is a private key; give the .pub file")
        if not text.startswith(KEY_TYPES):
            raise BadInput(f"{key} is not an OpenSSH public key")
    if args.hostname is not None and not HOSTNAME.match(args.hostname):
        raise BadInput(f"invalid hostname {args.hostname!r}")


def data_is_fresh(img: Path, offset: int) -> bool:
    """True when the data file system holds nothing but lost+found (and /provision)."""
    with tempfile.NamedTemporaryFile(suffix=".ext4") as tmp:
        out = run(["debugfs", "-R", "ls -p /", _extract(img, offset, Path(tmp.name))])
    names = {f.split("/")[5] for f in out.splitlines() if f.count("/") >= 6}
    return names <= {".", "..", "lost+found", "provision"}


def _extract(img: Path, offset: int, dest: Path) -> str:
    size = layout.partitions(img)["data"][1]
    run(["dd", f"if={img}", f"of={dest}", "bs=1M", f"skip={offset}", f"count={size}",
         "iflag=count_bytes,skip_bytes", "conv=sparse", "status=none"])
    return str(dest)


def main(argv: list[str]) -> int:
    args = parse(argv)
    check(args)
    require_tools({"mkfs.ext4": "e2fsprogs", "debugfs": "e2fsprogs", "sfdisk": "fdisk"})
    try:
        parts = layout.partitions(args.img)
    except Exception:
        raise BadInput(f"{args.img} has no partition table") from None
    if "data" not in parts:
        raise BadInput(f"{args.img} has no partition labelled data (not an edge-gateway image)")
    offset, size = parts["data"]
    if not data_is_fresh(args.img, offset):
        raise BadInput(f"{args.img} has booted already (its data partition holds state); "
                       "provision a fresh image")
    with tempfile.TemporaryDirectory(prefix="edge-gateway-provision-") as tmp:
        root = Path(tmp) / "root"
        p = root / "provision"
        p.mkdir(parents=True)
        shutil.copy(args.config, p / "gateway.toml")
        if args.certs is not None:
            shutil.copytree(args.certs, p / "certs")
        if args.ssh_key:
            (p / "authorized_keys").write_text(
                "".join(k.read_text().strip() + "\n" for k in args.ssh_key))
        if args.hostname:
            (p / "hostname").write_text(args.hostname + "\n")
        for f in root.rglob("*"):
            f.chmod(0o700 if f.is_dir() else 0o600)
        fs = Path(tmp) / "data.ext4"
        run(["mkfs.ext4", "-q", "-F", "-L", "data", "-E", "root_owner=0:0", "-d", root, fs,
             f"{size >> 20}M"])
        layout.write_partition(args.img, "data", fs)
    bmap = find_bmap(args.img)
    if bmap is not None:  # its checksums covered the old data partition
        run(["bmaptool", "create", "-o", bmap, args.img])
    what = ["gateway.toml"] + (["certs"] if args.certs else []) + \
        ([f"{len(args.ssh_key)} SSH key(s)"] if args.ssh_key else []) + \
        ([f"hostname {args.hostname}"] if args.hostname else [])
    print(f"provisioned {args.img}: {', '.join(what)} (applied at first boot)")
    return 0


if __name__ == "__main__":
    main_guard("image/provision", main)
