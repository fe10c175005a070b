"""``image/build --out DIR [--arch amd64] [--version V]``: the appliance image.

Stages (each cached under ``<cache>/<stage>-<key>``, the key a hash of its inputs):

1. wheelhouse  our wheel + runtime deps (scripts/wheelhouse) for Debian 12's Python
2. base        Debian packages (mmdebstrap) -- the slowest stage, rarely changes
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
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import time
from pathlib import Path

from edge_image import layout
from edge_image.common import (
    IMAGE_DIR,
    REPO,
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

SUITE = "bookworm"
MIRROR = os.environ.get("EDGE_GATEWAY_MIRROR", "http://deb.debian.org/debian")
ARCHES = {"amd64": {"kernel": "linux-image-cloud-amd64", "efi": "systemd-bootx64.efi",
                    "efi_default": "BOOTX64.EFI"}}
PACKAGES = [
    "systemd", "systemd-sysv", "systemd-boot", "udev", "dbus", "kmod", "busybox",
    "initramfs-tools", "e2fsprogs", "dosfstools", "fdisk", "cloud-guest-utils",
    "python3", "python3-venv", "libsystemd0", "openssh-server", "rauc", "rauc-service",
    "iproute2", "procps", "netbase", "ca-certificates", "less",
]
DPKG_EXCLUDES = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*",
                 "/usr/share/locale/*", "/usr/share/lintian/*"]
TOOLS = {"mmdebstrap": "mmdebstrap", "mkfs.ext4": "e2fsprogs", "mkfs.vfat": "dosfstools",
         "mcopy": "mtools", "mmd": "mtools", "sfdisk": "fdisk", "bmaptool": "bmap-tools",
         "rauc": "rauc", "mksquashfs": "squashfs-tools", "openssl": "openssl",
         "unshare": "util-linux", "chroot": "coreutils", "dd": "coreutils"}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="image/build", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for the .img, .bmap and .raucb")
    p.add_argument("--arch", default="amd64")
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
        self.arch: str = args.arch
        self.version: str = args.version or f"{gateway_version()}-dev"
        self.out = Path(args.out).resolve()
        self.keys = keys
        self.tries: int = args.boot_tries
        self.cache = cache_root()
        self.progress = Progress(8)
        self.name = f"edge-gateway-{self.version}-{self.arch}"

    # ------------------------------------------------------------------ stages
    def wheelhouse(self) -> tuple[Path, str]:
        h = hashlib.sha256()
        hash_files(h, [REPO / "gateway", REPO / "protocols", REPO / "pyproject.toml",
                       REPO / "scripts/wheelhouse"], REPO)
        key = h.hexdigest()[:16]
        final = self.cache / f"wheelhouse-{key}"
        t0 = self.progress.stage("wheelhouse", "our wheel and its dependencies")
        if not (final / "requirements.txt").exists():
            tmp = fresh_dir(final)
            run([REPO / "scripts/wheelhouse", tmp, "--python", "/usr/bin/python3"],
                timeout=1800)
            commit(tmp, final)
            self.progress.done(t0, False)
        else:
            self.progress.done(t0, True)
        return final, key

    def base(self) -> tuple[Path, str]:
        pkgs = [*PACKAGES, ARCHES[self.arch]["kernel"]]
        args = ["--variant=minbase", f"--architectures={self.arch}",
                f"--include={','.join(pkgs)}",
                *(f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES),
                "--aptopt=Acquire::Retries \"3\"", SUITE]
        key = key_of(repr(args), MIRROR)
        final = self.cache / f"base-{self.arch}-{key}"
        t0 = self.progress.stage("base", f"Debian {SUITE} packages (mmdebstrap)")
        if (final / "usr/lib/os-release").exists():
            self.progress.done(t0, True)
            return final, key
        tmp = fresh_dir(final)
        run(["mmdebstrap", *args, tmp, MIRROR], timeout=3600)
        commit(tmp, final)
        self.progress.done(t0, False)
        return final, key

    def rootfs(self, base: Path, base_key: str, wheels: Path, wheels_key: str) -> Path:
        h = hashlib.sha256()
        hash_files(h, [IMAGE_DIR / "rootfs", REPO / "systemd", IMAGE_DIR / "edge_image/build.py"],
                   REPO)
        key = key_of(base_key, wheels_key, h.hexdigest(), self.version,
                     self.keys.keyring.read_text(), str(self.tries))
        final = self.cache / f"rootfs-{self.arch}-{key}"
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
        shutil.copy(sysd / "sysusers.d/gateway.conf", root / "usr/lib/sysusers.d/gateway.conf")
        shutil.copy(sysd / "tmpfiles.d/gateway.conf", root / "usr/lib/tmpfiles.d/gateway.conf")
        shutil.copy(sysd / "sysctl.d/60-gateway-edge.conf", root / "usr/lib/sysctl.d/")
        (root / "etc/security/limits.d").mkdir(parents=True, exist_ok=True)
        shutil.copy(sysd / "limits.d/90-gateway-edge.conf", root / "etc/security/limits.d/")
        shutil.copy(self.keys.keyring, root / "etc/rauc/keyring.pem")
        (root / "usr/lib/edge-gateway/boot-tries").write_text(f"{self.tries}\n")
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
    systemd-networkd.service ssh.service
systemctl disable apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
    fstrim.timer 2>/dev/null || true
systemctl mask systemd-remount-fs.service rauc-mark-good.service 2>/dev/null || true
passwd -l root
rm -f /etc/ssh/ssh_host_*
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id && ln -s /etc/machine-id /var/lib/dbus/machine-id
echo edge-gateway > /etc/hostname
update-initramfs -u -k all
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb
"""
        chroot(root, script)
        for d in ("data", "efi", "etc/gateway", "var/lib/gateway", "var/lib/systemd",
                  "var/log", "var/tmp", "var/cache"):
            (root / d).mkdir(parents=True, exist_ok=True)

    def slotfs(self, rootfs: Path) -> Path:
        final = self.cache / f"slotfs-{rootfs.name.split('-', 2)[2]}.ext4"
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
        final = self.cache / f"esp-{rootfs.name.split('-', 2)[2]}.vfat"
        t0 = self.progress.stage("esp", "systemd-boot, loader entry, kernel + initrd for A")
        if final.exists():
            self.progress.done(t0, True)
            return final
        tmp = final.with_name(final.name + ".tmp")
        remove(tmp)
        layout.make_esp(tmp, rootfs, ARCHES[self.arch]["efi"], ARCHES[self.arch]["efi_default"])
        commit(tmp, final)
        self.progress.done(t0, False)
        return final

    def data(self) -> Path:
        final = self.cache / "data-empty.ext4"
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
        layout.assemble(img, esp, slot, data)
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
            make_bundle(slot, cached, version=self.version, arch=self.arch, keys=self.keys)
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
    if args.arch == "arm64":
        raise BadInput("arm64 is not built yet (docs/image.md#arm64 describes the boot "
                       "path and the cross-build)")
    if args.arch not in ARCHES:
        raise BadInput(f"unknown arch {args.arch!r} (supported: {', '.join(ARCHES)})")
    if args.version is not None and not all(c.isalnum() or c in ".-+~_" for c in args.version):
        raise BadInput(f"invalid --version {args.version!r} (letters, digits, . - + ~ _)")
    if not 1 <= args.boot_tries <= 9:
        raise BadInput("--boot-tries must be 1..9")
    require_root("build")
    require_tools(TOOLS)
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    keys = resolve(args.signing_key, args.signing_cert, args.keyring, release=args.release,
                   cache=cache)
    b = Builder(args, keys)
    b.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if keys.development:
        print(f"note: signing with the DEVELOPMENT key in {keys.key.parent} "
              "(docs/image.md#signing-keys)", flush=True)
    wheels, wkey = b.wheelhouse()
    base, bkey = b.base()
    rootfs = b.rootfs(base, bkey, wheels, wkey)
    slot = b.slotfs(rootfs)
    esp = b.esp(rootfs)
    data = b.data()
    img = b.disk(esp, slot, data)
    bundle = b.bundle(slot)
    content = int(run(["du", "-s", "--block-size=1M", img]).split()[0])
    print(f"built {img} ({img.stat().st_size >> 20} MiB, {content} MiB of content), "
          f"{bundle.name} ({bundle.stat().st_size >> 20} MiB) in "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    from edge_image.common import main_guard
    main_guard("image/build", main)
