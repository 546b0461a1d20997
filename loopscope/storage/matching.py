"""What a content search compares and shows, the same on every engine (``Reader.search``,
``--search``): the needle as it is looked for, and the snippet a hit shows around it."""

from __future__ import annotations

SNIPPET_CHARS = 60
"""Characters of context a snippet keeps on each side of the match."""


def needle_of(text: str) -> str:
    """The text a search looks for, as it compares it (stripped, lower case); a clear error
    for an empty one."""
    needle = text.strip().lower()
    if not needle:
        raise ValueError("the search text is empty")
    return needle


def snippet(text: str, needle: str, *, cut_before: bool = False, cut_after: bool = False) -> str:
    """The text around the first match of ``needle`` (lower case) on one line, with an
    ellipsis where text was left out."""
    flat = " ".join(text.split())
    at = flat.lower().find(needle)
    at = max(at, 0)
    start = max(0, at - SNIPPET_CHARS)
    end = min(len(flat), at + len(needle) + SNIPPET_CHARS)
    before = "…" if start > 0 or cut_before else ""
    after = "…" if end < len(flat) or cut_after else ""
    return f"{before}{flat[start:end]}{after}"


__all__ = ["SNIPPET_CHARS", "needle_of", "snippet"]
