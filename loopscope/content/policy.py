"""The content policy: what message text, tool arguments and results may be kept or sent.

Content (prompts, answers, tool arguments and results) is kept in the local store by
default and sent over OTLP only when the user opts in, as the GenAI conventions ask
(``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY`` or ``true``, see
:mod:`loopscope.content.capture`; or ``configure(capture_content=True)``). Wherever content goes, it is first scrubbed:
secrets matching the redaction patterns are masked, a user hook may rewrite it, and
over-long text is cut with a visible marker that states the original size.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import _json
from .. import semconv as a
from . import capture as _capture
from . import secrets
from .secrets import REDACTED

CONTENT_ATTRIBUTES = frozenset(
    {
        a.INPUT_MESSAGES,
        a.OUTPUT_MESSAGES,
        a.TOOL_CALL_ARGUMENTS,
        a.TOOL_CALL_RESULT,
        "gen_ai.system_instructions",
        # pydantic-ai's own (its instrumentation, which loopscope.instrument() turns on)
        "final_result",
        "pydantic_ai.all_messages",
        "tool_arguments",
        "tool_response",
        a.SEGMENTS,
        a.ROUND_TEXT,
        a.TURN_INPUT,
        a.THINKING,
        a.STATE_VALUE,
        a.CALL_REFUSAL,
    }
)
"""Attributes that carry what was said or passed: sent only when content capture is on."""

TOOL_ATTRIBUTES = frozenset({a.TOOL_DEFINITIONS, a.DECLARED_TOOLS})
"""Attributes that carry declared tools (a JSON list of definitions): sent whatever the
content switch says, as the tools are no conversation, but scrubbed (:meth:`ContentPolicy.mask_tools`):
a description or a parameter's default may hold a key or a signed URL."""

SCRUBBED_ATTRIBUTES = CONTENT_ATTRIBUTES | TOOL_ATTRIBUTES | {
    a.TOOL_ERROR, a.CALL_ERROR, a.TOOL_DESCRIPTION, "exception.message", "exception.stacktrace",
    a.EVALUATION_EXPLANATION,  # a score's explanation may quote what it judges
}
"""Attributes whose text is scrubbed of secrets wherever it goes (errors quote inputs too)."""

# The shapes of secrets masked by default live in one table (secrets.SECRET_SHAPES).
DEFAULT_PATTERNS = secrets.DEFAULT_PATTERNS
"""Secrets masked by default (see :data:`loopscope.content.secrets.SECRET_SHAPES`).
Secret-named values (``password=...``, ``Authorization: ...``) are the key-value rule's."""

Redactor = Callable[[str, str], str]
"""A user hook: ``(attribute_or_field, text) -> text`` applied after the patterns."""


@dataclass
class ContentPolicy:
    """How content is treated on its way to the store and to OTLP.

    ``capture`` (export only; the local store always keeps content) defaults to
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (``true``/``false`` or a mode,
    see :mod:`loopscope.content.capture`). ``max_chars`` caps each
    exported text, ``store_max_chars`` each stored one (0: no cap). ``patterns`` replace
    the default secret patterns; ``key_values`` masks the values of ``password=...``,
    ``"api_key": "..."`` and the like; ``redact`` is a hook run after them. The same
    masking applies to both destinations: to the local store in its writer's thread, to
    OTLP in the exporter's; text that holds JSON stays valid JSON.
    """

    capture: bool | None = None
    max_chars: int = 16_384
    store_max_chars: int = 1_048_576
    patterns: Iterable[str] | None = None
    redact: Redactor | None = None
    key_values: bool = True
    _compiled: re.Pattern[str] = field(init=False, repr=False)
    _secret_groups: tuple[str, ...] = field(init=False, repr=False)
    _literals: tuple[str, ...] | None = field(init=False, repr=False)
    # declared tools are the same text span after span (a tool set's JSON, made once):
    # each is masked once (bounded; not with a hook, which is called every time)
    _tools_masked: dict[str, str] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.capture is None:
            self.capture = _capture.from_environment()  # a flag or a mode: both spellings
        patterns = list(DEFAULT_PATTERNS if self.patterns is None else self.patterns)
        self.patterns = tuple(patterns)
        # one expression for all: a pattern's ``secret`` group (the part it masks) gets a
        # name of its own, as two groups of one expression cannot share a name
        parts, groups = [], []
        for i, pattern in enumerate(patterns):
            if _SECRET_GROUP in pattern:
                pattern = pattern.replace(_SECRET_GROUP, f"(?P<_secret{i}>")
                groups.append(f"_secret{i}")
            parts.append(f"(?:{pattern})")
        self._compiled = re.compile("|".join(parts)) if parts else re.compile(r"(?!x)x")
        self._secret_groups = tuple(groups)
        # the default patterns say which literals their matches hold: text without any is
        # not searched (most text; a substring test is ~20x cheaper than the expression)
        self._literals = secrets.DEFAULT_LITERALS if self.patterns == DEFAULT_PATTERNS else None

    def scrub(self, text: str, where: str = "", limit: int | None = None) -> str:
        """Mask secrets, apply the hook, then cut to ``limit`` characters with a marker."""
        if not isinstance(text, str):
            return text
        return truncate(self.mask(text, where), self.max_chars if limit is None else limit)

    @property
    def masks(self) -> bool:
        """Whether :meth:`mask` can change anything (patterns, key-values or a hook)."""
        return bool(self.patterns) or self.key_values or self.redact is not None

    def mask(self, text: str, where: str = "") -> str:
        """``text`` with secrets masked and the hook applied; never cut."""
        cleaned = text
        if self.patterns or self.key_values:
            lower = text.lower()
            if self.patterns and (self._literals is None or any(lit in lower for lit in self._literals)):
                cleaned = self._compiled.sub(self._mask_match if self._secret_groups else REDACTED, text)
            if self.key_values and any(lit in lower for lit in secrets.KEY_VALUE_LITERALS):
                cleaned = secrets.KEY_VALUE.sub(secrets.mask_key_value, cleaned)
        if self.redact is not None:
            cleaned = self.redact(where, cleaned)
        return cleaned

    def _mask_match(self, match: re.Match[str]) -> str:
        """One pattern's match masked: its ``secret`` group, or all of it without one."""
        for name in self._secret_groups:
            start, end = match.span(name)
            if start >= 0:
                text = match.string
                return f"{text[match.start():start]}{REDACTED}{text[end:match.end()]}"
        return REDACTED

    def scrub_json(self, text: str, where: str = "", limit: int | None = None, *, cap: str = "text") -> str:
        """:meth:`scrub` for text that may hold JSON: JSON stays valid JSON.

        Masking the text as a whole keeps it byte for byte where nothing matched. Where
        that broke the JSON (a value cut at a quote, a hook that rewrote a bracket), the
        JSON is masked value by value instead: each string, and the value of each key that
        names a secret. Over ``limit``, ``cap`` says what is cut: ``"text"`` the text, with
        the marker (it is no JSON then: a store keeps it as a JSON string); ``"strings"``
        every string in the JSON, so that it keeps its shape, unless that leaves it over
        twice the limit (many short values: then the text); ``"shape"`` every string,
        whatever the size.
        """
        if not isinstance(text, str):
            return text
        return self.cap_json(self._mask_keeping_json(text, where), self.max_chars if limit is None else limit, cap=cap)

    @staticmethod
    def cap_json(text: str, limit: int, *, cap: str = "text") -> str:
        """The cut of :meth:`scrub_json` alone, without masking: for text the masking would
        not change (the store's writer knows which from its prefilter)."""
        if limit <= 0 or len(text) <= limit:
            return text
        if cap == "text":
            return truncate(text, limit)
        capped = _cap_json(text, limit)
        return capped if cap == "shape" or len(capped) <= 2 * limit else truncate(text, limit)

    def _mask_keeping_json(self, text: str, where: str) -> str:
        """:meth:`mask`, by value where masking the whole text broke its JSON."""
        cleaned = self.mask(text, where)
        if cleaned != text and _is_json(text) and not _is_json(cleaned):
            value = json.loads(text)
            masked = self._mask_json(value, where)
            cleaned = text if masked == value else _json.dumps(masked)
        return cleaned

    def _mask_json(self, value: Any, where: str, schemas: bool = False) -> Any:
        """A parsed JSON value with secrets masked: each string as text (it may hold JSON
        itself), the value of a secret-named key whole. With ``schemas`` (declared tools,
        :meth:`mask_tools`), such a key's object is a parameter's schema: it is walked on, and
        only the values it gives (:data:`_SCHEMA_VALUES`) are masked whole."""
        if isinstance(value, str):
            return self._mask_keeping_json(value, where)
        if isinstance(value, list):
            return [self._mask_json(v, where, schemas) for v in value]
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                secret = secrets.SECRET_KEY.fullmatch(str(key)) if self.key_values else None
                if secret is None:
                    out[key] = self._mask_json(item, where, schemas)
                elif schemas and isinstance(item, dict):  # a parameter named so: its schema, whose values are secrets
                    kind = secrets.kind_of(secret)
                    out[key] = {k: _mask_all(kind, v) if k in _SCHEMA_VALUES else self._mask_json(v, where, schemas)
                                for k, v in item.items()}
                else:
                    out[key] = _mask_all(secrets.kind_of(secret), item)
            return out
        return value

    def mask_tools(self, text: str, where: str = a.TOOL_DEFINITIONS) -> str:
        """Declared tools (JSON text: a list of definitions) with secrets masked; never cut.

        Each string is masked as text (a description, a parameter's default such as a
        signed URL). A key that names a secret is, in a tool's JSON schema, mostly a
        parameter's name (``"password": {"type": "string"}``): its schema stays, and only
        the values it gives (``default``, ``const``, ``enum``, ``example(s)``) are masked
        whole; any other value of such a key is masked whole, as in :meth:`scrub_json`.
        Text that is no JSON is masked as :meth:`scrub_json` does."""
        if not isinstance(text, str) or not self.masks:
            return text
        cache = self._tools_masked if self.redact is None else None
        if cache is not None:
            done = cache.get(text)
            if done is not None:
                return done
        try:
            value = json.loads(text)
        except ValueError:
            masked_text = self._mask_keeping_json(text, where)
        else:
            masked = self._mask_json(value, where, schemas=True)
            masked_text = text if masked == value else _json.dumps(masked)
        if cache is not None and len(text) <= _CACHED_TOOLS_CHARS:
            if len(cache) >= 64:
                cache.clear()
            cache[text] = masked_text
        return masked_text

    def scrub_attributes_json(self, text: str) -> str:
        """A span's attributes as one JSON object (a collector's raw copy), masked; never cut.

        Masked as :meth:`scrub_json` masks JSON text, except the attributes that hold tool
        definitions (any convention's: :data:`TOOL_ATTRIBUTES`, OpenInference's
        ``llm.tools.N.tool.json_schema``, OpenLLMetry's ``llm.request.functions.N.parameters``),
        which :meth:`mask_tools` masks, so that their schemas stay schemas."""
        if not isinstance(text, str) or not _RAW_TOOL_KEY.search(text):
            return self.scrub_json(text, "", 0)
        try:
            attributes = json.loads(text)
        except ValueError:
            return self.scrub_json(text, "", 0)
        if not isinstance(attributes, dict) or not any(_RAW_TOOL_KEY.fullmatch(str(k)) for k in attributes):
            return self.scrub_json(text, "", 0)
        tools = {k: self.mask_tools(v, k) if isinstance(v, str) else self._mask_json(v, k, schemas=True)
                 for k, v in attributes.items() if _RAW_TOOL_KEY.fullmatch(str(k))}
        rest = {k: v for k, v in attributes.items() if k not in tools}
        rest = json.loads(self.scrub_json(_json.dumps(rest), "", 0)) if rest else rest
        masked = {k: tools[k] if k in tools else rest.get(k) for k in attributes}
        return text if masked == attributes else _json.dumps(masked)

    def export_attributes(self, attributes: Any) -> dict[str, Any] | None:
        """The attributes a span may carry over OTLP; None when nothing needs to change."""
        if not attributes or not any(key in SCRUBBED_ATTRIBUTES for key in attributes):
            return None
        withheld = False
        changes: dict[str, Any] = {}
        for key, value in attributes.items():
            if key not in SCRUBBED_ATTRIBUTES:
                continue
            if key in CONTENT_ATTRIBUTES and not self.capture:
                withheld = True
            elif isinstance(value, str):
                if key in TOOL_ATTRIBUTES:
                    cleaned = self.mask_tools(value, key)  # never cut: a list of tools stays one
                else:
                    cleaned = self.scrub_json(value, key)  # JSON attributes stay JSON
                if cleaned is not value and cleaned != value:
                    changes[key] = cleaned
        if not withheld and not changes:
            return None  # most spans with declared tools hold no secret: no copy of them is made
        out: dict[str, Any] = {}
        for key, value in attributes.items():
            if key in CONTENT_ATTRIBUTES and not self.capture:
                if key in _MESSAGE_TEXTS and value:
                    out[a.CONTENT_WITHHELD] = True  # a collector keeps the message's row, without its text
                continue
            out[key] = changes.get(key, value)
        return out


# the texts a message row is made of (a turn's input, a round's text)
_MESSAGE_TEXTS = frozenset({a.TURN_INPUT, a.ROUND_TEXT})

_SECRET_GROUP = "(?P<secret>"

_CACHED_TOOLS_CHARS = 65_536  # the longest tool list remembered masked (64 of them at most)

# attributes of other instrumentations that hold tool definitions or their schemas
_RAW_TOOL_KEY = re.compile(r"gen_ai\.tool\.definitions|loopscope\.turn\.declared_tools"
                           r"|llm\.tools\.[0-9]+\.tool\.json_schema|llm\.request\.functions\.[0-9]+\.parameters")

# the keywords of a JSON schema that give a parameter's values (masked under a secret's name)
_SCHEMA_VALUES = frozenset({"default", "const", "enum", "example", "examples"})


def _mask_all(kind: str | None, value: Any) -> Any:
    """The value of a secret-named JSON key: every string and number in it masked."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (str, int, float)):
        masked = secrets.mask_secret_value(kind, str(value))
        return value if masked is None else masked
    if isinstance(value, list):
        return [_mask_all(kind, v) for v in value]
    if isinstance(value, dict):
        return {k: _mask_all(kind, v) for k, v in value.items()}
    return value


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _cap_json(text: str, limit: int) -> str:
    """JSON over ``limit`` with every string in it cut instead of the text (see scrub_json)."""
    try:
        value = json.loads(text)
    except ValueError:
        return truncate(text, limit)

    capped = _cap_strings(value, limit)
    return text if capped == value else _json.dumps(capped)


_MARKER = re.compile(r"…\[truncated: ([0-9]{1,18}) chars\]\Z")


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying so and how long it was. Text that was cut
    before (:func:`cut_early`: a value over the store's cap, cut where its span ended) and
    still ends with its marker keeps the length that marker states: the value's own."""
    if limit <= 0 or len(text) <= limit:
        return text
    length = len(text)
    found = _MARKER.search(text, max(0, length - 40))
    if found is not None and int(found.group(1)) > length:
        length = int(found.group(1))
    return f"{text[:limit]}…[truncated: {length} chars]"


EARLY_MARGIN = 65_536
"""Characters past the store's cap that :func:`cut_early` keeps of a value: the store's writer
masks secrets before it cuts at the cap, and a secret that begins before the cap and ends past
it (a PEM key, a cookie's line) must still be whole there to be masked."""


def cut_early(text: str, limit: int, how: str = "text") -> str:
    """``text`` (over ``limit + EARLY_MARGIN`` characters) cut to about that, before it is
    queued for the store, so that it never costs the queue more than the store keeps of it:
    what the store's writer then masks and cuts at ``limit`` (:meth:`ContentPolicy.scrub_json`)
    is what it would have made of the whole value (the lengths its markers state included,
    those of strings joined from several cut ones aside). ``how``: ``"text"``; ``"json"``,
    JSON keeps its shape (each string cut, with its marker) unless it is not JSON or is made
    of so many short values that it stays over twice the kept length (then it is cut as
    text, as the writer's cap would); ``"shape"``, JSON keeps its shape whatever its size
    (what the mapping parses: a turn's segments)."""
    keep = limit + EARLY_MARGIN
    if len(text) <= keep:
        return text
    if how != "text":
        try:
            value = json.loads(text)
        except ValueError:
            value = _NOT_JSON
        if value is not _NOT_JSON:
            capped = _json.dumps(_cap_strings(value, keep))
            if how == "shape" or len(capped) <= 2 * keep:
                return capped
    return f"{text[:keep]}…[truncated: {len(text)} chars]"


_NOT_JSON = object()


def _cap_strings(item: Any, limit: int) -> Any:
    if isinstance(item, str):
        return truncate(item, limit)
    if isinstance(item, list):
        return [_cap_strings(v, limit) for v in item]
    if isinstance(item, dict):
        return {k: _cap_strings(v, limit) for k, v in item.items()}
    return item
