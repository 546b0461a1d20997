"""``_json.parse``: what ``json.loads`` gives for a str, value or error, with fewer frames."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loopscope import _json

TEXTS = [
    '{"city": "Paris", "n": [1, 2.5, null, true]}', " [1, 2] ", "\n{}\n", "\t1", '"é \\u00e9"', "1e400", "NaN", "-Infinity",
    '"\\ud800"', "", "   ", "{bad", '{"a": 1} x', "1 2", "\ufeff{}", "\x0b1", "\u00a01", '{"a": 1}   ',
]


def outcome(fn: Any, text: str) -> tuple[Any, ...]:
    try:
        value = fn(text)
    except ValueError as exc:
        return ("error", type(exc), str(exc))
    return ("value", repr(value))


@pytest.mark.parametrize("text", TEXTS)
def test_parse_is_json_loads(text: str) -> None:
    assert outcome(_json.parse, text) == outcome(json.loads, text)
