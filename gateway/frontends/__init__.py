"""The front-end registry: one module per front-end, one line per front-end here.

:class:`gateway.app.Gateway` opens every listener of every front-end of :data:`FRONTENDS`,
in this order, in one loop (:mod:`gateway.frontends.listen` does the opening). A new
front-end is a new module declaring a :class:`~gateway.frontends.base.FrontEnd` plus a
line in this table; docs/adding-a-frontend.md walks through one.
"""

from gateway.frontends import coap, lwm2m, mqtt, mqttsn, websocket
from gateway.frontends.base import Assembly, FrontEnd, ListenerSpec

FRONTENDS: tuple[FrontEnd, ...] = (
    mqtt.FRONTEND,  # [listeners.tcp.*], [listeners.ssl.*]
    websocket.FRONTEND,  # [listeners.ws.*], [listeners.wss.*]
    mqttsn.FRONTEND,  # [gateway.mqttsn]
    coap.FRONTEND,  # [gateway.coap]
    lwm2m.FRONTEND,  # [gateway.lwm2m]
)

__all__ = ["FRONTENDS", "Assembly", "FrontEnd", "ListenerSpec"]
