"""The OTLP receiver (``loopscope collect``): decoding, routing to the store, HTTP and gRPC."""
