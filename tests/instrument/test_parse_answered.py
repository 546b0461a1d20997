"""openai's ``parse()`` raises after a 200 when it cannot parse the answer (cut at the
token limit, stopped by the content filter): the call was answered and billed, so its
response is recorded, with the outcome its finish reason says. The real SDK against the
fake model server."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from fakes.model_server import Reply, Usage
from loopscope import LoopEndReason
from recorded import only_turn

MODEL = "gpt-test-1"
CUT = '{"city": "Pa'


class City(BaseModel):
    city: str


def _kwargs() -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Which city?"}], "response_format": City}


def _call(way: str, server: Any) -> None:
    """One structured-output call, each way the SDK offers it; each raises for this answer."""
    if way == "parse":
        server.openai_client().chat.completions.parse(**_kwargs())
    elif way == "beta":
        server.openai_client().beta.chat.completions.parse(**_kwargs())
    elif way == "async":
        asyncio.run(server.async_openai_client().chat.completions.parse(**_kwargs()))
    elif way == "stream":
        with server.openai_client().chat.completions.stream(**_kwargs()) as stream:
            for _ in stream:
                pass
    elif way == "async-stream":

        async def read() -> None:
            async with server.async_openai_client().chat.completions.stream(**_kwargs()) as stream:
                async for _ in stream:
                    pass

        asyncio.run(read())
    else:
        raise AssertionError(way)


@pytest.mark.parametrize("way", ["parse", "beta", "async", "stream", "async-stream"])
@pytest.mark.parametrize(
    ("stop", "error", "outcome", "reason"),
    [
        ("length", openai.LengthFinishReasonError, "truncated", LoopEndReason.TRUNCATED),
        ("content_filter", openai.ContentFilterFinishReasonError, "content_filter", LoopEndReason.CONTENT_FILTER),
    ],
)
def test_parse_that_raises_after_an_answer_records_the_answer(way, stop, error, outcome, reason, instrumented, server):
    server.queue(Reply(text=CUT, stop=stop, usage=Usage(40, 16), chunk_size=4))
    with pytest.raises(error):  # the application gets the SDK's exception, as without loopscope
        _call(way, server)

    [call] = instrumented.store.model_calls()
    assert call.response_id is not None and call.response_id.startswith("chatcmpl-fake")
    assert (call.response_model, call.finish_reasons, call.outcome) == (MODEL, [stop], outcome)
    assert call.error_type is None and call.error is None
    if "stream" not in way:  # a stream's usage comes in a chunk after the one the helper raises at
        assert (call.usage["input_tokens"], call.usage["output_tokens"]) == (40, 16)
    turn = only_turn(instrumented.store)
    assert (turn.loop_end_reason, turn.segments) == (reason, [CUT])
