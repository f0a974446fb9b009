"""What a task sees of its job while it runs (``@app.task(pass_context=True)``)."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, List, Optional

from ._util import dumps
from .errors import InvalidJob

__all__ = ["Context", "ParentResult", "Cancelled"]


PROGRESS_MAX = 8192  # bytes of JSON text, as the worker takes it (PGJOBQ_PROGRESS_MAX)
_EVENT_LOCK = threading.Lock()  # a Context's event is made once, and set if it was cancelled before


class Cancelled(Exception):
    """Raised by ``ctx.raise_if_cancelled()`` in a sync task whose job was given up."""


@dataclasses.dataclass(frozen=True)
class ParentResult:
    """A parent of a job that waited for others: its id, final state and result."""

    id: int
    state: str
    result: Any


class Context:
    """The job a task runs, and whether it must stop.

    - ``id``, ``queue``, ``kind``, ``attempt`` (1 for the first run), ``max_attempts``, ``payload``
    - ``parents``: ``ParentResult`` for each job this one waited for (``after=``), in id order
    - ``deadline``: ``time.monotonic()`` value at which the job is given up; ``time_left()``
    - ``cancelled``: True once the worker gave the job up (cancelled by someone, timed out, lease
      lost, shutdown).  An async task is cancelled (``asyncio.CancelledError``) as well; a sync one
      cannot be interrupted and should look at ``ctx.cancelled`` (or call
      ``ctx.raise_if_cancelled()``, or wait on ``ctx.cancel_event``) between steps.
    """

    __slots__ = ("id", "queue", "kind", "attempt", "max_attempts", "payload", "parents", "deadline", "_event",
                 "_cancelled", "reason", "app", "_report")

    def __init__(self, id: int, queue: str, kind: str, attempt: int, max_attempts: int, payload: Any,
                 parents: List[ParentResult], deadline: float, app: Any = None) -> None:
        self.id = id
        self.queue = queue
        self.kind = kind
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.payload = payload
        self.parents = parents
        self.deadline = deadline
        self._event: Optional[threading.Event] = None  # made when first asked for: most jobs never are
        self._cancelled = False
        self.reason: Optional[str] = None
        self.app = app
        self._report: Optional[Callable[["Context", bytes], None]] = None  # the coprocess side's line writer

    @property
    def cancel_event(self) -> threading.Event:
        """A ``threading.Event`` set when the job is given up (for a sync task to wait on)."""
        event = self._event
        if event is not None:  # made already: no lock to take on each look
            return event
        with _EVENT_LOCK:
            if self._event is None:
                self._event = threading.Event()
                if self._cancelled:
                    self._event.set()
            return self._event

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def time_left(self) -> float:
        """Seconds until the job is given up (never negative)."""
        return max(0.0, self.deadline - time.monotonic())

    def set_progress(self, value: Any) -> None:
        """Reports the job's progress: any JSON value of at most 8 KiB (e.g. ``{"done": 40, "of":
        100}``).  The worker writes the latest value to the job, fenced by its lease, within about a
        second and before the job's outcome; ``pgjobq show``, the dashboard and ``app.get(id)`` show
        it, and it stays on the job in the history.  Callable from a sync task's thread or an async
        task.  ``InvalidJob`` for what JSON cannot hold or what is too long; outside a worker (a task
        called directly) it does nothing."""
        text = dumps(value, f"job {self.id}: progress", limit=False)
        data = text.encode()
        if len(data) > PROGRESS_MAX:
            raise InvalidJob(f"job {self.id}: progress is {len(data)} bytes of JSON; at most {PROGRESS_MAX}")
        if self._report is not None and not self._cancelled:
            self._report(self, data)

    def raise_if_cancelled(self) -> None:
        if self._cancelled:
            raise Cancelled(self.reason or "the job was given up")

    def _cancel(self, reason: str) -> None:
        with _EVENT_LOCK:
            if self._cancelled:
                return
            self.reason = reason
            self._cancelled = True
            if self._event is not None:
                self._event.set()

    def __repr__(self) -> str:
        return f"<pgjobq.Context job {self.id} {self.kind!r} attempt {self.attempt}/{self.max_attempts}>"
