"""Test doubles for loopscope's tests: a fake model server speaking the providers' wire formats (tests/fakes/wires/)."""

from .model_server import FakeModelServer, RecordedRequest, Reply, ToolCall, Usage

__all__ = ["FakeModelServer", "RecordedRequest", "Reply", "ToolCall", "Usage"]
