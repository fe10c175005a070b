"""Protection of the broker: banned clients, flapping detection.

Rate limits live where the bytes are (the channel, :mod:`protocols.ratelimit`, and the
listener limits in :mod:`gateway.net.stream`); this package holds the parts that are
hook subscribers of the core.
"""
