"""Typed request parameters and the server a call goes to, as an adapter reports them.

:func:`request_parameters` takes every parameter loopscope names, keyword-only and typed
(the names :data:`loopscope.semconv.REQUEST_PARAMETERS` maps to span attributes), and gives
the mapping ``ModelRequest.parameters`` is. A provider's parameter with no name of its own
here goes in ``other``: it is kept (the span's ``loopscope.request.other``, the store's
``parameters.other``), and the first time each one is seen the log says so, for the
adapter's writer to name it (Gemini's ``max_output_tokens`` is ``max_tokens``).

:func:`server_of` reads the server an SDK's client talks to from its base URL (any text
URL, httpx's ``URL``, ``urllib``'s split): the adapter hands its client's URL, public or
not, and the recorder never reads an SDK's private fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from .._guard import warn_once

_KEPT = (str, int, float, list, tuple, dict)


def request_parameters(
    *,
    provider: str,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: float | None = None,
    max_tokens: int | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    seed: int | None = None,
    stop: str | Sequence[str] | None = None,
    choice_count: int | None = None,
    reasoning_effort: str | None = None,
    tool_choice: str | None = None,
    service_tier: str | None = None,
    output_type: str | None = None,
    response_format: Mapping[str, Any] | None = None,
    parallel_tool_calls: bool | None = None,
    logprobs: bool | None = None,
    top_logprobs: int | None = None,
    store: bool | None = None,
    include: Sequence[str] | None = None,
    reasoning: Mapping[str, Any] | None = None,
    thinking: Mapping[str, Any] | None = None,
    system_instructions: Any = None,
    server: Mapping[str, Any] | None = None,
    other: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``ModelRequest.parameters``: the parameters a request sets (None: not set; values of
    other types than a number, a text, a list or a mapping are left out). ``tool_choice``:
    ``auto``, ``none``, ``required`` or the name of the one tool; ``system_instructions``:
    the system prompt apart from the messages (a text, or parts); ``server``: what
    :func:`server_of` gave; ``other``: the provider's parameters with no name here (kept
    under ``other``, each said once in the log)."""
    found = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "max_tokens": max_tokens,
        "frequency_penalty": frequency_penalty,
        "presence_penalty": presence_penalty,
        "seed": seed,
        "stop": [stop] if isinstance(stop, str) else list(stop) if isinstance(stop, (list, tuple)) else None,
        "choice_count": choice_count,
        "reasoning_effort": reasoning_effort,
        "tool_choice": tool_choice,
        "service_tier": service_tier,
        "output_type": output_type,
        "response_format": response_format,
        "parallel_tool_calls": parallel_tool_calls,
        "logprobs": logprobs,
        "top_logprobs": top_logprobs,
        "store": store,
        "include": list(include) if isinstance(include, (list, tuple)) else None,
        "reasoning": reasoning,
        "thinking": thinking,
        "system_instructions": system_instructions,
    }
    out = {key: value for key, value in found.items() if value is not None and isinstance(value, _KEPT)}
    if server:
        out.update(server)
    if other:
        kept = {}
        for key, value in other.items():
            if value is None:
                continue
            kept[str(key)] = value
            warn_once(
                f"request parameter {provider} {key}",
                "loopscope: the %s request parameter %r has no name of its own in loopscope; kept under 'other'",
                provider,
                key,
            )
        if kept:
            out["other"] = kept
    return out


_servers: dict[Any, dict[str, Any]] = {}


def server_of(url: Any) -> dict[str, Any]:
    """``server_address`` / ``server_port`` of a base URL (``https://api.example.com:8443/v1``,
    an httpx ``URL``, any object with ``host`` / ``hostname`` and ``port``); the port only
    where the URL names one. Empty when there is no host. Nothing here raises."""
    if url is None:
        return {}
    text = url if type(url) is str else None
    if text is not None:
        known = _servers.get(text)
        if known is not None:
            return known
        try:
            parts = urlsplit(text if "//" in text else "//" + text)
            host, port = parts.hostname, parts.port
        except ValueError:  # a port that is no number
            host, port = None, None
    else:
        host = getattr(url, "host", None) or getattr(url, "hostname", None)
        port = getattr(url, "port", None)
    out = {"server_address": host, "server_port": port} if isinstance(host, str) and host else {}
    if out and not isinstance(port, int):
        out["server_port"] = None
    if text is not None:
        if len(_servers) >= 64:
            _servers.clear()
        _servers[text] = out
    return out


__all__ = ["request_parameters", "server_of"]
