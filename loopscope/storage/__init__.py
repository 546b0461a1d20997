"""The store: the seam (:mod:`.queries`, :mod:`.api`) and its engines (:mod:`.duckdb`; ClickHouse by URL),
the facts they take (:mod:`.rows`) and what they answer (:mod:`.results`); what comes
into the store from outside lives in :mod:`loopscope.ingest`."""
