"""The DuckDB store: schema and migrations, the writer, the query API and the SQL views.
:mod:`.api` names the store's API (the seam a second engine would implement); what comes
into the store from outside lives in :mod:`loopscope.ingest`."""
