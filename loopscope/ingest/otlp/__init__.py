"""The OTLP receiver (``loopscope collect``): decoding, routing to the store, HTTP and gRPC."""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 4318
DEFAULT_GRPC_PORT = 4317
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_SOCKET_TIMEOUT = 15.0
TOKEN_ENV = "LOOPSCOPE_COLLECT_TOKEN"
"""The environment variable ``loopscope collect`` reads its bearer token from."""
