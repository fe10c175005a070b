"""Operations: the management API, Prometheus metrics, ``$SYS`` topics, live trace,
alarms, the open-file limit check and the systemd integration.

- :mod:`gateway.admin.admin`: :class:`~gateway.admin.admin.Admin`, one per running gateway.
- :mod:`gateway.admin.api`: the aiohttp application (routes in ``ROUTES``) and
  :mod:`gateway.admin.openapi`, its OpenAPI document.
- :mod:`gateway.admin.introspect`: read-only JSON views of the core.
- :mod:`gateway.admin.prometheus`, :mod:`gateway.admin.sys_topics`,
  :mod:`gateway.admin.trace`, :mod:`gateway.admin.alarms`, :mod:`gateway.admin.stats`.
- :mod:`gateway.admin.limits` (RLIMIT_NOFILE), :mod:`gateway.admin.sdnotify` (systemd),
  :mod:`gateway.admin.tokens` (the API token), :mod:`gateway.admin.registry` (listeners).

This package's ``__init__`` imports nothing, so ``gatewayctl`` can use
:mod:`gateway.admin.tokens` without loading aiohttp.
"""
