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
    - ``traceparent``: the W3C trace context the job was enqueued with (None: none), to continue its
      trace in the task (docs/queues.md, "Trace context")
    - ``deadline``: ``time.monotonic()`` value at which the job is given up; ``time_left()``
    - ``cancelled``: True once the worker gave the job up (cancelled by someone, timed out, lease
      lost, shutdown).  An async task is cancelled (``asyncio.CancelledError``) as well; a sync one
      cannot be interrupted and should look at ``ctx.cancelled`` (or call
      ``ctx.raise_if_cancelled()``, or wait on ``ctx.cancel_event``) between steps.
    """

    __slots__ = ("id", "queue", "kind", "attempt", "max_attempts", "payload", "parents", "deadline", "traceparent",
                 "_event",
                 "_cancelled", "reason", "app", "_report", "_durable", "_token", "_parked", "_unnamed_sleeps",
                 "_unnamed_waits")

    def __init__(self, id: int, queue: str, kind: str, attempt: int, max_attempts: int, payload: Any,
                 parents: List[ParentResult], deadline: float, app: Any = None,
                 traceparent: Optional[str] = None) -> None:
        self.id = id
        self.queue = queue
        self.kind = kind
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.payload = payload
        self.parents = parents
        self.deadline = deadline
        self.traceparent = traceparent
        self._event: Optional[threading.Event] = None  # made when first asked for: most jobs never are
        self._cancelled = False
        self.reason: Optional[str] = None
        self.app = app
        self._report: Optional[Callable[["Context", bytes], None]] = None  # the coprocess side's line writer
        self._durable: Any = None  # where steps, sleeps and waits go (_durable._Lines or _Direct)
        self._token: Optional[int] = None  # the job's lease token, for a step with transaction=True
        self._parked = False  # a sleep or a wait parked the job: its attempt is over
        self._unnamed_sleeps = 0
        self._unnamed_waits = 0

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

    # -- durable execution (docs/durable.md) ----------------------------------------------------
    def step(self, name: str, fn: Callable[..., Any], *, transaction: bool = False) -> Any:
        """Runs the step ``name`` of the job once: its result (any JSON value) is stored on the job,
        fenced by the lease, and a later attempt (after a retry, a sleep, a crash) gets the stored
        result without calling ``fn``.  ``fn()`` is called with no argument; with
        ``transaction=True``, ``fn(conn)`` gets a connection of the package's own to the App's
        database (psycopg 3, else psycopg2), in the transaction that stores the result: its writes
        commit with the result, exactly once, or are rolled back when the lease was lost
        (``LeaseLost``).  An exception of ``fn`` stores nothing and goes on up.  For a sync task;
        ``await ctx.step_async(...)`` in an async one."""
        from . import _durable

        return _durable.step(self, name, fn, transaction)

    async def step_async(self, name: str, fn: Callable[..., Any], *, transaction: bool = False) -> Any:
        """``step`` for an async task: ``fn`` may be a coroutine function; with ``transaction=True``
        it gets a psycopg ``AsyncConnection`` in the transaction."""
        from . import _durable

        return await _durable.step_async(self, name, fn, transaction)

    def sleep(self, duration: Any, *, name: Optional[str] = None) -> None:
        """A durable sleep: the first time, its end (the database's now + ``duration``: seconds, a
        ``timedelta`` or ``"2h"``; at most 100 years) is stored and the job is parked until then:
        ``pgjobq.Parked`` is raised, which ends the attempt (let it out of the task): no attempt is
        used, the worker's slot and the lease are freed.  The attempt that runs at its end comes to
        the same sleep (its steps replayed from storage) and goes on.  ``name`` is its step's name
        (None: ``sleep#N``, counting the unnamed sleeps of this run)."""
        from . import _durable

        _durable.sleep(self, duration, name)

    async def sleep_async(self, duration: Any, *, name: Optional[str] = None) -> None:
        from . import _durable

        await _durable.sleep_async(self, duration, name)

    def wait_for_event(self, event: str, key: Optional[str] = None, *, timeout: Any = None,
                       name: Optional[str] = None) -> Any:
        """Waits for the event (``event``, ``key``) that ``pgjobq.send_event`` sends, and returns its
        payload: the first one of that name and key still kept (events are kept 7 days, so one sent
        before the wait began counts), or, when none is there yet, the job is parked
        (``pgjobq.Parked``, as ``sleep``) until it comes or ``timeout`` passes (counted from the
        wait's first call; None: 100 years), and the attempt that resumes it gets the payload here
        (``EventTimeout`` when the timeout came first).  The answer is stored: every later attempt
        gets the same.  ``name`` as ``sleep``'s (None: ``wait#N``)."""
        from . import _durable

        return _durable.wait_for_event(self, event, key, timeout, name)

    async def wait_for_event_async(self, event: str, key: Optional[str] = None, *, timeout: Any = None,
                                   name: Optional[str] = None) -> Any:
        from . import _durable

        return await _durable.wait_for_event_async(self, event, key, timeout, name)

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
