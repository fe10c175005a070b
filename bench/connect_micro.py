"""The CONNECT -> CONNACK -> DISCONNECT path of gatewayd in-process, without sockets.

    .venv/bin/python -m bench.connect_micro clean 22000            # µs per connect
    .venv/bin/python -m bench.connect_micro persistent 12000 --profile
    PYTHONPATH=/path/to/other/tree .venv/bin/python -m bench.connect_micro clean 22000

A real :class:`gateway.app.Gateway` (the default configuration of ``bench.run``'s
gatewayd: durable store, $SYS, auto-subscribe, bans, built-in authentication) is started
on this process's event loop; its MQTT listener's stream shell is then fed through a
fake transport (no socket, no kernel, no uvloop I/O): 50 CONNECTs (3.1.1, new client ids,
clean or persistent), one loop turn, their DISCONNECTs and the connections' ends, one
loop turn, and so on. The figure is this process's CPU time per connect (the loop thread
and, for persistent sessions, the store's writer thread), after 2,000 connects of
warm-up; with ``--profile`` cProfile's top functions follow (their times are inflated,
their call counts exact). The garbage collector's share is printed too (per
generation), with the longest full collection; ``--freeze`` installs the collector
policy ``gatewayd`` runs with once it serves (:mod:`gateway.gcpolicy`: the start-up
objects, and the survivors of every full collection, frozen). Run it pinned
(``taskset -c 0``) and repeat: it measures the Python side of a connect, which
``bench.run``'s connrate scenarios add the kernel's and uvloop's work to.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import wire


class FakeTransport:
    """What a stream shell uses of a transport; writes go nowhere."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.closing = False

    def get_extra_info(self, key: str, default: Any = None) -> Any:
        if key == "peername":
            return ("127.0.0.1", self.port)
        if key == "sockname":
            return ("127.0.0.1", 1883)
        return default

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def measure(conf: Path, clean: bool, count: int, profile: bool, freeze: bool) -> None:
    from gateway.app import Gateway
    from gateway.config.loader import load_config
    from gateway.frontends import FRONTENDS
    from gateway.gcpolicy import GcPolicy
    from gateway.net.stream import StreamShell, StreamSite

    gateway = Gateway(load_config(conf))
    await gateway.start()
    policy = GcPolicy() if freeze else None
    if policy is not None:
        policy.install()
    assert gateway.assembly is not None
    frontend = next(f for f in FRONTENDS if f.protocol == "mqtt" and f.transport == "stream")
    spec = frontend.listeners(gateway.config)[0]
    limits: Any = gateway.listeners[spec.id].limits  # the listener's ListenerLimits
    site = StreamSite(
        limits,
        frontend.channel(gateway.assembly, spec, None),
        gateway.committer,
        asyncio.get_running_loop(),
    )
    packets = [wire.connect(f"m{i}", 60, clean) for i in range(count)]
    collections = {g: [0, 0.0] for g in range(3)}
    started = [0.0]
    longest = [0.0]  # seconds

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            c = collections[info["generation"]]
            c[0] += 1
            took = time.perf_counter() - started[0]
            c[1] += took
            if info["generation"] == 2:
                longest[0] = max(longest[0], took)

    async def run(lo: int, hi: int) -> None:
        for first in range(lo, hi, 50):
            shells = []
            for i in range(first, min(first + 50, hi)):
                shell = StreamShell(site)
                shell.connection_made(FakeTransport(10000 + i % 50000))  # type: ignore[arg-type]
                shell.data_received(packets[i])
                shells.append(shell)
            await asyncio.sleep(0)
            for shell in shells:
                shell.data_received(wire.DISCONNECT)
                shell.connection_lost(None)
            await asyncio.sleep(0)

    warm = min(2000, count // 2)
    await run(0, warm)
    profiler = cProfile.Profile() if profile else None
    gc.callbacks.append(on_gc)
    cpu0, loop0 = time.process_time(), time.thread_time()
    if profiler is not None:
        profiler.enable()
    await run(warm, count)
    if profiler is not None:
        profiler.disable()
    cpu1, loop1 = time.process_time(), time.thread_time()
    gc.callbacks.remove(on_gc)
    n = count - warm
    print(
        f"{'clean' if clean else 'persistent'}: {1e6 * (cpu1 - cpu0) / n:.1f} µs of CPU per "
        f"connect ({1e6 * (loop1 - loop0) / n:.1f} on the loop thread), {n} connects"
    )
    print("garbage collections (count, µs per connect): " + ", ".join(
        f"gen{g} {c[0]} {1e6 * c[1] / n:.2f}" for g, c in collections.items())
        + f"; longest full collection {1e3 * longest[0]:.1f} ms")
    await gateway.stop()
    if policy is not None:
        policy.close()
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(35)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.connect_micro",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("sessions", choices=["clean", "persistent"])
    ap.add_argument("count", type=int, nargs="?", default=22000, help="connects (> 100)")
    ap.add_argument("--profile", action="store_true", help="cProfile the measured part")
    ap.add_argument("--freeze", action="store_true",
                    help="gatewayd's collector policy (gateway.gcpolicy)")
    args = ap.parse_args(argv)
    if args.count <= 100:
        ap.error("count must be more than 100")
    import uvloop

    tmp = Path(tempfile.mkdtemp(prefix="connect-micro-"))
    try:
        conf = tmp / "gateway.toml"
        conf.write_text(
            f'[node]\nname = "bench@127.0.0.1"\ndata_dir = "{tmp / "data"}"\n'
            '[listeners.tcp.default]\nbind = "127.0.0.1:0"\n'
            '[api]\nbind = "127.0.0.1:0"\n[mqtt]\nmax_mqueue_len = 0\n'
        )
        uvloop.run(measure(conf, args.sessions == "clean", args.count, args.profile,
                           args.freeze))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
