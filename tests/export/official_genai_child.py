"""One openai chat call recorded by loopscope and by the official GenAI instrumentation
(opentelemetry-instrumentation-genai-openai) on one provider, exported over OTLP.

Run by tests/export/test_content_switch.py with the peers stack's Python (tests/stacks.toml), which has it:
``python official_genai_child.py MODEL_BASE_URL OTLP_ENDPOINT DB``. The content switch is
whatever the environment says.
"""

from __future__ import annotations

import sys

import openai
from opentelemetry import trace
from opentelemetry.instrumentation.genai.openai import OpenAIInstrumentor
from opentelemetry.sdk.trace import TracerProvider

import loopscope

PROMPT = "What's the weather in Paris?"


def main(base_url: str, endpoint: str, db: str) -> None:
    provider = TracerProvider()
    trace.set_tracer_provider(provider)
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    loopscope.configure(db, tracer_provider=provider, otlp_endpoint=endpoint, flush_interval=0.05)
    loopscope.instrument()
    client = openai.OpenAI(base_url=base_url, api_key="test-key", max_retries=0)
    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": PROMPT}])
    loopscope.shutdown()
    provider.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:4])
