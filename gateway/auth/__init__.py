"""Authentication backends and per-user authorization, as hook subscribers of the core.

- :mod:`gateway.auth.builtin`: the built-in user database (password and SCRAM-SHA-256);
- :mod:`gateway.auth.http`: an HTTP authentication service (EMQX-shaped);
- :mod:`gateway.auth.user_rules`: superusers and per-user rules (``client.authorize``);
- :mod:`gateway.auth.setup`: the chain assembled from ``[authentication]``.
"""
