"""Kept so that ``loopscope.export.content`` (which README names) still imports: the content
policy is applied by the store and the collector too, and lives in
:mod:`loopscope.content.policy`."""

from __future__ import annotations

from ..content.policy import (  # noqa: F401
    CONTENT_ATTRIBUTES, DEFAULT_PATTERNS, REDACTED, SCRUBBED_ATTRIBUTES, ContentPolicy, Redactor, truncate,
)
