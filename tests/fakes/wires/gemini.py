"""Google's Gemini API wire, as the google-genai SDK calls it (``genai.Client(api_key=..., http_options=
{"base_url": server.url})``), written from the API reference of ``models.generateContent``:

- ``POST /v1beta/models/{model}:generateContent``: one ``GenerateContentResponse`` JSON;
- ``POST /v1beta/models/{model}:streamGenerateContent?alt=sse``: Server-Sent Events, one
  ``GenerateContentResponse`` per ``data:`` line, no event names and no end marker;
- Vertex AI's paths too (``/v1beta1/projects/P/locations/L/publishers/google/models/{model}:...``).

A request's ``contents`` hold ``role: "user"|"model"`` turns of ``parts``: ``text``, ``functionCall``
``{name, args}`` and ``functionResponse`` ``{name, response}``, with no call ids (an ``id`` appears only
when the caller sets one). A candidate's ``finishReason`` is ``STOP`` for text and function calls alike,
``MAX_TOKENS``, ``SAFETY``, ... Usage (``usageMetadata``): ``promptTokenCount`` (cached content
included), ``candidatesTokenCount`` (thoughts not included), ``thoughtsTokenCount``,
``cachedContentTokenCount``, ``totalTokenCount`` (prompt + candidates + thoughts). Errors are Google's
``{"error": {"code", "message", "status"}}``, the same object as a stream's failing ``data:`` line, which
the SDK raises as ``errors.ClientError`` (4xx) or ``errors.ServerError`` (5xx).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import Frame, Renderer, Route, Wire, content_text, pieces

GENERATE = "generate_content"

_FINISH = {"STOP", "MAX_TOKENS", "SAFETY", "RECITATION", "LANGUAGE", "OTHER", "BLOCKLIST", "PROHIBITED_CONTENT",
           "SPII", "MALFORMED_FUNCTION_CALL", "IMAGE_SAFETY", "UNEXPECTED_TOOL_CALL"}
_FROM_NEUTRAL = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"}

# google.rpc.Code names by HTTP status, as the API sends them in error.status
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           409: "ABORTED", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL", 501: "NOT_IMPLEMENTED",
           503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
_MESSAGES = {400: "Request contains an invalid argument.", 401: "API key not valid. Please pass a valid API key.",
             403: "The caller does not have permission", 404: "models/fake is not found for API version v1beta.",
             429: "Resource has been exhausted (e.g. check quota).", 500: "An internal error has occurred.",
             503: "The model is overloaded. Please try again later."}

_METHOD = r":(?P<method>generateContent|streamGenerateContent)"


class GeminiRenderer(Renderer):
    def _finish(self) -> str:
        return self.stop(_FINISH, _FROM_NEUTRAL)

    def _usage(self, *, final: bool = True) -> dict[str, Any]:
        u = self.usage
        if not final:  # the stream's chunks before the last carry the prompt's count only
            return {"promptTokenCount": u.input_tokens, "totalTokenCount": u.input_tokens}
        usage: dict[str, Any] = {
            "promptTokenCount": u.input_tokens,
            "candidatesTokenCount": u.output_tokens,
            "totalTokenCount": u.input_tokens + u.output_tokens + u.reasoning_tokens,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": u.input_tokens}],
        }
        if u.cached_tokens:
            usage["cachedContentTokenCount"] = u.cached_tokens
            usage["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": u.cached_tokens}]
        if u.reasoning_tokens:
            usage["thoughtsTokenCount"] = u.reasoning_tokens
        return {**usage, **self.reply.usage_extra}

    def _call_parts(self) -> list[dict[str, Any]]:
        parts = []
        for tc in self.reply.calls:
            call: dict[str, Any] = {"name": tc.name, "args": tc.arguments_dict}
            if tc.id:  # the Developer API sends no ids; a script may give one
                call["id"] = tc.id
            parts.append({"functionCall": call})
        return parts

    def _response(self, parts: list[dict[str, Any]], *, final: bool) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if final:
            candidate["finishReason"] = self._finish()
            if candidate["finishReason"] == "SAFETY":
                candidate["safetyRatings"] = [{"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH",
                                               "blocked": True}]
        return {"candidates": [candidate], "usageMetadata": self._usage(final=final), "modelVersion": self.model,
                "responseId": f"fake{self.n:05d}"}

    def json_body(self) -> dict[str, Any]:
        r = self.reply
        parts = ([{"text": r.text}] if r.text or not r.calls else []) + self._call_parts()
        if not parts:
            parts = [{"text": ""}]
        return self._response(parts, final=True)

    def frames(self) -> list[Frame]:
        r = self.reply
        chunks: list[list[dict[str, Any]]] = [[{"text": p}] for p in pieces(r.text or "", r.chunk_size)]
        chunks += [[part] for part in self._call_parts()]  # each function call comes whole, in a chunk of its own
        if not chunks:
            chunks = [[{"text": ""}]]
        last = len(chunks) - 1  # the last chunk carries the finish reason and the full usage, as the API's do
        return [(None, self._response(parts, final=i == last)) for i, parts in enumerate(chunks)]

    def _error(self, status: int) -> dict[str, Any]:
        r = self.reply
        name = r.error_type or _STATUS.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")
        return {"error": {"code": status, "message": r.error_message or _MESSAGES.get(status, f"HTTP {status}"),
                          "status": name}}

    def error_body(self, status: int) -> dict[str, Any]:
        return self._error(status)

    def stream_error_frame(self, seq: int) -> Frame:
        return None, self._error(500)


class GeminiWire(Wire):
    name = "gemini"
    routes = (
        Route(r"/(?P<version>v1|v1beta|v1alpha)/models/(?P<model>[^:/]+)" + _METHOD, GENERATE),
        Route(r"/(?P<version>v1|v1beta1)/(?:projects/[^/]+/locations/[^/]+/)?publishers/google/models/"
              r"(?P<model>[^:/]+)" + _METHOD, GENERATE),
    )
    renderer = GeminiRenderer

    def is_stream(self, api: str, params: Mapping[str, str], body: Any) -> bool:
        return params.get("method") == "streamGenerateContent"

    def first_user_text(self, api: str, body: Any) -> str:
        if not isinstance(body, dict):
            return ""
        for content in body.get("contents") or ():
            if isinstance(content, dict) and content.get("role", "user") == "user":
                text = content_text(content.get("parts"))
                if text:
                    return text
        return ""

    def tool_results(self, api: str, body: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for content in (body.get("contents") if isinstance(body, dict) else None) or ():
            for part in (content.get("parts") if isinstance(content, dict) else None) or ():
                fr = part.get("functionResponse") if isinstance(part, dict) else None
                if isinstance(fr, dict):
                    out.append({"id": fr.get("id"), "name": fr.get("name"), "content": fr.get("response")})
        return out
