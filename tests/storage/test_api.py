"""The store's API (loopscope/storage/api.py) is what the DuckDB store implements: each
method of the seam is the store's, with the same parameters, so code written against the
seam runs on the store (and a second engine is held to the same signatures)."""

from __future__ import annotations

import inspect

import pytest

from loopscope.ingest.writer import SPANS
from loopscope.storage.api import SpanSink, StoreReader
from loopscope.storage.duckdb.connection import open_store
from loopscope.storage.duckdb.schema import migrate
from loopscope.storage.duckdb.store import Store
from loopscope.storage.duckdb.writer import StoreWriter
from loopscope.storage.queries import open_sink


def _methods(protocol: type) -> list[str]:
    return [name for name, value in vars(protocol).items() if inspect.isfunction(value) and not name.startswith("_")]


def _shape(function: object) -> list[tuple[str, object, object, object]]:
    signature = inspect.signature(function)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default, p.annotation) for p in signature.parameters.values()] + [
        ("return", None, None, signature.return_annotation)
    ]


@pytest.mark.parametrize(("protocol", "implementation"), [(StoreReader, Store), (SpanSink, StoreWriter)])
def test_the_store_implements_each_method_of_the_seam_with_its_signature(protocol, implementation):
    methods = _methods(protocol)
    assert methods
    for name in methods:
        assert _shape(getattr(implementation, name)) == _shape(getattr(protocol, name)), name


def test_a_store_and_a_span_writer_are_what_the_seam_names(tmp_path):
    path = str(tmp_path / "seam.duckdb")
    with open_store(path, read_only=False) as con:
        migrate(con)
    writer = open_sink(path, mapping=SPANS)
    try:
        assert isinstance(writer, SpanSink)
        assert writer.flush()
        assert isinstance(Store(path), StoreReader)
        assert Store(path).list_sessions() == []
    finally:
        writer.close()
