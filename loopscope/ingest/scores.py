"""Other instrumentations' evaluation results -> loopscope's score spans.

The GenAI conventions' ``gen_ai.evaluation.result`` reaches a trace in two shapes:

* a span event of that name on the evaluated span (an evaluator that ran while the span was
  open), or on a span of the evaluator's own under it;
* a span of the evaluator's own whose attributes are the event's (``gen_ai.evaluation.name``
  ...), under the evaluated span (how instrumentations without a log pipeline send it).

:func:`foreign_scores` makes each into a span as :func:`loopscope.score` records it (the
evaluation's attributes, the evaluated span's ids), which the mapping turns into a ``scores``
row. (The conventions' log-record form, an OTLP log, is not read: ``collect`` takes logs only
for loopscope's start notices.)
"""

from __future__ import annotations

from typing import Any

from .. import semconv as a
from .spans import Ctx, SpanRecord

_ROLES = {a.OP_CHAT: "call", a.OP_EXECUTE_TOOL: "tool", a.OP_INVOKE_AGENT: "turn",
          "text_completion": "call", "generate_content": "call"}
_COPIED = (a.CONVERSATION_ID, a.AGENT_NAME)


def _hex(ctx: Any) -> tuple[str, str] | None:
    if ctx is None:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def _record(span: Any, scored: Any, attributes: dict[str, Any], when: int, seq: int | None, kind: str | None,
            extra: dict[str, Any]) -> SpanRecord:
    attrs = {k: v for k, v in attributes.items() if k in a.EVALUATION_ATTRIBUTES}
    ids = _hex(scored)
    if ids is not None:
        attrs[a.SCORE_TRACE_ID], attrs[a.SCORE_SPAN_ID] = ids
    if kind is not None:
        attrs[a.SCORE_TARGET_KIND] = kind
    if seq is not None:
        attrs[a.SCORE_SEQ] = seq
    for key, value in extra.items():
        attrs.setdefault(key, value)
    ctx = span.context
    return SpanRecord(a.EVALUATION_SPAN, Ctx(ctx.trace_id, ctx.span_id), scored, when, when, attrs)


def foreign_scores(span: Any) -> list[SpanRecord]:
    """The score spans of another instrumentation's span (none for most spans): one per
    ``gen_ai.evaluation.result`` event it carries, or itself as one when its attributes are an
    evaluation's."""
    attributes = span.attributes or {}
    events = getattr(span, "events", None) or ()
    found: list[SpanRecord] = []
    op = attributes.get(a.OPERATION)
    kind = _ROLES.get(op) if isinstance(op, str) else None
    parent = getattr(span, "parent", None)
    if any(getattr(e, "name", None) == a.EVALUATION_EVENT for e in events):
        # on the evaluated operation itself, or on a span of the evaluator's under it
        scored = span.context if kind is not None else parent
        extra = {k: attributes[k] for k in _COPIED if k in attributes}
        if kind == "call" and a.RESPONSE_ID in attributes:
            extra[a.RESPONSE_ID] = attributes[a.RESPONSE_ID]
        for seq, event in enumerate(events, 1):
            if getattr(event, "name", None) != a.EVALUATION_EVENT:
                continue
            event_attrs = dict(event.attributes or {})
            if a.EVALUATION_NAME not in event_attrs:
                continue  # required by the conventions: nothing to name the score by
            found.append(_record(span, scored, event_attrs, event.timestamp or span.end_time, seq, kind if scored is span.context else None, extra))
    elif a.EVALUATION_NAME in attributes and kind is None:  # the evaluator's own span, the event's attributes on it
        found.append(_record(span, parent, dict(attributes), span.end_time or span.start_time, None, None, {}))
    return found


__all__ = ["foreign_scores"]
