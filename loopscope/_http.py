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

How many. :class:`BoundedHTTPServer` serves each connection on a thread of its own, at
most ``max_connections`` at once (past that, new connections wait in the listen queue,
taking no file descriptor or thread of this process), and closes a connection that sends
nothing for ``socket_timeout`` seconds, idle keep-alive connections included.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["LOOPBACK_NAMES", "BoundedHTTPServer", "BoundedHandler", "HostRule", "is_loopback", "token_ok"]

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


class BoundedHandler(BaseHTTPRequestHandler):
    """A request handler whose socket times out after the server's ``socket_timeout``:
    a connection that sends nothing for that long (an idle keep-alive one too) is closed."""

    server: BoundedHTTPServer

    def setup(self) -> None:
        super().setup()
        # what StreamRequestHandler.setup does with its class-wide `timeout`, per server
        self.connection.settimeout(self.server.socket_timeout)


class BoundedHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server with at most ``max_connections`` connections served at once
    and a timeout on every socket (see the module's docstring). Stop it with ``shutdown()``
    then ``server_close()``."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BoundedHandler], *,
                 max_connections: int = 64, socket_timeout: float = 15.0) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        if not socket_timeout > 0:
            raise ValueError(f"socket_timeout must be positive, got {socket_timeout}")
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.max_connections = max_connections
        self.socket_timeout = socket_timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        self._stopping = False
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # wait for a free slot here, in the accepting thread: meanwhile further connections
        # wait in the kernel's listen queue instead of each taking a thread and a descriptor
        while not self._slots.acquire(timeout=0.25):
            if self._stopping:
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def shutdown(self) -> None:
        self._stopping = True
        super().shutdown()

    def wait_served(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the requests being served to end (False: some
        still run). The handler threads are daemon threads: one still inside a DuckDB read
        when the interpreter ends aborts the process (SIGABRT), so a server stopped at exit
        lets them finish first."""
        deadline = time.monotonic() + timeout
        taken = 0
        try:
            while taken < self.max_connections and self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                taken += 1
        finally:
            for _ in range(taken):
                self._slots.release()
        return taken == self.max_connections
