"""Looking at jobs and acting on them, queues and schedules, through the SQL API.

Privileges (``pgjobq migrate --roles``): reading jobs (``get``, ``result``) needs pgjobq_admin or
pgjobq_monitor; ``cancel``, ``retry``, the ``*_where`` forms, queue settings and schedules need
pgjobq_admin.  A role without the privilege gets ``PermissionDenied``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import time
from typing import Any, Dict, List, Optional

from . import _sql
from ._util import Duration, dumps, seconds
from .errors import JobCancelled, JobFailed, JobNotFound, ResultTimeout

__all__ = [
    "JobInfo",
    "QueueInfo",
    "get",
    "result",
    "cancel",
    "retry",
    "retry_running",
    "retry_where",
    "cancel_where",
    "pause",
    "resume",
    "set_limits",
    "queues",
    "FINAL_STATES",
]

FINAL_STATES = ("completed", "failed", "cancelled")


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """A job as ``pgjobq.all_jobs`` shows it (live or finished)."""

    id: int
    queue: str
    kind: str
    state: str  # waiting, queued, running, completed, failed, cancelled
    payload: Any
    priority: int
    attempt: int
    max_attempts: int
    run_at: _dt.datetime
    created_at: _dt.datetime
    started_at: Optional[_dt.datetime]
    finished_at: Optional[_dt.datetime]
    result: Any
    last_error: Optional[str]
    unique_key: Optional[str]
    concurrency_key: Optional[str]
    tags: Optional[List[str]]
    progress: Any
    worker_id: Optional[str]
    cancel_requested: bool
    # When a cancel was requested while it ran, and when its holder ended it and told its handler to
    # stop (None: not so, or before schema 16).
    cancel_requested_at: Optional[_dt.datetime] = None
    cancel_told_at: Optional[_dt.datetime] = None
    # The job's routing key in a cluster of shards (docs/python.md, "Shards"), None when it has none.
    route_key: Optional[str] = None
    # How many times it was snoozed (pgjobq.Snooze: no attempt used), against pgjobq.snooze_cap().
    snoozes: int = 0
    # When it expires if it has not started (None: never; docs/queues.md, "Expiry").  A job that
    # expired is cancelled, last_error "expired: ...".
    expires_at: Optional[_dt.datetime] = None
    # The priority it was enqueued with, when priority aging raised it since (``priority`` is the
    # raised one); None: never raised (docs/queues.md, "Priority aging").
    base_priority: Optional[int] = None
    # The W3C traceparent it was enqueued with (None: none; docs/queues.md, "Trace context").
    traceparent: Optional[str] = None
    # Its stored steps (ctx.step, and the sleeps and waits it came to), in the order they were stored,
    # and its park now: a durable sleep or a wait for an event (None when it is not parked).
    steps: List["StepInfo"] = dataclasses.field(default_factory=list)
    parked: Optional["ParkInfo"] = None
    # Its dead-letter links (docs/queues.md, "Dead letters"): the id of the job it is the dead letter
    # of (None: it is none), and the ids of the dead letters it left (one per time it failed for good).
    dead_letter_of: Optional[int] = None
    dead_letters: List[int] = dataclasses.field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """A stored step of a job: its name, the attempt that stored it, when, and its result's size
    (bytes of JSON text)."""

    name: str
    attempt: int
    stored_at: _dt.datetime
    size: int


@dataclasses.dataclass(frozen=True)
class ParkInfo:
    """Why a job is parked: ``why`` 'sleeping' (``ctx.sleep``) or 'waiting' (``ctx.wait_for_event``,
    for ``event`` and ``key``), in the step ``step``, until when it runs again (the sleep's end, the
    wait's timeout), since when."""

    why: str
    step: str
    until: _dt.datetime
    since: _dt.datetime
    event: Optional[str] = None
    key: Optional[str] = None


# steps and parked: JSON with times as epoch seconds (every driver reads those alike).
_GET_SQL = """
SELECT id, queue, kind, CAST(state AS text), payload, priority, attempt, max_attempts, run_at, created_at,
       started_at, finished_at, result, last_error, unique_key, concurrency_key, tags, progress, worker_id,
       cancel_requested, cancel_requested_at, cancel_told_at, route_key, snoozes, expires_at, base_priority,
       traceparent,
       (SELECT jsonb_agg(jsonb_build_array(s.name, s.attempt, extract(epoch FROM s.stored_at), s.result_bytes))
          FROM pgjobq.steps(a.id) s) AS steps,
       (SELECT jsonb_build_array(p.parked, p.step, extract(epoch FROM p.until), extract(epoch FROM p.since),
                                 p.event_name, p.event_key)
          FROM pgjobq.job_park_of(a.id) p) AS parked,
       (SELECT d.id FROM pgjobq.monitor_dead_letters(a.id) d WHERE d.relation = 'of') AS dead_letter_of,
       ARRAY(SELECT d.id FROM pgjobq.monitor_dead_letters(a.id) d WHERE d.relation = 'to' ORDER BY d.id)
         AS dead_letters
  FROM pgjobq.job_get(CAST(:id AS bigint)) a
"""


def _when(epoch: Any) -> _dt.datetime:
    return _dt.datetime.fromtimestamp(float(epoch), _dt.timezone.utc)


def _job(row: Any) -> JobInfo:
    (id_, queue, kind, state, payload, priority, attempt, max_attempts, run_at, created_at, started_at,
     finished_at, result_, last_error, unique_key, concurrency_key, tags, progress, worker_id, cancel_requested,
     cancel_requested_at, cancel_told_at, route_key, snoozes, expires_at, base_priority, traceparent, steps,
     parked, dead_letter_of, dead_letters) = row
    return JobInfo(int(id_), queue, kind, state, payload, int(priority), int(attempt), int(max_attempts), run_at,
                   created_at, started_at, finished_at, result_, last_error, unique_key, concurrency_key,
                   list(tags) if tags is not None else None, progress, worker_id, bool(cancel_requested),
                   cancel_requested_at, cancel_told_at, route_key, int(snoozes), expires_at,
                   int(base_priority) if base_priority is not None else None,
                   traceparent,
                   [StepInfo(str(n), int(a), _when(t), int(b)) for n, a, t, b in steps or []],
                   ParkInfo(parked[0], parked[1], _when(parked[2]), _when(parked[3]), parked[4], parked[5])
                   if parked else None,
                   int(dead_letter_of) if dead_letter_of is not None else None, [int(d) for d in dead_letters or []])


def get(conn: Any, job_id: int) -> Optional[JobInfo]:
    """The job, or None when no job has that id (retention may have pruned it)."""
    rows = _sql.run(conn, _GET_SQL, {"id": int(job_id)})
    return _job(rows[0]) if rows else None


def _own_polling_connection(conn: Any) -> Any:
    """For result(): a URL (or None) becomes one autocommit connection kept for the whole wait."""
    if _sql.classify(conn) != "url":
        return None
    url = _sql.default_url(conn)
    try:
        import psycopg

        return psycopg.connect(url, autocommit=True, prepare_threshold=None)
    except ImportError:
        import psycopg2

        c = psycopg2.connect(url)
        c.autocommit = True
        return c


# A wait on a connection of its own reads the job again this often even when no notification came
# (one can be missed in a short window: a job that finished while the wait was being registered).
WAIT_FALLBACK_S = 10.0


class _Listener:
    """A wait's LISTEN on its own autocommit connection (psycopg or psycopg2): ``woken()`` says whether
    a notification came since the last call (what came during a query included), ``wait(s)`` blocks
    until the socket has something or s seconds pass.  None of it when the database has no
    pgjobq.await_begin (schema < 24): then the wait polls."""

    def __init__(self, own: Any, job_id: int) -> None:
        self.own, self.job_id, self.seen = own, job_id, False
        self.psycopg3 = hasattr(own, "add_notify_handler")
        if self.psycopg3:
            own.add_notify_handler(self._notify)
        _sql.run(own, "LISTEN pgjobq_done", {})
        _sql.run(own, "SELECT state FROM pgjobq.await_begin(CAST(:id AS bigint))", {"id": job_id})

    def _notify(self, n: Any) -> None:
        if n.channel == "pgjobq_done" and (not n.payload or str(self.job_id) in n.payload.split(",")):
            self.seen = True

    def woken(self) -> bool:
        if not self.psycopg3:
            for n in self.own.notifies:
                self._notify(n)
            del self.own.notifies[:]
        seen, self.seen = self.seen, False
        return seen

    def wait(self, s: float) -> None:
        import select

        ready, _, _ = select.select([self.own.fileno()], [], [], max(s, 0.0))
        if ready and not self.psycopg3:
            self.own.poll()

    def end(self) -> None:
        try:
            _sql.run(self.own, "SELECT pgjobq.await_end(CAST(:id AS bigint))", {"id": self.job_id})
        except Exception:  # noqa: BLE001 - the connection closes next, which ends the wait anyway
            pass


def result(conn: Any, job_id: int, timeout: Optional[Duration] = 30.0, *, poll: Optional[Duration] = None) -> Any:
    """Waits until the job has finished and returns its result (None when it stored none).  Raises
    ``JobFailed`` or ``JobCancelled`` (with the job) when it ended so, ``JobNotFound``, or
    ``ResultTimeout`` after ``timeout`` seconds (None: no limit).  Given a URL (or None for the App's)
    it waits on a connection of its own, outside any transaction, woken by a notification sent in the
    transaction that finishes the job (docs/durable.md, "Awaiting a result"), and reads it every
    ``poll`` seconds (default 10) in case one was missed.  On a connection of the caller's it polls
    the job (``pgjobq.job_get``) with a backoff from 10 ms to ``poll`` (default 0.5 s); one not in autocommit
    mode runs each look in the caller's open transaction."""
    limit = None if timeout is None else seconds(timeout, "timeout")
    own = _own_polling_connection(conn)
    target = own if own is not None else conn
    listener: Optional[_Listener] = None
    if own is not None:
        try:
            listener = _Listener(own, int(job_id))
        except Exception:  # noqa: BLE001 - a database without await_begin (schema < 24): poll
            own.close()
            own = _own_polling_connection(conn)
            target = own
    cap = max(seconds(poll, "poll"), 0.01) if poll is not None else WAIT_FALLBACK_S if listener else 0.5
    try:
        start = time.monotonic()
        pause = 0.01 if listener is None else cap
        while True:
            rows = _sql.run(target, _GET_SQL, {"id": int(job_id)})
            if not rows:
                raise JobNotFound(f"no job has the id {job_id}")
            job = _job(rows[0])
            if job.state == "completed":
                return job.result
            if job.state == "failed":
                raise JobFailed(job)
            if job.state == "cancelled":
                raise JobCancelled(job)
            waited = time.monotonic() - start
            if limit is not None and waited >= limit:
                raise ResultTimeout(int(job_id), limit, job.state)
            step = pause if limit is None else min(pause, max(limit - waited, 0.001))
            if listener is None:
                time.sleep(step)
                pause = min(pause * 2, cap)
            elif not listener.woken():  # (one that came during the read: read again at once)
                until = time.monotonic() + step
                while not listener.woken() and time.monotonic() < until:
                    listener.wait(until - time.monotonic())
                    if listener.psycopg3:
                        _sql.run(own, "SELECT 1", {})  # (psycopg hands notifications over during a query)
    finally:
        if listener is not None:
            listener.end()
        if own is not None:
            own.close()


def cancel(conn: Any, job_id: int) -> str:
    """``pgjobq.cancel``: 'cancelled' (it was waiting or queued), 'cancel_requested' (running: its
    worker is notified and ends it cancelled at once; an async task is cancelled, a sync one sees
    ``ctx.cancelled``), 'not_found', or 'already_completed' / 'already_failed' /
    'already_cancelled'.  ``JobInfo.cancel_requested_at`` and ``cancel_told_at`` say when."""
    return str(_sql.run(conn, "SELECT pgjobq.cancel(CAST(:id AS bigint))", {"id": int(job_id)})[0][0])


def retry(conn: Any, job_id: int) -> str:
    """``pgjobq.retry``: runs a finished or scheduled job again now ('queued'), or says why not
    ('running', 'waiting', 'not_found').  A unique key held meanwhile raises ``DuplicateJob``."""
    return str(_sql.run(conn, "SELECT pgjobq.retry(CAST(:id AS bigint))", {"id": int(job_id)})[0][0])


def retry_running(conn: Any, job_id: int) -> str:
    """``pgjobq.retry_running``: ends a running job's lease now and queues it to run again ('queued';
    the attempt it was running counts, and its worker's writes are refused from now on), or ends it
    cancelled when a cancel was requested ('cancelled'); 'not_running' or 'not_found' otherwise."""
    return str(_sql.run(conn, "SELECT pgjobq.retry_running(CAST(:id AS bigint))", {"id": int(job_id)})[0][0])


def skip(conn: Any, job_id: int) -> str:
    """``pgjobq.sequence_skip``: the key that the job blocks in its strict-order queue (it failed for
    good there) moves on without it ('skipped'; the job stays failed); 'not_blocking' when it blocks
    no key, 'not_found' when there is no such job.  ``retry`` runs it again first instead."""
    return str(_sql.run(conn, "SELECT pgjobq.sequence_skip(CAST(:id AS bigint))", {"id": int(job_id)})[0][0])


def _interval(since: Optional[Duration]) -> Optional[str]:
    return None if since is None else f"{seconds(since, 'since')} seconds"


def retry_where(conn: Any, queue: str, state: str, *, kind: Optional[str] = None, since: Optional[Duration] = None,
                dry_run: bool = False, redrive: bool = False) -> Dict[str, int]:
    """``pgjobq.retry_where``: every job of the queue in ``state`` (failed, cancelled, completed, or
    queued for a later time) runs again now; returns {"retried": n, "skipped": n}.  ``redrive``: the
    queue is a dead-letter queue, and its dead letters go back to the queues they came from (state
    "queued": every one of them, due or not); a job of it that is no dead letter is skipped."""
    rows = _sql.run(
        conn,
        "SELECT r.retried, r.skipped FROM pgjobq.retry_where(CAST(:queue AS text), CAST(:state AS text), "
        "CAST(:kind AS text), CAST(:since AS interval), CAST(:dry_run AS boolean), CAST(:redrive AS boolean)) AS r",
        {"queue": queue, "state": state, "kind": kind, "since": _interval(since), "dry_run": bool(dry_run),
         "redrive": bool(redrive)},
    )
    return {"retried": int(rows[0][0]), "skipped": int(rows[0][1])}


def cancel_where(conn: Any, queue: str, state: str, *, kind: Optional[str] = None, since: Optional[Duration] = None,
                 dry_run: bool = False) -> int:
    """``pgjobq.cancel_where``: every queued job of the queue cancelled (state 'queued'), or every
    running one asked to cancel (state 'running'); returns how many."""
    rows = _sql.run(
        conn,
        "SELECT pgjobq.cancel_where(CAST(:queue AS text), CAST(:state AS text), CAST(:kind AS text), "
        "CAST(:since AS interval), CAST(:dry_run AS boolean))",
        {"queue": queue, "state": state, "kind": kind, "since": _interval(since), "dry_run": bool(dry_run)},
    )
    return int(rows[0][0])


def pause(conn: Any, queue: str, reason: Optional[str] = None) -> bool:
    """``pgjobq.queue_pause``: no worker claims from the queue until resume(); running jobs go on.
    False when it was paused already."""
    rows = _sql.run(conn, "SELECT pgjobq.queue_pause(CAST(:queue AS text), CAST(:reason AS text))",
                    {"queue": queue, "reason": reason})
    return bool(rows[0][0])


def resume(conn: Any, queue: str) -> bool:
    """``pgjobq.queue_resume``; False when the queue was not paused."""
    return bool(_sql.run(conn, "SELECT pgjobq.queue_resume(CAST(:queue AS text))", {"queue": queue})[0][0])


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


def set_limits(conn: Any, queue: str, *, concurrency: Optional[int] = UNSET, key_concurrency: Optional[int] = UNSET,
               rate_limit: Optional[int] = UNSET, rate_period: Optional[Duration] = UNSET,
               max_lease: Optional[Duration] = UNSET, dead_letter: Optional[str] = UNSET,
               expire_after: Optional[Duration] = UNSET, strict_order: Optional[bool] = UNSET,
               priority_aging: Optional[Duration] = UNSET) -> None:
    """``pgjobq.queue_set``: changes the limits given and leaves the others; None removes one.
    ``concurrency``: jobs of the queue running at once, on all workers; ``key_concurrency``: per
    concurrency key; ``rate_limit`` jobs started per ``rate_period`` (seconds, timedelta, "1m";
    the two go together); ``max_lease``: the longest lease a worker may take on a job of the queue
    (1 s to 365 days; None: the default, a day); ``dead_letter``: the queue where a job of this one
    that fails for good goes, as a new job (None: nowhere; a cycle is refused); ``expire_after``: the
    expiry of the jobs enqueued from then on without one, from their run_at (1 s to 365 days; None:
    none); ``strict_order``: True, the jobs of a concurrency key run one at a time in enqueue order
    and one that fails for good blocks its key until retried or ``skip``-ped (docs/queues.md,
    "Strict order per key"); False or None: off; ``priority_aging``: a queued job ready that long at
    its priority is raised one step (its priority number lowered by 1, down to -100), again after each
    further interval (1 s to 365 days; None: off; docs/queues.md, "Priority aging")."""
    settings: Dict[str, Any] = {}
    for name, v in (("concurrency", concurrency), ("key_concurrency", key_concurrency), ("rate_limit", rate_limit),
                    ("dead_letter", dead_letter)):
        if v is not UNSET:
            settings[name] = v
    if rate_period is not UNSET:
        settings["rate_period"] = None if rate_period is None else f"{seconds(rate_period, 'rate_period')} seconds"
    if max_lease is not UNSET:
        settings["max_lease"] = None if max_lease is None else f"{seconds(max_lease, 'max_lease')} seconds"
    if expire_after is not UNSET:
        settings["expire_after"] = (None if expire_after is None
                                    else f"{seconds(expire_after, 'expire_after')} seconds")
    if strict_order is not UNSET:
        if strict_order is not None and not isinstance(strict_order, bool):
            raise TypeError(f"set_limits: strict_order must be True, False or None, not {strict_order!r}")
        settings["strict_order"] = strict_order
    if priority_aging is not UNSET:
        settings["priority_aging"] = (None if priority_aging is None
                                      else f"{seconds(priority_aging, 'priority_aging')} seconds")
    _sql.run(conn, "SELECT pgjobq.queue_set(CAST(:queue AS text), CAST(:settings AS jsonb))",
             {"queue": queue, "settings": dumps(settings, "set_limits")})


@dataclasses.dataclass(frozen=True)
class QueueInfo:
    """A row of ``pgjobq.queue_list()``."""

    queue: str
    paused_at: Optional[_dt.datetime]
    pause_reason: Optional[str]
    concurrency: Optional[int]
    key_concurrency: Optional[int]
    rate_limit: Optional[int]
    rate_period: Optional[_dt.timedelta]
    queued: int
    scheduled: int
    running: int
    expired: int
    max_lease: _dt.timedelta  # the longest lease a claim may take: the queue's, or the default (a day)
    # What an autoscaler reads (pgjobq.queue_ready): how long the oldest job ready now has been
    # claimable (None: none is ready), and the slots of the live workers that serve the queue.
    oldest_ready: Optional[_dt.timedelta]
    worker_slots: int
    dead_letter: Optional[str]  # where its jobs that fail for good go (None: nowhere)
    expire_after: Optional[_dt.timedelta] = None  # the expiry its jobs get by default (None: none)
    strict_order: bool = False  # its keys' jobs run one at a time, in order
    blocked_keys: int = 0  # keys of a strict queue that a failed job blocks (skip, retry)
    # How long a job waits at a priority before it is raised one step (None: off).
    priority_aging: Optional[_dt.timedelta] = None
    shard: Optional[str] = None  # in a cluster: the shard these settings and counts are of

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


class QueueList(List[QueueInfo]):
    """``App.queues()``: the rows, and in a cluster ``down``: the shards that could not be read (name ->
    why), whose queues are not in the list."""

    def __init__(self, rows: Any = ()) -> None:
        super().__init__(rows)
        self.down: Dict[str, str] = {}


def queues(conn: Any) -> List[QueueInfo]:
    """Every queue with jobs or settings: its settings and live counts."""
    rows = _sql.run(
        conn,
        "SELECT q.queue, q.paused_at, q.pause_reason, q.concurrency, q.key_concurrency, q.rate_limit, "
        "q.rate_period, q.queued, q.scheduled, q.running, q.expired, q.max_lease,"
        " make_interval(secs => r.oldest_ready_s), coalesce(r.worker_slots, 0), q.dead_letter,"
        " q.expire_after, q.strict_order, q.blocked_keys, q.priority_aging"
        " FROM pgjobq.queue_list() AS q LEFT JOIN pgjobq.queue_ready() AS r ON r.queue = q.queue ORDER BY 1",
        {},
    )
    return [QueueInfo(*r) for r in rows]
