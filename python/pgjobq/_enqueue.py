"""Enqueueing through the SQL API: one job (``pgjobq.enqueue``), many in one statement
(``pgjobq.enqueue_many``, or ``pgjobq.enqueue_graph`` when jobs wait for others or carry tags), a
graph, a batch with its callback.

Everything is checked and turned into JSON before the statement is sent: a value JSON cannot hold
raises ``InvalidJob`` and nothing reaches the database.  What only the database can judge (names,
ranges, parents) comes back as ``InvalidJob`` with the SQL API's message.
"""

from __future__ import annotations

import dataclasses
import sys
import datetime as _dt
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

from . import _cluster, _sql
from ._util import Duration, check_json, dumps, seconds, timestamp
from .errors import DuplicateJob, InvalidJob, PgjobqError, WrongShard

__all__ = [
    "JobSpec",
    "Enqueued",
    "Batch",
    "enqueue",
    "enqueue_many",
    "enqueue_graph",
    "enqueue_batch",
    "enqueue_async",
    "enqueue_many_async",
    "enqueue_graph_async",
    "enqueue_batch_async",
]


@dataclasses.dataclass(frozen=True)
class Enqueued:
    """A job the SQL API took: its id, and whether it is another job that already held the unique
    key (``duplicate``: then ``id`` is the holder's and nothing was inserted; ``replaced``: and the
    holder, queued, took this job's payload and run_at, as ``on_conflict="replace"`` asked)."""

    id: int
    duplicate: bool = False
    replaced: bool = False

    def __int__(self) -> int:
        return self.id

    def __index__(self) -> int:
        return self.id


@dataclasses.dataclass(frozen=True)
class Batch:
    """``enqueue_batch``: the callback's id (the batch's) and the jobs' ids, in input order."""

    id: int
    job_ids: List[int]


Parent = Union[int, str, Enqueued]


@dataclasses.dataclass
class JobSpec:
    """One job to enqueue.  None leaves a field to the SQL API's default (queue and kind
    ``'default'``, payload ``{}``, priority 0, max_attempts 25, due now).

    - ``payload``: any JSON value (dict, list, str, number, bool); at most 1 MiB.
    - ``run_at`` (an aware datetime, or text such as ``"2027-01-01 09:00Z"``) or ``delay`` (seconds,
      a timedelta or ``"10m"``), not both.
    - ``priority``: -100..100, lower first.  ``max_attempts``: 1..1000.
    - ``unique_key``: while a queued or running job of the queue holds it, no second job is
      inserted (the holder's id comes back, ``duplicate=True``).  ``on_conflict`` says what else:
      ``"skip"`` (the default), ``"replace"`` (a debounce: a queued holder takes this job's kind,
      payload, priority, run_at and attempts: the last one wins; a running one is left alone) or
      ``"keep"`` (a throttle: the key is held for ``unique_for``, seconds, a timedelta or ``"10m"``,
      from the enqueue that took it, whatever became of that job; ``unique_for`` alone means keep).
    - ``concurrency_key``: what a queue's ``key_concurrency`` limit counts.
    - ``after``: parents, job ids (or refs of jobs of the same graph); the job waits until they have
      all completed.  ``on_parent_failure``: ``"cancel"`` (default) or ``"run"``.
    - ``tags``: 1 to 20 strings.  ``ref``: the job's name within a graph.
    - ``route_key``: the job's routing key in a cluster of shards (1 to 255 characters): a job of a
      *spread* queue lives on the shard its key hashes to (a tenant, an account); other jobs live
      on their queue's shard (docs/python.md, "Shards").  Stored with the job in any database.
    - ``expire_after`` (seconds, a timedelta or ``"10m"``, counted from the job's run_at) or
      ``expires_at`` (an aware datetime or text, after its run_at), not both: no attempt of the job
      starts after it; a job still queued then ends cancelled, last_error ``"expired: ..."``
      (docs/queues.md, "Expiry").  Neither: the queue's default (``set_limits(expire_after=)``).
    - ``traceparent``: the job's W3C trace context (``"00-<32 hex>-<16 hex>-<2 hex>"``, lowercase),
      handed to its handler (``ctx.traceparent``; docs/queues.md, "Trace context").  None: the
      caller's current OpenTelemetry span's, when the application uses ``opentelemetry`` and a span is
      recording or was given to it; else none.  A bad one is refused by the database (nothing of the
      call is written).
    Jobs with ``after``, ``tags`` or ``on_parent_failure`` cannot have a unique key.
    """

    kind: Optional[str] = None
    payload: Any = None
    queue: Optional[str] = None
    priority: Optional[int] = None
    run_at: Union[None, _dt.datetime, str] = None
    delay: Optional[Duration] = None
    max_attempts: Optional[int] = None
    unique_key: Optional[str] = None
    concurrency_key: Optional[str] = None
    after: Optional[Sequence[Parent]] = None
    tags: Optional[Sequence[str]] = None
    on_parent_failure: Optional[str] = None
    ref: Optional[str] = None
    route_key: Optional[str] = None
    on_conflict: Optional[str] = None
    unique_for: Optional[Duration] = None
    expire_after: Optional[Duration] = None
    expires_at: Union[None, _dt.datetime, str] = None
    traceparent: Optional[str] = None

    def replace(self, **changes: Any) -> "JobSpec":
        return dataclasses.replace(self, **changes)

    # -- checks and conversions --------------------------------------------------------------
    def _fields(self, i: Optional[int] = None, where: str = "enqueue") -> Dict[str, Any]:
        """The job's fields as JSON-ready values (only those given), checked."""
        w = f"{where}: job {i}" if i is not None else where
        out: Dict[str, Any] = {}
        for name in ("kind", "queue", "unique_key", "concurrency_key", "on_parent_failure", "ref", "route_key",
                     "on_conflict", "traceparent"):
            v = getattr(self, name)
            if v is not None:
                if not isinstance(v, str):
                    raise InvalidJob(f"{w}: {name} must be a str, not {type(v).__name__}")
                out[name] = v
        for name in ("priority", "max_attempts"):
            v = getattr(self, name)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int):
                    raise InvalidJob(f"{w}: {name} must be an int, not {v!r}")
                out[name] = v
        if self.payload is not None:
            check_json(self.payload, w, "payload")
            out["payload"] = self.payload
        if self.run_at is not None:
            out["run_at"] = timestamp(self.run_at, f"{w}: run_at")
        if self.delay is not None:
            try:
                out["delay"] = seconds(self.delay, f"{w}: delay")
            except ValueError as e:
                raise InvalidJob(str(e)) from None
        if self.unique_for is not None:
            try:
                out["unique_for"] = seconds(self.unique_for, f"{w}: unique_for")
            except ValueError as e:
                raise InvalidJob(str(e)) from None
        if self.expire_after is not None:
            try:
                out["expire_after"] = seconds(self.expire_after, f"{w}: expire_after")
            except ValueError as e:
                raise InvalidJob(str(e)) from None
        if self.expires_at is not None:
            out["expires_at"] = timestamp(self.expires_at, f"{w}: expires_at")
        if self.traceparent is None:
            current = current_traceparent()
            if current is not None:
                out["traceparent"] = current
        if self.after is not None:
            parents: List[Union[int, str]] = []
            for p in self.after:
                if isinstance(p, Enqueued):
                    parents.append(p.id)
                elif isinstance(p, bool) or not isinstance(p, (int, str)):
                    raise InvalidJob(f"{w}: after: {p!r} is neither a job id nor a ref")
                else:
                    parents.append(p)
            out["after"] = parents
        if self.tags is not None:
            if isinstance(self.tags, str) or not all(isinstance(t, str) for t in self.tags):
                raise InvalidJob(f"{w}: tags must be a list of str")
            out["tags"] = list(self.tags)
        return out

    def _needs_graph(self) -> bool:
        return self.after is not None or self.tags is not None or self.on_parent_failure is not None or self.ref is not None

    def _keyed(self) -> bool:
        """Whether its unique key says what to do when held (pgjobq.enqueue_keyed)."""
        return self.on_conflict is not None or self.unique_for is not None


def current_traceparent() -> Optional[str]:
    """The W3C traceparent of the caller's current OpenTelemetry span, or None: when the
    application has not imported ``opentelemetry.trace`` (then it has no span: the package is an
    optional dependency, never imported here), or the current span's context is not valid."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    try:
        sc = trace.get_current_span().get_span_context()
        if not sc.is_valid:
            return None
        return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags) & 0xff:02x}"
    except Exception:  # (an API of another shape: no trace context rather than no job)
        return None


def _spec(kind: Optional[str], payload: Any, opts: Dict[str, Any]) -> JobSpec:
    try:
        return JobSpec(kind=kind, payload=payload, **opts)
    except TypeError as e:
        raise TypeError(f"pgjobq.enqueue: {e}") from None


# ------------------------------------------------------------------------------------------------
# Plans: a statement, its parameters, and what to make of its rows

Plan = Tuple[str, Dict[str, Any], Any]

_ONE_ARGS = {
    "queue": "CAST(:queue AS text)",
    "kind": "CAST(:kind AS text)",
    "payload": "CAST(:payload AS jsonb)",
    "priority": "CAST(:priority AS smallint)",
    "run_at": "CAST(:run_at AS timestamptz)",
    "delay": "make_interval(secs => CAST(:delay AS double precision))",
    "max_attempts": "CAST(:max_attempts AS integer)",
    "unique_key": "CAST(:unique_key AS text)",
    "concurrency_key": "CAST(:concurrency_key AS text)",
    "after": "ARRAY(SELECT CAST(a.v AS bigint) FROM jsonb_array_elements_text(CAST(:after AS jsonb)) AS a(v))",
    "tags": "ARRAY(SELECT t.v FROM jsonb_array_elements_text(CAST(:tags AS jsonb)) AS t(v))",
    "on_parent_failure": "CAST(:on_parent_failure AS text)",
    "route_key": "CAST(:route_key AS text)",
    "on_conflict": "CAST(:on_conflict AS text)",
    "unique_for": "make_interval(secs => CAST(:unique_for AS double precision))",
    "expires_at": "CAST(:expires_at AS timestamptz)",
    "expire_after": "make_interval(secs => CAST(:expire_after AS double precision))",
    "traceparent": "CAST(:traceparent AS text)",
}

# enqueue_keyed's arrays for one job: what it answers tells a replaced job from a duplicate.
_KEYED_ONE = (("queues", "queue", "text"), ("kinds", "kind", "text"), ("payloads", "payload", "jsonb"),
              ("priorities", "priority", "smallint"), ("run_ats", "run_at", "timestamptz"),
              ("delays", "delay", None), ("max_attempts", "max_attempts", "integer"),
              ("unique_keys", "unique_key", "text"), ("on_conflicts", "on_conflict", "text"),
              ("unique_fors", "unique_for", None), ("concurrency_keys", "concurrency_key", "text"),
              ("route_keys", "route_key", "text"), ("expires_ats", "expires_at", "timestamptz"),
              ("expire_afters", "expire_after", None), ("traceparents", "traceparent", "text"))


def _plan_one(spec: JobSpec) -> Plan:
    f = spec._fields()
    if "ref" in f:
        raise InvalidJob("enqueue: ref names a job within a graph: use enqueue_graph")
    if any(isinstance(p, str) for p in f.get("after", ())):
        raise InvalidJob("enqueue: after: refs (str) name jobs of a graph: use enqueue_graph, or give job ids")
    params: Dict[str, Any] = {}
    args = []
    for name, expr in _ONE_ARGS.items():
        if name not in f:
            continue
        v = f[name]
        if name in ("payload", "after", "tags"):
            v = dumps(v, "enqueue", name, checked=True)
        params[name] = v
        args.append(f"{name} => {expr}")
    if spec._keyed() and not spec._needs_graph():  # (with a graph's fields: enqueue() says what is wrong)
        args = []
        for arr, name, typ in _KEYED_ONE:
            if name not in params:
                args.append(f"{arr} => CAST(NULL AS {typ or 'interval'}[])")
            elif typ is None:
                args.append(f"{arr} => ARRAY[{_ONE_ARGS[name]}]")
            else:
                args.append(f"{arr} => ARRAY[CAST(:{name} AS {typ})]")
        sql = (f"SELECT e.id, e.outcome <> 'inserted', e.outcome = 'replaced' "
               f"FROM pgjobq.enqueue_keyed({', '.join(args)}) AS e")
        return sql, params, f
    sql = f"SELECT e.id, e.duplicate FROM pgjobq.enqueue({', '.join(args)}) AS e"
    return sql, params, f


# enqueue_many's arrays, from one JSON array of objects (one parameter however many jobs).
# enqueue_many's arrays from one JSON document.  The optional ones no job of the call sets are passed
# as NULL rather than as arrays of NULLs (10,000 jobs: 30 ms less of the server's time), and the ids
# come back as one text, "id" or "id+" (a duplicate), in input order: 10,000 rows of three columns
# cost the pure-Python driver more than the insert's remaining time.
_MANY_ARRAYS = (
    ("queues", "text", "x.j ->> 'queue'", None),
    ("kinds", "text", "x.j ->> 'kind'", None),
    ("payloads", "jsonb", "x.j -> 'payload'", None),
    ("priorities", "smallint", "CAST(x.j ->> 'priority' AS smallint)", "priority"),
    ("run_ats", "timestamptz", "CAST(x.j ->> 'run_at' AS timestamptz)", "run_at"),
    ("delays", "interval", "make_interval(secs => CAST(x.j ->> 'delay' AS double precision))", "delay"),
    ("max_attempts", "integer", "CAST(x.j ->> 'max_attempts' AS integer)", "max_attempts"),
    ("unique_keys", "text", "x.j ->> 'unique_key'", "unique_key"),
    ("concurrency_keys", "text", "x.j ->> 'concurrency_key'", "concurrency_key"),
)
# Passed by name (enqueue_many's `notify` comes before it), and only when a job of the call has one.
_ROUTE_KEYS = ("route_keys", "text", "x.j ->> 'route_key'", "route_key")
# The expiries, passed by name, only when a job of the call has one.
_EXPIRY_ARRAYS = (
    ("expires_ats", "timestamptz", "CAST(x.j ->> 'expires_at' AS timestamptz)", "expires_at"),
    ("expire_afters", "interval", "make_interval(secs => CAST(x.j ->> 'expire_after' AS double precision))",
     "expire_after"),
)
# The trace contexts, passed by name, only when a job of the call has one.
_TRACE_ARRAYS = (("traceparents", "text", "x.j ->> 'traceparent'", "traceparent"),)
# enqueue_keyed's two more, when a job of the call has a conflict mode or a window.
_KEYED_ARRAYS = (
    ("on_conflicts", "text", "x.j ->> 'on_conflict'", "on_conflict"),
    ("unique_fors", "interval", "make_interval(secs => CAST(x.j ->> 'unique_for' AS double precision))", "unique_for"),
)


def _many_sql(used: Set[str]) -> str:
    arrays = _MANY_ARRAYS + ((_ROUTE_KEYS,) if "route_key" in used else ())
    keyed = "on_conflict" in used or "unique_for" in used
    if keyed:
        arrays += _KEYED_ARRAYS
    if "expires_at" in used or "expire_after" in used:
        arrays += _EXPIRY_ARRAYS
    if "traceparent" in used:
        arrays += _TRACE_ARRAYS
    cols = ",\n               ".join(
        f"array_agg({expr} ORDER BY x.o) AS {name}" if field is None or field in used
        else f"CAST(NULL AS {typ}[]) AS {name}"
        for name, typ, expr, field in arrays)
    args = ", ".join(f"{name} => a.{name}" for name, _, _, _ in arrays)
    # "id" inserted, "id+" a duplicate, "id~" replaced (enqueue_keyed's outcome).
    mark = ("CASE e.outcome WHEN 'duplicate' THEN '+' WHEN 'replaced' THEN '~' ELSE '' END" if keyed
            else "CASE WHEN e.duplicate THEN '+' ELSE '' END")
    return f"""
SELECT string_agg(e.id::text || {mark}, ',' ORDER BY e.ord)
  FROM (SELECT {cols}
          FROM jsonb_array_elements(CAST(:jobs AS jsonb)) WITH ORDINALITY AS x(j, o)) AS a,
       pgjobq.{'enqueue_keyed' if keyed else 'enqueue_many'}({args}) AS e
"""


def _many_rows(rows: _sql.Rows, n: int) -> List[Tuple[int, int, bool, bool]]:
    """(ord, id, duplicate, replaced) for each job, from _many_sql's one text."""
    text = rows[0][0] if rows and rows[0] and rows[0][0] is not None else ""
    out = [(i, int(t[:-1]), True, t.endswith("~")) if t[-1:] in ("+", "~") else (i, int(t), False, False)
           for i, t in enumerate(text.split(",") if text else (), 1)]
    if len(out) != n:
        raise PgjobqError(f"pgjobq.enqueue_many answered for {len(out)} of {n} jobs")
    return out


_GRAPH_SQL = "SELECT g.ref, g.id FROM pgjobq.enqueue_graph(CAST(:graph AS jsonb)) AS g"

_BATCH_SQL = "SELECT b.batch_id, b.ids FROM pgjobq.enqueue_batch(CAST(:jobs AS jsonb), CAST(:callback AS jsonb)) AS b"


def _graph_json(specs: Sequence[JobSpec], where: str) -> str:
    objs = []
    for i, s in enumerate(specs):
        if not isinstance(s, JobSpec):
            raise InvalidJob(f"{where}: job {i} is a {type(s).__name__}, not a JobSpec")
        objs.append(s._fields(i, where))
    return dumps(objs, where, checked=True, limit=False)


def _plan_many(specs: Sequence[JobSpec]) -> Tuple[Plan, bool]:
    """(plan, is_graph).  enqueue_many unless a job needs the graph's fields."""
    if any(s._needs_graph() for s in specs if isinstance(s, JobSpec)):
        return (_GRAPH_SQL, {"graph": _graph_json(specs, "enqueue_many")}, specs), True
    objs = []
    used: Set[str] = set()
    for i, s in enumerate(specs):
        if not isinstance(s, JobSpec):
            raise InvalidJob(f"enqueue_many: job {i} is a {type(s).__name__}, not a JobSpec")
        f = s._fields(i, "enqueue_many")
        used.update(f)
        objs.append(f)
    return (_many_sql(used), {"jobs": dumps(objs, "enqueue_many", checked=True, limit=False)}, specs), False


def _dup_error(spec: JobSpec, holder: int) -> DuplicateJob:
    return DuplicateJob(
        f"the unique key {spec.unique_key!r} is held by job {holder}, queued or running in queue "
        f"{spec.queue or 'default'!r}: nothing was enqueued",
        holder,
    )


def _check_one(spec: JobSpec, on_duplicate: str) -> Callable[[_sql.Rows], None]:
    def check(rows: _sql.Rows) -> None:
        # (A replaced job is what was asked for, not a duplicate to raise.)
        if on_duplicate == "raise" and rows and rows[0][1] and not (len(rows[0]) > 2 and rows[0][2]):
            raise _dup_error(spec, rows[0][0])

    return check


def _check_many(specs: Sequence[JobSpec], on_duplicate: str, graph: bool) -> Callable[[_sql.Rows], None]:
    def check(rows: _sql.Rows) -> None:
        if on_duplicate == "raise" and not graph:  # (a graph has no unique keys)
            for ord_, id_, dup, replaced in _many_rows(rows, len(specs)):
                if dup and not replaced:
                    raise _dup_error(specs[ord_ - 1], id_)

    return check


def _on_dup(v: str) -> str:
    if v not in ("return", "raise"):
        raise ValueError(f"on_duplicate must be 'return' or 'raise', not {v!r}")
    return v


def _one_result(rows: _sql.Rows) -> Enqueued:
    (row,) = rows
    return Enqueued(int(row[0]), bool(row[1]), bool(row[2]) if len(row) > 2 else False)


def _many_result(rows: _sql.Rows, graph: bool, n: int) -> List[Enqueued]:
    if graph:
        return [Enqueued(int(r[1]), False) for r in rows]
    return [Enqueued(id_, dup, replaced) for _, id_, dup, replaced in _many_rows(rows, n)]


# ------------------------------------------------------------------------------------------------
# On one database (target), or routed over a cluster's shards (docs/python.md, "Shards")
#
# Each takes the cluster (None: one database, as without a cluster: nothing more is done).  With a
# cluster, a target of None routes each job to its shard, on the package's own connection to it; a
# caller's connection, session or URL is checked first to be the shard of every job (Cluster.check_here).


def _run_one(target: Any, spec: JobSpec, on_dup: str) -> Enqueued:
    sql, params, _ = _plan_one(spec)
    return _one_result(_sql.run(target, sql, params, check=_check_one(spec, on_dup), enqueue=True))


async def _arun_one(target: Any, spec: JobSpec, on_dup: str) -> Enqueued:
    sql, params, _ = _plan_one(spec)
    return _one_result(await _sql.arun(target, sql, params, check=_check_one(spec, on_dup), enqueue=True))


def _run_many(target: Any, specs: List[JobSpec], on_dup: str) -> List[Enqueued]:
    (sql, params, _), graph = _plan_many(specs)
    rows = _sql.run(target, sql, params, check=_check_many(specs, on_dup, graph), enqueue=True)
    return _many_result(rows, graph, len(specs))


async def _arun_many(target: Any, specs: List[JobSpec], on_dup: str) -> List[Enqueued]:
    (sql, params, _), graph = _plan_many(specs)
    rows = await _sql.arun(target, sql, params, check=_check_many(specs, on_dup, graph), enqueue=True)
    return _many_result(rows, graph, len(specs))


def _run_graph(target: Any, specs: List[JobSpec]) -> Dict[str, int]:
    rows = _sql.run(target, _GRAPH_SQL, {"graph": _graph_json(specs, "enqueue_graph")}, enqueue=True)
    return {str(r[0]): int(r[1]) for r in rows}


async def _arun_graph(target: Any, specs: List[JobSpec]) -> Dict[str, int]:
    rows = await _sql.arun(target, _GRAPH_SQL, {"graph": _graph_json(specs, "enqueue_graph")}, enqueue=True)
    return {str(r[0]): int(r[1]) for r in rows}


def _run_batch(target: Any, specs: List[JobSpec], callback: JobSpec) -> Batch:
    rows = _sql.run(target, _BATCH_SQL, _batch_params(specs, callback), enqueue=True)
    return Batch(int(rows[0][0]), [int(x) for x in rows[0][1]])


async def _arun_batch(target: Any, specs: List[JobSpec], callback: JobSpec) -> Batch:
    rows = await _sql.arun(target, _BATCH_SQL, _batch_params(specs, callback), enqueue=True)
    return Batch(int(rows[0][0]), [int(x) for x in rows[0][1]])


def _check_specs(specs: List[JobSpec], where: str) -> None:
    """Before a cluster routes them (by their queue and route_key): JobSpecs."""
    for i, s in enumerate(specs):
        if not isinstance(s, JobSpec):
            raise InvalidJob(f"{where}: job {i} is a {type(s).__name__}, not a JobSpec")


def _here(cl: "_cluster.Cluster", target: Any, specs: List[JobSpec]) -> None:
    _check_specs(specs, "enqueue")
    if not cl.map().single:  # (a cluster of one database: nothing to check, nothing read)
        cl.check_here(target, specs, cl.self_of(target))


async def _ahere(cl: "_cluster.Cluster", target: Any, specs: List[JobSpec]) -> None:
    _check_specs(specs, "enqueue")
    if not cl.map().single:
        cl.check_here(target, specs, await cl.aself_of(target))


def _on(cl: Optional["_cluster.Cluster"], target: Any, specs: List[JobSpec], fn: Callable[..., Any], *args: Any) -> Any:
    """fn(target, specs, *args) on a caller's target (checked to be the jobs' shard in a cluster)."""
    if cl is None:
        return fn(target, specs, *args)
    _here(cl, target, specs)
    try:
        return fn(target, specs, *args)
    except WrongShard as e:  # the shard's guard: its map is newer than ours
        raise cl.stale(e) from e


async def _aon(cl: Optional["_cluster.Cluster"], target: Any, specs: List[JobSpec], fn: Callable[..., Any],
               *args: Any) -> Any:
    if cl is None:
        return await fn(target, specs, *args)
    await _ahere(cl, target, specs)
    try:
        return await fn(target, specs, *args)
    except WrongShard as e:
        raise cl.stale(e) from e


def _one_shard(cl: "_cluster.Cluster", m: "_cluster.Map", specs: List[JobSpec], what: str) -> str:
    """The one shard of a graph's or a batch's jobs (one statement, all or none: one shard)."""
    _check_specs(specs, what)
    owners = cl.owners_of(m, specs) or [m.owners[0]]  # (none: the SQL API says what is wrong)
    for i, o in enumerate(owners):
        if o != owners[0]:
            raise InvalidJob(f"{what}: job 0 lives on shard \"{owners[0]}\" and job {i} on shard \"{o}\": "
                             f"{what} is one statement on one shard, all or none; route its jobs to one shard "
                             "(one pinned queue, or one route_key of a spread queue)")
    return owners[0]


def _routed_single(cl: "_cluster.Cluster", specs: List[JobSpec], what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(url, specs, *args) on the shard of every job (_one_shard); after a PJQ01, the map is read
    again and the jobs routed again, once."""
    m = cl.map()
    for again in (True, False):
        shard = _one_shard(cl, m, specs, what)
        try:
            return cl.on_shard(m, shard, fn, specs, *args)
        except WrongShard as e:
            if not again or e.sqlstate != "PJQ01":
                raise
            m = cl.reload(m)
    raise AssertionError("unreachable")


async def _arouted_single(cl: "_cluster.Cluster", specs: List[JobSpec], what: str, fn: Callable[..., Any],
                          *args: Any) -> Any:
    m = cl.map()
    for again in (True, False):
        shard = _one_shard(cl, m, specs, what)
        try:
            return await cl.aon_shard(m, shard, fn, specs, *args)
        except WrongShard as e:
            if not again or e.sqlstate != "PJQ01":
                raise
            m = cl.reload(m)
    raise AssertionError("unreachable")


def _parts(cl: "_cluster.Cluster", m: "_cluster.Map", specs: List[JobSpec], pending: List[int]) -> List[Tuple[str, List[int]]]:
    """The jobs (indexes) per shard, shards in the order of their first job; a job's parents must be on
    its shard (InvalidJob otherwise: a ref of the call, or an id, which names its shard)."""
    owner = {i: m.owner(specs[i].queue, specs[i].route_key) for i in pending}
    refs = {specs[i].ref: owner[i] for i in pending if specs[i].ref is not None}
    for i in pending:
        for p in specs[i].after or ():
            pid = p.id if isinstance(p, Enqueued) else p
            there = refs.get(pid) if isinstance(pid, str) else (m.shard_of_id(pid) if isinstance(pid, int) else None)
            if there is not None and there != owner[i]:
                raise InvalidJob(f"enqueue_many: job {i} (on shard \"{owner[i]}\") waits for {pid!r}, which is on shard "
                                 f"\"{there}\": a job's parents must be on its shard")
    parts: Dict[str, List[int]] = {}
    for i in pending:
        parts.setdefault(owner[i], []).append(i)
    return list(parts.items())


def _split(cl: "_cluster.Cluster", specs: List[JobSpec]) -> Any:
    """A batch over a cluster, as a generator: yields (map, shard, indexes) for each shard's part to
    run, is sent back its outcome (the part's Enqueued, or the exception it raised), and returns the
    jobs in input order.  Every part is tried (a shard down or a part refused holds up no other), then
    the first error is raised with ``partial``: the Enqueued of each job, in input order, None for
    those not written.  The parts a shard refuses with PJQ01 are routed again by the map read again
    (once per call)."""
    _check_specs(specs, "enqueue_many")
    out: List[Optional[Enqueued]] = [None] * len(specs)
    errors: List[BaseException] = []
    m = cl.map()
    pending = list(range(len(specs)))
    reloaded = False
    while pending:
        try:
            parts = _parts(cl, m, specs, pending)
        except InvalidJob as e:
            if not reloaded:
                raise  # nothing sent yet
            errors.append(e)
            break
        stale: List[int] = []
        for shard, idx in parts:
            got = yield m, shard, idx
            if isinstance(got, WrongShard) and got.sqlstate == "PJQ01" and not reloaded:
                stale.extend(idx)
            elif isinstance(got, BaseException):
                errors.append(got)
            else:
                for i, r in zip(idx, got):
                    out[i] = r
        if not stale:
            break
        m = cl.reload(m)
        reloaded = True
        pending = sorted(stale)
    if errors:
        e = errors[0]
        e.partial = out  # type: ignore[attr-defined]
        raise e
    return out


def _routed_many(cl: "_cluster.Cluster", specs: List[JobSpec], on_dup: str) -> List[Enqueued]:
    plan = _split(cl, specs)
    try:
        m, shard, idx = next(plan)
        while True:
            try:
                got: Any = cl.on_shard(m, shard, _run_many, [specs[i] for i in idx], on_dup)
            except Exception as e:  # noqa: BLE001 - _split raises it, with what was written
                got = e
            m, shard, idx = plan.send(got)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def _arouted_many(cl: "_cluster.Cluster", specs: List[JobSpec], on_dup: str) -> List[Enqueued]:
    plan = _split(cl, specs)
    try:
        m, shard, idx = next(plan)
        while True:
            try:
                got: Any = await cl.aon_shard(m, shard, _arun_many, [specs[i] for i in idx], on_dup)
            except Exception as e:  # noqa: BLE001
                got = e
            m, shard, idx = plan.send(got)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _one(target: Any, spec: JobSpec, on_dup: str, cl: Optional["_cluster.Cluster"]) -> Enqueued:
    if cl is not None and target is None:
        return _routed_single(cl, [spec], "enqueue", lambda url, specs, d: _run_one(url, specs[0], d), on_dup)
    return _on(cl, target, [spec], lambda t, specs, d: _run_one(t, specs[0], d), on_dup)


async def _aone(target: Any, spec: JobSpec, on_dup: str, cl: Optional["_cluster.Cluster"]) -> Enqueued:
    async def run(t: Any, specs: List[JobSpec], d: str) -> Enqueued:
        return await _arun_one(t, specs[0], d)

    if cl is not None and target is None:
        return await _arouted_single(cl, [spec], "enqueue", run, on_dup)
    return await _aon(cl, target, [spec], run, on_dup)


def _many(target: Any, specs: List[JobSpec], on_dup: str, cl: Optional["_cluster.Cluster"]) -> List[Enqueued]:
    if not specs:
        return []
    if cl is not None and target is None:
        return _routed_many(cl, specs, on_dup)
    return _on(cl, target, specs, _run_many, on_dup)  # type: ignore[no-any-return]


async def _amany(target: Any, specs: List[JobSpec], on_dup: str, cl: Optional["_cluster.Cluster"]) -> List[Enqueued]:
    if not specs:
        return []
    if cl is not None and target is None:
        return await _arouted_many(cl, specs, on_dup)
    return await _aon(cl, target, specs, _arun_many, on_dup)  # type: ignore[no-any-return]


def _graph(target: Any, specs: List[JobSpec], cl: Optional["_cluster.Cluster"]) -> Dict[str, int]:
    if cl is not None and target is None:
        return _routed_single(cl, specs, "enqueue_graph", _run_graph)  # type: ignore[no-any-return]
    return _on(cl, target, specs, _run_graph)  # type: ignore[no-any-return]


async def _agraph(target: Any, specs: List[JobSpec], cl: Optional["_cluster.Cluster"]) -> Dict[str, int]:
    if cl is not None and target is None:
        return await _arouted_single(cl, specs, "enqueue_graph", _arun_graph)  # type: ignore[no-any-return]
    return await _aon(cl, target, specs, _arun_graph)  # type: ignore[no-any-return]


def _batch(target: Any, specs: List[JobSpec], callback: JobSpec, cl: Optional["_cluster.Cluster"]) -> Batch:
    if cl is not None and target is None:
        return _routed_single(cl, specs + [callback], "enqueue_batch",  # type: ignore[no-any-return]
                              lambda url, sc: _run_batch(url, sc[:-1], sc[-1]))
    return _on(cl, target, specs + [callback], lambda t, sc: _run_batch(t, sc[:-1], sc[-1]))  # type: ignore[no-any-return]


async def _abatch(target: Any, specs: List[JobSpec], callback: JobSpec, cl: Optional["_cluster.Cluster"]) -> Batch:
    async def run(t: Any, sc: List[JobSpec]) -> Batch:
        return await _arun_batch(t, sc[:-1], sc[-1])

    if cl is not None and target is None:
        return await _arouted_single(cl, specs + [callback], "enqueue_batch", run)  # type: ignore[no-any-return]
    return await _aon(cl, target, specs + [callback], run)  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------------------
# The functions
#
# conn None: the configured database ($PGJOBQ_DATABASE_URL, $DATABASE_URL), or, with $PGJOBQ_CLUSTER
# set, each job's shard of that cluster.


def enqueue(conn: Any, kind: Optional[str] = None, payload: Any = None, *, on_duplicate: str = "return",
            **options: Any) -> Enqueued:
    """Enqueues one job with ``pgjobq.enqueue`` on ``conn`` (see the module: a connection or
    session joins its transaction, never committed here; a URL or None opens a connection of its own
    and commits).  ``options`` are JobSpec's fields.  With ``on_duplicate="raise"``, a unique key
    already held raises ``DuplicateJob`` (carrying the holder's id) instead of returning
    ``Enqueued(holder, duplicate=True)``.  In a cluster ($PGJOBQ_CLUSTER), None enqueues on the job's
    shard, and a connection must be the job's shard (``WrongShard`` otherwise)."""
    spec = _spec(kind, payload, options)
    return _one(conn, spec, _on_dup(on_duplicate), _cluster.current())


async def enqueue_async(conn: Any, kind: Optional[str] = None, payload: Any = None, *, on_duplicate: str = "return",
                        **options: Any) -> Enqueued:
    """enqueue() on a psycopg AsyncConnection (or a URL)."""
    spec = _spec(kind, payload, options)
    return await _aone(conn, spec, _on_dup(on_duplicate), _cluster.current())


def _plan_forward(spec: JobSpec) -> Plan:
    f = spec._fields(where="forward")
    for name in ("after", "tags", "on_parent_failure", "ref"):
        if name in f:
            raise InvalidJob(f"forward: {name}: a forwarded job's parents must be on its shard; enqueue "
                             "a workflow on the shard where it runs")
    sql, params, _ = _plan_one(spec)
    sql = sql.replace("SELECT e.id, e.duplicate FROM pgjobq.enqueue(", "SELECT pgjobq.forward(", 1)
    sql = sql[: sql.rindex(") AS e")] + ")"
    return sql, params, f


def forward(conn: Any, kind: Optional[str] = None, payload: Any = None, **options: Any) -> int:
    """Enqueues, in ``conn``'s transaction, a job for the outbox (``pgjobq.forward``: docs/shards.md,
    "The outbox"): the database of ``conn`` keeps it in its queue ``pgjobq.outbox`` until a forwarder
    (``pgjobq work --forward-to CLUSTER``) writes it to the shard that owns it, exactly once.  For a
    job whose shard is not the database of the application's data, in the same transaction as that
    data.  ``options`` are JobSpec's fields but after, tags and on_parent_failure.  Judged as an
    enqueue now (the same errors).  Returns the outbox job's id; its result, once forwarded, is
    {"shard": ..., "id": ...}."""
    sql, params, _ = _plan_forward(_spec(kind, payload, options))
    (id_,), = _sql.run(conn, sql, params, enqueue=True)
    return int(id_)


async def forward_async(conn: Any, kind: Optional[str] = None, payload: Any = None, **options: Any) -> int:
    """forward() on a psycopg AsyncConnection (or a URL)."""
    sql, params, _ = _plan_forward(_spec(kind, payload, options))
    (id_,), = await _sql.arun(conn, sql, params, enqueue=True)
    return int(id_)


def enqueue_many(conn: Any, jobs: Iterable[JobSpec], *, on_duplicate: str = "return") -> List[Enqueued]:
    """Enqueues many jobs in one statement, all or none, and returns them in input order.  Jobs
    with ``after``, ``tags``, ``on_parent_failure`` or ``ref`` go through ``pgjobq.enqueue_graph``
    (no unique keys there); the others through ``pgjobq.enqueue_many``.  In a cluster, with conn
    None, one statement per shard, each all or none (docs/python.md, "Shards")."""
    return _many(conn, list(jobs), _on_dup(on_duplicate), _cluster.current())


async def enqueue_many_async(conn: Any, jobs: Iterable[JobSpec], *, on_duplicate: str = "return") -> List[Enqueued]:
    return await _amany(conn, list(jobs), _on_dup(on_duplicate), _cluster.current())


def enqueue_graph(conn: Any, jobs: Sequence[JobSpec]) -> Dict[str, int]:
    """Enqueues a graph of jobs in one statement, all or none (``pgjobq.enqueue_graph``): each job's
    ``after`` names refs of jobs of the graph (str) or ids of jobs already enqueued (int).  Cycles,
    unknown refs and parents are refused.  Returns {ref: id} in input order (a job without a ref is
    named by its index, "0", "1", ...).  In a cluster, its jobs must live on one shard."""
    return _graph(conn, list(jobs), _cluster.current())


async def enqueue_graph_async(conn: Any, jobs: Sequence[JobSpec]) -> Dict[str, int]:
    return await _agraph(conn, list(jobs), _cluster.current())


def _batch_params(jobs: Sequence[JobSpec], callback: JobSpec) -> Dict[str, Any]:
    if not isinstance(callback, JobSpec):
        raise InvalidJob("enqueue_batch: callback must be a JobSpec")
    cb = callback._fields(None, "enqueue_batch: callback")
    return {"jobs": _graph_json(list(jobs), "enqueue_batch"), "callback": dumps(cb, "enqueue_batch: callback", checked=True)}


def enqueue_batch(conn: Any, jobs: Sequence[JobSpec], callback: JobSpec) -> Batch:
    """Enqueues the jobs and a callback job that runs once every one of them has finished, however
    it ended, with ``{"batch": {"id", "jobs", "completed", "failed", "cancelled"}}`` added to its
    payload (``pgjobq.enqueue_batch``).  In a cluster, the jobs and the callback must live on one
    shard."""
    if not isinstance(callback, JobSpec):
        raise InvalidJob("enqueue_batch: callback must be a JobSpec")
    return _batch(conn, list(jobs), callback, _cluster.current())


async def enqueue_batch_async(conn: Any, jobs: Sequence[JobSpec], callback: JobSpec) -> Batch:
    if not isinstance(callback, JobSpec):
        raise InvalidJob("enqueue_batch: callback must be a JobSpec")
    return await _abatch(conn, list(jobs), callback, _cluster.current())
