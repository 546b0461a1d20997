"""The gaps between a streamed call's chunks, for ``gen_ai.client.operation.time_per_output_chunk``.

The conventions record one value per chunk after the first: the time from the previous
chunk to this one. A stream proxy stamps every chunk as it reaches the application (it
does already, for the time to first chunk) and hands the stamps over a batch at a time
(:meth:`loopscope.recorder.stitch.ModelCall.chunk_times`); they are kept here, off the
span (no exported attribute carries them), and the round hands them at its end to the
metrics side (:data:`loopscope.recorder.settings.chunk_gaps`), whose thread computes the
gaps and records them. Nothing is kept unless that side asks for them (the latest
experimental conventions with metrics on).

Bounded per call: :data:`CAP` gaps at most. Past it the gaps are a uniform random sample
of all of them (a reservoir, Vitter's algorithm R), and :meth:`ChunkGaps.weighted` gives
each kept gap the weight of the gaps it stands for, so that the histogram's count is still
the number of gaps and its buckets (percentiles) are those of the whole stream, in
expectation. A cap that kept only the first gaps would bias a long stream's percentiles
toward its start; a mean gap per call (what a first version did) hides how one call's
chunks differ, which is what the metric is for.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence

CAP = 4096
"""Gaps kept per call: 32 KiB of stamps (8 bytes each, in an ``array``), whatever the stream's
length. A 4,096-chunk answer (a few thousand tokens) is kept whole; longer ones are sampled."""


class ChunkGaps:
    """The arrival times of a streamed call's chunks from the first output chunk on, or,
    past :data:`CAP` gaps, a uniform sample of the gaps between them."""

    __slots__ = ("_last", "_rng", "_sample", "_seen", "_stamps")

    def __init__(self) -> None:
        self._stamps: array[int] | None = array("q")  # monotonic ns, while the call is under the cap
        self._sample: array[int] | None = None  # gap ns, a uniform sample, past the cap
        self._seen = 0  # gaps seen, past the cap
        self._last = 0  # the last stamp, past the cap
        self._rng: random.Random | None = None

    def add(self, stamps: Sequence[int], start: int = 0) -> None:
        """``stamps[start:]`` are the monotonic times (ns) of the next chunks, in order."""
        held = self._stamps
        if held is not None:
            # under the cap: one C-level extend per batch of chunks, the gaps are computed
            # on the metrics thread
            held.extend(stamps[start:] if start else stamps)
            if len(held) > CAP + 1:
                self._to_sample(held)
            return
        self._sample_more(stamps, start)

    def _to_sample(self, held: array[int]) -> None:
        sample = array("q", [held[i + 1] - held[i] for i in range(CAP)])
        self._stamps, self._sample, self._seen, self._last = None, sample, CAP, held[CAP]
        self._rng = random.Random()  # a statistical sample, not a secret
        self._sample_more(held, CAP + 1)

    def _sample_more(self, stamps: Sequence[int], start: int) -> None:
        sample, rng, last, seen = self._sample, self._rng, self._last, self._seen
        if sample is None or rng is None:
            return
        draw = rng.random
        for i in range(start, len(stamps)):
            stamp = stamps[i]
            seen += 1
            slot = int(draw() * seen)
            if slot < CAP:
                sample[slot] = stamp - last
            last = stamp
        self._last, self._seen = last, seen

    def count(self) -> int:
        """How many gaps the stream had (chunks after the first)."""
        return max(len(self._stamps) - 1, 0) if self._stamps is not None else self._seen

    def weighted(self) -> list[tuple[float, int]]:
        """The gaps in seconds, each with how many gaps it stands for (1 under the cap);
        the weights add up to :meth:`count`."""
        stamps = self._stamps
        if stamps is not None:
            return [((stamps[i + 1] - stamps[i]) / 1e9, 1) for i in range(len(stamps) - 1)]
        sample = self._sample or array("q")
        share, extra = divmod(self._seen, len(sample) or 1)
        return [(gap / 1e9, share + (1 if i < extra else 0)) for i, gap in enumerate(sample)]


__all__ = ["CAP", "ChunkGaps"]
