"""Adapters: one module per instrumented library, each activating when its library is imported.

``instrument()`` registers an import hook per adapter; importing loopscope imports no
SDK. :data:`ADAPTERS` is the one list of adapters: each one's name, the library module
whose import activates it, and its adapter module, which has ``patch()`` (wraps what it
needs, returning the patches so they can be undone).
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Any, NamedTuple

from ._patch import Patch, Registration, on_import, restore


class Adapter(NamedTuple):
    target: str
    """The library module whose import activates the adapter."""
    module: str
    """The adapter module (``patch()``), imported only when the target is."""


ADAPTERS: dict[str, Adapter] = {
    "openai": Adapter("openai", "loopscope.instrument.openai"),
    "anthropic": Adapter("anthropic", "loopscope.instrument.anthropic"),
    "roomkit": Adapter("roomkit", "loopscope.instrument.roomkit"),
    "openai_agents": Adapter("agents", "loopscope.instrument.openai_agents"),
    "toolnexus": Adapter("toolnexus", "loopscope.instrument.toolnexus"),
    "pydantic_ai": Adapter("pydantic_ai", "loopscope.instrument.pydantic_ai"),
    "langchain": Adapter("langchain_core", "loopscope.instrument.langchain"),
    "mcp": Adapter("mcp", "loopscope.instrument.mcp"),
    "litellm": Adapter("litellm", "loopscope.instrument.litellm"),
    "bedrock": Adapter("botocore", "loopscope.instrument.bedrock"),
    "groq": Adapter("groq", "loopscope.instrument.groq"),
    "mistral": Adapter("mistralai", "loopscope.instrument.mistral"),
    "cohere": Adapter("cohere", "loopscope.instrument.cohere"),
    "ollama": Adapter("ollama", "loopscope.instrument.ollama"),
    "google_genai": Adapter("google.genai", "loopscope.instrument.google_genai"),
}
"""Every adapter, by name; the name is also the keyword that switches it off."""

_lock = threading.RLock()
_wanted: set[str] = set()
_patches: dict[str, list[Patch | Registration]] = {}
_hooked: set[str] = set()


def _activate(name: str) -> None:
    from .._guard import guard  # here: ``import loopscope`` (and the command line) never needs it

    with _lock:
        if name not in _wanted or name in _patches:
            return
        with guard(f"instrument {name}"):
            adapter = importlib.import_module(ADAPTERS[name].module)
            _patches[name] = adapter.patch()


def _hook(name: str) -> Any:
    def on_import(module: Any) -> None:
        _activate(name)

    return on_import


def instrument(*, find_conversations: bool | None = None, **switches: bool) -> list[str]:
    """Turn on every adapter whose library is importable, now or when it is imported.

    Idempotent. Pass ``openai=False`` (and so on) to leave a library alone. Returns the
    names of the adapters that are on (active or waiting for their import).

    A turn stitched from SDK calls in no named session joins the session of the earlier
    turn whose conversation its request continues (a chat loop is one session);
    ``find_conversations=False`` (or ``LOOPSCOPE_FIND_CONVERSATIONS=0``) gives each such
    turn a session of its own (see ``loopscope.configure``).
    """
    unknown = set(switches) - set(ADAPTERS)
    if unknown:
        raise TypeError(f"unknown adapters: {', '.join(sorted(unknown))} (known: {', '.join(ADAPTERS)})")
    from .. import pipeline

    pipeline.active()  # configure the defaults if the application did not
    if find_conversations is not None:
        pipeline.set_find_conversations(find_conversations)
    with _lock:
        for name, adapter in ADAPTERS.items():
            if not switches.get(name, True):
                continue
            _wanted.add(name)
            if adapter.target in sys.modules:
                _activate(name)
            elif name not in _hooked:
                on_import(adapter.target, _hook(name))
                _hooked.add(name)
        return sorted(_wanted)


def uninstrument() -> None:
    """Restore every original method; hooks that have not fired stay inert."""
    with _lock:
        _wanted.clear()
        for patches in _patches.values():
            restore(patches)
        _patches.clear()


def active() -> list[str]:
    """The adapters whose patches are in place."""
    return sorted(_patches)
