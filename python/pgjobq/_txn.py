"""Warnings, once per process, about an enqueue that will not be atomic with the caller's data as
the caller probably thinks: on a connection in autocommit mode (the job is committed at once, alone),
and in a SQLAlchemy session whose transaction then ends without a commit (closed: the job is gone).
docs/python.md, "Which transaction a job joins", says the rest.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Set

__all__ = ["TransactionWarning", "watch"]

_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_warned: Set[str] = set()


class TransactionWarning(UserWarning):
    """An enqueue that is not part of a transaction of the caller's, or whose transaction ended
    without a commit."""


def _stacklevel(skip: tuple) -> int:
    """The warning's stack level: the first frame outside this package (and ``skip``)."""
    frame = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith((_HERE,) + skip):
        frame = frame.f_back
        level += 1
    return level


def _warn_once(key: str, message: str, skip: tuple = ()) -> None:
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, TransactionWarning, stacklevel=_stacklevel(skip))


def _dbapi(target: Any, kind: str) -> Any:
    """The DB-API connection under a caller's connection or session."""
    if kind in ("psycopg", "psycopg_async", "psycopg2"):
        return target
    conn = target.connection() if kind == "sa_session" else target
    fairy = conn.connection
    return getattr(fairy, "dbapi_connection", None) or getattr(fairy, "connection", None)


def _outside_transaction(dbapi: Any) -> bool:
    """Autocommit mode and no transaction block open (psycopg's ``conn.transaction()`` opens one)."""
    if not getattr(dbapi, "autocommit", False):
        return False
    info = getattr(dbapi, "info", None)
    if info is not None:  # psycopg 3
        return int(info.transaction_status) == 0  # IDLE
    return int(dbapi.get_transaction_status()) == 0  # psycopg2: TRANSACTION_STATUS_IDLE


def _session_ended(session: Any, transaction: Any) -> None:
    if transaction.parent is None and session.info.pop("pgjobq_pending", False):
        import sqlalchemy

        _warn_once("session", "pgjobq: a SQLAlchemy session's transaction in which jobs were deferred ended without a "
                              "commit (the session was closed): those jobs were not enqueued.  Commit it "
                              "(session.commit(), or `with session.begin():`), or roll it back if you meant to.",
                   (os.path.dirname(os.path.abspath(sqlalchemy.__file__)) + os.sep,))


def _session_settled(session: Any, *args: Any) -> None:
    session.info.pop("pgjobq_pending", None)


def _watch_session(session: Any) -> None:
    """Remembers that the session's transaction holds jobs; a commit or a rollback settles that,
    and a transaction that ends with neither (a close) warns."""
    info = session.info
    if "pgjobq_watched" not in info:
        from sqlalchemy import event

        info["pgjobq_watched"] = True
        event.listen(session, "after_commit", _session_settled)
        event.listen(session, "after_rollback", _session_settled)
        event.listen(session, "after_transaction_end", _session_ended)
    info["pgjobq_pending"] = True


def watch(target: Any, kind: str) -> None:
    """Called after an enqueue on a caller's connection or session.  A failing check never costs
    the caller the enqueue (only a warning made an error by a filter is raised)."""
    autocommit = False
    try:
        if kind == "sa_session":
            orm = sys.modules.get("sqlalchemy.orm")
            if orm is not None and isinstance(target, orm.scoped_session):
                target = target.registry()  # the session of this scope
        autocommit = _outside_transaction(_dbapi(target, kind))
        if not autocommit and kind == "sa_session":
            _watch_session(target)
    except Exception:  # noqa: BLE001
        return
    if autocommit:
        _warn_once("autocommit", "pgjobq: enqueued on a connection in autocommit mode: the job is committed at "
                                 "once, on its own, whatever becomes of the rest of your work.  Enqueue inside "
                                 "your transaction (conn.transaction(), session.begin()) to make them atomic.")
