"""What differs per architecture: kernel package, systemd-boot binary, serial console,
GPT root type, QEMU machine and firmware; and the cross-build of arm64 on another host.

Invariants:
- ``amd64`` and ``arm64`` share the layout, the RAUC setup and every unit; only the
  values in :data:`ARCHES` differ (and RAUC's ``compatible=edge-gateway-<arch>``, so a
  bundle of one arch is refused by a unit of the other).
- A foreign-arch build runs the target's binaries under qemu-user through binfmt_misc;
  :func:`ensure_binfmt` checks (and, as root, tries to enable) the registration before
  any stage runs, and names what is missing in one line otherwise.
- arm64's Debian stage never runs update-initramfs: :func:`base_options` configures
  initramfs-tools (``MODULES=list`` + :data:`ARM64_INITRAMFS_MODULES`) and parks
  update-initramfs before the kernel package is unpacked, and restores it afterwards; the
  rootfs stage then makes the one initramfs the image carries (its modules stripped and
  the overlay's hooks in place).
- A foreign arch's wheelhouse needs no emulation: the native resolution's pure-Python
  wheels plus PyPI's manylinux wheels of the same versions for that arch
  (edge_image/wheels.py:foreign, :attr:`Arch.wheel_platforms`).
"""

from __future__ import annotations

import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from edge_image.common import BadInput, run


@dataclass(frozen=True)
class Arch:
    name: str
    kernels: dict[str, str]       # --kernel flavour -> Debian package
    default_kernel: str
    efi: str                      # systemd-boot binary in /usr/lib/systemd/boot/efi
    efi_default: str              # its name under EFI/BOOT (the removable-media path)
    console: str                  # the serial console on the kernel command line
    qemu: str                     # qemu-system-* binary
    qemu_package: str
    firmware_code: Path
    firmware_vars: Path
    firmware_package: str
    uname: str                    # platform.machine() of a native host
    wheel_platforms: tuple[str, ...]  # pip --platform tags of its manylinux wheels
    initramfs_modules: tuple[str, ...] = ()  # a fixed list instead of MODULES=most

    @property
    def gnu_type(self) -> str:
        """The GNU triplet of Debian's multiarch paths and of its cross compiler."""
        return f"{self.uname}-linux-gnu"


ARCHES: dict[str, Arch] = {
    "amd64": Arch(
        "amd64", {"cloud": "linux-image-cloud-amd64", "generic": "linux-image-amd64"},
        "cloud", "systemd-bootx64.efi", "BOOTX64.EFI", "console=ttyS0,115200",
        "qemu-system-x86_64", "qemu-system-x86",
        Path("/usr/share/OVMF/OVMF_CODE_4M.fd"), Path("/usr/share/OVMF/OVMF_VARS_4M.fd"),
        "ovmf", "x86_64",
        ("manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64")),
    # generic by default: linux-image-arm64 carries the Raspberry Pi 4 (bcm2711) drivers
    # and device trees; cloud-arm64 boots QEMU's virt machine only.
    "arm64": Arch(
        "arm64", {"generic": "linux-image-arm64", "cloud": "linux-image-cloud-arm64"},
        "generic", "systemd-bootaa64.efi", "BOOTAA64.EFI", "console=ttyAMA0,115200",
        "qemu-system-aarch64", "qemu-system-arm",
        Path("/usr/share/AAVMF/AAVMF_CODE.fd"), Path("/usr/share/AAVMF/AAVMF_VARS.fd"),
        "qemu-efi-aarch64", "aarch64",
        # Debian 12 has glibc 2.36: manylinux up to 2_36 runs there.
        ("manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64",
         "manylinux_2_31_aarch64", "manylinux_2_34_aarch64", "manylinux_2_35_aarch64",
         "manylinux_2_36_aarch64"),
        ("virtio_pci", "virtio_mmio", "virtio_blk", "ext4", "crc32c_generic", "vfat",
         "nls_cp437", "nls_ascii", "sdhci-iproc", "reset-raspberrypi", "xhci-pci",
         "usb-storage", "uas", "nvme")),
}

#: Module trees of the generic arm64 kernel that a headless gateway never loads (GPU,
#: sound, video capture, InfiniBand, ISDN...). Dropping them keeps the root file system
#: inside its 1 GiB slot; depmod runs again afterwards.
ARM64_UNNEEDED_MODULES = ["drivers/gpu", "sound", "drivers/media", "drivers/infiniband",
                          "drivers/isdn", "drivers/staging", "drivers/scsi/qla2xxx",
                          "drivers/scsi/lpfc", "drivers/net/ethernet/mellanox",
                          "drivers/net/wireless/ath", "drivers/net/wireless/intel",
                          "drivers/net/wireless/realtek", "drivers/net/wireless/mediatek"]


#: The arm64 initramfs holds these modules (and what they depend on) instead of
#: initramfs-tools' MODULES=most: mkinitramfs runs under qemu-user there, one emulated
#: process per module, and "most" took about 25 minutes (twice: the kernel's postinst and
#: initramfs-tools' trigger). Enough to find the root and data partitions on QEMU's virt
#: machine (virtio-pci/-mmio disks) and on a Raspberry Pi 4 / CM4 (SD card and eMMC on
#: emmc2 = sdhci-iproc, USB mass storage behind the VL805, NVMe on the CM4's PCIe);
#: mmc_block and pcie-brcmstb are built into the kernel.
ARM64_INITRAMFS_MODULES = list(ARCHES["arm64"].initramfs_modules)

#: update-initramfs while the Debian stage installs packages: a no-op (see base_options).
PARKED = "/usr/sbin/update-initramfs.edge-gateway"


def base_options(arch: Arch) -> list[str]:
    """mmdebstrap options for the Debian stage of ``arch`` (none for amd64).

    ``force-unsafe-io``: dpkg does not fsync every unpacked file (the stage is renamed
    into place only when complete, so a crash mid-way loses nothing that counts); under
    qemu-user on a shared disk those syncs are a share of the stage's time.

    For an arch with a fixed initramfs module list, an *essential* hook (it runs after
    the Essential: yes packages, before ``--include``'s, so before initramfs-tools and the
    kernel are unpacked) writes ``/etc/initramfs-tools/conf.d/gateway-modules``
    (``MODULES=list``) and ``/usr/share/initramfs-tools/modules.d/edge-gateway`` (the
    list; read by mkinitramfs next to the ``/etc/initramfs-tools/modules`` conffile, which
    is left to its package), and diverts update-initramfs to a no-op, so neither the
    kernel's postinst (``-c``) nor initramfs-tools' trigger (``-u``) builds one. A
    *customize* hook puts the real update-initramfs back. The rootfs stage builds the
    image's single initramfs (``update-initramfs -c -k all``) with this configuration."""
    if not arch.initramfs_modules:
        return []
    conf = "/etc/initramfs-tools/conf.d/gateway-modules"
    listing = "/usr/share/initramfs-tools/modules.d/edge-gateway"
    essential = (
        'set -e; r="$1"; mkdir -p "$r/etc/initramfs-tools/conf.d" '
        '"$r/usr/share/initramfs-tools/modules.d"; '
        f'echo MODULES=list > "$r{conf}"; '
        f"printf '%s\\n' {' '.join(arch.initramfs_modules)} > \"$r{listing}\"; "
        'chroot "$r" dpkg-divert --quiet --local --rename '
        f'--divert {PARKED} --add /usr/sbin/update-initramfs; '
        'printf \'#!/bin/sh\\nexit 0\\n\' > "$r/usr/sbin/update-initramfs"; '
        'chmod 755 "$r/usr/sbin/update-initramfs"')
    customize = (
        'set -e; r="$1"; rm -f "$r/usr/sbin/update-initramfs"; '
        'chroot "$r" dpkg-divert --quiet --local --rename '
        f'--divert {PARKED} --remove /usr/sbin/update-initramfs; '
        'test -x "$r/usr/sbin/update-initramfs"')
    return ["--dpkgopt=force-unsafe-io", f"--essential-hook={essential}",
            f"--customize-hook={customize}"]


def get(name: str) -> Arch:
    if name not in ARCHES:
        raise BadInput(f"unknown arch {name!r} (supported: {', '.join(ARCHES)})")
    return ARCHES[name]


def kernel_package(arch: Arch, flavour: str | None) -> str:
    flavour = flavour or arch.default_kernel
    if flavour not in arch.kernels:
        raise BadInput(f"unknown --kernel {flavour!r} for {arch.name} "
                       f"(one of: {', '.join(arch.kernels)})")
    return arch.kernels[flavour]


def foreign(arch: Arch) -> bool:
    return platform.machine() != arch.uname


BINFMT = Path("/proc/sys/fs/binfmt_misc")


def ensure_binfmt(arch: Arch, binfmt: Path = BINFMT, fix: bool = True) -> None:
    """Make sure this host runs ``arch`` binaries (qemu-user via binfmt_misc, with the
    F flag so the interpreter works inside a chroot); with ``fix``, try to mount
    binfmt_misc and enable the interpreter first; else BadInput naming what is missing."""
    if not foreign(arch):
        return
    entry = binfmt / f"qemu-{arch.uname}"
    if fix and not (binfmt / "status").exists():
        run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(binfmt)], check=False)
    if fix and not entry.exists() and shutil.which("update-binfmts"):
        run(["update-binfmts", "--enable", f"qemu-{arch.uname}"], check=False)
    if not entry.exists():
        raise BadInput(f"building {arch.name} here needs qemu-user through binfmt_misc: "
                       f"{entry} is missing (apt-get install qemu-user-static "
                       f"binfmt-support; mount -t binfmt_misc binfmt_misc {binfmt}; "
                       f"update-binfmts --enable qemu-{arch.uname})")
    text = entry.read_text()
    if "enabled" not in text.splitlines()[0]:
        raise BadInput(f"{entry} is disabled (update-binfmts --enable qemu-{arch.uname})")
    flags = next((ln.split(":", 1)[1] for ln in text.splitlines() if ln.startswith("flags:")),
                 "")
    if "F" not in flags:
        raise BadInput(f"{entry} lacks the F flag, so its interpreter is not found inside "
                       f"a chroot (use Debian's qemu-user-static, not qemu-user-binfmt)")
