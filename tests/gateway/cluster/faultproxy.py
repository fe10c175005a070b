"""A fault-injecting TCP proxy for partition tests: one listening port in front of one
node's cluster port.

Modes:
- ``up``: bytes pass both ways.
- ``cut()``: a black hole. Open connections stay open but every byte is dropped in both
  directions and a close on one side is not passed on (as when a cable is pulled: each
  node finds out through its own heartbeat timeout); new connections are accepted and
  held, never connected through.
- ``restore()``: connections that lived through the cut are closed (their streams lost
  bytes; a real network answers them with a reset), new ones pass again.

Threads only; ``close()`` ends everything. The tests wait on conditions, never on time.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading


class FaultProxy:
    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.target = target
        self.lsock = socket.create_server((host, 0))
        self.port: int = self.lsock.getsockname()[1]
        self.host = host
        self.is_cut = False
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket | None]] = []
        self._pending_close: list[tuple[socket.socket, socket.socket | None]] = []
        self._sel = selectors.DefaultSelector()
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self.lsock, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.connections = 0  # accepted so far
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def cut(self) -> None:
        with self._lock:
            self.is_cut = True

    def restore(self) -> None:
        with self._lock:
            self.is_cut = False
            self._pending_close, self._pairs = self._pairs, []
        self._wake_w.send(b"r")

    def close(self) -> None:
        self._closed = True
        self._wake_w.send(b"x")
        self._thread.join(5)
        with contextlib.suppress(OSError):
            self.lsock.close()

    # -- the loop -------------------------------------------------------------------------

    def _drop(self, s: socket.socket | None) -> None:
        if s is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(s)
        with contextlib.suppress(OSError):
            s.close()

    def _run(self) -> None:
        peer_of: dict[socket.socket, socket.socket | None] = {}
        while not self._closed:
            for key, _ in self._sel.select(0.5):
                tag = key.data
                if tag == "wake":
                    self._wake_r.recv(64)
                    pending, self._pending_close = self._pending_close, []
                    for a, b in pending:
                        peer_of.pop(a, None)
                        if b is not None:
                            peer_of.pop(b, None)
                        self._drop(a)
                        self._drop(b)
                    continue
                if tag == "accept":
                    try:
                        client, _ = self.lsock.accept()
                    except OSError:
                        continue
                    self.connections += 1
                    upstream: socket.socket | None = None
                    if not self.is_cut:
                        try:
                            upstream = socket.create_connection(self.target, timeout=5)
                        except OSError:
                            client.close()
                            continue
                        upstream.setblocking(False)
                        peer_of[upstream] = client
                        self._sel.register(upstream, selectors.EVENT_READ, "conn")
                    client.setblocking(False)
                    peer_of[client] = upstream
                    self._sel.register(client, selectors.EVENT_READ, "conn")
                    with self._lock:
                        self._pairs.append((client, upstream))
                    continue
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                other = peer_of.get(sock)
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    peer_of.pop(sock, None)
                    self._drop(sock)
                    if other is not None and not self.is_cut:
                        peer_of.pop(other, None)
                        self._drop(other)
                    continue
                if self.is_cut or other is None:
                    continue  # the black hole
                try:
                    other.setblocking(True)
                    other.sendall(data)
                    other.setblocking(False)
                except OSError:
                    peer_of.pop(sock, None)
                    peer_of.pop(other, None)
                    self._drop(sock)
                    self._drop(other)
        for s in list(peer_of):
            self._drop(s)
