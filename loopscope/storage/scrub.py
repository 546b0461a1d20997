"""The content policy on the way into the local store, in the writer's mapping stage.

The writer reduces spans to facts in Arrow record batches (:class:`rows.Facts`);
before they are written, the columns that carry content (tool arguments, results and
errors, message text, state rows' content, a turn's response, segments, thinking and
error, its declared tools, a model call's messages, refusal and error) go through the
same :class:`~loopscope.content.policy.ContentPolicy` as OTLP
export: secrets masked, the redaction hook, ``store_max_chars`` per value.

It runs in the writer's thread, once per batch written (never on the calling thread).
Almost no value holds a secret, so the regular expressions (Python's, as on export) run
only on the few values a prefilter picks: an RE2 expression that matches every value a
pattern could match (for the default patterns, the prefilters of
:data:`~loopscope.content.secrets.SECRET_SHAPES`, mostly literal prefixes), run
by Arrow off the GIL over all content values of the batch end to end as one string, and
a byte-length check for the cap. Values it does not pick are not even converted to
Python: they are stored byte for byte as without the policy. A redaction hook, or a
pattern the prefilter cannot stand in for (:data:`_RE2_UNSAFE`), has every value looked
at in Python. A policy with no pattern, no key-value masking, no hook and no cap costs
nothing.
"""

from __future__ import annotations

import bisect
import re
import struct
from typing import Any

from .. import semconv as a
from .._guard import warn_once
from ..content.policy import REDACTED, ContentPolicy
from ..content.secrets import DEFAULT_PREFILTERS, KEY_VALUE_PREFILTER
from . import rows

# Python's and RE2's meaning of these differ (Unicode classes and boundaries, ``$``
# before a final newline): a pattern with one could match a value its RE2 form misses.
_RE2_UNSAFE = re.compile(r"\\[wWdDsSbBZAx]|\$|(?<!\[)\^|\(\?[^:Pi]")

# (column, where: the attribute the hook is told, or None for by-row, how: text / json / shape)
_EVENT_COLUMNS = (
    ("arguments", a.TOOL_CALL_ARGUMENTS, "json"),
    ("result", a.TOOL_CALL_RESULT, "json"),
    ("error", a.TOOL_ERROR, "text"),
    ("body", None, "text"),
    ("content", None, "shape"),
)
_TURN_COLUMNS = (
    ("response_content", a.SEGMENTS, "text"),
    ("segments", a.SEGMENTS, "shape"),
    ("thinking", a.THINKING, "text"),
    ("error", "exception.message", "text"),
    ("declared_tools", a.DECLARED_TOOLS, "tools"),  # masked, never cut (the views read it as JSON)
)
_CALL_COLUMNS = (
    ("input_messages", a.INPUT_MESSAGES, "json"),
    ("output_messages", a.OUTPUT_MESSAGES, "json"),
    ("refusal", a.CALL_REFUSAL, "text"),
    ("error", a.CALL_ERROR, "text"),
)


def _event_where(column: str, code: int) -> str:
    if column == "body":
        return a.TURN_INPUT if code == rows.INPUT_MESSAGE else a.ROUND_TEXT
    if code in (rows.STATE_SNAPSHOT, rows.STATE_DELTA):
        return a.STATE_VALUE
    return a.TOOL_CALL_RESULT if code <= rows.TOOL_END else a.ROUND_TEXT


def prefilter(policy: ContentPolicy) -> str | None:
    """An RE2 expression matching every text :meth:`ContentPolicy.mask` could change;
    ``""`` when it changes nothing; None when no such expression is known (a hook, or a
    pattern RE2 cannot stand in for)."""
    if policy.redact is not None:
        return None
    parts: list[str] = []
    for pattern in policy.patterns or ():
        prefix = DEFAULT_PREFILTERS.get(pattern)  # each default shape's own (secrets.py)
        if prefix is not None:
            parts.append(prefix)
            continue
        pattern = pattern.replace("(?P<secret>", "(?:")  # RE2 refuses a name used twice
        if _RE2_UNSAFE.search(pattern) or not _re2_compiles(pattern):
            return None
        parts.append(f"(?-i:{pattern})")
    if policy.key_values:
        parts.append(KEY_VALUE_PREFILTER)
    return "(?i)" + "|".join(parts) if parts else ""


def _re2_compiles(pattern: str) -> bool:
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        pc.match_substring_regex(pa.array(["probe"]), pattern=pattern)  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes its functions at import
    except Exception:  # any refusal means: not an RE2 expression
        return False
    return True


class Scrubber:
    """Applies a content policy to the content columns of fact batches."""

    def __init__(self, policy: ContentPolicy) -> None:
        self.policy = policy
        self.limit = max(0, int(policy.store_max_chars or 0))
        self.masking = policy.masks
        self.pattern = prefilter(policy) if self.masking else ""

    @property
    def idle(self) -> bool:
        """True when the policy can change no stored value (nothing to do at all)."""
        return not self.masking and not self.limit

    def apply(self, facts: rows.Facts) -> None:
        """Scrub the batches of ``facts`` in place."""
        if self.idle:
            return
        kinds = [(name, columns) for name, columns in (("events", _EVENT_COLUMNS), ("turns", _TURN_COLUMNS),
                                                       ("calls", _CALL_COLUMNS)) if getattr(facts, name)]
        if kinds:
            scrubbed = self._batches([(getattr(facts, name), columns) for name, columns in kinds])
            for (name, _), batches in zip(kinds, scrubbed):
                setattr(facts, name, batches)
        if facts.fixes:  # a corrected call's error, as its row's error would be (rare: in Python)
            facts.fixes = [(*fix[:3], self._scrub(fix[3], a.TOOL_ERROR, "text"), *fix[4:]) for fix in facts.fixes]
        if facts.scores:  # a score's explanation, as its span's attribute is scrubbed on export (rare: in Python)
            facts.scores = [
                (*f[:5], self._scrub(f[5], a.EVALUATION_EXPLANATION, "text") if f[5] else f[5], *f[6:]) for f in facts.scores
            ]

    def masked(self, column: Any, how: str = "json") -> Any:
        """A string array with secrets masked in the values the prefilter picks (no cap,
        no ``where`` for the hook): the collector's raw copies of received spans, whose
        attributes may come unmasked from any sender. ``how``: ``"json"`` (JSON stays
        JSON), ``"attributes"`` (a span's attributes as a JSON object: tool definitions
        in it keep their schemas) or ``"text"``."""
        import pyarrow as pa

        if not self.masking or column.null_count == len(column):
            return column
        if self.pattern is None:
            rows = [i for i, valid in enumerate(column.is_valid().to_pylist()) if valid]
        else:
            rows = _matching_rows(column, self.pattern) if self.pattern else []
        if not rows:
            return column
        values = column.to_pylist()
        for row in rows:
            value = values[row]
            if value is not None:
                values[row] = self._scrub_unlimited(value, how)
        return pa.array(values, column.type)

    def _scrub_unlimited(self, value: str, how: str) -> str:
        try:
            if how == "attributes":
                return self.policy.scrub_attributes_json(value)
            return self.policy.scrub_json(value, "", 0) if how == "json" else self.policy.scrub(value, "", 0)
        except Exception as exc:  # the user's hook or pattern failed: keep nothing of the value
            warn_once("content-policy", "loopscope: the content policy failed on a stored value (%r); it is stored as %s", exc, REDACTED)
            return '"[REDACTED]"' if how != "text" else REDACTED

    def _batches(self, kinds: list[tuple[list[Any], tuple[tuple[str, str | None, str], ...]]]) -> list[list[Any]]:
        """The batches of each kind of fact (events, turns, calls: its batches and its
        content columns), scrubbed."""
        import pyarrow as pa

        # every content column of every batch of every kind end to end: the prefilter's
        # cost is mostly per call (its expression compiled), so it runs once per write
        # (only the content columns are copied)
        pieces: list[Any] = []
        where: list[tuple[int, int, int]] = []  # per piece: its kind, its batch, its column (k)
        indices_of: list[list[int]] = []
        for g, (batches, columns) in enumerate(kinds):
            names = batches[0].schema.names
            indices = [names.index(name) for name, _, _ in columns]
            indices_of.append(indices)
            for k, i in enumerate(indices):
                for j, batch in enumerate(batches):
                    pieces.append(batch.column(i))
                    where.append((g, j, k))
        picked, to_mask = self._pick(pa.concat_arrays(pieces))
        out = [list(batches) for batches, _ in kinds]
        if not picked:
            return out
        starts = [0]
        for piece in pieces:
            starts.append(starts[-1] + len(piece))
        # (kind, batch) -> column (k) -> (row, whether it is masked or only cut)
        hits: dict[tuple[int, int], dict[int, list[tuple[int, bool]]]] = {}
        for position in picked:
            piece = bisect.bisect_right(starts, position) - 1
            g, j, k = where[piece]
            hits.setdefault((g, j), {}).setdefault(k, []).append((position - starts[piece], to_mask is None or position in to_mask))
        for (g, j), by_column in hits.items():
            batches, columns = kinds[g]
            out[g][j] = self._batch(batches[j], columns, indices_of[g], by_column)
        return out

    def _batch(self, batch: Any, columns: tuple[tuple[str, str | None, str], ...], indices: list[int],
               hits: dict[int, list[tuple[int, bool]]]) -> Any:
        import pyarrow as pa

        codes: list[int] | None = None
        for k, positions in hits.items():
            name, where, how = columns[k]
            index = indices[k]
            column = batch.column(index)
            values = column.to_pylist()
            changed = False
            for row, mask in positions:
                value = values[row]
                if value is None:
                    continue
                if not mask:  # picked for its length alone: the prefilter says no masking changes it
                    cleaned = self._cut(value, how)
                else:
                    place = where
                    if place is None:
                        if codes is None:
                            fetched: list[int] = batch.column(0).to_pylist()
                            codes = fetched
                        place = _event_where(name, codes[row])
                    cleaned = self._scrub(value, place, how)
                if cleaned != value:
                    values[row] = cleaned
                    changed = True
            if changed:
                batch = batch.set_column(index, batch.schema.field(index), pa.array(values, column.type))
        return batch

    def _pick(self, column: Any) -> tuple[list[int], set[int] | None]:
        """The rows of ``column`` whose value the policy may change, in order, and those of
        them the masking may change (None: all of them); the others are only over the cap.

        A value over the cap that the prefilter did not pick is cut without being masked:
        masking would change nothing in it, and its passes over the text (the lower-cased
        copy, the literals' searches) were most of the writer's time for 1 MiB tool
        results (~38 ms each)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if column.null_count == len(column):
            return [], None
        if self.pattern is None:  # every value is looked at
            return pc.indices_nonzero(pc.is_valid(column)).to_pylist(), None  # pyright: ignore[reportAttributeAccessIssue]
        rows = _matching_rows(column, self.pattern) if self.pattern else []
        masked = set(rows)
        if self.limit:
            # bytes, not characters: a superset, without a pass over the text
            # the limit as an Arrow scalar: a Python int costs pyarrow a failed import of
            # dateutil (where it is not installed: ~0.15 ms, once per batch) to convert it
            length = pc.binary_length(column)  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes its functions at import
            limit = pa.scalar(self.limit, length.type)
            long = pc.indices_nonzero(pc.greater(length, limit)).to_pylist()  # pyright: ignore[reportAttributeAccessIssue]
            if long:
                rows = sorted(masked.union(long))
        return rows, masked

    def _cut(self, value: str, how: str) -> str:
        """:meth:`_scrub` of a value no masking changes: the cap alone."""
        cap = ContentPolicy.cap_json
        if how == "text":
            return cap(value, self.limit)
        return cap(value, self.limit, cap="shape" if how == "shape" else "strings")

    def _scrub(self, value: str, where: str, how: str) -> str:
        policy, limit = self.policy, self.limit
        try:
            if how == "text":
                return policy.scrub(value, where, limit)
            if how == "tools":
                return policy.mask_tools(value, where)
            return policy.scrub_json(value, where, limit, cap="shape" if how == "shape" else "strings")
        except Exception as exc:  # the user's hook or pattern failed: keep nothing of the value
            warn_once("content-policy", "loopscope: the content policy failed on a stored value (%r); it is stored as %s", exc, REDACTED)
            if how == "tools":
                return "[]"  # the tools are not known (a list, as the views read it)
            return '"[REDACTED]"' if how != "text" else REDACTED


def _matching_rows(column: Any, pattern: str) -> list[int]:
    """The rows of a string array in which ``pattern`` (RE2) matches.

    The values lie end to end in the array's data buffer: the expression runs over that
    buffer as one string (zero copy) and each match is traced back to its row through the
    offsets, searching on after that row. Matches are rare, so this is about one pass,
    several times faster than a match per value. A match across two values only picks one
    more value to look at; the expression has no anchors (:data:`_RE2_UNSAFE`).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.type != pa.string() or column.offset:
        return pc.indices_nonzero(pc.match_substring_regex(column, pattern=pattern)).to_pylist()  # type: ignore[no-any-return]
    count = len(column)
    _, offsets_buffer, data = column.buffers()
    if data is None or offsets_buffer is None:
        return []
    offsets = memoryview(offsets_buffer)[: (count + 1) * 4].cast("i")
    start, end = offsets[0], offsets[count]
    rows: list[int] = []
    while start < end:
        span = pa.StringArray.from_buffers(1, pa.py_buffer(struct.pack("=ii", start, end)), data)
        found = pc.find_substring_regex(span, pattern=pattern)[0].as_py()  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes its functions at import
        if found is None or found < 0:
            break
        row = bisect.bisect_right(offsets, start + found, 0, count + 1) - 1
        rows.append(row)
        start = offsets[row + 1]
    return rows


_scrubbers: dict[int, tuple[ContentPolicy, Scrubber]] = {}


def scrubber(policy: ContentPolicy) -> Scrubber:
    """The scrubber of ``policy``, made once per policy object."""
    entry = _scrubbers.get(id(policy))
    if entry is None or entry[0] is not policy:
        if len(_scrubbers) > 32:
            _scrubbers.clear()
        entry = _scrubbers[id(policy)] = (policy, Scrubber(policy))
    return entry[1]
