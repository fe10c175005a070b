"""``image/build --out DIR [--arch amd64|arm64] [--kernel cloud|generic] [--version V]``:
the appliance image. ``image/build --prune [--keep N]``: drop stale cache entries.

Stages (each cached under ``<cache>/<arch>/<stage>-<key>``, the key a hash of its inputs):

1. base        Debian packages (mmdebstrap) -- the slowest stage, rarely changes
2. wheelhouse  our wheel + runtime deps (scripts/wheelhouse) for Debian 12's Python of
               the target arch (for a foreign arch: the binary wheels swapped for the
               index's wheels of that arch, ours cross-compiled; edge_image/wheels.py,
               edge_image/cross.py)
3. rootfs      base + the gateway venv + systemd/ units and profiles + image/rootfs/
               overlay + version stamp + initramfs; host keys and machine-id removed
4. slotfs      the root file system image (ext4, ``mkfs.ext4 -d``): one RAUC slot
5. esp         the EFI system partition (vfat, mtools): systemd-boot, loader entry, A's
               kernel and initrd
6. data        the empty data partition (ext4, label data)
7. disk        GPT on a sparse file (sfdisk), partitions copied in (dd conv=notrunc,sparse)
8. bundle      the signed RAUC bundle of the slot image

Outputs in ``--out``: ``edge-gateway-V-ARCH.img``, ``.bmap`` and ``.raucb``.
No loop devices and no mounts except the private ones a chroot needs (unshare -m).
After a build, each stage keeps its latest ``--keep`` entries (default 3) per arch;
older ones are removed and the space freed is printed (edge_image/prune.py).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import time
from pathlib import Path

from edge_image import arch as arches
from edge_image import cross, layout, wheels
from edge_image.arch import Arch
from edge_image.common import (
    IMAGE_DIR,
    MIRROR,
    REPO,
    SUITE,
    BadInput,
    Progress,
    cache_root,
    commit,
    fresh_dir,
    hash_files,
    key_of,
    remove,
    require_root,
    require_tools,
    run,
)
from edge_image.keys import SigningKeys, resolve
from edge_image.prune import prune, unmount_leftovers

PACKAGES = [
    "systemd", "systemd-sysv", "systemd-boot", "udev", "dbus", "kmod", "busybox",
    "systemd-resolved", "systemd-timesyncd",
    "initramfs-tools", "e2fsprogs", "dosfstools", "fdisk", "cloud-guest-utils",
    "python3", "python3-venv", "libsystemd0", "openssh-server", "rauc", "rauc-service",
    "iproute2", "procps", "netbase", "ca-certificates", "less",
    "rclone",  # gateway-fleet ship (docs/fleet.md)
]
DPKG_EXCLUDES = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*",
                 "/usr/share/locale/*", "/usr/share/lintian/*"]
TOOLS = {"mmdebstrap": "mmdebstrap", "mkfs.ext4": "e2fsprogs", "mkfs.vfat": "dosfstools",
         "mcopy": "mtools", "mmd": "mtools", "sfdisk": "fdisk", "bmaptool": "bmap-tools",
         "rauc": "rauc", "mksquashfs": "squashfs-tools", "openssl": "openssl",
         "unshare": "util-linux", "chroot": "coreutils", "dd": "coreutils"}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="image/build", description=__doc__.split("\n")[0])
    p.add_argument("--out", help="directory for the .img, .bmap and .raucb")
    p.add_argument("--arch", default="amd64", help="amd64 or arm64 (docs/image.md#arm64)")
    p.add_argument("--kernel", default=None, help="kernel flavour: cloud (amd64 default: "
                   "virtio only, QEMU and cloud VMs) or generic (real hardware; arm64 "
                   "default)")
    p.add_argument("--prune", action="store_true", help="only remove stale cache entries "
                   "(every arch; the latest --keep per stage stay) and say what it freed")
    p.add_argument("--keep", type=int, default=3, help="cache entries kept per stage and "
                   "arch when pruning (default 3; 0 with a build: do not prune)")
    p.add_argument("--version", default=None, help="image version (default: the "
                   "gateway's version + 'dev')")
    p.add_argument("--signing-key"), p.add_argument("--signing-cert")
    p.add_argument("--keyring", help="CA certificate the image trusts for updates")
    p.add_argument("--release", action="store_true",
                   help="refuse to fall back to the cached development signing key")
    p.add_argument("--boot-tries", type=int, default=3,
                   help="boots a freshly installed slot gets to pass its health check")
    try:
        return p.parse_args(argv)
    except SystemExit as e:
        if e.code == 0:
            raise
        raise BadInput("invalid arguments (see image/build --help)") from None


def gateway_version() -> str:
    for line in (REPO / "gateway/__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=")[1].strip().strip("\"'")
    return "0"


class Builder:
    def __init__(self, args: argparse.Namespace, keys: SigningKeys) -> None:
        self.arch: Arch = arches.get(args.arch)
        self.kernel = arches.kernel_package(self.arch, args.kernel)
        self.version: str = args.version or f"{gateway_version()}-dev"
        self.out = Path(args.out).resolve()
        self.keys = keys
        self.tries: int = args.boot_tries
        self.cache = cache_root() / self.arch.name
        self.progress = Progress(8)
        self.name = f"edge-gateway-{self.version}-{self.arch.name}"

    # ------------------------------------------------------------------ stages
    def wheelhouse(self, base: Path, base_key: str) -> tuple[Path, str]:
        t0 = self.progress.stage("wheelhouse", "our wheel and its dependencies"
                                 + (f" ({self.arch.name} wheels from the index)"
                                    if arches.foreign(self.arch) else ""))
        if arches.foreign(self.arch):
            path, key, hit = wheels.foreign(self.cache, self.arch)
        else:
            path, key, hit = wheels.native(self.cache)
        self.progress.done(t0, hit)
        return path, key

    def base(self) -> tuple[Path, str]:
        pkgs = [*PACKAGES, self.kernel]
        args = ["--variant=minbase", f"--architectures={self.arch.name}",
                f"--include={','.join(pkgs)}",
                *(f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES),
                "--aptopt=Acquire::Retries \"3\"", *arches.base_options(self.arch), SUITE]
        key = key_of(repr(args), MIRROR)
        final = self.cache / f"base-{key}"
        how = "mmdebstrap, qemu-user" if arches.foreign(self.arch) else "mmdebstrap"
        t0 = self.progress.stage("base", f"Debian {SUITE} {self.arch.name} packages ({how})")
        if (final / "usr/lib/os-release").exists():
            self.progress.done(t0, True)
            return final, key
        tmp = fresh_dir(final)
        # In its own mount namespace: the /proc, /sys and /dev mounts mmdebstrap makes in
        # its chroot go with it, even when it is killed (see prune.unmount_leftovers).
        run(["unshare", "--mount", "--propagation", "private", "mmdebstrap", *args, tmp,
             MIRROR], timeout=5400)
        commit(tmp, final)
        self.progress.done(t0, False)
        return final, key

    def rootfs(self, base: Path, base_key: str, wheels: Path, wheels_key: str) -> Path:
        h = hashlib.sha256()
        hash_files(h, [IMAGE_DIR / "rootfs", REPO / "systemd", IMAGE_DIR / "edge_image/build.py",
                       IMAGE_DIR / "edge_image/arch.py"], REPO)
        key = key_of(base_key, wheels_key, h.hexdigest(), self.version,
                     self.keys.keyring.read_text(), str(self.tries))
        final = self.cache / f"rootfs-{key}"
        t0 = self.progress.stage("rootfs", "gateway venv, units, overlay, initramfs")
        if (final / "usr/lib/edge-gateway/kernel-cmdline").exists():
            self.progress.done(t0, True)
            return final
        root = fresh_dir(final)
        run(["cp", "-a", "--reflink=auto", base, root])
        self._populate(root, wheels)
        commit(root, final)
        self.progress.done(t0, False)
        return final

    def _populate(self, root: Path, wheels: Path) -> None:
        sysd = REPO / "systemd"
        units = root / "usr/lib/systemd/system"
        run(["cp", "-a", f"{IMAGE_DIR}/rootfs/.", root])
        shutil.copy(sysd / "gatewayd.service", units / "gatewayd.service")
        (units / "gatewayd.service.d").mkdir(exist_ok=True)
        shutil.copy(sysd / "gatewayd.service.d/edge.conf", units / "gatewayd.service.d/")
        for unit in ("gateway-fleet-ship.service", "gateway-fleet-ship.timer"):
            shutil.copy(sysd / unit, units / unit)
        shutil.copy(sysd / "sysusers.d/gateway.conf", root / "usr/lib/sysusers.d/gateway.conf")
        shutil.copy(sysd / "tmpfiles.d/gateway.conf", root / "usr/lib/tmpfiles.d/gateway.conf")
        shutil.copy(sysd / "sysctl.d/60-gateway-edge.conf", root / "usr/lib/sysctl.d/")
        (root / "etc/security/limits.d").mkdir(parents=True, exist_ok=True)
        shutil.copy(sysd / "limits.d/90-gateway-edge.conf", root / "etc/security/limits.d/")
        shutil.copy(self.keys.keyring, root / "etc/rauc/keyring.pem")
        (root / "usr/lib/edge-gateway/boot-tries").write_text(f"{self.tries}\n")
        (root / "usr/lib/edge-gateway/kernel-cmdline").write_text(
            layout.kernel_cmdline(self.arch.name) + "\n")
        conf = root / "etc/rauc/system.conf"
        conf.write_text(conf.read_text().replace(f"compatible={layout.compatible('amd64')}",
                                                 f"compatible={layout.compatible(self.arch.name)}"))
        with open(root / "usr/lib/os-release", "a") as f:
            f.write(f'IMAGE_ID=edge-gateway\nIMAGE_VERSION="{self.version}"\n')
        shutil.copytree(wheels, root / "tmp/wheels")
        script = """set -e
python3 -m venv /opt/gateway
/opt/gateway/bin/pip install -q --no-index --disable-pip-version-check \
    --find-links /tmp/wheels -r /tmp/wheels/requirements.txt
rm -rf /tmp/wheels /root/.cache
systemd-sysusers
systemctl enable gatewayd.service gateway-data.service gateway-health.service \
    gateway-fleet-ship.timer systemd-networkd.service ssh.service systemd-resolved.service \
    systemd-timesyncd.service
systemctl disable apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
    fstrim.timer 2>/dev/null || true
systemctl mask systemd-remount-fs.service rauc-mark-good.service 2>/dev/null || true
passwd -l root
rm -f /etc/ssh/ssh_host_*
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id && ln -s /etc/machine-id /var/lib/dbus/machine-id
echo edge-gateway > /etc/hostname
# DNS: systemd-resolved's stub, fed by networkd's DHCP leases. The root is read-only, so
# the link is made here, not at boot.
rm -f /etc/resolv.conf && ln -s ../run/systemd/resolve/stub-resolv.conf /etc/resolv.conf
{strip_modules}update-initramfs {initramfs_mode} -k all
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb
"""
        strip = ""
        if self.arch.name == "arm64" and self.kernel == "linux-image-arm64":
            dirs = " ".join(f"/lib/modules/*/kernel/{d}" for d in arches.ARM64_UNNEEDED_MODULES)
            strip = (f"rm -rf {dirs}\n"
                     "for v in $(ls /lib/modules); do depmod -a \"$v\"; done\n")
        # With a fixed module list the Debian stage made no initramfs (arch.base_options):
        # create the one the image carries; amd64's base has one to update.
        mode = "-c" if self.arch.initramfs_modules else "-u"
        chroot(root, script.replace("{strip_modules}", strip)
               .replace("{initramfs_mode}", mode))
        for d in ("data", "efi", "etc/gateway", "var/lib/gateway", "var/lib/systemd",
                  "var/log", "var/tmp", "var/cache"):
            (root / d).mkdir(parents=True, exist_ok=True)

    def slotfs(self, rootfs: Path) -> Path:
        final = self.cache / f"slotfs-{rootfs.name.split('-', 1)[1]}.ext4"
        t0 = self.progress.stage("slotfs", "root file system image (mkfs.ext4 -d)")
        if final.exists():
            self.progress.done(t0, True)
            return final
        used = int(run(["du", "-s", "--block-size=1M", rootfs]).split()[0])
        size = min(layout.SLOT_MIB, int(used * 1.25) + 96)
        if used + 32 > layout.SLOT_MIB:
            raise BadInput(f"the root file system ({used} MiB) does not fit a "
                           f"{layout.SLOT_MIB} MiB slot")
        tmp = final.with_name(final.name + ".tmp")
        remove(tmp)
        run(["mkfs.ext4", "-q", "-F", "-L", "root", "-d", rootfs, "-E",
             "root_owner=0:0", tmp, f"{size}M"], timeout=1800)
        commit(tmp, final)
        self.progress.done(t0, False)
        return final

    def esp(self, rootfs: Path) -> Path:
        final = self.cache / f"esp-{rootfs.name.split('-', 1)[1]}.vfat"
        t0 = self.progress.stage("esp", "systemd-boot, loader entry, kernel + initrd for A")
        if final.exists():
            self.progress.done(t0, True)
            return final
        tmp = final.with_name(final.name + ".tmp")
        remove(tmp)
        layout.make_esp(tmp, rootfs, self.arch.efi, self.arch.efi_default, self.arch.name)
        commit(tmp, final)
        self.progress.done(t0, False)
        return final

    def data(self) -> Path:
        final = self.cache.parent / "data-empty.ext4"
        t0 = self.progress.stage("data", "empty data partition (grows on first boot)")
        if final.exists():
            self.progress.done(t0, True)
            return final
        tmp = final.with_name(final.name + ".tmp")
        remove(tmp)
        layout.make_data(tmp, None)
        commit(tmp, final)
        self.progress.done(t0, False)
        return final

    def disk(self, esp: Path, slot: Path, data: Path) -> Path:
        img = self.out / f"{self.name}.img"
        t0 = self.progress.stage("disk", f"GPT disk {img.name} + bmap")
        layout.assemble(img, esp, slot, data, self.arch.name)
        bmap = self.out / f"{self.name}.bmap"
        run(["bmaptool", "create", "-o", bmap, img])
        self.progress.done(t0, False)
        return img

    def bundle(self, slot: Path) -> Path:
        out = self.out / f"{self.name}.raucb"
        t0 = self.progress.stage("bundle", f"signed RAUC bundle {out.name}")
        key = key_of(str(slot.stat().st_mtime_ns), slot.name, self.version,
                     self.keys.cert.read_text())
        cached = self.cache / f"bundle-{key}.raucb"
        hit = cached.exists()
        if not hit:
            make_bundle(slot, cached, version=self.version, arch=self.arch.name,
                        keys=self.keys)
        shutil.copy(cached, out)
        self.progress.done(t0, hit)
        return out


def make_bundle(slot: Path, out: Path, *, version: str, arch: str, keys: SigningKeys) -> None:
    """A verity RAUC bundle holding ``slot`` as the rootfs image, signed with ``keys``."""
    work = Path(run(["mktemp", "-d"]).strip())
    try:
        content = work / "content"
        content.mkdir()
        os.link(slot, content / "rootfs.ext4") if _same_fs(slot, work) else \
            shutil.copy(slot, content / "rootfs.ext4")
        (content / "manifest.raucm").write_text(
            f"[update]\ncompatible={layout.compatible(arch)}\nversion={version}\n\n"
            f"[bundle]\nformat=verity\n\n[image.rootfs]\nfilename=rootfs.ext4\n")
        tmp = out.with_name(out.name + ".tmp")
        remove(tmp)
        # zstd: several times faster than mksquashfs's default gzip at a similar size.
        run(["rauc", "bundle", "--cert", keys.cert, "--key", keys.key,
             "--mksquashfs-args=-comp zstd -Xcompression-level 6", content, tmp],
            timeout=1800)
        tmp.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _same_fs(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev


def chroot(root: Path, script: str) -> None:
    """Run ``script`` with /bin/sh in ``root``, with /proc, /sys, /dev mounted privately."""
    wrapper = (f'set -e; r="{root}"; mount -t proc proc "$r/proc"; '
               'mount --rbind /sys "$r/sys"; mount --rbind /dev "$r/dev"; '
               'exec chroot "$r" /bin/sh -c "$1"')
    run(["unshare", "--mount", "--propagation", "private", "sh", "-c", wrapper, "sh", script],
        env={"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C.UTF-8",
             "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
        timeout=1800)


def main(argv: list[str]) -> int:
    args = parse(argv)
    arch = arches.get(args.arch)
    arches.kernel_package(arch, args.kernel)
    if args.version is not None and not all(c.isalnum() or c in ".-+~_" for c in args.version):
        raise BadInput(f"invalid --version {args.version!r} (letters, digits, . - + ~ _)")
    if not 1 <= args.boot_tries <= 9:
        raise BadInput("--boot-tries must be 1..9")
    if args.keep < 0 or (args.prune and args.keep < 1):
        raise BadInput("--keep must be 1 or more (0 only with a build: no pruning)")
    if args.prune and args.out is None:
        prune(cache_root(), args.keep)
        return 0
    if args.out is None:
        raise BadInput("--out DIR is required (or --prune alone)")
    require_root("build")
    require_tools(TOOLS)
    if arches.foreign(arch):
        require_tools({"arch-test": "arch-test"})  # mmdebstrap's foreign-arch check
        cross.require_compiler(arch)  # our compiled wheel for that arch
    arches.ensure_binfmt(arch)
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    unmount_leftovers(cache)
    keys = resolve(args.signing_key, args.signing_cert, args.keyring, release=args.release,
                   cache=cache)
    b = Builder(args, keys)
    b.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if keys.development:
        print(f"note: signing with the DEVELOPMENT key in {keys.key.parent}: images built "
              "so trust only this cache's key, and anyone who can read the cache can sign "
              "updates for them; fleets build with --release and their own key "
              "(docs/image.md#signing-keys)", flush=True)
    print(f"building {b.name} (kernel {b.kernel}; cache {b.cache})", flush=True)
    base, bkey = b.base()
    wheels, wkey = b.wheelhouse(base, bkey)
    rootfs = b.rootfs(base, bkey, wheels, wkey)
    slot = b.slotfs(rootfs)
    esp = b.esp(rootfs)
    data = b.data()
    img = b.disk(esp, slot, data)
    bundle = b.bundle(slot)
    print(f"slot image: {slot}", flush=True)
    content = int(run(["du", "-s", "--block-size=1M", img]).split()[0])
    print(f"built {img} ({img.stat().st_size >> 20} MiB, {content} MiB of content), "
          f"{bundle.name} ({bundle.stat().st_size >> 20} MiB) in "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    if args.keep:
        prune(cache, args.keep, only=b.cache)
    return 0


if __name__ == "__main__":
    from edge_image.common import main_guard
    main_guard("image/build", main)
