"""The query API (:class:`~loopscope.storage.queries.Reader`) on ClickHouse: the named queries the
CLI and the web dashboard make, as ClickHouse SQL over loopscope's derived tables (:mod:`.ddl`),
run by a :class:`~.runner.Runner` (chDB in process, or a server over HTTP).

Every read counts a row the Collector resent once (``LIMIT 1 BY`` its id, ``FINAL`` or distinct
ids), and numbers a session's timeline at read time (``row_number()`` over ``(at, seq, id)``, as
``ddl.TIMELINE`` does), blocked rows included before a filter leaves them out: the same indices
the DuckDB store's writer gives. Times travel as Unix microseconds and become aware UTC datetimes
here. What ClickHouse has no data for is answered empty and said so (docs/clickhouse.md):
no cost (``cost_usd`` None everywhere), no request ``parameters``, no writers' counters, no AG-UI
imports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import StoreError
from ..matching import needle_of
from ..policy import EventFilter, TurnFilter
from ..results import (
    TOOL_OUTCOMES,
    CallRow,
    Record,
    ScoreTarget,
    SearchHit,
    SessionLookup,
    Stats,
    StoreStatus,
    ToolCallRow,
    TrajectoryLookup,
    TurnRow,
)
from . import pages, parquet, scores, trajectory
from . import search as _search  # (a method is named search)
from .runner import Runner, connect, parse, readonly
from .tables import (
    CALL_SELECT,
    CALLS,
    DECLARED,
    EVENT_NAMES,
    EVENT_SELECT,
    IN_IDS,
    MANY_ROWS,
    SERVER_TOOLS,
    SESSION_ROWS,
    TOOL_ORDER,
    TOOL_STATS,
    TURN_NAMES,
    TURN_SELECT,
    TURNS,
    at,
    event_filter_sql,
    ids_param,
    json_of,
    us_of,
    usage_of,
    when,
    where_of,
)

if TYPE_CHECKING:
    from ...models import ActivityEvent, AIResponseEvent, ModelCall, SessionInfo
    from ..queries import ExportProgress, Follow


_TABLES = ("loopscope_events", "loopscope_turns", "loopscope_model_calls", "loopscope_tool_calls", "loopscope_sessions")
_HAS_TABLES = ("SELECT count() FROM system.tables WHERE database = currentDatabase() AND name IN ("
               + ", ".join(f"'{t}'" for t in _TABLES) + ")")


class ClickHouseReader:
    """The named queries on the ClickHouse store ``url`` names (:mod:`.runner`). Opens nothing
    until the first query; the connection is kept until :meth:`close` (a chDB directory is
    this process's until then)."""

    engine = "clickhouse"

    def __init__(self, url: str, *, lock_timeout: float = 10.0, keep_open: bool = False) -> None:
        self.target = parse(url)
        self.path = self.target.url
        self.lock_timeout = lock_timeout
        self.keep_open = keep_open
        self._runner: Runner | None = None

    @property
    def runner(self) -> Runner:
        """The connection, made at the first query; a store without loopscope's tables (not
        prepared: no ``loopscope collect`` or ``prepare`` ran on it) is a clear :class:`StoreError`."""
        if self._runner is None:
            runner = connect(self.path, timeout=self.lock_timeout)
            try:
                [(found,)] = runner.rows(_HAS_TABLES)
            except Exception:
                runner.close()
                raise
            if int(found) < len(_TABLES):
                runner.close()
                raise StoreError(f"the ClickHouse store {self.path} holds no loopscope data yet (its tables are made by "
                                 "`loopscope init --db <url>` before the Collectors write, or by `loopscope collect --db <url>`)")
            self._runner = runner
        return self._runner

    def close(self) -> None:
        """Lets go of the connection (chDB: of the directory, when no other reader here holds it)."""
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return self.runner.rows(sql, params)

    def records(self, sql: str, params: Mapping[str, Any] | None = None) -> list[Record]:
        names, rows = self.runner.query(sql, params)
        return [dict(zip(names, row)) for row in rows]

    def _events(self, rows: Sequence[Sequence[Any]]) -> list[ActivityEvent]:
        from ...models import ActivityEvent, EventSource, EventStatus, TextContent, ToolCallContent

        out = []
        for row in rows:
            data = dict(zip(EVENT_NAMES, row))
            content = json_of(data["content"]) or {}
            kind = content.get("type") if isinstance(content, dict) else None
            if kind == "tool_call":
                content = ToolCallContent.model_validate(content)
            elif kind == "text":
                content = TextContent.model_validate(content)
            elif not isinstance(content, dict):
                content = {"value": content}
            out.append(ActivityEvent(
                id=data["id"], session_id=data["session_id"], index=int(data["idx"]), type=data["type"],
                created_at=when(data["created_us"]), correlation_id=data["correlation_id"],
                source=EventSource(channel_id=data["source_channel_id"], provider=data["source_provider"],
                                   framework=data["source_framework"]),
                status=EventStatus(data["status"]), content=content, trace_id=data["trace_id"], span_id=data["span_id"],
            ))
        return out

    # -- sessions ------------------------------------------------------------------------

    def session(self, requested: str | None) -> SessionLookup:
        if requested is None:
            rows = self.rows("SELECT session_id FROM loopscope_sessions GROUP BY session_id "
                             "ORDER BY max(last_at) DESC, session_id LIMIT 1")
            return SessionLookup(str(rows[0][0]) if rows else None)
        rows = self.rows(
            "SELECT DISTINCT session_id FROM loopscope_sessions WHERE startsWith(session_id, {p:String}) "
            "ORDER BY session_id LIMIT 7", {"p": requested})
        matches = [str(r[0]) for r in rows]
        if requested in matches:
            return SessionLookup(requested)
        if len(matches) == 1:
            return SessionLookup(matches[0])
        return SessionLookup(None, tuple(matches[:6]))

    def _session_ids(self, limit: int | None, offset: int = 0, search: str | None = None) -> list[str]:
        """The ids of a page of sessions, most recently active first; ``search``: those whose
        id, agent or model, or whose content (:meth:`search`'s), holds it."""
        params: dict[str, Any] = {}
        where = ""
        if search:
            params["q"] = params["needle"] = search.strip()  # and the sessions whose content holds it (issue 35)
            where = ("WHERE positionCaseInsensitiveUTF8(session_id, {q:String}) > 0 OR session_id IN ("
                     "SELECT session_id FROM loopscope_turns WHERE positionCaseInsensitiveUTF8(coalesce(channel_id, ''), "
                     "{q:String}) > 0 OR positionCaseInsensitiveUTF8(coalesce(model, ''), {q:String}) > 0) "
                     f"OR session_id IN (SELECT session_id FROM ({_search.matches_sql()}))")
        sql = f"SELECT session_id FROM loopscope_sessions {where} GROUP BY session_id ORDER BY max(last_at) DESC, session_id"
        if limit is not None:
            sql += " LIMIT {limit:UInt64} OFFSET {offset:UInt64}"
            params |= {"limit": int(limit), "offset": int(offset)}
        return [str(r[0]) for r in self.rows(sql, params)]

    def session_count(self, search: str | None = None) -> int:
        return len(self._session_ids(None, search=search))

    def session_infos(self, session_ids: Sequence[str]) -> dict[str, Record]:
        """Per session: ``event_count``, ``first_us`` / ``last_us`` (its first and last timeline
        rows), ``turns``, ``agents`` (sorted, of its turns)."""
        if not session_ids:
            return {}
        ids = {"ids": ids_param(session_ids)}
        out: dict[str, Record] = {s: {"event_count": 0, "first_us": None, "last_us": None, "turns": 0, "agents": []}
                                  for s in session_ids}
        for r in self.rows(
            "SELECT session_id, uniqExact(id), toUnixTimestamp64Micro(min(created_at)), toUnixTimestamp64Micro(max(created_at)) "
            f"FROM loopscope_events WHERE session_id IN {IN_IDS % 'ids'} GROUP BY session_id", ids):
            out[str(r[0])].update(event_count=int(r[1]), first_us=r[2], last_us=r[3])
        for r in self.rows(
            "SELECT session_id, uniqExact(correlation_id, span_id), arraySort(groupUniqArrayIf(channel_id, isNotNull(channel_id))) "
            f"FROM loopscope_turns WHERE session_id IN {IN_IDS % 'ids'} GROUP BY session_id", ids):
            out[str(r[0])].update(turns=int(r[1]), agents=[str(x) for x in r[2] if x])
        return out

    def sessions(self, limit: int | None = None, *, search: str | None = None) -> list[SessionInfo]:
        from ...models import SessionInfo

        picked = self._session_ids(limit, search=search)
        infos = self.session_infos(picked)
        return [SessionInfo(session_id=s, event_count=infos[s]["event_count"], turn_count=infos[s]["turns"],
                            first_at=at(infos[s]["first_us"]), last_at=at(infos[s]["last_us"]), agents=infos[s]["agents"])
                for s in picked]

    def session_costs(self, session_ids: Sequence[str]) -> dict[str, float | None]:
        return {s: None for s in session_ids}  # no prices on ClickHouse (docs/clickhouse.md)

    # -- the timeline ----------------------------------------------------------------------

    def timeline_rows(
        self, session_id: str, limit: int | None = None, *, offset: int = 0, after_index: int | None = None,
        before_index: int | None = None, event_filter: EventFilter | None = None, newest_first: bool = False,
        select: str = EVENT_SELECT,
    ) -> list[tuple[Any, ...]]:
        """A page of one session's numbered rows (``select``), ascending by index, paged as
        :meth:`timeline`."""
        if after_index is not None and before_index is not None:
            raise ValueError("after_index and before_index cannot be used together")
        if offset < 0 or (limit is not None and limit < 0):
            raise ValueError("offset and limit must not be negative")
        params: dict[str, Any] = {"session_id": session_id}
        clauses = event_filter_sql(event_filter or EventFilter(), params)
        descending = newest_first
        if after_index is not None:
            clauses.append("idx > {after:Int64}")
            params["after"], offset, descending = int(after_index), 0, False
        elif before_index is not None:
            clauses.append("idx < {before:Int64}")
            params["before"], offset, descending = int(before_index), 0, True
        sql = f"SELECT {select} FROM ({SESSION_ROWS}) {where_of(clauses)} ORDER BY idx {'DESC' if descending else 'ASC'}"
        if limit is not None:
            sql += " LIMIT {limit:UInt64}"
            params["limit"] = int(limit)
        if offset:
            sql += " OFFSET {offset:UInt64}"
            params["offset"] = int(offset)
        rows = self.rows(sql, params)
        if descending:
            rows.reverse()
        return rows

    def timeline(
        self, session_id: str, limit: int | None = None, *, after_index: int | None = None,
        before_index: int | None = None, event_filter: EventFilter | None = None, newest_first: bool = False,
    ) -> list[ActivityEvent]:
        return self._events(self.timeline_rows(session_id, limit, after_index=after_index, before_index=before_index,
                                               event_filter=event_filter, newest_first=newest_first))

    def event_count(self, session_id: str, event_filter: EventFilter | None = None) -> int:
        params: dict[str, Any] = {"session_id": session_id}
        clauses = [] if event_filter is None else event_filter_sql(event_filter, params)
        sql = "SELECT uniqExact(id) FROM loopscope_events WHERE session_id = {session_id:String}"
        if clauses:
            sql += " AND " + " AND ".join(clauses)
        return int(self.rows(sql, params)[0][0])

    def recent_events(self, limit: int = 10, *, event_filter: EventFilter | None = None) -> list[ActivityEvent]:
        if limit < 0:
            raise ValueError("limit must not be negative")
        params: dict[str, Any] = {"limit": int(limit)}
        where = where_of(event_filter_sql(event_filter or EventFilter(), params))
        order = "ORDER BY created_at DESC, session_id DESC, at DESC, seq DESC, id DESC"
        picked = f"(SELECT DISTINCT session_id FROM (SELECT session_id FROM loopscope_events {where} {order} LIMIT {{limit:UInt64}}))"
        sql = (f"SELECT {EVENT_SELECT} FROM ({MANY_ROWS.format(sessions=picked)}) {where} "
               "ORDER BY created_at DESC, session_id DESC, idx DESC LIMIT {limit:UInt64}")
        rows = self.rows(sql, params)
        rows.reverse()
        return self._events(rows)

    def follow(self, session_id: str | None, *, event_filter: EventFilter | None = None) -> Follow:
        return _Follower(self, session_id, event_filter)

    def ready(self) -> bool:
        try:
            self.runner  # noqa: B018 (connects, and checks the tables)
        except Exception:
            return False
        return True

    # -- turns and model calls --------------------------------------------------------------

    def turn_rows(
        self, session_id: str | None = None, limit: int | None = 50, *, newest_first: bool = False,
        turn_filter: TurnFilter | None = None,
    ) -> list[TurnRow]:
        params: dict[str, Any] = {}
        clauses: list[str] = []
        if session_id is not None:
            clauses.append("session_id = {session_id:String}")
            params["session_id"] = session_id
        if turn_filter is not None:
            clauses += _turn_filter_sql(turn_filter, params)
        sql = (f"SELECT {TURN_SELECT} FROM {TURNS.format(where=where_of(clauses))} "
               f"ORDER BY timestamp {'DESC' if newest_first else 'ASC'}, correlation_id")
        if limit is not None:
            sql += " LIMIT {limit:UInt64}"
            params["limit"] = int(limit)
        rows = [dict(zip(TURN_NAMES, r)) for r in self.rows(sql, params)]
        if newest_first:
            rows.reverse()
        uncounted = [r for r in rows if r["model_call_count"] is None]
        if uncounted:  # a turn that did not count its calls: its model_calls rows (the DuckDB store's rule)
            counts = {(r[0], r[1]): int(r[2]) for r in self.rows(
                f"SELECT session_id, correlation_id, uniqExact(span_id) FROM loopscope_model_calls WHERE correlation_id IN "
                f"{IN_IDS % 'ids'} GROUP BY session_id, correlation_id", {"ids": ids_param([r['correlation_id'] for r in uncounted])})}
            for r in uncounted:
                r["model_call_count"] = counts.get((r["session_id"], r["correlation_id"]), 0)
        return [TurnRow(
            channel_id=r["channel_id"], session_id=r["session_id"], correlation_id=r["correlation_id"],
            parent_correlation_id=r["parent_correlation_id"], response_content=r["response_content"] or "",
            segments=json_of(r["segments"]) or [], tool_calls_count=int(r["tool_calls_count"] or 0),
            round_count=int(r["round_count"] or 0), usage=usage_of(r), thinking=r["thinking"] or "",
            loop_end_reason=r["loop_end_reason"], latency_ms=float(r["latency_ms"] or 0), streaming=bool(r["streaming"]),
            timestamp=at(r["timestamp_us"]), declared_tools=json_of(r["declared_tools"]) or [], model=r["model"],
            provider=r["provider"], error=r["error"], trace_id=r["trace_id"], span_id=r["span_id"],
            model_call_count=int(r["model_call_count"] or 0),
        ) for r in rows]

    def turns(
        self, session_id: str | None = None, limit: int | None = 50, *, newest_first: bool = False,
        turn_filter: TurnFilter | None = None,
    ) -> list[AIResponseEvent]:
        from ...models import AIResponseEvent

        return [AIResponseEvent.model_validate({k: v for k, v in r._asdict().items() if v is not None})
                for r in self.turn_rows(session_id, limit, newest_first=newest_first, turn_filter=turn_filter)]

    def turn_costs(self, turn_ids: Sequence[str | None]) -> dict[tuple[str | None, str | None], float | None]:
        ids = sorted({t for t in turn_ids if t})
        if not ids:
            return {}
        rows = self.rows(f"SELECT DISTINCT session_id, correlation_id FROM loopscope_turns WHERE correlation_id IN {IN_IDS % 'ids'}",
                         {"ids": ids_param(ids)})
        return {(r[0], r[1]): None for r in rows}  # no prices on ClickHouse

    def calls(
        self, session_id: str | None = None, *, model: str | None = None, provider: str | None = None,
        failed: bool = False, slowest: bool = False, limit: int | None = 50,
        since: datetime | None = None, search: str | None = None,
    ) -> list[CallRow]:
        if limit is not None and limit < 0:
            raise ValueError("limit must not be negative")
        clauses: list[str] = []
        params: dict[str, Any] = {}
        for column, value in (("session_id", session_id), ("provider", provider)):
            if value is not None:
                clauses.append(f"{column} = {{{column}:String}}")
                params[column] = value
        if model is not None:
            clauses.append("(request_model = {model:String} OR response_model = {model:String})")
            params["model"] = model
        if failed:
            clauses.append("(outcome = 'error' OR error_type IS NOT NULL)")
        if since is not None:
            clauses.append("started_at >= fromUnixTimestamp64Micro({since:Int64}, 'UTC')")
            params["since"] = us_of(since)
        if search:
            clauses.append(_search.MATCH.format(text=_search.CALL_TEXT))
            params["needle"] = needle_of(search)
        order = ("duration_ms DESC, started_us DESC, span_id" if slowest
                 else "started_us DESC, position DESC, span_id DESC")
        sql = f"SELECT {CALL_SELECT} FROM {CALLS.format(where=where_of(clauses))} ORDER BY {order}"
        if limit is not None:
            sql += " LIMIT {limit:UInt64}"
            params["limit"] = int(limit)
        rows = self.records(sql, params)
        if not slowest:
            rows.reverse()
        out = []
        for r in rows:
            reasons = json_of(r["finish_reasons"])
            out.append(CallRow(
                session_id=r["session_id"], correlation_id=r["correlation_id"], position=r["position"], agent=r["agent"],
                provider=r["provider"], framework=r["framework"], model=r["model"], request_model=r["request_model"],
                response_model=r["response_model"], response_id=r["response_id"],
                finish_reasons=[str(x) for x in reasons] if isinstance(reasons, list) else [], outcome=r["outcome"],
                streaming=r["streaming"], started_at=at(r["started_us"]), ended_at=at(r["ended_us"]),
                duration_ms=r["duration_ms"], time_to_first_chunk_ms=r["time_to_first_chunk_ms"], usage=usage_of(r),
                provider_usage=json_of(r["provider_usage"]), parameters={}, cost_usd=None, price_source=None,
                error_type=r["error_type"], error=r["error"], refusal=r["refusal"], input_messages=None,
                output_messages=None, trace_id=r["trace_id"], span_id=r["span_id"],
            ))
        return out

    def model_calls(
        self, session_id: str | None = None, *, model: str | None = None, provider: str | None = None,
        failed: bool = False, slowest: bool = False, limit: int | None = 50,
        since: datetime | None = None, search: str | None = None,
    ) -> list[ModelCall]:
        from ...models import ModelCall

        return [ModelCall.model_validate({k: v for k, v in c._asdict().items() if v is not None})
                for c in self.calls(session_id, model=model, provider=provider, failed=failed, slowest=slowest, limit=limit,
                                    since=since, search=search)]

    # -- trajectories (loopscope diff: .trajectory) ------------------------------------------

    def trajectory(self, ref: str) -> TrajectoryLookup:
        return trajectory.lookup(self, ref)

    # -- search and tool calls (.search) -----------------------------------------------------

    def search(self, text: str, *, session_id: str | None = None, limit: int = 50) -> list[SearchHit]:
        needle_of(text)  # an empty text: a clear error before the store is opened
        return _search.hits(self, text, session_id, limit)

    def tool_calls(
        self, session_id: str | None = None, *, tool: str | None = None, failed: bool = False,
        slowest: bool = False, since: datetime | None = None, search: str | None = None, limit: int | None = 50,
    ) -> list[ToolCallRow]:
        return _search.tool_calls(self, session_id, tool=tool, failed=failed, slowest=slowest, since=since, text=search,
                                  limit=limit)

    # -- analytics ------------------------------------------------------------------------

    def stats(self) -> Stats:
        [totals] = self.records(
            "SELECT (SELECT uniqExact(session_id) FROM loopscope_events) AS sessions, "
            f"(SELECT count() FROM {TURNS.format(where='')}) AS turns, "
            "(SELECT uniqExact(id) FROM loopscope_events) AS events, "
            f"(SELECT uniqExact(channel_id) FROM {TURNS.format(where='')}) AS agents, "
            "(SELECT toUnixTimestamp64Micro(min(created_at)) FROM loopscope_events) AS first_us, "
            "(SELECT toUnixTimestamp64Micro(max(created_at)) FROM loopscope_events) AS last_us")
        empty = not totals["events"]
        calls = CALLS.format(where="")
        [costs] = self.records(f"SELECT count() AS model_calls, CAST(NULL AS Nullable(Float64)) AS cost_usd, "
                               f"countIf(isNotNull(input_tokens) OR isNotNull(output_tokens)) AS unpriced_calls FROM {calls}")
        model_calls = self.records(
            f"""SELECT coalesce(response_model, request_model) AS model, provider, count() AS calls,
                countIf(outcome = 'error' OR isNotNull(error_type)) AS failed, CAST(NULL AS Nullable(Float64)) AS cost_usd,
                countIf(isNotNull(input_tokens) OR isNotNull(output_tokens)) AS unpriced_calls, avg(duration_ms) AS avg_ms,
                quantileExactInclusive(0.95)(duration_ms) AS p95_ms, avg(time_to_first_chunk_ms) AS avg_ttfc_ms
            FROM {calls} GROUP BY model, provider ORDER BY calls DESC, model NULLS LAST""")
        outcome_sums = ", ".join(f"sum(s.{o}) AS {o}" for o in TOOL_OUTCOMES)
        [tools] = self.records(
            f"""SELECT sum(s.calls) AS calls, sum(s.pending) AS pending, sum(s.finished) AS finished, {outcome_sums},
                (sum(s.finished) - sum(s.served)) / nullIf(sum(s.finished), 0) AS failure_share, count() AS tools
            FROM ({TOOL_STATS}) AS s""")
        turns = TURNS.format(where="")
        reasons = self.records(
            f"""SELECT loop_end_reason, count() AS turns, turns / sum(count()) OVER () AS share, avg(latency_ms) AS avg_latency_ms
            FROM {turns} GROUP BY loop_end_reason ORDER BY turns DESC, loop_end_reason""")
        total = "(coalesce(t.input_tokens, 0) + coalesce(t.output_tokens, 0))"
        [tokens] = self.records(
            f"""SELECT sum(t.input_tokens) AS input_tokens, sum(t.output_tokens) AS output_tokens,
                sum(t.cache_read_input_tokens) AS cache_read_input_tokens,
                sum(t.cache_creation_input_tokens) AS cache_creation_input_tokens, sum(t.reasoning_tokens) AS reasoning_tokens,
                sumIf({total}, isNotNull(t.input_tokens) OR isNotNull(t.output_tokens)) AS total_tokens FROM {turns} AS t""")
        models = self.records(
            f"""SELECT t.model AS model, t.provider AS provider, count() AS turns,
                sumIf({total}, isNotNull(t.input_tokens) OR isNotNull(t.output_tokens)) AS total_tokens,
                avg(t.latency_ms) AS avg_latency_ms
            FROM {turns} AS t GROUP BY model, provider ORDER BY turns DESC, model NULLS LAST""")
        if empty:  # the sums of nothing are NULL, as DuckDB's
            tokens = dict.fromkeys(tokens)
            tools = {k: (None if k == "failure_share" else 0) for k in tools}
        return Stats(
            sessions=int(totals["sessions"]), turns=int(totals["turns"]), events=int(totals["events"]),
            agents=int(totals["agents"]), first_at=None if empty else at(totals["first_us"]),
            last_at=None if empty else at(totals["last_us"]), costs=costs, model_calls=model_calls, tool_calls=tools,
            loop_end_reasons=reasons, tokens=tokens, models=models,
        )

    def tools(self, order: str = "calls", limit: int | None = None) -> list[Record]:
        sql = f"SELECT * EXCEPT q FROM ({TOOL_STATS}) ORDER BY {TOOL_ORDER[order]}"
        if limit:
            sql += f" LIMIT {int(limit)}"
        records = self.records(sql)
        for r in records:
            r["first_seen"], r["last_seen"] = at(r["first_seen"]), at(r["last_seen"])
        return records

    def declared_tools(self, agent: str | None = None, limit: int | None = None) -> list[Record]:
        sql, params = f"SELECT * FROM ({DECLARED})", dict[str, Any]()
        if agent:
            sql += " WHERE agent = {agent:String}"
            params["agent"] = agent
        if limit:
            sql += f" LIMIT {int(limit)}"
        records = self.records(sql, params)
        server = {(str(r[0]), str(r[1])) for r in self.rows(SERVER_TOOLS)} if records else set()
        for r in records:
            r["agent"] = r["agent"] or None
            r["last_offered"], r["last_called"] = at(r["last_offered"]), at(r["last_called"])
            r["kind"] = "server" if (r["agent"] or "", r["tool"]) in server else "client"
        return records

    def turn_count(self, agent: str | None = None) -> int:
        where, params = ("WHERE channel_id = {agent:String}", {"agent": agent}) if agent else ("", {})
        return int(self.rows(f"SELECT uniqExact(correlation_id, span_id) FROM loopscope_turns {where}", params)[0][0])

    def status(self) -> StoreStatus:
        [r] = self.records(
            "SELECT (SELECT uniqExact(session_id) FROM loopscope_events) AS sessions, "
            "(SELECT uniqExact(id) FROM loopscope_events) AS events, "
            "(SELECT uniqExact(correlation_id, span_id) FROM loopscope_turns) AS turns, "
            "(SELECT uniqExact(id) FROM loopscope_events WHERE type = 'tool_call_start') AS tool_calls, "
            "(SELECT uniqExact(span_id) FROM loopscope_model_calls) AS model_calls, "
            "(SELECT toUnixTimestamp64Micro(max(created_at)) FROM loopscope_events) AS last_us, "
            "(SELECT sum(bytes_on_disk) FROM system.parts WHERE active AND database = currentDatabase() "
            "AND (startsWith(table, 'loopscope_') OR table = 'otel_traces')) AS size")
        return StoreStatus(
            path=self.path, size_bytes=int(r["size"] or 0), schema_version=0, sessions=int(r["sessions"]),
            events=int(r["events"]), turns=int(r["turns"]), tool_calls=int(r["tool_calls"]),
            model_calls=int(r["model_calls"]), last_event_at=at(r["last_us"]) if r["events"] else None,
            writers=[], unserved_cut=0,  # no writers' table: the Collectors write (their own metrics count)
        )

    # -- the web dashboard's pages (.pages) ------------------------------------------------

    def page_overview(self, limit: int = 50) -> dict[str, Any]:
        return pages.overview(self, limit)

    def page_sessions(self, q: str | None = None, limit: int | None = None, offset: int | None = None) -> dict[str, Any]:
        return pages.sessions(self, q, limit, offset)

    def page_timeline(
        self, session_id: str, *, after_index: int | None = None, before_index: int | None = None,
        limit: int | None = None, include_blocked: bool = False, turn_ids: Sequence[str] = (),
    ) -> dict[str, Any]:
        return pages.timeline(self, session_id, after_index=after_index, before_index=before_index, limit=limit,
                              include_blocked=include_blocked, turn_ids=turn_ids)

    def page_event(self, event_id: str) -> dict[str, Any] | None:
        return pages.event(self, event_id)

    def page_tools(self, range_: str | None = "all", tool: str | None = None) -> dict[str, Any]:
        return pages.tool_analytics(self, range_, tool)

    def page_turns(self, range_: str | None = "all") -> dict[str, Any]:
        return pages.turn_analytics(self, range_)

    def page_declared(self, range_: str | None = "all") -> dict[str, Any]:
        return pages.declared_vs_used(self, range_)

    def sql(self, query: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Read-only SQL (ClickHouse's dialect; ``readonly = 1``: a write is refused). Parameters
        by name (``{name:Type}``), a mapping; positional ones are refused. What the engine refuses
        is a :class:`StoreError` that says ``SQL failed:`` and the engine's first line (as the CLI
        says it of DuckDB's errors)."""
        if params and not isinstance(params, Mapping):
            raise StoreError("ClickHouse SQL takes its parameters by name ({name:Type}), not positional ones")
        runner = self.runner  # a store that cannot be read says so first
        try:
            return runner.query(readonly(query), dict(params or {}))
        except Exception as exc:  # the engine refused the text (syntax, a write, an unknown table): one line
            first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise StoreError(f"SQL failed: {first}") from exc

    def export_parquet(
        self, tables: Sequence[str], out: str, *, progress: Callable[[str], ExportProgress] | None = None,
    ) -> dict[str, int]:
        return parquet.export(self, tables, out, progress=progress)

    def stored_ids(self, event_ids: Sequence[str]) -> set[str]:
        if not event_ids:
            return set()
        rows = self.rows(f"SELECT DISTINCT id FROM loopscope_events WHERE id IN {IN_IDS % 'ids'}", {"ids": ids_param(event_ids)})
        return {str(r[0]) for r in rows}

    def has_agui_events(self, session_id: str) -> bool:
        return False  # AG-UI imports write a DuckDB store only

    def interrupted(self, exc: BaseException) -> bool:
        return isinstance(exc, KeyboardInterrupt) or "interrupted" in str(exc).lower() and "Code: 394" in str(exc)

    # -- scores (.scores; docs/scores.md) ----------------------------------------------------

    def score_target(self, ref: str) -> ScoreTarget | None:
        return scores.score_target(self, ref)

    def page_session_scores(self, session_id: str, turn_ids: Sequence[str]) -> dict[str, Any]:
        return scores.session_page(self, session_id, turn_ids)

    def page_scores(self, range_: str | None = "all") -> dict[str, Any]:
        return scores.page(self, range_)


def _turn_filter_sql(turn_filter: TurnFilter, params: dict[str, Any]) -> list[str]:
    """A :class:`TurnFilter` as conditions on ``loopscope_turns``, its values in ``params``. No
    turn has a cost here: ``min_cost`` keeps none (as the DuckDB store keeps no unpriced turn)."""
    clauses: list[str] = []
    for column, name, value in (("channel_id", "t_agent", turn_filter.agent),
                                ("loop_end_reason", "t_reason", turn_filter.reason), ("model", "t_model", turn_filter.model)):
        if value is not None:
            clauses.append(f"{column} = {{{name}:String}}")
            params[name] = value
    if turn_filter.since is not None:
        clauses.append("timestamp >= fromUnixTimestamp64Micro({t_since:Int64}, 'UTC')")
        params["t_since"] = us_of(turn_filter.since)
    if turn_filter.min_cost is not None:
        clauses.append("0")
    if turn_filter.text:
        clauses.append(f"(session_id, correlation_id) IN (SELECT session_id, turn_id FROM ({_search.matches_sql()}))")
        params["needle"] = needle_of(turn_filter.text)
    return clauses


class _Follower:
    """A log followed by polling: the newest events, then each session's rows after the last
    index it gave. A row that lands late before a given index (a Collector's retry of an older
    batch) is numbered in its place by time; the follower has gone past it and does not show it."""

    def __init__(self, reader: ClickHouseReader, session_id: str | None, event_filter: EventFilter | None) -> None:
        self.reader, self.session_id, self.event_filter = reader, session_id, event_filter
        self.last: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def _note(self, events: list[ActivityEvent]) -> list[ActivityEvent]:
        for e in events:
            self.last[e.session_id] = max(self.last.get(e.session_id, 0), e.index)
        return events

    def start(self, newest: int = 0) -> list[ActivityEvent]:
        if self.session_id is not None:
            total = self.reader.rows("SELECT uniqExact(id) FROM loopscope_events WHERE session_id = {s:String}",
                                     {"s": self.session_id})[0][0]
            self.last[self.session_id] = int(total)
            shown = self.reader.timeline(self.session_id, newest, newest_first=True, event_filter=self.event_filter)
            return shown if newest else []
        self.counts = self._counts()
        self.last = dict(self.counts)
        return self.reader.recent_events(newest, event_filter=self.event_filter) if newest else []

    def _counts(self) -> dict[str, int]:
        return {str(r[0]): int(r[1]) for r in self.reader.rows("SELECT session_id, uniqExact(id) FROM loopscope_events GROUP BY session_id")}

    def poll(self) -> list[ActivityEvent]:
        sessions = [self.session_id] if self.session_id is not None else None
        if sessions is None:
            counts = self._counts()
            sessions = sorted(s for s, n in counts.items() if n > self.counts.get(s, 0))
            self.counts = counts
        out: list[ActivityEvent] = []
        for session in sessions:
            out += self._note(self.reader.timeline(session, after_index=self.last.get(session, 0),
                                                   event_filter=self.event_filter))
        out.sort(key=lambda e: (e.created_at, e.session_id, e.index))
        return out


def open_reader(url: str, *, lock_timeout: float = 10.0, keep_open: bool = False) -> ClickHouseReader:
    """The query API of the ClickHouse store ``url`` names."""
    return ClickHouseReader(url, lock_timeout=lock_timeout, keep_open=keep_open)


def prepare(url: str, *, timeout: float = 10.0, ttl_days: int = 0) -> str:
    """The store's schema made (``otel_traces`` as the exporter makes it, loopscope's tables and
    views; each ``IF NOT EXISTS``); its URL as its reads take it."""
    from . import ddl

    runner = connect(url, timeout=timeout)
    try:
        version = str(runner.rows("SELECT version()")[0][0])
        ddl.create(runner.command, version, runner.target.database, ttl_days=ttl_days)
    finally:
        runner.close()
    return runner.target.url


__all__ = ["ClickHouseReader", "open_reader", "prepare"]
