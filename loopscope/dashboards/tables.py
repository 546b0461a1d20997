"""Plain-text tables for a terminal: events, turns, sessions and SQL results.

No dependency: columns are aligned with spaces, a cell is kept on one line, and a cell
too long for its column is cut with an ellipsis. When the whole table is wider than the
terminal, the columns marked ``shrink`` give up width (the text columns first, the widest
first), so the identifying columns stay readable; a command's headers never change with
the data (a script or a reader finds the same columns whatever the rows hold).

Stored text never drives the terminal: :func:`visible` writes its control characters as
escapes (ESC as ``\\x1b``), so a tool result holding ``ESC]52;...`` (the clipboard),
``ESC[2J`` (clear the screen) or a carriage return prints as text. Every cell and header
goes through it (before widths are measured), and the commands pass every line they
print through it once more (``loopscope.cli.commands.emit``).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # the rows are the public models; pydantic is imported by what reads them, not by ``--help``
    from ..models import ActivityEvent, AIResponseEvent, ModelCall, SessionInfo
    from ..storage.results import CallRow, TurnRow  # plain rows (``loopscope turns``, ``calls``: no pydantic)

ELLIPSIS = "…"
GAP = "  "
MIN_WIDTH = 60
DEFAULT_WIDTH = 120


class Column(NamedTuple):  # not a dataclass: ``loopscope turns`` imports no ``dataclasses`` (nor ``inspect``)
    """How one column is laid out."""

    header: str
    align: str = "left"  # "left" or "right"
    max_width: int | None = None  # a cell longer than this is cut, even when there is room
    shrink: int = 0  # 0: keeps its width; else gives up width when the table is too wide, higher first
    min_width: int = 8
    cut_header: bool = False  # may shrink below its header's width (the header cut too): a query's columns


def terminal_width() -> int:
    """The terminal's width (``COLUMNS`` wins); 120 when output is not a terminal."""
    width = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    return max(width, MIN_WIDTH)


def char_width(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def text_width(text: str) -> int:
    """Columns ``text`` takes on a terminal (wide CJK characters count two)."""
    if text.isascii():
        return len(text)
    return sum(char_width(ch) for ch in text)


# -- text a terminal only shows ---------------------------------------------------------------

# What a terminal acts on instead of showing: C0 controls (ESC starts CSI, OSC and DCS
# sequences; BEL ends OSC; CR and BS overwrite), DEL, the C1 controls (0x9b is CSI and 0x9d
# OSC on a terminal that reads 8-bit bytes, or UTF-8 ones that honour C1), the bidi
# controls that reorder what follows (U+202E, "Trojan Source"), and the line and paragraph
# separators some terminals break on. Line feeds and tabs are kept by :func:`visible`
# (they lay text out, they do not rewrite it); a table cell folds them (:func:`one_line`).
_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[{_UNSAFE}]")
_NAMED = {"\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    return _NAMED.get(ch) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def visible(text: str) -> str:
    """``text`` as a terminal shows it without acting on it: every control character
    but line feeds and tabs written as a visible escape, as ``git`` and ``llm logs`` do
    (ESC as the four characters ``\\x1b``, CR as ``\\r``, C1 CSI as ``\\x9b``, a bidi
    override as ``\\u202e``). Printable text, and what this returns, come back unchanged:
    applying it twice is applying it once."""
    if text.isprintable() or not _CONTROL.search(text):
        return text
    return _CONTROL.sub(_escape, text)


def json_visible(text: str) -> str:
    """JSON text (``json.dumps``'s) a terminal only shows: the controls it leaves raw
    (DEL, C1, bidi controls, line separators; C0 it escapes itself) as ``\\u`` escapes,
    which JSON reads back to the same characters. Only JSON text may come in: the
    characters replaced can stand only inside its strings."""
    if text.isprintable() or not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def one_line(value: Any) -> str:
    """A cell's text: ``None`` empty, line breaks and tabs folded into single spaces,
    other control characters shown as escapes (:func:`visible`)."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    if "\n" in text or "\r" in text or "\t" in text:
        text = " ".join(text.split())
    return visible(text)


def truncate(text: str, width: int, ellipsis: str = ELLIPSIS) -> str:
    """``text`` cut to ``width`` columns, ending with ``ellipsis`` when something was cut."""
    if width <= 0:
        return ""
    if text_width(text) <= width:
        return text
    room = width - text_width(ellipsis)
    if room <= 0:
        return ellipsis[:width]
    out, used = [], 0
    for ch in text:
        w = char_width(ch)
        if used + w > room:
            break
        out.append(ch)
        used += w
    return "".join(out).rstrip() + ellipsis


def _pad(text: str, width: int, align: str) -> str:
    fill = " " * (width - text_width(text))
    return fill + text if align == "right" else text + fill


def render(
    columns: Sequence[Column],
    rows: Iterable[Sequence[Any]],
    *,
    width: int | None = None,
    ellipsis: str = ELLIPSIS,
) -> str:
    """The table as text: a header, a rule, one line per row, no trailing spaces."""
    cells = [[one_line(v) for v in row] for row in rows]
    columns = [c._replace(header=one_line(c.header)) for c in columns]  # a query's names may be stored text (PIVOT)
    widths = []
    for i, col in enumerate(columns):
        natural = max([text_width(col.header)] + [text_width(r[i]) for r in cells])
        widths.append(min(natural, max(col.max_width, text_width(col.header))) if col.max_width else natural)
    limit = width if width is not None else terminal_width()
    excess = sum(widths) + len(GAP) * (len(columns) - 1) - limit
    # columns give up width by priority (the free-text ones first), widest first within a priority
    for priority in sorted({c.shrink for c in columns if c.shrink}, reverse=True):
        group = [i for i, c in enumerate(columns) if c.shrink == priority]
        floor = {i: _floor(columns[i]) for i in group}
        while excess > 0:
            candidates = [i for i in group if widths[i] > floor[i]]
            if not candidates:
                break
            widest = max(candidates, key=lambda i: widths[i])
            runner_up = max([widths[i] for i in candidates if i != widest] + [floor[widest]])
            step = max(1, min(excess, widths[widest] - runner_up))
            widths[widest] -= step
            excess -= step
    lines = [
        GAP.join(_pad(truncate(c.header, w, ellipsis), w, c.align) for c, w in zip(columns, widths)).rstrip(),
        GAP.join("-" * w for w in widths).rstrip(),
    ]
    for row in cells:
        lines.append(
            GAP.join(_pad(truncate(text, w, ellipsis), w, c.align) for c, text, w in zip(columns, row, widths)).rstrip()
        )
    return "\n".join(lines)


def _floor(column: Column) -> int:
    """The narrowest a shrinking column gets: its ``min_width``, and its header's width
    unless the header may be cut."""
    return column.min_width if column.cut_header else max(column.min_width, text_width(column.header))


# -- cell formatting -------------------------------------------------------------------------


def compact_json(value: Any) -> str:
    """JSON on one line, readable: ``{"city": "Lisbon", "day": "tomorrow"}``."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    from .._json import to_jsonable  # here: the turns table needs none of it

    return json.dumps(to_jsonable(value), ensure_ascii=False, separators=(", ", ": "))


def clock(value: datetime | None) -> str:
    """Local time of day with milliseconds."""
    if value is None:
        return ""
    return value.astimezone().strftime("%H:%M:%S.%f")[:-3]


def stamp(value: datetime | None) -> str:
    """Local date and time to the second."""
    if value is None:
        return ""
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def millis(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:,.0f}"


def fine_millis(value: float | None) -> str:
    """Milliseconds with the decimals a short duration needs: ``0.07``, ``12.5``, ``1,204``."""
    if value is None:
        return ""
    return f"{value:.2f}" if value < 1 else f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def usd(value: float | None) -> str:
    """A cost in US dollars, to a precision that shows a single call's: ``$0.000412``,
    ``$0.0275``, ``$12.40``; empty for None (no price known)."""
    if value is None:
        return ""
    if value == 0:
        return "$0"
    if value < 0.001:
        return f"${value:.6f}"
    if value < 1:
        return f"${value:.4f}"
    return f"${value:,.2f}"


NO_PRICE = "-"
"""A COST cell without a price (the model has none): the column stays, never a guess."""


def cost(value: float | None) -> str:
    """A COST cell: :func:`usd`, or :data:`NO_PRICE` for None."""
    return NO_PRICE if value is None else usd(value)


def number(value: float) -> str:
    """A float as a reader wants it: up to 6 significant digits (``0.000204``,
    ``3.14159``, ``123457``), whole numbers of a million or more without an exponent;
    NaN and infinities as Python writes them."""
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if 1e6 <= abs(value) < 1e16:
        return f"{value:.0f}"
    return f"{value:.6g}"


# -- the tables ------------------------------------------------------------------------------

EVENT_COLUMNS = (
    Column("IDX", "right"),
    Column("TIME"),
    Column("TYPE"),
    Column("ROLE/TOOL", max_width=24, shrink=1, min_width=9),
    Column("OUTCOME"),
    Column("MS", "right"),
    Column("DETAIL", shrink=2, min_width=20),
)


def event_row(event: ActivityEvent, running: bool = False) -> list[str]:
    """One timeline line: who or which tool, how it went, and what it said or returned."""
    from ..models import TextContent, ToolCallContent

    content = event.content
    name = outcome = ms = detail = ""
    if isinstance(content, TextContent):
        name, detail = content.role, content.body
    elif isinstance(content, ToolCallContent):
        name = content.tool_name
        if event.type == "tool_call_start":
            outcome = "running" if running else ""
            detail = compact_json(content.arguments)
        else:
            outcome = content.outcome or content.status
            ms = millis(content.duration_ms)
            if content.error:
                detail = content.error
            elif content.result is not None:
                detail = "-> " + compact_json(content.result)
    elif event.type == "model_error" and isinstance(content, dict):  # a failed model call: its model and error
        name, outcome, ms = str(content.get("model") or "model"), "error", millis(content.get("duration_ms"))
        detail = ": ".join(str(p) for p in (content.get("error_type"), content.get("error")) if p)
    else:
        detail = compact_json(content)
    if event.status.value == "blocked":
        outcome = f"blocked{'/' + outcome if outcome else ''}"
    return [str(event.index), clock(event.created_at), event.type, name, outcome, ms, detail]


def events_table(
    events: Sequence[ActivityEvent],
    *,
    running: Iterable[str] = (),
    width: int | None = None,
    ellipsis: str = ELLIPSIS,
) -> str:
    """A session's timeline; ``running`` names the tool call ids still without an end (a
    call without an id by its span id)."""
    from ..models import ToolCallContent

    open_ids = set(running)
    rows = [
        event_row(
            e,
            isinstance(e.content, ToolCallContent)
            and e.type == "tool_call_start"
            and (e.content.tool_id or e.span_id or "") in open_ids,
        )
        for e in events
    ]
    return render(EVENT_COLUMNS, rows, width=width, ellipsis=ellipsis)


def turns_table(
    turns: Sequence[AIResponseEvent | TurnRow],
    *,
    show_session: bool = False,
    costs: Mapping[tuple[str | None, str | None], float | None] | None = None,
    width: int | None = None,
    ellipsis: str = ELLIPSIS,
) -> str:
    """Turn summaries: model calls, tool rounds (RoomKit's ``round_count``: the calls whose
    tool calls ran), tool calls, tokens, cost (``costs`` by session and correlation id, in
    USD; ``-`` without a price), latency, why the loop stopped, and its last text segment
    (the answer, usually), or the error that ended it. The headers are the same whatever
    the turns hold."""
    columns = [Column("ENDED")]
    if show_session:
        columns.append(Column("SESSION", max_width=20, shrink=1, min_width=10))
    columns += [
        Column("AGENT", max_width=16),
        Column("MODEL", max_width=24, shrink=1, min_width=10),
        Column("MODEL CALLS", "right"),  # every model call of the turn (a one-call turn has 1)
        Column("TOOL ROUNDS", "right"),  # RoomKit's round_count: model calls whose tool calls ran
        Column("TOOLS", "right"),
        Column("TOKENS IN/OUT", "right"),
        Column("COST", "right"),
        Column("MS", "right"),
        Column("END"),
        Column("FINAL SEGMENT", shrink=2, min_width=12),
    ]
    rows = []
    for t in turns:
        row = [clock(t.timestamp)[:8]]  # to the second: room for the fixed headers (the timeline has milliseconds)
        if show_session:
            row.append(t.session_id or "")
        row += [
            t.channel_id or "",
            t.model or "",
            str(t.model_call_count),
            str(t.round_count),
            str(t.tool_calls_count),
            in_out(t.usage),
            cost((costs or {}).get((t.session_id, t.correlation_id))),
            millis(t.latency_ms),
            _text(t.loop_end_reason),
            t.error or (t.segments[-1] if t.segments else t.response_content),
        ]
        rows.append(row)
    return render(columns, rows, width=width, ellipsis=ellipsis)


def _text(value: str | Enum | None) -> str:
    """A text or a text enum's value (a model's ``LoopEndReason``, a plain row's text)."""
    if value is None:
        return ""
    return str(value.value) if isinstance(value, Enum) else value


def in_out(usage: Mapping[str, int] | None) -> str:
    """A usage's ``input/output`` token cell (``1,633/144``); empty without usage."""
    if not usage:
        return ""
    return f"{usage.get('input_tokens', 0):,}/{usage.get('output_tokens', 0):,}"


def calls_table(
    calls: Sequence[ModelCall | CallRow],
    *,
    show_session: bool = False,
    width: int | None = None,
    ellipsis: str = ELLIPSIS,
) -> str:
    """Model calls: when, which model, how long (and to the first chunk of a stream), the
    tokens, the cost (``-``: no price known), how the call ended, and its error or finish
    reasons."""
    columns = [Column("STARTED")]
    if show_session:
        columns.append(Column("SESSION", max_width=20, shrink=1, min_width=10))
    columns += [
        Column("POS", "right"),
        Column("MODEL", max_width=32, shrink=1, min_width=10),
        Column("MS", "right"),
        Column("TTFC", "right"),
        Column("TOKENS IN/OUT", "right"),
        Column("COST", "right"),
        Column("OUTCOME"),
        Column("DETAIL", shrink=2, min_width=12),
    ]
    rows = []
    for c in calls:
        row = [clock(c.started_at)]
        if show_session:
            row.append(c.session_id)
        detail = c.error or c.refusal or ", ".join(c.finish_reasons)
        if c.error_type and c.error and not c.error.startswith(c.error_type):
            detail = f"{c.error_type}: {c.error}"
        row += [
            "" if c.position is None else str(c.position),
            c.model or "",
            fine_millis(c.duration_ms),
            fine_millis(c.time_to_first_chunk_ms),
            in_out(c.usage),
            cost(c.cost_usd),
            c.outcome or "",
            detail,
        ]
        rows.append(row)
    return render(columns, rows, width=width, ellipsis=ellipsis)


SESSION_COLUMNS = (
    Column("SESSION", shrink=1, min_width=12),
    Column("EVENTS", "right"),
    Column("TURNS", "right"),
    Column("COST", "right"),
    Column("FIRST"),
    Column("LAST"),
    Column("AGENTS", shrink=2, min_width=10),
)


def sessions_table(
    sessions: Sequence[SessionInfo],
    *,
    costs: Mapping[str, float | None] | None = None,
    width: int | None = None,
    ellipsis: str = ELLIPSIS,
) -> str:
    """Sessions, as :meth:`Store.list_sessions` orders them (most recently active first),
    with their cost (``costs``: USD by session id; ``-`` without a price). The session id
    is cut only when the terminal is too narrow, after the agents."""
    rows = []
    for s in sessions:
        rows.append([
            s.session_id, str(s.event_count), str(s.turn_count), cost((costs or {}).get(s.session_id)),
            stamp(s.first_at), stamp(s.last_at), ", ".join(s.agents),
        ])
    return render(SESSION_COLUMNS, rows, width=width, ellipsis=ellipsis)


def sql_cell(value: Any) -> str:
    """A query's value as text: NULL, timestamps in ISO form, floats to 6 significant
    digits (:func:`number`; ``--json`` keeps every digit), lists and structs as JSON."""
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return number(value)
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (dict, list, tuple)):
        return compact_json(value)
    return str(value)


def sql_table(
    names: Sequence[str], rows: Sequence[Sequence[Any]], *, width: int | None = None, ellipsis: str = ELLIPSIS
) -> str:
    """Any query's result; numbers align right. Nothing is cut while the table fits the
    terminal; when it does not, the widest columns give up width first (headers too, a
    column's data is worth more than its name), the first column (the row's name, mostly)
    last."""
    from decimal import Decimal  # here: only a query's table needs it

    columns = []
    for i, name in enumerate(names):
        numeric = bool(rows) and all(
            isinstance(r[i], (int, float, Decimal)) and not isinstance(r[i], bool) for r in rows if r[i] is not None
        )
        columns.append(
            Column(name, "right" if numeric else "left", shrink=1 if i == 0 else 2, min_width=6, cut_header=i > 0)
        )
    return render(columns, [[sql_cell(v) for v in r] for r in rows], width=width, ellipsis=ellipsis)


# -- a stream of events, one line each (``loopscope tail``) ---------------------------------------

_STREAM = (
    ("TIME", 12, "left"),
    ("SESSION", 14, "left"),
    ("IDX", 6, "right"),
    ("TYPE", 15, "left"),
    ("ROLE/TOOL", 18, "left"),
    ("OUTCOME", 9, "left"),
    ("MS", 8, "right"),
)


def _stream_cells(cells: Sequence[str], show_session: bool, width: int | None, ellipsis: str) -> str:
    layout = [c for c in _STREAM if show_session or c[0] != "SESSION"]
    fixed = sum(w for _, w, _ in layout) + len(GAP) * len(layout)
    room = max(20, (width if width is not None else terminal_width()) - fixed)
    parts = [_pad(truncate(one_line(text), w, ellipsis), w, align) for text, (_, w, align) in zip(cells, layout)]
    parts.append(truncate(one_line(cells[-1]), room, ellipsis))
    return GAP.join(parts).rstrip()


def stream_header(*, show_session: bool, width: int | None = None, ellipsis: str = ELLIPSIS) -> str:
    """The header line of :func:`stream_line`'s columns."""
    names = [name for name, _, _ in _STREAM if show_session or name != "SESSION"]
    return _stream_cells([*names, "DETAIL"], show_session, width, ellipsis)


def stream_line(event: ActivityEvent, *, show_session: bool, width: int | None = None, ellipsis: str = ELLIPSIS) -> str:
    """One event on one line of fixed-width columns, so that lines printed as they come
    stay aligned: time, session (when several are shown), index, type, role or tool,
    outcome, duration and the text, arguments or result."""
    index, time_, kind, name, outcome, ms, detail = event_row(event)
    cells = [time_, *([event.session_id] if show_session else []), index, kind, name, outcome, ms, detail]
    return _stream_cells(cells, show_session, width, ellipsis)
