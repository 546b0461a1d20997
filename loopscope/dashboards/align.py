"""A global sequence alignment (Needleman–Wunsch) of two sequences, by a similarity score:
the pairs of positions a person would line up, and the items only one side has.

Pure: nothing here reads a store or knows what the items are. ``score(x, y)`` says how alike
two items are (a positive number: the higher, the likelier a match; None: never paired);
each item left unpaired costs ``gap``. The alignment is the one with the highest total, so a
repeated or an extra item costs one gap where a position-by-position comparison would pair
everything after it with the wrong item.

Ties go to the earliest pairing (reading both sequences forwards, a pair is taken as soon as
it is part of a best alignment), and of two unpaired items the first sequence's comes first,
as a unified diff shows ``-`` lines before ``+`` lines. A common run at either end whose items
are ``identical`` is paired before the table is filled (that is always part of a best
alignment when no pair scores more than an identical one), so two long runs that differ in
a few steps cost a small table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

GAP = -1
"""What an unpaired item costs, by default."""
MAX_CELLS = 4_000_000
"""The largest table (items of one side times the other's, once common ends are paired)
aligned; past it :func:`align` raises :class:`TooLongError`."""

Pair = tuple[int | None, int | None]
"""Positions in the first and the second sequence (None: the item has no partner)."""


class TooLongError(ValueError):
    """The sequences are too long to align within :data:`MAX_CELLS`."""


def align(
    a: Sequence[T], b: Sequence[T], score: Callable[[T, T], float | None], *,
    identical: Callable[[T, T], bool] | None = None, gap: float = GAP, max_cells: int = MAX_CELLS,
) -> list[Pair]:
    """The best alignment of ``a`` and ``b``: every position of each exactly once, in order."""
    head = 0
    tail = 0
    if identical is not None:
        while head < len(a) and head < len(b) and identical(a[head], b[head]):
            head += 1
        while tail < len(a) - head and tail < len(b) - head and identical(a[-1 - tail], b[-1 - tail]):
            tail += 1
    pairs: list[Pair] = [(i, i) for i in range(head)]
    middle = _align(a[head:len(a) - tail], b[head:len(b) - tail], score, gap, max_cells)
    pairs.extend((None if i is None else i + head, None if j is None else j + head) for i, j in middle)
    pairs.extend((len(a) - tail + k, len(b) - tail + k) for k in range(tail))
    return pairs


def _align(a: Sequence[T], b: Sequence[T], score: Callable[[T, T], float | None], gap: float, max_cells: int) -> list[Pair]:
    n, m = len(a), len(b)
    if n * m > max_cells:
        raise TooLongError(f"{n} and {m} steps that differ are too many to align ({n * m:,} > {max_cells:,} comparisons)")
    # best[i][j]: the best total of aligning a[i:] with b[j:] (filled from the ends, so that the
    # walk below goes forwards and takes the earliest pair a best alignment allows)
    sims = [[score(x, y) for y in b] for x in a]
    best = [[0.0] * (m + 1) for _ in range(n + 1)]
    for j in range(m - 1, -1, -1):
        best[n][j] = best[n][j + 1] + gap
    for i in range(n - 1, -1, -1):
        row, below, sim_row = best[i], best[i + 1], sims[i]
        row[m] = below[m] + gap
        for j in range(m - 1, -1, -1):
            value = max(below[j] + gap, row[j + 1] + gap)
            sim = sim_row[j]
            if sim is not None:
                value = max(value, below[j + 1] + sim)
            row[j] = value
    pairs: list[Pair] = []
    i = j = 0
    while i < n or j < m:
        if i < n and j < m:
            sim = sims[i][j]
            if sim is not None and _close(best[i][j], best[i + 1][j + 1] + sim):
                pairs.append((i, j))
                i += 1
                j += 1
                continue
        if i < n and _close(best[i][j], best[i + 1][j] + gap):
            pairs.append((i, None))
            i += 1
        else:
            pairs.append((None, j))
            j += 1
    return pairs


def _close(x: float, y: float) -> bool:
    return abs(x - y) <= 1e-9 * max(1.0, abs(x), abs(y))


__all__ = ["GAP", "MAX_CELLS", "Pair", "TooLongError", "align"]
