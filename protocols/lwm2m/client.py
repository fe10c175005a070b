"""A small LwM2M client (device simulator) on aiocoap, for tests and the HIL rig.

One aiocoap server context on one UDP socket is both the device's CoAP server (the
gateway reads, writes, executes and observes its resources) and its client (register,
update, deregister go out from the same address, as LwM2M requires).

The device holds resource values in a dict (``"/3/0/0" -> value``) typed by the object
model; it answers Read with text/plain for a resource and TLV (or SenML JSON, with
``senml=True``, as 1.1 devices do) for an instance or object, Discover with link format,
Write (text, opaque, TLV, SenML), Execute (recorded in ``executed``), Create and Delete
of instances, and Observe with notifications when :meth:`set` changes a value. As a 1.1
device (``version="1.1"``, ``senml=True``) it lists SenML in its registration, answers
Read-/Observe-Composite (FETCH) and Write-Composite (iPATCH), and sends (``POST /dp``).
Reads are answered in the Accept asked when it is one of ``formats`` (4.06 otherwise;
without an Accept: text for a resource, else TLV, or 5.00 when it has no TLV, as
wakaama's 1.1 client did); ``accepts`` records the Accept of every read.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import cbor2
from aiocoap import (
    CHANGED,
    CONTENT,
    CREATED,
    DELETE,
    DELETED,
    GET,
    METHOD_NOT_ALLOWED,
    NOT_FOUND,
    POST,
    PUT,
    Context,
    Message,
)
from aiocoap.error import BadRequest
from aiocoap.interfaces import ObservableResource
from aiocoap.numbers.codes import Code

from protocols.lwm2m import content
from protocols.lwm2m.objects import ObjectModel


class Lwm2mClient:
    def __init__(
        self,
        server: tuple[str, int],
        endpoint: str,
        *,
        lifetime: int = 300,
        binding: str = "U",
        version: str = "1.0",
        senml: bool = False,
        values: dict[str, Any] | None = None,
        model: ObjectModel | None = None,
        formats: tuple[int, ...] | None = None,
        list_formats: bool = True,
    ) -> None:
        self.server = server
        self.endpoint = endpoint
        self.lifetime = lifetime
        self.binding = binding
        self.version = version
        self.senml = senml
        # the formats it answers reads of several resources in (and writes it takes)
        self.formats = formats if formats is not None else (
            (content.SENML_JSON, content.SENML_CBOR, content.TLV) if senml else (content.TLV,))
        self.list_formats = list_formats  # its root link says them (ct, LwM2M 1.1)
        self.accepts: list[int | None] = []  # the Accept of every read, in order
        self.model = model or ObjectModel.shipped()
        self.values: dict[str, Any] = dict(values or {
            "/1/0/0": 1, "/1/0/1": lifetime, "/1/0/7": binding,
            "/3/0/0": "gatewayd simulator", "/3/0/1": "sim-1", "/3/0/9": 100,
            "/3/0/7/0": 3300, "/3/0/7/1": 5000,
        })
        self.executed: list[tuple[str, bytes]] = []
        self.location: tuple[str, ...] = ()
        self.ctx: Any = None
        self._observers: dict[str, list[Callable[[], None]]] = {}
        self.bootstrapped = asyncio.Event()

    # -- lifecycle -----------------------------------------------------------------

    async def start(self, bind: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.ctx = await Context.create_server_context(_Site(self), bind=bind)

    async def close(self) -> None:
        if self.ctx is not None:
            await self.ctx.shutdown()

    def _uri(self, path: str) -> str:
        return f"coap://{self.server[0]}:{self.server[1]}{path}"

    def links(self) -> str:
        instances = sorted({"/".join(p.split("/")[:3]) for p in self.values},
                           key=lambda p: [int(x) for x in p.split("/")[1:]])
        root = '</>;rt="oma.lwm2m"'
        if self.list_formats and self.version != "1.0" and self.formats != (content.TLV,):
            root += f';ct="{" ".join(map(str, self.formats))}"'  # what it reads (1.1)
        return ",".join([root] + [f"<{p}>" for p in instances])

    async def register(self, timeout: float = 10.0) -> Any:
        q = f"ep={self.endpoint}&lt={self.lifetime}&lwm2m={self.version}&b={self.binding}"
        req = Message(code=POST, uri=self._uri(f"/rd?{q}"), payload=self.links().encode())
        req.opt.content_format = content.LINK_FORMAT
        resp = await asyncio.wait_for(self.ctx.request(req).response, timeout)
        if resp.code == CREATED:
            self.location = tuple(resp.opt.location_path)
        return resp

    async def bootstrap(self, timeout: float = 10.0) -> Any:
        """Client-initiated bootstrap: ``POST /bs?ep=``, then wait for Bootstrap-Finish
        (the server's deletes and writes land in ``values`` meanwhile)."""
        self.bootstrapped = asyncio.Event()
        req = Message(code=POST, uri=self._uri(f"/bs?ep={self.endpoint}"))
        resp = await asyncio.wait_for(self.ctx.request(req).response, timeout)
        if resp.code == CHANGED:
            await asyncio.wait_for(self.bootstrapped.wait(), timeout)
        return resp

    async def update(self, timeout: float = 10.0) -> Any:
        path = "/" + "/".join(self.location)
        req = Message(code=POST, uri=self._uri(f"{path}?lt={self.lifetime}"))
        return await asyncio.wait_for(self.ctx.request(req).response, timeout)

    async def deregister(self, timeout: float = 10.0) -> Any:
        path = "/" + "/".join(self.location)
        req = Message(code=DELETE, uri=self._uri(path))
        return await asyncio.wait_for(self.ctx.request(req).response, timeout)

    async def send(self, paths: list[str], *, cbor: bool = False, timeout: float = 10.0) -> Any:
        """LwM2M 1.1 Send (``POST /dp``) of these resources' values, SenML JSON or CBOR."""
        recs = [_senml_record(p, self.values[p]) for p in paths]
        if cbor:
            keys = {"n": 0, "v": 2, "vs": 3, "vb": 4}
            payload = cbor2.dumps([{keys[k]: v for k, v in r.items()} for r in recs])
            fmt = content.SENML_CBOR
        else:
            payload, fmt = json.dumps(recs).encode(), content.SENML_JSON
        req = Message(code=POST, uri=self._uri("/dp"), payload=payload)
        req.opt.content_format = fmt
        return await asyncio.wait_for(self.ctx.request(req).response, timeout)

    def set(self, path: str, value: Any) -> None:
        """Change a value; observers of it (or of its instance/object) are notified."""
        self.values[path] = value
        for key, callbacks in list(self._observers.items()):
            if path == key or path.startswith(key + "/"):
                for cb in callbacks:
                    cb()

    # -- serving -------------------------------------------------------------------

    def _under(self, path: str) -> dict[str, Any]:
        return {p: v for p, v in self.values.items() if p == path or p.startswith(path + "/")}

    def render(self, request: Any) -> Any:
        parts = [p for p in request.opt.uri_path if p]
        path = "/" + "/".join(parts)
        code = request.code
        if code == GET:
            found = self._under(path)
            if not found:
                return Message(code=NOT_FOUND)
            if request.opt.accept == content.LINK_FORMAT:
                items = sorted({"/".join(p.split("/")[:4]) for p in found})
                return Message(code=CONTENT, payload=",".join(f"<{p}>" for p in items).encode(),
                               content_format=content.LINK_FORMAT)
            self.accepts.append(request.opt.accept)
            return self._read(path, found, request.opt.accept)
        if code == PUT:
            if request.opt.uri_query:  # write-attributes
                return Message(code=CHANGED)
            return self._write(path, request)
        if code == POST and parts == ["bs"]:  # Bootstrap-Finish
            self.bootstrapped.set()
            return Message(code=CHANGED)
        if code == DELETE and not parts:  # Bootstrap-Delete: the server accounts go
            for p in [p for p in self.values if p.startswith(("/0/", "/1/"))]:
                del self.values[p]
            return Message(code=DELETED)
        if code == POST:
            if len(parts) == 3 and self.model.resource(path) is not None and \
                    "E" in self.model.resource(path).operations:  # type: ignore[union-attr]
                self.executed.append((path, bytes(request.payload)))
                return Message(code=CHANGED)
            if len(parts) == 1:  # create
                entries = content.decode(request.opt.content_format, bytes(request.payload),
                                         path, self.model.type_of)
                for e in entries:
                    self.values[e["path"]] = e["value"]
                return Message(code=CREATED)
            return self._write(path, request)
        if code == Code.FETCH:  # Read-/Observe-Composite
            return self._read_composite(request)
        if code == Code.iPATCH:  # Write-Composite
            return self._write(path, request)
        if code == DELETE:
            found = self._under(path)
            if not found:
                return Message(code=NOT_FOUND)
            for p in found:
                del self.values[p]
            return Message(code=DELETED)
        return Message(code=METHOD_NOT_ALLOWED)

    def _read(self, path: str, found: dict[str, Any], accept: int | None) -> Any:
        """A Read answered in ``accept`` (4.06 when it is not one of ``formats``); without
        an Accept, a resource in text and anything else in TLV, or 5.00 for a device
        without TLV (what wakaama's 1.1 client did)."""
        depth = len([p for p in path.split("/") if p])
        single = depth == 3 and path in found
        if accept is None:
            accept = content.TEXT if single else content.TLV
            if accept not in self.formats and not single:
                return Message(code=Code.INTERNAL_SERVER_ERROR)
        if accept == content.TEXT and single:
            typ = self.model.type_of(path)
            return Message(code=CONTENT, payload=content.text_of(found[path], typ),
                           content_format=content.TEXT)
        if accept not in self.formats:
            return Message(code=Code.NOT_ACCEPTABLE)
        entries = [{"path": p, "value": v} for p, v in sorted(found.items())]
        if accept == content.TLV:
            payload = content.encode_tlv(entries, path if depth < 3 else
                                         "/".join(path.split("/")[:3]), self.model.type_of)
        else:
            payload = content.encode_senml(entries, "/", self.model.type_of,
                                           cbor=accept == content.SENML_CBOR)
        return Message(code=CONTENT, payload=payload, content_format=accept)

    def _read_composite(self, request: Any) -> Any:
        fmt = request.opt.content_format
        try:
            names = [e["path"] for e in content.decode(fmt, bytes(request.payload), "/")]
        except content.ContentError:
            return Message(code=Code.BAD_REQUEST)
        found: dict[str, Any] = {}
        for n in names:
            found.update(self._under(n))
        recs = [_senml_record(p, v) for p, v in sorted(found.items())]
        if (request.opt.accept or fmt) == content.SENML_CBOR:
            keys = {"n": 0, "v": 2, "vs": 3, "vb": 4}
            return Message(code=CONTENT, payload=cbor2.dumps(
                [{keys[k]: v for k, v in r.items()} for r in recs]),
                content_format=content.SENML_CBOR)
        return Message(code=CONTENT, payload=json.dumps(recs).encode(),
                       content_format=content.SENML_JSON)

    def _write(self, path: str, request: Any) -> Any:
        fmt = request.opt.content_format
        try:
            if fmt in (content.TLV, content.SENML_JSON, content.SENML_CBOR):
                for e in content.decode(fmt, bytes(request.payload), path, self.model.type_of):
                    self.set(e["path"], e["value"])
            else:
                [e] = content.decode(fmt, bytes(request.payload), path, self.model.type_of)
                self.set(path, e["value"])
        except (content.ContentError, ValueError):
            return Message(code=Code.BAD_REQUEST)
        return Message(code=CHANGED)


def _senml_record(name: str, value: Any) -> dict[str, Any]:
    key = "vb" if isinstance(value, bool) else "v" if isinstance(value, (int, float)) else "vs"
    return {"n": name, key: value}


class _Site(ObservableResource):  # type: ignore[misc]
    """aiocoap's resource interface for every path of the device."""

    def __init__(self, client: Lwm2mClient) -> None:
        super().__init__()
        self.client = client

    async def render_to_pipe(self, pipe: Any) -> None:
        req = pipe.request
        b2 = req.opt.block2
        if b2 is not None and b2.block_number > 0 and req.opt.observe is None:
            # a later block of a notification: aiocoap serves only blocks of answers it
            # cached itself, so the current value is cut here
            full = self.client.render(req.copy(block2=None))
            if full.code.is_successful():
                try:
                    block = full._extract_block(b2.block_number, b2.size_exponent, 1024)
                except BadRequest:
                    block = Message(code=Code.BAD_REQUEST)
                pipe.add_response(block, is_last=True)
                return
        await self._render_to_pipe(pipe)

    async def needs_blockwise_assembly(self, request: Any) -> bool:
        return True

    async def render(self, request: Any) -> Any:
        return self.client.render(request)

    async def add_observation(self, request: Any, serverobservation: Any) -> None:
        paths = ["/" + "/".join(p for p in request.opt.uri_path if p)]
        if request.code == Code.FETCH:  # Observe-Composite: each path of the body
            paths = [e["path"] for e in content.decode(
                request.opt.content_format, bytes(request.payload), "/")]

        def trigger() -> None:
            # a notification larger than a block goes as its first block (RFC 7959 2.6);
            # the server asks for the rest (aiocoap would send it whole)
            resp = self.client.render(request)
            if len(resp.payload) > 1024:
                resp = resp._extract_block(0, 6, 1024)
            serverobservation.trigger(resp)

        lists = [self.client._observers.setdefault(p, []) for p in paths]
        for callbacks in lists:
            callbacks.append(trigger)
        def cancelled() -> None:
            for callbacks in lists:
                callbacks.remove(trigger)

        serverobservation.accept(cancelled)

    def get_resources_as_linkheader(self) -> str:
        return self.client.links()
