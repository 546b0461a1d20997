"""Which signals loopscope sends over OTLP: the standard ``OTEL_TRACES_EXPORTER``,
``OTEL_METRICS_EXPORTER`` and ``OTEL_LOGS_EXPORTER``.

Each is a comma-separated list of exporter names (the OpenTelemetry SDK configuration
spec); unset or empty means ``otlp``, the default. loopscope provides the ``otlp`` exporter
only (over the protocol ``OTEL_EXPORTER_OTLP_PROTOCOL`` names), and only when an endpoint
is set. So for each signal:

* ``otlp`` (or unset): sent over OTLP, as before;
* ``none``: loopscope sends nothing of that signal (``none`` wins over any other name);
* any other name (``console``, ``zipkin``, ``prometheus``, ...): loopscope sends nothing of
  that signal either, and says once that it does not provide that exporter. An SDK set up
  by the application (``opentelemetry-instrument``, its own providers) does: loopscope's
  spans and metrics reach it through the application's providers, which loopscope adds to.

Arguments given to ``configure()`` (``otlp=True`` / ``False``) win over these variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .._guard import warn_once

VARIABLES = {"traces": "OTEL_TRACES_EXPORTER", "metrics": "OTEL_METRICS_EXPORTER", "logs": "OTEL_LOGS_EXPORTER"}
"""Each signal and the variable that selects its exporters."""
SUPPORTED = "otlp"


def exporter_names(signal: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The exporters the environment selects for ``signal`` (``traces``, ``metrics``, ``logs``),
    lower-cased; ``["otlp"]`` when unset or empty."""
    value = (os.environ if environ is None else environ).get(VARIABLES[signal], "")
    names = [name.strip().lower() for name in value.split(",") if name.strip()]
    return names or [SUPPORTED]


def exports(signal: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether loopscope may send ``signal`` over OTLP (given an endpoint): ``otlp`` is among
    the names and ``none`` is not. Names of exporters loopscope does not provide are said
    once, in a warning."""
    names = exporter_names(signal, environ)
    if "none" in names:
        return False
    others = [name for name in names if name != SUPPORTED]
    if others:
        warn_once(
            f"unsupported-exporter-{signal}",
            "loopscope: %s=%s: loopscope sends %s over OTLP only and does not provide %s (the application's own "
            "OpenTelemetry setup may); %s",
            VARIABLES[signal], ",".join(names), signal, ", ".join(others),
            "it sends them over OTLP as the list asks" if SUPPORTED in names else "it sends none over OTLP",
        )
    return SUPPORTED in names
