"""A minimal OTLP/HTTP receiver on 127.0.0.1 for export tests: decodes what it is sent."""

from __future__ import annotations

import http.server
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@dataclass
class ReceivedSpan:
    name: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    trace_id: str
    span_id: str
    parent_span_id: str


@dataclass
class OTLPReceiver:
    port: int = 0
    spans: list[ReceivedSpan] = field(default_factory=list)
    # pending copies sent as spans (loopscope.pending_for): loopscope no longer sends any
    pending: list[ReceivedSpan] = field(default_factory=list)
    # loopscope's start notices (log records on /v1/logs), as the spans they announce
    notices: list[ReceivedSpan] = field(default_factory=list)
    logs_status: int = 200  # what /v1/logs answers (404: a backend without a logs receiver)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    status: int = 200
    delay: float = 0.0
    # path -> the HTTP status it answers (a backend without that signal's receiver: {"/v1/metrics": 405})
    refuse: dict[str, int] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)  # every request's path, in order
    bodies: list[tuple[str, bytes]] = field(default_factory=list)  # every request's (path, body) as sent, in order

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.02)
        return False


def start() -> tuple[OTLPReceiver, http.server.ThreadingHTTPServer]:
    receiver = OTLPReceiver()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
            receiver.paths.append(self.path)
            receiver.bodies.append((self.path, body))
            refused = receiver.refuse.get(self.path)
            if refused is None and self.path.endswith("/v1/logs") and receiver.logs_status != 200:
                refused = receiver.logs_status
            if refused is not None:
                self.send_response(refused)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            if receiver.delay:
                time.sleep(receiver.delay)
            if receiver.status != 200:
                self.send_response(receiver.status)
                self.end_headers()
                return
            if self.path.endswith("/v1/traces"):
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for rs in request.resource_spans:
                    resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            span = ReceivedSpan(
                                s.name, {a.key: _value(a.value) for a in s.attributes}, resource,
                                s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                            )
                            (receiver.pending if "loopscope.pending_for" in span.attributes else receiver.spans).append(span)
            elif self.path.endswith("/v1/logs"):
                logs = ExportLogsServiceRequest()
                logs.ParseFromString(body)
                for rl in logs.resource_logs:
                    resource = {a.key: _value(a.value) for a in rl.resource.attributes}
                    for sl in rl.scope_logs:
                        for record in sl.log_records:
                            attributes = {a.key: _value(a.value) for a in record.attributes}
                            attributes["event_name"] = record.event_name
                            receiver.notices.append(ReceivedSpan(
                                str(attributes.get("loopscope.span.name")), attributes, resource,
                                record.trace_id.hex(), record.span_id.hex(), "",
                            ))
            elif self.path.endswith("/v1/metrics"):
                request = ExportMetricsServiceRequest()
                request.ParseFromString(body)
                receiver.metrics.append(MessageToDict(request))
            payload = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.port = server.server_port
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return receiver, server
