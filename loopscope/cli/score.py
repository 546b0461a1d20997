"""``loopscope score TARGET NAME``: a score of a stored turn, model call or tool call (a
thumbs-up from a script), written to the store as :func:`loopscope.score` records one.

``TARGET`` is looked up in the store through the query API (a turn's correlation id or a
unique prefix of it, a response id, a tool call id, a span id); the score is then the same
``gen_ai.evaluation.result`` span the API makes (the scored span's child), written through the
store's sink with loopscope's span mapping, as ``collect`` writes what it receives.
"""

from __future__ import annotations

import argparse
import math
import secrets
import time
from typing import Any

from .. import semconv as a
from . import _args
from .commands import CommandError, db_path, emit, emit_json


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    score = sub.add_parser(
        "score",
        parents=[common],
        help="score a turn, model call or tool call (a thumbs-up from a script)",
        description="Record a score of a stored turn, model call or tool call: the GenAI conventions' "
        "gen_ai.evaluation.result, kept in the store's scores table (docs/scores.md). TARGET is a turn's "
        "correlation id (or a unique prefix of it), a response id, a tool call id or a span id; NAME names "
        "the evaluation. Give at least one of --value, --label, --explanation.",
    )
    score.add_argument("target", metavar="TARGET", help="what is scored: a turn, response, tool call or span id")
    score.add_argument("name", metavar="NAME", help="the evaluation's name (helpful, thumbs, accuracy, ...)")
    score.add_argument("--value", type=_finite, metavar="V", help="the score, a number")
    score.add_argument("--label", metavar="L", help="the score as a word (up, down, pass, fail, ...)")
    score.add_argument("--explanation", metavar="E", help="why, in words")
    score.add_argument("--source", metavar="S", default="human", help="who scored: human (default), model, code, ...")
    _args.add_json(score, "the score written and what it scores")
    score.set_defaults(handler=score_command)


def score_command(args: argparse.Namespace) -> int:
    from ..ingest.spans import OWN_SCOPE, Ctx, Scope, SpanEvent, SpanRecord
    from ..ingest.writer import SPANS
    from ..storage.queries import open_reader, open_sink, prepare

    if not args.name.strip():
        raise CommandError("a score needs a name")
    if args.value is None and not args.label and not args.explanation:
        raise CommandError("a score needs --value, --label or --explanation")
    if not args.source:
        raise CommandError("--source is a word such as human, model or code")
    db = prepare(db_path(args), timeout=getattr(args, "wait", 10.0))  # made or migrated: it has scores
    found = open_reader(db, lock_timeout=getattr(args, "wait", 10.0)).score_target(args.target)
    if found is None:
        raise CommandError(f"no turn, model call or tool call has the id {args.target!r} in {db}")
    trace_id = int(found.trace_id, 16) if found.trace_id else None
    span_id = int(found.span_id, 16) if found.span_id else None
    attributes, event = a.score_attributes(
        args.name, value=args.value, label=args.label or None, explanation=args.explanation or None,
        source=args.source, kind=found.kind, target_id=found.tool_call_id or (found.turn_id if found.kind == "turn" else None),
        response_id=found.response_id, trace_id=trace_id, span_id=span_id, session_id=found.session_id,
        turn_id=found.turn_id, agent=found.agent,
    )
    now = time.time_ns()
    own = secrets.randbits(64) or 1
    record = SpanRecord(
        a.EVALUATION_SPAN, Ctx(trace_id or secrets.randbits(128) or 1, own),
        Ctx(trace_id, span_id) if trace_id and span_id else None, now, now, attributes,
        events=[SpanEvent(a.EVALUATION_EVENT, now, event)], instrumentation_scope=Scope(OWN_SCOPE),
    )
    sink = open_sink(db, mapping=SPANS)
    try:
        sink.submit_end(record)
        if not sink.flush(getattr(args, "wait", 10.0) + 20.0):
            raise CommandError(f"the score could not be written to {db} (see loopscope status)")
    finally:
        sink.close()
    written: dict[str, Any] = {
        "id": f"{record.context.trace_id:032x}{own:016x}", "name": args.name, "value": args.value,
        "label": args.label or None, "explanation": args.explanation or None, "source": args.source,
        "target": found.kind, "session_id": found.session_id, "turn_id": found.turn_id, "agent": found.agent,
        "tool_call_id": found.tool_call_id, "response_id": found.response_id, "span_id": found.span_id,
    }
    if args.json:
        emit_json(written)
    else:
        what = {"turn": "turn", "call": "model call", "tool": "tool call"}[found.kind]
        said = ", ".join(str(v) for v in (args.value, args.label) if v not in (None, ""))
        emit(f"scored {what} {found.span_id or args.target} of session {found.session_id}: {args.name} {said}".rstrip())
    return 0
