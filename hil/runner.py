"""One scenario run against one unit: phases, fault schedule, sampling, progress.

Phases (each a ``phase`` record): ``start`` -> ``boot`` (power on, wait until the unit
answers) -> ``connect`` (collector, commander, then every device, spread over ``ramp``)
-> ``publishing`` (for ``duration``; faults fire at their ``at``) -> ``settle`` (no new
messages; wait up to ``settle`` for deliveries still owed and for the bridge's outbox to
empty) -> ``stop``. The runner never judges: it only records; :mod:`hil.expectations`
reads the records afterwards, so a run interrupted at any point still leaves evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hil.drivers.common import api_get
from hil.faults.upstream import Upstream
from hil.records import Recorder
from hil.scenario import (
    DiskFull,
    Group,
    Network,
    PowerCut,
    ProcessKill,
    Scenario,
    UpstreamOutage,
)
from hil.simulators.base import Ctx, Fleet
from hil.simulators.coap import CoapFleet
from hil.simulators.control import Collector, Commander, UpstreamCollector
from hil.simulators.lwm2m import Lwm2mFleet
from hil.simulators.mqtt import MqttFleet
from hil.simulators.mqttsn import MqttSnFleet
from hil.simulators.paho_async import misc_loop
from hil.unit import Unit, Unsupported

FLEETS: dict[str, type[Fleet]] = {
    "mqtt": MqttFleet, "mqtt-sn": MqttSnFleet, "coap": CoapFleet, "lwm2m": Lwm2mFleet,
}


@dataclass
class RunInfo:
    run: str
    records: Path
    started: float
    ended: float = 0.0
    unsupported: list[str] = field(default_factory=list)
    rig_cpu: float = 0.0  # CPU seconds used by the rig process during the run
    devices: int = 0


IN_FLIGHT_S = 5.0  # settle waits for acks of what was sent this close to the stop


class _Tracking(Recorder):
    """A recorder that also keeps, in memory, what is still owed (for an early settle)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.need: dict[str, dict[str, Any]] = {}
        self.sent_at: dict[str, float] = {}  # message id -> monotonic time it was sent
        self.got: set[tuple[str, str]] = set()

    def __call__(self, event: str, /, **fields: Any) -> None:
        super().__call__(event, **fields)
        if event == "sent" and fields.get("q", 0) >= 1 and fields.get("p"):
            self.need[fields["m"]] = fields
            self.sent_at[fields["m"]] = time.monotonic()
        elif event == "recv":
            self.got.add((fields["m"], fields["by"]))

    def owed(self, acked: set[str], upstream: bool) -> int:
        n = 0
        for mid in acked:
            ev = self.need.get(mid)
            if ev is None:
                continue
            by = ev["d"] if ev.get("k") == "cmd" else "collector"
            if (mid, by) not in self.got:
                n += 1
            if upstream and ev.get("k") == "tele" and (mid, "upstream") not in self.got:
                n += 1
        return n

    def unanswered(self, acked: set[str], since: float) -> int:
        """Messages sent at or after ``since`` whose acknowledgement has not come yet
        (in flight when publishing stopped: their PUBACK/PUBCOMP may still arrive, and
        then they are owed)."""
        return sum(1 for mid, t in self.sent_at.items() if t >= since and mid not in acked)


class Runner:
    def __init__(self, sc: Scenario, unit: Unit, run_dir: Path, *,
                 progress: Callable[[str], None] | None = None,
                 unit_env: dict[str, str] | None = None) -> None:
        self.sc, self.unit, self.run_dir = sc, unit, run_dir
        self.progress = progress or (lambda line: None)
        self.unit_env = dict(unit_env or {})
        self.run = secrets.token_hex(3)
        self.rec = _Tracking(run_dir / "records.jsonl")
        self.acked: set[str] = set()
        self.phase = "start"
        self.upstream: Upstream | None = None
        self.fleets: list[Fleet] = []
        self.info = RunInfo(self.run, self.rec.path, time.time(), devices=sc.device_count)
        self.bridge_queue: int | None = None
        self.loop_errors = 0

    def _record(self, event: str, /, **fields: Any) -> None:
        if event == "acked":
            self.acked.add(fields["m"])
        self.rec(event, **fields)

    def _phase(self, name: str, **fields: Any) -> None:
        self.phase = name
        # the rig's own CPU seconds so far: its cost per phase is in the records
        self._record("phase", name=name, cpu=round(time.process_time(), 3), **fields)

    # -- the run ------------------------------------------------------------------------
    def execute(self) -> RunInfo:
        cpu0 = time.process_time()
        try:
            asyncio.run(self._main())
        finally:
            self.info.ended = time.time()
            self.info.rig_cpu = time.process_time() - cpu0
            with contextlib.suppress(Exception):
                self.unit.teardown()
            if self.upstream is not None:
                self.upstream.stop()
            self.rec.close()
        return self.info

    async def _main(self) -> None:
        sc = self.sc
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._loop_error)
        pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="hil-connect")
        self._phase("start", devices=sc.device_count, scenario=sc.name, run=self.run)
        await asyncio.to_thread(self.unit.prepare, self.run_dir / "unit", {})
        ep = self.unit.endpoints()
        missing = sorted({_port_of(g) for g in sc.active} - set(ep.ports))
        if missing:
            raise Unsupported(f"this target exposes no {', '.join(missing)} port "
                              f"(it has {', '.join(sorted(ep.ports))})")
        env = dict(self.unit_env)
        if sc.bridge and sc.bridge.enable:
            self.upstream = Upstream(self.run_dir, ep.rig_host)
            await asyncio.to_thread(self.upstream.start)
            env.update({
                "GATEWAY_BRIDGES__MQTT__HIL__SERVER": f"{ep.rig_host}:{self.upstream.port}",
                "GATEWAY_BRIDGES__MQTT__HIL__RECONNECT__INITIAL": "0.5s",
                "GATEWAY_BRIDGES__MQTT__HIL__RECONNECT__MAX": "2s",
                "GATEWAY_BRIDGES__MQTT__HIL__FORWARDS":
                    f'[{{local = "hil/{self.run}/t/#", remote = "up/${{topic}}", '
                    f"qos = {sc.bridge.qos}}}]",
            })
        if env:
            self.unit.configure(env)
        self._phase("boot")
        self.unit.power_on()
        waited = await asyncio.to_thread(self.unit.wait_ready, max(60.0, sc.connect_timeout))
        self._record("note", text=f"unit ready {waited:.2f} s after power on")

        ctx = Ctx(self.run, ep, self._record, loop, pool)
        stop_misc = asyncio.Event()
        misc = loop.create_task(misc_loop(stop_misc))
        side = [g for g in sc.active if g.protocol == "lwm2m"]
        collector = Collector(ctx, side)
        commander = Commander(ctx, sc.active)
        collector.commander = commander
        upc = (UpstreamCollector(ctx, self.upstream.host, self.upstream.port)
               if self.upstream else None)
        sampler = loop.create_task(self._sampler(ctx))
        self._phase("connect")
        await collector.start()
        await commander.start()
        if upc:
            await upc.start()
        await asyncio.wait_for(collector.connected.wait(), sc.connect_timeout)
        for g in sc.active:
            fleet = FLEETS[g.protocol](ctx, g)
            self.fleets.append(fleet)
            await fleet.start(sc.ramp)
        deadline = time.monotonic() + sc.connect_timeout
        while time.monotonic() < deadline and self._connected() < sc.device_count:
            await asyncio.sleep(0.2)
        # LwM2M telemetry flows once the observe is in place; give it a moment
        self._phase("publishing", connected=self._connected())
        t0 = time.monotonic()
        ctx.publishing.set()
        faults = [loop.create_task(self._fault(i, f, t0)) for i, f in enumerate(sc.faults)]
        await asyncio.sleep(sc.duration)
        ctx.stopping.set()
        self._phase("settle")
        for i, res in enumerate(await asyncio.gather(*faults, return_exceptions=True)):
            if isinstance(res, BaseException):
                self.info.unsupported.append(f"fault {i} failed: {res!r}")
                self._record("note", text=f"fault {i} failed: {res!r}")
        settle_end = time.monotonic() + sc.settle
        # sends of the last seconds may still be acknowledged: wait for those too (older
        # unacknowledged ones were lost with a connection and are not waited for)
        in_flight_since = time.monotonic() - IN_FLIGHT_S
        while time.monotonic() < settle_end:
            owed = self.rec.owed(self.acked, upc is not None) + self.rec.unanswered(
                self.acked, in_flight_since)
            everyone = self._connected() >= sc.device_count
            if owed == 0 and everyone and self.bridge_queue in (None, 0):
                break
            await asyncio.sleep(0.5)
        self._phase("stop")
        if self.loop_errors:
            self._record("note", text=f"{self.loop_errors} errors in client library callbacks")
        for fleet in self.fleets:
            await fleet.stop()
        await commander.stop()
        collector.close()
        commander.close()
        if upc:
            upc.close()
        stop_misc.set()
        sampler.cancel()
        await asyncio.gather(misc, sampler, return_exceptions=True)
        pool.shutdown(wait=False, cancel_futures=True)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Errors inside client libraries' callbacks (aiocoap answering a request we gave
        up on, ...) go to the records, counted, instead of over the progress line."""
        self.loop_errors += 1
        if self.loop_errors <= 5:
            exc = context.get("exception")
            self._record("note", text=f"rig loop error: {context.get('message', '')} {exc!r}"[:300])

    def _connected(self) -> int:
        return sum(len(f.connected) for f in self.fleets)

    async def _sampler(self, ctx: Ctx) -> None:
        last = 0.0
        while True:
            rss = await asyncio.to_thread(self.unit.rss_bytes)
            sample: dict[str, Any] = {"rss": rss, "connected": self._connected(),
                                      "sent": ctx.sent, "acked": ctx.acked,
                                      "received": ctx.received}
            if self.upstream is not None:
                try:
                    bridges = await asyncio.to_thread(api_get, ctx.ep, "/api/v5/bridges")
                    q = _bridge_queue(bridges)
                    if q is not None:
                        self.bridge_queue = q
                        sample["bridge_queue"] = q
                except (OSError, ValueError):
                    pass
            self._record("sample", **sample)
            now = time.monotonic()
            if now - last >= 1.0:
                last = now
                self.progress(
                    f"[{self.phase}] devices {sample['connected']}/{self.sc.device_count} "
                    f"sent {ctx.sent} acked {ctx.acked} received {ctx.received}"
                    + (f" outbox {self.bridge_queue}" if self.bridge_queue is not None else "")
                    + (f" rss {rss / 2**20:.0f}MiB" if rss else ""))
            await asyncio.sleep(0.5)

    async def _fault(self, i: int, f: Any, t0: float) -> None:
        await asyncio.sleep(max(0.0, t0 + f.start(self.sc.duration) - time.monotonic()))
        u = self.unit
        label = f.kind
        if isinstance(f, Network):
            label = f"{f.mode}" + (f" {f.loss:g}%" if f.mode == "loss" else "") + (
                f" {f.delay * 1000:g}ms" if f.mode == "delay" else "")
        self._record("fault", kind=f.kind, i=i, label=label)
        try:
            if isinstance(f, PowerCut):
                await asyncio.to_thread(u.power_cut)
                await asyncio.sleep(f.off_for)
                await asyncio.to_thread(u.power_on)
            elif isinstance(f, ProcessKill):
                await asyncio.to_thread(u.kill_process)
            elif isinstance(f, Network):
                await asyncio.to_thread(u.network_fault, f.mode, f.loss, f.delay)
                await asyncio.sleep(f.for_)
                await asyncio.to_thread(u.network_heal)
            elif isinstance(f, DiskFull):
                what = await asyncio.to_thread(u.disk_fill)
                if what:
                    self._record("note", text=f"fault {i} (disk-full): {what}")
                await asyncio.sleep(f.for_)
                await asyncio.to_thread(u.disk_free)
            elif isinstance(f, UpstreamOutage):
                assert self.upstream is not None
                await asyncio.to_thread(self.upstream.stop)
                await asyncio.sleep(f.for_)
                await asyncio.to_thread(self.upstream.start)
        except Unsupported as e:
            self.info.unsupported.append(f"fault {i} ({f.kind}): {e}")
            self._record("note", text=f"fault {i} ({f.kind}) not made: {e}")
            self._record("heal", kind=f.kind, i=i)
            self._record("ready", i=i, after=0.0)
            return
        self._record("heal", kind=f.kind, i=i)
        healed = time.monotonic()
        try:
            await asyncio.to_thread(u.wait_ready, self.sc.expect.unit_back or 120.0)
            self._record("ready", i=i, after=round(time.monotonic() - healed, 3))
        except TimeoutError:
            self._record("note", text=f"unit did not answer after fault {i} ({f.kind})")


def _port_of(g: Group) -> str:
    if g.protocol == "mqtt":
        return {"tcp": "mqtt", "tls": "mqtts", "ws": "ws", "wss": "wss"}[g.mqtt_transport]
    return g.protocol.replace("-", "")


def _bridge_queue(bridges: object) -> int | None:
    """Total ``queue_len`` of ``GET /api/v5/bridges`` (``{"bridges": [...]}``)."""
    items = bridges.get("bridges") if isinstance(bridges, dict) else bridges
    if not isinstance(items, list):
        return None
    total = 0
    found = False
    for b in items:
        if isinstance(b, dict) and "queue_len" in b:
            total += int(b["queue_len"])
            found = True
    return total if found else None


def stderr_progress() -> Callable[[str], None]:
    tty = sys.stderr.isatty()
    last = [0.0]

    def show(line: str) -> None:
        if tty:
            sys.stderr.write("\r\x1b[K" + line)
            sys.stderr.flush()
        elif time.monotonic() - last[0] >= 5.0:
            last[0] = time.monotonic()
            print(line, file=sys.stderr, flush=True)

    return show


def cpu_count() -> int:
    return os.cpu_count() or 1
