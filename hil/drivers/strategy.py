"""``GatewayStrategy``: moves a target between ``off`` and ``running`` (labgrid style).

Bound to whichever unit driver the environment declares (local process, QEMU image or
board). ``running`` means powered and answering (API ``/status`` and the MQTT port);
``off`` means no power (SIGKILL locally, QEMU killed, the power switch off). The pytest
plugin's ``strategy`` fixture is this object: ``strategy.transition("running")``.
"""

from __future__ import annotations

import enum
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import attr
from labgrid.factory import target_factory
from labgrid.strategy.common import Strategy, StrategyError, never_retry


class Status(enum.Enum):
    unknown = 0
    off = 1
    running = 2


@target_factory.reg_driver
@attr.s(eq=False)
class GatewayStrategy(Strategy):
    bindings: ClassVar[dict[str, Any]] = {
        "unit": {"LocalGatewayDriver", "QemuGatewayDriver", "BoardGatewayDriver"}}
    status: Status = attr.ib(default=Status.unknown)
    ready_timeout: float = attr.ib(default=120.0,
                                   validator=attr.validators.instance_of(float))

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.prepared = False

    def prepare(self, run_dir: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.target.activate(self.unit)
        self.unit.prepare(run_dir or Path(tempfile.mkdtemp(prefix="hil-")), env or {})
        self.prepared = True

    @never_retry
    def transition(self, status: str | Status) -> None:
        if not isinstance(status, Status):
            status = Status[status]
        if status == self.status:
            return
        if not self.prepared:
            self.prepare()
        if status == Status.running:
            self.unit.power_on()
            self.unit.wait_ready(self.ready_timeout)
        elif status == Status.off:
            self.unit.power_cut()
        else:
            raise StrategyError(f"no transition to {status}")
        self.status = status
