"""Normalise the many ways a tool list is written into :class:`DeclaredTool` records."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import weakref
from collections.abc import Callable, Iterable
from typing import Any, cast, final, get_args

from pydantic import TypeAdapter

from .. import _json
from ..models import DeclaredTool, ToolOrigin


def declared_tool(tool: Any, origin: str = "always") -> DeclaredTool | None:
    """One :class:`DeclaredTool` for ``tool``, whatever provider format it is written in.

    Accepts a ``DeclaredTool``; an OpenAI ``{"type": "function", "function": {...}}`` or
    Responses-style ``{"type": "function", "name": ...}`` entry; an Anthropic
    ``{"name", "description", "input_schema"}`` entry; a server tool (``{"type":
    "web_search_20250305", "name": "web_search"}``: its type kept); a plain mapping with ``name``;
    a function (its name and docstring); or a bare name.
    """
    if isinstance(tool, DeclaredTool):
        return tool
    if type(origin) is not str or origin not in _ORIGINS:
        origin = "always"  # not one of the origins: the tool was offered, that is all that is known
    if isinstance(tool, str):
        return DeclaredTool(name=tool, origin=origin)  # type: ignore[arg-type]
    if not isinstance(tool, dict) and not inspect.isroutine(tool) and not isinstance(tool, type):
        fields = _object_fields(tool)  # a provider's own tool object: read as the dict it stands for
        if fields is not None:
            tool = fields
    if isinstance(tool, dict):
        spec = tool.get("function")
        if not isinstance(spec, dict):
            spec = tool
        name = spec.get("name")
        if not name:
            return None
        params = spec.get("parameters", spec.get("input_schema", spec.get("inputSchema")))
        if params is None:  # Gemini's FunctionDeclaration: a JSON schema beside its own Schema
            params = spec.get("parameters_json_schema", spec.get("parametersJsonSchema"))
        if not isinstance(params, dict) and params is not None:
            params = _object_fields(params)  # a schema object (Gemini's types.Schema)
        description = spec.get("description")
        own_origin = tool.get("origin", origin)
        kind = tool.get("type")  # a server tool's own type; "function" / "custom": the application's
        return DeclaredTool(
            name=name if type(name) is str else _json.to_text(name),
            description=description if description is None or type(description) is str else _json.to_text(description),
            parameters=_schema(params) if isinstance(params, dict) else None,
            origin=cast(ToolOrigin, own_origin if type(own_origin) is str and own_origin in _ORIGINS else origin),
            type=kind if type(kind) is str and kind and kind not in _CLIENT_TYPES else None,
        )
    if callable(tool):
        name = getattr(tool, "__loopscope_tool_name__", None) or getattr(tool, "__name__", None)
        if not name:
            return None
        return DeclaredTool(name=name, description=inspect.getdoc(tool), parameters=_parameters(tool), origin=origin)  # type: ignore[arg-type]
    return None


_TOOL_FIELDS = (
    "type", "name", "description", "parameters", "parameters_json_schema", "input_schema", "inputSchema", "function",
)


def _object_fields(obj: Any) -> dict[str, Any] | None:
    """A tool (or a schema) written as an object, as the dict it stands for: a pydantic model
    (``model_dump``: Gemini's ``types.FunctionDeclaration``, openai's and anthropic's
    models), a dataclass, or any object with the fields a tool has (``name``,
    ``description``, ``parameters``...). None when it has none of them."""
    try:
        dump = getattr(obj, "model_dump", None)
        if callable(dump):
            found = dump(mode="json", exclude_none=True)
            return found if isinstance(found, dict) else None
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return {k: v for k, v in dataclasses.asdict(obj).items() if v is not None}
        to_dict = getattr(obj, "to_dict", None)
        if callable(to_dict):
            found = to_dict()
            if isinstance(found, dict):
                return found
        fields = {key: getattr(obj, key, None) for key in _TOOL_FIELDS}
        fields = {key: value for key, value in fields.items() if value is not None}
        if not fields.get("name") and not fields.get("function"):
            return None
        for key in ("parameters", "parameters_json_schema", "input_schema", "inputSchema", "function"):
            value = fields.get(key)
            if value is not None and not isinstance(value, dict):
                nested = _object_fields(value) if not isinstance(value, (str, bytes)) else None
                fields[key] = nested if nested is not None else value
        return fields
    except Exception:  # a provider object that will not be read: the tool is left out
        return None


def _expanded(tool: Any) -> list[Any]:
    """The tools one entry declares: a Gemini ``Tool`` (an object or its dict) holds several
    ``function_declarations``, each a tool; its server tools (``google_search``,
    ``code_execution``...) are tools of their own, by their name. Any other entry is itself."""
    if type(tool) is str or type(tool) is DeclaredTool:
        return [tool]
    if type(tool) is dict:
        if "function_declarations" not in tool and "functionDeclarations" not in tool:
            return [tool]
        fields: dict[str, Any] | None = tool
    elif inspect.isroutine(tool) or isinstance(tool, type) or getattr(tool, "function_declarations", None) is None:
        return [tool]
    else:
        fields = _object_fields(tool)
    if not fields:
        return [tool]
    out: list[Any] = list(fields.get("function_declarations") or fields.get("functionDeclarations") or ())
    for key, value in fields.items():
        if key not in ("function_declarations", "functionDeclarations") and value is not None:
            out.append({"name": key, "type": key})  # a server tool: run at the provider
    return out


_ORIGINS = frozenset(get_args(ToolOrigin))
_CLIENT_TYPES = frozenset(("function", "custom"))
"""The ``type`` of a tool the application runs (OpenAI's function tools, Anthropic's custom
ones); any other names a server tool (:attr:`DeclaredTool.type`)."""


def _schema(params: dict[Any, Any]) -> dict[str, Any]:
    """A parameters schema with text keys (a key of another type as its text)."""
    if all(type(key) is str for key in params):
        return params
    return {_json.to_text(key): value for key, value in params.items()}

_schemas: weakref.WeakKeyDictionary[Callable[..., Any], dict[str, Any] | None] = weakref.WeakKeyDictionary()


def _parameters(fn: Callable[..., Any]) -> dict[str, Any] | None:
    """The JSON schema of a function's parameters, as a model would be offered it (cached)."""
    try:
        return _schemas[fn]
    except (KeyError, TypeError):
        pass
    try:
        # a function's adapter gives its arguments' schema; the stubs want a type form
        schema: dict[str, Any] | None = TypeAdapter(cast(Any, fn)).json_schema()
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
    for entry in tools:
        for tool in _expanded(entry):
            record = declared_tool(tool, origin)
            if record is not None:
                out.append(record)
    return out


def union_into(union: dict[str, DeclaredTool], tools: Iterable[DeclaredTool]) -> None:
    """Add ``tools`` to ``union`` keeping the first declaration of each name, in order."""
    for tool in tools:
        union.setdefault(tool.name, tool)


@final  # `type(tools) is ToolSet` stands for isinstance (and narrows for the type checker)
class ToolSet:
    """A normalised tool list as a round or turn declares it, with its JSON made once.

    The lists adapters see are usually the very same tool dicts call after call, so
    :func:`tool_set` hands back one shared, read-only ``ToolSet`` for them: no model
    validation and no JSON encoding on the hot path. Its :class:`DeclaredTool` records
    are shared too; never mutate them (the turn summary gets copies).
    """

    __slots__ = ("_declared", "_definitions", "tools", "unique")

    def __init__(self, tools: tuple[DeclaredTool, ...]) -> None:
        self.tools = tools
        self.unique = len({t.name for t in tools}) == len(tools)  # then a union of it alone is itself
        self._definitions: str | None = None
        self._declared: str | None = None

    def __bool__(self) -> bool:
        return bool(self.tools)

    def definitions(self) -> str:
        """``gen_ai.tool.definitions``: the tools as offered to the model (no origin)."""
        text = self._definitions
        if text is None:
            text = self._definitions = definitions_json(self.tools)
        return text

    def declared(self) -> str:
        """``loopscope.turn.declared_tools``: the tools with their origin."""
        text = self._declared
        if text is None:
            text = self._declared = declared_json(self.tools)
        return text


def definitions_json(tools: Iterable[DeclaredTool]) -> str:
    """``gen_ai.tool.definitions``: each tool with the ``type`` its JSON schema requires (a server
    tool's own, ``function`` for the application's), then its name, description and parameters."""
    return _json.dumps([tool_definition(t) for t in tools])


def tool_definition(tool: DeclaredTool) -> dict[str, Any]:
    """One ``gen_ai.tool.definitions`` entry (the conventions' FunctionToolDefinition, or a
    GenericToolDefinition for a server tool)."""
    entry = tool.model_dump(exclude={"origin", "type"}, exclude_none=True)
    return {"type": tool.type or "function", **entry}


def declared_json(tools: Iterable[DeclaredTool]) -> str:
    return _json.dumps([t.model_dump(exclude_none=True) for t in tools])


EMPTY = ToolSet(())

_CACHE_SIZE = 512
# (id(tool dict), origin) -> (the dict itself, a deep copy of it as it was, its record). The
# entry holds the dict, so its id cannot be reused while cached; the copy tells whether it
# was changed in place since.
_by_dict: dict[tuple[int, str], tuple[Any, Any, DeclaredTool | None]] = {}
_by_name: dict[tuple[str, str], DeclaredTool] = {}  # bare names and {"name": ...} dicts
# (a tool dict's name, origin) -> (a deep copy of the last dict of that name, its record)
_by_value: dict[tuple[Any, str], tuple[Any, DeclaredTool | None]] = {}
# the ids of a list's records -> its ToolSet (which holds the records: ids stay theirs)
_sets: dict[tuple[int, ...], ToolSet] = {}


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    if len(cache) >= _CACHE_SIZE:
        try:
            del cache[next(iter(cache))]  # the oldest entry
        except (KeyError, StopIteration, RuntimeError):  # another thread got there first
            pass
    cache[key] = value


def _cached_dict(tool: dict[str, Any], origin: str) -> DeclaredTool | None:
    key = (id(tool), origin)
    entry = _by_dict.get(key)
    if entry is not None and entry[0] is tool:
        try:
            if entry[1] == tool:
                return entry[2]
        except Exception:  # a value whose == does not answer: compute it afresh
            return declared_tool(tool, origin)
    if len(tool) == 1 and type(tool.get("name")) is str and tool["name"]:
        return _cached_name(tool["name"], origin, tool)  # what a bare name gives
    # a library may hand a copy of the same tools with every call (LiteLLM deep-copies its
    # request): a copy equal to one seen is that tool
    named = (_dict_name(tool), origin)
    seen = _by_value.get(named) if named[0] is not None else None
    if seen is not None:
        try:
            if seen[0] == tool:
                return seen[1]
        except Exception:
            return declared_tool(tool, origin)
    record = declared_tool(tool, origin)
    try:
        snapshot = copy.deepcopy(tool)
        if not snapshot == tool:  # noqa: SIM201 - NaN and friends: never a hit
            return record
    except Exception:
        return record
    _remember(_by_dict, key, (tool, snapshot, record))
    if named[0] is not None:
        _remember(_by_value, named, (snapshot, record))
    return record



def _dict_name(tool: dict[str, Any]) -> str | None:
    """A tool dict's name (OpenAI's ``function.name``, or a top-level ``name``), if a string."""
    function = tool.get("function")
    name = function.get("name") if type(function) is dict else tool.get("name")
    return name if type(name) is str else None


# provider tool objects: a routine or class by identity, (id, origin) -> (it, its records); any
# other object by value, (its type, its names, origin) -> (a deep copy of it as it was, its
# records): an SDK may hand a copy of the user's tools with every call (google-genai
# deep-copies its config each round), and a copy equal to the one seen is the same tools
_by_object: dict[tuple[Any, ...], tuple[Any, tuple[DeclaredTool, ...]]] = {}


_kinds: dict[type, int] = {}  # a tool object's type -> _BY_IDENTITY, _BY_VALUE or _NOT_CACHED
_BY_IDENTITY, _BY_VALUE, _NOT_CACHED = 0, 1, 2


def _kind(tool: Any) -> int:
    """How a tool object of this type is cached (``inspect`` asked once per type: on a pydantic
    model each of its lookups of a missing attribute raises and catches, microseconds a call)."""
    kind = type(tool)
    found = _kinds.get(kind)
    if found is None:
        if inspect.isroutine(tool) or isinstance(tool, type):
            found = _BY_IDENTITY
        else:
            found = _NOT_CACHED if kind.__eq__ is object.__eq__ else _BY_VALUE
        if len(_kinds) < _CACHE_SIZE:
            _kinds[kind] = found
    return found


def _names(tool: Any) -> Any:
    """What tells a tool object from others of its type cheaply: its name, or its function
    declarations' names (a Gemini ``Tool``), read from its ``__dict__`` (a pydantic model's
    fields are there); the entry's equality check decides."""
    fields = getattr(tool, "__dict__", None)
    if type(fields) is not dict:
        return None
    name = fields.get("name")
    if name is not None:
        return name if type(name) is str else None
    declarations = fields.get("function_declarations")
    if type(declarations) is list:
        return tuple(getattr(d, "__dict__", {}).get("name") if type(d) is not dict else d.get("name")
                     for d in declarations)
    return None


def _cached_object(tool: Any, origin: str) -> tuple[DeclaredTool, ...] | None:
    """The records of a tool written as an object (not a dict or a name): cached, so that
    the same tools offered call after call are not normalised again; None when it cannot be
    (its type compares by identity only: a copy would never hit)."""
    how = _kind(tool)
    if how == _BY_IDENTITY:
        key: tuple[Any, ...] = (id(tool), origin)
        entry = _by_object.get(key)
        if entry is not None and entry[0] is tool:
            return entry[1]
        records = tuple(declared_tools((tool,), origin))
        _remember(_by_object, key, (tool, records))  # held: its id stays its own while cached
        return records
    if how == _NOT_CACHED:
        return None
    key = (type(tool), _names(tool), origin)
    entry = _by_object.get(key)
    try:
        if entry is not None and entry[0] == tool:
            return entry[1]
        records = tuple(declared_tools((tool,), origin))
        snapshot = copy.deepcopy(tool)
        if snapshot == tool:  # NaN and friends: never a hit, never cached
            _remember(_by_object, key, (snapshot, records))
        return records
    except Exception:  # a value that will not copy or compare: read afresh every time
        return None


def _cached_name(name: str, origin: str, tool: Any) -> DeclaredTool | None:
    key = (name, origin)
    record = _by_name.get(key)
    if record is None:
        record = declared_tool(tool, origin)
        if record is None:
            return None
        _remember(_by_name, key, record)
    return record


def tool_set(tools: Iterable[Any] | ToolSet | None, origin: str = "always") -> ToolSet:
    """The :class:`ToolSet` of ``tools`` (see :func:`declared_tools`), shared between calls
    that offer the same, unchanged tool dicts, names or objects (functions, a provider's tool
    objects, or copies equal to them)."""
    if type(tools) is ToolSet:
        return tools
    if not tools:
        return EMPTY
    records = []
    cacheable = True
    for tool in tools:
        kind = type(tool)
        if kind is dict and "function_declarations" not in tool:
            record = _cached_dict(tool, origin)
        elif kind is str:
            record = _cached_name(tool, origin, tool)
        else:
            found = _cached_object(tool, origin) if kind is not DeclaredTool else None
            if found is None:
                cacheable = False
                found = tuple(declared_tools((tool,), origin))
            records.extend(found)  # a provider's object may declare several
            continue
        if record is not None:
            records.append(record)
    if not records:
        return EMPTY
    if not cacheable:
        return ToolSet(tuple(records))
    key = tuple(map(id, records))
    found = _sets.get(key)
    if found is None:
        found = ToolSet(tuple(records))
        _remember(_sets, key, found)
    return found
