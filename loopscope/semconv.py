"""Attribute names on the spans loopscope emits and reads.

GenAI names follow the OpenTelemetry semantic conventions for generative AI; the
``loopscope.*`` names carry what those conventions do not have (yet): why the loop
ended, the turn's text segments, a tool call's outcome, where a declared tool came from.

Which version of the GenAI conventions is emitted (spans and metrics) is one switch,
:func:`conventions` (docs/otlp-export.md has the table of every name, its version and the switch):

* by default, ``current``: the conventions as open-telemetry/semantic-conventions-genai has them
  since its v0.1.0 release (the names opentelemetry-util-genai 1.0 emits by default):
  ``gen_ai.usage.cache_write.input_tokens`` (:data:`USAGE_CACHE_WRITE`); the model-call metrics
  ``gen_ai.client.inference.*`` (:data:`METRIC_INFERENCE_DURATION`, the token counters
  :data:`METRIC_INPUT_TOKENS` ..., the streaming histograms); the agent metrics
  ``gen_ai.invoke_agent.duration`` / ``.inference_calls`` / ``.tool_calls``; no provider and no
  cache usage on the ``invoke_agent`` span (the conventions removed them from the in-process agent
  span: loopscope keeps them under ``loopscope.turn.*``, :data:`TURN_PROVIDER` ...);
* ``LOOPSCOPE_SEMCONV=v1.37`` (or ``configure(semconv="v1.37")``), for backends that still read the
  older names: open-telemetry/semantic-conventions v1.37's GenAI pages, the version loopscope
  emitted before: ``gen_ai.usage.cache_creation.input_tokens``, the metrics
  ``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration`` (plus
  ``gen_ai.execute_tool.duration``), provider and cache usage on ``invoke_agent``.

``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` (:func:`latest_experimental`), which
used to ask for the newer names, still gives them: it is the default now, as in
opentelemetry-util-genai 1.0, which dropped the switch. It never selects the older names.

Spans that do not change between them: a model call is a ``chat`` span of kind CLIENT (the
conventions' ``gen_ai.inference.client``: a call over HTTP to a model service), a turn an
``invoke_agent`` span of kind INTERNAL (the conventions' "invoke agent internal span", an agent
run in the same process; the CLIENT one is a remote agent service's), never ``invoke_workflow``
(which the conventions reserve for instrumentations that can tell a workflow of several agents
from an agent), a tool call an ``execute_tool`` span of kind INTERNAL. Every ``gen_ai.tool.definitions``
entry has its ``type`` (``function`` for the application's tools), as its JSON schema requires;
every output message its ``finish_reason`` (Arize Phoenix drops an output message without one).
The proposed ``gen_ai.agent.finish_reason`` and ``gen_ai.agent.turn.count`` are on every
``invoke_agent`` span (:func:`agent_finish_reason`). The collector reads every version: both
usage spellings, ``invoke_agent`` of either kind, and ``invoke_workflow`` as a container of
agent runs.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, SupportsInt, cast

from . import _json

# operation names (gen_ai.operation.name values)
OP_INVOKE_AGENT = "invoke_agent"
OP_CHAT = "chat"
OP_EXECUTE_TOOL = "execute_tool"
OP_INVOKE_WORKFLOW = "invoke_workflow"
"""A workflow of several agents (semantic-conventions-genai gen-ai-agent-spans.md, "Invoke
workflow span", ``gen_ai.invoke_workflow.internal``): read by the collector as a container of
agent runs; loopscope does not emit it."""
WORKFLOW_NAME = "gen_ai.workflow.name"

# GenAI semantic conventions
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
AGENT_NAME = "gen_ai.agent.name"
AGENT_ID = "gen_ai.agent.id"
CONVERSATION_ID = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_STREAM = "gen_ai.request.stream"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
USAGE_INPUT = "gen_ai.usage.input_tokens"
USAGE_OUTPUT = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
USAGE_CACHE_CREATION = "gen_ai.usage.cache_creation.input_tokens"
USAGE_CACHE_WRITE = "gen_ai.usage.cache_write.input_tokens"
""":data:`USAGE_CACHE_CREATION` as the latest experimental conventions name it
(semantic-conventions-genai changelog.d/440.breaking.md: "Rename
``gen_ai.usage.cache_creation.input_tokens`` to ``gen_ai.usage.cache_write.input_tokens``");
emitted under the opt-in, read in either spelling."""
USAGE_REASONING = "gen_ai.usage.reasoning.output_tokens"
AGENT_FINISH_REASON = "gen_ai.agent.finish_reason"
"""On an ``invoke_agent`` span: why the agent loop ended, as proposed upstream
(semantic-conventions-genai #171 / pull request #238, not merged: ``completed``,
``max_iterations``, ``guardrail``, ``max_tokens``, ``time_budget``, ``cancelled``, ``error``, ...):
:func:`agent_finish_reason` maps loopscope's :data:`LOOP_END_REASON` to it."""
AGENT_TURN_COUNT = "gen_ai.agent.turn.count"
"""On an ``invoke_agent`` span: the agent-loop cycles the invocation completed, one per model
call with the tool calls it asked for, as proposed upstream (semantic-conventions-genai #332 /
pull request #451, not merged): loopscope's :data:`MODEL_CALL_COUNT`."""
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
OUTPUT_TYPE = "gen_ai.output.type"
"""On a ``chat`` span: the output type the request asked for (``text``, ``json``): from
``response_format`` (Chat Completions) or ``text.format`` (Responses)."""
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
TOOL_DEFINITIONS = "gen_ai.tool.definitions"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_DESCRIPTION = "gen_ai.tool.description"
TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT = "gen_ai.tool.call.result"
ERROR_TYPE = "error.type"

# loopscope's own
TURN_PROVIDER = "loopscope.turn.provider"
TURN_CACHE_READ = "loopscope.turn.usage.cache_read.input_tokens"
TURN_CACHE_WRITE = "loopscope.turn.usage.cache_write.input_tokens"
TURN_REASONING = "loopscope.turn.usage.reasoning.output_tokens"
TURN_MODEL = "loopscope.turn.model"
"""On an ``invoke_agent`` span under the current conventions, whose in-process agent span has no
provider, no cache or reasoning usage and no response model (``gen_ai.invoke_agent.internal``: the
input and output tokens, and ``gen_ai.request.model`` for an agent of one configured model): the
turn's provider, cache and reasoning tokens and the model that answered (the store's turn rows and
their cost read them; ``gen_ai.provider.name``, ``gen_ai.usage.*`` and ``gen_ai.response.model``
there under ``LOOPSCOPE_SEMCONV=v1.37``, read in either form)."""
TURN_ID = "loopscope.turn.id"
PARENT_TURN_ID = "loopscope.turn.parent_id"
FRAMEWORK = "loopscope.framework"
LOOP_END_REASON = "loopscope.turn.loop_end_reason"
SEGMENTS = "loopscope.turn.segments"
ROUND_COUNT = "loopscope.turn.round_count"
TOOL_CALLS_COUNT = "loopscope.turn.tool_calls_count"
DECLARED_TOOLS = "loopscope.turn.declared_tools"
THINKING = "loopscope.turn.thinking"
STREAMING = "loopscope.turn.streaming"
TURN_INPUT = "loopscope.turn.input"
TURN_INPUT_BLOCKED = "loopscope.turn.input_blocked"
ROUND_TEXT = "loopscope.round.text"
ROUND_BLOCKED = "loopscope.round.blocked"
TOOL_STATUS = "loopscope.tool.status"
TOOL_OUTCOME = "loopscope.tool.outcome"
TOOL_ERROR = "loopscope.tool.error"
CONTENT_WITHHELD = "loopscope.content.withheld"
"""On a ``chat`` span without :data:`ROUND_TEXT`, or an ``invoke_agent`` span without
:data:`TURN_INPUT`: the message was said but its text was not captured (content capture
off): its row is kept, without text."""
UNSERVED_CUT = "not answered while more stitched turns than loopscope keeps open waited for results"
"""The error of a call whose stitched turn ended early because more turns than the bound waited
for tool results (``MAX_OPEN_TURNS``; ``loopscope status`` counts these)."""
CALL_POSITION = "loopscope.call.position"
"""On a ``chat`` span: the model call's place in its turn, from 1 (the turn's first model
call is 1). Not the round count: see :data:`ROUND_COUNT` and :data:`MODEL_CALL_COUNT`."""
CALL_OUTCOME = "loopscope.call.outcome"
"""On a ``chat`` span: how the model call ended, one of :data:`CALL_OUTCOMES`."""
CALL_OUTCOMES = ("completed", "truncated", "refusal", "content_filter", "error", "cancelled")
"""``completed``: the model answered (text, tool calls, or both); ``truncated``: cut at the
token limit; ``refusal``: the model refused (a structured-output refusal, Anthropic's
``refusal`` stop reason); ``content_filter``: the provider's filter withheld the answer;
``error``: the call raised, or an HTTP 200 carried an error body; ``cancelled``: the
stream was closed (or the call abandoned) before it ended."""
CALL_REFUSAL = "loopscope.call.refusal"
"""On a ``chat`` span: the model's refusal text (content: kept under the content policy;
:data:`CALL_OUTCOME` says ``refusal`` either way)."""
CALL_ERROR = "loopscope.call.error"
"""On a ``chat`` span: the error text of a call that failed, when the span status cannot
carry it (an HTTP 200 whose body is an error); the status description otherwise."""
USAGE_PROVIDER = "loopscope.usage.provider"
"""On a ``chat`` span: the provider's own usage figures as it reported them, JSON text
(``{"input_tokens": 3, "cache_read_input_tokens": 1111, ...}``). The ``gen_ai.usage.*``
attributes are normalized: input tokens include cached ones on every provider, as the
GenAI conventions say they SHOULD."""
USAGE_WEB_SEARCHES = "loopscope.usage.web_search_requests"
"""On a ``chat`` span: the server-side web searches the call ran (Anthropic's
``usage.server_tool_use.web_search_requests``): their fee is part of the call's cost."""
REQUEST_TOOL_CHOICE = "loopscope.request.tool_choice"
"""On a ``chat`` span: the request's tool choice (``auto``, ``required``, a tool name...)."""
TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
"""On a streamed ``chat`` span: seconds from the request to the first chunk."""
MODEL_CALL_COUNT = "loopscope.turn.model_call_count"
"""On an ``invoke_agent`` span: how many model calls the turn made. :data:`ROUND_COUNT`
keeps RoomKit's meaning (tool rounds: model calls that asked for tools)."""
USAGE_INVALID = "loopscope.usage.invalid"
"""On a ``chat`` (or ``invoke_agent``) span: the usage values the application reported that
are not token counts (see :func:`token_count`), as JSON text ``{"key": "<the value as
text>"}``; they are left out of the usage."""
STATE_KIND = "loopscope.state.kind"
"""On a ``state_snapshot`` / ``state_delta`` span (no ``gen_ai.operation.name``: it is not
a GenAI operation): ``snapshot`` or ``delta``."""
STATE_VALUE = "loopscope.state.value"
"""On a state span: the snapshot object, or the JSON Patch operations of a delta, as JSON
text. Content: exported only when content capture is on."""
STATE_KINDS = {"snapshot": "state_snapshot", "delta": "state_delta"}
"""``loopscope.state.kind`` values and the event types (and span names) they make."""
TOOL_CORRECTION = "loopscope.tool.correction"
"""On a ``tool_outcome_correction`` span (no ``gen_ai.operation.name``; from the call's end
to the request that marked it): the
outcome a tool call is corrected to, ``failed``. A call a decorated tool served (its
``execute_tool`` span ended ``served``, and was exported so) whose result the next request
marks as an error (Anthropic's ``tool_result.is_error``) gets one such span, under its turn,
with the call's :data:`TOOL_NAME`, :data:`TOOL_CALL_ID` and :data:`TOOL_ERROR` (the result's
text): the store sets the call's row ``failed`` with that error."""
TOOL_CORRECTION_SPAN = "tool_outcome_correction"
"""The name of the span that carries :data:`TOOL_CORRECTION`."""
# evaluation results (scores, feedback): the GenAI conventions' ``gen_ai.evaluation.result`` event
EVALUATION_EVENT = "gen_ai.evaluation.result"
"""The conventions' event of one evaluation of a GenAI operation (semantic-conventions-genai
``model/gen-ai/events.yaml``): parented to the evaluated span where possible, else carrying
:data:`RESPONSE_ID`. loopscope sends it as a span event of a zero-duration span of that name
(:data:`EVALUATION_SPAN`), the evaluated span's child: see docs/scores.md for why."""
EVALUATION_SPAN = "gen_ai.evaluation.result"
"""The name of the zero-duration span that carries one :data:`EVALUATION_EVENT`."""
EVALUATION_NAME = "gen_ai.evaluation.name"
EVALUATION_SCORE_VALUE = "gen_ai.evaluation.score.value"
EVALUATION_SCORE_LABEL = "gen_ai.evaluation.score.label"
EVALUATION_EXPLANATION = "gen_ai.evaluation.explanation"
EVALUATION_ATTRIBUTES = (EVALUATION_NAME, EVALUATION_SCORE_VALUE, EVALUATION_SCORE_LABEL, EVALUATION_EXPLANATION,
                         RESPONSE_ID, ERROR_TYPE)
"""What a :data:`EVALUATION_EVENT` carries (the conventions' attributes), in the store's terms."""
SCORE_SOURCE = "loopscope.score.source"
"""On an evaluation span: who scored (``human``, ``model``, ``code``, or the caller's word)."""
SCORE_TARGET = "loopscope.score.target"
"""On an evaluation span: the id the score was given for, as given (a turn's correlation id, a
response id, a tool call id), when no span of it was at hand (the store matches it to its turn,
model call or tool call)."""
SCORE_TARGET_KIND = "loopscope.score.target_kind"
"""On an evaluation span: ``turn``, ``call`` or ``tool`` where the scorer knew which."""
SCORE_TARGET_KINDS = ("turn", "call", "tool")
SCORE_TRACE_ID = "loopscope.score.trace_id"
SCORE_SPAN_ID = "loopscope.score.span_id"
"""On an evaluation span: the evaluated span's trace and span ids, in hex (also its parent: the
store's writer reads these, a writer process being shipped no parent)."""
SCORE_SEQ = "loopscope.score.seq"
"""On a score made of another instrumentation's ``gen_ai.evaluation.result`` span event: the
event's place among its span's events (the score's id is the span's and this)."""
def score_attributes(
    name: str, *, value: float | None = None, label: str | None = None, explanation: str | None = None,
    source: str | None = None, kind: str | None = None, target_id: str | None = None, response_id: str | None = None,
    trace_id: int | None = None, span_id: int | None = None, session_id: str | None = None, turn_id: str | None = None,
    agent: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A score's span attributes and its :data:`EVALUATION_EVENT`'s attributes (the values
    checked already: see :func:`loopscope.score`); ``trace_id`` / ``span_id``: the scored span's."""
    event: dict[str, Any] = {EVALUATION_NAME: name}
    if value is not None:
        event[EVALUATION_SCORE_VALUE] = value
    if label:
        event[EVALUATION_SCORE_LABEL] = label
    if explanation:
        event[EVALUATION_EXPLANATION] = explanation
    if response_id:
        event[RESPONSE_ID] = response_id
    span: dict[str, Any] = {**event}
    for key, given in ((SCORE_SOURCE, source), (SCORE_TARGET_KIND, kind), (SCORE_TARGET, target_id),
                       (CONVERSATION_ID, session_id), (TURN_ID, turn_id), (AGENT_NAME, agent)):
        if given:
            span[key] = given
    if trace_id and span_id:
        span[SCORE_TRACE_ID], span[SCORE_SPAN_ID] = f"{trace_id:032x}", f"{span_id:016x}"
    return span, event


PENDING_FOR = "loopscope.pending_for"
"""On a zero-duration copy of a started ``invoke_agent`` / ``execute_tool`` span made at
its start (OTLP carries only ended spans): the real span's id, in hex. The exporter sends
it as a start notice (:data:`NOTICE_EVENT`, a log record); earlier versions sent it as a
span, which a collector still understands."""
PENDING_OPERATION = "loopscope.pending.operation"
"""On a pending copy: the real span's ``gen_ai.operation.name``, which the copy does not
carry itself (a tracing backend must not count it as a second agent run or tool call)."""
PENDING_SENT = "loopscope.pending_sent"
"""On a real span whose start notice was queued for export."""
NOTICE_EVENT = "loopscope.span.start"
"""The ``event_name`` of an OTLP log record that says a span started (a *start notice*,
see :mod:`loopscope.export.notices`): its ``trace_id`` / ``span_id`` are the span's, its
time the span's start, its attributes the span's start attributes."""
NOTICE_SPAN_NAME = "loopscope.span.name"
"""On a start notice: the started span's name."""
NOTICE_BEFORE = "loopscope.notice.before"
"""On a start notice: the span (trace id and span id in hex, 48 digits) that comes next in
the export batch both belong to (it ended after this span started); none when no span
follows it there (the span is still running). A collector writes the start rows right
before that span's rows, with them: the order the process saw, although notices and spans
travel in separate requests."""
NOTICE_AFTER = "loopscope.notice.after"
"""On a start notice that no span follows in a batch that has spans: the batch's last span
(as :data:`NOTICE_BEFORE`). A collector writes the start rows right after that span's."""

USAGE_ATTRIBUTES = {
    "input_tokens": USAGE_INPUT,
    "output_tokens": USAGE_OUTPUT,
    "cache_read_input_tokens": USAGE_CACHE_READ,
    "cache_creation_input_tokens": USAGE_CACHE_CREATION,
    "reasoning_tokens": USAGE_REASONING,
}
"""Usage keys of :class:`~loopscope.AIResponseEvent` and the span attributes that carry them
(the default conventions; :data:`USAGE_ALIASES` the other spellings read)."""
USAGE_ALIASES = {USAGE_CACHE_CREATION: USAGE_CACHE_WRITE}
"""A usage attribute and its other spelling, read when it is absent."""
USAGE_EMITTED = {**USAGE_ATTRIBUTES, "web_search_requests": USAGE_WEB_SEARCHES}
"""The usage attributes the recorder emits: :data:`USAGE_ATTRIBUTES` (or the latest experimental
spellings after ``use_conventions(latest=True)``), and the server tools' counts that are priced
(:data:`USAGE_WEB_SEARCHES`; not token counts, so not in the store's usage)."""

# -- which version of the conventions --------------------------------------------------------------

SEMCONV = "LOOPSCOPE_SEMCONV"
CURRENT = "current"
"""The conventions as semantic-conventions-genai has them since v0.1.0 (the default)."""
LEGACY = "v1.37"
"""The older names: open-telemetry/semantic-conventions v1.37's GenAI pages."""
_CHOICES = {"current": CURRENT, "latest": CURRENT, "v0.1": CURRENT, "v0.1.0": CURRENT,
            "v1.37": LEGACY, "1.37": LEGACY, "v1.37.0": LEGACY, "legacy": LEGACY}
OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"
LATEST_EXPERIMENTAL = "gen_ai_latest_experimental"


def conventions(choice: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Which conventions to emit, :data:`CURRENT` or :data:`LEGACY`: ``choice`` (``configure(semconv=)``)
    when given, else ``LOOPSCOPE_SEMCONV``, else the current ones (``OTEL_SEMCONV_STABILITY_OPT_IN`` naming
    ``gen_ai_latest_experimental`` asks for those too). Values are read without regard to case and
    space. A ``choice`` loopscope does not know raises ValueError; an unknown ``LOOPSCOPE_SEMCONV``
    is said once and gives the current ones."""
    if choice is not None:
        value = _CHOICES.get(str(choice).strip().lower())
        if value is None:
            raise ValueError(f"semconv={choice!r}: expected one of 'current', 'v1.37'")
        return value
    text = (os.environ if environ is None else environ).get(SEMCONV, "").strip().lower()
    if not text:
        return CURRENT
    value = _CHOICES.get(text)
    if value is None:
        from ._guard import warn_once

        warn_once(f"semconv {text}", f"{SEMCONV}={text!r} is not one of 'current', 'v1.37': the current GenAI conventions are emitted")
        return CURRENT
    return value


def latest_experimental(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` asks for the latest experimental GenAI conventions:
    a comma-separated list of category values, each stripped (as opentelemetry-instrumentation's
    ``_OpenTelemetrySemanticConventionStability`` reads it), compared without regard to case (the
    SDK configuration spec's rule for enum values); other categories (``http``, ``database/dup``)
    are other instrumentations' business. Those are the current conventions, the default."""
    value = (os.environ if environ is None else environ).get(OPT_IN, "")
    return any(item.strip().lower() == LATEST_EXPERIMENTAL for item in value.split(","))


_latest = True
TURN_USAGE_EMITTED = {
    "input_tokens": USAGE_INPUT, "output_tokens": USAGE_OUTPUT, "cache_read_input_tokens": TURN_CACHE_READ,
    "cache_creation_input_tokens": TURN_CACHE_WRITE, "reasoning_tokens": TURN_REASONING,
}
"""The usage attributes of an ``invoke_agent`` span (:func:`use_conventions` sets them)."""
_turn_provider, _turn_model = TURN_PROVIDER, TURN_MODEL


def use_conventions(latest: bool) -> None:
    """Emit the current conventions from now on (``latest``), or the older ones (:data:`LEGACY`).
    ``configure()`` calls it with :func:`conventions`."""
    global _latest, _turn_provider, _turn_model
    _latest = latest
    USAGE_EMITTED["cache_creation_input_tokens"] = USAGE_CACHE_WRITE if latest else USAGE_CACHE_CREATION
    TURN_USAGE_EMITTED["cache_read_input_tokens"] = TURN_CACHE_READ if latest else USAGE_CACHE_READ
    TURN_USAGE_EMITTED["cache_creation_input_tokens"] = TURN_CACHE_WRITE if latest else USAGE_CACHE_CREATION
    TURN_USAGE_EMITTED["reasoning_tokens"] = TURN_REASONING if latest else USAGE_REASONING
    _turn_provider, _turn_model = (TURN_PROVIDER, TURN_MODEL) if latest else (PROVIDER, RESPONSE_MODEL)


def emits_latest() -> bool:
    """Whether the current conventions are emitted (:func:`use_conventions`)."""
    return _latest


def turn_provider_attribute() -> str:
    """The attribute an ``invoke_agent`` span carries its provider in (:data:`TURN_PROVIDER`, or
    ``gen_ai.provider.name`` under the older conventions)."""
    return _turn_provider


use_conventions(True)  # the default, before configure() says otherwise (the hand API records without it)


# -- metric names -----------------------------------------------------------------------------------

METRIC_TOKEN_USAGE = "gen_ai.client.token.usage"
"""Histogram of tokens per operation, by ``gen_ai.token.type`` (``input``/``output``): the
older conventions (v1.37; semantic-conventions-genai changelog.d/374.breaking.md replaced it with
the token counters)."""
METRIC_OPERATION_DURATION = "gen_ai.client.operation.duration"
"""Histogram, seconds per model call: the older conventions (v1.37). The current ones keep it for
operations other than inference ("SHOULD NOT be reported for inference operations"), which
loopscope does not record: :data:`METRIC_INFERENCE_DURATION` instead."""
METRIC_INFERENCE_DURATION = "gen_ai.client.inference.duration"
"""Histogram, seconds per model call (current; semantic-conventions-genai #521, model/gen-ai/metrics.yaml):
the ``chat`` span's duration."""
METRIC_EXECUTE_TOOL_DURATION = "gen_ai.execute_tool.duration"
"""Histogram, seconds per tool execution (model/gen-ai/metrics.yaml; emitted in both versions)."""
METRIC_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
"""The name :data:`METRIC_INFERENCE_TIME_TO_FIRST_CHUNK` had before semantic-conventions-genai #521
(pydantic-ai still names a span attribute after it: the collector reads it)."""
METRIC_INFERENCE_TIME_TO_FIRST_CHUNK = "gen_ai.client.inference.time_to_first_chunk"
"""Histogram, seconds from the request to the first chunk, streamed calls only (current;
model/gen-ai/metrics.yaml: "SHOULD be reported for streaming calls and SHOULD NOT be reported
otherwise")."""
METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK = "gen_ai.client.inference.time_per_output_chunk"
"""Histogram, seconds, streamed calls only (current; model/gen-ai/metrics.yaml: "recorded for each
chunk received after the first one, measured as the time elapsed from the end of the previous
chunk to the end of the current chunk"; the same attributes and bucket advice as
:data:`METRIC_INFERENCE_TIME_TO_FIRST_CHUNK`). One value per gap between two chunks as they reached the
application, from the first output chunk on (the one :data:`TIME_TO_FIRST_CHUNK` measures): a
stream of n such chunks gives n - 1 values, summing to the time from the first to the last.
Past :data:`loopscope.recorder.chunks.CAP` gaps in one call, a uniform sample of them stands for
all (the count stays exact). No span attribute carries the gaps."""
METRIC_INVOKE_AGENT_DURATION = "gen_ai.invoke_agent.duration"
"""Histogram, seconds per agent run (a turn) (current; model/gen-ai/metrics.yaml)."""
INVOKE_AGENT_BUCKETS = (0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 51.2, 102.4, 204.8, 409.6)
"""Its bucket boundaries, as opentelemetry-util-genai 1.3 advises them."""
METRIC_INVOKE_AGENT_INFERENCE_CALLS = "gen_ai.invoke_agent.inference_calls"
METRIC_INVOKE_AGENT_TOOL_CALLS = "gen_ai.invoke_agent.tool_calls"
"""Histograms, one value per agent run (a turn): the model calls it made, failed ones included
(:data:`MODEL_CALL_COUNT`), and the tool calls it asked for (:data:`TOOL_CALLS_COUNT`; the
provider's server tools are no tool calls of the application) (current; model/gen-ai/metrics.yaml),
by ``gen_ai.agent.name``."""
CALL_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
"""Their bucket boundaries, as opentelemetry-util-genai advises them."""
METRIC_INPUT_TOKENS = "gen_ai.client.inference.usage.input_tokens"
METRIC_OUTPUT_TOKENS = "gen_ai.client.inference.usage.output_tokens"
METRIC_CACHE_READ_TOKENS = "gen_ai.client.inference.usage.cache_read.input_tokens"
METRIC_CACHE_WRITE_TOKENS = "gen_ai.client.inference.usage.cache_write.input_tokens"
METRIC_REASONING_TOKENS = "gen_ai.client.inference.usage.reasoning.output_tokens"
"""The current token usage counters (semantic-conventions-genai model/gen-ai/token-metrics.yaml,
docs/gen-ai/gen-ai-token-metrics.md: monotonic counters, one per token category, each by
``gen_ai.token.modality``; cache and reasoning are subsets of input and output), recorded for
every model call, failed ones too, 0 where the response said nothing (modality ``unknown``)."""
METRIC_OPERATION_INPUT_TOKENS = "gen_ai.client.inference.operation.input_tokens"
METRIC_OPERATION_OUTPUT_TOKENS = "gen_ai.client.inference.operation.output_tokens"
"""The current per-operation token histograms (token-metrics.yaml), not by modality."""
TOKEN_MODALITY = "gen_ai.token.modality"
TOKEN_TYPE = "gen_ai.token.type"


def turn_summary_attributes(summary: Any) -> dict[str, Any]:
    """The ``invoke_agent`` span attributes that carry a turn's :class:`AIResponseEvent`."""
    tools = summary.declared_tools
    return turn_attributes(
        summary.loop_end_reason.value if summary.loop_end_reason else "",
        _json.dumps(summary.segments),
        summary.round_count,
        summary.tool_calls_count,
        summary.streaming,
        _json.dumps([t.model_dump(exclude_none=True) for t in tools]),
        _json.dumps([{"type": t.type or "function", **t.model_dump(exclude={"origin", "type"}, exclude_none=True)}
                     for t in tools]) if tools else None,
        summary.response_content,
        summary.thinking,
        summary.model,
        summary.provider,
        summary.usage,
        model_call_count=summary.model_call_count,
    )


def turn_attributes(
    loop_end_reason: str,
    segments_json: str,
    round_count: int,
    tool_calls_count: int,
    streaming: bool,
    declared_tools_json: str,
    tool_definitions_json: str | None,
    response_content: str,
    thinking: str,
    model: str | None,
    provider: str | None,
    usage: Mapping[str, int],
    *,
    model_call_count: int | None = None,
    input_messages_json: str | None = None,
    content_json: str | None = None,
) -> dict[str, Any]:
    """:func:`turn_summary_attributes` from the summary's plain values (the JSON ones encoded).

    ``input_messages_json``: what the agent was given, as ``gen_ai.input.messages``;
    ``content_json``: ``response_content`` as JSON text, when the caller made it already. The
    response is the output message, its ``finish_reason`` said by the loop end reason
    (:func:`turn_finish_reason`), as the GenAI message schema requires."""
    attributes: dict[str, Any] = {
        LOOP_END_REASON: loop_end_reason,
        SEGMENTS: segments_json,
        ROUND_COUNT: round_count,
        TOOL_CALLS_COUNT: tool_calls_count,
        STREAMING: streaming,
        DECLARED_TOOLS: declared_tools_json,
    }
    if tool_definitions_json is not None:
        attributes[TOOL_DEFINITIONS] = tool_definitions_json
    if input_messages_json is not None:
        attributes[INPUT_MESSAGES] = input_messages_json
    if response_content:
        attributes[OUTPUT_MESSAGES] = _output_text_json(response_content, turn_finish_reason(loop_end_reason), content_json)
    if thinking:
        attributes[THINKING] = thinking
    if model:
        attributes[_turn_model] = model
    if provider:
        attributes[_turn_provider] = provider
    for key, value in usage.items():
        attr = TURN_USAGE_EMITTED.get(key)
        if attr:
            attributes[attr] = value
    if model_call_count is not None:
        attributes[MODEL_CALL_COUNT] = model_call_count
        attributes[AGENT_TURN_COUNT] = model_call_count
    finish = agent_finish_reason(loop_end_reason)
    if finish:
        attributes[AGENT_FINISH_REASON] = finish
    return attributes


AGENT_FINISH_REASONS = {
    "completed": "completed",
    "max_rounds": "max_iterations",
    "timeout": "time_budget",
    "budget_exceeded": "max_tokens",
    "force_stopped": "cancelled",
    "cancelled": "cancelled",
    "error": "error",
    "refusal": "guardrail",
    "content_filter": "guardrail",
}
"""loopscope's loop end reasons and the proposed ``gen_ai.agent.finish_reason`` values that say the
same (semantic-conventions-genai #171: ``max_iterations`` "an implementation-defined iteration
(turn) limit was reached", ``time_budget`` "wall-clock budget exhausted", ``max_tokens`` "token
budget exhausted", ``guardrail`` "a safety or policy guardrail", a model's refusal and the
provider's content filter included). The others (``truncated``, ``empty_response``, ``unfinished``,
``cut_off``) have no proposed value: they are sent as they are, which the proposal allows ("a custom
value MAY be used")."""


def agent_finish_reason(loop_end_reason: str) -> str:
    """``gen_ai.agent.finish_reason`` for a loop end reason (:data:`AGENT_FINISH_REASONS`), the reason
    itself where no proposed value fits; empty for none."""
    return AGENT_FINISH_REASONS.get(loop_end_reason) or loop_end_reason


_TURN_FINISH = {"completed": "stop", "truncated": "length", "content_filter": "content_filter", "error": "error"}


def turn_finish_reason(loop_end_reason: str) -> str:
    """A turn's output message's ``finish_reason``: the GenAI value where one fits the
    loop end reason (``completed`` -> ``stop``, ``truncated`` -> ``length``,
    ``content_filter``, ``error``), else the loop end reason itself (``max_rounds``...)."""
    return _TURN_FINISH.get(loop_end_reason) or loop_end_reason or "stop"


def _output_text_json(text: str, finish_reason: str, text_json: str | None = None) -> str:
    """One assistant message of ``text``, as ``_json.dumps`` gives it, assembled from its
    parts' JSON text (the same text, see ``_json.plain``): ``text_json`` when made already."""
    content = text_json if text_json is not None else _json.plain(text)
    reason = _json.plain(finish_reason)
    if content is None or reason is None:  # a part that needs a fallback: the whole, as before
        return _json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": text}], "finish_reason": finish_reason}])
    return '[{"role": "assistant", "parts": [{"type": "text", "content": ' + content + '}], "finish_reason": ' + reason + "}]"


def user_text_json(text: Any) -> str:
    """``gen_ai.input.messages`` of one user message with ``text`` (a turn's input)."""
    return _json.dumps([{"role": "user", "parts": [{"type": "text", "content": text if isinstance(text, str) else _json.to_text(text)}]}])


def system_instructions_json(value: Any) -> str | None:
    """``gen_ai.system_instructions`` (a list of parts) from a request's separate system
    prompt: a text (OpenAI Responses' ``instructions``, Anthropic's ``system``) or a list
    of text blocks (``{"type": "text", "text": ...}``); None when there is none."""
    if isinstance(value, str):
        return _json.dumps([{"type": "text", "content": value}]) if value else None
    if isinstance(value, (list, tuple)):
        parts = []
        for block in value:
            text = block.get("text") if isinstance(block, Mapping) else getattr(block, "text", block if isinstance(block, str) else None)
            if isinstance(text, str):
                parts.append({"type": "text", "content": text})
        return _json.dumps(parts) if parts else None
    return None


MAX_COUNT = (1 << 63) - 1
"""The largest token count (or other count) recorded: an int64, what a store column and an
OTLP integer value hold."""


def token_count(value: Any) -> int | None:
    """``value`` as a count when it unambiguously is one, else None.

    A whole number from 0 to :data:`MAX_COUNT`: an ``int`` (not a ``bool``), an integral
    ``float`` or ``Decimal`` (``12.0`` -> 12), or ASCII digits in text (``"12"`` -> 12).
    NaN, infinity, negative numbers, fractions (``12.5``), other text (``"n/a"``) and
    every other value give None.
    """
    if type(value) is int:
        return value if 0 <= value <= MAX_COUNT else None
    if isinstance(value, bool) or value is None:
        return None
    try:
        if isinstance(value, (str, bytes, bytearray)):
            text = value.strip()
            if not text.isdigit() or not text.isascii() or len(text) > 19:
                return None
            count = int(text)
        elif isinstance(value, numbers.Integral):
            count = int(value)
        elif isinstance(value, (numbers.Real, Decimal)):
            number = cast("SupportsInt", value)  # float, Decimal, Fraction: int() takes them (typeshed's Real does not say)
            if not math.isfinite(value) or value != int(number):
                return None
            count = int(number)
        else:
            return None
    except (TypeError, ValueError, OverflowError, ArithmeticError):
        return None
    return count if 0 <= count <= MAX_COUNT else None


def usage_value(value: Any) -> int | None:
    """A usage attribute of a span as the store reads it: an int as it is, a float cut to
    an int (as Arrow casts it), anything else (NaN and infinity too) None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return None


def usage_from_attributes(attributes: Mapping[str, Any]) -> dict[str, int]:
    """Token usage keyed as :attr:`AIResponseEvent.usage` is, from GenAI attributes."""
    usage = {}
    for key, attr in USAGE_ATTRIBUTES.items():
        value = usage_value(attributes.get(attr))
        if value is None and attr in USAGE_ALIASES:
            value = usage_value(attributes.get(USAGE_ALIASES[attr]))
        if value is not None:
            usage[key] = value
    return usage


REQUEST_PARAMETERS = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "max_tokens": "gen_ai.request.max_tokens",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "seed": "gen_ai.request.seed",
    "stop": "gen_ai.request.stop_sequences",
    "choice_count": "gen_ai.request.choice.count",
    "reasoning_effort": "gen_ai.request.reasoning.level",
    "tool_choice": REQUEST_TOOL_CHOICE,
    "service_tier": "gen_ai.request.service_tier",
    "server_address": SERVER_ADDRESS,
    "server_port": SERVER_PORT,
    "output_type": OUTPUT_TYPE,
    "parallel_tool_calls": "loopscope.request.parallel_tool_calls",
    "logprobs": "loopscope.request.logprobs",
    "top_logprobs": "loopscope.request.top_logprobs",
    "store": "loopscope.request.store",
    "include": "loopscope.request.include",
    "response_format": "loopscope.request.response_format",
    "reasoning": "loopscope.request.reasoning",
    "thinking": "loopscope.request.thinking",
    "other": "loopscope.request.other",  # a provider's parameters with no name here (recorder/parameters.py)
}
"""Neutral request parameter names (what adapters report) and their span attributes: the
GenAI conventions' where they name one, ``loopscope.request.*`` otherwise. A mapping value
(``reasoning``, ``thinking``, ``response_format``) is JSON text (:data:`JSON_PARAMETERS`)."""
JSON_PARAMETERS = frozenset(("response_format", "reasoning", "thinking", "other"))
"""Request parameters whose value is an object, carried as JSON text and stored as the object."""


def request_attributes(request: Mapping[str, Any]) -> dict[str, Any]:
    """Span attributes for the request parameters an adapter reports; others are ignored."""
    out: dict[str, Any] = {}
    for key, value in request.items():
        if value is None:  # most parameters a request could set, it does not
            continue
        attr = REQUEST_PARAMETERS.get(key)
        if attr is None:
            if key == "system_instructions":  # content (under the content policy), in the GenAI schema
                instructions = system_instructions_json(value)
                if instructions is not None:
                    out[SYSTEM_INSTRUCTIONS] = instructions
            continue
        kind = type(value)
        if kind is str or kind is float or kind is bool or (kind is int and -MAX_COUNT - 1 <= value <= MAX_COUNT):
            out[attr] = value  # the common values, without the isinstance checks below
        elif isinstance(value, int) and not isinstance(value, bool) and not -MAX_COUNT - 1 <= value <= MAX_COUNT:
            out[attr] = _json.to_text(value)  # an OTLP integer is an int64: past it, the number as text
        elif isinstance(value, (str, bool, int, float)):
            out[attr] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            out[attr] = tuple(value)
        elif key in JSON_PARAMETERS and isinstance(value, Mapping):
            out[attr] = _json.dumps(value)
    return out
