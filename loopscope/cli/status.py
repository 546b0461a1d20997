"""``loopscope status``: the store at a glance, and what had to be dropped or failed.

What a store holds says little about what it misses. Each writer keeps its counters in
the store (read by the query API's ``status``; on DuckDB :mod:`loopscope.storage.duckdb.health`):
rows written, events dropped because its queue was full or because the file stayed unwritable too long, failed write attempts
with the last error, and what the OTLP exporter of the same process dropped. What a
writer could not say in the store (it was held by another process or full when the
writer stopped, or a write never ended) is counted in the file beside it
(:func:`health.beside_path`); this command adds both. It reads them from any process,
while agents keep writing, and writes nothing.

Start notices (OTLP log records that tell ``loopscope collect`` of a turn or tool call as it
starts, loopscope/export/notices.py) are counted by each writer's process too: sent, refused
by an endpoint that takes no logs (then off for good, with the reason), failed. They lose
nothing (the spans carry it all), so they are notes, not problems.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from typing import Any

from ..dashboards import tables
from ..dashboards.tables import Column
from ..storage.results import LOSS_COUNTERS
from . import _args
from .commands import db_path, emit, emit_json


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    status = sub.add_parser(
        "status",
        parents=[common],
        help="the store (size, schema, counts, last event) and what writers dropped or failed to write",
        description="The store file (path, size, schema version), what it holds (sessions, events, turns, "
        "tool calls, model calls, the last event's time), and every process that wrote to it: where its writer ran (a "
        "thread of the process, or a writer process of its own: 'process of' the application's pid), when it started and was "
        "last seen, whether it still runs, how many events it wrote, dropped (its queue was full, or the "
        "file stayed unwritable too long) and failed to write, its last error, and what its OTLP exporter "
        "dropped, and its start notices (sent; refused, then off for good, by an endpoint that takes no OTLP "
        "logs; failed). A store nothing went missing from says so.",
    )
    _args.add_json(status, "the status")
    status.set_defaults(handler=status_command)


def read_status(path: str, wait: float = 10.0) -> dict[str, Any]:
    """The status of the store at ``path`` as plain values (what ``--json`` prints)."""
    from ..storage.queries import open_reader

    found = open_reader(path, lock_timeout=wait).status()
    writers = _with_beside(found.writers, found.beside)
    for writer in writers:
        for key in ("boot_id", "pid_namespace", "process_start"):
            writer.pop(key, None)
    totals = {name: sum(int(w[name]) for w in writers) for name in LOSS_COUNTERS}
    # every loss in the store's own rows: events (rows of `events`) and turns (rows of `turns`)
    totals["events_lost"] = totals["dropped_queue_full"] + totals["dropped_unwritable"]
    totals["turns_lost"] = totals["turns_dropped_queue_full"] + totals["turns_dropped_unwritable"]
    notices = {kind: sum(int(w.get(f"notices_{kind}") or 0) for w in writers) for kind in ("sent", "refused", "failed")}
    return {
        "path": found.path,
        "size_bytes": found.size_bytes,
        "schema_version": found.schema_version,
        "sessions": found.sessions,
        "events": found.events,
        "turns": found.turns,
        "tool_calls": found.tool_calls,
        "model_calls": found.model_calls,
        "last_event_at": found.last_event_at,
        "writers": writers,
        "totals": totals,
        "unserved_cut": found.unserved_cut,
        "notices": notices,
        "problems": problems(writers) + _cut_problem(found.unserved_cut),
        "notes": notes(writers),
    }


def _with_beside(writers: list[dict[str, Any]], beside: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The store's writer rows with what the file beside the store adds: to the row of
    the same writer, or as a row of its own for a writer the store has no row of."""
    by_id = {w["writer_id"]: w for w in writers}
    stored = {w["writer_id"]: dict(w) for w in writers}  # the rows as the store has them (children are set against these)
    for writer_id, entry in beside.items():
        row = by_id.get(writer_id)
        if row is None:
            row = {
                "writer_id": writer_id, "host": entry.get("host"), "pid": entry.get("pid"), "started_at": None,
                "last_seen": _when(entry.get("at")), "alive": "stopped", "events_written": 0, "turns_written": 0,
                "excluded": 0, "queue_size": entry.get("queue_size") or 0, "last_error": None, "last_error_at": None,
                "stopped_at": _when(entry.get("at")), **{name: 0 for name in LOSS_COUNTERS},
            }
            writers.append(row)
            by_id[writer_id] = row
        for name in LOSS_COUNTERS:
            value = entry.get(name)
            row[name] = int(row[name] or 0) + (int(value) if isinstance(value, int) else 0)
        if entry.get("last_error"):
            row["last_error"], row["last_error_at"] = entry["last_error"], _when(entry.get("last_error_at"))
        row["beside"] = entry.get("note") or "counted beside the store"
        if row["alive"] == "gone":
            row["alive"] = "stopped"  # it counted this as it closed the store
    for writer_id, entry in beside.items():
        children = entry.get("children")
        if isinstance(children, list):
            _children_lost(by_id[writer_id], entry, [c for c in children if isinstance(c, dict)], writers, stored)
    return writers


def _children_lost(app: dict[str, Any], entry: dict[str, Any], children: list[dict[str, Any]],
                   writers: list[dict[str, Any]], stored: dict[str, dict[str, Any]]) -> None:
    """Add to the application's row ``app`` what its writer processes that ended unasked did
    not write: what each was sent (rows, as its mapping makes them of the spans) less what its
    row in the store says it wrote or counted as lost itself (the row is updated in every
    batch's transaction, so what a child wrote before it was killed is never counted lost)."""
    for child in children:
        row = next((w for w in writers if child.get("writer_id") and w["writer_id"] == child["writer_id"]), None)
        if row is None:  # a child killed before it said its id: its row by pid, for this application
            row = next((w for w in writers if w.get("pid") == child.get("pid") and w.get("app_pid") == entry.get("pid")
                        and w.get("host") == entry.get("host")), None)
        base = stored.get(row["writer_id"]) if row is not None else None
        held = row if row is not None else {}
        for sent, forwarded, written, counted, lost in (
            ("sent_events", "forwarded_events", "events_written", ("dropped_queue_full", "dropped_unwritable"), "dropped_unwritable"),
            ("sent_turns", "forwarded_turns", "turns_written", ("turns_dropped_queue_full", "turns_dropped_unwritable"),
             "turns_dropped_unwritable"),
        ):
            accounted = int((base or held).get(written) or 0) + sum(int(held.get(name) or 0) for name in counted)
            missing = int(child.get(sent) or 0) + int(child.get(forwarded) or 0) - accounted
            if missing > 0:
                app[lost] = int(app[lost] or 0) + missing
        if row is not None:
            row["ended"] = f"ended unasked; counted by pid {entry.get('pid')}"


def _when(seconds: Any) -> datetime | None:
    return datetime.fromtimestamp(seconds, timezone.utc) if isinstance(seconds, (int, float)) else None


def _cut_problem(cut: int) -> list[str]:
    if not cut:
        return []
    return [(
        f"{cut:,} tool calls ended unserved because more stitched turns waited for tool results than loopscope keeps "
        "open (loopscope.configure(stitch_max_open=...)); a program that never answers its tool calls ends them so"
    )]


def _rows(events: int, turns: int) -> str:
    """A loss in the store's rows: ``412 events and 37 turns``."""
    return f"{events:,} event{'' if events == 1 else 's'} and {turns:,} turn{'' if turns == 1 else 's'}"


def problems(writers: list[dict[str, Any]]) -> list[str]:
    """One line per kind of loss, saying what to do about it; empty when nothing was lost.
    Losses are counted in the store's rows: events (rows of ``events``) and turns (rows of
    ``turns``, one per turn), as the writer's mapping makes them of the spans it lost."""
    lines = []
    for w in writers:
        who = f"pid {w['pid']} on {w['host']}"
        queue_full = (int(w["dropped_queue_full"] or 0), int(w.get("turns_dropped_queue_full") or 0))
        unwritten = (int(w["dropped_unwritable"] or 0), int(w.get("turns_dropped_unwritable") or 0))
        if w.get("beside") == _STORE_OFF:
            when = f" at {tables.stamp(w['last_error_at'])}" if w["last_error_at"] else ""
            lines.append(f"{_STORE_OFF} ({who}){when}: {w['last_error'] or 'unknown error'}")
        if any(queue_full):
            lines.append(
                f"{_rows(*queue_full)} dropped: queue full ({who}, queue_size {w['queue_size']:,}); "
                "raise queue_size or queue_bytes (loopscope.configure(queue_size=..., queue_bytes=...)) "
                "or record less per second"
            )
        if any(unwritten):
            lines.append(
                f"{_rows(*unwritten)} lost: not written to the store ({who}; last error: "
                f"{w['last_error'] or 'unknown'}); keep readers that hold the file short, check the disk, "
                "and let the process end normally"
            )
        if w["failed_writes"]:
            when = f" at {tables.stamp(w['last_error_at'])}" if w["last_error_at"] else ""
            lines.append(
                f"{w['failed_writes']:,} write attempts failed ({who}); last{when}: {w['last_error'] or 'unknown error'}"
                + _fate(w)
            )
        if w.get("beside") and w.get("beside") != _STORE_OFF and (any(queue_full) or any(unwritten) or w["failed_writes"]):
            lines.append(f"  (pid {w['pid']}: counted in the file beside the store, the store could not take it)")
        if w["alive"] == "gone" and not w.get("beside") and not w.get("ended"):
            lines.append(
                f"pid {w['pid']} on {w['host']} ended without closing the store and left no record of what it had not "
                f"written ({_rows(int(w['events_written'] or 0), int(w['turns_written'] or 0))} written): killed, or "
                "its last record found no room; what it held then is lost and not counted"
            )
        refused = int(w.get("refused_requests") or 0)
        if refused:
            spans = int(w.get("refused_spans") or 0)
            counted = f"{spans:,} spans in those over --max-spans; " if spans else ""
            lines.append(
                f"{refused:,} traces request{'' if refused == 1 else 's'} refused by loopscope collect ({who}; {counted}"
                "their events and turns are not known: a refused request is not read; last: "
                f"{w.get('last_refused') or 'unknown'}); the senders were told (HTTP 4xx, gRPC INVALID_ARGUMENT) and "
                "do not send them again: send smaller batches, or raise --max-spans / --max-bytes"
            )
        if w["otlp_dropped"]:
            lines.append(f"{w['otlp_dropped']:,} spans dropped by the OTLP exporter: its queue was full ({who})")
        if w["otlp_failed"]:
            lines.append(f"{w['otlp_failed']:,} spans the OTLP exporter failed to send ({who}); check the endpoint")
    return lines


def notes(writers: list[dict[str, Any]]) -> list[str]:
    """One line per writer whose start notices were turned off for good or failed: what
    a collector did not hear of as it started (it still stores all of it when it ends)."""
    lines = []
    for w in writers:
        who = f"pid {w['pid']} on {w['host']}"
        refused, failed, off = int(w.get("notices_refused") or 0), int(w.get("notices_failed") or 0), w.get("notices_off")
        if off or refused:
            lines.append(
                f"start notices off for good ({who}, {int(w.get('notices_sent') or 0):,} sent, {refused:,} refused): "
                f"the endpoint takes no OTLP logs ({off or 'refused'}); only `loopscope collect` reads them, "
                "the spans were sent as usual"
            )
        if failed:
            lines.append(
                f"{failed:,} start notices not sent ({who}): the endpoint did not answer or failed; "
                "a collector writes those turns' and tool calls' start rows when their spans end"
            )
    return lines


_STORE_OFF = "recording to the store was off"


def _fate(w: dict[str, Any]) -> str:
    """What became of the events of a writer whose writes failed, as far as is known."""
    if w["dropped_unwritable"] or w.get("turns_dropped_unwritable"):
        return ""  # the line above counts them
    if w["alive"] == "stopped":
        return " (the events were kept and written later)"
    if w["alive"] == "yes":
        return " (the events are kept in its memory and retried)"
    return ""  # the line on its end says it


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{n} B"


_WRITER_COLUMNS = [
    Column("host", max_width=24, shrink=1), Column("pid", "right"), Column("writer"), Column("started"), Column("last seen"),
    Column("alive"), Column("written", "right"), Column("dropped", "right"), Column("failed writes", "right"),
    Column("otlp dropped", "right"), Column("notices", "right"), Column("last error", shrink=2),
]


def _writer_cell(w: dict[str, Any]) -> str:
    """Where the writer ran: ``thread`` (in the pid's process), ``process of 1234`` (a writer
    process, the row's pid, for the application 1234); empty for a row of an older loopscope."""
    mode = w.get("writer_mode")
    if mode == "process" and w.get("app_pid") is not None:
        return f"process of {w['app_pid']}"
    return mode or ""


def _lost_cell(w: dict[str, Any]) -> str:
    """Events and turns dropped or not written: ``412`` (events only), ``412 + 37 turns``."""
    events = int(w["dropped_queue_full"] or 0) + int(w["dropped_unwritable"] or 0)
    turns = int(w.get("turns_dropped_queue_full") or 0) + int(w.get("turns_dropped_unwritable") or 0)
    return f"{events:,}" + (f" + {turns:,} turns" if turns else "")


def _notice_cell(w: dict[str, Any]) -> str:
    """Start notices sent, and refused or failed when any: ``12``, ``3 + 9 refused``."""
    sent, refused, failed = (int(w.get(f"notices_{kind}") or 0) for kind in ("sent", "refused", "failed"))
    cell = f"{sent:,}"
    if refused:
        cell += f" + {refused:,} refused"
    if failed:
        cell += f" + {failed:,} failed"
    return cell


def status_command(args: argparse.Namespace) -> int:
    path = db_path(args)
    status = read_status(path, getattr(args, "wait", 10.0))
    if args.json:
        from .._json import to_jsonable

        emit_json(to_jsonable(status))
        return 0
    emit(f"store       {status['path']}")
    emit(f"size        {_size(status['size_bytes'])} (schema {status['schema_version']})")
    emit(
        f"holds       {status['sessions']:,} sessions, {status['events']:,} events, {status['turns']:,} turns, "
        f"{status['tool_calls']:,} tool calls, {status['model_calls']:,} model calls"
    )
    last = status["last_event_at"]
    if last is not None:
        now = datetime.now(timezone.utc)
        seconds = max(0, int((now - last).total_seconds()))
        emit(f"last event  {tables.stamp(last)} ({_ago(seconds)})")
    else:
        emit("last event  none yet")
    writers = status["writers"]
    if writers:
        emit()
        emit(f"writers ({len(writers)})")
        rows = [
            [
                w["host"], w["pid"], _writer_cell(w), tables.stamp(w["started_at"]), tables.stamp(w["last_seen"]), w["alive"],
                f"{w['events_written']:,}", _lost_cell(w),
                f"{w['failed_writes']:,}", f"{w['otlp_dropped'] + w['otlp_failed']:,}", _notice_cell(w),
                w["last_error"] or "",
            ]
            for w in writers
        ]
        emit(tables.render(_WRITER_COLUMNS, rows))
    emit()
    for line in status["problems"]:
        emit(line)
    if not status["problems"]:
        emit("nothing was dropped and no write failed" if writers else "no writer left counters here (written before loopscope kept them)")
    for line in status["notes"]:
        emit(line)
    return 0


def _ago(seconds: int) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"
