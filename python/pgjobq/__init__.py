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
)

__version__ = "0.1.0"

__all__ = [
    "App", "Task", "Deferrer", "Periodic", "exponential_backoff",
    "Context", "ParentResult", "Cancelled",
    "JobSpec", "Enqueued", "Batch",
    "enqueue", "enqueue_many", "enqueue_graph", "enqueue_batch", "forward", "forward_async",
    "enqueue_async", "enqueue_many_async", "enqueue_graph_async", "enqueue_batch_async",
    "JobInfo", "QueueInfo", "get", "result", "cancel", "retry", "retry_running", "retry_where", "cancel_where",
    "pause", "resume", "set_limits", "queues",
    "PgjobqError", "InvalidArgument", "InvalidJob", "DuplicateJob", "PermissionDenied", "SchemaMissing",
    "TransactionConflict", "WrongShard", "ShardUnavailable", "JobNotFound", "JobFailed", "JobCancelled", "ResultTimeout",
    "Retry", "Snooze", "Fail", "TransactionWarning",
    "__version__",
]
