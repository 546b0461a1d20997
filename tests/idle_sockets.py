"""Idle connections against one of loopscope's HTTP servers (the dashboard, the collector):
both must bound the connections they serve and close those that send nothing."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable


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
