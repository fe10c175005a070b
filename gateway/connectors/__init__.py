"""Data-integration sinks fed by rule actions, each over one durable queue
(:mod:`gateway.store.queue`): :mod:`gateway.connectors.webhook` (HTTP)."""
