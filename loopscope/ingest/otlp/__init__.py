"""The OTLP receiver (``loopscope collect``): decoding, routing to the store, HTTP and gRPC."""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 4318
DEFAULT_GRPC_PORT = 4317
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_SPANS = 50_000
"""Spans one traces request may carry (OpenTelemetry SDKs send at most 512 at once, the
OpenTelemetry Collector's batches 8,192 by default); past it: 413 / ``INVALID_ARGUMENT``."""
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_SOCKET_TIMEOUT = 15.0
DEFAULT_MAX_OPEN = 512
"""HTTP connections held open at once (waiting for a request or served); past it the oldest
waiting one is closed for the new one (see :class:`loopscope._http.BoundedHTTPServer`)."""
TOKEN_ENV = "LOOPSCOPE_COLLECT_TOKEN"
"""The environment variable ``loopscope collect`` reads its bearer token from."""
