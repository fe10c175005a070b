"""The stream listener's connections share one per-listener ``StreamSite`` (limits,
factory, gate, loop): one slot per connection. Real loopback sockets."""

from __future__ import annotations

import asyncio

from gateway.net.stream import ListenerLimits, StreamShell, start_stream_listener
from protocols.effects import Effect


class Quiet:
    def connection_made(self) -> list[Effect]:
        return []

    def handle_data(self, data: bytes) -> list[Effect]:
        return []

    def on_timer(self, name: str) -> list[Effect]:
        return []

    def connection_lost(self) -> None:
        pass

    def deliver(self, deliveries: object) -> list[Effect]:
        return []

    def release(self, packet_id: int) -> list[Effect]:
        return []

    def kick(self, reason_code: int) -> list[Effect]:
        return []


def test_connections_of_a_listener_share_one_site() -> None:
    async def main() -> None:
        limits = ListenerLimits("tcp:t")
        shells: list[StreamShell] = []
        two = asyncio.Event()

        def factory(shell: StreamShell, peer: tuple[str, int] | None) -> Quiet:
            shells.append(shell)
            if len(shells) == 2:
                two.set()
            return Quiet()

        server = await start_stream_listener("127.0.0.1:0", limits, factory)
        port = server.sockets[0].getsockname()[1]
        writers = []
        try:
            for _ in range(2):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writers.append(writer)
            await asyncio.wait_for(two.wait(), 10)
            a, b = shells
            assert a.site is b.site
            assert a.limits is limits and a.factory is factory
            assert a.gate is None and a.loop is asyncio.get_running_loop()
            assert limits.current == 2
            assert not hasattr(a, "__dict__")  # slots only
        finally:
            for writer in writers:
                writer.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())
