"""The content switch, ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``, in both spellings.

Two readings of the one variable are in use, and a process often runs both:

* a flag, ``true`` / ``false`` (the OpenTelemetry GenAI instrumentations on their default
  conventions, e.g. ``opentelemetry-instrumentation-openai-v2`` without
  ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``, and loopscope until now);
* a mode, ``NO_CONTENT`` / ``SPAN_ONLY`` / ``EVENT_ONLY`` / ``SPAN_AND_EVENT``
  (``opentelemetry-util-genai`` 1.3+, so ``opentelemetry-instrumentation-genai-openai`` and
  every instrumentation built on it; its ``get_content_capturing_mode`` upper-cases the
  value and reads anything else, ``true`` included, as ``NO_CONTENT``).

loopscope accepts both, case-insensitively. Its content goes on span attributes (it emits
no content events), so a mode turns its export of content on when it puts content on
spans: ``SPAN_ONLY`` and ``SPAN_AND_EVENT`` on; ``NO_CONTENT`` and ``EVENT_ONLY`` off
(``EVENT_ONLY`` asks for content in events only, which loopscope does not send). The local
store keeps content whatever the switch says. ``SPAN_ONLY`` is the value that turns content
on for loopscope and for the official instrumentation alike: ``loopscope run
--capture-content`` sets it (:data:`BOTH_ON`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .._guard import warn_once

VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
BOTH_ON = "SPAN_ONLY"
"""The value that turns content on spans on for loopscope and for ``opentelemetry-util-genai``
based instrumentations (which read ``true`` as no content)."""

_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
MODES = {"NO_CONTENT": False, "SPAN_ONLY": True, "EVENT_ONLY": False, "SPAN_AND_EVENT": True}
"""Each ``opentelemetry-util-genai`` mode and whether loopscope exports content with it
(content on spans: yes; events only: no, loopscope emits no content events)."""


def parse(value: str | None) -> bool | None:
    """Whether ``value`` (the variable's text) turns the export of content on; None when unset
    or empty. A value that is neither a flag nor a mode is off, said once in a warning."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    flag = _FLAGS.get(text.lower())
    if flag is not None:
        return flag
    mode = MODES.get(text.upper())
    if mode is not None:
        return mode
    warn_once(
        "capture-content-value",
        "loopscope: %s=%r is not a value it knows (true/false, or one of %s); content is not exported",
        VARIABLE, value, ", ".join(MODES),
    )
    return False


def from_environment(environ: Mapping[str, str] | None = None) -> bool:
    """The switch as the environment sets it (off when unset)."""
    return bool(parse((os.environ if environ is None else environ).get(VARIABLE)))


def on_spans_for_all(value: str | None) -> bool:
    """Whether ``value`` puts content on spans for loopscope and for the mode readers both
    (``SPAN_ONLY`` / ``SPAN_AND_EVENT``); ``true`` does not: the mode readers read it as off."""
    return value is not None and value.strip().upper() in ("SPAN_ONLY", "SPAN_AND_EVENT")
