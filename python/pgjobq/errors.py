"""pgjobq's exceptions.

Errors of the SQL API arrive as driver exceptions carrying a SQLSTATE; they are raised again as the
classes below, with the SQL API's own message (``str(e)``), its SQLSTATE (``e.sqlstate``) and the
driver's exception as ``__cause__``.  The handler-side control exceptions (``Retry``, ``Fail``) are
in the same module but are not errors of the package.
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:  # pragma: no cover
    from ._jobs import JobInfo

__all__ = [
    "PgjobqError",
    "InvalidArgument",
    "InvalidJob",
    "DuplicateJob",
    "PermissionDenied",
    "SchemaMissing",
    "TransactionConflict",
    "WrongShard",
    "ShardUnavailable",
    "JobNotFound",
    "JobFailed",
    "JobCancelled",
    "ResultTimeout",
    "Retry",
    "Fail",
]


class PgjobqError(Exception):
    """Any error of pgjobq's SQL API or of this package.  ``sqlstate`` is the database's code, or
    None for an error found before anything was sent."""

    def __init__(self, message: str, sqlstate: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate


class InvalidArgument(PgjobqError, ValueError):
    """A bad argument: SQLSTATE 22023 (invalid_parameter_value), 22P02 or another of class 22, or a
    rule of a table (class 23 but 23505)."""


class InvalidJob(InvalidArgument):
    """A job the SQL API (or the package, before sending anything) refuses: a bad queue or kind
    name, priority, max_attempts, payload (not JSON, larger than 1 MiB), unknown parent (23503), a
    rule of the jobs table (23514)..."""


class DuplicateJob(PgjobqError):
    """A job whose unique key is held by a queued or running job of its queue.  ``holder_id`` is that
    job's id when the SQL API reported it (``enqueue`` returns it with ``duplicate = true``; a retry
    that hits the key is a unique violation, 23505, without the id)."""

    def __init__(self, message: str, holder_id: Optional[int] = None, sqlstate: Optional[str] = None) -> None:
        super().__init__(message, sqlstate)
        self.holder_id = holder_id


class PermissionDenied(PgjobqError):
    """SQLSTATE 42501: the role lacks the privilege (pgjobq_producer may only enqueue; cancel, retry,
    queue settings and schedules need pgjobq_admin; reading jobs needs pgjobq_admin or
    pgjobq_monitor)."""


class SchemaMissing(PgjobqError):
    """The pgjobq schema or one of its functions is missing (3F000, 42883, 42P01): run ``pgjobq
    migrate``."""


class TransactionConflict(PgjobqError):
    """SQLSTATE 40001 or 40P01 (serialization failure, deadlock): nothing changed; run the
    transaction again."""


class WrongShard(PgjobqError):
    """A job that lives on another shard of the cluster than the database it was sent to
    (docs/python.md, "Shards"): refused by the package before anything is sent (a transactional
    defer on a connection to another shard; ``sqlstate`` None), or by the shard's guard (SQLSTATE
    PJQ01: the map the job was routed by is older than the shard's; nothing of the statement was
    written).  ``shard``: the shard the job lives on, ``connection_shard``: the one it was sent to
    (None when not known)."""

    def __init__(self, message: str, sqlstate: Optional[str] = "PJQ01", shard: Optional[str] = None,
                 connection_shard: Optional[str] = None) -> None:
        super().__init__(message, sqlstate)
        self.shard = shard
        self.connection_shard = connection_shard


class ShardUnavailable(PgjobqError, ConnectionError):
    """A shard of the cluster (``shard``, None for the database the map is read from) cannot be
    reached: refused, down, or no answer within the connect timeout.  The jobs routed to it were not
    enqueued; the other shards are not held up.  The driver's exception is ``__cause__``.  A batch
    over several shards carries ``partial`` (see ``enqueue_many``)."""

    def __init__(self, message: str, shard: Optional[str] = None) -> None:
        super().__init__(message, None)
        self.shard = shard


class JobNotFound(PgjobqError, LookupError):
    """No job has that id (or retention has pruned it)."""


class JobFailed(PgjobqError):
    """``result()`` of a job that ended failed; ``job`` is its record (``job.last_error``)."""

    def __init__(self, job: "JobInfo") -> None:
        super().__init__(f"job {job.id} failed: {job.last_error or '(no error recorded)'}")
        self.job = job


class JobCancelled(PgjobqError):
    """``result()`` of a job that ended cancelled."""

    def __init__(self, job: "JobInfo") -> None:
        super().__init__(f"job {job.id} was cancelled" + (f": {job.last_error}" if job.last_error else ""))
        self.job = job


class ResultTimeout(PgjobqError, TimeoutError):
    """``result()`` waited ``timeout`` seconds and the job had not finished."""

    def __init__(self, job_id: int, timeout: float, state: Optional[str]) -> None:
        super().__init__(f"job {job_id} has not finished after {timeout:g} s (it is {state})")
        self.job_id = job_id
        self.state = state


# ------------------------------------------------------------------------------------------------
# Raised by handlers


class Retry(Exception):
    """Raise in a task to end this attempt as failed and run the job again: after ``delay`` (seconds,
    a ``timedelta`` or a duration such as ``"30s"``), or after the task's ``retry_backoff`` (else the
    database's ``pgjobq.backoff``) when no delay is given.  Once attempts run out, the job ends
    failed.  A delay that is not a duration, or more than 100 years, is refused here
    (``InvalidArgument``, raised where the task builds the Retry)."""

    def __init__(self, message: str = "retry requested", delay: Union[None, float, str, _dt.timedelta] = None) -> None:
        if delay is not None:
            from ._util import delay_seconds

            delay_seconds(delay, "Retry(delay=...)")
        super().__init__(message)
        self.message = message
        self.delay = delay


class Snooze(Exception):
    """Raise in a task to hand its job back untouched and run it again after ``delay`` (seconds, a
    ``timedelta`` or a duration such as ``"5m"``; None: the backoff of its attempt, a few seconds):
    **no attempt is used**, for a job that cannot run yet rather than one that failed (a remote side's
    rate, a resource not ready).  ``reason`` is kept as the job's ``last_error``.  A cancellation
    requested meanwhile ends the job cancelled.  A delay that is not a duration, or more than 100
    years, is refused here (``InvalidArgument``).  (River's ``JobSnooze``, Oban's ``{:snooze, n}``;
    docs/durable.md.)"""

    def __init__(self, delay: Union[None, float, str, _dt.timedelta] = None, reason: str = "snoozed by the task") -> None:
        if delay is not None:
            from ._util import delay_seconds

            delay_seconds(delay, "Snooze(delay=...)")
        super().__init__(reason)
        self.reason = reason
        self.delay = delay


class Fail(Exception):
    """Raise in a task to end the job failed for good, whatever attempts remain."""

    def __init__(self, message: str = "failed") -> None:
        super().__init__(message)
        self.message = message


# ------------------------------------------------------------------------------------------------
# From a driver's exception


def _driver_error(exc: BaseException) -> Optional[BaseException]:
    """The DB-API exception inside exc (SQLAlchemy wraps it as .orig), or None when exc is none."""
    seen = 0
    e: Any = exc
    while e is not None and seen < 4:
        code = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
        if code:
            return e  # type: ignore[no-any-return]
        e = getattr(e, "orig", None)
        seen += 1
    return None


def sqlstate_of(exc: BaseException) -> Optional[str]:
    e = _driver_error(exc)
    if e is None:
        return None
    return getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)


def message_of(exc: BaseException) -> str:
    e = _driver_error(exc) or exc
    diag = getattr(e, "diag", None)
    msg = getattr(diag, "message_primary", None) if diag is not None else None
    if msg:
        return str(msg)
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# The shard's guard's message (sql/functions/cluster.sql, cluster_guard): the owner, and the shard it ran on.
_GUARD = re.compile(r'which shard "([^"]+)" owns .* not this shard \("([^"]+)"\)')


def translate(exc: BaseException, *, enqueue: bool = False) -> Optional[PgjobqError]:
    """The pgjobq exception for a driver's exception, or None when it carries no SQLSTATE (a lost
    connection, a driver's own error): those are raised as they are.  The C library maps SQLSTATEs to
    its result codes alike (src/errors.c, pgjobq__code_from_sqlstate; a lost connection, a timeout
    and any other error are a plain PgjobqError here): tests/test_rules.c holds the two equal."""
    code = sqlstate_of(exc)
    if code is None:
        return None
    msg = message_of(exc)
    if code == "23505":
        return DuplicateJob(msg, None, code)
    if code == "42501":
        return PermissionDenied(msg, code)
    if code in ("3F000", "42883", "42P01"):
        return SchemaMissing(msg + " (is the pgjobq schema installed? run `pgjobq migrate`)", code)
    if code in ("40001", "40P01"):
        return TransactionConflict(msg, code)
    if code == "PJQ01":
        m = _GUARD.search(msg)
        return WrongShard(msg, code, m.group(1) if m else None, m.group(2) if m else None)
    if code.startswith("22") or code.startswith("23"):
        return (InvalidJob if enqueue else InvalidArgument)(msg, code)
    return PgjobqError(msg, code)
