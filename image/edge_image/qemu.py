"""``image/qemu IMG [--arch A] [--mqtt-port N] [--ssh-port N] [--api-port N] [--snapshot]``.

Boots an image under QEMU: amd64 on q35 with OVMF, arm64 on ``virt`` (Cortex-A72, the
Raspberry Pi 4's core) with AAVMF (Debian's qemu-efi-aarch64); virtio disk and network
either way. The arch comes from the image's GPT (the root partitions' type GUID) unless
``--arch`` says. A foreign arch always runs under TCG. For amd64 KVM is used when it
works: /dev/kvm must be usable *and* a short probe must not hit a KVM emulation failure
(this happens on some nested hosts, which then need TCG); otherwise TCG. The choice is
printed. Every VM gets its own copy of OVMF_VARS (``--efivars FILE`` keeps one across
runs). Host ports are forwarded on 127.0.0.1 only. The serial console goes to the
terminal, or to ``--serial-log FILE``.

:func:`command` builds the command line; tests/image and the HIL rig's qemu target use it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from edge_image import layout
from edge_image.arch import ARCHES, foreign
from edge_image.common import BadInput, main_guard, require_tools, run

OVMF_CODE = ARCHES["amd64"].firmware_code
OVMF_VARS = ARCHES["amd64"].firmware_vars
#: TCG CPU of the arm64 guest: the Raspberry Pi 4's Cortex-A72 ("max" adds pointer
#: authentication, which TCG emulates slowly).
ARM64_CPU = "cortex-a72"
# Not "max": QEMU 7.2's TCG with every feature on corrupts path strings in the guest
# kernel (/proc/self/mountinfo shows mount points as "xxx"), and systemd's mount units
# then fail with result 'protocol'. The default qemu64 model plus SSE4/POPCNT is enough
# for Debian 12 and its Python wheels.
TCG_CPU = "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt"
GUEST_PORTS = {"mqtt": 1883, "ssh": 22, "api": 18083}


def image_arch(img: Path) -> str:
    """The arch of a raw image, from its root partitions' GPT type (amd64 if unknown,
    e.g. a qcow2 file)."""
    try:
        table = json.loads(run(["sfdisk", "--json", img]))["partitiontable"]
    except Exception:
        return "amd64"
    types = {p.get("name"): p.get("type", "").upper() for p in table.get("partitions", [])}
    for arch, guid in layout.ROOT_TYPE.items():
        if types.get("rootA") == guid:
            return arch
    return "amd64"


@cache
def accelerator(arch: str = "amd64") -> str:
    """``kvm`` if KVM really runs guest code here, else ``tcg`` (EDGE_GATEWAY_ACCEL wins;
    a foreign arch is always ``tcg``)."""
    if foreign(ARCHES[arch]):
        return "tcg"
    forced = os.environ.get("EDGE_GATEWAY_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    if arch != "amd64":
        return "tcg"  # the KVM probe below is x86's
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    with tempfile.TemporaryDirectory() as tmp:
        vars_ = Path(tmp) / "vars.fd"
        shutil.copy(OVMF_VARS, vars_)
        try:
            r = subprocess.run(
                ["qemu-system-x86_64", "-accel", "kvm", "-machine", "q35", "-m", "256",
                 "-display", "none", "-serial", "none", "-monitor", "none", "-nodefaults",
                 "-drive", f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}",
                 "-drive", f"if=pflash,format=raw,file={vars_}"],
                capture_output=True, text=True, timeout=4)
            out = r.stdout + r.stderr
        except subprocess.TimeoutExpired as e:
            out = ((e.stdout or b"") + (e.stderr or b"")).decode(errors="replace") \
                if isinstance(e.stdout, bytes) or isinstance(e.stderr, bytes) else ""
            if "emulation failure" not in out and "internal error" not in out.lower():
                return "kvm"
        return "tcg"


def command(img: Path, *, vars_file: Path, ports: dict[str, int], snapshot: bool = False,
            serial_log: Path | None = None, memory_mib: int = 1024, cpus: int = 2,
            extra_drives: tuple[Path, ...] = (), no_reboot: bool = False,
            arch: str = "amd64") -> list[str]:
    """The QEMU command line (``ports`` maps mqtt/ssh/api to host ports). With
    ``no_reboot`` QEMU exits (status 0) when the guest resets instead of resetting in
    place; the caller starts it again (see tests/image/vm.py). ``vars_file`` must be a
    copy of ``arch``'s firmware variables (:func:`new_vars`)."""
    a = ARCHES[arch]
    accel = accelerator(arch)
    fwd = "".join(f",hostfwd=tcp:127.0.0.1:{port}-:{GUEST_PORTS[name]}"
                  for name, port in sorted(ports.items()) if port)
    fmt = "qcow2" if img.suffix == ".qcow2" else "raw"
    drive = f"if=virtio,format={fmt},file={img},cache=unsafe,discard=unmap"
    if snapshot:
        drive += ",snapshot=on"
    if arch == "amd64":
        machine = ["-machine", "q35", "-cpu", "host" if accel == "kvm" else TCG_CPU]
        disk = ["-drive", drive]
    else:
        machine = ["-machine", "virt", "-cpu", "host" if accel == "kvm" else ARM64_CPU]
        # The disk first in the firmware's boot order: AAVMF would otherwise try PXE on
        # the virtio NIC first, which takes minutes under TCG.
        disk = ["-drive", drive.replace("if=virtio", "if=none,id=disk0"),
                "-device", "virtio-blk-pci,drive=disk0,bootindex=0"]
    cmd = [a.qemu, "-accel", accel, *machine,
           "-smp", str(cpus), "-m", str(memory_mib), "-nodefaults", "-display", "none",
           "-drive", f"if=pflash,format=raw,readonly=on,file={a.firmware_code}",
           "-drive", f"if=pflash,format=raw,file={vars_file}",
           *disk,
           "-netdev", f"user,id=n0{fwd}", "-device", "virtio-net-pci,netdev=n0",
           "-device", "virtio-rng-pci"]
    for extra in extra_drives:
        cmd += ["-drive", f"if=virtio,format=raw,file={extra}"]
    if no_reboot:
        cmd.append("-no-reboot")
    if serial_log is not None:
        cmd += ["-serial", f"file:{serial_log}", "-monitor", "none"]
    else:
        cmd += ["-serial", "mon:stdio"]
    return cmd


def new_vars(dest: Path, arch: str = "amd64") -> Path:
    """A fresh copy of ``arch``'s UEFI variable store (OVMF / AAVMF)."""
    shutil.copy(ARCHES[arch].firmware_vars, dest)
    return dest


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="image/qemu", description="Boot an image under QEMU.")
    p.add_argument("img", type=Path)
    p.add_argument("--arch", choices=sorted(ARCHES), help="default: from the image's GPT")
    for name in GUEST_PORTS:
        p.add_argument(f"--{name}-port", type=int, default=0,
                       help=f"host port forwarded to the unit's {name} port "
                       f"{GUEST_PORTS[name]} (127.0.0.1)")
    p.add_argument("--snapshot", action="store_true", help="discard every disk write")
    p.add_argument("--serial-log", type=Path, help="serial console to this file")
    p.add_argument("--efivars", type=Path, help="keep the UEFI variables in this file")
    p.add_argument("--memory", type=int, default=1024, help="MiB (default 1024)")
    p.add_argument("--cpus", type=int, default=2)
    try:
        return p.parse_args(argv)
    except SystemExit as e:
        if e.code == 0:
            raise
        raise BadInput("invalid arguments (see image/qemu --help)") from None


def main(argv: list[str]) -> int:
    args = parse(argv)
    if not args.img.is_file():
        raise BadInput(f"no such image: {args.img}")
    arch = args.arch or image_arch(args.img)
    a = ARCHES[arch]
    require_tools({a.qemu: a.qemu_package})
    for f in (a.firmware_code, a.firmware_vars):
        if not f.exists():
            raise BadInput(f"{f} not found (Debian package {a.firmware_package})")
    ports = {name: getattr(args, f"{name}_port") for name in GUEST_PORTS}
    for name, port in ports.items():
        if not 0 <= port <= 65535:
            raise BadInput(f"--{name}-port {port} is not a port number")
    with tempfile.TemporaryDirectory(prefix="edge-gateway-qemu-") as tmp:
        vars_file = args.efivars
        if vars_file is None:
            vars_file = new_vars(Path(tmp) / "VARS.fd", arch)
        elif not vars_file.exists():
            new_vars(vars_file, arch)
        cmd = command(args.img.resolve(), vars_file=vars_file, ports=ports,
                      snapshot=args.snapshot, serial_log=args.serial_log,
                      memory_mib=args.memory, cpus=args.cpus, arch=arch)
        print(f"image/qemu: {arch} under {accelerator(arch).upper()}; forwarding "
              + (", ".join(f"{n} 127.0.0.1:{p}" for n, p in ports.items() if p) or "nothing")
              + ("; serial console: " + str(args.serial_log) if args.serial_log else
                 "; Ctrl-A X quits"), flush=True)
        proc = subprocess.Popen(cmd)
        forward = lambda signum, _frame: proc.send_signal(signum)  # noqa: E731
        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGHUP, forward)
        return proc.wait()


if __name__ == "__main__":
    main_guard("image/qemu", main)
