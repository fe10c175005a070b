"""The listen backlog of stream listeners (``[listeners.<type>.<name>] backlog``):
validated in the configuration and handed to listen(2). The kernel's view of a listening
socket's queue limit is ``ss -ltn``'s Send-Q column (iproute2, a Debian package of
scripts/test); it is ``min(backlog, net.core.somaxconn)``. Real loopback sockets."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

import pytest

from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.config.listeners import DEFAULT_BACKLOG
from gateway.net.stream import ListenerLimits, start_stream_listener
from tests.gateway.net.test_stream import Quiet


def somaxconn() -> int:
    with open("/proc/sys/net/core/somaxconn") as f:
        return int(f.read())


def kernel_backlog(port: int) -> int:
    """The accept-queue limit the kernel holds for the listener on ``port``."""
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout.split()
    # State Recv-Q Send-Q Local Peer; for a listener Send-Q is the backlog
    assert out and out[0] == "LISTEN", out
    return int(out[2])


def listen_with(backlog: int | None, transport: str = "asyncio") -> int:
    async def main() -> int:
        kwargs: dict[str, Any] = {} if backlog is None else {"backlog": backlog}
        server = await start_stream_listener(
            "127.0.0.1:0", ListenerLimits("tcp:t"), lambda s, p: Quiet(),
            transport=transport, **kwargs,
        )
        try:
            return kernel_backlog(server.sockets[0].getsockname()[1])
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(main())


@pytest.mark.parametrize("transport", ["asyncio", "lean"])
def test_backlog_reaches_listen(transport: str) -> None:
    assert listen_with(700, transport) == min(700, somaxconn())
    assert listen_with(3, transport) == 3
    assert listen_with(None, transport) == min(DEFAULT_BACKLOG, somaxconn())


def test_default_backlog_is_not_asyncios_100() -> None:
    # asyncio's and uvloop's create_server default is 100: a storm of reconnects overflows it
    assert GatewayConfig().listeners.tcp["default"].backlog == DEFAULT_BACKLOG
    assert listen_with(None) == min(DEFAULT_BACKLOG, somaxconn()) > 100


def test_backlog_from_configuration() -> None:
    c = load_config(
        None,
        environ={
            "GATEWAY_LISTENERS__TCP__DEFAULT__BACKLOG": "1024",
            "GATEWAY_LISTENERS__WS__DEFAULT__BIND": "127.0.0.1:0",
            "GATEWAY_LISTENERS__WS__DEFAULT__BACKLOG": "50",
        },
    )
    assert c.listeners.tcp["default"].backlog == 1024
    assert c.listeners.ws["default"].backlog == 50


@pytest.mark.parametrize("bad", ["0", "-1", "65536", "lots", "1.5"])
def test_bad_backlog_is_one_clear_error(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, environ={"GATEWAY_LISTENERS__TCP__DEFAULT__BACKLOG": bad})
    assert "backlog" in info.value.message
    assert "\n" not in info.value.message.strip()
