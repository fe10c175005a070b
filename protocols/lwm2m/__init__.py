"""LwM2M 1.0/1.1 server front-end over CoAP: registration interface and EMQX's MQTT JSON
mapping for device management (``channel.py``), content formats (``content.py``), the
object model from OMA XML (``objects.py``, core objects 0-7 in ``xml/``)."""

from protocols.lwm2m.channel import Lwm2mChannel, Lwm2mSettings
from protocols.lwm2m.objects import ObjectModel

__all__ = ["Lwm2mChannel", "Lwm2mSettings", "ObjectModel"]
