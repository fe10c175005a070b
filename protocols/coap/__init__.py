"""CoAP front-end (RFC 7252, 7641 observe, 7959 blockwise) with EMQX's publish/subscribe
mapping: codec on aiocoap's message class (sans-IO), channel on our datagram shell."""

from protocols.coap.channel import CoapChannel, CoapSettings
from protocols.coap.codec import RemoteProtocolError, decode, encode

__all__ = ["CoapChannel", "CoapSettings", "RemoteProtocolError", "decode", "encode"]
