"""Start notices go over one kept-alive HTTP connection from batch to batch (a new
connection a batch cost more CPU than the notices themselves, issue 31), and over a new one
when the endpoint closed the idle one meanwhile."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from exporting import batch_leaves


class KeepAliveReceiver:
    """An OTLP/HTTP endpoint speaking HTTP/1.1 (connections stay open, as a collector's do):
    it notes each request's path and the client port it came from."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, int, bytes]] = []
        self.close_next = False  # close the connection after the next answer
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests.append((self.path, self.client_address[1], body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()
                if receiver.close_next and self.path == "/v1/logs":
                    receiver.close_next = False
                    self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def notices(self) -> list[tuple[int, list[str]]]:
        """Per logs request: its client port and the names of the spans it announced."""
        out = []
        for path, port, body in self.requests:
            if path == "/v1/logs":
                request = ExportLogsServiceRequest.FromString(body)
                names = [kv.value.string_value for rl in request.resource_logs for sl in rl.scope_logs
                         for record in sl.log_records for kv in record.attributes if kv.key == "loopscope.span.name"]
                out.append((port, names))
        return out


@pytest.fixture
def receiver() -> Iterator[KeepAliveReceiver]:
    rec = KeepAliveReceiver()
    yield rec
    rec.server.shutdown()
    rec.server.server_close()


def _turn(name: str) -> None:
    with loopscope.turn(session_id="keep", agent=name, input="hi", model="m", provider="openai") as t:
        batch_leaves()  # while the turn runs: it sends its start notice
        t.generation("Done.", finish_reason="stop", usage={"input_tokens": 3, "output_tokens": 1})


def _flush() -> None:
    batch_leaves()


def test_notices_reuse_one_connection(tmp_path: Path, receiver: KeepAliveReceiver) -> None:
    loopscope.configure(tmp_path / "s.duckdb", tracer_provider=TracerProvider(), otlp_endpoint=receiver.endpoint,
                        flush_interval=0.05, otlp=True)
    try:
        for name in ("a1", "a2", "a3"):
            _turn(name)
            _flush()
        receiver.close_next = True  # the endpoint closes the idle connection: the next batch opens another
        _turn("a4")
        _flush()
        _turn("a5")
        _flush()
    finally:
        loopscope.shutdown()
    sent = receiver.notices()
    assert [names for _, names in sent] == [["invoke_agent a1"], ["invoke_agent a2"], ["invoke_agent a3"],
                                            ["invoke_agent a4"], ["invoke_agent a5"]]
    ports = [port for port, _ in sent]
    assert len(set(ports[:4])) == 1  # one connection for the first four batches
    assert ports[4] != ports[3]  # a new one after the endpoint closed it
