"""The dashboard's HTTP server: the static page and a read-only JSON API, on loopback.

Standard library only (``http.server``). What it serves:

- ``/`` the page; ``/static/<name>`` its assets, looked up by exact name in a table
  loaded from the package at start-up, so no request path ever reaches the file system;
- ``/api/...`` JSON read from the store (see :mod:`.api`), one short read-only
  connection per request;
- GET and HEAD only: every other method gets 405.

Requests whose ``Host`` header names another machine are refused (421), and those whose
``Origin`` names another site (403), so a web page elsewhere cannot reach the store
through DNS rebinding (the rule, shared with ``loopscope collect``: :class:`loopscope._http.HostRule`).
Every response forbids inline scripts (Content-Security-Policy). At most
``max_connections`` requests are served at once; a request's head must arrive within
``socket_timeout`` seconds, and past ``max_open`` connections the oldest one waiting for a
request is closed for a new one, so idle or slow clients cannot keep others out
(:class:`loopscope._http.BoundedHTTPServer`).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from http import HTTPStatus
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ..._http import BoundedHandler, BoundedHTTPServer, HostRule
from ...storage.errors import StoreError
from ...storage.queries import Reader, open_reader
from ...storage.recording import configured_path, default_db_path
from ..tables import visible
from . import DEFAULT_HOST, DEFAULT_PORT, api  # the defaults live in the package, which ``loopscope ui``'s parser reads

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "DashboardServer", "make_server", "serve"]

MAX_CONNECTIONS = 32
"""Requests served at once; more wait their turn (a browser opens about six connections)."""
MAX_OPEN = 256
"""Connections held open at once; past it the oldest one waiting for a request is closed."""
SOCKET_TIMEOUT = 15.0
"""Seconds a connection may send nothing (between requests too) before it is closed."""

log = logging.getLogger("loopscope.ui")

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
}
_MAX_QUERY = 4096


def _static_files() -> dict[str, tuple[bytes, str]]:
    """Every asset shipped in the package's ``static`` folder: name -> (bytes, content type)."""
    folder = resources.files(__name__.rpartition(".")[0]) / "static"  # this module's package
    files: dict[str, tuple[bytes, str]] = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
        if entry.is_file() and suffix in _TYPES:
            files[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return files


class _BadRequest(Exception):
    pass


class _NotFound(Exception):
    pass


class _Query:
    """The query string of a request, with typed getters that raise 400 on bad input."""

    def __init__(self, text: str) -> None:
        if len(text) > _MAX_QUERY:
            raise _BadRequest("query string too long")
        try:
            self.values = parse_qs(text, keep_blank_values=True, strict_parsing=False, max_num_fields=50)
        except ValueError as exc:
            raise _BadRequest(str(exc)) from None

    def str(self, name: str, required: bool = False) -> str | None:
        values = self.values.get(name)
        if not values or values[-1] == "":
            if required:
                raise _BadRequest(f"missing parameter {name!r}")
            return None
        return values[-1]

    def int(self, name: str) -> int | None:
        text = self.str(name)
        if text is None:
            return None
        try:
            return int(text)
        except ValueError:
            raise _BadRequest(f"parameter {name!r} must be a whole number") from None

    def flag(self, name: str) -> bool:
        return (self.str(name) or "").lower() in ("1", "true", "yes", "on")

    def list(self, name: str, limit: int = 200) -> list[str]:
        text = self.str(name)
        items = [x for x in (text or "").split(",") if x]
        if len(items) > limit:
            raise _BadRequest(f"parameter {name!r} holds more than {limit} items")
        return items


def _timeline(store: Reader, q: _Query) -> Any:
    return api.timeline(
        store,
        q.str("session", required=True) or "",
        after_index=q.int("after"),
        before_index=q.int("before"),
        limit=q.int("limit"),
        include_blocked=q.flag("blocked"),
        turn_ids=q.list("turns"),
    )


def _scores(store: Reader, q: _Query) -> Any:
    session = q.str("session")
    if session is not None:  # a timeline page's turns' scores, polled while it is open
        return api.session_scores(store, session, q.list("turns"))
    return api.scores(store, q.str("range"))


def _event(store: Reader, q: _Query) -> Any:
    found = api.event(store, q.str("id", required=True) or "")
    if found is None:
        raise _NotFound("no such event")
    return found


_ROUTES: dict[str, Callable[[Reader, _Query], Any]] = {
    "/api/overview": lambda store, q: api.overview(store),
    "/api/sessions": lambda store, q: api.sessions(store, q.str("q"), q.int("limit"), q.int("offset")),
    "/api/timeline": _timeline,
    "/api/event": _event,
    "/api/tools": lambda store, q: api.tool_analytics(store, q.str("range"), q.str("tool")),
    "/api/turns": lambda store, q: api.turn_analytics(store, q.str("range")),
    "/api/declared": lambda store, q: api.declared_vs_used(store, q.str("range")),
    "/api/scores": lambda store, q: _scores(store, q),  # the Scores page, a session's scores (docs/scores.md)
    "/api/diff": lambda store, q: api.diff(store, q.str("a", required=True) or "", q.str("b", required=True) or ""),
    # issue 35: content search, store-wide slowest and failed calls
    "/api/search": lambda store, q: api.search(store, q.str("q"), q.str("session"), q.int("limit")),
    "/api/calls": lambda store, q: api.calls(store, q.str("tool"), q.flag("failed"), q.int("limit")),
}


def _json_bytes(value: Any) -> bytes:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, default=str, separators=(",", ":"))
    except ValueError:  # a NaN or an infinity the API let through: null, as in every answer (api.json_safe)
        text = json.dumps(api.json_safe(value), ensure_ascii=False, allow_nan=False, default=str, separators=(",", ":"))
    return text.encode("utf-8")


class _Handler(BoundedHandler):
    server: DashboardServer
    server_version = "loopscope-ui"
    protocol_version = "HTTP/1.1"

    def version_string(self) -> str:
        return self.server_version

    # -- methods -----------------------------------------------------------------------------

    def do_GET(self) -> None:  # http.server's naming
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def _refuse(self) -> None:
        self._send(
            HTTPStatus.METHOD_NOT_ALLOWED,
            _json_bytes({"error": "the dashboard is read-only: GET only"}),
            "application/json",
            extra={"Allow": "GET, HEAD"},
        )

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _refuse

    # -- routing -----------------------------------------------------------------------------

    def _serve(self) -> None:
        refused = self.server.host_rule.refusal(self.headers)
        if refused is not None:
            self._error(HTTPStatus(refused[0]), refused[1])
            return
        parts = urlsplit(self.path)
        path = parts.path
        decoded = unquote(path)
        if "\\" in decoded or "\x00" in decoded or any(seg in ("..", ".") for seg in decoded.split("/")):
            self._error(HTTPStatus.BAD_REQUEST, "bad path")
            return
        if path in ("/", "/index.html"):
            self._asset("index.html")
        elif path.startswith("/static/"):
            self._asset(path[len("/static/") :])
        elif path in _ROUTES:
            self._api(_ROUTES[path], parts.query)
        else:
            self._error(HTTPStatus.NOT_FOUND, "not found")

    def _asset(self, name: str) -> None:
        found = self.server.static.get(name)
        if found is None:
            self._error(HTTPStatus.NOT_FOUND, "not found")
            return
        body, content_type = found
        self._send(HTTPStatus.OK, body, content_type, extra={"Cache-Control": "no-cache"})

    def _api(self, handler: Callable[[Reader, _Query], Any], query: str) -> None:
        try:
            value = handler(self.server.store, _Query(query))
        except (_BadRequest, api.ApiError) as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        except _NotFound as exc:
            self._error(HTTPStatus.NOT_FOUND, str(exc))
            return
        except StoreError as exc:  # no store yet, a locked or a newer store
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, str(exc).strip().splitlines()[0])
            return
        except Exception:  # a request never takes the server down
            log.exception("dashboard request %s failed", self.path)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error (see the server's log)")
            return
        self._send(HTTPStatus.OK, _json_bytes(value), "application/json", extra={"Cache-Control": "no-store"})

    # -- responses ---------------------------------------------------------------------------

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, _json_bytes({"error": message}), "application/json", extra={"Cache-Control": "no-store"})

    def _send(self, status: HTTPStatus, body: bytes, content_type: str, extra: Mapping[str, str] = {}) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in {**_SECURITY_HEADERS, **extra}.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # http.server's own errors (bad request line, unsupported method): JSON, no echo of the request
        self.close_connection = True
        with suppress(Exception):  # the client is gone
            self._send(HTTPStatus(code), _json_bytes({"error": HTTPStatus(code).phrase}), "application/json")

    def log_message(self, format: str, *args: Any) -> None:  # http.server's signature
        if self.server.verbose:
            # the request line is the client's text: control characters as escapes, as http.server's own log does
            sys.stderr.write(visible(f"loopscope ui: {self.address_string()} {format % args}") + "\n")


class DashboardServer(BoundedHTTPServer):
    """The dashboard's server; ``url`` is where it listens. Close it with ``shutdown()`` then ``server_close()``."""

    def __init__(
        self, store: Reader, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *, verbose: bool = False,
        max_connections: int = MAX_CONNECTIONS, socket_timeout: float = SOCKET_TIMEOUT,
        allow_hosts: Sequence[str] = (), max_open: int = MAX_OPEN,
    ) -> None:
        super().__init__((host, port), _Handler, max_connections=max_connections, socket_timeout=socket_timeout,
                         max_open=max_open)
        self.store = store
        self.verbose = verbose
        self.static = _static_files()
        # requests for another host name (DNS rebinding) or from another site's page are refused
        # (``allow_hosts``: names it is reached by beyond those HostRule knows, e.g. behind a proxy)
        self.host_rule = HostRule(host, allow_hosts)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        return f"http://{shown}:{port}/"


def make_server(
    store: Reader | api.StoreLike | str | None = None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
    verbose: bool = False, max_connections: int = MAX_CONNECTIONS, socket_timeout: float = SOCKET_TIMEOUT, allow_hosts: Sequence[str] = (),
    max_open: int = MAX_OPEN,
) -> DashboardServer:
    """A dashboard server bound to ``host:port`` (port 0: any free port), not yet serving:
    at most ``max_connections`` served at once, each closed after ``socket_timeout``
    seconds without a byte; it answers requests addressed to the names
    :class:`loopscope._http.HostRule` knows for ``host``, and to ``allow_hosts``."""
    if store is None or isinstance(store, str):  # a path (none: the store this process records to, or the default)
        store = open_reader(store or configured_path() or default_db_path())
    return DashboardServer(
        api.reader(store), host, port, verbose=verbose, max_connections=max_connections, socket_timeout=socket_timeout,
        allow_hosts=allow_hosts, max_open=max_open,
    )


def serve(
    store: Reader | api.StoreLike | str | None = None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
    verbose: bool = False,
) -> None:
    """Serve the dashboard until interrupted (or until another thread calls ``shutdown()``)."""
    server = make_server(store, host, port, verbose=verbose)
    try:
        server.serve_forever(poll_interval=0.25)
    finally:
        server.server_close()


def serve_in_thread(server: DashboardServer) -> threading.Thread:
    """Run ``server`` in a daemon thread (tests, notebooks); stop it with ``server.shutdown()``."""
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="loopscope-ui", daemon=True
    )
    thread.start()
    return thread
