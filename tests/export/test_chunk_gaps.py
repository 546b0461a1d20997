"""gen_ai.client.inference.time_per_output_chunk: one value per gap between a streamed answer's
chunks (the latest experimental conventions only), from the real openai SDK streaming from the
fake server with paced chunks, exported as real OTLP metrics to a receiver on loopback by a
program that exits; and the bound on what one call keeps."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes import otlp_receiver
from fakes.model_server import Reply
from loopscope.recorder.chunks import CAP, ChunkGaps

PER_CHUNK = "gen_ai.client.inference.time_per_output_chunk"
FIRST_CHUNK = "gen_ai.client.inference.time_to_first_chunk"
DURATION = "gen_ai.client.inference.duration"
OLDER_DURATION = "gen_ai.client.operation.duration"  # the older conventions' (LOOPSCOPE_SEMCONV=v1.37)
PACE = 0.04  # seconds before every SSE frame
PAUSE = 0.4  # and this much more before the third content chunk
WORDS = "one two three four five"


@pytest.fixture
def receiver() -> Iterator[otlp_receiver.OTLPReceiver]:
    rec, server = otlp_receiver.start()
    yield rec
    server.shutdown()


STREAMS = {
    # api: (how the program streams, the frame paused before (the third content chunk), the gaps:
    # the chunks from the first output chunk to the last, less one)
    # chat: role (0), a chunk per word (1-5), finish (6): from frame 1
    "chat": ("for _ in client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True): pass", 3, 5),
    # responses: created, in_progress, output_item.added (2, the first: output begins), content_part.added,
    # a delta per word (4-8), output_text.done, content_part.done, output_item.done, completed (12)
    "responses": ("for _ in client.responses.create(model=MODEL, input='count', stream=True): pass", 6, 10),
    # messages: message_start (0, the first chunk: a refusal has no content block), ping (the SDK skips it),
    # content_block_start, a delta per word (3-7), content_block_stop, message_delta, message_stop (10): the
    # round ends at message_stop, the last gap is counted too
    "messages": ("for _ in anthropic_client.messages.create(model=MODEL, max_tokens=64, messages=MESSAGES, stream=True): pass",
                 5, 9),
}


def run_program(tmp_path: Path, receiver: otlp_receiver.OTLPReceiver, model_server: Any, api: str = "chat",
                **env: str) -> None:
    """One streamed call (model gpt-stream) read to its end through the real SDK of ``api``, then
    one plain chat call (gpt-plain); metrics go over OTLP/HTTP to ``receiver`` (sent at exit)."""
    stream, paused, _gaps = STREAMS[api]
    model_server.queue(
        Reply(text=WORDS, chunk_delay=PACE, pauses={paused: PAUSE}),
        Reply(text="plain answer"),
    )
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(f"""
        import loopscope
        from anthropic import Anthropic
        from openai import OpenAI
        loopscope.configure({str(tmp_path / "a.duckdb")!r}, flush_interval=0.05)
        loopscope.instrument()
        client = OpenAI(base_url={model_server.openai_base_url!r}, api_key="k", max_retries=0)
        anthropic_client = Anthropic(base_url={model_server.anthropic_base_url!r}, api_key="k", max_retries=0)
        MODEL, MESSAGES = "gpt-stream", [{{"role": "user", "content": "count"}}]
        {stream}
        client.chat.completions.create(model="gpt-plain", messages=MESSAGES)
    """))
    full = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    full.update({"LOOPSCOPE_STRICT": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **env})
    done = subprocess.run([sys.executable, str(script)], env=full, check=False, capture_output=True, text=True, timeout=180)  # a loaded machine: its OTLP sends and the bounded close take their time
    assert done.returncode == 0, done.stderr[-3000:]
    assert receiver.wait_for(lambda r: any(_points(r, DURATION)) or any(_points(r, OLDER_DURATION))), "metrics are sent at exit"


def _points(receiver: otlp_receiver.OTLPReceiver, name: str) -> list[dict[str, Any]]:
    """The data points of metric ``name`` in the last export that has it (cumulative)."""
    for request in reversed(receiver.metrics):
        found = [
            point
            for rm in request.get("resourceMetrics", [])
            for sm in rm.get("scopeMetrics", [])
            for metric in sm.get("metrics", [])
            if metric["name"] == name
            for point in metric.get("histogram", {}).get("dataPoints", [])
        ]
        if found:
            return found
    return []


def _attributes(point: dict[str, Any]) -> dict[str, Any]:
    return {kv["key"]: next(iter(kv["value"].values())) for kv in point.get("attributes", [])}


@pytest.mark.parametrize("api", sorted(STREAMS))
def test_each_gap_between_streamed_chunks_is_one_value(tmp_path, receiver, model_server, api):
    run_program(tmp_path, receiver, model_server, api)  # the current conventions: the default
    (point,) = _points(receiver, PER_CHUNK)  # the streamed call's only: the plain call has none
    attributes = _attributes(point)
    assert attributes["gen_ai.request.model"] == "gpt-stream"
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == ("anthropic" if api == "messages" else "openai")
    assert "error.type" not in attributes
    gaps = STREAMS[api][2]
    assert int(point["count"]) == gaps
    (first,) = _points(receiver, FIRST_CHUNK)
    assert int(first["count"]) == 1
    ttfc = first["sum"]
    # The server waited PACE before each frame, PAUSE more before one. The last chunk cannot reach
    # the application earlier than the server sent it, so the time to first chunk and the gaps add
    # up to at least that, however late the client read (a client held off the CPU reads piled up
    # chunks in a burst: that time shows in the gap it spans, or before the first chunk).
    assert ttfc + point["sum"] >= 0.8 * ((gaps + 1) * PACE + PAUSE)
    # One gap holds the pause (or, read late, the time before the first chunk does): real gaps,
    # not the call's mean gap, which is a fifth of that or less here.
    assert max(point["max"], ttfc) >= 0.8 * (PACE + PAUSE)
    assert point["explicitBounds"][:3] == [0.01, 0.02, 0.04]


def test_with_the_older_conventions_no_chunk_metrics_are_sent(tmp_path, receiver, model_server):
    run_program(tmp_path, receiver, model_server, LOOPSCOPE_SEMCONV="v1.37")
    assert _points(receiver, OLDER_DURATION) and not _points(receiver, DURATION)  # metrics were sent
    assert not _points(receiver, PER_CHUNK) and not _points(receiver, FIRST_CHUNK)


def test_a_call_keeps_a_bounded_uniform_sample_of_its_gaps_and_their_exact_count():
    gaps = ChunkGaps()
    # 3 * CAP gaps alternating 1 ms and 100 ms, handed over in batches of 32 as a stream proxy does
    stamps, now = [], 0
    for i in range(3 * CAP + 1):
        stamps.append(now)
        now += 1_000_000 if i % 2 else 100_000_000
    for at in range(0, len(stamps), 32):
        gaps.add(stamps[at : at + 32])
    weighted = gaps.weighted()
    assert gaps.count() == 3 * CAP and sum(w for _, w in weighted) == 3 * CAP
    assert len(weighted) == CAP  # the bound: what the call holds does not grow with the stream
    values = [round(v, 3) for v, _ in weighted]
    assert set(values) == {0.001, 0.1}  # real gaps of the stream, both kinds
    assert 0.4 < values.count(0.1) / CAP < 0.6  # a uniform sample: about half are the long ones
    # under the cap every gap is kept as it was, from the given start on
    small = ChunkGaps()
    small.add([5, 10, 30, 70], start=1)
    assert small.weighted() == [(20e-9, 1), (40e-9, 1)] and small.count() == 2
