"""Edge gateway: an MQTT broker core with protocol front-ends, for edge hardware."""

__version__ = "0.1.0"
