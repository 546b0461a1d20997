"""Idle connections against one of loopscope's HTTP servers (the dashboard, the collector):
both must bound the connections they serve and close those that send nothing."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator


def _handler_threads() -> int:
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def serve_past_idle_sockets(port: int, request: Callable[[], int], count: int = 8) -> int:
    """Open ``count`` connections that send nothing, then make ``request`` (which returns
    its HTTP status): it must be served (200) after waiting its turn, and every idle
    connection must have been closed by the server. Returns the most request threads the
    server ran for the idle connections meanwhile."""
    before = _handler_threads()
    idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(count)]
    try:
        threads = 0
        for _ in range(20):
            time.sleep(0.01)
            threads = max(threads, _handler_threads() - before)
        assert request() == 200  # waits its turn, then is served
        for s in idle:
            assert s.recv(1) == b""  # closed by the server: it sent nothing
    finally:
        for s in idle:
            s.close()
    return threads


@contextlib.contextmanager
def slow_clients(port: int, idle: int, trickling: int) -> Iterator[None]:
    """While the block runs: ``idle`` connections that never send a byte and ``trickling``
    ones that send a request head one byte at a time, a byte each 0.2 s, never finishing it
    (connected without waiting: past the listen queue, a connect would wait itself)."""
    sockets = []
    for _ in range(idle + trickling):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        sockets.append(s)
    stop = threading.Event()
    head = b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"x" * 10_000

    def trickle() -> None:
        sent = 0
        while not stop.wait(0.2):
            for s in sockets[idle:]:
                try:
                    s.send(head[sent % len(head):][:1])
                except OSError:  # not connected yet, or closed by the server: it keeps trying
                    pass
            sent += 1

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)  # let them reach the server (a sleep: they only have to be there, it is no sync point)
        yield
    finally:
        stop.set()
        thread.join()
        for s in sockets:
            s.close()
