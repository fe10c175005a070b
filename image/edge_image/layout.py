"""The disk layout and the partitions' contents, built from files (no loop devices).

GPT: ESP | rootA | rootB | data, addressed by partition label (``/dev/disk/by-partlabel``).
Sizes are fixed at build time: a bundle's slot image must fit ``SLOT_MIB`` on every unit
ever flashed, so raising it later means reflashing. The data partition is small in the
image and grows to fill the disk on first boot (gateway-data.service: growpart +
resize2fs).

The ESP holds systemd-boot and, per slot X, ``/X/vmlinuz`` and ``/X/initrd.img`` plus the
loader entry ``loader/entries/slot-x[+TRIES[-DONE]].conf`` that the RAUC bootloader
handler (image/rootfs/usr/lib/edge-gateway/rauc-bootloader) rewrites on updates. Entry
text comes from one place: :func:`entry` here and ``rauc-bootloader`` write the same
format (the shell copy is checked against this one by tests/image/test_layout.py).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from edge_image.arch import ARCHES
from edge_image.common import IMAGE_DIR, BadInput, remove, run

ESP_MIB = 256
SLOT_MIB = 1024
DATA_MIB = 256
ALIGN_MIB = 1
ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
ROOT_TYPE = {"amd64": "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709",
             "arm64": "B921B045-1DF0-41C3-AF44-4C6F280D3FAE"}
DATA_TYPE = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
PARTITIONS = [("esp", ESP_MIB), ("rootA", SLOT_MIB), ("rootB", SLOT_MIB), ("data", DATA_MIB)]


def compatible(arch: str) -> str:
    return f"edge-gateway-{arch}"


def kernel_cmdline(arch: str = "amd64") -> str:
    """The kernel command line of ``arch``: image/rootfs's (written for amd64) with that
    arch's serial console. image/build writes it into the root file system, where the
    RAUC boot loader backend reads it."""
    text = (IMAGE_DIR / "rootfs/usr/lib/edge-gateway/kernel-cmdline").read_text().strip()
    return text.replace(ARCHES["amd64"].console, ARCHES[arch].console)


def entry(slot: str, sort_key: int, arch: str = "amd64") -> str:
    """The loader entry of slot ``A``/``B`` (sort-key 1 = primary, 2 = the other)."""
    return (f"title Edge gateway (slot {slot})\n"
            f"sort-key {sort_key}\n"
            f"linux /{slot}/vmlinuz\n"
            f"initrd /{slot}/initrd.img\n"
            f"options root=PARTLABEL=root{slot} rauc.slot={slot} {kernel_cmdline(arch)}\n")


def _kernel_files(rootfs: Path) -> tuple[Path, Path]:
    kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
    initrds = sorted((rootfs / "boot").glob("initrd.img-*"))
    if len(kernels) != 1 or len(initrds) != 1:
        raise BadInput(f"expected one kernel and one initrd in {rootfs}/boot, found "
                       f"{[k.name for k in kernels + initrds]}")
    return kernels[0], initrds[0]


def copy_kernel(kernel: Path, dest: Path) -> None:
    """Copy the kernel where systemd-boot loads it. Debian's arm64 vmlinuz is a gzipped
    Image, which systemd-boot 252 cannot start: it is stored decompressed (the Image is
    an EFI application through the kernel's EFI stub). rauc-post-install does the same."""
    with open(kernel, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    if gzipped:
        with gzip.open(kernel, "rb") as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    else:
        shutil.copy(kernel, dest)


def make_esp(out: Path, rootfs: Path, efi: str, efi_default: str,
             arch: str = "amd64") -> None:
    """A FAT32 ESP image: systemd-boot as the default loader, slot A's kernel + entry."""
    kernel, initrd = _kernel_files(rootfs)
    stub = rootfs / "usr/lib/systemd/boot/efi" / efi
    if not stub.exists():
        stub = Path("/usr/lib/systemd/boot/efi") / efi
    if not stub.exists():
        raise BadInput(f"{efi} not found (Debian package systemd-boot-efi)")
    run(["mkfs.vfat", "-F", "32", "-n", "ESP", "-C", out, str(ESP_MIB * 1024)])
    work = out.with_name(out.name + ".d")
    remove(work)
    for d in ("EFI/BOOT", "EFI/systemd", "loader/entries", "A", "B"):
        (work / d).mkdir(parents=True)
    shutil.copy(stub, work / "EFI/BOOT" / efi_default)
    shutil.copy(stub, work / "EFI/systemd" / efi)
    copy_kernel(kernel, work / "A/vmlinuz")
    shutil.copy(initrd, work / "A/initrd.img")
    (work / "loader/loader.conf").write_text("timeout 0\neditor no\nrandom-seed-mode off\n")
    (work / "loader/entries/slot-a.conf").write_text(entry("A", 1, arch))
    try:
        run(["mcopy", "-s", "-Q", "-i", out, *sorted(work.iterdir()), "::/"])
    finally:
        remove(work)


def make_data(out: Path, content: Path | None) -> None:
    """The data partition: ext4 labelled ``data``, optionally filled from ``content``."""
    remove(out)
    args = ["mkfs.ext4", "-q", "-F", "-L", "data", "-E", "root_owner=0:0"]
    if content is not None:
        args += ["-d", str(content)]
    run([*args, out, f"{DATA_MIB}M"])


def table(arch: str = "amd64") -> str:
    """The sfdisk script of the layout."""
    lines = ["label: gpt", "unit: sectors", "first-lba: 2048"]
    start = ALIGN_MIB
    types = {"esp": ESP_TYPE, "rootA": ROOT_TYPE[arch], "rootB": ROOT_TYPE[arch],
             "data": DATA_TYPE}
    for name, mib in PARTITIONS:
        lines.append(f"start={start * 2048}, size={mib * 2048}, type={types[name]}, "
                     f'name="{name}"')
        start += mib
    return "\n".join(lines) + "\n"


def disk_mib() -> int:
    return ALIGN_MIB + sum(m for _, m in PARTITIONS) + ALIGN_MIB


def partitions(img: Path) -> dict[str, tuple[int, int]]:
    """``{partlabel: (offset_bytes, size_bytes)}`` read from the image's GPT."""
    d = json.loads(run(["sfdisk", "--json", img]))
    sector = int(d["partitiontable"].get("sectorsize", 512))
    return {p["name"]: (p["start"] * sector, p["size"] * sector)
            for p in d["partitiontable"]["partitions"]}


def write_partition(img: Path, label: str, content: Path) -> None:
    offset, size = partitions(img)[label]
    if content.stat().st_size > size:
        raise BadInput(f"{content.name} ({content.stat().st_size >> 20} MiB) does not fit "
                       f"partition {label} ({size >> 20} MiB)")
    run(["dd", f"if={content}", f"of={img}", "bs=1M", f"seek={offset}", "oflag=seek_bytes",
         "conv=notrunc,sparse", "status=none"])


def assemble(img: Path, esp: Path, slot: Path, data: Path, arch: str = "amd64") -> None:
    tmp = img.with_name(img.name + ".tmp")
    remove(tmp)
    with open(tmp, "wb") as f:
        f.truncate(disk_mib() << 20)
    run(["sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", tmp],
        input=table(arch).encode())
    write_partition(tmp, "esp", esp)
    write_partition(tmp, "rootA", slot)
    write_partition(tmp, "data", data)
    tmp.rename(img)
