"""labgrid resources, drivers and the strategy of the rig, registered the labgrid way.

Importing this package registers them with ``labgrid.target_factory``; environment files
say ``imports: [hil.drivers]``. Each unit driver implements :class:`hil.unit.Unit`.
"""

from hil.drivers import board, local, qemu, resources, strategy

__all__ = ["board", "local", "qemu", "resources", "strategy"]
