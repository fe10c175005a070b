"""The appliance image this node runs from, if any (docs/image.md).

An image built by image/build stamps ``IMAGE_ID=edge-gateway`` and ``IMAGE_VERSION=`` into
os-release, and its boot loader entries pass ``rauc.slot=A|B`` on the kernel command
line. Anywhere else (a developer's machine, an Ansible-installed host) there is no image:
:func:`image_info` returns None and ``gatewayctl status`` shows no Image row.
"""

from __future__ import annotations

import shlex
from pathlib import Path

OS_RELEASE = Path("/etc/os-release")
CMDLINE = Path("/proc/cmdline")


def _os_release(path: Path) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            parts = shlex.split(value) if value else [""]
            fields[key.strip()] = parts[0] if parts else ""
    return fields


def image_info(os_release: Path = OS_RELEASE, cmdline: Path = CMDLINE) -> dict[str, str] | None:
    """``{"version": ..., "slot": ...}`` on an edge-gateway image, else None."""
    try:
        fields = _os_release(os_release)
    except (OSError, ValueError):
        return None
    if fields.get("IMAGE_ID") != "edge-gateway":
        return None
    slot = "unknown"
    try:
        for word in cmdline.read_text().split():
            if word.startswith("rauc.slot="):
                slot = word.split("=", 1)[1]
    except OSError:
        pass
    return {"version": fields.get("IMAGE_VERSION", "unknown"), "slot": slot}
