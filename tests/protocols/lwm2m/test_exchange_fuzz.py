"""The exchange's promise under hypothesis: whatever a device answers (content in the
format asked, 4.06, 5.00, 4.05, 4.04, an empty ACK and nothing, nothing at all), every
command gets exactly one answer on ``up/resp``, through format fallbacks, composite
operations carried out path by path and retransmissions."""

from __future__ import annotations

import json
from typing import Any

import cbor2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from protocols.coap.codec import ACK, CON, Code, Message, make
from protocols.lwm2m import content
from tests.protocols.lwm2m.test_channel import Device, registered_11

PATHS = st.sampled_from(["/3/0/9", "/3/0", "/3/0/0", "/1/0/1"])
ACCEPT = st.sampled_from([None, "tlv", "senml-json", "senml-cbor", "text", 112, "xml"])
COMMANDS = st.one_of(
    st.tuples(st.sampled_from(["read", "observe", "cancel-observe", "discover", "delete"]),
              st.fixed_dictionaries({"path": PATHS}, optional={"accept": ACCEPT})),
    st.tuples(st.sampled_from(["read-composite", "observe-composite",
                               "cancel-observe-composite"]),
              st.fixed_dictionaries({"paths": st.lists(PATHS, min_size=1, max_size=3)},
                                    optional={"accept": ACCEPT})),
    st.tuples(st.just("write-composite"),
              st.fixed_dictionaries({"content": st.lists(st.fixed_dictionaries(
                  {"path": st.sampled_from(["/3/0/14", "/1/0/1"]),
                   "value": st.sampled_from(["+01:00", 60])}), min_size=1, max_size=2)})),
    st.tuples(st.just("execute"), st.fixed_dictionaries({"path": st.just("/3/0/4")},
                                                        optional={"args": st.just("1")})),
)
ANSWERS = st.sampled_from(["content", "content", "content", "4.06", "5.00", "4.05", "4.04",
                           "empty-ack", "silence"])


def _body(req: Message) -> tuple[bytes, int]:
    fmt = req.opt.accept if req.opt.accept is not None else content.TEXT
    if fmt == content.SENML_CBOR:
        return cbor2.dumps([{0: "/3/0/9", 2: 7}]), fmt
    if fmt in (content.SENML_JSON, content.OMA_JSON):
        return json.dumps([{"n": "/3/0/9", "v": 7}]).encode(), content.SENML_JSON
    if fmt == content.TLV:
        return content.encode_tlv([{"path": "/3/0/9", "value": 7}], "/3/0"), fmt
    if fmt == content.LINK_FORMAT:
        return b"</3/0/9>", fmt
    return b"7", content.TEXT


def _act(d: Device, req: Message, answer: str) -> None:
    if answer == "silence":
        return
    if answer == "empty-ack":
        d.send(make(ACK, Code.EMPTY, req.mid))
        return
    code = {"4.06": Code.NOT_ACCEPTABLE, "5.00": Code.INTERNAL_SERVER_ERROR,
            "4.05": Code.METHOD_NOT_ALLOWED, "4.04": Code.NOT_FOUND}.get(answer)
    if code is not None:
        d.reply(req, code)
    elif req.code in (Code.GET, Code.FETCH):
        payload, fmt = _body(req)
        d.reply(req, Code.CONTENT, payload, fmt,
                observe=1 if req.opt.observe == 0 else None)
    else:
        d.reply(req, Code.CHANGED if req.code != Code.DELETE else Code.DELETED)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(COMMANDS, min_size=1, max_size=5), st.lists(ANSWERS, min_size=60,
                                                             max_size=60),
       st.sampled_from([b'</>;rt="oma.lwm2m";ct=112,</3/0>', b'</>;rt="oma.lwm2m",</3/0>']))
def test_every_command_is_answered_exactly_once(
        commands: list[tuple[str, dict[str, Any]]], answers: list[str], links: bytes) -> None:
    clock = VirtualScheduler()
    node = Node(CoreSettings(), clock)
    d, app = registered_11(node, clock, links)
    for i, (msg_type, data) in enumerate(commands):
        app.command(i, msg_type, **data)
    pending = iter(answers)
    published: list[tuple[str, dict[str, Any]]] = []
    for _ in range(400):
        reqs = [m for m in d.take() if m.mtype == CON and m.code.is_request()]
        published += app.up()
        answered = {b["reqID"] for t, b in published if t == "up/resp"}
        if not reqs:
            if len(answered) == len(commands):
                break
            d.advance(30)  # retransmissions and timeouts
            continue
        for req in reqs:
            _act(d, req, next(pending, "content"))
    published += app.up()
    ids = sorted(b["reqID"] for t, b in published if t == "up/resp")
    assert ids == list(range(len(commands))), (ids, commands)
    for t, b in published:
        if t == "up/resp" and b["msgType"] in ("read-composite", "read") and \
                b["data"]["code"] == "2.05":
            assert isinstance(b["data"]["content"], list)
