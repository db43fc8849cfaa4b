"""The synchronous engine of the SQLite metastore.

Every function here runs in the one worker thread of a
:class:`headrace.metastore.sqlite.SqliteMetastore`; the async facade never
touches the connection itself. Writes run in ``BEGIN IMMEDIATE`` so that
several processes sharing the file serialise on SQLite's write lock (WAL
journal, readers never block). Tables::

    meta(name, value)      'revision' (store revision), 'compacted' (events <= it are gone)
    kv(key, value, create_revision, mod_revision, version, lease)
    leases(id, ttl, expires_at)   expires_at is wall-clock (time.time()) seconds
    events(id, revision, type, key, value, create_revision, mod_revision, version, lease)

A write transaction first expires overdue leases (each expired lease with keys
takes one revision and deletes its keys, logging DELETE events), then applies
its own changes under one new revision, like etcd.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path

from headrace import errors
from headrace.metastore.contract import (
    Compare,
    Delete,
    EventType,
    Get,
    KeyValue,
    LeaseExpired,
    Op,
    Put,
    TxnResult,
    WatchEvent,
)
from headrace.metastore.ranges import check_compare, check_ops, encode_key, prefix_end

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS kv (
    key BLOB PRIMARY KEY, value BLOB NOT NULL, create_revision INTEGER NOT NULL,
    mod_revision INTEGER NOT NULL, version INTEGER NOT NULL, lease INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_by_lease ON kv (lease) WHERE lease != 0;
CREATE TABLE IF NOT EXISTS leases (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ttl REAL NOT NULL, expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_by_expiry ON leases (expires_at);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, revision INTEGER NOT NULL, type INTEGER NOT NULL,
    key BLOB NOT NULL, value BLOB NOT NULL, create_revision INTEGER NOT NULL,
    mod_revision INTEGER NOT NULL, version INTEGER NOT NULL, lease INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_revision ON events (revision);
INSERT OR IGNORE INTO meta (name, value) VALUES ('revision', 1), ('compacted', 0);
"""
_Row = tuple[bytes, bytes, int, int, int, int]
"""A kv row: key, value, create_revision, mod_revision, version, lease."""
_KV_COLUMNS = "key, value, create_revision, mod_revision, version, lease"
_PUT, _DELETE = 0, 1
_RETRYABLE = {"SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_CANTOPEN", "SQLITE_IOERR", "SQLITE_PERM"}
_RETRYABLE |= {"SQLITE_READONLY", "SQLITE_PROTOCOL", "SQLITE_AUTH"}


def translate(exc: sqlite3.Error, path: str) -> errors.HeadraceError:
    """The Headrace error for a sqlite3 exception raised on ``path``."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    if name == "SQLITE_FULL" or "disk is full" in text:
        return errors.StorageFull(f"SQLite metastore {path}: {text}")
    if name in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
        return errors.CorruptData(f"SQLite metastore {path} is damaged: {text}")
    if name in _RETRYABLE or "locked" in text or "unable to open" in text:
        return errors.Unavailable(f"SQLite metastore {path}: {text}")
    return errors.HeadraceError(f"SQLite metastore {path}: {text} ({name or 'no code'})")


def connect(path: str, busy_timeout: float, *, create: bool = True) -> sqlite3.Connection:
    """Open the database file; with ``create``, create it (and its directory)
    and its schema if missing. Without, touch nothing on disk: NotFound if the
    file is missing or holds no Headrace metastore (a mistyped path)."""
    if not create:
        return _open_existing(path, busy_timeout)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise errors.Unavailable(
            f"SQLite metastore {path}: cannot create its directory: {exc}"
        ) from None
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
    try:
        _configure(conn, path, busy_timeout)
        with write_txn(conn):
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.close()
        raise
    return conn


def _open_existing(path: str, busy_timeout: float) -> sqlite3.Connection:
    if not Path(path).is_file():
        raise errors.NotFound(
            f"SQLite metastore {path} does not exist (check the path; "
            "`headrace standalone` prints the URL of the one it creates)"
        )
    uri = f"file:{urllib.parse.quote(str(Path(path).resolve()))}?mode=rw"
    conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        # Read before anything writes: a file of another program stays untouched.
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            raise errors.NotFound(
                f"SQLite metastore {path}: the file is not a Headrace metastore "
                f"(schema version {version}, expected {SCHEMA_VERSION})"
            )
        _configure(conn, path, busy_timeout)
    except BaseException:
        conn.close()
        raise
    return conn


def _configure(conn: sqlite3.Connection, path: str, busy_timeout: float) -> None:
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise errors.Unavailable(f"SQLite metastore {path}: WAL journal unavailable ({mode})")
    conn.execute("PRAGMA synchronous = FULL")


@contextlib.contextmanager
def write_txn(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@contextlib.contextmanager
def read_txn(conn: sqlite3.Connection) -> Iterator[None]:
    """A consistent snapshot for several SELECTs."""
    conn.execute("BEGIN")
    try:
        yield
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


def _meta(conn: sqlite3.Connection, name: str) -> int:
    return int(conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()[0])


def _row_kv(row: _Row) -> KeyValue:
    return KeyValue(bytes(row[0]).decode(), bytes(row[1]), row[2], row[3], row[4], row[5])


class _Writer:
    """Revision bookkeeping of one write transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.revision = self._initial = _meta(conn, "revision")
        self._own: int | None = None

    def next_revision(self) -> int:
        self.revision += 1
        return self.revision

    def own_revision(self) -> int:
        """The single revision of the caller's changes, allocated on first use."""
        if self._own is None:
            self._own = self.next_revision()
        return self._own

    def finish(self) -> None:
        if self.revision != self._initial:
            self.conn.execute("UPDATE meta SET value = ? WHERE name = 'revision'", (self.revision,))

    def log(self, kind: int, row: _Row) -> None:
        self.conn.execute(
            "INSERT INTO events (revision, type, key, value, create_revision, mod_revision,"
            " version, lease) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (row[3], kind, *row[:3], *row[3:]),
        )

    def delete_rows(self, rows: list[_Row], rev: int) -> None:
        for row in rows:
            self.conn.execute("DELETE FROM kv WHERE key = ?", (row[0],))
            self.log(_DELETE, (row[0], b"", 0, rev, 0, 0))


def _select(conn: sqlite3.Connection, key: bytes, prefix: bool) -> list[_Row]:
    if not prefix:
        return conn.execute(f"SELECT {_KV_COLUMNS} FROM kv WHERE key = ?", (key,)).fetchall()
    end = prefix_end(key)
    if end is None:
        query = f"SELECT {_KV_COLUMNS} FROM kv WHERE key >= ? ORDER BY key"
        return conn.execute(query, (key,)).fetchall()
    query = f"SELECT {_KV_COLUMNS} FROM kv WHERE key >= ? AND key < ? ORDER BY key"
    return conn.execute(query, (key, end)).fetchall()


def _expire(w: _Writer, now: float) -> bool:
    """Revoke overdue leases; whether anything was logged."""
    overdue = w.conn.execute("SELECT id FROM leases WHERE expires_at <= ?", (now,)).fetchall()
    logged = False
    for (lease,) in overdue:
        logged = _revoke(w, lease) or logged
    return logged


def _revoke(w: _Writer, lease: int) -> bool:
    rows = w.conn.execute(
        f"SELECT {_KV_COLUMNS} FROM kv WHERE lease = ? ORDER BY key", (lease,)
    ).fetchall()
    w.conn.execute("DELETE FROM leases WHERE id = ?", (lease,))
    if rows:
        w.delete_rows(rows, w.next_revision())
    return bool(rows)


def _lease_alive(conn: sqlite3.Connection, lease: int) -> bool:
    return conn.execute("SELECT 1 FROM leases WHERE id = ?", (lease,)).fetchone() is not None


def _put(w: _Writer, op: Put) -> None:
    if op.lease and not _lease_alive(w.conn, op.lease):
        raise LeaseExpired(f"lease {op.lease:x} is gone; cannot put {op.key!r}")
    key = encode_key(op.key)
    old = w.conn.execute("SELECT create_revision, version FROM kv WHERE key = ?", (key,)).fetchone()
    rev = w.own_revision()
    row = (key, op.value, old[0] if old else rev, rev, old[1] + 1 if old else 1, op.lease)
    w.conn.execute(f"INSERT OR REPLACE INTO kv ({_KV_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", row)
    w.log(_PUT, row)


def _delete(w: _Writer, op: Delete) -> int:
    rows = _select(w.conn, encode_key(op.key, prefix=op.prefix), op.prefix)
    if rows:
        w.delete_rows(rows, w.own_revision())
    return len(rows)


def _current(conn: sqlite3.Connection, key: str) -> KeyValue | None:
    row = conn.execute(f"SELECT {_KV_COLUMNS} FROM kv WHERE key = ?", (encode_key(key),)).fetchone()
    return None if row is None else _row_kv(row)


def overdue_leases(conn: sqlite3.Connection, now: float) -> bool:
    """Cheap read: is any lease past its expiry?"""
    query = "SELECT 1 FROM leases WHERE expires_at <= ? LIMIT 1"
    return conn.execute(query, (now,)).fetchone() is not None


def expire_leases(conn: sqlite3.Connection) -> bool:
    """Revoke every overdue lease now; whether any key was deleted."""
    if not overdue_leases(conn, time.time()):
        return False
    with write_txn(conn):
        w = _Writer(conn)
        logged = _expire(w, time.time())
        w.finish()
    return logged


def txn(
    conn: sqlite3.Connection,
    compares: Sequence[Compare],
    success: Sequence[Op],
    failure: Sequence[Op],
) -> tuple[TxnResult, list[int]]:
    """Apply a transaction; the result and the delete count of each Delete op."""
    for compare in compares:
        check_compare(compare)
    check_ops(success)
    check_ops(failure)
    with write_txn(conn):
        w = _Writer(conn)
        _expire(w, time.time())
        succeeded = all(c.holds(_current(conn, c.key)) for c in compares)
        gets: list[list[KeyValue]] = []
        deleted: list[int] = []
        for op in success if succeeded else failure:
            if isinstance(op, Put):
                _put(w, op)
            elif isinstance(op, Delete):
                deleted.append(_delete(w, op))
            else:
                rows = _select(conn, encode_key(op.key, prefix=op.prefix), op.prefix)
                gets.append([_row_kv(r) for r in rows])
        w.finish()
    return TxnResult(succeeded, w.revision, gets), deleted


def get(conn: sqlite3.Connection, op: Get) -> list[KeyValue]:
    expire_leases(conn)
    return [_row_kv(r) for r in _select(conn, encode_key(op.key, prefix=op.prefix), op.prefix)]


def revision(conn: sqlite3.Connection) -> int:
    expire_leases(conn)
    return _meta(conn, "revision")


def grant_lease(conn: sqlite3.Connection, ttl: float) -> int:
    with write_txn(conn):
        cur = conn.execute(
            "INSERT INTO leases (ttl, expires_at) VALUES (?, ?)", (ttl, time.time() + ttl)
        )
    assert cur.lastrowid is not None
    return cur.lastrowid


def keep_alive(conn: sqlite3.Connection, lease: int) -> bool:
    """Renew ``lease``; whether expiring overdue leases deleted keys. LeaseExpired if gone."""
    with write_txn(conn):
        w = _Writer(conn)
        logged = _expire(w, time.time())
        w.finish()
        cur = conn.execute(
            "UPDATE leases SET expires_at = ? + ttl WHERE id = ?", (time.time(), lease)
        )
    if cur.rowcount == 0:
        raise LeaseExpired(f"lease {lease:x} expired or was revoked")
    return logged


def revoke_lease(conn: sqlite3.Connection, lease: int) -> bool:
    """Revoke ``lease`` and delete its keys; whether keys were deleted."""
    with write_txn(conn):
        w = _Writer(conn)
        logged = _expire(w, time.time())
        logged = _revoke(w, lease) or logged
        w.finish()
    return logged


def compact(conn: sqlite3.Connection, retention: int) -> None:
    """Drop events older than the newest ``retention`` revisions."""
    floor = _meta(conn, "revision") - retention
    if floor <= _meta(conn, "compacted") + max(1, retention // 4):
        return
    with write_txn(conn):
        conn.execute("DELETE FROM events WHERE revision <= ?", (floor,))
        conn.execute("UPDATE meta SET value = ? WHERE name = 'compacted'", (floor,))


def data_version(conn: sqlite3.Connection) -> int:
    """Changes whenever another connection commits to the file."""
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


class WatchCursor:
    """Where one watch stands in the event log.

    Every revision below ``needed`` has been examined; ``after_id`` is the last
    event id examined. Batches end on revision boundaries, so a compaction that
    removed revisions >= ``needed`` means events were lost (Truncated).
    """

    def __init__(self, prefix: bytes, start: int, after_id: int, needed: int) -> None:
        self.prefix = prefix
        self.end = prefix_end(prefix)
        self.start = start
        self.after_id = after_id
        self.needed = needed


def _truncated(revision: int, compacted: int) -> errors.Truncated:
    return errors.Truncated(
        f"watch from revision {revision}: events up to revision {compacted} were compacted",
        earliest=str(compacted + 1),
    )


def open_cursor(conn: sqlite3.Connection, prefix: str, start_revision: int) -> WatchCursor:
    key = encode_key(prefix, prefix=True)
    expire_leases(conn)
    with read_txn(conn):
        current = _meta(conn, "revision")
        if start_revision <= 0:
            last = conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]
            return WatchCursor(key, current + 1, last, current + 1)
        compacted = _meta(conn, "compacted")
        if start_revision <= compacted:
            raise _truncated(start_revision, compacted)
        last = conn.execute(
            "SELECT COALESCE(MAX(id), 0) FROM events WHERE revision < ?", (start_revision,)
        ).fetchone()[0]
    return WatchCursor(key, start_revision, last, start_revision)


def fetch(conn: sqlite3.Connection, cursor: WatchCursor, limit: int) -> list[WatchEvent]:
    """The next events of ``cursor`` (whole revisions, about ``limit`` events)."""
    with read_txn(conn):
        compacted = _meta(conn, "compacted")
        if compacted >= cursor.needed:
            raise _truncated(cursor.needed, compacted)
        bound_row = conn.execute(
            "SELECT revision FROM events WHERE id > ? ORDER BY id LIMIT 1 OFFSET ?",
            (cursor.after_id, limit - 1),
        ).fetchone()
        bound = _meta(conn, "revision") if bound_row is None else int(bound_row[0])
        last_id = conn.execute(
            "SELECT COALESCE(MAX(id), ?) FROM events WHERE id > ? AND revision <= ?",
            (cursor.after_id, cursor.after_id, bound),
        ).fetchone()[0]
        query = (
            "SELECT type, key, value, create_revision, mod_revision, version, lease FROM events"
            " WHERE id > ? AND id <= ? AND revision >= ? AND key >= ?"
        )
        params: tuple[object, ...] = (cursor.after_id, last_id, cursor.start, cursor.prefix)
        if cursor.end is not None:
            query += " AND key < ?"
            params += (cursor.end,)
        rows = conn.execute(query + " ORDER BY id", params).fetchall()
    cursor.after_id = last_id
    cursor.needed = max(cursor.needed, bound + 1)
    return [
        WatchEvent(
            EventType.PUT if kind == _PUT else EventType.DELETE,
            KeyValue(bytes(key).decode(), bytes(value), create, mod, version, lease),
        )
        for kind, key, value, create, mod, version, lease in rows
    ]
