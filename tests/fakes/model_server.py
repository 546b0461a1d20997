"""A scripted fake model server that speaks the providers' wire formats (standard library only).

Endpoints, all ``POST``, answered by the wire (``tests/fakes/wires/``) whose route matches the path:

- ``/v1/chat/completions``  OpenAI Chat Completions (``openai_base_url`` = ``http://127.0.0.1:PORT/v1``)
- ``/v1/responses``         OpenAI Responses
- ``/v1/messages``          Anthropic Messages (``anthropic_base_url`` = ``http://127.0.0.1:PORT``, no ``/v1``)
- ``/v1/messages/count_tokens`` answers ``{"input_tokens": N}`` without consuming a reply
- ``/v1beta/models/{model}:generateContent`` / ``:streamGenerateContent``  Gemini (``gemini_client()``)
- ``/api/chat``             Ollama, JSON or NDJSON streams (``ollama_client()``)
- ``/v2/chat``              Cohere v2 (``cohere_client()``)
- ``/mistral/v1/chat/completions``  Mistral (``mistral_client()``: ``server_url`` = ``mistral_url``)
- ``/openai/v1/chat/completions``   Groq (``groq_client()``)
- ``/model/{modelId}/converse`` / ``converse-stream``  Bedrock Runtime, JSON or AWS event-stream (``bedrock_client()``)

A :class:`Reply` is provider-neutral (text, tool calls, stop reason, usage, faults); the server renders it in the
format of whichever endpoint was called, so one script drives any of the APIs::

    server.queue(
        Reply(tool_calls=[ToolCall("get_weather", {"city": "Paris"})], usage=Usage(100, 20, cached_tokens=30)),
        Reply(text="21 °C, dry."),
        match="[conv-7]",          # substring of the first user message; omit for the global queue
    )

Which reply serves a request: the first script whose ``match`` fits the request and still has replies; if a script
matched but all matching ones are used up, the default reply; if none matched, the global queue (``match=None``),
then the default reply (``server.default_reply``: a fixed text, no tool calls).

Every request is recorded (``server.requests``) with its path, headers, parsed JSON body and the reply it got.

Streams use HTTP/1.1 chunked transfer encoding with one frame (an SSE event, an NDJSON line, an AWS event-stream
message: the wire's framing) per chunk, ended by the zero-length chunk, so connections are kept alive and a
deliberately aborted stream (``fail_mode="abort"``) is seen by the client as an incomplete body rather than a clean
end.
"""

from __future__ import annotations

import itertools
import json
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from typing_extensions import Self

from .script import DEFAULT_TEXT, Matcher, Reply, Script, ToolCall, Usage
from .wires import Frame, Renderer, Wire, route, wire_named
from .wires.anthropic import COUNT_TOKENS, MESSAGES
from .wires.openai import CHAT, RESPONSES

__all__ = ["CHAT", "COUNT_TOKENS", "DEFAULT_TEXT", "MESSAGES", "RESPONSES", "FakeModelServer", "RecordedRequest",
           "Reply", "Script", "ToolCall", "Usage"]

STANDS_FOR = {"providers": {"127.0.0.1": "sdk"}}
"""``configure(prices=...)`` for a store whose calls go to this server: it stands for the
provider of the SDK that calls it (OpenAI for the openai SDK, Anthropic for anthropic), so
that its calls are recorded and priced as theirs. Without it, 127.0.0.1 is an unknown server
(recorded as the SDK's provider, not priced), as any local server is."""

# --------------------------------------------------------------------------------------------------------------------
# Recorded requests
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class RecordedRequest:
    index: int  # arrival order, from 0
    api: str  # the wire's API: "chat" | "responses" | "messages" | "count_tokens" | ... | "unknown"
    method: str
    path: str  # without the query string
    query: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON, or None
    raw_body: bytes
    script: str | None = None  # label of the script that served it; "global", "default", or None (no reply)
    reply: Reply | None = None
    status: int | None = None  # HTTP status sent (200 for streams, even ones that fail later)
    # the wire's name ("openai", "anthropic", "gemini", ...; "" for an unknown path) and the route's path
    # parameters (a model in the path): found from the path when not given
    wire: str = ""
    params: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.wire:
            found = route(self.path)
            if found is not None:
                self.wire, self.params = found[0].name, found[2]

    @property
    def _wire(self) -> Wire | None:
        return wire_named(self.wire)

    @property
    def stream(self) -> bool:
        w = self._wire
        if w is None:
            return isinstance(self.body, dict) and bool(self.body.get("stream"))
        return w.is_stream(self.api, self.params, self.body)

    @property
    def model(self) -> str | None:
        w = self._wire
        if w is None:
            return self.body.get("model") if isinstance(self.body, dict) else None
        return w.model(self.api, self.params, self.body)

    @property
    def first_user_text(self) -> str:
        """The text of the first user message (Chat ``messages``, Responses ``input``, Anthropic ``messages``,
        Gemini ``contents``, ...)."""
        w = self._wire
        return "" if w is None else w.first_user_text(self.api, self.body)

    @property
    def tool_results(self) -> list[dict[str, Any]]:
        """Tool results sent back to the model, normalised to ``{"id": call id, "content": ...}``, in order (Gemini
        and Ollama send no id: ``"id"`` is None and ``"name"`` the function's)."""
        w = self._wire
        return [] if w is None else w.tool_results(self.api, self.body)


# --------------------------------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------------------------------

class _Abort(Exception):
    """Drop the connection without finishing the response."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every response has a Content-Length or is chunked
    server_version = "FakeModelServer/1.0"
    sys_version = ""
    timeout = 60  # idle keep-alive connections are dropped after this
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # ---- plumbing -------------------------------------------------------------------------------------------------

    def _send_bytes(self, status: int, payload: bytes, content_type: str, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(payload)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(payload)

    def _send_json(self, status: int, data: Any, headers: Mapping[str, str]) -> None:
        self._send_bytes(status, json.dumps(data).encode(), "application/json", headers)

    def do_GET(self) -> None:
        self._read_body()
        self._not_found(self.path.partition("?")[0])

    def _not_found(self, path: str) -> None:
        body = {"error": {"message": f"Unknown request URL: {self.command} {path}", "type": "invalid_request_error",
                          "param": None, "code": "unknown_url"}}
        self._send_json(404, body, {})

    def _read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    # ---- requests -------------------------------------------------------------------------------------------------

    def do_POST(self) -> None:
        owner = self.server.owner
        path, _, query = self.path.partition("?")
        found = route(path)
        wire, api, params = found if found is not None else (None, "unknown", {})
        raw = self._read_body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        req = owner._record(api, self.command, path, query, {k.lower(): v for k, v in self.headers.items()}, body, raw)
        if wire is None:
            req.status = 404
            self._not_found(path)
            return
        if not isinstance(body, dict):
            req.status = 400
            self._send_json(400, wire.render(owner, api, {}, Reply(), params).error_body(400), {})
            return
        direct = wire.direct(api, body, raw)
        if direct is not None:
            req.status = 200
            self._send_json(200, direct, {})
            return

        try:
            reply, label = owner._next_reply(req)
            req.reply, req.script = reply, label
            r = wire.render(owner, api, body, reply, params)
            plain = not reply.is_error and reply.raw_body is None and not reply.error_in_body
            frames = r.frames() if req.stream and plain else []
            payload = r.json_body() if not req.stream and plain else None
        except Exception as exc:  # a bad script or a bug in the fake: say so instead of hanging up
            owner.errors.append(exc)
            req.status = 500
            self._send_json(500, {"error": {"message": f"fake model server failed: {exc!r}", "type": "fake_error",
                                            "param": None, "code": None}}, {})
            return
        headers = {wire.request_id_header: r.request_id, **reply.headers}
        try:
            if reply.delay and owner._sleep(reply.delay):
                raise _Abort
            if reply.hold is not None and not owner._hold(reply.hold):
                raise _Abort
            if reply.raw_body is not None:
                req.status = reply.status
                rb = reply.raw_body
                if isinstance(rb, (bytes, str)):
                    payload = rb.encode() if isinstance(rb, str) else rb
                    # the reply's own content type if it names one (an SSE body: text/event-stream)
                    ctype = next((v for k, v in headers.items() if k.lower() == "content-type"), "application/json")
                    rest = {k: v for k, v in headers.items() if k.lower() != "content-type"}
                    self._send_bytes(reply.status, payload, ctype, rest)
                else:
                    self._send_json(reply.status, rb, headers)
            elif reply.is_error:
                req.status = reply.status
                self._send_json(reply.status, r.error_body(reply.status), {**r.error_headers(reply.status), **headers})
            elif reply.error_in_body:  # a 200 with the error JSON, streamed or not: no SSE, just the body
                req.status = 200
                self._send_json(200, r.error_body(500), headers)
            elif req.stream:
                req.status = 200
                self._stream(r, wire, frames, headers)
            elif reply.fail_after is not None:
                if reply.fail_mode == "abort":
                    raise _Abort
                req.status = 500
                self._send_json(500, r.error_body(500), {**r.error_headers(500), **headers})
            elif reply.cut_body is not None:  # the headers and the first bytes of the body, then a dropped connection
                req.status = 200
                data = json.dumps(payload).encode()
                self.send_response(200)
                for k, v in {"content-type": "application/json", "content-length": str(len(data)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data[:reply.cut_body])
                self.wfile.flush()
                raise _Abort
            else:
                req.status = 200
                self._send_json(200, payload, headers)
        except _Abort:
            self._drop()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _stream(self, r: Renderer, wire: Wire, frames: list[Frame], headers: Mapping[str, str]) -> None:
        owner = self.server.owner
        reply = r.reply
        self.send_response(200)
        self.send_header("content-type", wire.framing.content_type)
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        delay = owner.chunk_delay if reply.chunk_delay is None else reply.chunk_delay
        last = len(frames) - 1
        encode = wire.framing.encode
        for i, frame in enumerate(frames):
            if reply.fail_after is not None and i >= reply.fail_after:
                if reply.fail_mode == "abort":
                    raise _Abort
                self._write_chunk(encode(r.stream_error_frame(i)), end=True)
                return
            wait = delay + reply.pauses.get(i, 0.0)
            if wait and owner._sleep(wait):
                raise _Abort
            # the last frame goes out in one write with the terminating chunk, so a client that stops reading at
            # `data: [DONE]` (the sync openai Stream) still sees a complete body and can reuse the connection
            self._write_chunk(encode(frame), end=i == last)
        if not frames:
            self.wfile.write(b"0\r\n\r\n")

    def _write_chunk(self, data: bytes, *, end: bool = False) -> None:
        self.wfile.write(b"%x\r\n%s\r\n%s" % (len(data), data, b"0\r\n\r\n" if end else b""))


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # listen backlog: many clients connect at once in concurrency tests
    owner: FakeModelServer

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a reverse DNS lookup that can stall without a network.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client hanging up mid-response is expected (aborted streams, early-closed iterators): stay quiet;
        # anything else is a bug in the fake, kept for the fixture to report
        exc = sys.exc_info()[1]
        if exc is not None and not isinstance(exc, OSError):
            self.owner.errors.append(exc)



# --------------------------------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------------------------------


class FakeModelServer:
    """A scripted OpenAI/Anthropic-compatible HTTP server on 127.0.0.1, run in a background thread.

    Use as a context manager (or ``start()``/``stop()``). See the module doc for the reply-selection rules.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        default_reply: Reply | None = None,
        chunk_delay: float = 0.0,
    ) -> None:
        self.host = host
        self._port = port
        self._initial = (default_reply or Reply(text=DEFAULT_TEXT), chunk_delay)
        self.default_reply, self.chunk_delay = self._initial
        self._lock = threading.RLock()  # a match predicate may call back into the server
        self._changed = threading.Condition(self._lock)
        self._scripts: list[Script] = []
        self._global = Script(None, ())
        self._requests: list[RecordedRequest] = []
        self._ids = itertools.count(1)
        self._conns: set[socket.socket] = set()
        self.connections_accepted = 0  # TCP connections served so far (keep-alive reuse shows as fewer)
        self.errors: list[BaseException] = []  # exceptions raised inside the fake itself (bugs, bad scripts)
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> FakeModelServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _HTTPServer((self.host, self._port), _Handler)
        httpd.owner = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-model-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        with self._lock:
            conns = list(self._conns)
        for c in conns:  # wake handler threads blocked on idle keep-alive connections
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server is not running")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    # ---- scripting ------------------------------------------------------------------------------------------------

    def queue(self, *replies: Reply, match: str | Matcher | None = None) -> Script:
        """Append replies for requests that ``match`` (substring of the first user message, or a predicate on the
        :class:`RecordedRequest`); ``match=None`` appends to the global queue. Returns the script (``.remaining``,
        ``.served``). Queuing again with an equal string ``match`` appends to the same script."""
        for r in replies:
            if not isinstance(r, Reply):
                raise TypeError(f"queue() takes Reply objects, not {type(r).__name__}")
        with self._lock:
            if match is None:
                self._global.pending.extend(replies)
                return self._global
            for s in self._scripts:
                if isinstance(match, str) and s.match == match:
                    s.pending.extend(replies)
                    return s
            script = Script(match, replies)
            self._scripts.append(script)
            return script

    @property
    def scripts(self) -> list[Script]:
        with self._lock:
            return [*self._scripts, self._global]

    def pending(self) -> dict[str, int]:
        """Replies not served yet, by script label ("global" for the global queue); empty when all were served."""
        with self._lock:
            out = {s.label: s.remaining for s in self._scripts if s.remaining}
            if self._global.remaining:
                out["global"] = self._global.remaining
            return out

    def assert_all_served(self) -> None:
        left = self.pending()
        if left:
            raise AssertionError(f"scripted replies never requested: {left}")

    def reset(self) -> None:
        """Forget scripts, recorded requests and errors; restore the constructor's default reply and chunk delay."""
        with self._lock:
            self._scripts.clear()
            self._global = Script(None, ())
            self._requests.clear()
        self.default_reply, self.chunk_delay = self._initial
        self.errors.clear()

    # ---- recorded requests ----------------------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def requests_for(self, match: str | None = None, *, api: str | None = None) -> list[RecordedRequest]:
        """Recorded requests whose first user message contains ``match`` and/or whose ``api`` is given."""
        return [
            r for r in self.requests
            if (match is None or match in r.first_user_text) and (api is None or r.api == api)
        ]

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until at least ``n`` requests have arrived (raises TimeoutError)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._requests) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self._requests)} requests arrived, expected {n}")
                self._changed.wait(left)
            return list(self._requests)

    # ---- SDK clients (imported lazily: this module itself needs only the standard library) ------------------------

    def openai_client(self, **kwargs: Any) -> Any:
        from openai import OpenAI

        return OpenAI(**{"base_url": self.openai_base_url, "api_key": "test-key", "max_retries": 0, **kwargs})

    def async_openai_client(self, **kwargs: Any) -> Any:
        from openai import AsyncOpenAI

        return AsyncOpenAI(**{"base_url": self.openai_base_url, "api_key": "test-key", "max_retries": 0, **kwargs})

    def anthropic_client(self, **kwargs: Any) -> Any:
        from anthropic import Anthropic

        return Anthropic(**{"base_url": self.anthropic_base_url, "api_key": "test-key", "max_retries": 0, **kwargs})

    def async_anthropic_client(self, **kwargs: Any) -> Any:
        from anthropic import AsyncAnthropic

        return AsyncAnthropic(
            **{"base_url": self.anthropic_base_url, "api_key": "test-key", "max_retries": 0, **kwargs}
        )

    def gemini_client(self, *, vertex: bool = False, **kwargs: Any) -> Any:
        """A google-genai ``Client`` on the Gemini API wire (``client.aio`` is its async side); no retries.
        ``vertex=True``: in Vertex AI mode (project ``fake-project``, ``us-central1``, an OAuth token that needs no
        refresh: ``Authorization: Bearer fake-token``), which calls Vertex's paths."""
        from google import genai

        if vertex:
            from google.oauth2.credentials import Credentials

            auth: dict[str, Any] = {"vertexai": True, "project": "fake-project", "location": "us-central1",
                                    "credentials": Credentials(token="fake-token")}
        else:
            auth = {"api_key": "test-key"}
        return genai.Client(**{**auth, "http_options": {"base_url": self.url}, **kwargs})

    def ollama_client(self, **kwargs: Any) -> Any:
        """An ``ollama.Client`` on Ollama's native wire (``/api/chat``)."""
        from ollama import Client

        return Client(**{"host": self.url, **kwargs})

    def async_ollama_client(self, **kwargs: Any) -> Any:
        from ollama import AsyncClient

        return AsyncClient(**{"host": self.url, **kwargs})

    def cohere_client(self, **kwargs: Any) -> Any:
        """A cohere ``ClientV2`` on Cohere's v2 wire, its retries off (the SDK retries 429 and 5xx twice)."""
        from cohere import ClientV2

        return _no_retries(ClientV2(**{"base_url": self.url, "api_key": "test-key", **kwargs}))

    def async_cohere_client(self, **kwargs: Any) -> Any:
        from cohere import AsyncClientV2

        return _no_retries(AsyncClientV2(**{"base_url": self.url, "api_key": "test-key", **kwargs}))

    @property
    def mistral_url(self) -> str:
        """The mistralai SDK's ``server_url``: Mistral's paths are OpenAI's, so its wire sits under ``/mistral``."""
        return f"{self.url}/mistral"

    def mistral_client(self, **kwargs: Any) -> Any:
        """A mistralai ``Mistral`` client (sync and async methods alike) on Mistral's wire; no retries."""
        from mistralai.client import Mistral

        return Mistral(**{"api_key": "test-key", "server_url": self.mistral_url, **kwargs})

    def groq_client(self, **kwargs: Any) -> Any:
        """A ``groq.Groq`` client on Groq's wire (``/openai/v1/chat/completions``); no retries."""
        from groq import Groq

        return Groq(**{"base_url": self.url, "api_key": "test-key", "max_retries": 0, **kwargs})

    def async_groq_client(self, **kwargs: Any) -> Any:
        from groq import AsyncGroq

        return AsyncGroq(**{"base_url": self.url, "api_key": "test-key", "max_retries": 0, **kwargs})

    def bedrock_client(self, **kwargs: Any) -> Any:
        """A boto3 ``bedrock-runtime`` client on Bedrock's Converse wire: dummy credentials (signed, never
        checked), ``us-east-1``, one attempt per call (botocore retries throttling and 5xx by default)."""
        import boto3
        from botocore.config import Config

        return boto3.client(**{
            "service_name": "bedrock-runtime", "endpoint_url": self.url, "region_name": "us-east-1",
            "aws_access_key_id": "testing", "aws_secret_access_key": "testing-secret",
            "config": Config(retries={"total_max_attempts": 1, "mode": "standard"}), **kwargs,
        })

    # ---- internals used by the handler ----------------------------------------------------------------------------

    def _next_id(self) -> int:
        return next(self._ids)

    def _sleep(self, seconds: float) -> bool:
        """Sleep; True when the server is stopping (the handler should give up)."""
        return self._stopping.wait(seconds)

    def _hold(self, event: threading.Event, timeout: float = 60.0) -> bool:
        """Wait for a reply's ``hold`` event; False when the server stops first or it never comes."""
        deadline = time.monotonic() + timeout
        while not event.wait(0.05):
            if self._stopping.is_set() or time.monotonic() > deadline:
                return False
        return True

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self.connections_accepted += 1
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def _record(self, api: str, method: str, path: str, query: str, headers: dict[str, str], body: Any,
                raw: bytes) -> RecordedRequest:
        with self._changed:
            req = RecordedRequest(len(self._requests), api, method, path, query, headers, body, raw)
            self._requests.append(req)
            self._changed.notify_all()
            return req

    def _next_reply(self, req: RecordedRequest) -> tuple[Reply, str]:
        with self._lock:
            matched = False
            for s in self._scripts:
                if s.matches(req):
                    matched = True
                    if s.pending:
                        s.served.append(req)
                        return s.pending.popleft(), str(s.label)
            if not matched and self._global.pending:
                self._global.served.append(req)
                return self._global.pending.popleft(), "global"
            return self.default_reply, "default"


def _no_retries(client: Any) -> Any:
    """A Fern-made SDK client (cohere) without its default two retries: each scripted reply is one request."""
    client._client_wrapper.httpx_client.base_max_retries = 0
    return client
