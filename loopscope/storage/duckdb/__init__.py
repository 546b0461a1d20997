"""The DuckDB engine: the store file's connections, schema and migrations, the writer, the
reads and the SQL views. What calls it from outside storage goes through the seam
(:mod:`loopscope.storage.api`)."""
