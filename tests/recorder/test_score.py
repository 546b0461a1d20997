"""``loopscope.score``'s arguments: what a score must say, and what it may be given as its target.
Bad input is refused before anything is recorded (the recording's exporter sees no span)."""

from __future__ import annotations

import math

import pytest

import loopscope

BAD = [
    (("t1",), {"value": 1}, ValueError, "needs a name"),
    (("t1", "  "), {"value": 1}, ValueError, "needs a name"),
    (("t1", "helpful"), {}, ValueError, "a value, a label or an explanation"),
    (("t1", "helpful"), {"value": "high"}, TypeError, "is a number"),
    (("t1", "helpful"), {"value": True}, TypeError, "is a number"),
    (("t1", "helpful"), {"value": math.nan}, ValueError, "finite"),
    (("t1", "helpful"), {"label": 3}, TypeError, "label is text"),
    (("t1", "helpful"), {"value": 1, "source": ""}, TypeError, "source"),
    (("", "helpful"), {"value": 1}, ValueError, "target id is empty"),
    ((3.5, "helpful"), {"value": 1}, TypeError, "not float"),
    ((None, "helpful"), {"value": 1}, ValueError, "no turn, model call or tool call is current here"),
]


def test_bad_scores_are_refused_and_a_score_given_an_id_is_a_root_span_carrying_the_conventions_event(recording):
    """One recording (its close costs a second): every bad score first, then a good one."""
    for args, kwargs, error, says in BAD:
        with pytest.raises(error, match=says):
            loopscope.score(*args, **kwargs)
    assert recording.exporter.get_finished_spans() == ()
    with loopscope.turn(session_id="s", input="hi") as t:
        t.generation("hello")
        loopscope.score("chatcmpl-1", "accurate", value=0.5, label="partly", source="model")  # an id: not the turn here
    (span,) = [s for s in recording.exporter.get_finished_spans() if s.name == "gen_ai.evaluation.result"]
    assert span.parent is None and span.start_time == span.end_time
    assert dict(span.attributes) == {
        "gen_ai.evaluation.name": "accurate", "gen_ai.evaluation.score.value": 0.5, "gen_ai.evaluation.score.label": "partly",
        "loopscope.score.source": "model", "loopscope.score.target": "chatcmpl-1",
    }
    (event,) = span.events
    assert (event.name, dict(event.attributes)) == ("gen_ai.evaluation.result", {
        "gen_ai.evaluation.name": "accurate", "gen_ai.evaluation.score.value": 0.5, "gen_ai.evaluation.score.label": "partly"})
