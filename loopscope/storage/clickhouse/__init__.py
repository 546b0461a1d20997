"""The ClickHouse engine: loopscope's turns, timeline and analytics over the ``otel_traces`` table an
OpenTelemetry Collector's ``clickhouseexporter`` writes (docs/clickhouse.md).

So far the data side: :mod:`.ddl` makes ``otel_traces`` exactly as the exporter does and loopscope's
derived tables beside it, as materialized views fed by each insert into ``otel_traces``. It imports
no ClickHouse client: the statements run on whatever runs SQL (chDB in-process, or a server through
``clickhouse-connect``)."""
