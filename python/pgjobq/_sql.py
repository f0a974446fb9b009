"""Running one statement of the SQL API on whatever the caller holds.

A *target* is one of:

- a psycopg 3 ``Connection`` or ``AsyncConnection``, a psycopg2 connection, a SQLAlchemy
  ``Connection`` or ``Session`` (or ``scoped_session``): the statement runs in the caller's
  transaction, which is never committed or rolled back here;
- a SQLAlchemy ``Engine``: a transaction of its own (``engine.begin()``), committed;
- a database URL (``postgresql://...`` or ``host=... dbname=...``), or None for the App's URL, else
  ``$PGJOBQ_DATABASE_URL``, else ``$DATABASE_URL``: a connection of the package's own (psycopg 3,
  else psycopg2), a transaction committed on it, and the connection kept for the next call (at most
  ``_IDLE_MAX`` idle per URL and process, and per event loop for the ``*_async`` functions; see
  ``_take`` and ``_atake``).

Statements are written with ``:name`` placeholders (SQLAlchemy's ``text()``), rewritten to
``%(name)s`` for the DB-API drivers.  Every value is a bound parameter; every parameter is a str, an
int, a float or None, cast in the SQL itself, so that every driver sends the same thing.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import re
import select
import sys
import threading
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from . import _txn
from .errors import PgjobqError, sqlstate_of, translate

Rows = List[Tuple[Any, ...]]
Check = Optional[Callable[[Rows], None]]

_PLACEHOLDER = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


@functools.lru_cache(maxsize=256)
def _pyformat(sql: str) -> str:
    assert "%" not in sql, "the SQL API's statements carry no literal %"
    return _PLACEHOLDER.sub(r"%(\1)s", sql)


@functools.lru_cache(maxsize=256)
def _sa_text(sql: str) -> Any:
    from sqlalchemy import text

    return text(sql)


_SA_DRIVER = re.compile(r"(postgres(?:ql)?)\+[A-Za-z0-9_]+://", re.I)


def _is_sa_url(value: Any) -> bool:
    eng = sys.modules.get("sqlalchemy.engine")
    return eng is not None and isinstance(value, getattr(eng, "URL", ()))


def libpq_url(url: Any) -> str:
    """A database URL as libpq reads it (psycopg, psycopg2 and the pgjobq command alike), from any form
    the package takes: a libpq URL (postgresql://, postgres://) or keyword string as it is, a
    SQLAlchemy URL (postgresql+psycopg2://, postgresql+psycopg://, ...) without its +driver, which is
    for SQLAlchemy only, or a ``sqlalchemy.engine.URL`` (with its password: ``str()`` would mask it)."""
    if _is_sa_url(url):
        render = getattr(url, "render_as_string", None)
        url = render(hide_password=False) if render is not None else str(url)
    if not isinstance(url, str):
        raise TypeError(f"pgjobq: a database URL is a str or a sqlalchemy URL, not a {type(url).__qualname__}")
    return _SA_DRIVER.sub(r"\1://", url, count=1) if _SA_DRIVER.match(url) else url


def configured_url() -> Optional[str]:
    """$PGJOBQ_DATABASE_URL, else $DATABASE_URL, else None (read when called)."""
    return os.environ.get("PGJOBQ_DATABASE_URL") or os.environ.get("DATABASE_URL") or None


def default_url(url: Any = None) -> str:
    u = url or configured_url()
    if not u:
        raise PgjobqError(
            "no database: pass a connection or session, a URL, App(database_url=...), "
            "or set $PGJOBQ_DATABASE_URL (e.g. to $(pgjobq db url))"
        )
    return libpq_url(u)


def unreachable(exc: BaseException) -> bool:
    """Whether exc says the database could not be reached (refused, down, starting or shutting down,
    a connection lost), as opposed to an error of the statement: worth waiting for."""
    code = sqlstate_of(exc)
    if code is not None:
        return code.startswith("08") or code in ("57P01", "57P02", "57P03")
    e: Any = exc
    for _ in range(3):  # SQLAlchemy wraps the driver's exception as .orig
        if e is None:
            break
        if type(e).__name__ == "OperationalError" and type(e).__module__.split(".")[0] in ("psycopg", "psycopg2"):
            return True
        e = getattr(e, "orig", None)
    return False


def classify(target: Any) -> str:
    """What the target is: psycopg, psycopg_async, psycopg2, sa_session, sa_connection, sa_engine,
    url (a str or None)."""
    if target is None or isinstance(target, str) or _is_sa_url(target):
        return "url"
    mods = sys.modules
    pg3 = mods.get("psycopg")
    if pg3 is not None:
        if isinstance(target, pg3.AsyncConnection):
            return "psycopg_async"
        if isinstance(target, pg3.Connection):
            return "psycopg"
    pg2 = mods.get("psycopg2.extensions")
    if pg2 is not None and isinstance(target, pg2.connection):
        return "psycopg2"
    orm = mods.get("sqlalchemy.orm")
    if orm is not None:
        if isinstance(target, orm.Session):
            return "sa_session"
        scoped = getattr(orm, "scoped_session", None)
        if scoped is not None and isinstance(target, scoped):
            return "sa_session"
    eng = mods.get("sqlalchemy.engine")
    if eng is not None:
        if isinstance(target, eng.Connection):
            return "sa_connection"
        if isinstance(target, eng.Engine):
            return "sa_engine"
    sa_async = mods.get("sqlalchemy.ext.asyncio")
    if sa_async is not None and isinstance(target, (sa_async.AsyncSession, sa_async.AsyncConnection)):
        raise TypeError(
            "pgjobq: SQLAlchemy's AsyncSession/AsyncConnection are not supported yet; "
            "pass a psycopg AsyncConnection, or a sync Session"
        )
    raise TypeError(
        f"pgjobq: cannot run SQL on a {type(target).__module__}.{type(target).__qualname__}: pass a psycopg "
        "(3) connection, a psycopg2 connection, a SQLAlchemy Connection, Session or Engine, or a database URL"
    )


def _rows_dbapi(cur: Any) -> Rows:
    return [tuple(r) for r in cur.fetchall()] if cur.description is not None else []


def _on_psycopg(conn: Any, sql: str, params: Mapping[str, Any]) -> Rows:
    from psycopg.rows import tuple_row

    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(_pyformat(sql), params)
        return _rows_dbapi(cur)


def _on_psycopg2(conn: Any, sql: str, params: Mapping[str, Any]) -> Rows:
    import psycopg2.extensions

    with conn.cursor(cursor_factory=psycopg2.extensions.cursor) as cur:
        cur.execute(_pyformat(sql), params)
        return _rows_dbapi(cur)


def _on_sqlalchemy(target: Any, sql: str, params: Mapping[str, Any]) -> Rows:
    if getattr(target, "_is_future", True) is False and not target.in_transaction():
        # SQLAlchemy 1.4's legacy Connection outside a transaction "autocommits" the statements it
        # takes for writes, which it guesses from their text: a SELECT of pgjobq.enqueue(...) would
        # be rolled back when the connection goes back to the pool.  Commit it as a write would be.
        with target.begin():
            return _on_sqlalchemy_now(target, sql, params)
    return _on_sqlalchemy_now(target, sql, params)


def _on_sqlalchemy_now(target: Any, sql: str, params: Mapping[str, Any]) -> Rows:
    result = target.execute(_sa_text(sql), dict(params))
    if not result.returns_rows:
        return []
    return [tuple(r) for r in result]


def _connect(url: str) -> Tuple[Any, str]:
    try:
        import psycopg

        # No server-side prepared statements: the URL may be a PgBouncer in transaction mode.
        return psycopg.connect(url, prepare_threshold=None), "psycopg"
    except ImportError:
        pass
    try:
        import psycopg2
    except ImportError:
        raise PgjobqError("pgjobq needs psycopg (3) or psycopg2 to open a connection from a URL: "
                          "pip install 'pgjobq[psycopg]' (Debian: apt-get install python3-psycopg)") from None
    return psycopg2.connect(url), "psycopg2"


# The connections a URL target opens, kept idle between calls: a connection costs a fork on the
# server and several round trips, many times an enqueue's own work.  Per process: a forked child
# must not use (or close: closing sends the server a Terminate on the parent's session) what it
# inherited, so it leaves those alone and starts afresh.
_IDLE_MAX = 4
_idle: Dict[str, List[Tuple[Any, str]]] = {}  # url -> [(conn, driver)]
_idle_lock = threading.Lock()
_idle_pid = os.getpid()
_inherited: List[Any] = []  # a forked child's copies of its parent's connections, never touched
# The AsyncConnections of the *_async functions, kept the same way but per event loop: one belongs to
# the loop it was opened on.  Those of a loop that has closed (asyncio.run() returned) cannot be
# closed with await any more; they are ended at once (_finish) the next time anything is taken or
# given back here, and at exit.
_aidle: Dict[Any, Dict[str, List[Any]]] = {}  # loop -> url -> [AsyncConnection]


def _healthy(conn: Any) -> bool:
    """An idle connection of ours has nothing to read: anything there is the server's goodbye (a
    FATAL error, an end of file: a restart, pg_terminate_backend, idle_session_timeout)."""
    if conn.closed:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _close(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        pass


def _forget_inherited() -> None:
    """In a forked child, the first time it takes a connection: its parent's are set aside, never
    used or closed.  Call with _idle_lock held."""
    global _idle_pid
    if _idle_pid != os.getpid():
        for conns in _idle.values():
            _inherited.extend(conns)
        _idle.clear()
        for per_url in _aidle.values():
            for aconns in per_url.values():
                _inherited.extend(aconns)
        _aidle.clear()
        _idle_pid = os.getpid()


def _take(url: str) -> Tuple[Any, str, bool]:
    """A connection to url: an idle one of this process's if one is healthy, else a new one.
    Returns it, its driver and whether it had been used before."""
    while True:
        with _idle_lock:
            _forget_inherited()
            conns = _idle.get(url)
            if not conns:
                break
            conn, driver = conns.pop()
        if _healthy(conn):
            return conn, driver, True
        _close(conn)
    conn, driver = _connect(url)
    return conn, driver, False


def _give(url: str, conn: Any, driver: str) -> None:
    """Back to the idle ones if it is out of any transaction and there is room; else closed."""
    if driver == "psycopg":
        from psycopg import pq

        idle = not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE
    else:
        import psycopg2.extensions

        idle = not conn.closed and conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    if idle:
        with _idle_lock:
            conns = _idle.setdefault(url, [])
            if _idle_pid == os.getpid() and len(conns) < _IDLE_MAX:
                conns.append((conn, driver))
                return
    _close(conn)


def _release(url: str, conn: Any, driver: str, committed: bool) -> None:
    """After a transaction of the package's own: kept when it committed, or when it failed (bad input,
    a duplicate) and rolls back cleanly; closed when the connection itself failed."""
    if not committed:
        try:
            conn.rollback()
        except Exception:
            _close(conn)
            return
    _give(url, conn, driver)


def _finish(aconn: Any) -> None:
    """Ends an AsyncConnection without its event loop (which may be closed): libpq's PQfinish,
    which sends the server its Terminate and closes the socket, as close() would."""
    try:
        aconn.pgconn.finish()
    except Exception:
        pass


def _swept_closed_loops() -> List[Any]:
    """Takes out the idle AsyncConnections of event loops that have closed, to _finish.  Call with
    _idle_lock held."""
    gone: List[Any] = []
    for loop in [lp for lp in _aidle if lp.is_closed()]:
        gone.extend(c for cs in _aidle.pop(loop).values() for c in cs)
    return gone


async def _atake(url: str) -> Tuple[Any, bool]:
    """_take for the *_async functions: an idle AsyncConnection of this event loop's if one is
    healthy, else a new one; and whether it had been used before."""
    loop = asyncio.get_running_loop()
    while True:
        with _idle_lock:
            _forget_inherited()
            gone = _swept_closed_loops()
            conns = _aidle.get(loop, {}).get(url)
            conn = conns.pop() if conns else None
        for c in gone:
            _finish(c)
        if conn is None:
            break
        if _healthy(conn):
            return conn, True
        _finish(conn)
    import psycopg

    # No server-side prepared statements: the URL may be a PgBouncer in transaction mode.
    return await psycopg.AsyncConnection.connect(url, prepare_threshold=None), False


async def _arelease(url: str, conn: Any, committed: bool) -> None:
    """_release for the *_async functions: kept when its transaction committed or rolls back
    cleanly and there is room, else closed."""
    from psycopg import pq

    if not committed:
        try:
            await conn.rollback()
        except Exception:
            _finish(conn)
            return
    if not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE:
        loop = asyncio.get_running_loop()
        with _idle_lock:
            gone = _swept_closed_loops()
            conns = _aidle.setdefault(loop, {}).setdefault(url, []) if _idle_pid == os.getpid() else None
            kept = conns is not None and len(conns) < _IDLE_MAX
            if kept:
                conns.append(conn)
        for c in gone:
            _finish(c)
        if kept:
            return
    try:
        await conn.close()
    except Exception:
        _finish(conn)


@atexit.register
def _close_idle() -> None:
    with _idle_lock:
        if _idle_pid != os.getpid():
            return
        conns = [c for cs in _idle.values() for c, _ in cs]
        _idle.clear()
        aconns = [c for per_url in _aidle.values() for cs in per_url.values() for c in cs]
        _aidle.clear()
    for c in conns:
        _close(c)
    for c in aconns:
        _finish(c)


def _run_own(url: str, sql: str, params: Mapping[str, Any], check: Check) -> Rows:
    """run() on a connection of the package's own, in a transaction committed here.  A kept
    connection that turns out to be gone when the statement is sent (the server restarted since)
    is replaced once: its transaction never reached a commit, so nothing of it was written."""
    for again in (True, False):
        conn, driver, reused = _take(url)
        done = False
        try:
            try:
                rows = (_on_psycopg if driver == "psycopg" else _on_psycopg2)(conn, sql, params)
            except Exception:
                if again and reused and conn.closed:
                    continue
                raise
            if check:
                check(rows)
            conn.commit()
            done = True
            return rows
        finally:
            _release(url, conn, driver, done)
    raise AssertionError("unreachable")


def run(target: Any, sql: str, params: Mapping[str, Any], *, check: Check = None, enqueue: bool = False,
        default: Optional[str] = None) -> Rows:
    """Runs sql on target and returns its rows as tuples; check(rows) runs before a transaction of
    the package's own commits (an exception from it rolls that back)."""
    kind = classify(target)
    try:
        if kind == "psycopg":
            rows = _on_psycopg(target, sql, params)
        elif kind == "psycopg2":
            rows = _on_psycopg2(target, sql, params)
        elif kind in ("sa_session", "sa_connection"):
            rows = _on_sqlalchemy(target, sql, params)
        elif kind == "sa_engine":
            with target.begin() as c:
                rows = _on_sqlalchemy(c, sql, params)
                if check:
                    check(rows)
            return rows
        elif kind == "url":
            return _run_own(default_url(target or default), sql, params, check)
        else:  # psycopg_async
            raise TypeError("pgjobq: this is a psycopg AsyncConnection: use the *_async functions (await ...)")
    except PgjobqError:
        raise
    except Exception as e:
        t = translate(e, enqueue=enqueue)
        if t is None:
            raise
        raise t from e
    if enqueue:
        _txn.watch(target, kind)  # on a caller's connection: autocommit, a session never committed
    if check:
        check(rows)
    return rows


@contextlib.contextmanager
def transaction(target: Any, default: Optional[str] = None) -> Iterator[Any]:
    """A target for several run() calls in one transaction: the caller's connection or session as
    it is (its transaction, not committed here); for an Engine or a URL, a transaction of the
    package's own, committed when the block ends without an exception."""
    kind = classify(target)
    if kind == "sa_engine":
        with target.begin() as c:
            yield c
    elif kind == "url":
        url = default_url(target or default)
        conn, driver, _ = _take(url)
        done = False
        try:
            yield conn
            conn.commit()
            done = True
        finally:
            _release(url, conn, driver, done)
    else:
        yield target


async def _arun_own(url: str, on: Callable[[Any], Any], check: Check) -> Rows:
    """_run_own for the *_async functions: on(conn) on a kept AsyncConnection of this event loop's
    (or a new one), in a transaction committed here; a kept one found gone is replaced once."""
    for again in (True, False):
        conn, reused = await _atake(url)
        done = False
        try:
            try:
                rows = await on(conn)
            except Exception:
                if again and reused and conn.closed:
                    continue
                raise
            if check:
                check(rows)
            await conn.commit()
            done = True
            return rows
        finally:
            await _arelease(url, conn, done)
    raise AssertionError("unreachable")


async def arun(target: Any, sql: str, params: Mapping[str, Any], *, check: Check = None, enqueue: bool = False,
               default: Optional[str] = None) -> Rows:
    """run() for a psycopg AsyncConnection, or a URL (an AsyncConnection of its own, kept: _atake)."""
    kind = classify(target)
    if kind not in ("psycopg_async", "url"):
        raise TypeError(
            "pgjobq: the *_async functions take a psycopg AsyncConnection or a URL; "
            f"for a {type(target).__qualname__} use the plain functions"
        )
    from psycopg.rows import tuple_row

    async def on(conn: Any) -> Rows:
        async with conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(_pyformat(sql), params)
            return [tuple(r) for r in await cur.fetchall()] if cur.description is not None else []

    try:
        if kind == "psycopg_async":
            rows = await on(target)
        else:
            return await _arun_own(default_url(target or default), on, check)
    except PgjobqError:
        raise
    except Exception as e:
        t = translate(e, enqueue=enqueue)
        if t is None:
            raise
        raise t from e
    if enqueue:
        _txn.watch(target, kind)
    if check:
        check(rows)
    return rows

