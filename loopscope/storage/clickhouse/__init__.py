"""The ClickHouse engine: loopscope's turns, timeline and analytics over the ``otel_traces`` table an
OpenTelemetry Collector's ``clickhouseexporter`` writes (docs/clickhouse.md).

:mod:`.ddl` makes ``otel_traces`` exactly as the exporter does and loopscope's derived tables beside
it, as materialized views fed by each insert into ``otel_traces``; :mod:`.runner` runs a statement
on chDB (in process) or a server (``clickhouse-connect``); :mod:`.reader` answers the query API
(:class:`~loopscope.storage.queries.Reader`); :mod:`.sink` writes loopscope's spans as the exporter
would, for ``loopscope collect --db clickhouse://...`` without a Collector. The seam
(:mod:`loopscope.storage.queries`) calls ``open_reader``, ``open_sink`` and ``prepare`` here."""

from .reader import open_reader, prepare
from .sink import open_sink

__all__ = ["open_reader", "open_sink", "prepare"]
