"""One call, one record: an SDK adapter's call under an adapter's open outer call for the same request (recorder.adapter)."""

from __future__ import annotations

from typing import Any

import pytest

import loopscope
from fakes.model_server import Reply
from loopscope import semconv as a
from loopscope.recorder.adapter import ModelRequest, ModelResponse, close_outer_call, open_outer_call, start_model_call

HI = [{"role": "user", "content": "Hi"}]


def outer(messages: list[Any]) -> Any:
    """A call as an adapter over other adapters records it (LiteLLM's), opened in this context."""
    call = start_model_call(ModelRequest("litellm", "gpt-4.1-mini", input_text=messages[-1]["content"], messages=messages))
    assert call is not None
    return call, open_outer_call(call, ModelRequest("litellm", "gpt-4.1-mini", input_text=messages[-1]["content"], messages=messages))


def counts(recording) -> tuple[int, int]:
    loopscope.flush()
    chats = [s for s in recording.spans() if s.attributes.get(a.OPERATION) == a.OP_CHAT]
    _, [(rows,)] = recording.store.sql("SELECT count(*) FROM model_calls")
    return len(chats), rows


@pytest.mark.parametrize("closed", [False, True])
def test_the_same_request_under_an_open_outer_call_is_recorded_once(instrumented, server, closed):
    server.queue(Reply(text="Hello."))
    call, token = outer(HI)
    if closed:  # the outer call's request has been answered: an SDK call after it is a call of its own
        assert close_outer_call(token)
    server.openai_client().chat.completions.create(model="gpt-4.1-mini", messages=HI)
    call.finish(ModelResponse(text="Hello.", finish_reason="stop"))
    assert counts(instrumented) == ((2, 2) if closed else (1, 1))


def test_another_request_under_an_open_outer_call_is_its_own(instrumented, server):
    server.queue(Reply(text="Yes."))
    call, _token = outer(HI)
    server.openai_client().chat.completions.create(model="gpt-4.1-mini", messages=[{"role": "user", "content": "Is this polite?"}])
    call.finish(ModelResponse(text="Hello.", finish_reason="stop"))
    assert counts(instrumented) == (2, 2)


def test_an_ended_outer_call_covers_nothing(instrumented, server):
    server.queue(Reply(text="Hello."))
    call, _token = outer(HI)
    call.finish(ModelResponse(text="Hello.", finish_reason="stop"))
    server.openai_client().chat.completions.create(model="gpt-4.1-mini", messages=HI)
    assert counts(instrumented) == (2, 2)
