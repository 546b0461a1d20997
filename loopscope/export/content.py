"""The content policy: what message text, tool arguments and results may be kept or sent.

Content (prompts, answers, tool arguments and results) is kept in the local store by
default and sent over OTLP only when the user opts in, as the GenAI conventions ask
(``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` or
``configure(capture_content=True)``). Wherever content goes, it is first scrubbed:
secrets matching the redaction patterns are masked, a user hook may rewrite it, and
over-long text is cut with a visible marker that states the original size.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import _json
from .. import semconv as a

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
    }
)
"""Attributes that carry what was said or passed: sent only when content capture is on."""

SCRUBBED_ATTRIBUTES = CONTENT_ATTRIBUTES | {a.TOOL_ERROR, "exception.message", "exception.stacktrace"}
"""Attributes whose text is scrubbed of secrets wherever it goes (errors quote inputs too)."""

REDACTED = "[REDACTED]"

DEFAULT_PATTERNS: tuple[str, ...] = (
    r"sk-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_\-]{16,}",  # OpenAI / Anthropic / Stripe style keys
    r"AKIA[0-9A-Z]{16}",  # AWS access key ids
    r"gh[pousr]_[A-Za-z0-9]{30,}",  # GitHub tokens
    r"xox[abprs]-[A-Za-z0-9-]{10,}",  # Slack tokens
    r"AIza[0-9A-Za-z_\-]{35}",  # Google API keys
    r"(?i:\bbearer\s+[A-Za-z0-9._~+/\-]+=*)",  # bearer tokens
    r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWTs
)
"""Secrets masked by default. Key-value secrets (passwords, api keys) are handled apart."""

_KEY_VALUE = re.compile(
    r"""(?ix)
    (?P<key>["']?(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token|client[_-]?secret|authorization)["']?
       \s*[:=]\s*)
    (?!\[REDACTED\])(?P<value>"(?:[^"\\]|\\.)*"|'[^']*'|[^\s,;&}\]]+)
    """
)

Redactor = Callable[[str, str], str]
"""A user hook: ``(attribute_or_field, text) -> text`` applied after the patterns."""


def _env_flag(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None:
        return None
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass
class ContentPolicy:
    """How content is treated on its way to the store and to OTLP.

    ``capture`` (export only; the local store always keeps content) defaults to
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``. ``max_chars`` caps each
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

    def __post_init__(self) -> None:
        if self.capture is None:
            self.capture = bool(_env_flag("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"))
        patterns = list(DEFAULT_PATTERNS if self.patterns is None else self.patterns)
        self.patterns = tuple(patterns)
        self._compiled = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else re.compile(r"(?!x)x")

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
        cleaned = self._compiled.sub(REDACTED, text) if self.patterns else text
        if self.key_values:
            cleaned = _KEY_VALUE.sub(_mask_value, cleaned)
        if self.redact is not None:
            cleaned = self.redact(where, cleaned)
        return cleaned

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
        cleaned = self.mask(text, where)
        if cleaned != text and _is_json(text) and not _is_json(cleaned):
            value = json.loads(text)
            masked = self._mask_json(value, where)
            cleaned = text if masked == value else _json.dumps(masked)
        limit = self.max_chars if limit is None else limit
        if limit <= 0 or len(cleaned) <= limit:
            return cleaned
        if cap == "text":
            return truncate(cleaned, limit)
        capped = _cap_json(cleaned, limit)
        return capped if cap == "shape" or len(capped) <= 2 * limit else truncate(cleaned, limit)

    def _mask_json(self, value: Any, where: str) -> Any:
        if isinstance(value, str):
            return self.mask(value, where)
        if isinstance(value, list):
            return [self._mask_json(v, where) for v in value]
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if self.key_values and isinstance(item, (str, int, float)) and _SECRET_KEY.fullmatch(str(key)):
                    out[key] = REDACTED
                else:
                    out[key] = self._mask_json(item, where)
            return out
        return value

    def export_attributes(self, attributes: Any) -> dict[str, Any] | None:
        """The attributes a span may carry over OTLP; None when nothing needs to change."""
        if not attributes or not any(key in SCRUBBED_ATTRIBUTES for key in attributes):
            return None
        out: dict[str, Any] = {}
        for key, value in attributes.items():
            if key in CONTENT_ATTRIBUTES and not self.capture:
                continue
            if key in SCRUBBED_ATTRIBUTES and isinstance(value, str):
                value = self.scrub_json(value, key)  # JSON attributes stay JSON
            out[key] = value
        return out


def _mask_value(match: re.Match[str]) -> str:
    value = match.group("value")
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{match.group('key')}{quote}{REDACTED}{quote}"


_SECRET_KEY = re.compile(r"(?i)password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token|client[_-]?secret|authorization")
"""A JSON key whose value is masked (the keys of :data:`_KEY_VALUE`)."""


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

    def cap(item: Any) -> Any:
        if isinstance(item, str):
            return truncate(item, limit)
        if isinstance(item, list):
            return [cap(v) for v in item]
        if isinstance(item, dict):
            return {k: cap(v) for k, v in item.items()}
        return item

    capped = cap(value)
    return text if capped == value else _json.dumps(capped)


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying so and how long it was."""
    if limit <= 0 or len(text) <= limit:
        return text
    return f"{text[:limit]}…[truncated: {len(text)} chars]"
