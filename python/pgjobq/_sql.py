"""Running one statement of the SQL API on whatever the caller holds.

A *target* is one of:

- a psycopg 3 ``Connection`` or ``AsyncConnection``, a psycopg2 connection, a SQLAlchemy
  ``Connection`` or ``Session`` (or ``scoped_session``): the statement runs in the caller's
  transaction, which is never committed or rolled back here;
- a SQLAlchemy ``Engine``: a transaction of its own (``engine.begin()``), committed;
- a database URL (``postgresql://...`` or ``host=... dbname=...``), or None for the App's URL, else
  ``$PGJOBQ_DATABASE_URL``, else ``$DATABASE_URL``: a connection of its own (psycopg 3, else
  psycopg2), committed and closed.

Statements are written with ``:name`` placeholders (SQLAlchemy's ``text()``), rewritten to
``%(name)s`` for the DB-API drivers.  Every value is a bound parameter; every parameter is a str, an
int, a float or None, cast in the SQL itself, so that every driver sends the same thing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
from typing import Any, Callable, Iterator, List, Mapping, Optional, Tuple

from .errors import PgjobqError, translate

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


def default_url(url: Optional[str] = None) -> str:
    u = url or os.environ.get("PGJOBQ_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if not u:
        raise PgjobqError(
            "no database: pass a connection or session, a URL, App(database_url=...), "
            "or set $PGJOBQ_DATABASE_URL (e.g. to $(pgjobq db url))"
        )
    # A SQLAlchemy URL names its driver (postgresql+psycopg2://); libpq reads the rest.
    return re.sub(r"^(postgres(?:ql)?)\+[A-Za-z0-9_]+://", r"\1://", u)


def classify(target: Any) -> str:
    """What the target is: psycopg, psycopg_async, psycopg2, sa_session, sa_connection, sa_engine,
    url (a str or None)."""
    if target is None or isinstance(target, str):
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

        return psycopg.connect(url), "psycopg"
    except ImportError:
        pass
    try:
        import psycopg2
    except ImportError:
        raise PgjobqError("pgjobq needs psycopg (3) or psycopg2 to open a connection from a URL") from None
    return psycopg2.connect(url), "psycopg2"


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
            conn, driver = _connect(default_url(target or default))
            try:
                rows = (_on_psycopg if driver == "psycopg" else _on_psycopg2)(conn, sql, params)
                if check:
                    check(rows)
                conn.commit()
                return rows
            finally:
                conn.close()
        else:  # psycopg_async
            raise TypeError("pgjobq: this is a psycopg AsyncConnection: use the *_async functions (await ...)")
    except PgjobqError:
        raise
    except Exception as e:
        t = translate(e, enqueue=enqueue)
        if t is None:
            raise
        raise t from e
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
        conn, _ = _connect(default_url(target or default))
        try:
            yield conn
            conn.commit()
        finally:
            conn.close()
    else:
        yield target


async def arun(target: Any, sql: str, params: Mapping[str, Any], *, check: Check = None, enqueue: bool = False,
               default: Optional[str] = None) -> Rows:
    """run() for a psycopg AsyncConnection, or a URL (an AsyncConnection of its own)."""
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
            import psycopg

            conn = await psycopg.AsyncConnection.connect(default_url(target or default))
            try:
                rows = await on(conn)
                if check:
                    check(rows)
                await conn.commit()
                return rows
            finally:
                await conn.close()
    except PgjobqError:
        raise
    except Exception as e:
        t = translate(e, enqueue=enqueue)
        if t is None:
            raise
        raise t from e
    if check:
        check(rows)
    return rows

