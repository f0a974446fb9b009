"""``App.run_inline()``: the due jobs of an App's tasks, claimed and run in the calling process, for
tests.

Each job goes through the database as with the worker: claimed with ``pgjobq.claim_batch`` (a lease
of its own, a worker id ``inline:HOST:PID``), run, and ended with ``pgjobq.complete_many`` /
``fail_many`` (or handed back with ``release_many`` when the App has no task for its kind), each
statement committed on its own when the target is a URL.  The outcome of a task's return or exception
is decided by the worker's own rules (``_runner.Runner``), so a test sees what production would
store.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import os
import socket
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

from . import _durable, _sql
from ._runner import Runner
from ._util import dumps
from .app import App, Task
from .context import Context, ParentResult
from .errors import InvalidJob

LEASE_S = 300.0  # an attempt that runs longer finds its lease gone: 'lost', counted as such

_CLAIM_SQL = """
SELECT c.id, c.kind, c.payload, c.attempt, c.max_attempts, c.lease_token, c.parents, c.traceparent
  FROM pgjobq.claim_batch(CAST(:queue AS text), CAST(:n AS integer),
                          make_interval(secs => CAST(:lease AS double precision)), CAST(:worker AS text)) AS c
"""
_COMPLETE_SQL = """
SELECT m.outcome FROM pgjobq.complete_many(ARRAY[CAST(:id AS bigint)], ARRAY[CAST(:token AS bigint)],
                                           ARRAY[CAST(:result AS jsonb)]) AS m
"""
_FAIL_SQL = """
SELECT m.outcome FROM pgjobq.fail_many(ARRAY[CAST(:id AS bigint)], ARRAY[CAST(:token AS bigint)],
                                       ARRAY[CAST(:error AS text)],
                                       ARRAY[make_interval(secs => CAST(:delay AS double precision))],
                                       ARRAY[CAST(:permanent AS boolean)]) AS m
"""
_SNOOZE_SQL = """
SELECT m.outcome FROM pgjobq.snooze_many(ARRAY[CAST(:id AS bigint)], ARRAY[CAST(:token AS bigint)],
                                         ARRAY[CAST(:reason AS text)],
                                         ARRAY[make_interval(secs => CAST(:delay AS double precision))]) AS m
"""
_RELEASE_SQL = """
SELECT m.outcome FROM pgjobq.release_many(ARRAY[CAST(:id AS bigint)], ARRAY[CAST(:token AS bigint)],
                                          CAST(:reason AS text)) AS m
"""

# What the database answers, as run_inline counts it.
_COUNT = {"completed": "completed", "queued": "retried", "snoozed": "snoozed", "failed": "failed", "cancelled": "cancelled",
          "lost": "lost"}


class _Outcomes(Runner):
    """The coprocess side's decisions (Runner._raised, _returned), without its event loop and pool."""

    def __init__(self) -> None:  # noqa: D107 - nothing of the Runner's state is used
        pass


def _run_coroutine(coro: Any) -> Any:
    """Runs a coroutine to its end: here, or on a thread of its own when this thread already runs an
    event loop (a test under pytest-asyncio)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: List[Any] = []

    def run() -> None:
        try:
            box.append((True, asyncio.run(coro)))
        except BaseException as e:  # noqa: B036 - handed back to the caller's thread
            box.append((False, e))

    t = threading.Thread(target=run, name="pgjobq-inline")
    t.start()
    t.join()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _call(task: Task, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """The task's value, as the worker would get it (a sync task's timeout cannot stop it here)."""
    if task.is_async:
        coro = task.fn(*args, **kwargs)
        return _run_coroutine(asyncio.wait_for(coro, task.timeout) if task.timeout is not None else coro)
    value = task.fn(*args, **kwargs)
    return _run_coroutine(value) if inspect.isawaitable(value) else value


def _run_one(task: Task, ctx: Context) -> Tuple[str, Dict[str, Any]]:
    """(status, fields) as a coprocess would answer for this job."""
    decide = _Outcomes()
    args, kwargs = task._call_args(ctx.payload)
    try:
        task._payload_sig.bind(*args, **kwargs)
    except TypeError as e:
        return "failed", {"error": f"the payload does not fit {task.name}{task._payload_sig}: {e}"}
    if task.pass_context:
        args = (ctx,) + args
    try:
        value = _call(task, args, kwargs)
    except BaseException as e:  # noqa: B036 - whatever a task raises is its attempt's failure
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        if isinstance(e, _durable.Parked) or ctx._parked:
            return "parked", {}  # a sleep or a wait parked the job: nothing to write
        answer = decide._raised(ctx, task, e, task.timeout if task.is_async else None)
        return answer if answer is not None else ("retry", {"error": "the task was cancelled"})
    return decide._returned(ctx, task, value)


def _write(target: Any, job_id: int, token: int, status: str, fields: Dict[str, Any]) -> str:
    if status == "completed":
        result = fields.get("result")
        params: Dict[str, Any] = {"id": job_id, "token": token,
                                  "result": None if result is None else dumps(result, "the result", limit=False)}
        rows = _sql.run(target, _COMPLETE_SQL, params)
    elif status == "snooze":
        delay = fields.get("delay_ms")
        rows = _sql.run(target, _SNOOZE_SQL, {"id": job_id, "token": token,
                                              "reason": str(fields.get("reason", "")).replace("\x00", "\\0"),
                                              "delay": None if delay is None else delay / 1000.0})
        return "snoozed" if rows and rows[0][0] == "queued" else (str(rows[0][0]) if rows else "lost")
    else:
        delay = fields.get("delay_ms")
        params = {"id": job_id, "token": token, "error": str(fields.get("error", "")).replace("\x00", "\\0"),
                  "delay": None if delay is None else delay / 1000.0,
                  "permanent": "true" if status == "failed" else "false"}
        rows = _sql.run(target, _FAIL_SQL, params)
    return str(rows[0][0]) if rows else "lost"


def _parents(given: Any) -> List[ParentResult]:
    return [ParentResult(int(p.get("id")), str(p.get("state")), p.get("result"))
            for p in given if isinstance(p, dict)] if isinstance(given, list) else []


def run_inline(app: App, target: Any, queues: Optional[Iterable[str]], max_jobs: int) -> Dict[str, int]:
    if isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs < 1:
        raise InvalidJob(f"run_inline: max_jobs must be a positive int, not {max_jobs!r}")
    names = list(queues) if queues is not None else sorted({t.queue or app.queue for t in app.tasks.values()}
                                                           or {app.queue})
    worker = f"inline:{socket.gethostname()}:{os.getpid()}"[:255]
    counts: "collections.Counter[str]" = collections.Counter()
    handed_back: Dict[str, set] = {q: set() for q in names}
    ran = 0
    busy = True
    while busy and ran < max_jobs:
        busy = False
        for queue in names:
            while ran < max_jobs:
                # One job more than this call handed back in the queue: those come first again when due.
                rows = _sql.run(target, _CLAIM_SQL, {"queue": queue, "n": len(handed_back[queue]) + 1,
                                                     "lease": LEASE_S, "worker": worker})
                new = False
                for job_id, kind, payload, attempt, max_attempts, token, parents, traceparent in rows:
                    task = app.tasks.get(kind)
                    if task is None:
                        _sql.run(target, _RELEASE_SQL, {"id": job_id, "token": token,
                                                        "reason": f"no task for the kind {kind!r} in this App"})
                        if job_id not in handed_back[queue]:
                            handed_back[queue].add(job_id)
                            counts["handed_back"] += 1
                        continue
                    new = True
                    ctx = Context(int(job_id), queue, kind, int(attempt), int(max_attempts), payload, _parents(parents),
                                  time.monotonic() + LEASE_S, app, traceparent)
                    ctx._durable = _durable._Direct(target, int(job_id), int(token))
                    ctx._token = int(token)
                    status, fields = _run_one(task, ctx)
                    if status == "parked":
                        counts["parked"] += 1
                    else:
                        counts[_COUNT.get(_write(target, job_id, token, status, fields), "lost")] += 1
                    ran += 1
                if not new:
                    break
                busy = True
    return dict(counts)
