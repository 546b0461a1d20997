"""What every wire of the fake model server is made of (standard library only).

A wire is one provider's HTTP API: the routes it answers (:class:`Route`), how a request names its
model, asks for a stream and carries the user's text and tool results (:class:`Wire`), and a
:class:`Renderer` that turns a :class:`~fakes.script.Reply` into that API's JSON body, its stream
frames, its error body and its in-stream error. How the frames go on the wire is the wire's
:class:`Framing`: Server-Sent Events, newline-delimited JSON, or the AWS event-stream binary
framing (``wires/eventstream.py``). The server (``model_server.py``) knows none of the formats.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..script import Reply, Usage, canonical_stop

if TYPE_CHECKING:
    from ..model_server import FakeModelServer

Frame = tuple["str | None", Any]
"""One frame of a stream: (its event name or None, its data: JSON-able, or a str sent as it is)."""

_WORDS = re.compile(r"\S+\s*|\s+")


def pieces(s: str, size: int | None) -> list[str]:
    """Text deltas: ``size`` characters each, or words (with their trailing spaces) when None."""
    if not s:
        return []
    if size:
        return [s[i : i + size] for i in range(0, len(s), size)]
    return _WORDS.findall(s)


def arg_pieces(s: str, size: int | None) -> list[str]:
    """Fragments of a tool call's JSON arguments: ``size`` characters each (12 when None)."""
    size = size or 12
    return [s[i : i + size] for i in range(0, len(s), size)] if s else []


def content_text(content: Any) -> str:
    """The text of a message's content: a string, or the ``text`` of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


# --------------------------------------------------------------------------------------------------------------------
# Framing: how a stream's frames become bytes
# --------------------------------------------------------------------------------------------------------------------


class Framing:
    """Server-Sent Events (the default): ``event: NAME`` when the frame has a name, then ``data: JSON``."""

    content_type: ClassVar[str] = "text/event-stream; charset=utf-8"

    def encode(self, frame: Frame) -> bytes:
        event, data = frame
        payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        head = f"event: {event}\n" if event else ""
        return f"{head}data: {payload}\n\n".encode()


class NDJSONFraming(Framing):
    """Newline-delimited JSON (Ollama's streams): one JSON object a line; frame names are not sent."""

    content_type: ClassVar[str] = "application/x-ndjson"

    def encode(self, frame: Frame) -> bytes:
        data = frame[1]
        payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        return payload.encode() + b"\n"


SSE = Framing()
NDJSON = NDJSONFraming()


def stop_in(reply: Reply, native: Collection[str] = (), neutral: Mapping[str, str] | None = None) -> str:
    """A reply's stop reason in one API's words: as given when it is one of ``native``, else its neutral meaning
    through ``neutral`` (``{"stop": ..., "tool_calls": ..., "length": ..., "content_filter": ...}``)."""
    stop, canonical = canonical_stop(reply)
    if stop in native:
        return stop
    return (neutral or {}).get(canonical, canonical)


# --------------------------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------------------------


class Renderer:
    """Turns one :class:`Reply` into one API's JSON body or stream frames; one per request.

    ``n`` numbers the response (ids, request ids); ``call_ids`` are the tool calls' ids, given or made with the
    wire's ``call_id_prefix``; ``params`` are the route's named groups (a model in the path)."""

    call_id_prefix: ClassVar[str] = "call_fake"

    def __init__(self, server: FakeModelServer, api: str, body: dict[str, Any], reply: Reply,
                 params: Mapping[str, str] | None = None) -> None:
        self.server = server
        self.api = api
        self.body = body
        self.reply = reply
        self.params = dict(params or {})
        self.model = reply.model or str(self.params.get("model") or body.get("model") or "fake-model")
        self.usage = Usage.of(reply.usage)
        self.created = int(time.time())
        n = server._next_id()
        self.n = n
        self.call_ids = [
            tc.id if tc.id is not None else f"{self.call_id_prefix}_{n:05d}_{i}" for i, tc in enumerate(reply.calls)
        ]

    @property
    def request_id(self) -> str:
        return f"req_fake_{self.n:05d}"

    def stop(self, native: Collection[str] = (), neutral: Mapping[str, str] | None = None,
             reply: Reply | None = None) -> str:
        """The stop reason of ``reply`` (this renderer's by default) in this API's words (:func:`stop_in`)."""
        return stop_in(reply or self.reply, native, neutral)

    # ---- what each API defines -----------------------------------------------------------------------------------

    def json_body(self) -> Any:
        raise NotImplementedError

    def frames(self) -> list[Frame]:
        raise NotImplementedError

    def error_body(self, status: int) -> Any:
        raise NotImplementedError

    def error_headers(self, status: int) -> dict[str, str]:
        """Headers an HTTP error adds (Bedrock names its error type in one)."""
        return {}

    def stream_error_frame(self, seq: int) -> Frame:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------------------------------
# Wires
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """A path (a regular expression over the whole path, named groups kept as ``params``) and the API it is."""

    pattern: str
    api: str

    def match(self, path: str) -> dict[str, str] | None:
        m = re.fullmatch(self.pattern, path)
        return None if m is None else {k: v for k, v in m.groupdict().items() if v is not None}


class Wire:
    """One provider's HTTP API: routes, request reading, its renderer and its framing. Subclasses override what
    differs; the defaults read an OpenAI-like JSON body (``model``, ``stream``, ``messages``)."""

    name: ClassVar[str] = ""
    routes: ClassVar[Sequence[Route]] = ()
    renderer: ClassVar[type[Renderer]] = Renderer
    framing: ClassVar[Framing] = SSE
    request_id_header: ClassVar[str] = "x-request-id"

    def is_stream(self, api: str, params: Mapping[str, str], body: Any) -> bool:
        return isinstance(body, dict) and bool(body.get("stream"))

    def model(self, api: str, params: Mapping[str, str], body: Any) -> str | None:
        if "model" in params:
            return params["model"]
        return body.get("model") if isinstance(body, dict) else None

    def first_user_text(self, api: str, body: Any) -> str:
        """The text of the first user message (what a :class:`Script`'s ``match`` string is looked for in)."""
        if not isinstance(body, dict):
            return ""
        for item in body.get("messages") or ():
            if isinstance(item, dict) and item.get("role") == "user":
                return content_text(item.get("content"))
        return ""

    def tool_results(self, api: str, body: Any) -> list[dict[str, Any]]:
        """Tool results sent back to the model, as ``{"id": call id or None, "content": ..., ...}``, in order."""
        return []

    def direct(self, api: str, body: dict[str, Any], raw: bytes) -> Any | None:
        """A JSON answer that consumes no scripted reply (Anthropic's token count), or None."""
        return None

    def render(self, server: FakeModelServer, api: str, body: dict[str, Any], reply: Reply,
               params: Mapping[str, str]) -> Renderer:
        return self.renderer(server, api, body, reply, params)
