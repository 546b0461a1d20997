"""Start-up stays light with a framework imported (issue 19), in each framework's stack
(tests/stacks.toml): ``instrument()`` leaves alone what the application has not used yet, and
patches a library module imported later. Each check runs in a child interpreter."""

from __future__ import annotations

import pytest

from test_startup import loaded


@pytest.mark.stack("langchain")
def test_instrument_reads_no_heavy_module_of_langchain():
    """With openai and LangChain imported, ``instrument()`` loads neither LangChain's tracer
    context (LangSmith) nor the openai resources."""
    code = (
        "import openai, langchain_core\n"
        "import loopscope\n"
        "loopscope.configure(False)\n"
        "on = loopscope.instrument()\n"
        "assert {'openai', 'langchain'} <= set(on), on\n"
    )
    found = loaded(code, [
        "langchain_core.tracers.context", "langsmith.client",
        "openai.resources.chat.completions.completions", "openai.resources.responses.responses",
    ])
    assert not any(found.values()), [name for name, is_in in found.items() if is_in]


@pytest.mark.stack("openai-agents")
def test_instrument_reads_no_heavy_module_of_the_agents_sdk():
    """With the Agents SDK imported, ``instrument()`` makes no trace provider (its exporter's
    HTTP client) and loads no openai resource."""
    code = (
        "import openai, agents\n"
        "import loopscope\n"
        "loopscope.configure(False)\n"
        "on = loopscope.instrument()\n"
        "assert {'openai', 'openai_agents'} <= set(on), on\n"
        "from agents.tracing import setup\n"
        "assert setup.GLOBAL_TRACE_PROVIDER is None\n"
    )
    found = loaded(code, ["openai.resources.chat.completions.completions", "openai.resources.responses.responses"])
    assert not any(found.values()), [name for name, is_in in found.items() if is_in]


@pytest.mark.stack("langchain")
def test_a_langchain_module_imported_later_is_patched_then():
    code = (
        "import openai, langchain_core\n"
        "import loopscope\n"
        "loopscope.configure(False)\n"
        "loopscope.instrument()\n"
        "import wrapt\n"
        "from openai.resources.chat.completions import completions\n"
        "from openai.resources.responses import responses\n"
        "assert isinstance(completions.Completions.__dict__['create'], wrapt.FunctionWrapper)\n"
        "assert isinstance(responses.AsyncResponses.__dict__['create'], wrapt.FunctionWrapper)\n"
        "from langchain_core.tracers import context\n"
        "assert any(type(var.get()).__name__ == 'LoopscopeCallbackHandler' for var, *_ in context._configure_hooks)\n"
        "loopscope.uninstrument()\n"
        "assert not isinstance(completions.Completions.__dict__['create'], wrapt.FunctionWrapper)\n"
        "assert not any(type(var.get()).__name__ == 'LoopscopeCallbackHandler' for var, *_ in context._configure_hooks)\n"
    )
    loaded(code, [])


@pytest.mark.stack("openai-agents")
def test_an_agents_sdk_module_imported_later_is_patched_then():
    code = (
        "import agents\n"
        "import loopscope\n"
        "loopscope.configure(False)\n"
        "loopscope.instrument()\n"
        "import agents.tracing\n"
        "from loopscope.instrument.openai_agents import LoopscopeProcessor\n"
        "processors = agents.tracing.get_trace_provider()._multi_processor._processors\n"
        "assert sum(isinstance(p, LoopscopeProcessor) for p in processors) == 1, processors\n"
        "loopscope.uninstrument()\n"
        "processors = agents.tracing.get_trace_provider()._multi_processor._processors\n"
        "assert not any(isinstance(p, LoopscopeProcessor) for p in processors), processors\n"
    )
    loaded(code, [])
