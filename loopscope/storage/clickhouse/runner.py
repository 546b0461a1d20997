"""One statement with named parameters, run on ClickHouse: chDB in this process, or a server over
HTTP through ``clickhouse-connect``. The same SQL text on both (ClickHouse's server-side
parameters, ``{name:Type}``, bound by the engine: no value is spliced into the SQL).

The store's URL says which (docs/clickhouse.md):

* ``clickhouse://[user[:password]@]host[:port][/database]``: a server over HTTP (port 8123 by
  default); ``clickhouses://`` the same over HTTPS (port 8443);
* ``chdb:///absolute/dir`` or ``chdb://relative/dir`` (``?database=name``, default ``default``):
  chDB, ClickHouse's engine in this process, on that data directory. chDB serves one directory per
  process, and one process at a time opens a directory: a second process that opens it waits
  for it (or fails), so ``loopscope collect --db chdb://...`` holds the directory while it runs.

Rows come back as tuples of Python values (ints, floats, strings, lists, None); times are best
selected as Unix microseconds (``toUnixTimestamp64Micro``), the same on every client.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import StoreError

CHDB_SCHEME = "chdb://"
"""The prefix of an in-process (chDB) store's URL."""
HTTP_PORTS = {"clickhouse": 8123, "clickhouses": 8443}


@dataclass(frozen=True)
class Target:
    """Where a ClickHouse store is: a chDB directory (``path``) or a server (``host``...)."""

    url: str
    database: str = "default"
    path: str | None = None
    host: str | None = None
    port: int | None = None
    secure: bool = False
    user: str | None = None
    password: str | None = None

    @property
    def in_process(self) -> bool:
        return self.path is not None


def parse(url: str) -> Target:
    """The target of a ``clickhouse://``, ``clickhouses://`` or ``chdb://`` URL; a clear
    :class:`StoreError` for anything else."""
    lowered = url.lower()
    if lowered.startswith(CHDB_SCHEME):
        rest, _, query = url[len(CHDB_SCHEME):].partition("?")
        if not rest:
            raise StoreError(f"{url!r} names no directory: give chdb:///absolute/dir or chdb://relative/dir")
        database = parse_qs(query).get("database", ["default"])[0] or "default"
        path = os.path.abspath(os.path.expanduser(unquote(rest)))
        return Target(url=f"{CHDB_SCHEME}{path}" + (f"?database={database}" if database != "default" else ""),
                      database=database, path=path)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in HTTP_PORTS or not parts.hostname:
        raise StoreError(f"{url!r} is not a ClickHouse URL: clickhouse://host:8123/database, clickhouses://... "
                         "or chdb:///path/to/dir")
    try:
        port = parts.port or HTTP_PORTS[scheme]
    except ValueError:
        raise StoreError(f"{url!r} has a port that is not a number") from None
    database = parts.path.strip("/") or "default"
    if "/" in database:
        raise StoreError(f"{url!r}: the path is one database name, not {database!r}")
    return Target(url=url, database=unquote(database), host=parts.hostname, port=port, secure=scheme == "clickhouses",
                  user=unquote(parts.username) if parts.username else None,
                  password=unquote(parts.password) if parts.password else None)


class Runner:
    """Runs statements on one ClickHouse store. :meth:`rows` and :meth:`query` read, :meth:`command`
    runs a statement for its effect, :meth:`insert` adds rows; every call binds ``params`` by
    name. Safe to share between threads (a chDB session is used by one at a time)."""

    target: Target

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Column names and rows."""
        raise NotImplementedError

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return self.query(sql, params)[1]

    def arrow(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        """The result as a ``pyarrow.Table`` (Parquet export)."""
        raise NotImplementedError

    def __call__(self, sql: str, params: Mapping[str, Any], /) -> Sequence[Sequence[Any]]:
        """The rows (the ``run`` callable of :mod:`.queries`)."""
        return self.rows(sql, params)

    def command(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        raise NotImplementedError

    def insert_json(self, table: str, lines: str) -> None:
        """``lines`` (``JSONEachRow``: one JSON object a line) inserted into ``table`` in one ``INSERT``."""
        raise NotImplementedError

    def close(self) -> None:
        """Lets go of the connection (a chDB directory stays open for others in this process)."""


class _Chdb(Runner):
    """chDB in this process: one session per process, on the target's directory."""

    _opening = threading.RLock()  # (not _lock: the SDK door's check reads that name as the SDK's)
    _session: Any = None
    _path: str | None = None
    _users = 0

    def __init__(self, target: Target) -> None:
        self.target = target
        self._closed = False
        with _Chdb._opening:
            if _Chdb._session is not None and _Chdb._path != target.path:
                raise StoreError(f"chDB has {_Chdb._path} open in this process; it serves one directory per process "
                                 f"(asked for {target.path})")
            if _Chdb._session is None:
                try:
                    from chdb import session  # pyright: ignore[reportMissingImports] - the clickhouse extra
                except ModuleNotFoundError:
                    raise StoreError("a chdb:// store needs chDB: pip install 'loopscope[clickhouse]'") from None
                os.makedirs(str(target.path), exist_ok=True)
                try:
                    _Chdb._session = session.Session(target.path)
                except Exception as exc:  # another process holds the directory, or it is not chDB's
                    raise StoreError(f"cannot open chDB directory {target.path} (chDB lets one process at a time open a "
                                     f"directory: is another loopscope using it?): {exc}") from None
                _Chdb._path = target.path
            _Chdb._users += 1

    def _run(self, sql: str, params: Mapping[str, Any] | None, fmt: str) -> Any:
        with _Chdb._opening:
            if self._closed or _Chdb._session is None:
                raise StoreError(f"the chDB store {self.target.url} is closed")
            database = self.target.database
            if database != "default":
                _Chdb._session.query(f"USE `{database}`")
            return _Chdb._session.query(sql, fmt, params=dict(params or {}))

    def arrow(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        return self._run(sql, params, "ArrowTable")

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        table = self._run(sql, params, "ArrowTable")
        names = list(table.column_names)
        columns = [column.to_pylist() for column in table.columns]
        return names, list(zip(*columns)) if columns else []

    def command(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        self._run(sql, params, "CSV")

    def insert_json(self, table: str, lines: str) -> None:
        self._run(f"INSERT INTO {table} SETTINGS session_timezone = 'UTC' FORMAT JSONEachRow\n{lines}", None, "CSV")

    def close(self) -> None:
        with _Chdb._opening:
            if self._closed:
                return
            self._closed = True
            _Chdb._users -= 1
            if _Chdb._users <= 0 and _Chdb._session is not None:
                _Chdb._session.close()
                _Chdb._session, _Chdb._path, _Chdb._users = None, None, 0


class _Http(Runner):
    """A ClickHouse server over HTTP (``clickhouse-connect``)."""

    def __init__(self, target: Target, timeout: float = 10.0) -> None:
        self.target = target
        try:
            import clickhouse_connect  # pyright: ignore[reportMissingImports] - the clickhouse extra
        except ModuleNotFoundError:
            raise StoreError("a clickhouse:// store needs clickhouse-connect: pip install 'loopscope[clickhouse]'") from None
        try:
            self._client = clickhouse_connect.get_client(
                host=target.host, port=target.port, username=target.user or "default", password=target.password or "",
                database=target.database, secure=target.secure, connect_timeout=timeout,
                # the same texts as chDB gives: times read as numbers, no client-side conversion
                settings={"session_timezone": "UTC"},
            )
        except Exception as exc:
            raise StoreError(f"cannot reach ClickHouse at {target.host}:{target.port}: {exc}") from None
        self._lock = threading.Lock()

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        with self._lock:
            result = self._client.query(sql, parameters=dict(params or {}))
        return list(result.column_names), [tuple(row) for row in result.result_rows]

    def arrow(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        with self._lock:
            return self._client.query_arrow(sql, parameters=dict(params or {}))

    def command(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        with self._lock:
            self._client.command(sql, parameters=dict(params or {}))

    def insert_json(self, table: str, lines: str) -> None:
        with self._lock:
            self._client.raw_insert(table, insert_block=lines.encode(), fmt="JSONEachRow",
                                    settings={"session_timezone": "UTC"})

    def close(self) -> None:
        self._client.close()


def connect(url: str, *, timeout: float = 10.0) -> Runner:
    """A :class:`Runner` on the store ``url`` names (see the module's docstring)."""
    target = parse(url)
    return _Chdb(target) if target.in_process else _Http(target, timeout)


def readonly(sql: str) -> str:
    """``sql`` run read-only: ClickHouse refuses a write, a DDL statement or a setting changed in it
    (``readonly = 1``). A statement that has its own ``SETTINGS`` or ``FORMAT`` clause at the end
    is refused too (ClickHouse: a syntax error): the reader answers rows, in its own format."""
    return sql.strip().rstrip(";").rstrip() + "\nSETTINGS readonly = 1"


__all__ = ["CHDB_SCHEME", "Runner", "Target", "connect", "parse", "readonly"]
