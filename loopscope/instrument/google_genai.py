"""google-genai (the Gemini API and Vertex AI), on the provider kit.

One model call is one HTTP request: the SDK's ``Models._generate_content`` /
``_generate_content_stream`` (and ``AsyncModels``'), which every public way reaches
(``models.generate_content`` and its stream, ``client.aio``, ``chats`` send_message and its
stream), once per round of automatic function calling (AFC) and per continuation hop. AFC
runs the user's Python functions between those calls through ``_extra_utils``'
``invoke_function_from_dict_args`` (and its async twin): each run is a tool call, with its
arguments, result, error and duration. The provider is ``gcp.vertex_ai`` for a Vertex AI
client, else ``gcp.gemini`` (the GenAI conventions' names), or the one whose host the base URL is.
"""

from __future__ import annotations

from typing import Any

from .._guard import guarded
from ..models import ToolCall
from ..recorder.adapter import (
    Finish,
    FinishMap,
    ModelCall,
    ModelRequest,
    ModelResponse,
    Part,
    Reasoning,
    RequestMessages,
    Text,
    ToolCallRequest,
    ToolCallResponse,
    end_tool,
    provider_at,
    request_parameters,
    server_of,
    start_tool,
    usage,
)
from . import _read as r
from ._calls import async_call, async_tool, streamed, sync_call, sync_tool
from ._patch import Patch, wrap
from ._streams import Gathered, answer_or_stream

FINISH = FinishMap({
    "STOP": Finish.STOP, "MAX_TOKENS": Finish.LENGTH, "MALFORMED_FUNCTION_CALL": Finish.ERROR,
    "UNEXPECTED_TOOL_CALL": Finish.ERROR, "TOO_MANY_TOOL_CALLS": Finish.ERROR,
    "MISSING_THOUGHT_SIGNATURE": Finish.ERROR,
    **dict.fromkeys(("SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY",
                     "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION"), Finish.CONTENT_FILTER),
})
"""Gemini's ``FinishReason`` values (``OTHER``, ``FINISH_REASON_UNSPECIFIED``...: ``stop``)."""

_MODES = {"AUTO": "auto", "ANY": "required", "NONE": "none", "VALIDATED": "auto"}


def _text(value: Any) -> str | None:
    """The text of a system instruction or a content: a string, or its parts' texts."""
    if value is None or type(value) is str:
        return value
    parts = r.field(value, "parts") if not isinstance(value, list) else value
    texts = [p if type(p) is str else r.field(p, "text") for p in parts or ()]
    return "\n".join(t for t in texts if isinstance(t, str)) or None


def _contents(contents: Any) -> list[Any]:
    """The request's contents as a list of contents (loose parts and texts: one user content)."""
    out: list[Any] = []
    loose: list[Any] = []
    for item in contents if type(contents) is list else [] if contents is None else [contents]:
        if type(item) is str or r.field(item, "parts") is None:
            loose.append(item)
        else:
            out += [{"role": "user", "parts": loose}, item] if loose else [item]
            loose = []
    return [*out, {"role": "user", "parts": loose}] if loose else out


def _result(response: Any) -> tuple[Any, bool]:
    """A function response's result, and whether it is an error: the API reads ``output`` and
    ``error`` keys (the SDK's own function calling sends ``result`` or ``error``), else the whole."""
    if type(response) is dict and len(response) == 1:
        key = next(iter(response))
        if key in ("output", "result", "error"):
            return response[key], key == "error"
    return response, False


def _part(part: Any, messages: RequestMessages) -> Any:
    if type(part) is str:
        return Text(part)
    text = r.field(part, "text")
    if text is not None:
        return Reasoning(text) if r.field(part, "thought") else Text(text)
    call = r.field(part, "function_call", "functionCall")
    if call is not None:
        return ToolCallRequest(str(r.field(call, "name")), r.field(call, "args"), r.field(call, "id"))
    answer = r.field(part, "function_response", "functionResponse")
    if answer is not None:
        response = r.field(answer, "response")
        return messages.result(r.field(answer, "id"), response, *_result(response))
    return Part(r.kind(part))


_CONFIG = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "max_tokens": "max_output_tokens",
           "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "seed": "seed",
           "stop": "stop_sequences", "choice_count": "candidate_count"}
"""loopscope's parameter names -> ``GenerateContentConfig``'s (the SDK hands its call a config object)."""


def _parameters(config: Any, server: dict[str, Any], provider: str) -> dict[str, Any]:
    f: dict[str, Any] = getattr(config, "__dict__", None) or {}  # the config model's fields: one lookup each
    calling = getattr(f.get("tool_config"), "function_calling_config", None)
    mode = _MODES.get(str(r.enum_value(getattr(calling, "mode", None))))
    names = getattr(calling, "allowed_function_names", None)
    thinking, mime = f.get("thinking_config"), f.get("response_mime_type")
    return request_parameters(
        provider=provider,
        **{name: f.get(field) for name, field in _CONFIG.items()},
        tool_choice=names[0] if mode == "required" and names and len(names) == 1 else mode,
        output_type="json" if mime == "application/json" else "text" if mime == "text/plain" else None,
        thinking=thinking.model_dump(exclude_none=True) if thinking is not None else None,
        system_instructions=_text(f.get("system_instruction")),
        server=server,
        other={"cached_content": f.get("cached_content")},
    )


def _request(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], stream: bool = False) -> ModelRequest:
    api = instance._api_client
    server = server_of(getattr(api._http_options, "base_url", None))
    provider = provider_at("gcp.vertex_ai" if api.vertexai else "gcp.gemini", server)
    config = kwargs.get("config")
    contents = _contents(kwargs.get("contents"))
    messages = RequestMessages()
    said = []  # the messages as the recorder's conversation finder reads them
    for content in contents:
        role = r.field(content, "role") or "user"
        if role == "model":
            role = "assistant"
        parts = [_part(p, messages) for p in r.field(content, "parts") or ()]
        if role == "user" and parts and all(type(p) is ToolCallResponse for p in parts):
            role = "tool"
        text = _text(content) or ""
        messages.add(role, parts, text or None)  # an empty text leaves the last user text
        said.append({"role": role, "content": text})
    model = kwargs.get("model")
    if type(model) is str and "models/" in model:
        model = model.rpartition("models/")[2]  # "models/x", "publishers/google/models/x": the model's name
    return messages.request(provider, model, tools=getattr(config, "tools", None), stream=stream,
                            parameters=_parameters(config, server, provider), messages=said)


# -- the answer --------------------------------------------------------------------------------


class _Answer(Gathered):
    """What one response (no ``call``), or a stream's chunks, said: read from each
    ``GenerateContentResponse``."""

    def __init__(self, call: ModelCall | None = None) -> None:
        super().__init__(call)
        self.meta: Any = None
        self.blocked = False  # the prompt was blocked: its block reason is the finish reason

    def read(self, response: Any) -> None:
        """One response (a stream's chunk: its text handed on as it comes)."""
        self.response_id = response.response_id or self.response_id
        self.model = response.model_version or self.model
        self.meta = response.usage_metadata or self.meta
        candidates = response.candidates
        if not candidates:
            feedback = response.prompt_feedback  # the prompt was blocked: no candidate at all
            blocked = feedback.block_reason if feedback is not None else None
            if blocked is not None:
                self.reason, self.blocked = blocked, True
            self.chunk()
            return
        candidate = candidates[0]
        self.reason = candidate.finish_reason or self.reason
        content = candidate.content
        for part in (content.parts if content is not None else None) or ():
            text, call = part.text, part.function_call
            if text is not None and part.thought:
                self.thinking.append(text)
            elif text is not None:
                self.said(text)
                continue
            elif call is not None:
                self.calls.append(ToolCall(id=call.id or "", name=str(call.name), arguments=call.args or {}))
            self.chunk()

    def partial(self) -> ModelResponse:
        reason, meta = r.enum_value(self.reason), self.meta
        return ModelResponse(
            text="".join(self.texts) or None,
            tool_calls=self.calls,
            usage=usage(input=meta.prompt_token_count, output=meta.candidates_token_count,
                        cache_read=meta.cached_content_token_count, reasoning=meta.thoughts_token_count,
                        output_includes_reasoning=False) if meta is not None else None,  # thoughts apart
            finish_reason=reason,
            # Gemini says STOP for function calls too
            finish=Finish.CONTENT_FILTER if self.blocked else FINISH.with_calls(reason, self.calls),
            response_id=self.response_id,
            model=self.model,
            thinking="".join(self.thinking) or None,
            provider_usage=r.reported_json(meta),
        )


class _Chunks(_Answer):
    """A stream's accumulator that reads each chunk as the proxy hands it on (``capture``), not
    in batches: with automatic function calling the SDK runs the functions a chunk asks for
    before it reads the next, so the call ends at the chunk with the finish reason, and its
    function calls wait for their runs."""

    def capture(self, chunk: Any) -> None:
        self.read(chunk)
        candidates = chunk.candidates
        if candidates and candidates[0].finish_reason is not None and self.call is not None:
            self.finish(self.call)

    def add(self, item: Any, model_call: ModelCall, /) -> None:
        """Read already (``capture``)."""


def _finish(response: Any, model_call: ModelCall) -> None:
    answer = _Answer()
    answer.read(response)
    answer.finish(model_call)


_deliver = answer_or_stream(_finish, _Chunks)


# -- automatic function calling: the SDK runs the user's functions ----------------------------------


@guarded("google-genai function start")
def _started(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    arguments = args[0] if args else kwargs.get("args")
    function = args[1] if len(args) > 1 else kwargs.get("function_to_invoke")
    return start_tool(str(getattr(function, "__name__", function)), arguments)


@guarded("google-genai function end")
def _ended(execution: Any, exc: BaseException | None, result: Any) -> None:
    if exc is None:
        end_tool(execution, result=result)
    else:  # the SDK's FunctionInvocationError wraps what the function raised: that is the error
        cause = exc.__cause__ or exc.__context__
        end_tool(execution, cause if isinstance(cause, Exception) else exc)


# -- patching -----------------------------------------------------------------------------------------


def patch() -> list[Patch]:
    from google.genai import _extra_utils, models

    patches = [
        wrap(models.Models, "_generate_content", sync_call(_request, _deliver, mark=False)),
        wrap(models.Models, "_generate_content_stream", sync_call(streamed(_request), _deliver, mark=False)),
        wrap(models.AsyncModels, "_generate_content", async_call(_request, _deliver, mark=False)),
        wrap(models.AsyncModels, "_generate_content_stream", async_call(streamed(_request), _deliver, mark=False)),
        wrap(_extra_utils, "invoke_function_from_dict_args", sync_tool(_started, _ended)),  # type: ignore[arg-type]
        wrap(_extra_utils, "invoke_function_from_dict_args_async", async_tool(_started, _ended)),  # type: ignore[arg-type]
    ]
    return [p for p in patches if p is not None]
