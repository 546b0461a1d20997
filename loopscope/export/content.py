"""The content policy: what message text, tool arguments and results may be kept or sent.

Content (prompts, answers, tool arguments and results) is kept in the local store by
default and sent over OTLP only when the user opts in, as the GenAI conventions ask
(``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` or
``configure(capture_content=True)``). Wherever content goes, it is first scrubbed:
secrets matching the redaction patterns are masked, a user hook may rewrite it, and
over-long text is cut with a visible marker that states the original size.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import semconv as a

CONTENT_ATTRIBUTES = frozenset(
    {
        a.INPUT_MESSAGES,
        a.OUTPUT_MESSAGES,
        a.TOOL_CALL_ARGUMENTS,
        a.TOOL_CALL_RESULT,
        "gen_ai.system_instructions",
        a.SEGMENTS,
        a.ROUND_TEXT,
        a.TURN_INPUT,
        a.THINKING,
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
    exported text, ``store_max_chars`` each stored one. ``patterns`` replace the default
    secret patterns; ``redact`` is a hook run after them.
    """

    capture: bool | None = None
    max_chars: int = 16_384
    store_max_chars: int = 1_000_000
    patterns: Iterable[str] | None = None
    redact: Redactor | None = None
    _compiled: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.capture is None:
            self.capture = bool(_env_flag("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"))
        patterns = list(DEFAULT_PATTERNS if self.patterns is None else self.patterns)
        self._compiled = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else re.compile(r"(?!x)x")

    def scrub(self, text: str, where: str = "", limit: int | None = None) -> str:
        """Mask secrets, apply the hook, then cut to ``limit`` characters with a marker."""
        if not isinstance(text, str):
            return text
        cleaned = self._compiled.sub(REDACTED, text)
        cleaned = _KEY_VALUE.sub(_mask_value, cleaned)
        if self.redact is not None:
            cleaned = self.redact(where, cleaned)
        return truncate(cleaned, self.max_chars if limit is None else limit)

    def export_attributes(self, attributes: Any) -> dict[str, Any] | None:
        """The attributes a span may carry over OTLP; None when nothing needs to change."""
        if not attributes or not any(key in SCRUBBED_ATTRIBUTES for key in attributes):
            return None
        out: dict[str, Any] = {}
        for key, value in attributes.items():
            if key in CONTENT_ATTRIBUTES and not self.capture:
                continue
            if key in SCRUBBED_ATTRIBUTES and isinstance(value, str):
                value = self.scrub(value, key)
            out[key] = value
        return out


def _mask_value(match: re.Match[str]) -> str:
    value = match.group("value")
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{match.group('key')}{quote}{REDACTED}{quote}"


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying so and how long it was."""
    if limit <= 0 or len(text) <= limit:
        return text
    return f"{text[:limit]}…[truncated: {len(text)} chars]"
