"""Normalise the many ways a tool list is written into :class:`DeclaredTool` records."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import TypeAdapter

from ..models import DeclaredTool


def declared_tool(tool: Any, origin: str = "always") -> DeclaredTool | None:
    """One :class:`DeclaredTool` for ``tool``, whatever provider format it is written in.

    Accepts a ``DeclaredTool``; an OpenAI ``{"type": "function", "function": {...}}`` or
    Responses-style ``{"type": "function", "name": ...}`` entry; an Anthropic
    ``{"name", "description", "input_schema"}`` entry; a plain mapping with ``name``;
    a function (its name and docstring); or a bare name.
    """
    if isinstance(tool, DeclaredTool):
        return tool
    if isinstance(tool, str):
        return DeclaredTool(name=tool, origin=origin)  # type: ignore[arg-type]
    if isinstance(tool, dict):
        spec = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name = spec.get("name")
        if not name:
            return None
        params = spec.get("parameters", spec.get("input_schema", spec.get("inputSchema")))
        return DeclaredTool(
            name=str(name),
            description=spec.get("description"),
            parameters=params if isinstance(params, dict) else None,
            origin=tool.get("origin", origin),
        )
    if callable(tool):
        name = getattr(tool, "__loopscope_tool_name__", None) or getattr(tool, "__name__", None)
        if not name:
            return None
        return DeclaredTool(name=name, description=inspect.getdoc(tool), parameters=_parameters(tool), origin=origin)  # type: ignore[arg-type]
    return None


_schemas: weakref.WeakKeyDictionary[Callable[..., Any], dict[str, Any] | None] = weakref.WeakKeyDictionary()


def _parameters(fn: Callable[..., Any]) -> dict[str, Any] | None:
    """The JSON schema of a function's parameters, as a model would be offered it (cached)."""
    try:
        return _schemas[fn]
    except (KeyError, TypeError):
        pass
    try:
        schema: dict[str, Any] | None = TypeAdapter(fn).json_schema()
    except Exception:  # unannotated or exotic signatures: declare the name alone
        schema = None
    try:
        _schemas[fn] = schema
    except TypeError:
        pass
    return schema


def declared_tools(tools: Iterable[Any] | None, origin: str = "always") -> list[DeclaredTool]:
    """Normalise a whole tool list, skipping entries that name no tool."""
    if not tools:
        return []
    out = []
    for tool in tools:
        record = declared_tool(tool, origin)
        if record is not None:
            out.append(record)
    return out


def union_into(union: dict[str, DeclaredTool], tools: Iterable[DeclaredTool]) -> None:
    """Add ``tools`` to ``union`` keeping the first declaration of each name, in order."""
    for tool in tools:
        union.setdefault(tool.name, tool)
