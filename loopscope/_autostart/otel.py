"""loopscope as an OpenTelemetry instrumentor, for ``opentelemetry-instrument``.

Registered under the ``opentelemetry_instrumentor`` entry point as ``loopscope``, so
``opentelemetry-instrument python app.py`` turns on every loopscope adapter, with the
tracer provider the OpenTelemetry distro set up (loopscope adds its store to it). This
module needs ``opentelemetry-instrumentation`` (which ``opentelemetry-instrument`` comes
with); nothing else in loopscope imports it. It lives with the zero-code start, which it
is: the adapters (``loopscope.instrument``) know nothing of either.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]


class LoopscopeInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Every loopscope adapter, on or off as one instrumentor.

    ``LOOPSCOPE_DISABLED_ADAPTERS=anthropic,mcp`` leaves some libraries alone;
    ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=loopscope`` leaves loopscope out entirely.
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # each adapter waits for its own library's import; none is required

    def _instrument(self, **kwargs: Any) -> None:
        provider = kwargs.get("tracer_provider")
        if provider is not None:
            from .. import pipeline

            if pipeline._active is None:  # the application configured nothing itself
                pipeline.configure(tracer_provider=provider)
        from . import start

        start()

    def _uninstrument(self, **kwargs: Any) -> None:
        from ..instrument import uninstrument

        uninstrument()
