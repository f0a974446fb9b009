"""Tasks as functions: ``App``, ``@app.task``, ``@app.periodic``."""

from __future__ import annotations

import builtins
import dataclasses
import dis
import inspect
import random
import types
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Union, overload

from . import _enqueue as _enq, _jobs, _sql
from ._util import NAME, Duration, check_json, dumps, seconds
from ._enqueue import Batch, Enqueued, JobSpec
from .errors import InvalidArgument, InvalidJob
from ._jobs import UNSET, JobInfo, QueueInfo

__all__ = ["App", "Task", "Periodic", "exponential_backoff"]

Backoff = Union[None, Duration, Callable[[int], Duration]]

# What .configure() and .spec() accept besides the payload.
_JOB_OPTIONS = ("queue", "priority", "run_at", "delay", "max_attempts", "unique_key", "concurrency_key", "after",
                "tags", "on_parent_failure", "ref")


def exponential_backoff(first: Duration = 1.0, factor: float = 2.0, max: Duration = 3600.0,
                        jitter: float = 0.1) -> Callable[[int], float]:
    """A retry_backoff: ``first * factor ** (attempt - 1)`` seconds, at most ``max``, ±``jitter``
    (a fraction)."""
    f, cap = seconds(first, "first"), seconds(max, "max")

    def backoff(attempt: int) -> float:
        d = min(cap, f * factor ** builtins.max(attempt - 1, 0))
        return d * (1 + random.uniform(-jitter, jitter)) if jitter else d

    return backoff



# What lets a coroutine suspend: await, async with and async for compile to these.
_SUSPENDS = frozenset({"GET_AWAITABLE", "SEND", "YIELD_VALUE", "YIELD_FROM", "BEFORE_ASYNC_WITH", "GET_AITER",
                       "GET_ANEXT", "END_ASYNC_FOR"})


def _never_suspends(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is an ``async def`` whose body has no await, async with or async for: its
    coroutine runs to its end in one step, so the coprocess side runs it without an asyncio Task."""
    if not isinstance(fn, types.FunctionType) or not inspect.iscoroutinefunction(fn):
        return False
    try:
        return not any(i.opname in _SUSPENDS for i in dis.get_instructions(fn.__code__))
    except Exception:  # noqa: BLE001 - an unusual code object: the general path
        return False


def _check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise InvalidArgument(f"{what} {value!r} is not a name: a letter, then up to 63 letters, digits, _ . : -")
    return value


class Task:
    """A function registered with ``@app.task``.  Calling it runs the function directly; ``defer``
    enqueues a job that a worker (``python3 -m pgjobq worker``) runs."""

    def __init__(self, app: "App", fn: Callable[..., Any], *, name: Optional[str], queue: Optional[str],
                 priority: Optional[int], max_attempts: Optional[int], timeout: Optional[Duration],
                 retry_backoff: Backoff, pass_context: bool) -> None:
        self.app = app
        self.fn = fn
        self.name = _check_name(name or fn.__name__, "task name")
        self.queue = _check_name(queue, "queue") if queue is not None else None
        self.priority = priority
        self.max_attempts = max_attempts
        self.timeout = None if timeout is None else seconds(timeout, f"task {self.name}: timeout")
        if retry_backoff is not None and not callable(retry_backoff):
            seconds(retry_backoff, f"task {self.name}: retry_backoff")  # checked now
        self.retry_backoff = retry_backoff
        self.pass_context = pass_context
        self.is_async = inspect.iscoroutinefunction(fn)
        self._at_once = _never_suspends(fn)
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        if pass_context:
            if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                    inspect.Parameter.POSITIONAL_OR_KEYWORD):
                raise TypeError(f"task {self.name}: pass_context=True needs a first positional parameter for the context")
            params = params[1:]
        self._payload_sig = sig.replace(parameters=params)
        # What a payload of keyword arguments may hold, to check it without Signature.bind (a tenth of
        # a no-op task's time in the worker); None when the signature needs bind's rules.
        P = inspect.Parameter
        self._kw_names: Optional[FrozenSet[str]] = None
        self._kw_required: FrozenSet[str] = frozenset()
        self._kw_any = any(p.kind is P.VAR_KEYWORD for p in params)
        if all(p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY, P.VAR_KEYWORD) for p in params):
            self._kw_names = frozenset(p.name for p in params if p.kind is not P.VAR_KEYWORD)
            self._kw_required = frozenset(p.name for p in params
                                          if p.kind is not P.VAR_KEYWORD and p.default is P.empty)
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", self.name)
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<pgjobq.Task {self.name!r} queue={self.queue or self.app.queue!r}>"

    # -- the payload -----------------------------------------------------------------------------
    def payload(self, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """The JSON payload for these keyword arguments, checked against the function's signature
        and JSON's types (InvalidJob otherwise): nothing is sent before this passes."""
        try:
            self._payload_sig.bind(**kwargs)
        except TypeError as e:
            raise InvalidJob(f"{self.name}.defer: {e} (the task is {self.name}{self._payload_sig})") from None
        check_json(kwargs, f"{self.name}.defer: argument")
        return kwargs

    def _fits(self, kwargs: Dict[str, Any]) -> bool:
        """Whether the function takes these keyword arguments (what ``Signature.bind`` would say, for
        the signatures it is computed for; bind itself for the others)."""
        names = self._kw_names
        if names is not None:
            keys = kwargs.keys()
            return self._kw_required <= keys and (self._kw_any or keys <= names)
        try:
            self._payload_sig.bind(**kwargs)
        except TypeError:
            return False
        return True

    def backoff_delay(self, attempt: int) -> Optional[float]:
        """Seconds before the next attempt after a failed one, or None for the database's backoff."""
        b = self.retry_backoff
        if b is None:
            return None
        return seconds(b(attempt) if callable(b) else b, f"task {self.name}: retry_backoff")

    # -- enqueueing --------------------------------------------------------------------------------
    def configure(self, **options: Any) -> "Deferrer":
        """Job options for one defer: queue, priority, run_at, delay, max_attempts, unique_key,
        concurrency_key, after, tags, on_parent_failure, ref, on_duplicate."""
        return Deferrer(self, options)

    def spec(self, **kwargs: Any) -> JobSpec:
        """A JobSpec of this task (for enqueue_many, enqueue_graph, enqueue_batch)."""
        return Deferrer(self, {}).spec(**kwargs)

    def defer(self, conn: Any = None, /, **kwargs: Any) -> Enqueued:
        """Enqueues a job of this task with the keyword arguments as its payload, on ``conn`` (a
        connection or session: in its transaction; None: the App's own connection, committed)."""
        return Deferrer(self, {}).defer(conn, **kwargs)

    async def defer_async(self, conn: Any = None, /, **kwargs: Any) -> Enqueued:
        """defer() on a psycopg AsyncConnection (None: an async connection of the App's own)."""
        return await Deferrer(self, {}).defer_async(conn, **kwargs)


class Deferrer:
    """``task.configure(...)``: a task with job options, to defer or to build specs."""

    def __init__(self, task: Task, options: Dict[str, Any]) -> None:
        unknown = set(options) - set(_JOB_OPTIONS) - {"on_duplicate"}
        if unknown:
            raise TypeError(f"{task.name}.configure: unknown option(s) {', '.join(sorted(unknown))} "
                            f"(options: {', '.join(_JOB_OPTIONS)}, on_duplicate)")
        self.task = task
        self.options = dict(options)

    def configure(self, **options: Any) -> "Deferrer":
        """More options (the later ones win)."""
        return Deferrer(self.task, {**self.options, **options})

    def spec(self, **kwargs: Any) -> JobSpec:
        t = self.task
        o = {k: v for k, v in self.options.items() if k != "on_duplicate"}
        o.setdefault("queue", t.queue or t.app.queue)
        if t.priority is not None:
            o.setdefault("priority", t.priority)
        if t.max_attempts is not None:
            o.setdefault("max_attempts", t.max_attempts)
        return JobSpec(kind=t.name, payload=t.payload(kwargs), **o)

    def defer(self, conn: Any = None, /, **kwargs: Any) -> Enqueued:
        spec = self.spec(**kwargs)
        return self.task.app._enqueue_spec(conn, spec, self.options.get("on_duplicate", "return"))

    async def defer_async(self, conn: Any = None, /, **kwargs: Any) -> Enqueued:
        spec = self.spec(**kwargs)
        return await self.task.app._enqueue_spec_async(conn, spec, self.options.get("on_duplicate", "return"))


@dataclasses.dataclass
class Periodic:
    """A schedule of the App: ``task`` enqueued at every fire time of ``cron`` in ``tz``."""

    task: Task
    cron: str
    tz: str
    key: str
    kwargs: Dict[str, Any]
    queue: Optional[str]
    priority: Optional[int]
    max_attempts: Optional[int]
    catch_up: str

    def schedule_name(self, app: "App") -> str:
        return f"{app.name}:{self.key}" if app.name else self.key

    def row(self, app: "App") -> Dict[str, Any]:
        t = self.task
        return {
            "name": self.schedule_name(app),
            "cron": self.cron.strip(),
            "tz": self.tz,
            "queue": self.queue or t.queue or app.queue,
            "kind": t.name,
            "payload": self.kwargs,
            "priority": self.priority if self.priority is not None else (t.priority or 0),
            "max_attempts": self.max_attempts if self.max_attempts is not None else (t.max_attempts or 25),
            "catch_up": self.catch_up,
        }


_SCHEDULES_SQL = """
SELECT CAST(s.name AS text), s.cron, s.tz, CAST(s.queue AS text), CAST(s.kind AS text), CAST(s.payload AS jsonb),
       s.priority, s.max_attempts, s.catch_up, s.enabled
  FROM pgjobq.schedule_list() AS s
"""

_SCHEDULE_SET_SQL = """
SELECT pgjobq.schedule_set(CAST(:name AS text), CAST(:cron AS text), CAST(:tz AS text), CAST(:queue AS text),
                           CAST(:kind AS text), CAST(:payload AS jsonb), CAST(:priority AS smallint),
                           CAST(:max_attempts AS integer), CAST(:catch_up AS text))
"""


class App:
    """Tasks, schedules, and the database they use.

    ``database_url`` is used whenever no connection is given (else ``$PGJOBQ_DATABASE_URL``, else
    ``$DATABASE_URL``, read when needed).  ``name`` prefixes the names of the App's schedules
    (``name:task``) and lets ``sync_schedules`` delete the ones the App no longer has.  ``queue`` is
    the queue of tasks that name none."""

    def __init__(self, database_url: Optional[str] = None, *, name: Optional[str] = None,
                 queue: str = "default") -> None:
        self.database_url = database_url
        self.name = _check_name(name, "App name") if name is not None else None
        self.queue = _check_name(queue, "queue")
        self.tasks: Dict[str, Task] = {}
        self.periodics: List[Periodic] = []

    def __repr__(self) -> str:
        return f"<pgjobq.App {self.name or ''} tasks={sorted(self.tasks)}>"

    # -- registering -------------------------------------------------------------------------------
    @overload
    def task(self, fn: Callable[..., Any]) -> Task: ...

    @overload
    def task(self, fn: None = None, *, name: Optional[str] = None, queue: Optional[str] = None,
             priority: Optional[int] = None, max_attempts: Optional[int] = None, timeout: Optional[Duration] = None,
             retry_backoff: Backoff = None, pass_context: bool = False) -> Callable[[Callable[..., Any]], Task]: ...

    def task(self, fn: Optional[Callable[..., Any]] = None, *, name: Optional[str] = None,
             queue: Optional[str] = None, priority: Optional[int] = None, max_attempts: Optional[int] = None,
             timeout: Optional[Duration] = None, retry_backoff: Backoff = None,
             pass_context: bool = False) -> Union[Task, Callable[[Callable[..., Any]], Task]]:
        """Registers a function (``def`` or ``async def``) as a task; usable bare (``@app.task``) or
        with options.  ``name`` is the job kind (default: the function's name); ``queue``,
        ``priority`` and ``max_attempts`` are defaults for its jobs; ``timeout`` (seconds, "30s")
        gives an attempt up (an async task is cancelled; a sync one sees ``ctx.cancelled``) as a
        failed attempt; ``retry_backoff`` (seconds, or a function of the attempt number returning
        seconds; ``exponential_backoff()``) is the delay after a failed attempt (default: the
        database's ``pgjobq.backoff``); ``pass_context`` gives the function a ``pgjobq.Context``
        as its first argument."""

        def register(f: Callable[..., Any]) -> Task:
            t = Task(self, f, name=name, queue=queue, priority=priority, max_attempts=max_attempts, timeout=timeout,
                     retry_backoff=retry_backoff, pass_context=pass_context)
            if t.name in self.tasks and self.tasks[t.name].fn is not f:
                raise InvalidArgument(f"two tasks are named {t.name!r}: give one of them name=...")
            self.tasks[t.name] = t
            return t

        if fn is not None:
            return register(fn)
        return register

    def periodic(self, cron: str, *, tz: str = "UTC", name: Optional[str] = None,
                 kwargs: Optional[Dict[str, Any]] = None, queue: Optional[str] = None,
                 priority: Optional[int] = None, max_attempts: Optional[int] = None,
                 catch_up: str = "latest") -> Callable[[Any], Task]:
        """Runs a task on a cron schedule (5 or 6 fields) in a time zone, with ``kwargs`` as its
        payload: ``@app.periodic("0 3 * * *", tz="Europe/Berlin")`` above ``@app.task`` (or on a
        plain function, which becomes a task).  The schedule lives in ``pgjobq.schedules`` once
        ``sync_schedules`` (which ``python3 -m pgjobq worker`` runs at start) has written it; every
        worker then ticks it and each fire time enqueues exactly once.  ``catch_up``: 'latest',
        'all' or 'skip' (fire times missed while no worker ran)."""
        if catch_up not in ("latest", "all", "skip"):
            raise InvalidArgument(f"catch_up must be 'latest', 'all' or 'skip', not {catch_up!r}")

        def register(obj: Any) -> Task:
            t = obj if isinstance(obj, Task) else self.task(obj)
            assert isinstance(t, Task)
            key = _check_name(name or t.name, "schedule name")
            p = Periodic(t, cron, tz, key, dict(kwargs or {}), queue, priority, max_attempts, catch_up)
            if any(q.key == key for q in self.periodics):
                raise InvalidArgument(f"two schedules are named {key!r}: give one of them name=...")
            _check_name(p.schedule_name(self), "schedule name")
            t.payload(p.kwargs)
            self.periodics.append(p)
            return t

        return register

    # -- schedules --------------------------------------------------------------------------------
    def sync_schedules(self, conn: Any = None) -> int:
        """Writes the App's schedules to ``pgjobq.schedules`` in one transaction: creates the
        missing ones, replaces the changed ones (their next run is recomputed), leaves the
        unchanged ones as they are (their next run, and an operator's ``enabled = false``), and,
        when the App has a name, deletes schedules named ``name:...`` that the App no longer has.
        Returns how many it created, changed or deleted.  Needs the pgjobq_admin role."""
        wanted = {p.schedule_name(self): p.row(self) for p in self.periodics}
        changes = 0
        with _sql.transaction(conn, self.database_url) as db:
            have = {r[0]: r for r in _sql.run(db, _SCHEDULES_SQL, {})}
            for sname, row in wanted.items():
                old = have.get(sname)
                if old is not None and list(old[1:9]) == [row["cron"], row["tz"], row["queue"], row["kind"],
                                                           row["payload"], row["priority"], row["max_attempts"],
                                                           row["catch_up"]]:
                    continue
                params = dict(row)
                params["payload"] = dumps(row["payload"], f"schedule {sname}: kwargs")
                _sql.run(db, _SCHEDULE_SET_SQL, params)
                changes += 1
            if self.name:
                prefix = self.name + ":"
                for sname in have:
                    if sname.startswith(prefix) and sname not in wanted:
                        _sql.run(db, "SELECT pgjobq.schedule_delete(CAST(:name AS text))", {"name": sname})
                        changes += 1
        return changes

    # -- enqueueing without a task --------------------------------------------------------------------
    def _target(self, conn: Any) -> Any:
        return self.database_url if conn is None else conn

    def _enqueue_spec(self, conn: Any, spec: JobSpec, on_duplicate: str) -> Enqueued:
        return _enq.enqueue(self._target(conn), on_duplicate=on_duplicate, **_spec_options(spec))

    async def _enqueue_spec_async(self, conn: Any, spec: JobSpec, on_duplicate: str) -> Enqueued:
        return await _enq.enqueue_async(self._target(conn), on_duplicate=on_duplicate, **_spec_options(spec))

    def enqueue(self, kind: Optional[str] = None, payload: Any = None, *, conn: Any = None,
                on_duplicate: str = "return", **options: Any) -> Enqueued:
        """pgjobq.enqueue() with the App's database when ``conn`` is None."""
        options.setdefault("queue", self.queue)
        return _enq.enqueue(self._target(conn), kind, payload, on_duplicate=on_duplicate, **options)

    def enqueue_many(self, jobs: Iterable[JobSpec], *, conn: Any = None, on_duplicate: str = "return") -> List[Enqueued]:
        return _enq.enqueue_many(self._target(conn), jobs, on_duplicate=on_duplicate)

    def enqueue_graph(self, jobs: Sequence[JobSpec], *, conn: Any = None) -> Dict[str, int]:
        return _enq.enqueue_graph(self._target(conn), jobs)

    def enqueue_batch(self, jobs: Sequence[JobSpec], callback: JobSpec, *, conn: Any = None) -> Batch:
        return _enq.enqueue_batch(self._target(conn), jobs, callback)

    # -- looking and acting ---------------------------------------------------------------------------
    def get(self, job_id: int, *, conn: Any = None) -> Optional[JobInfo]:
        return _jobs.get(self._target(conn), job_id)

    def result(self, job_id: int, timeout: Optional[Duration] = 30.0, *, conn: Any = None, poll: Duration = 0.5) -> Any:
        return _jobs.result(self._target(conn), job_id, timeout, poll=poll)

    def cancel(self, job_id: int, *, conn: Any = None) -> str:
        return _jobs.cancel(self._target(conn), job_id)

    def retry(self, job_id: int, *, conn: Any = None) -> str:
        return _jobs.retry(self._target(conn), job_id)

    def retry_running(self, job_id: int, *, conn: Any = None) -> str:
        return _jobs.retry_running(self._target(conn), job_id)

    def retry_where(self, queue: str, state: str, *, kind: Optional[str] = None, since: Optional[Duration] = None,
                    dry_run: bool = False, conn: Any = None) -> Dict[str, int]:
        return _jobs.retry_where(self._target(conn), queue, state, kind=kind, since=since, dry_run=dry_run)

    def cancel_where(self, queue: str, state: str, *, kind: Optional[str] = None, since: Optional[Duration] = None,
                     dry_run: bool = False, conn: Any = None) -> int:
        return _jobs.cancel_where(self._target(conn), queue, state, kind=kind, since=since, dry_run=dry_run)

    def pause(self, queue: str, reason: Optional[str] = None, *, conn: Any = None) -> bool:
        return _jobs.pause(self._target(conn), queue, reason)

    def resume(self, queue: str, *, conn: Any = None) -> bool:
        return _jobs.resume(self._target(conn), queue)

    def set_limits(self, queue: str, *, concurrency: Optional[int] = UNSET, key_concurrency: Optional[int] = UNSET,
                   rate_limit: Optional[int] = UNSET, rate_period: Optional[Duration] = UNSET,
                   max_lease: Optional[Duration] = UNSET, conn: Any = None) -> None:
        _jobs.set_limits(self._target(conn), queue, concurrency=concurrency, key_concurrency=key_concurrency,
                         rate_limit=rate_limit, rate_period=rate_period, max_lease=max_lease)

    def queues(self, *, conn: Any = None) -> List[QueueInfo]:
        return _jobs.queues(self._target(conn))


def _spec_options(spec: JobSpec) -> Dict[str, Any]:
    d = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    return {k: v for k, v in d.items() if v is not None}
