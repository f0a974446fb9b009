"""pgjobq for Python: a job queue in the PostgreSQL you already run.

- Enqueue through pgjobq's SQL API on your own connection or session (psycopg 3 sync and async,
  psycopg2, SQLAlchemy 1.4 and 2.x), inside your transaction: the job exists if and only if your
  data commits.  ``enqueue``, ``enqueue_many`` (one statement), ``enqueue_graph``,
  ``enqueue_batch``.
- Tasks as functions: ``app = pgjobq.App()``, ``@app.task``, ``task.defer(session, *args, **kwargs)``,
  ``task.delay(*args, **kwargs)``, ``@app.periodic("0 3 * * *", tz="Europe/Berlin")``;
  ``app.run_inline()`` runs the due jobs in the calling process (tests).
- Run them with the C engine: ``python3 -m pgjobq worker myapp.tasks:app --queue mail:32``.
- Look and act: ``app.get``, ``app.result``, ``app.cancel``, ``app.retry``, ``app.pause``...

docs/python.md is the tour.
"""

from typing import Any, Optional

from .app import App, Deferrer, Periodic, Task, exponential_backoff
from .context import Cancelled, Context, ParentResult
from ._enqueue import (
    Batch,
    Enqueued,
    JobSpec,
    enqueue,
    enqueue_async,
    enqueue_batch,
    enqueue_batch_async,
    enqueue_graph,
    enqueue_graph_async,
    enqueue_many,
    enqueue_many_async,
    forward,
    forward_async,
)
from ._durable import EventTimeout, LeaseLost, Parked
from ._cluster import current as _cluster_current
from ._durable import send_event as _send_event, send_event_async as _send_event_async
from ._durable import send_event_cluster as _send_event_cluster, send_event_cluster_async as _send_event_cluster_async
from ._txn import TransactionWarning
from .errors import (
    DuplicateJob,
    Fail,
    InvalidArgument,
    InvalidJob,
    JobCancelled,
    JobFailed,
    JobNotFound,
    PermissionDenied,
    PgjobqError,
    ResultTimeout,
    Retry,
    SchemaMissing,
    Snooze,
    ShardUnavailable,
    TransactionConflict,
    WrongShard,
)
from ._jobs import (
    JobInfo,
    ParkInfo,
    StepInfo,
    QueueInfo,
    cancel,
    cancel_where,
    get,
    pause,
    queues,
    result,
    resume,
    retry,
    retry_running,
    retry_where,
    set_limits,
    skip,
)



def send_event(conn: Any, name: str, key: Optional[str] = None, payload: Any = None) -> int:
    """``pgjobq.send_event`` on ``conn`` (your connection or session: in your transaction; a URL:
    committed): resumes the jobs parked in ``ctx.wait_for_event(name, key)`` with ``payload``, and
    keeps the event 7 days for the waits that begin later.  Returns how many jobs it resumed.  None:
    the configured database, or with $PGJOBQ_CLUSTER set every shard of that cluster, each in a
    transaction of its own (``App.send_event``)."""
    cl = _cluster_current() if conn is None else None
    if cl is not None:
        return _send_event_cluster(cl, name, key, payload)
    return _send_event(conn, name, key, payload)


async def send_event_async(conn: Any, name: str, key: Optional[str] = None, payload: Any = None) -> int:
    """``send_event`` on a psycopg ``AsyncConnection`` (or a URL)."""
    cl = _cluster_current() if conn is None else None
    if cl is not None:
        return await _send_event_cluster_async(cl, name, key, payload)
    return await _send_event_async(conn, name, key, payload)


__version__ = "0.1.0"

__all__ = [
    "App", "Task", "Deferrer", "Periodic", "exponential_backoff",
    "Context", "ParentResult", "Cancelled",
    "JobSpec", "Enqueued", "Batch",
    "enqueue", "enqueue_many", "enqueue_graph", "enqueue_batch", "forward", "forward_async",
    "enqueue_async", "enqueue_many_async", "enqueue_graph_async", "enqueue_batch_async",
    "JobInfo", "StepInfo", "ParkInfo", "QueueInfo", "get", "result", "cancel", "retry", "retry_running", "retry_where", "cancel_where",
    "skip", "pause", "resume", "set_limits", "queues",
    "PgjobqError", "InvalidArgument", "InvalidJob", "DuplicateJob", "PermissionDenied", "SchemaMissing",
    "TransactionConflict", "WrongShard", "ShardUnavailable", "JobNotFound", "JobFailed", "JobCancelled", "ResultTimeout",
    "Retry", "Snooze", "Fail", "TransactionWarning",
    "send_event", "send_event_async", "Parked", "EventTimeout", "LeaseLost",
    "__version__",
]
