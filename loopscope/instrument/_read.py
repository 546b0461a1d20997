"""Reading SDK objects and plain dicts alike: requests hold either, responses are models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel  # adapters test it through is_model

from .. import _json
from ..recorder.adapter import server_of

_models: set[type] = set()  # the response classes seen that are pydantic models


def is_model(value: Any) -> bool:
    """``isinstance(value, BaseModel)``, the class remembered: pydantic's metaclass answers
    ``isinstance`` in Python (~0.3 us), a set lookup costs a tenth of it (an SDK has few
    response classes; bounded all the same)."""
    kind = type(value)
    if kind in _models:
        return True
    if not isinstance(value, BaseModel):
        return False
    if len(_models) >= 256:
        _models.clear()
    _models.add(kind)
    return True


def get(obj: Any, key: str, default: Any = None) -> Any:
    """``obj[key]`` for a mapping, ``obj.key`` for anything else."""
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def field(obj: Any, snake: str, camel: str | None = None) -> Any:
    """A field of an SDK object (``obj.snake``), or of the dict a user wrote it as, in either
    spelling (``snake``, else ``camel``: an SDK whose pydantic models take their JSON aliases,
    google-genai's ``function_call`` / ``functionCall``). Only a ``dict`` is read as a dict."""
    if type(obj) is dict:
        found = obj.get(snake)
        return obj.get(camel) if found is None and camel else found
    return getattr(obj, snake, None)


def enum_value(value: Any) -> Any:
    """An SDK's enum member as its value (``FinishReason.STOP`` -> ``"STOP"``); text and None as they are."""
    return value if value is None or type(value) is str else getattr(value, "value", value)


def kind(value: Any) -> str:
    """What a part of a kind the adapter has no reader for is, by its first field: a dict's first
    key (Bedrock's ``{"image": {...}}``), an SDK model's first field set (google-genai's
    ``Part(inline_data=...)``); ``unknown`` for anything else."""
    fields = value if type(value) is dict else (value.model_dump(exclude_none=True) if is_model(value) else {})
    return next(iter(fields), "unknown")


def arguments(raw: Any) -> Any:
    """Tool call arguments: the JSON the model wrote, decoded when it decodes."""
    if isinstance(raw, str):
        try:
            return _json.parse(raw) if raw.strip() else {}
        except ValueError:
            return raw
    return raw


def text_of(content: Any) -> str | None:
    """The text of a message content: a string, or the text parts of a list."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [get(part, "text") for part in content if get(part, "type") in ("text", "input_text", "output_text")]
        return "".join(t for t in texts if isinstance(t, str)) or None
    return None


_servers: dict[int, tuple[Any, dict[str, Any]]] = {}  # id(base URL) -> (that URL, its server fields)


def stainless_server(instance: Any) -> dict[str, Any]:
    """server.address / server.port of the client a Stainless SDK's resource belongs to (the
    openai and anthropic SDKs: ``resource._client.base_url``), through the kit's ``server_of``
    (an adapter of another SDK hands its own client's URL to ``server_of``). Do not change it."""
    client = getattr(instance, "_client", None)
    # what the openai and anthropic clients' ``base_url`` property returns; that property
    # runs an import statement on every read in openai 3
    url = getattr(client, "_base_url", None)
    if type(url).__name__ != "URL":
        url = getattr(client, "base_url", None)
    known = _servers.get(id(url))
    if known is not None and known[0] is url:
        return known[1]
    out = server_of(url)
    if type(url).__name__ == "URL":  # httpx's URL is immutable: remember it (it is held, so its id stays its own)
        if len(_servers) >= 64:
            _servers.clear()
        _servers[id(url)] = (url, out)
    return out


def number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def count(value: Any) -> int | None:
    """A count a provider may send as a float (Cohere's ``100.0``) as the int it is; None for no number."""
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def items(kwargs: dict[str, Any], key: str) -> Any:
    """The request's ``key`` (messages, input...) ready to read: a one-shot iterator, such as
    a generator, is read into a list and put back, so that the SDK still sends all of it."""
    value = kwargs.get(key)
    if type(value) is list or value is None:
        return value
    if isinstance(value, Iterator):
        value = kwargs[key] = list(value)
    return value


def tool_choice(value: Any) -> str | None:
    """A request's tool choice as text: ``auto`` / ``none`` / ``required`` / ``any`` as
    given, a forced tool by its name (OpenAI ``{"type": "function", "function": {"name"}}``
    or ``{"type": "function", "name"}``, Anthropic ``{"type": "tool", "name"}``), any other
    kind by its type (``{"type": "auto"}`` -> ``auto``)."""
    if value is None or isinstance(value, str):
        return value
    name = get(get(value, "function"), "name") or get(value, "name")
    if isinstance(name, str) and name:
        return name
    kind = get(value, "type")
    return kind if isinstance(kind, str) else None


_OUTPUT_TYPES = {"text": "text", "json_schema": "json", "json_object": "json"}


def output_format(value: Any) -> tuple[dict[str, Any] | None, str | None]:
    """A request's structured-output format (Chat ``response_format``, Responses
    ``text.format``, or the class ``parse()`` is given) as a small summary (its ``type``,
    and a schema's ``name`` and ``strict``: not the schema itself), and its
    ``gen_ai.output.type`` (``text`` or ``json``)."""
    if value is None or type(value).__name__ in ("Omit", "NotGiven"):
        return None, None
    if isinstance(value, type):  # parse(response_format=SomeModel): a JSON schema of that class
        return {"type": "json_schema", "name": value.__name__}, "json"
    kind = get(value, "type")
    if not isinstance(kind, str):
        return None, None
    found: dict[str, Any] = {"type": kind}
    schema = get(value, "json_schema") if kind == "json_schema" else None
    for key in ("name", "strict"):  # Chat nests them under json_schema, Responses does not
        field = get(schema if schema is not None else value, key)
        if isinstance(field, (str, bool)):
            found[key] = field
    return found, _OUTPUT_TYPES.get(kind)


def content_parts(content: Any) -> list[dict[str, Any]]:
    """A message's content as GenAI message parts: its text as text parts, other parts
    (images, files, audio) by their type only (their data is not recorded)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    if not isinstance(content, (list, tuple)):
        return []
    parts: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, str):
            parts.append({"type": "text", "content": part})
            continue
        kind = get(part, "type")
        text = get(part, "text")
        if isinstance(text, str) and kind in ("text", "input_text", "output_text", None):
            parts.append({"type": "text", "content": text})
        elif kind == "refusal":
            parts.append({"type": "refusal", "content": get(part, "refusal")})
        elif isinstance(kind, str):
            parts.append({"type": kind})
    return parts


def json_text(value: Any) -> str:
    """A value (a mapping, an SDK model) as JSON text, for an error body with no message."""
    return _json.dumps(value.model_dump() if isinstance(value, BaseModel) else value)


# -- GenAI messages as JSON text, for the hot path ----------------------------------------------
#
# A request's messages are recorded on every call (gen_ai.input.messages), all of them: a
# message made a dict of parts and then encoded costs ~2 us, most of it the encoder walking
# the little dicts. The common shapes (a text, a tool call, a tool result, all strings) are
# written here as text with the C string encoder, ~0.4 us a message; others go through
# ``_json.dumps`` one message at a time.

_string = json.encoder.encode_basestring  # the C encoder of a str as JSON (non-ASCII kept), as _json uses


string_json = _string


def text_part_json(text: str) -> str:
    """``{"type": "text", "content": text}`` as JSON text."""
    return '{"type":"text","content":' + _string(text) + "}"


# A request holds the conversation so far: every message of it was in the last request
# too (the system prompt in every request). The JSON of the common shapes (a text, a tool
# result, an assistant message asking for tool calls) is kept by their strings, so a message
# costs its encoding once, then a lookup (the strings' hashes are kept by the strings
# themselves): the cost of a call no longer grows with the encoding of its history (22
# messages, 10 of them tool calls: ~16 us a request, ~21-26 us when the calls' messages were
# encoded every time). Bounded in entries and in characters held.
MESSAGE_CACHE_ENTRIES = 1024
MESSAGE_CACHE_CHARS = 1 << 20
"""The message texts kept at most, and their characters (the strings and their JSON): 2-4 MB
at most (the strings are kept alive by it), well inside issue 19's memory budget."""
_made: dict[tuple[str | None, ...], str] = {}
_made_chars = 0


def _remember(key: tuple[str | None, ...], made: str) -> None:
    global _made_chars
    size = len(made)
    for text in key:
        if text is not None:
            size += len(text)
    if size > MESSAGE_CACHE_CHARS // 16:
        return  # one huge message would push out the rest
    if len(_made) >= MESSAGE_CACHE_ENTRIES or _made_chars + size > MESSAGE_CACHE_CHARS:
        _made.clear()  # a new conversation, most likely: start again (cheaper than an LRU per call)
        _made_chars = 0
    _made[key] = made
    _made_chars += size


def text_message_json(role: str, text: str) -> str:
    """``{"role": role, "parts": [{"type": "text", "content": text}]}`` as JSON text."""
    key = ("", role, text)
    made = _made.get(key)
    if made is None:
        made = '{"role":' + _string(role) + ',"parts":[{"type":"text","content":' + _string(text) + "}]}"
        _remember(key, made)
    return made


def tool_result_json(call_id: str, response: str) -> str:
    """A tool message: ``{"role": "tool", "parts": [{"type": "tool_call_response", "id", "response"}]}``."""
    key = ("tool", call_id, response)
    made = _made.get(key)
    if made is None:
        made = '{"role":"tool","parts":[{"type":"tool_call_response","id":' + _string(call_id) + ',"response":' + _string(response) + "}]}"
        _remember(key, made)
    return made


def tool_call_json(call_id: str, name: str, arguments: str) -> str:
    """A ``tool_call`` part (the arguments as the model wrote them)."""
    return '{"type":"tool_call","id":' + _string(call_id) + ',"name":' + _string(name) + ',"arguments":' + _string(arguments) + "}"


def calls_message_json(content: str | None, calls: list[Any]) -> str | None:
    """An assistant message asking for tool calls, ``{"role": "assistant", "parts": [text?,
    tool_call...]}`` as JSON text, for its usual shape (``content`` a string or None, each
    call a dict whose id, name and arguments are strings); None for any other. Kept by its
    strings as the text messages are: in a tool loop every such message of the history is
    in every later request, and its arguments are the longest part to encode."""
    key: list[str | None] = ["call", content]
    for call in calls:
        if type(call) is not dict or type(function := call.get("function")) is not dict:
            return None
        call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
        if type(call_id) is not str or type(name) is not str or type(arguments) is not str:
            return None
        key += (call_id, name, arguments)
    made_key = tuple(key)
    made = _made.get(made_key)
    if made is None:
        parts = [text_part_json(content)] if content is not None else []
        for index in range(2, len(key), 3):
            parts.append(tool_call_json(*key[index : index + 3]))  # type: ignore[arg-type]  # strings, checked above
        made = '{"role":"assistant","parts":[' + ",".join(parts) + "]}"
        _remember(made_key, made)
    return made


def message_json(message: dict[str, Any]) -> str:
    """Any other message (a dict in the GenAI schema) as JSON text."""
    return _json.dumps(message)


def messages_json(fragments: list[str], checked: int | None = None) -> str:
    """The messages' JSON texts as one JSON array; text that is no valid UTF-8 (a lone
    surrogate in a message) has it replaced, as a JSON encoder for the wire would fail on it.
    With ``checked``, the texts from that index on are checked and replaced one by one, in
    ``fragments`` (those before it were already): texts kept for later requests are valid."""
    if checked is not None:
        for index in range(checked, len(fragments)):
            fragments[index] = _valid(fragments[index])
        return "[" + ",".join(fragments) + "]"
    return _valid("[" + ",".join(fragments) + "]")


def _valid(text: str) -> str:
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def reported_json(value: Any) -> str | None:
    """A provider's object (a usage) as it reported it, as JSON text: an SDK model's fields
    the response set, its extras included (DeepSeek's cache counts, OpenRouter's ``cost``),
    zeros and totals too (pydantic's own encoder, in Rust: a Python walk costs twice as
    much); a dict as it is; None for no object."""
    if value is None:
        return None
    if not is_model(value):
        return _json.dumps(value)
    try:
        return value.model_dump_json(exclude_unset=True, warnings=False)
    except Exception:  # a value pydantic cannot encode: the general way
        return _json.dumps(value)
