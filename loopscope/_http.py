"""What loopscope's two HTTP servers (``loopscope ui``, ``loopscope collect``) share: who
they answer, and how many connections they hold.

Who. A web page the user visits can make the browser send requests to a server on the
user's machine by *DNS rebinding*: the page's own host name is made to resolve to
127.0.0.1, so the browser treats the server as the page's origin. Such a request names
the page's host in ``Host`` (and in ``Origin``), never the server's, so
:class:`HostRule` answers only requests addressed to the server by a name it knows:

- bound to a loopback address: ``127.0.0.1``, ``localhost``, ``::1`` or the bound address;
- bound to another address (or all of them): those, the bound address, any IP address
  literal (a browser sends one only for a page loaded from that address itself, that
  is from the server), this machine's host name and fully qualified name, and the
  names given as ``extra_names``.

A request with an ``Origin`` header (a browser's, cross-origin or not) is answered only
when the origin's host passes the same rule. And a bearer token (:func:`token_ok`), when
the server has one, is what a page cannot know at all.

How many, and for how long. :class:`BoundedHTTPServer` keeps slow and idle clients from
holding the server (threads and availability alike):

- one thread accepts every connection at once and reads each request's head (its request
  line and headers) itself, without a thread per connection: a connection that sends
  nothing, or a byte now and then, costs a file descriptor and no thread;
- a request's head must arrive whole within ``socket_timeout`` seconds of the connection
  (or of the previous response, on a keep-alive connection), else it is closed: sending a
  byte a second does not hold it open;
- at most ``max_open`` connections are held at once, at most ``max_per_client`` from one
  address; past either, the oldest connection still waiting for its head (of that address)
  is closed for the new one, so the listener keeps accepting and a client with a request
  to make gets in;
- requests whose head has arrived are served by at most ``max_connections`` threads (more
  wait their turn); a body must keep coming (``socket_timeout`` seconds without a byte, or
  slower than :data:`MIN_BODY_RATE` bytes a second after the first ``socket_timeout``
  seconds, closes the connection), and an answer must be taken within ``socket_timeout``.
"""

from __future__ import annotations

import collections
import hmac
import ipaddress
import selectors
import socket
import socketserver
import threading
import time
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["LOOPBACK_NAMES", "BoundedHTTPServer", "BoundedHandler", "HostRule", "is_loopback", "token_ok"]

MAX_HEAD = 64 * 1024
"""Bytes a request's line and headers may take (http.server's own limits are per line)."""
MIN_BODY_RATE = 16 * 1024
"""Bytes a second a request body must average once its first ``socket_timeout`` seconds are past."""

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def _bare(name: str) -> str:
    """A host name as compared: lower case, an IPv6 literal without its brackets."""
    name = name.strip().lower().rstrip(".")
    return name[1:-1] if name.startswith("[") and name.endswith("]") else name


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """Whether a bind address is a loopback address (``localhost`` included)."""
    name = _bare(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """The host part of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``)."""
    value = header.strip()
    if value.startswith("["):
        return _bare(value[: value.find("]") + 1])
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return _bare(value)


class HostRule:
    """Which ``Host`` and ``Origin`` headers a server bound to ``bind_host`` answers (see
    the module's docstring)."""

    def __init__(self, bind_host: str, extra_names: Iterable[str] = ()) -> None:
        bind = _bare(bind_host)
        self.local_only = is_loopback(bind)
        names = {_bare(n) for n in LOOPBACK_NAMES} | {_bare(n) for n in extra_names if n.strip()}
        if bind not in WILDCARDS:
            names.add(bind)
        if not self.local_only:
            for name in (socket.gethostname(), socket.getfqdn()):
                if name:
                    names.add(_bare(name))
        self.names = frozenset(names)

    def allows_name(self, name: str) -> bool:
        name = _bare(name)
        return name in self.names or (not self.local_only and _is_ip(name))

    def allows_host(self, header: str | None) -> bool:
        """Whether a request with this ``Host`` header is addressed to this server (an
        HTTP/1.0 request without one is: no browser sends those)."""
        return header is None or self.allows_name(host_of(header))

    def allows_origin(self, header: str | None) -> bool:
        """Whether a request with this ``Origin`` header comes from a page this server
        answers (no header: not a browser's cross-site request). ``null`` (a sandboxed
        page, a file) is refused."""
        if header is None:
            return True
        try:
            host = urlsplit(header.strip()).hostname
        except ValueError:
            return False
        return bool(host) and self.allows_name(host)  # type: ignore[arg-type]

    def refusal(self, headers: Mapping[str, str] | Any) -> tuple[int, str] | None:
        """``(status, reason)`` for a request this rule refuses: 421 for another ``Host``,
        403 for another ``Origin``; None when it is answered."""
        if not self.allows_host(headers.get("Host")):
            return 421, "this server only answers requests addressed to it (Host)"
        if not self.allows_origin(headers.get("Origin")):
            return 403, "requests from other web pages are refused (Origin)"
        return None


def token_ok(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header (or gRPC ``authorization`` metadata) carries
    ``Bearer <token>``; compared in constant time."""
    if not authorization:
        return False
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), token.encode())


class _Connection:
    """A client connection between requests: the bytes read ahead of the next request
    (its head, as it arrives) and when it began to wait."""

    __slots__ = ("address", "buffer", "client", "keep", "since", "sock")

    def __init__(self, sock: socket.socket, address: Any) -> None:
        self.sock, self.address = sock, address
        self.client = address[0] if isinstance(address, tuple) and address else str(address)
        self.buffer = bytearray()
        self.since = time.monotonic()
        self.keep = False  # whether the handler left it open for another request

    def has_head(self) -> bool:
        return b"\r\n\r\n" in self.buffer or b"\n\n" in self.buffer


class _Reader:
    """The request's bytes for a handler's ``rfile``: what the accepting thread read ahead,
    then the socket, under the body's deadlines (see the module's docstring). What it reads
    past the request (a pipelined next one) stays in the connection's buffer."""

    def __init__(self, connection: _Connection, timeout: float) -> None:
        self._connection = connection
        self._timeout = timeout
        self._start = time.monotonic()
        self._got = 0

    def _more(self) -> bool:
        timeout = min(self._timeout, self._start + self._timeout + self._got / MIN_BODY_RATE - time.monotonic())
        if timeout <= 0:
            raise TimeoutError("the request's body came too slowly")
        sock = self._connection.sock
        sock.settimeout(timeout)
        data = sock.recv(1 << 16)
        if not data:
            return False
        self._got += len(data)
        self._connection.buffer += data
        return True

    def readline(self, limit: int = -1) -> bytes:
        buffer = self._connection.buffer
        while True:
            end = buffer.find(b"\n")
            if end >= 0 and (limit < 0 or end < limit):
                size = end + 1
                break
            if 0 <= limit <= len(buffer) or not self._more():
                size = len(buffer) if limit < 0 else min(limit, len(buffer))
                break
        line = bytes(buffer[:size])
        del buffer[:size]
        return line

    def read(self, size: int = -1) -> bytes:
        buffer = self._connection.buffer
        while (size < 0 or len(buffer) < size) and self._more():
            pass
        size = len(buffer) if size < 0 else min(size, len(buffer))
        data = bytes(buffer[:size])
        del buffer[:size]
        return data

    def close(self) -> None:
        pass


class BoundedHandler(BaseHTTPRequestHandler):
    """A request handler for :class:`BoundedHTTPServer`: one request per call, its head
    already read; the connection stays the server's (it waits for the next request
    without a thread)."""

    server: BoundedHTTPServer
    request: _Connection  # type: ignore[assignment]

    def setup(self) -> None:
        connection = self.request
        self.connection = connection.sock
        self.connection.settimeout(self.server.socket_timeout)  # the answer's writes
        self.rfile = _Reader(connection, self.server.socket_timeout)  # type: ignore[assignment]
        self.wfile = socketserver._SocketWriter(self.connection)  # type: ignore[attr-defined]  # what StreamRequestHandler uses unbuffered

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()

    def finish(self) -> None:
        self.request.keep = not self.close_connection


class BoundedHTTPServer(HTTPServer):
    """An HTTP server that stays available to clients with requests to make while others
    hold connections open (see the module's docstring). Serve with ``serve_forever()``,
    stop with ``shutdown()`` then ``server_close()``. ``stats`` counts the connections it
    took (``accepted``) and those it closed: waiting too long for a head (``timed_out``), for
    a newer one (``evicted``), or refused at once (``refused``: every connection was busy
    with a request)."""

    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BoundedHandler], *,
                 max_connections: int = 64, socket_timeout: float = 15.0, max_open: int = 512,
                 max_per_client: int | None = None) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        if not socket_timeout > 0:
            raise ValueError(f"socket_timeout must be positive, got {socket_timeout}")
        if max_open < 1 or (max_per_client is not None and max_per_client < 1):
            raise ValueError("max_open and max_per_client must be at least 1")
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.max_connections = max_connections
        self.socket_timeout = socket_timeout
        self.max_open = max_open
        self.max_per_client = max_per_client if max_per_client is not None else max(1, max_open // 2)
        self.stats = {"accepted": 0, "timed_out": 0, "evicted": 0, "refused": 0}
        self._lock = threading.Lock()
        self._waiting: collections.OrderedDict[_Connection, None] = collections.OrderedDict()  # oldest first
        self._ready: collections.deque[_Connection] = collections.deque()  # heads read, waiting for a thread
        self._back: collections.deque[_Connection] = collections.deque()  # served, kept alive: wait again
        self._per_client: collections.Counter[str] = collections.Counter()
        self._open = 0
        self._running = 0
        self._stopping = False
        self._done = threading.Event()
        self._serving = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector: selectors.BaseSelector | None = None
        super().__init__(address, handler)  # type: ignore[arg-type]

    # -- the accepting thread --------------------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._serving = True
        selector = self._selector = selectors.DefaultSelector()
        self.socket.setblocking(False)
        selector.register(self.socket, selectors.EVENT_READ, None)
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while not self._stopping:
                wait = poll_interval
                if self._waiting:
                    oldest = next(iter(self._waiting))
                    wait = max(0.0, min(wait, oldest.since + self.socket_timeout - time.monotonic()))
                for key, _ in selector.select(wait):
                    try:
                        if key.fileobj is self.socket:
                            self._accept()
                        elif key.fileobj is self._wake_r:
                            self._drain_wake()
                        elif key.data in self._waiting:  # (closed for a newer one in this round otherwise)
                            self._read_head(key.data)
                    except Exception:  # one connection's trouble (a descriptor gone) never stops the server
                        self.handle_error(self.socket, self.server_address)
                self._take_back()
                self._expire()
        finally:
            with self._lock:
                waiting = list(self._waiting)
                self._waiting.clear()
                waiting += self._back
                self._back.clear()
            for connection in waiting:
                self._close(connection, registered=False)
            selector.close()
            self._selector = None
            self._done.set()

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, a connection reset before it was taken
                return
            sock.setblocking(False)
            connection = _Connection(sock, address)
            if not self._make_room(connection.client):
                self.stats["refused"] += 1
                self._shut(sock)
                continue
            with self._lock:
                self._open += 1
                self._per_client[connection.client] += 1
            self.stats["accepted"] += 1
            self._wait(connection)
            self._read_head(connection)  # a client with a request sent it with the connection: served before any eviction

    def _make_room(self, client: str) -> bool:
        """Close the oldest waiting connection (of ``client``, when it holds its share) if a new
        one would pass a bound; False when none can be closed (all are being served)."""
        if self._per_client[client] >= self.max_per_client:
            victim = next((c for c in self._waiting if c.client == client), None)
            if victim is None:
                return False
            self.stats["evicted"] += 1
            self._close(victim)
        if self._open >= self.max_open:
            if not self._waiting:
                return False
            self.stats["evicted"] += 1
            self._close(next(iter(self._waiting)))
        return True

    def _wait(self, connection: _Connection) -> None:
        """Wait for the connection's next request head (it may be in its buffer already)."""
        if connection.has_head():
            self._dispatch(connection)
            return
        connection.since = time.monotonic()
        self._waiting[connection] = None
        assert self._selector is not None
        self._selector.register(connection.sock, selectors.EVENT_READ, connection)

    def _read_head(self, connection: _Connection) -> None:
        if connection not in self._waiting:
            return
        try:
            data = connection.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(connection)
            return
        connection.buffer += data
        if connection.has_head():
            self._unwait(connection)
            self._dispatch(connection)
        elif len(connection.buffer) > MAX_HEAD:
            self._close(connection)

    def _expire(self) -> None:
        deadline = time.monotonic() - self.socket_timeout
        while self._waiting:
            oldest = next(iter(self._waiting))
            if oldest.since > deadline:
                return
            self.stats["timed_out"] += 1
            self._close(oldest)

    def _unwait(self, connection: _Connection) -> None:
        del self._waiting[connection]
        if self._selector is not None:
            self._selector.unregister(connection.sock)

    def _close(self, connection: _Connection, *, registered: bool = True) -> None:
        if registered and connection in self._waiting:
            self._unwait(connection)
        with self._lock:
            self._open -= 1
            self._per_client[connection.client] -= 1
            if self._per_client[connection.client] <= 0:
                del self._per_client[connection.client]
        self._shut(connection.sock)

    def _shut(self, sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # its buffer is full: the thread will wake anyway
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _take_back(self) -> None:
        while True:
            with self._lock:
                if not self._back:
                    return
                connection = self._back.popleft()
            self._wait(connection)

    # -- the serving threads ---------------------------------------------------------------

    def _dispatch(self, connection: _Connection) -> None:
        with self._lock:
            if self._running >= self.max_connections:
                self._ready.append(connection)
                return
            self._running += 1
        thread = threading.Thread(target=self.process_request_thread, args=(connection,), daemon=True)
        thread.start()

    def process_request_thread(self, connection: _Connection) -> None:  # type: ignore[override]
        while True:
            self._serve(connection)
            with self._lock:
                if not self._ready:
                    self._running -= 1
                    return
                connection = self._ready.popleft()

    def _serve(self, connection: _Connection) -> None:
        keep = False
        try:
            connection.keep = False
            self.RequestHandlerClass(connection, connection.address, self)  # type: ignore[arg-type]
            keep = connection.keep
        except Exception:
            self.handle_error(connection, connection.address)  # type: ignore[arg-type]
        if keep and not self._stopping:
            try:
                connection.sock.setblocking(False)
            except OSError:
                keep = False
        if keep and not self._stopping:
            with self._lock:
                self._back.append(connection)
            self._wake()
        else:
            self._close(connection, registered=False)

    # -- stopping ------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop serving_forever (it closes the connections waiting for a request) and wait for it."""
        self._stopping = True
        if self._serving:
            self._wake()
            self._done.wait()

    def wait_served(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the requests being served to end (False: some
        still run). The serving threads are daemon threads: one still inside a DuckDB read
        when the interpreter ends aborts the process (SIGABRT), so a server stopped at exit
        lets them finish first."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._running == 0:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def server_close(self) -> None:
        super().server_close()
        with self._lock:
            ready = list(self._ready)
            self._ready.clear()
        for connection in ready:
            self._close(connection, registered=False)
        self._wake_r.close()
        self._wake_w.close()
