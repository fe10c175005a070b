"""The cluster tests' node factory (stopped at the end, logs printed on failure) for the
live-link revocation tests."""

from tests.gateway.cluster.conftest import nodes, pki

__all__ = ["nodes", "pki"]
