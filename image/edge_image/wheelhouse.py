"""``scripts/wheelhouse DIR --arch ARCH`` for a foreign arch (e.g. arm64 hosts provisioned
with Ansible from an amd64 controller): the arm64 image's wheelhouse stage
(:func:`edge_image.wheels.foreign`: PyPI's wheels of that arch for every dependency, ours
pure and cross-compiled), copied into ``DIR`` (its requirements.txt pins exactly these
wheels by hash, so older ones left in ``DIR`` are not installed).

The stage is cached under the image build's cache (``$EDGE_GATEWAY_CACHE/image/<arch>``),
so an image build and this command share it. Needs root, as the image build does (the
sysroot of the cross build is extracted with mmdebstrap in a private mount namespace).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

from edge_image import arch as arches
from edge_image import cross, wheels
from edge_image.common import BadInput, cache_root, main_guard, require_tools


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="scripts/wheelhouse",
                                description=__doc__.split("\n")[0])
    p.add_argument("out", metavar="DIR")
    p.add_argument("--arch", required=True)
    args = p.parse_args(argv)
    arch = arches.get(args.arch)
    if not arches.foreign(arch):
        raise BadInput(f"{arch.name} is this host's arch: scripts/wheelhouse builds it "
                       "without --arch")
    if os.geteuid() != 0:
        raise BadInput(f"--arch {arch.name} must run as root (try: sudo scripts/wheelhouse ...)")
    require_tools({"mmdebstrap": "mmdebstrap"})
    cross.require_compiler(arch)
    out = Path(args.out)
    print(f"==> building the {arch.name} wheelhouse (PyPI's {arch.name} wheels, ours "
          "cross-compiled; a few minutes the first time, cached after)", flush=True)
    t0 = time.monotonic()
    built, _, cached = wheels.foreign(cache_root() / arch.name, arch)
    out.mkdir(parents=True, exist_ok=True)
    files = [f for f in sorted(built.iterdir()) if f.is_file()]
    for f in files:
        shutil.copy2(f, out / f.name)
    n = sum(1 for f in files if f.suffix == ".whl")
    print(f"==> {n} wheels, requirements.txt and SHA256SUMS in {out} "
          f"({'cached' if cached else f'{time.monotonic() - t0:.0f} s'})", flush=True)
    return 0


if __name__ == "__main__":
    main_guard("scripts/wheelhouse", main)
