"""Metrics from the same spans: GenAI client metrics plus tool calls and turns by outcome.

Recorded off the hot path: ``on_end`` only queues GenAI spans; a daemon thread turns them
into measurements every half second (and on flush). Bucket boundaries are those the GenAI
conventions advise, given as advisories so they hold on the application's own
``MeterProvider`` too.

Which GenAI metrics (:func:`loopscope.semconv.conventions`): by default the current conventions'
(``latest=True``): ``gen_ai.client.inference.duration``, the token usage counters and per-call token
histograms, ``gen_ai.client.inference.time_to_first_chunk`` and ``.time_per_output_chunk``,
``gen_ai.execute_tool.duration``, and per agent run (turn) ``gen_ai.invoke_agent.duration``,
``.inference_calls`` and ``.tool_calls``; with ``LOOPSCOPE_SEMCONV=v1.37`` the older ones
(``gen_ai.client.token.usage``, ``gen_ai.client.operation.duration``, ``gen_ai.execute_tool.duration``).
Names and sources in :mod:`loopscope.semconv`.
``loopscope.*`` metrics are the same in both.

Counters are added once per drain: a drain sums each counter's values per attribute set over
its spans, then makes one measurement of each sum (a measurement through the SDK costs ~10 us
whatever its value; a model call's five token counters, its tool's and its turn's were half
the metrics' CPU a call: issue 31, benchmarks/bench_export_cpu.py). The totals are the same, and
a counter a call added 0 to still gets its point (an add of 0 once per drain).

Chunk gaps (time_per_output_chunk) do not travel on the span: the recorder hands each streamed
call's stamps to :meth:`MetricsProcessor.chunk_gaps` as its span ends (a dict entry, on the
calling thread); this thread computes the gaps when it measures the span.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Protocol

from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from .. import semconv as a
from .._guard import guard

TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864]
DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]

TOKEN_USAGE = a.METRIC_TOKEN_USAGE
OPERATION_DURATION = a.METRIC_OPERATION_DURATION
INFERENCE_DURATION = a.METRIC_INFERENCE_DURATION
TOOL_DURATION = a.METRIC_EXECUTE_TOOL_DURATION
TOOL_CALLS = "loopscope.tool.calls"
TURNS = "loopscope.turns"
DROPPED = "loopscope.dropped"

_OPS = frozenset({a.OP_CHAT, a.OP_EXECUTE_TOOL, a.OP_INVOKE_AGENT})
_MAX_QUEUE = 20_000
"""Ended spans waiting for the metrics thread (it drains them every half second). A span takes
~3.5 KB with little content (benchmarks/bench_memory.py): 20,000 are ~70 MB at most, several
seconds of spans recorded flat out; past it spans are counted as skipped."""


class ChunkGaps(Protocol):
    """A streamed call's chunk gaps as the recorder keeps them (:mod:`loopscope.recorder.chunks`)."""

    def weighted(self) -> list[tuple[float, int]]: ...


class MetricsProcessor(SpanProcessor):
    """Turns ended GenAI spans into metric measurements on a background thread."""

    def __init__(self, meter: Meter, dropped: Any = None, interval: float = 0.5, *, latest: bool = False) -> None:
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._lock = threading.Lock()
        self.skipped = 0
        self.latest = latest
        # span id -> its chunk gaps, from the span's end until this thread measures the span
        self._gaps: dict[int, ChunkGaps] = {}
        self._latest = _LatestInstruments(meter) if latest else None
        self._tokens = None if latest else meter.create_histogram(
            TOKEN_USAGE, unit="{token}", description="Tokens used by GenAI operations",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self._duration = meter.create_histogram(
            INFERENCE_DURATION, unit="s", description="Duration of model calls (GenAI inference operations)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        ) if latest else meter.create_histogram(
            OPERATION_DURATION, unit="s", description="Duration of GenAI operations",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._tool_duration = meter.create_histogram(
            TOOL_DURATION, unit="s", description="Duration of tool executions",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._tool_calls = meter.create_counter(TOOL_CALLS, unit="{call}", description="Tool calls by tool and outcome")
        self._turns = meter.create_counter(TURNS, unit="{turn}", description="Agent turns by loop end reason")
        if dropped is not None:
            meter.create_observable_counter(
                DROPPED, callbacks=[lambda options: _observe_dropped(dropped, options)], unit="{event}",
                description="Events loopscope had to drop, by destination",
            )
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loopscope-metrics", daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def chunk_gaps(self, span: Any, gaps: ChunkGaps) -> None:
        """A streamed call's chunk gaps, given as its ``chat`` span ends (before ``on_end``)."""
        if self._latest is None or len(self._gaps) >= _MAX_QUEUE or not span.is_recording():
            return  # not measured (an unsampled span never reaches on_end); past the bound, skipped
        self._gaps[span.get_span_context().span_id] = gaps

    def on_end(self, span: ReadableSpan) -> None:
        attrs: Any = span.attributes
        if attrs and attrs.get(a.OPERATION) in _OPS:
            if len(self._queue) >= _MAX_QUEUE:
                self.skipped += 1
                if self._gaps and span.context is not None:
                    self._gaps.pop(span.context.span_id, None)
                return
            self._queue.append(span)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.drain()

    def drain(self) -> None:
        with self._lock:
            queue = self._queue
            sums = _Sums()
            while queue:
                span = queue.popleft()
                with guard("metrics"):
                    self._measure(span, sums)
            for counter, value, attributes in sums.drained():
                with guard("metrics"):  # one that fails loses its own sum only
                    counter.add(value, attributes)

    def _measure(self, span: ReadableSpan, sums: _Sums) -> None:
        attrs: Any = span.attributes
        op = attrs.get(a.OPERATION)
        seconds = ((span.end_time or 0) - (span.start_time or 0)) / 1e9
        if op == a.OP_CHAT:
            common = {a.OPERATION: op}
            for key in (a.PROVIDER, a.REQUEST_MODEL, a.RESPONSE_MODEL, "server.address", a.ERROR_TYPE):
                value = attrs.get(key)
                if value is not None:
                    common[key] = value
            self._duration.record(seconds, common)
            if self._latest is not None:
                gaps = self._gaps.pop(span.context.span_id, None) if self._gaps and span.context is not None else None
                self._latest.model_call(attrs, common, gaps, sums)
            elif self._tokens is not None:
                for token_type, key in (("input", a.USAGE_INPUT), ("output", a.USAGE_OUTPUT)):
                    value = attrs.get(key)
                    if isinstance(value, int):
                        self._tokens.record(value, {**common, a.TOKEN_TYPE: token_type})
        elif op == a.OP_EXECUTE_TOOL:
            tool = {a.TOOL_NAME: attrs.get(a.TOOL_NAME, ""), a.TOOL_OUTCOME: attrs.get(a.TOOL_OUTCOME, "served")}
            if attrs.get(a.ERROR_TYPE):
                tool[a.ERROR_TYPE] = attrs[a.ERROR_TYPE]
            self._tool_duration.record(seconds, tool)
            sums.add(self._tool_calls, 1, {a.TOOL_NAME: tool[a.TOOL_NAME], a.TOOL_OUTCOME: tool[a.TOOL_OUTCOME]})
        elif op == a.OP_INVOKE_AGENT:
            turn = {a.LOOP_END_REASON: attrs.get(a.LOOP_END_REASON) or "unknown"}
            if attrs.get(a.AGENT_NAME):
                turn[a.AGENT_NAME] = attrs[a.AGENT_NAME]
            sums.add(self._turns, 1, turn)
            if self._latest is not None:
                self._latest.agent_run(attrs, seconds)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.drain()
        return True

    def shutdown(self) -> None:
        self._stop.set()
        self.drain()


class _Sums:
    """A drain's counter values, summed per counter and attribute set until :meth:`drained`."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[tuple[Any, ...], list[Any]] = {}

    def add(self, counter: Any, value: int, attributes: dict[str, Any]) -> None:
        key = (counter, *attributes.items())
        try:
            entry = self._values.get(key)
        except TypeError:  # an attribute value that cannot be a key (a list): added on its own
            counter.add(value, attributes)
            return
        if entry is None:
            self._values[key] = [value, attributes]
        else:
            entry[0] += value

    def drained(self) -> list[tuple[Any, int, dict[str, Any]]]:
        """Each counter's sum per attribute set, once (then none are left)."""
        values, self._values = self._values, {}
        return [(key[0], value, attributes) for key, (value, attributes) in values.items()]


_USAGE_COUNTERS = (
    (a.METRIC_INPUT_TOKENS, a.USAGE_INPUT, None, "Input (prompt) tokens used, cached ones included"),
    (a.METRIC_OUTPUT_TOKENS, a.USAGE_OUTPUT, None, "Output (completion) tokens used, reasoning ones included"),
    (a.METRIC_CACHE_READ_TOKENS, a.USAGE_CACHE_READ, None, "Input tokens served from a provider-managed cache"),
    (a.METRIC_CACHE_WRITE_TOKENS, a.USAGE_CACHE_CREATION, a.USAGE_CACHE_WRITE, "Input tokens written to a provider-managed cache"),
    (a.METRIC_REASONING_TOKENS, a.USAGE_REASONING, None, "Output tokens used for reasoning"),
)


def _tokens(attrs: Any, key: str, alias: str | None) -> int:
    value = attrs.get(key)
    if value is None and alias is not None:
        value = attrs.get(alias)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class _LatestInstruments:
    """The current conventions' GenAI instruments (see :mod:`loopscope.semconv`)."""

    def __init__(self, meter: Meter) -> None:
        self.counters = [
            (meter.create_counter(name, unit="{token}", description=description), key, alias)
            for name, key, alias, description in _USAGE_COUNTERS
        ]
        self.input_histogram = meter.create_histogram(
            a.METRIC_OPERATION_INPUT_TOKENS, unit="{token}", description="Input tokens per model call",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.output_histogram = meter.create_histogram(
            a.METRIC_OPERATION_OUTPUT_TOKENS, unit="{token}", description="Output tokens per model call",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.first_chunk = meter.create_histogram(
            a.METRIC_INFERENCE_TIME_TO_FIRST_CHUNK, unit="s", description="Time from the request to the first chunk of a streamed answer",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.per_chunk = meter.create_histogram(
            a.METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK, unit="s",
            description="Time per output chunk of a streamed answer, after the first (from the previous chunk)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.agent_duration = meter.create_histogram(
            a.METRIC_INVOKE_AGENT_DURATION, unit="s", description="Duration of agent runs (turns)",
            explicit_bucket_boundaries_advisory=list(a.INVOKE_AGENT_BUCKETS),
        )
        self.inference_calls = meter.create_histogram(
            a.METRIC_INVOKE_AGENT_INFERENCE_CALLS, unit="{inference_call}",
            description="Model calls made by one agent run (turn), failed ones included",
            explicit_bucket_boundaries_advisory=list(a.CALL_COUNT_BUCKETS),
        )
        self.tool_calls = meter.create_histogram(
            a.METRIC_INVOKE_AGENT_TOOL_CALLS, unit="{tool_call}",
            description="Tool calls made by one agent run (turn)",
            explicit_bucket_boundaries_advisory=list(a.CALL_COUNT_BUCKETS),
        )

    def model_call(self, attrs: Any, common: dict[str, Any], gaps: ChunkGaps | None, sums: _Sums) -> None:
        # every call counts, a failed one too: 0 where the response said nothing (the conventions'
        # rule), of modality "unknown" (loopscope does not read a per-modality breakdown)
        # (the counters and the first-chunk histogram have no error.type; the per-call histograms do)
        plain = {k: v for k, v in common.items() if k != a.ERROR_TYPE}
        by_modality = {**plain, a.TOKEN_MODALITY: "unknown"}
        for counter, key, alias in self.counters:
            sums.add(counter, _tokens(attrs, key, alias), by_modality)
        self.input_histogram.record(_tokens(attrs, a.USAGE_INPUT, None), common)
        self.output_histogram.record(_tokens(attrs, a.USAGE_OUTPUT, None), common)
        first = attrs.get(a.TIME_TO_FIRST_CHUNK)  # set on streamed calls only
        if isinstance(first, (int, float)) and not isinstance(first, bool):
            self.first_chunk.record(float(first), plain)
            if gaps is not None:  # one value per gap; a sampled gap (a very long stream) stands for several
                record = self.per_chunk.record
                for seconds, weight in gaps.weighted():
                    for _ in range(weight):
                        record(seconds, plain)

    def agent_run(self, attrs: Any, seconds: float) -> None:
        # the attributes metrics.yaml gives gen_ai.invoke_agent.duration: error.type, the agent's
        # name and model (no provider: an agent run is not a call to one; no operation name)
        run: dict[str, Any] = {}
        for key in (a.AGENT_NAME, a.REQUEST_MODEL, a.ERROR_TYPE):
            value = attrs.get(key)
            if value:
                run[key] = value
        self.agent_duration.record(seconds, run)
        # one value per run, 0 included (a turn that made no model call or asked for no tool)
        agent = {a.AGENT_NAME: attrs[a.AGENT_NAME]} if attrs.get(a.AGENT_NAME) else {}
        calls = attrs.get(a.MODEL_CALL_COUNT)
        if isinstance(calls, int) and not isinstance(calls, bool) and calls >= 0:
            self.inference_calls.record(calls, agent)
        tools = attrs.get(a.TOOL_CALLS_COUNT)
        if isinstance(tools, int) and not isinstance(tools, bool) and tools >= 0:
            self.tool_calls.record(tools, agent)


def _observe_dropped(dropped: Any, options: CallbackOptions) -> list[Observation]:
    return [Observation(count, {"loopscope.destination": where}) for where, count in dropped().items()]
