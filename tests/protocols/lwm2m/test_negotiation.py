"""Content-format negotiation of reads (Accept chosen per device, ``accept`` override, one
fallback on 4.06/5.00), cancel-observe content, execute's format, why a session ended."""

from __future__ import annotations

import json
import logging

import cbor2
import pytest

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from protocols.coap.codec import ACK, NON, Code, make
from protocols.context import ClientInfo
from protocols.lwm2m import content
from protocols.lwm2m.channel import Lwm2mSettings
from protocols.lwm2m.formats import candidates, name_of, parse_accept
from tests.protocols.lwm2m.test_channel import (
    LINKS,
    Device,
    registered,
    registered_11,
)


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler()


@pytest.fixture
def node(clock: VirtualScheduler) -> Node:
    return Node(CoreSettings(), clock)


SENML = json.dumps([{"bn": "/3/0/", "n": "9", "v": 80}, {"n": "0", "vs": "OMA"}]).encode()
SENML_CBOR = cbor2.dumps([{-2: "/3/0/", 0: "9", 2: 80}, {0: "0", 3: "OMA"}])
SENML_CONTENT = [{"path": "/3/0/9", "value": 80}, {"path": "/3/0/0", "value": "OMA"}]


def test_candidates() -> None:
    assert candidates("1.0", [], None) == [content.TLV, content.OMA_JSON]
    assert candidates("1.0", [content.SENML_CBOR], None)[0] == content.TLV  # 1.0: ct ignored
    assert candidates("1.1", [], None) == [content.SENML_CBOR, content.SENML_JSON, content.TLV]
    assert candidates("1.1", [110, 112, 11542], None)[:2] == [110, 112]
    assert candidates("1.1", [112], 11542) == [11542, 112, 110]
    assert candidates("1.1", [0, 42, 11542], None) == [11542, 112, 110]  # text: no
    assert candidates("1.1", [11542], None, composite=True) == [112, 110]
    assert parse_accept("senml-cbor") == parse_accept(112) == parse_accept("112") == 112
    assert parse_accept("application/vnd.oma.lwm2m+tlv") == content.TLV
    assert name_of(110) == "senml-json" and name_of(None) == "none"
    for bad in ("xml", 40, True, None, 99999):
        with pytest.raises(ValueError):
            parse_accept(bad)


def test_a_10_device_is_asked_tlv(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    app.up()
    for i, (msg_type, path) in enumerate((("read", "/3/0"), ("read", "/3/0/0"),
                                          ("observe", "/3/0/9"))):
        app.command(i, msg_type, path=path)
        [req] = d.take()
        assert req.opt.accept == content.TLV, (msg_type, path)
        d.reply(req, Code.CONTENT, b"x", content.TEXT)
        app.up()


@pytest.mark.parametrize(("links", "expect"), [
    (b'</>;rt="oma.lwm2m";ct="110 112 11542",</3/0>', content.SENML_JSON),
    (b'</>;rt="oma.lwm2m";ct=112,</3/0>', content.SENML_CBOR),
    (b'</>;rt="oma.lwm2m",</3/0>', content.SENML_CBOR),  # 1.1 listing nothing
])
def test_a_11_device_is_asked_senml(node: Node, clock: VirtualScheduler, links: bytes,
                                    expect: int) -> None:
    d, app = registered_11(node, clock, links)
    app.command(1, "read", path="/3/0")
    [req] = d.take()
    assert req.opt.accept == expect
    d.reply(req, Code.CONTENT, SENML_CBOR if expect == content.SENML_CBOR else SENML, expect)
    [(_, resp)] = app.up()
    assert resp["data"]["code"] == "2.05" and resp["data"]["content"] == SENML_CONTENT


def test_accept_in_the_command_overrides(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    app.up()
    app.command(1, "read", path="/3/0", accept="senml-json")
    [req] = d.take()
    assert req.opt.accept == content.SENML_JSON
    d.reply(req, Code.NOT_ACCEPTABLE)  # named by the command: no second try
    assert d.take() == []
    [(_, resp)] = app.up()
    assert resp["data"]["code"] == "4.06" and resp["data"]["codeMsg"] == "not_acceptable"
    app.command(2, "read", path="/3/0", accept=11543)
    [req] = d.take()
    assert req.opt.accept == content.OMA_JSON
    d.reply(req, Code.CONTENT, b'{"bn":"/3/0/","e":[{"n":"9","v":80}]}', content.OMA_JSON)
    assert app.up()[0][1]["data"]["content"] == [{"path": "/3/0/9", "value": 80}]
    app.command(3, "read", path="/3/0", accept="xml")
    assert d.take() == []  # not sent
    [(_, resp)] = app.up()
    assert resp["reqID"] == 3 and resp["data"]["code"] == "4.00"
    assert "accept 'xml'" in resp["data"]["codeMsg"]


@pytest.mark.parametrize("first_error", [Code.NOT_ACCEPTABLE, Code.INTERNAL_SERVER_ERROR])
def test_one_fallback_then_kept(node: Node, clock: VirtualScheduler, first_error: int,
                                caplog: pytest.LogCaptureFixture) -> None:
    d, app = registered_11(node, clock, b'</>;rt="oma.lwm2m",</3/0>')
    app.command(1, "read", path="/3/0")
    [req] = d.take()
    assert req.opt.accept == content.SENML_CBOR
    with caplog.at_level(logging.INFO, "protocols.lwm2m.channel"):
        d.reply(req, first_error)
    assert app.up() == []  # not answered yet
    [again] = d.take()
    assert again.code == Code.GET and again.opt.accept == content.SENML_JSON
    assert again.token != req.token and again.opt.uri_path == ("3", "0")
    assert "asking in senml-json" in caplog.text
    d.reply(again, Code.CONTENT, SENML, content.SENML_JSON)
    [(_, resp)] = app.up()
    assert resp["reqID"] == 1 and resp["data"]["content"] == SENML_CONTENT
    app.command(2, "read", path="/3/0")  # the format that worked goes first now
    [req] = d.take()
    assert req.opt.accept == content.SENML_JSON
    d.reply(req, Code.NOT_ACCEPTABLE)
    [again] = d.take()
    assert again.opt.accept == content.SENML_CBOR
    d.reply(again, Code.INTERNAL_SERVER_ERROR)  # once only: this one is the answer
    assert d.take() == []
    [(_, resp)] = app.up()
    assert resp["reqID"] == 2 and resp["data"]["code"] == "5.00"
    assert node.metrics.get("lwm2m.format.fallback") == 2


def test_observe_falls_back_and_cancel_answers_content(node: Node,
                                                       clock: VirtualScheduler) -> None:
    d, app = registered_11(node, clock, b'</>;rt="oma.lwm2m";ct=112,</3/0>')
    app.command(1, "observe", path="/3/0")
    [req] = d.take()
    d.reply(req, Code.NOT_ACCEPTABLE)
    [again] = d.take()
    assert again.opt.observe == 0 and again.opt.accept == content.SENML_JSON
    d.reply(again, Code.CONTENT, SENML, content.SENML_JSON, observe=1)
    assert app.up()[0][1]["data"]["content"] == SENML_CONTENT
    n = make(NON, Code.CONTENT, 777, again.token, SENML)
    n.opt.observe, n.opt.content_format = 2, content.SENML_JSON
    d.send(n)
    [(topic, note)] = app.up()
    assert topic == "up/notify" and note["reqID"] == 1 and note["seqNum"] == 2
    app.command(2, "cancel-observe", path="/3/0")
    [cancel] = d.take()
    assert cancel.opt.observe == 1 and cancel.token == again.token
    assert cancel.opt.accept == content.SENML_JSON  # the observation's format
    d.reply(cancel, Code.CONTENT, SENML, content.SENML_JSON)
    [(_, resp)] = app.up()
    assert resp == {"reqID": 2, "msgType": "cancel-observe", "data": {
        "reqPath": "/3/0", "code": "2.05", "codeMsg": "content", "content": SENML_CONTENT}}


def test_composite_read_falls_back_between_senml_formats(node: Node,
                                                         clock: VirtualScheduler) -> None:
    d, app = registered_11(node, clock, b'</>;rt="oma.lwm2m";ct=112,</3/0>')
    app.command(1, "read-composite", paths=["/3/0/9", "/3/0/0"])
    [req] = d.take()
    assert req.code == Code.FETCH and req.opt.accept == req.opt.content_format == 112
    assert cbor2.loads(req.payload) == [{0: "/3/0/9"}, {0: "/3/0/0"}]
    d.reply(req, Code.NOT_ACCEPTABLE)
    [again] = d.take()
    assert again.code == Code.FETCH and again.opt.accept == again.opt.content_format == 110
    assert json.loads(again.payload) == [{"n": "/3/0/9"}, {"n": "/3/0/0"}]
    d.reply(again, Code.CONTENT, SENML, content.SENML_JSON)
    [(_, resp)] = app.up()
    assert resp["data"]["paths"] == ["/3/0/9", "/3/0/0"]
    assert resp["data"]["content"] == SENML_CONTENT
    app.command(2, "read-composite", paths=["/3/0/9"], accept="tlv")
    assert d.take() == []
    assert app.up()[0][1]["data"]["code"] == "4.00"


def test_execute_arguments_are_text(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    app.up()
    app.command(1, "execute", path="/3/0/4", args="5,'now'")
    [req] = d.take()
    assert req.code == Code.POST and req.payload == b"5,'now'"
    assert req.opt.content_format == content.TEXT
    d.reply(req, Code.CHANGED)
    app.up()
    app.command(2, "execute", path="/3/0/4")
    [req] = d.take()
    assert req.payload == b"" and req.opt.content_format is None


def _reasons(node: Node) -> list[tuple[str, object]]:
    seen: list[tuple[str, object]] = []
    node.hooks.add("client.disconnected", lambda c: seen.append(
        (c.client_id, c.attrs.get("disconnect_reason"))))
    return seen


def test_why_the_session_ended(node: Node, clock: VirtualScheduler,
                               caplog: pytest.LogCaptureFixture) -> None:
    seen = _reasons(node)
    with caplog.at_level(logging.INFO, "protocols.lwm2m.channel"):
        d, _ = registered(node, clock)
    assert "lwm2m endpoint 'dev1' registered from 127.0.0.1:5000: lwm2m 1.0" in caplog.text
    d.request(Code.DELETE, ("rd", "dev1"))
    assert seen == [("dev1", "deregistered")]
    d, _ = registered(node, clock)
    d.advance(301)
    assert d.closed == "lifetime expired" and seen[-1] == ("dev1", "lifetime_expired")
    d, _ = registered(node, clock)
    info = d.channel.info
    assert isinstance(info, ClientInfo)
    d2 = Device(node, clock, Lwm2mSettings())  # the same endpoint from a new address
    d2.channel.peer = ("127.0.0.1", 5001)
    d2.request(Code.POST, ("rd",), ("ep=dev1", "lt=300", "lwm2m=1.0", "b=U"), LINKS)
    # the core names the takeover as EMQX does (a registration starts clean: discarded)
    assert d.closed == "takeover (0x8E)" and info.attrs["disconnect_reason"] == "discarded"
    d2.request(Code.POST, ("rd",), ("ep=dev1", "lt=300", "lwm2m=1.0", "b=U"), LINKS)
    assert seen[-1] == ("dev1", "reregistered")
    assert all(reason != "unknown" and reason is not None for _, reason in seen)


def test_composite_path_by_path_for_a_device_without_it(node: Node,
                                                        clock: VirtualScheduler) -> None:
    d, app = registered_11(node, clock, b'</>;rt="oma.lwm2m";ct=112,</3/0>')
    app.command(1, "read-composite", paths=["/3/0/9", "/3/0/0"])
    app.command(2, "read", path="/3/0/1")  # waits behind it
    [fetch] = d.take()
    assert fetch.code == Code.FETCH
    d.send(make(ACK, Code.EMPTY, fetch.mid))  # wakaama: an empty ACK, then nothing
    d.advance(61)
    assert app.up() == []  # not answered: carried out path by path
    [get9] = d.take()
    assert get9.code == Code.GET and get9.opt.uri_path == ("3", "0", "9")
    d.reply(get9, Code.CONTENT, cbor2.dumps([{0: "/3/0/9", 2: 80}]), content.SENML_CBOR)
    [get0] = d.take()
    assert get0.opt.uri_path == ("3", "0", "0")
    d.reply(get0, Code.CONTENT, cbor2.dumps([{0: "/3/0/0", 3: "OMA"}]), content.SENML_CBOR)
    [(_, resp)] = app.up()
    assert resp["reqID"] == 1 and resp["msgType"] == "read-composite"
    assert resp["data"]["code"] == "2.05" and resp["data"]["content"] == SENML_CONTENT
    assert resp["data"]["paths"] == ["/3/0/9", "/3/0/0"] and resp["data"]["reqPath"] == "/"
    assert "path by path" in resp["data"]["codeMsg"]
    [get1] = d.take()  # the waiting read goes next
    assert get1.opt.uri_path == ("3", "0", "1")
    d.reply(get1, Code.CONTENT, b"x", content.TEXT)
    assert app.up()[0][1]["reqID"] == 2
    # known now: the next composite goes path by path at once, a failing part says so
    app.command(3, "write-composite", content=[{"path": "/3/0/14", "value": "+01:00"},
                                               {"path": "/3/0/15", "value": "Europe/Paris"}])
    [put14] = d.take()
    assert put14.code == Code.PUT and put14.payload == b"+01:00"
    d.reply(put14, Code.CHANGED)
    [put15] = d.take()
    assert put15.opt.uri_path == ("3", "0", "15")
    d.reply(put15, Code.NOT_IMPLEMENTED)
    [(_, resp)] = app.up()
    assert resp["msgType"] == "write-composite" and resp["data"]["code"] == "5.01"
    assert "/3/0/15" in resp["data"]["codeMsg"]
    app.command(4, "read-composite", paths=["/3/0/9"], accept="senml-json")
    [get] = d.take()
    assert get.code == Code.GET  # path by path, no FETCH any more


def test_a_single_resource_falls_back_to_text(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    app.up()
    app.command(1, "read", path="/3/0/0")
    [req] = d.take()
    assert req.opt.accept == content.TLV
    d.reply(req, Code.NOT_ACCEPTABLE)
    [again] = d.take()
    assert again.opt.accept == content.TEXT
    d.reply(again, Code.CONTENT, b"OMA", content.TEXT)
    assert app.up()[0][1]["data"]["content"] == [{"path": "/3/0/0", "value": "OMA"}]
    app.command(2, "read", path="/3/0/1")  # text first now, for a resource
    [req] = d.take()
    assert req.opt.accept == content.TEXT
    d.reply(req, Code.CONTENT, b"x", content.TEXT)
    app.up()
    app.command(3, "read", path="/3/0")  # not for an instance
    [req] = d.take()
    assert req.opt.accept == content.TLV
