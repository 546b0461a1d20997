"""What tests of start notices share: a batch leaving while a span runs."""

from __future__ import annotations

from loopscope import pipeline


def batch_leaves() -> None:
    """The OTLP exporter's queued spans leave now, as its timer would send them: an agent
    run or tool call still running then sends its start notice; one that has ended by then
    sends none (its span carries its start: loopscope.export.otlp.StartMarker)."""
    active = pipeline.active()
    assert active is not None and active.exporter is not None
    active.exporter.force_flush()
