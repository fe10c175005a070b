"""The LwM2M channel against the real core: a scripted device on one side (CoAP messages
through the codec), an MQTT client of the same node on the other; virtual clock."""

from __future__ import annotations

import json
from typing import Any

import cbor2
import pytest

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from protocols.coap.codec import ACK, CON, NON, Block, Code, Message, decode, encode, make
from protocols.lwm2m import content
from protocols.lwm2m.channel import Lwm2mChannel, Lwm2mSettings, State
from protocols.mqtt.packets import Publish as MqttPublish
from protocols.mqtt.packets import Subscribe as MqttSubscribe
from protocols.mqtt.packets import Subscription
from tests.protocols.mqtt.test_channel import client as mqtt_client
from tests.protocols.wire import DatagramWire

LINKS = b'</>;rt="oma.lwm2m",</1/0>,</3/0>,</5/0>'


class Device(DatagramWire[Lwm2mChannel, Message]):
    def __init__(self, node: Node, clock: VirtualScheduler, settings: Lwm2mSettings) -> None:
        self.channel = Lwm2mChannel(node, settings, self, peer=("127.0.0.1", 5000),
                                    monotonic=clock.time)
        self.mid = 1
        super().__init__(clock)

    def decode_out(self, data: bytes) -> Message:
        return decode(data)

    def send(self, m: Message) -> None:
        self.send_raw(encode(m))

    def request(self, code: int, path: tuple[str, ...], query: tuple[str, ...] = (),
                payload: bytes = b"") -> Message:
        self.mid += 1
        m = make(CON, code, self.mid, b"d", payload)
        m.opt.uri_path = path
        m.opt.uri_query = query
        self.send(m)
        return m

    def reply(self, req: Message, code: int, payload: bytes = b"", fmt: int | None = None,
              observe: int | None = None) -> None:
        r = make(ACK, code, req.mid, req.token, payload)
        if fmt is not None:
            r.opt.content_format = fmt
        if observe is not None:
            r.opt.observe = observe
        self.send(r)


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler()


@pytest.fixture
def node(clock: VirtualScheduler) -> Node:
    return Node(CoreSettings(), clock)


class Mqtt:
    def __init__(self, node: Node, clock: VirtualScheduler, ep: str) -> None:
        self.c = mqtt_client(node, clock, "app")
        self.c.send(MqttSubscribe(1, (Subscription(f"lwm2m/{ep}/up/#", qos=0),)))
        self.c.take()
        self.ep = ep
        self.pub = mqtt_client(node, clock, "cmd", level=4)

    def up(self) -> list[tuple[str, dict[str, Any]]]:
        return [(p.topic.rsplit("/", 2)[-2] + "/" + p.topic.rsplit("/", 1)[-1],
                 json.loads(p.payload)) for p in self.c.take() if isinstance(p, MqttPublish)]

    def command(self, req_id: int, msg_type: str, **data: Any) -> None:
        body = {"reqID": req_id, "msgType": msg_type, "data": data}
        self.pub.send(MqttPublish(f"lwm2m/{self.ep}/dn", json.dumps(body).encode(), qos=0))


def registered(node: Node, clock: VirtualScheduler, query: tuple[str, ...] = ()
               ) -> tuple[Device, Mqtt]:
    app = Mqtt(node, clock, "dev1")
    d = Device(node, clock, Lwm2mSettings())
    d.request(Code.POST, ("rd",), ("ep=dev1", "lt=300", "lwm2m=1.0", "b=U", *query), LINKS)
    [r] = d.take()
    assert r.code == Code.CREATED and r.opt.location_path == ("rd", "dev1")
    return d, app


def test_register_event_and_session(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    [(topic, ev)] = app.up()
    assert topic == "up/resp" and ev["msgType"] == "register"
    assert ev["data"]["objectList"] == ["/1/0", "/3/0", "/5/0"] and ev["data"]["lt"] == 300
    assert ev["data"]["alternatePath"] == "/"
    assert "dev1" in node.sessions and d.channel.state is State.REGISTERED


def test_read_text_and_tlv(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    app.up()
    app.command(1, "read", path="/3/0/0")
    [req] = d.take()
    assert req.code == Code.GET and req.opt.uri_path == ("3", "0", "0") and req.mtype == CON
    d.reply(req, Code.CONTENT, b"Open Mobile Alliance", content.TEXT)
    [(topic, resp)] = app.up()
    assert topic == "up/resp"
    assert resp == {"reqID": 1, "msgType": "read", "data": {
        "reqPath": "/3/0/0", "code": "2.05", "codeMsg": "content",
        "content": [{"path": "/3/0/0", "value": "Open Mobile Alliance"}]}}
    app.command(2, "read", path="/3/0")
    [req] = d.take()
    tlv = content.encode_tlv([{"path": "/3/0/9", "value": 80}, {"path": "/3/0/7/0", "value": 3300}],
                             "/3/0", d.channel.settings.model.type_of)
    d.reply(req, Code.CONTENT, tlv, content.TLV)
    [(_, resp)] = app.up()
    assert resp["data"]["content"] == [{"path": "/3/0/9", "value": 80},
                                       {"path": "/3/0/7/0", "value": 3300}]


def test_every_command_makes_its_request(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    app.up()
    cases: list[tuple[str, dict[str, Any], int]] = [
        ("discover", {"path": "/3/0"}, Code.GET),
        ("write", {"path": "/3/0/13", "type": "Time", "value": 1700000000}, Code.PUT),
        ("write", {"basePath": "/1/0", "content": [{"path": "1", "value": 60},
                                                   {"path": "7", "value": "U"}]}, Code.POST),
        ("write-attr", {"path": "/3/0/9", "pmin": 5, "pmax": 60}, Code.PUT),
        ("execute", {"path": "/3/0/4", "args": "'now'"}, Code.POST),
        ("create", {"basePath": "/5", "content": [{"path": "/5/1/1", "value": "coap://x"}]},
         Code.POST),
        ("delete", {"path": "/5/1"}, Code.DELETE),
    ]
    for i, (msg_type, data, code) in enumerate(cases):
        app.command(10 + i, msg_type, **data)
        [req] = d.take()
        assert req.code == code, msg_type
        if msg_type == "discover":
            assert req.opt.accept == content.LINK_FORMAT
            d.reply(req, Code.CONTENT, b"</3/0/0>,</3/0/9>;pmax=60", content.LINK_FORMAT)
        elif msg_type == "write" and code == Code.PUT:
            assert req.payload == b"1700000000" and req.opt.content_format == content.TEXT
            d.reply(req, Code.CHANGED)
        elif msg_type == "write":
            got = content.decode_tlv(req.payload, "/1/0", d.channel.settings.model.type_of)
            assert got == [{"path": "/1/0/1", "value": 60}, {"path": "/1/0/7", "value": "U"}]
            d.reply(req, Code.CHANGED)
        elif msg_type == "write-attr":
            assert set(req.opt.uri_query) == {"pmin=5", "pmax=60"} and not req.payload
            d.reply(req, Code.CHANGED)
        elif msg_type == "execute":
            assert req.payload == b"'now'"
            d.reply(req, Code.CHANGED)
        elif msg_type == "create":
            assert req.opt.uri_path == ("5",)
            d.reply(req, Code.CREATED)
        else:
            d.reply(req, Code.DELETED)
        [(_, resp)] = app.up()
        assert resp["reqID"] == 10 + i and resp["msgType"] == msg_type
        if msg_type == "discover":
            assert resp["data"]["content"] == ["</3/0/0>", "</3/0/9>;pmax=60"]
    assert resp["data"]["code"] == "2.02"


def test_observe_notify_cancel(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    app.up()
    app.command(5, "observe", path="/3/0/9")
    [req] = d.take()
    assert req.opt.observe == 0
    d.reply(req, Code.CONTENT, b"80", content.TEXT, observe=1)
    [(topic, resp)] = app.up()
    assert topic == "up/resp" and resp["data"]["content"] == [{"path": "/3/0/9", "value": 80}]
    for seq, level in ((2, b"79"), (3, b"78")):
        n = make(NON, Code.CONTENT, 900 + seq, req.token, level)
        n.opt.observe = seq
        n.opt.content_format = content.TEXT
        d.send(n)
    notes = app.up()
    assert [(t, b["msgType"], b["seqNum"], b["reqID"], b["data"]["content"][0]["value"])
            for t, b in notes] == [("up/notify", "notify", 2, 5, 79),
                                   ("up/notify", "notify", 3, 5, 78)]
    assert all(b["data"]["reqPath"] == "/3/0/9" for _, b in notes)
    app.command(6, "cancel-observe", path="/3/0/9")
    [req2] = d.take()
    assert req2.opt.observe == 1 and req2.token == req.token
    d.reply(req2, Code.CONTENT, b"78", content.TEXT)
    assert app.up()[0][1]["msgType"] == "cancel-observe"


def test_senml_and_oma_json_reads(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    app.up()
    senml = [{"bn": "/3/0/", "n": "0", "vs": "ACME"}, {"n": "9", "v": 55},
             {"n": "20", "vb": False}]
    for i, (fmt, payload) in enumerate([
        (content.SENML_JSON, json.dumps(senml).encode()),
        (content.SENML_CBOR, cbor2.dumps([{-2: "/3/0/", 0: "0", 3: "ACME"}, {0: "9", 2: 55},
                                          {0: "20", 4: False}])),
        (content.OMA_JSON, json.dumps({"bn": "/3/0/", "e": [
            {"n": "0", "sv": "ACME"}, {"n": "9", "v": 55}, {"n": "20", "bv": False}]}).encode()),
    ]):
        app.command(i, "read", path="/3/0")
        [req] = d.take()
        d.reply(req, Code.CONTENT, payload, fmt)
        [(_, resp)] = app.up()
        assert resp["data"]["content"] == [{"path": "/3/0/0", "value": "ACME"},
                                           {"path": "/3/0/9", "value": 55},
                                           {"path": "/3/0/20", "value": False}], fmt


def test_timeout_and_one_at_a_time(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    app.up()
    app.command(1, "read", path="/3/0/0")
    app.command(2, "read", path="/3/0/1")
    first = d.take()
    assert len(first) == 1  # the second waits
    d.advance(2 + 4 + 8 + 16 + 32 + 1)
    resends = d.take()
    assert [m.mid for m in resends[:4]] == [first[0].mid] * 4
    [(_, resp)] = app.up()
    assert resp["reqID"] == 1 and resp["data"]["code"] == "coap_timeout"
    assert resends[-1].opt.uri_path == ("3", "0", "1")


def test_separate_response(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    app.up()
    app.command(1, "read", path="/3/0/0")
    [req] = d.take()
    d.send(make(ACK, Code.EMPTY, req.mid))
    d.advance(30)
    assert app.up() == []
    late = make(CON, Code.CONTENT, 4242, req.token, b"late")
    d.send(late)
    [ack] = d.take()
    assert ack.mtype == ACK and ack.mid == 4242
    [(_, resp)] = app.up()
    assert resp["data"]["content"][0]["value"] == "late"


def test_update_deregister_lifetime(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    app.up()
    d.advance(200)
    d.request(Code.POST, ("rd", "dev1"), ("lt=100",))
    assert d.take()[0].code == Code.CHANGED
    [(topic, ev)] = app.up()
    assert topic == "up/update" and ev["data"]["lt"] == 100
    d.advance(99)
    assert d.closed is None
    d.advance(2)
    assert d.closed == "lifetime expired" and "dev1" not in node.sessions
    d2, _ = registered(node, clock)
    d2.request(Code.DELETE, ("rd", "dev1"))
    assert d2.take()[0].code == Code.DELETED and d2.closed == "deregistered"


def test_queue_mode_buffers_until_update(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock, ("Q",))
    app.up()
    d.advance(60)  # past the 22 s window: asleep
    app.command(1, "read", path="/3/0/0")
    assert d.take() == []
    d.request(Code.POST, ("rd", "dev1"))
    msgs = d.take()
    assert msgs[0].code == Code.CHANGED and msgs[1].code == Code.GET


def test_bad_commands_and_malformed(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    app.up()
    app.command(1, "frobnicate", path="/3/0")
    app.command(2, "read", path="/x/y")
    assert [b["data"]["code"] for _, b in app.up()] == ["4.00", "4.00"]
    assert d.take() == []
    d._run(d.channel.handle_datagram(b"\x41\x02\x00\x09T\xd0"))
    [r] = d.take()
    assert r.code == Code.BAD_REQUEST and d.closed is None


def test_register_refused_without_ep(node: Node, clock: VirtualScheduler) -> None:
    d = Device(node, clock, Lwm2mSettings())
    d.request(Code.POST, ("rd",), ("lt=60",), LINKS)
    assert d.take()[0].code == Code.BAD_REQUEST
    d.advance(31)
    assert d.closed == "did not register"


def test_block2_answer_collected(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    app.up()
    app.command(1, "read", path="/3/0/0")
    [req] = d.take()
    body = b"x" * 2500
    num = 0
    while True:
        chunk = body[num * 1024 : (num + 1) * 1024]
        more = (num + 1) * 1024 < len(body)
        r = make(ACK, Code.CONTENT, req.mid, req.token, chunk)
        r.opt.content_format = content.TEXT
        r.opt.block2 = Block(num, more, 6)
        d.send(r)
        if not more:
            break
        [req] = d.take()
        num += 1
        assert req.opt.block2 == Block(num, False, 6) and req.opt.uri_path == ("3", "0", "0")
        assert app.up() == []
    [(_, resp)] = app.up()
    assert resp["data"]["content"] == [{"path": "/3/0/0", "value": "x" * 2500}]


def test_block1_write_of_a_large_opaque(node: Node, clock: VirtualScheduler) -> None:
    import base64

    d, app = registered(node, clock)
    app.up()
    package = bytes(range(256)) * 10  # 2560 bytes: three blocks
    app.command(1, "write", path="/5/0/0", value=base64.b64encode(package).decode())
    got = b""
    while True:
        [req] = d.take()
        assert req.code == Code.PUT and req.opt.content_format == content.OPAQUE
        b1 = req.opt.block1
        assert b1.block_number * 1024 == len(got)
        got += req.payload
        if not b1.more:
            d.reply(req, Code.CHANGED)
            break
        r = make(ACK, Code.CONTINUE, req.mid, req.token)
        r.opt.block1 = b1
        d.send(r)
        assert app.up() == []
    assert got == package
    [(_, resp)] = app.up()
    assert resp["data"]["code"] == "2.04"


def test_send_senml_json_and_cbor(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered(node, clock)
    app.up()
    body = json.dumps([{"bn": "/3/0/", "n": "9", "v": 87, "bt": 1700000000},
                       {"n": "0", "vs": "ACME"}]).encode()
    m = make(CON, Code.POST, 899, b"s", body)
    m.opt.uri_path = ("dp",)
    m.opt.content_format = content.SENML_JSON
    d.send(m)
    [r] = d.take()
    assert r.code == Code.CHANGED and r.mid == 899
    [(topic, ev)] = app.up()
    assert topic == "up/send" and ev == {"msgType": "send", "data": {"reqPath": "/dp", "content": [
        {"path": "/3/0/9", "value": 87, "time": 1700000000},
        {"path": "/3/0/0", "value": "ACME", "time": 1700000000}]}}
    cbor = cbor2.dumps([{-2: "/3/0/", 0: "9", 2: 12}])
    m = make(CON, Code.POST, 900, b"s", cbor)
    m.opt.uri_path = ("dp",)
    m.opt.content_format = content.SENML_CBOR
    d.send(m)
    [r] = d.take()
    assert r.code == Code.CHANGED
    [(_, ev)] = app.up()
    assert ev["data"]["content"][0]["path"] == "/3/0/9" and ev["data"]["content"][0]["value"] == 12


def test_send_refusals(node: Node, clock: VirtualScheduler) -> None:
    stranger = Device(node, clock, Lwm2mSettings())
    m = make(CON, Code.POST, 1, b"s", b"[]")
    m.opt.uri_path = ("dp",)
    m.opt.content_format = content.SENML_JSON
    stranger.send(m)
    assert stranger.take()[0].code == Code.NOT_FOUND
    d, app = registered(node, clock)
    app.up()
    for mid, (fmt, body) in enumerate([(content.TEXT, b"1"), (content.SENML_JSON, b"{nope")]):
        m = make(CON, Code.POST, 100 + mid, b"s", body)
        m.opt.uri_path = ("dp",)
        m.opt.content_format = fmt
        d.send(m)
    assert [r.code for r in d.take()] == [Code.UNSUPPORTED_CONTENT_FORMAT, Code.BAD_REQUEST]
    assert app.up() == [] and d.channel.state is State.REGISTERED


LINKS_11 = b'</>;rt="oma.lwm2m";ct="110 112 11542",</1/0>,</3/0>'


def registered_11(node: Node, clock: VirtualScheduler, links: bytes = LINKS_11
                  ) -> tuple[Device, Mqtt]:
    app = Mqtt(node, clock, "dev1")
    d = Device(node, clock, Lwm2mSettings())
    d.request(Code.POST, ("rd",), ("ep=dev1", "lt=300", "lwm2m=1.1", "b=U"), links)
    [r] = d.take()
    assert r.code == Code.CREATED
    app.up()
    return d, app


def test_composite_read_write_observe(node: Node, clock: VirtualScheduler) -> None:
    d, app = registered_11(node, clock)
    app.command(1, "read-composite", paths=["/3/0/0", "1/0/1"])
    [req] = d.take()
    assert req.code == Code.FETCH and req.opt.uri_path == ()
    assert req.opt.content_format == content.SENML_JSON == req.opt.accept
    assert json.loads(req.payload) == [{"n": "/3/0/0"}, {"n": "/1/0/1"}]
    d.reply(req, Code.CONTENT, b'[{"n":"/3/0/0","vs":"ACME"},{"n":"/1/0/1","v":300}]',
            content.SENML_JSON)
    [(topic, resp)] = app.up()
    assert topic == "up/resp" and resp == {"reqID": 1, "msgType": "read-composite", "data": {
        "reqPath": "/", "paths": ["/3/0/0", "/1/0/1"], "code": "2.05", "codeMsg": "content",
        "content": [{"path": "/3/0/0", "value": "ACME"}, {"path": "/1/0/1", "value": 300}]}}
    app.command(2, "write-composite", content=[{"path": "/3/0/14", "value": "+02:00"},
                                                {"path": "/1/0/1", "value": 60}])
    [req] = d.take()
    assert req.code == Code.iPATCH and req.opt.content_format == content.SENML_JSON
    assert json.loads(req.payload) == [{"n": "/3/0/14", "vs": "+02:00"}, {"n": "/1/0/1", "v": 60}]
    d.reply(req, Code.CHANGED)
    [(_, resp)] = app.up()
    assert resp["msgType"] == "write-composite" and resp["data"]["code"] == "2.04"
    app.command(3, "observe-composite", paths=["/3/0/9", "/3/0/13"])
    [req] = d.take()
    assert req.code == Code.FETCH and req.opt.observe == 0
    d.reply(req, Code.CONTENT, b'[{"n":"/3/0/9","v":80},{"n":"/3/0/13","v":1}]',
            content.SENML_JSON, observe=7)
    [(_, resp)] = app.up()
    assert resp["data"]["code"] == "2.05" and len(resp["data"]["content"]) == 2
    note = make(NON, Code.CONTENT, 4000, req.token, b'[{"n":"/3/0/9","v":79}]')
    note.opt.observe, note.opt.content_format = 8, content.SENML_JSON
    d.send(note)
    [(topic, ev)] = app.up()
    assert topic == "up/notify" and ev["reqID"] == 3 and ev["seqNum"] == 8
    assert ev["data"]["paths"] == ["/3/0/9", "/3/0/13"]
    assert ev["data"]["content"] == [{"path": "/3/0/9", "value": 79}]
    app.command(4, "cancel-observe-composite", paths=["/3/0/9", "/3/0/13"])
    [cancel] = d.take()
    assert cancel.code == Code.FETCH and cancel.opt.observe == 1 and cancel.token == req.token
    d.reply(cancel, Code.CONTENT, b"[]", content.SENML_JSON)
    [(_, resp)] = app.up()
    assert resp["msgType"] == "cancel-observe-composite"
    app.command(5, "read-composite", paths=[])
    app.command(6, "write-composite", content=[{"path": "/3", "value": 1}])
    assert [r["data"]["code"] for _, r in app.up()] == ["4.00", "4.00"] and d.take() == []


def test_writes_in_senml_for_a_11_device_that_reads_it(node: Node, clock: VirtualScheduler
                                                         ) -> None:
    d, app = registered_11(node, clock)
    app.command(1, "write", basePath="/1/0", content=[{"path": "1", "value": 60},
                                                      {"path": "7", "value": "UQ"}])
    [req] = d.take()
    assert req.code == Code.POST and req.opt.content_format == content.SENML_JSON
    assert json.loads(req.payload) == [{"n": "/1/0/1", "v": 60}, {"n": "/1/0/7", "vs": "UQ"}]
    d.reply(req, Code.CHANGED)
    app.command(2, "create", basePath="/5", content=[{"path": "/5/0/1", "value": "coap://x"}])
    [req] = d.take()
    assert req.opt.content_format == content.SENML_JSON
    assert json.loads(req.payload) == [{"n": "/5/0/1", "vs": "coap://x"}]


def test_cbor_only_11_device_and_11_without_formats(node: Node, clock: VirtualScheduler
                                                    ) -> None:
    d, app = registered_11(node, clock, b'</>;rt="oma.lwm2m";ct=112,</3/0>')
    app.command(1, "write", basePath="/1/0", content=[{"path": "1", "value": 60}])
    [req] = d.take()
    assert req.opt.content_format == content.SENML_CBOR
    assert cbor2.loads(req.payload) == [{0: "/1/0/1", 2: 60}]
    d.reply(req, Code.CHANGED)
    app.up()
    d2, app2 = registered_11(node, clock, b"</>;rt=\"oma.lwm2m\",</3/0>")
    app2.command(2, "write", basePath="/1/0", content=[{"path": "1", "value": 60}])
    [req] = d2.take()
    assert req.opt.content_format == content.TLV  # no ct: TLV, as for 1.0


def test_block1_in_the_smaller_blocks_the_device_asks_for(node: Node, clock: VirtualScheduler
                                                          ) -> None:
    import base64

    d, app = registered(node, clock)
    app.up()
    package = bytes(range(256)) * 5  # 1280 bytes
    app.command(1, "write", path="/5/0/0", value=base64.b64encode(package).decode())
    [req] = d.take()
    assert req.opt.block1 == Block(0, True, 6) and len(req.payload) == 1024
    got = bytes(req.payload)
    r = make(ACK, Code.CONTINUE, req.mid, req.token)
    r.opt.block1 = Block(0, True, 2)  # 64-byte blocks from now on, please
    d.send(r)
    sizes = []
    while True:
        [req] = d.take()
        b1 = req.opt.block1
        assert b1.size_exponent == 2 and b1.block_number * 64 == len(got)
        sizes.append(len(req.payload))
        got += req.payload
        if not b1.more:
            d.reply(req, Code.CHANGED)
            break
        r = make(ACK, Code.CONTINUE, req.mid, req.token)
        r.opt.block1 = b1
        d.send(r)
    assert got == package and sizes == [64] * 4
    [(_, resp)] = app.up()
    assert resp["data"]["code"] == "2.04"


def test_block2_notification_fetched_and_published_whole(node: Node, clock: VirtualScheduler
                                                         ) -> None:
    d, app = registered(node, clock)
    app.up()
    app.command(1, "observe", path="/3/0/0")
    [req] = d.take()
    d.reply(req, Code.CONTENT, b"small", content.TEXT, observe=3)
    app.up()
    app.command(2, "read", path="/3/0/1")  # waits behind the notification's blocks
    [read] = d.take()
    body = b"y" * 600
    note = make(CON, Code.CONTENT, 777, req.token, body[:256])
    note.opt.observe, note.opt.content_format = 4, content.TEXT
    note.opt.block2 = Block(0, True, 4)
    d.send(note)
    [ack] = d.take()
    assert ack.mtype == ACK and ack.mid == 777
    assert app.up() == []
    d.reply(read, Code.CONTENT, b"m", content.TEXT)
    [(_, resp)] = app.up()
    assert resp["reqID"] == 2
    num = 1
    while True:
        [nxt] = d.take()
        assert nxt.code == Code.GET and nxt.opt.observe is None
        assert nxt.opt.uri_path == ("3", "0", "0") and nxt.opt.block2 == Block(num, False, 4)
        more = (num + 1) * 256 < len(body)
        r = make(ACK, Code.CONTENT, nxt.mid, nxt.token, body[num * 256 : (num + 1) * 256])
        r.opt.content_format = content.TEXT
        r.opt.block2 = Block(num, more, 4)
        d.send(r)
        if not more:
            break
        num += 1
    [(topic, ev)] = app.up()
    assert topic == "up/notify" and ev["reqID"] == 1 and ev["seqNum"] == 4
    assert ev["data"]["content"] == [{"path": "/3/0/0", "value": "y" * 600}]


def test_413_with_block1_resends_in_the_size_the_device_takes(node: Node, clock: VirtualScheduler
                                                              ) -> None:
    import base64

    d, app = registered(node, clock)
    app.up()
    package = bytes(range(200))  # fits our block, not the device's 64 bytes
    app.command(1, "write", path="/5/0/0", value=base64.b64encode(package).decode())
    [req] = d.take()
    assert req.opt.block1 is None and len(req.payload) == 200
    r = make(ACK, Code.REQUEST_ENTITY_TOO_LARGE, req.mid, req.token)
    r.opt.block1 = Block(0, True, 2)
    d.send(r)
    got = b""
    while True:
        [req] = d.take()
        b1 = req.opt.block1
        assert b1.size_exponent == 2 and b1.block_number * 64 == len(got)
        got += req.payload
        if not b1.more:
            d.reply(req, Code.CHANGED)
            break
        r = make(ACK, Code.CONTINUE, req.mid, req.token)
        r.opt.block1 = b1
        d.send(r)
    assert got == package
    [(_, resp)] = app.up()
    assert resp["data"]["code"] == "2.04"


def test_register_with_block1_links(node: Node, clock: VirtualScheduler) -> None:
    app = Mqtt(node, clock, "dev1")
    d = Device(node, clock, Lwm2mSettings())
    links = b'</>;rt="oma.lwm2m",' + b",".join(b"</%d/0>" % i for i in range(3, 40))
    chunks = [links[i : i + 64] for i in range(0, len(links), 64)]
    for num, chunk in enumerate(chunks):
        d.mid += 1
        m = make(CON, Code.POST, d.mid, b"r", chunk)
        m.opt.uri_path = ("rd",)
        m.opt.uri_query = ("ep=dev1", "lt=300")
        m.opt.block1 = Block(num, num + 1 < len(chunks), 2)
        d.send(m)
        [r] = d.take()
        if num + 1 < len(chunks):
            assert r.code == Code.CONTINUE and r.opt.block1 == Block(num, True, 2)
    assert r.code == Code.CREATED and r.opt.block1 == Block(len(chunks) - 1, False, 2)
    [(_, ev)] = app.up()
    assert len(ev["data"]["objectList"]) == 37
    d.mid += 1
    m = make(CON, Code.POST, d.mid, b"r", b"x" * 64)
    m.opt.uri_path = ("dp",)
    m.opt.block1 = Block(3, True, 2)  # no block 0 before it
    d.send(m)
    assert d.take()[0].code == Code.REQUEST_ENTITY_INCOMPLETE


def test_bootstrap_then_register(node: Node, clock: VirtualScheduler) -> None:
    from protocols.lwm2m.bootstrap import BootstrapPlan

    plan = BootstrapPlan(True, [
        ("/0/1", [{"path": "0", "value": "coap://127.0.0.1:5783"}, {"path": "1", "value": False},
                  {"path": "2", "value": 3}, {"path": "10", "value": 123}]),
        ("/1/1", [{"path": "0", "value": 123}, {"path": "1", "value": 300},
                  {"path": "7", "value": "U"}]),
    ])
    app = Mqtt(node, clock, "dev1")
    d = Device(node, clock, Lwm2mSettings(bootstrap={"dev1": plan}))
    d.request(Code.POST, ("bs",), ("ep=other",))
    assert d.take()[0].code == Code.BAD_REQUEST  # no plan for it, no "*"
    d.request(Code.POST, ("bs",), ("ep=dev1",))
    changed, delete = d.take()
    assert changed.code == Code.CHANGED and "idle" not in d.timers
    assert delete.code == Code.DELETE and delete.opt.uri_path == ()
    d.reply(delete, Code.DELETED)
    [w0] = d.take()
    model = d.channel.settings.model
    assert w0.code == Code.PUT and w0.opt.uri_path == ("0", "1")
    assert w0.opt.content_format == content.TLV
    assert content.decode_tlv(w0.payload, "/0/1", model.type_of)[0] == {
        "path": "/0/1/0", "value": "coap://127.0.0.1:5783"}
    d.reply(w0, Code.CHANGED)
    [w1] = d.take()
    assert w1.opt.uri_path == ("1", "1")
    d.reply(w1, Code.CHANGED)
    [finish] = d.take()
    assert finish.code == Code.POST and finish.opt.uri_path == ("bs",)
    d.reply(finish, Code.CHANGED)
    assert node.metrics.get("lwm2m.bootstrap.finished") == 1
    assert d.channel.state is State.NEW and "idle" in d.timers
    assert app.up() == []  # nothing on MQTT while bootstrapping
    d.request(Code.POST, ("rd",), ("ep=dev1", "lt=300"), LINKS)
    assert d.take()[0].code == Code.CREATED
    [(_, ev)] = app.up()
    assert ev["msgType"] == "register"


def test_bootstrap_failure_counted(node: Node, clock: VirtualScheduler) -> None:
    from protocols.lwm2m.bootstrap import BootstrapPlan

    d = Device(node, clock, Lwm2mSettings(bootstrap={"*": BootstrapPlan(False, [
        ("/1/1", [{"path": "1", "value": 300}])])}))
    d.request(Code.POST, ("bs",), ("ep=any",))
    _, w = d.take()
    d.reply(w, Code.BAD_REQUEST)
    [finish] = d.take()
    d.reply(finish, Code.CHANGED)
    assert node.metrics.get("lwm2m.bootstrap.failed") == 1
    assert d.channel.state is State.NEW
