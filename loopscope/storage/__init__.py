"""The DuckDB store: schema, span-to-event mapping, background writer, query API."""
