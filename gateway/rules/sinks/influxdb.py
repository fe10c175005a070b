"""InfluxDB 1.x sink: line protocol over HTTP ``POST /write`` (aiohttp), batched.

An item is ``{"l": line without timestamp, "t": timestamp}`` or ``{"l", "ms": the
event's time in ms}`` (scaled to the connector's ``precision``). A batch is one request:
204 stores every point. 400 (a line the server cannot parse, a field type conflict)
makes us send the batch's lines one at a time so that only the refused points fail;
points are keyed by series and time, so a point sent twice is stored once. 401, 403,
404 (no such database), 5xx and connection errors retry the batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import aiohttp

from gateway.config.connectors import InfluxdbConnector, host_port
from gateway.rules.sinks.base import Outcome, Refused, Retry, Sink, client_ssl_context

__all__ = ["InfluxdbSink"]

_SCALE = {"ns": 1_000_000, "us": 1_000, "ms": 1}


class InfluxdbSink(Sink[InfluxdbConnector]):
    kind = "influxdb"
    session: aiohttp.ClientSession | None = None

    @property
    def base(self) -> str:
        host, port = host_port(self.cfg.server, 8086)
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self.cfg.tls.enable else 'http'}://{host}:{port}"

    async def connect(self) -> None:
        cfg = self.cfg
        ctx = client_ssl_context(cfg.tls)
        auth = (aiohttp.BasicAuth(cfg.username, cfg.password.get_secret_value()
                                  if cfg.password else "") if cfg.username else None)
        self.session = aiohttp.ClientSession(
            auth=auth, timeout=aiohttp.ClientTimeout(total=cfg.request_timeout),
            connector=aiohttp.TCPConnector(ssl=ctx if ctx is not None else False, limit=1),
        )
        await self.ping()

    async def close(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await session.close()

    async def ping(self) -> None:
        assert self.session is not None
        async with self.session.get(self.base + "/ping") as resp:
            if resp.status != 204:
                raise ConnectionError(f"/ping answered HTTP {resp.status}")

    def _line(self, item: bytes) -> str:
        p = json.loads(item)
        if "t" in p:
            return f"{p['l']} {p['t']}"
        ms = p.get("ms")
        if ms is None:
            return str(p["l"])
        precision = self.cfg.precision
        ts = ms // 1000 if precision == "s" else ms * _SCALE[precision]
        return f"{p['l']} {ts}"

    async def _write(self, lines: list[str]) -> tuple[int, str]:
        assert self.session is not None
        params = {"db": self.cfg.database, "precision": self.cfg.precision}
        async with self.session.post(self.base + "/write", params=params,
                                     data="\n".join(lines).encode()) as resp:
            return resp.status, (await resp.text()).strip()

    async def deliver(self, items: Sequence[bytes]) -> list[Outcome]:
        lines = [self._line(i) for i in items]
        status, text = await self._write(lines)
        if status == 204:
            return [None] * len(lines)
        if status != 400:
            raise ConnectionError(f"/write answered HTTP {status}: {text[:200]}")
        outcomes: list[Outcome] = []
        for i, line in enumerate(lines):
            status, text = await self._write([line])
            if status == 204:
                outcomes.append(None)
            elif status == 400:
                outcomes.append(Refused(f"HTTP 400: {text[:200]}"))
            else:
                outcomes.extend([Retry(f"HTTP {status}: {text[:200]}")] * (len(lines) - i))
                break
        return outcomes
