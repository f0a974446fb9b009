"""Tasks as functions: ``App``, ``@app.task``, ``@app.periodic``."""

from __future__ import annotations

import builtins
import dataclasses
import dis
import inspect
import random
import types
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Union, overload

from . import _cluster, _enqueue as _enq, _jobs, _sql
from ._util import Duration, check_json, delay_seconds, dumps, is_name, seconds
from ._enqueue import Batch, Enqueued, JobSpec
from .errors import InvalidArgument, InvalidJob, JobNotFound, ShardUnavailable
from ._jobs import UNSET, JobInfo, QueueInfo

__all__ = ["App", "Task", "Periodic", "exponential_backoff"]

Backoff = Union[None, Duration, Callable[[int], Duration]]
Exceptions = Union[None, type, Sequence[type]]

# The attempts of a task's job when neither the task nor the App names a number (App(max_attempts=)).
# Ten, with the database's backoff (2 s, doubling), retry for about 17 minutes: a restart, a deploy, an
# outage of a few minutes; a bug fails for good within the half hour instead of retrying for a day, as
# the SQL API's default (25, capped at an hour) would.  Other clients keep that default.
DEFAULT_MAX_ATTEMPTS = 10

# What .configure() and .spec() accept besides the payload.
_JOB_OPTIONS = ("queue", "priority", "run_at", "delay", "max_attempts", "unique_key", "on_conflict", "unique_for",
                "concurrency_key", "after", "tags", "on_parent_failure", "ref", "route_key", "expire_after",
                "expires_at", "traceparent")


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


def _exceptions(value: Exceptions, what: str) -> Optional[tuple]:
    """``retry_on`` / ``fail_on``: an exception class or a sequence of them, as a tuple (isinstance's
    form); None stays None."""
    if value is None:
        return None
    items = (value,) if isinstance(value, type) else tuple(value) if isinstance(value, (list, tuple, set, frozenset)) else None
    if items is None or not all(isinstance(c, type) and issubclass(c, BaseException) for c in items):
        raise TypeError(f"{what} must be an exception class or a tuple of them, not {value!r}")
    return items


def _check_name(value: str, what: str) -> str:
    if not is_name(value):
        raise InvalidArgument(f"{what} {value!r} is not a name: a letter, then up to 63 letters, digits, _ . : -")
    return value


class Task:
    """A function registered with ``@app.task``.  Calling it runs the function directly; ``defer``
    enqueues a job that a worker (``python3 -m pgjobq worker``) runs."""

    def __init__(self, app: "App", fn: Callable[..., Any], *, name: Optional[str], queue: Optional[str],
                 priority: Optional[int], max_attempts: Optional[int], timeout: Optional[Duration],
                 retry_backoff: Backoff, pass_context: bool, retry_on: Exceptions = None,
                 fail_on: Exceptions = None) -> None:
        self.app = app
        self.fn = fn
        self.name = _check_name(name or fn.__name__, "task name")
        self.queue = _check_name(queue, "queue") if queue is not None else None
        self.priority = priority
        self.max_attempts = max_attempts
        self.timeout = None if timeout is None else seconds(timeout, f"task {self.name}: timeout")
        if retry_backoff is not None and not callable(retry_backoff):
            delay_seconds(retry_backoff, f"task {self.name}: retry_backoff")  # checked now
        self.retry_backoff = retry_backoff
        self.retry_on = _exceptions(retry_on, f"task {self.name}: retry_on")
        self.fail_on = _exceptions(fail_on, f"task {self.name}: fail_on")
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
        P = inspect.Parameter
        # Positional-only and *args parameters travel in the payload under their names; a worker
        # passes them back positionally (_call_args).  None for the usual signature.
        pos_only = tuple(p.name for p in params if p.kind is P.POSITIONAL_ONLY)
        var_pos = next((p.name for p in params if p.kind is P.VAR_POSITIONAL), None)
        self._unpack = (pos_only, var_pos) if pos_only or var_pos else None
        # What a payload of keyword arguments may hold, to check it without Signature.bind (a tenth of
        # a no-op task's time in the worker); None when the signature needs bind's rules.
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
    def payload(self, kwargs: Dict[str, Any], args: Sequence[Any] = (), how: str = "defer") -> Dict[str, Any]:
        """The JSON payload for these arguments, checked against the function's signature and JSON's
        types (InvalidJob otherwise, naming the signature): nothing is sent before this passes.  The
        payload is a JSON object of the arguments by name: positional arguments are named by the
        parameters they bind to (``add.delay(2, 3)`` is ``{"a": 2, "b": 3}``), so a job is the same
        however it was deferred, and any client can enqueue one."""
        try:
            bound = self._payload_sig.bind(*args, **kwargs)
        except TypeError as e:
            raise InvalidJob(f"{self.name}.{how}: {e} (the task is {self.name}{self._payload_sig})") from None
        if args:
            kwargs = self._by_name(bound, how)
        check_json(kwargs, f"{self.name}.{how}: argument")
        return kwargs

    def _by_name(self, bound: inspect.BoundArguments, how: str) -> Dict[str, Any]:
        P = inspect.Parameter
        out: Dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = self._payload_sig.parameters[name].kind
            items = value.items() if kind is P.VAR_KEYWORD else [(name, list(value) if kind is P.VAR_POSITIONAL else value)]
            for k, v in items:
                if k in out:
                    raise InvalidJob(f"{self.name}.{how}: the argument {k!r} would be given twice "
                                     f"(the task is {self.name}{self._payload_sig})")
                out[k] = v
        return out

    def _call_args(self, payload: Any) -> Any:
        """(args, kwargs) to call the function with for a job's payload: a JSON object is the
        arguments by name (positional-only and ``*args`` parameters taken out of it and passed
        positionally); any other JSON value, from another client, is the one positional argument."""
        if not isinstance(payload, dict):
            return (payload,), {}
        if self._unpack is None:
            return (), payload
        pos_only, var_pos = self._unpack
        kwargs = dict(payload)
        args = [kwargs.pop(n) for n in pos_only if n in kwargs]
        if var_pos is not None and isinstance(kwargs.get(var_pos), list):
            args.extend(kwargs.pop(var_pos))
        return tuple(args), kwargs

    def _gives_up(self, e: BaseException) -> Optional[str]:
        """Why an exception the function raised ends the job failed for good (``fail_on``, or not
        in ``retry_on``); None when the attempt is retried (while attempts remain)."""
        if self.fail_on is not None and isinstance(e, self.fail_on):
            return f"failed for good: {type(e).__name__} is in the task's fail_on"
        if self.retry_on is not None and not isinstance(e, self.retry_on):
            return f"failed for good: {type(e).__name__} is not in the task's retry_on"
        return None

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
        return delay_seconds(b(attempt) if callable(b) else b, f"task {self.name}: retry_backoff")

    # -- enqueueing --------------------------------------------------------------------------------
    def configure(self, **options: Any) -> "Deferrer":
        """Job options for one defer: queue, priority, run_at, delay, max_attempts, unique_key,
        concurrency_key, after, tags, on_parent_failure, ref, on_duplicate."""
        return Deferrer(self, options)

    def spec(self, *args: Any, **kwargs: Any) -> JobSpec:
        """A JobSpec of this task (for enqueue_many, enqueue_graph, enqueue_batch)."""
        return Deferrer(self, {}).spec(*args, **kwargs)

    def defer(self, conn: Any = None, /, *args: Any, **kwargs: Any) -> Enqueued:
        """Enqueues a job of this task with the arguments after ``conn`` as its payload, on ``conn``
        (a connection or session: in its transaction; a URL, or None: the App's own connection,
        committed)."""
        return Deferrer(self, {}).defer(conn, *args, **kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> Enqueued:
        """``defer(None, *args, **kwargs)``: enqueues on the App's own connection, committed at once
        (Celery's shorthand).  In a transaction of yours, use ``defer(session, ...)``."""
        return Deferrer(self, {}).delay(*args, **kwargs)

    async def defer_async(self, conn: Any = None, /, *args: Any, **kwargs: Any) -> Enqueued:
        """defer() on a psycopg AsyncConnection (None: an async connection of the App's own)."""
        return await Deferrer(self, {}).defer_async(conn, *args, **kwargs)


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

    def spec(self, *args: Any, **kwargs: Any) -> JobSpec:
        d = self._keyed(kwargs)
        return d._spec(args, kwargs, "spec")

    def _spec(self, args: Sequence[Any], kwargs: Dict[str, Any], how: str) -> JobSpec:
        t = self.task
        o = {k: v for k, v in self.options.items() if k != "on_duplicate"}
        o.setdefault("queue", t.queue or t.app.queue)
        if t.priority is not None:
            o.setdefault("priority", t.priority)
        o.setdefault("max_attempts", t.max_attempts if t.max_attempts is not None else t.app.max_attempts)
        return JobSpec(kind=t.name, payload=t.payload(kwargs, args, how), **o)

    def _where(self, conn: Any) -> None:
        """A first argument that cannot be a connection, session or URL is a task's argument given
        where the connection goes: say so rather than failing to connect to it."""
        if conn is None or (isinstance(conn, str) and ("://" in conn or "=" in conn)):
            return
        if isinstance(conn, (str, int, float, list, dict, tuple)):
            t = self.task
            raise TypeError(f"{t.name}.defer: the first argument is where to enqueue (a connection, session or URL), "
                            f"not {_short(conn)}: pass the task's arguments after it, or use {t.name}.delay(...) "
                            f"on the App's own connection (the task is {t.name}{t._payload_sig})")

    def _keyed(self, kwargs: Dict[str, Any]) -> "Deferrer":
        """``route_key=`` among defer's keyword arguments is the job's routing key (docs/python.md,
        "Shards"), unless the function has a parameter of that name (then it is that argument, and
        ``configure(route_key=...)`` gives the job's)."""
        if "route_key" not in kwargs or "route_key" in self.task._payload_sig.parameters:
            return self
        return self.configure(route_key=kwargs.pop("route_key"))

    def defer(self, conn: Any = None, /, *args: Any, **kwargs: Any) -> Enqueued:
        self._where(conn)
        d = self._keyed(kwargs)
        spec = d._spec(args, kwargs, "defer")
        return self.task.app._enqueue_spec(conn, spec, d.options.get("on_duplicate", "return"))

    def delay(self, *args: Any, **kwargs: Any) -> Enqueued:
        d = self._keyed(kwargs)
        spec = d._spec(args, kwargs, "delay")
        return self.task.app._enqueue_spec(None, spec, d.options.get("on_duplicate", "return"))

    async def defer_async(self, conn: Any = None, /, *args: Any, **kwargs: Any) -> Enqueued:
        self._where(conn)
        d = self._keyed(kwargs)
        spec = d._spec(args, kwargs, "defer_async")
        return await self.task.app._enqueue_spec_async(conn, spec, d.options.get("on_duplicate", "return"))


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
            "max_attempts": (self.max_attempts if self.max_attempts is not None
                             else t.max_attempts if t.max_attempts is not None else app.max_attempts),
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
    the queue of tasks that name none; ``max_attempts`` the attempts of tasks that name none (10:
    ``DEFAULT_MAX_ATTEMPTS``).

    ``cluster`` (else ``$PGJOBQ_CLUSTER``, read when needed): a cluster of shards, as a conninfo or URL
    of any shard or of its router, or a JSON map file (docs/python.md, "Shards").  Then a job
    enqueued without a connection goes to its shard, a connection given must be the job's shard,
    and ``get``, ``result``, ``cancel`` and ``retry`` go to the shard an id names."""

    def __init__(self, database_url: Optional[str] = None, *, name: Optional[str] = None,
                 queue: str = "default", max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 cluster: Optional[str] = None) -> None:
        if cluster is not None and (not isinstance(cluster, str) or not cluster.strip()):
            raise InvalidArgument(f"App(cluster=...) is a conninfo, a URL or a map file's path, not {cluster!r}")
        self.cluster = cluster
        self.database_url = database_url
        self.name = _check_name(name, "App name") if name is not None else None
        self.queue = _check_name(queue, "queue")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or not 1 <= max_attempts <= 1000:
            raise InvalidArgument(f"App(max_attempts=...) must be an int from 1 to 1000, not {max_attempts!r}")
        self.max_attempts = max_attempts
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
             retry_backoff: Backoff = None, pass_context: bool = False, retry_on: Exceptions = None,
             fail_on: Exceptions = None) -> Callable[[Callable[..., Any]], Task]: ...

    def task(self, fn: Optional[Callable[..., Any]] = None, *, name: Optional[str] = None,
             queue: Optional[str] = None, priority: Optional[int] = None, max_attempts: Optional[int] = None,
             timeout: Optional[Duration] = None, retry_backoff: Backoff = None,
             pass_context: bool = False, retry_on: Exceptions = None,
             fail_on: Exceptions = None) -> Union[Task, Callable[[Callable[..., Any]], Task]]:
        """Registers a function (``def`` or ``async def``) as a task; usable bare (``@app.task``) or
        with options.  ``name`` is the job kind (default: the function's name); ``queue``,
        ``priority`` and ``max_attempts`` are defaults for its jobs; ``timeout`` (seconds, "30s")
        gives an attempt up (an async task is cancelled; a sync one sees ``ctx.cancelled``) as a
        failed attempt; ``retry_backoff`` (seconds, or a function of the attempt number returning
        seconds; ``exponential_backoff()``) is the delay after a failed attempt (default: the
        database's ``pgjobq.backoff``); ``pass_context`` gives the function a ``pgjobq.Context``
        as its first argument.  ``retry_on`` (an exception class or a tuple of them): only those are
        retried, any other exception fails the job for good; ``fail_on``: those fail it for good
        (it wins over ``retry_on``).  By default every exception but ``pgjobq.Fail`` is retried
        while attempts remain.  ``max_attempts`` defaults to the App's (10)."""

        def register(f: Callable[..., Any]) -> Task:
            t = Task(self, f, name=name, queue=queue, priority=priority, max_attempts=max_attempts, timeout=timeout,
                     retry_backoff=retry_backoff, pass_context=pass_context, retry_on=retry_on, fail_on=fail_on)
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
        Returns how many it created, changed or deleted.  Needs the pgjobq_admin role.  In a cluster
        (without ``conn``), each schedule goes to its queue's shard (where its ticks are allowed), one
        transaction per shard, and a schedule whose queue moved is deleted from its old shard."""
        wanted = {p.schedule_name(self): p.row(self) for p in self.periodics}
        cl = self._cl()
        if cl is None or conn is not None:
            return self._sync_on(conn, wanted)
        m = cl.map()
        changes = 0
        for shard in sorted(m.shards, key=lambda s: m.shards[s][0]):
            mine = {n: r for n, r in wanted.items() if m.owner(r["queue"], None) == shard}
            changes += cl.on_shard(m, shard, self._sync_on, mine)
        return changes

    def _sync_on(self, conn: Any, wanted: Dict[str, Dict[str, Any]]) -> int:
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

    def _cl(self) -> Optional["_cluster.Cluster"]:
        return _cluster.current(self.cluster)

    def _where(self, conn: Any) -> Any:
        """(target, cluster): in a cluster, None (each job to its shard) when no connection is given."""
        cl = self._cl()
        return (None if cl is not None and conn is None else self._target(conn)), cl

    def _enqueue_spec(self, conn: Any, spec: JobSpec, on_duplicate: str) -> Enqueued:
        target, cl = self._where(conn)
        return _enq._one(target, spec, _enq._on_dup(on_duplicate), cl)

    async def _enqueue_spec_async(self, conn: Any, spec: JobSpec, on_duplicate: str) -> Enqueued:
        target, cl = self._where(conn)
        return await _enq._aone(target, spec, _enq._on_dup(on_duplicate), cl)

    def enqueue(self, kind: Optional[str] = None, payload: Any = None, *, conn: Any = None,
                on_duplicate: str = "return", **options: Any) -> Enqueued:
        """pgjobq.enqueue() with the App's database (or, in a cluster, the job's shard) when ``conn``
        is None."""
        options.setdefault("queue", self.queue)
        return self._enqueue_spec(conn, _enq._spec(kind, payload, options), on_duplicate)

    def enqueue_many(self, jobs: Iterable[JobSpec], *, conn: Any = None, on_duplicate: str = "return") -> List[Enqueued]:
        """pgjobq.enqueue_many(); in a cluster without ``conn``, one statement per shard, each all or
        none: a failure raises the first error with ``e.partial`` (the jobs written, None for the others)."""
        target, cl = self._where(conn)
        return _enq._many(target, list(jobs), _enq._on_dup(on_duplicate), cl)

    def enqueue_graph(self, jobs: Sequence[JobSpec], *, conn: Any = None) -> Dict[str, int]:
        target, cl = self._where(conn)
        return _enq._graph(target, list(jobs), cl)

    def enqueue_batch(self, jobs: Sequence[JobSpec], callback: JobSpec, *, conn: Any = None) -> Batch:
        if not isinstance(callback, JobSpec):
            raise InvalidJob("enqueue_batch: callback must be a JobSpec")
        target, cl = self._where(conn)
        return _enq._batch(target, list(jobs), callback, cl)

    # -- looking and acting ---------------------------------------------------------------------------
    def _by_id(self, conn: Any, job_id: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(target, job_id, ...) on the App's database, or, in a cluster without ``conn``, on the
        shard the id names (id % 1024 is its number); an id that names none (at most the map's
        id_floor: from before the cluster) is looked for on every shard."""
        cl = self._cl()
        if cl is None or conn is not None:
            return fn(self._target(conn), job_id, *args, **kwargs)
        m = cl.map()
        shard = m.shard_of_id(int(job_id))
        if shard is None:
            shard = self._holder(cl, m, int(job_id))
        return cl.on_shard(m, shard, fn, job_id, *args, **kwargs)

    def _holder(self, cl: "_cluster.Cluster", m: "_cluster.Map", job_id: int) -> str:
        """The shard that has a job whose id names no shard: the first that has it.  JobNotFound when
        none has it, the first shard out of reach's error when one could not be asked."""
        down: Optional[BaseException] = None
        for shard in sorted(m.shards, key=lambda s: m.shards[s][0]):
            try:
                if cl.on_shard(m, shard, _jobs.get, job_id) is not None:
                    return shard
            except Exception as e:  # noqa: BLE001 - another shard may have it
                down = down or e
        if down is not None:
            raise down
        raise JobNotFound(f"no job has the id {job_id} on any shard of the cluster")

    def get(self, job_id: int, *, conn: Any = None) -> Optional[JobInfo]:
        try:
            return self._by_id(conn, job_id, _jobs.get)  # type: ignore[no-any-return]
        except JobNotFound:
            return None

    def result(self, job_id: int, timeout: Optional[Duration] = 30.0, *, conn: Any = None,
               poll: Optional[Duration] = None) -> Any:
        return self._by_id(conn, job_id, _jobs.result, timeout, poll=poll)

    def cancel(self, job_id: int, *, conn: Any = None) -> str:
        try:
            return self._by_id(conn, job_id, _jobs.cancel)  # type: ignore[no-any-return]
        except JobNotFound:
            return "not_found"

    def send_event(self, name: str, key: Optional[str] = None, payload: Any = None, *, conn: Any = None) -> int:
        """Sends the event (``name``, ``key``) with its payload (any JSON value), in the transaction
        of ``conn`` when it is one of yours (the event exists, and resumes jobs, only if that
        commits): every job parked in ``ctx.wait_for_event`` for it is due at once, with the
        payload stored as its wait's answer, and waits that begin later (within 7 days) find it.
        Returns how many parked jobs it resumed.  On a cluster of shards without ``conn``: every
        shard, each in a transaction of its own (a job waiting for it may be on any); when shards
        fail the others still take it, and the first failure is raised with ``resumed`` (what the
        others resumed) and ``failed`` (one error per shard that did not take it): send it again.
        With ``conn``: that database alone, in its transaction."""
        from . import _durable

        target, cl = self._where(conn)
        if target is None and cl is not None:
            return _durable.send_event_cluster(cl, name, key, payload)
        return _durable.send_event(target, name, key, payload)  # (target None: $PGJOBQ_DATABASE_URL)

    async def send_event_async(self, name: str, key: Optional[str] = None, payload: Any = None, *,
                               conn: Any = None) -> int:
        from . import _durable

        target, cl = self._where(conn)
        if target is None and cl is not None:
            return await _durable.send_event_cluster_async(cl, name, key, payload)
        return await _durable.send_event_async(target, name, key, payload)

    def retry(self, job_id: int, *, conn: Any = None) -> str:
        try:
            return self._by_id(conn, job_id, _jobs.retry)  # type: ignore[no-any-return]
        except JobNotFound:
            return "not_found"

    def skip(self, job_id: int, *, conn: Any = None) -> str:
        """The key that a job failed for good blocks in its strict-order queue moves on without it."""
        try:
            return self._by_id(conn, job_id, _jobs.skip)  # type: ignore[no-any-return]
        except JobNotFound:
            return "not_found"

    def retry_running(self, job_id: int, *, conn: Any = None) -> str:
        try:
            return self._by_id(conn, job_id, _jobs.retry_running)  # type: ignore[no-any-return]
        except JobNotFound:
            return "not_found"

    # In a cluster without ``conn``: a queue's settings (pause, limits) are written on the shard that
    # owns the queue (pinned), or on every shard (spread); the filters act on every shard, summed; a
    # shard out of reach raises ShardUnavailable naming it (what reached the others stays done).
    # queues() reads every shard that answers: each row with its shard, the others in ``.down``.
    def _queue_shards(self, m: "_cluster.Map", queue: str) -> List[str]:
        if m.queues.get(queue, ("pinned", None))[0] == "spread":
            return sorted(m.shards, key=lambda s: m.shards[s][0])
        return [m.owner(queue, None)]

    def _each(self, conn: Any, shards: Optional[Callable[["_cluster.Map"], List[str]]], fn: Callable[..., Any],
              *args: Any, **kwargs: Any) -> List[Any]:
        """[fn(target, ...)] on the App's database (or conn), or, in a cluster without conn, on each
        shard that shards(map) names (None: every shard)."""
        cl = self._cl()
        if cl is None or conn is not None:
            return [fn(self._target(conn), *args, **kwargs)]
        m = cl.map()
        names = shards(m) if shards is not None else sorted(m.shards, key=lambda s: m.shards[s][0])
        return [cl.on_shard(m, shard, fn, *args, **kwargs) for shard in names]

    def retry_where(self, queue: str, state: str, *, kind: Optional[str] = None, since: Optional[Duration] = None,
                    dry_run: bool = False, redrive: bool = False, conn: Any = None) -> Dict[str, int]:
        got = self._each(conn, None, _jobs.retry_where, queue, state, kind=kind, since=since, dry_run=dry_run,
                         redrive=redrive)
        return {k: sum(int(g[k]) for g in got) for k in got[0]}

    def cancel_where(self, queue: str, state: str, *, kind: Optional[str] = None, since: Optional[Duration] = None,
                     dry_run: bool = False, conn: Any = None) -> int:
        return sum(self._each(conn, None, _jobs.cancel_where, queue, state, kind=kind, since=since, dry_run=dry_run))

    def pause(self, queue: str, reason: Optional[str] = None, *, conn: Any = None) -> bool:
        return any(self._each(conn, lambda m: self._queue_shards(m, queue), _jobs.pause, queue, reason))

    def resume(self, queue: str, *, conn: Any = None) -> bool:
        return any(self._each(conn, lambda m: self._queue_shards(m, queue), _jobs.resume, queue))

    def set_limits(self, queue: str, *, concurrency: Optional[int] = UNSET, key_concurrency: Optional[int] = UNSET,
                   rate_limit: Optional[int] = UNSET, rate_period: Optional[Duration] = UNSET,
                   max_lease: Optional[Duration] = UNSET, dead_letter: Optional[str] = UNSET,
                   expire_after: Optional[Duration] = UNSET, strict_order: Optional[bool] = UNSET,
                   priority_aging: Optional[Duration] = UNSET,
                   conn: Any = None) -> None:
        self._each(conn, lambda m: self._queue_shards(m, queue), _jobs.set_limits, queue, concurrency=concurrency,
                   key_concurrency=key_concurrency, rate_limit=rate_limit, rate_period=rate_period,
                   max_lease=max_lease, dead_letter=dead_letter, expire_after=expire_after,
                   strict_order=strict_order, priority_aging=priority_aging)

    def queues(self, *, conn: Any = None) -> "_jobs.QueueList":
        """Every queue with jobs or settings.  In a cluster without ``conn``: each shard's rows, with
        its name in ``shard``; a shard out of reach is left out and named in ``.down`` (shard -> why)."""
        cl = self._cl()
        if cl is None or conn is not None:
            return _jobs.QueueList(_jobs.queues(self._target(conn)))
        m = cl.map()
        out = _jobs.QueueList()
        for shard in sorted(m.shards, key=lambda s: m.shards[s][0]):
            try:
                rows = cl.on_shard(m, shard, _jobs.queues)
            except ShardUnavailable as e:
                out.down[shard] = str(e)
                continue
            out.extend(dataclasses.replace(q, shard=shard) for q in rows)
        return out

    # -- testing -------------------------------------------------------------------------------------
    def run_inline(self, queues: Optional[Iterable[str]] = None, *, conn: Any = None,
                   max_jobs: int = 10000) -> Dict[str, int]:
        """Runs the due jobs of the App's tasks here, one after another, until none is due (or
        ``max_jobs`` attempts have run): for tests.  Each job is claimed from the database, run, and
        its outcome written as the worker would (retries, ``Fail``, ``retry_on``/``fail_on``,
        ``pass_context``, results), so what the test checks afterwards is what production would
        have stored.  A retry waits for its delay like any job: it runs in this call only if it is
        due before the queues run dry.  A job of a kind the App has no task for is handed back
        untouched.  ``queues``: those of the App's tasks by default.  Returns how many attempts
        ended each way (``completed``, ``retried``, ``failed``, ``cancelled``, ``lost``,
        ``snoozed``, ``handed_back``, ``parked``: a sleep or a wait parked the job, which runs
        again when it is due), e.g. ``{"completed": 2}``."""
        from ._inline import run_inline

        return run_inline(self, self._target(conn), queues, max_jobs)


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."

