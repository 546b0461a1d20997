"""pydantic-ai: its agent runs as turns, from the GenAI spans it emits itself.

pydantic-ai instruments its agent runs natively (``invoke_agent`` -> ``chat`` ->
``execute_tool`` spans with GenAI attributes), so this adapter translates nothing
itself. It switches that instrumentation on for every agent (``Agent.instrument_all``)
with a tracer provider that follows loopscope's pipeline, unless the application chose
its own settings; the store's span processor maps the spans with the same
:mod:`loopscope.ingest.foreign` mapping ``loopscope collect`` uses, loop end reason
included (an output tool such as ``final_result`` is the run's answer there, not a tool
call). And it tells the SDK adapters underneath (openai, anthropic) that a model call
made under one of pydantic-ai's ``chat`` spans is recorded already, so each model call
has one span and each agent run one turn.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

from .._guard import guarded
from ..recorder.adapter import defer_model_calls_to
from ._patch import Registration

SCOPE = "pydantic-ai"  # the instrumentation scope of pydantic-ai's spans


_NOOP = trace.NoOpTracer()


class _LiveTracer(trace.Tracer):
    """A tracer that starts each span on the provider of loopscope's current pipeline,
    so pydantic-ai's settings, made once, follow a later ``loopscope.configure()``."""

    def __init__(self, name: str, version: str | None, schema_url: str | None, attributes: Any) -> None:
        self._args = (name, version, schema_url, attributes)
        self._provider: Any = None
        self._tracer: trace.Tracer | None = None

    def _current(self) -> trace.Tracer:
        from .. import pipeline

        provider = pipeline.active().tracer_provider
        tracer = self._tracer
        if tracer is None or provider is not self._provider:
            name, version, schema_url, attributes = self._args
            tracer = provider.get_tracer(name, version, schema_url, attributes)
            self._provider, self._tracer = provider, tracer
        return tracer

    @guarded("pydantic-ai tracer", default=_NOOP)
    def _tracer_or_noop(self) -> trace.Tracer:
        # pydantic-ai starts its spans inside the user's run: if loopscope cannot give it a
        # tracer, the run goes on with spans that record nothing
        return self._current()

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._tracer_or_noop().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._tracer_or_noop().start_as_current_span(*args, **kwargs)


class _LiveTracerProvider(trace.TracerProvider):
    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> trace.Tracer:
        return _LiveTracer(instrumenting_module_name, instrumenting_library_version, schema_url, attributes)


def settings() -> Any:
    """The instrumentation settings loopscope gives pydantic-ai: its spans, with content
    (the store keeps it; the OTLP export drops it unless content capture is on), on
    loopscope's tracer provider."""
    from pydantic_ai.models.instrumented import InstrumentationSettings

    return InstrumentationSettings(tracer_provider=_LiveTracerProvider(), include_content=True)


def _instrument_all() -> Registration | None:
    from pydantic_ai import Agent

    before = Agent.__dict__.get("_instrument_default", False)
    if before is not False:
        return None  # the application instrumented pydantic-ai itself: its settings stand
    ours = settings()
    Agent.instrument_all(ours)

    def undo() -> None:
        # put the default back only if it is still ours (the application may have set its own since)
        if Agent.__dict__.get("_instrument_default") is ours:
            Agent.instrument_all(before)

    return Registration(undo)


def patch() -> list[Registration]:
    patches = [Registration(defer_model_calls_to(SCOPE))]
    instrumented = _instrument_all()
    if instrumented is not None:
        patches.append(instrumented)
    return patches
