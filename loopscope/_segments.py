"""How a turn's text segments join, in a module of its own: the public models re-export it, and
the store's writer process maps spans with it without importing pydantic (~0.1 s of every
writer process's start)."""

from __future__ import annotations

__all__ = ["RESPONSE_SEGMENT_SEPARATOR"]

RESPONSE_SEGMENT_SEPARATOR = "\n\n"
"""Joins a turn's segments into its ``response_content``: a blank line at every tool-call boundary."""
