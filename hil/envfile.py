"""Environment files: labgrid's YAML, checked before labgrid sees it.

labgrid reports a bad environment with a traceback from deep inside its factory; the rig
wants one line naming file, field and line (exit 2). :func:`load_env` therefore
validates the file's shape with pydantic first (``targets.main`` with ``resources`` and
``drivers``; exactly one unit driver and a ``GatewayStrategy``; ``imports`` naming
``hil.drivers``), then lets labgrid build the target, turning any error it raises into
:class:`hil.yamlmarks.BadInput` with the line of the driver or resource concerned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hil import ENV_DIR
from hil.yamlmarks import BadInput, from_validation, line_of, load

UNIT_DRIVERS = ("LocalGatewayDriver", "QemuGatewayDriver", "BoardGatewayDriver")


class _Target(BaseModel):
    model_config = ConfigDict(extra="allow")
    resources: dict[str, Any] | list[Any] = Field(default_factory=dict)
    drivers: dict[str, Any] | list[Any]

    @model_validator(mode="after")
    def _unit(self) -> _Target:
        names = _names(self.drivers)
        units = [n for n in names if n in UNIT_DRIVERS]
        if len(units) != 1:
            raise ValueError(f"drivers: exactly one of {', '.join(UNIT_DRIVERS)} is needed")
        if "GatewayStrategy" not in names:
            raise ValueError("drivers: GatewayStrategy is needed")
        return self


class _EnvFile(BaseModel):
    model_config = ConfigDict(extra="allow")
    targets: dict[str, _Target]
    imports: list[str]

    @model_validator(mode="after")
    def _main(self) -> _EnvFile:
        if "main" not in self.targets:
            raise ValueError("targets: a target named main is needed")
        if "hil.drivers" not in self.imports:
            raise ValueError("imports: must list hil.drivers")
        return self


def _names(section: dict[str, Any] | list[Any]) -> list[str]:
    if isinstance(section, dict):
        return list(section)
    return [next(iter(x)) for x in section if isinstance(x, dict) and x]


def resolve(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return ENV_DIR / f"{name_or_path}.yaml"


def load_env(name_or_path: str) -> tuple[Any, Any]:
    """Validate, then build with labgrid; returns (environment, GatewayStrategy)."""
    path = resolve(name_or_path)
    data, lines = load(path)
    if not isinstance(data, dict):
        raise BadInput(path, 1, "", "expected a labgrid environment (targets: main: ...)")
    try:
        _EnvFile.model_validate(data)
    except ValidationError as e:
        raise from_validation(path, e, lines, data) from None
    import labgrid

    import hil.drivers  # noqa: F401  (registers our resources and drivers)

    try:
        env = labgrid.Environment(config_file=str(path))
        target = env.get_target("main")
        strategy = target.get_driver("GatewayStrategy")
    except Exception as e:  # labgrid raises many kinds; name the part it choked on
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        main = data["targets"]["main"]
        field, line = "targets.main", line_of(lines, ("targets", "main"))
        for section in ("drivers", "resources"):
            for name in _names(main.get(section, {})):
                if name in text:
                    field = f"targets.main.{section}.{name}"
                    line = line_of(lines, ("targets", "main", section, name))
        raise BadInput(path, line, field, text) from None
    return env, strategy


def shipped() -> list[Path]:
    return sorted(ENV_DIR.glob("*.yaml"))
