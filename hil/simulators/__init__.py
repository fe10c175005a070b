"""Device simulators, one fleet per scenario group, all on the rig's one asyncio loop.

``base`` holds what every fleet shares (the run context, message ids and payloads, the
per-device publish schedule); ``mqtt`` drives paho-mqtt clients through their socket
callbacks (no thread per client); ``mqttsn``, ``coap`` and ``lwm2m`` use the project's
own MQTT-SN client and aiocoap. ``control`` is the rig's side: the collector that receives
every device's telemetry and the commander that sends devices their commands.
"""
