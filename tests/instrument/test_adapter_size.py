"""A provider adapter stays a translator on the kit: its code lines are counted (issue 32's
acceptance: the google-genai and mistralai adapters at most ~200 lines of code on the kit).

A code line is a line that is not blank, not a comment alone, and not part of a docstring (a
module's, a class's or a function's). What an adapter would otherwise derive again belongs in
the kit (``recorder/adapter.py`` and the modules it exposes, ``instrument/_calls.py``,
``_streams.py``, ``_read.py``, ``_openai_compat.py``), where every adapter shares it.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

INSTRUMENT = Path(importlib.import_module("loopscope.instrument").__path__[0])
PROVIDERS = ("google_genai.py", "mistral.py", "cohere.py", "ollama.py", "bedrock.py", "groq.py")
LIMITS = {"google_genai.py": 200, "mistral.py": 200}
"""The code lines each adapter may have (issue 32)."""


def code_lines(source: str) -> int:
    """The lines of ``source`` that are code: not blank, not a comment alone, not a docstring's."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return sum(
        1
        for number, line in enumerate(source.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#") and number not in docstrings
    )


def test_code_lines_leave_out_blanks_comments_and_docstrings() -> None:
    source = '''"""A module.

Its docstring."""

import os  # a comment after code is code


class A:
    """A class."""

    # a comment alone
    x = 1

    def f(self) -> str:
        """A function,
        over two lines."""
        return """a string
that is no docstring"""
'''
    assert code_lines(source) == 6  # import, class, x, def, and the returned string's two lines


def test_the_provider_adapters_are_small(capsys: pytest.CaptureFixture[str]) -> None:
    counts = {name: code_lines((INSTRUMENT / name).read_text()) for name in PROVIDERS}
    with capsys.disabled():
        print("\ncode lines: " + ", ".join(f"{name} {count}" for name, count in counts.items()))
    over = {name: f"{counts[name]} > {limit}" for name, limit in LIMITS.items() if counts[name] > limit}
    assert over == {}, (
        f"adapters past their code lines (move what is not the SDK's own into the kit): {over}; all: {counts}"
    )
