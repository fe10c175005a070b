"""Multi-core nodes: ``node.workers`` processes behind SO_REUSEPORT listeners that act
as one broker, built on the cluster (docs/workers.md).

- :mod:`gateway.workers.plan`: each worker's name, cluster port, data directory,
  certificate and configuration overrides (pure, deterministic).
- :mod:`gateway.workers.supervisor`: the process that starts, restarts and signals the
  workers and relays their sd_notify messages to systemd.
"""
