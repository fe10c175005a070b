"""What the rig needs from a unit under test, whatever the target (local, QEMU, board).

Every labgrid driver that puts a gateway under test implements :class:`Unit`; the runner
talks to nothing else. Invariants: ``power_cut`` leaves the unit off until ``power_on``;
``kill_process`` kills only the gatewayd process and leaves bringing it back to the unit's
own supervisor (systemd on an image or a board, the driver's restart loop locally), so
"unit back without a person" is measured, not arranged; faults a target cannot make
raise :class:`Unsupported`, which the runner reports instead of passing silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable


class Unsupported(Exception):
    """This target cannot make that fault (the message says why)."""


@dataclass(frozen=True)
class Endpoints:
    device_host: str  # where simulated devices connect (the side faults act on)
    control_host: str  # where the rig's collector, commander and API calls go
    ports: dict[str, int]  # mqtt, mqtts, ws, wss, mqttsn, coap, lwm2m, api
    api_token: str | None = None
    ca_file: Path | None = None  # verifies the TLS listeners' certificate
    rig_host: str = "127.0.0.1"  # an address of the rig the unit can reach (upstream)
    extra: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Unit(Protocol):
    def prepare(self, run_dir: Path, env: dict[str, str]) -> None:
        """Set the unit up for one run (``env``: extra GATEWAY_* settings, if it can)."""

    def configure(self, env: dict[str, str]) -> None:
        """Extra GATEWAY_* settings for the next power-on (Unsupported if it cannot)."""

    def power_on(self) -> None: ...

    def power_cut(self) -> None: ...

    def kill_process(self) -> None: ...

    def wait_ready(self, timeout: float) -> float:
        """Block until the unit answers (API and MQTT); return the seconds waited."""

    def endpoints(self) -> Endpoints: ...

    def rss_bytes(self) -> int | None: ...

    def network_fault(self, mode: str, loss: float, delay: float) -> None: ...

    def network_heal(self) -> None: ...

    def disk_fill(self) -> str | None:
        """Fill the data file system; say how full it is now (for the record)."""

    def disk_free(self) -> None: ...

    def teardown(self) -> None: ...
