"""What leaves the process: OTLP export of spans and metrics, under the content policy."""
