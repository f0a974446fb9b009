"""Durable execution for a task (docs/durable.md): ``ctx.step``, ``ctx.sleep``, ``ctx.wait_for_event``
and their ``*_async`` forms, and ``send_event``.

What a step, a sleep or a wait asks of the database goes one of two ways, by where the task runs:

- under the worker (``python3 -m pgjobq worker``, the coprocess side, protocol 3 of docs/coproc.md):
  a request line to the worker, which runs it on the connection it lends to the job and answers
  (``_Lines``): the task needs no database access of its own, and a sleep or a wait parks the job
  where the worker can see it;
- under ``app.run_inline()``: the SQL itself, on the target run_inline was given (``_Direct``).

A step with ``transaction=True`` runs on a connection of the package's own (the App's database),
in one transaction with the store of its result (``pgjobq.step_put``, fenced by the job's lease
token): its effects commit with the result, or are rolled back when the lease was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import _sql
from ._util import DELAY_MAX_S, check_json, delay_seconds, dumps
from .errors import InvalidArgument, PgjobqError

NAME_MAX = 255

_STEP_GET = """
SELECT s.outcome, s.result FROM pgjobq.step_get(CAST(:id AS bigint), CAST(:token AS bigint), CAST(:name AS text)) AS s
"""
_STEP_PUT = """
SELECT s.outcome, s.result FROM pgjobq.step_put(CAST(:id AS bigint), CAST(:token AS bigint), CAST(:name AS text),
                                                CAST(:value AS jsonb)) AS s
"""
_SLEEP = """
SELECT s.outcome FROM pgjobq.sleep(CAST(:id AS bigint), CAST(:token AS bigint), CAST(:name AS text),
                                   make_interval(secs => CAST(:delay AS double precision))) AS s
"""
_WAIT = """
SELECT w.outcome, w.payload FROM pgjobq.wait_event(CAST(:id AS bigint), CAST(:token AS bigint), CAST(:name AS text),
                                                   CAST(:event AS text), CAST(:key AS text),
                                                   make_interval(secs => CAST(:timeout AS double precision))) AS w
"""
_SEND = """
SELECT e.id, e.resumed FROM pgjobq.send_event(CAST(:name AS text), CAST(:key AS text), CAST(:payload AS jsonb)) AS e
"""


class LeaseLost(PgjobqError):
    """The job is no longer this attempt's (its lease expired and another worker may hold it, or it
    ended): nothing was stored, and a step's transaction was rolled back.  The task should stop."""


class EventTimeout(PgjobqError, TimeoutError):
    """``ctx.wait_for_event`` waited its timeout and the event did not come."""

    def __init__(self, job_id: int, event: str, key: str) -> None:
        super().__init__(f"job {job_id}: no event {event!r} (key {key!r}) came before the timeout")
        self.event = event
        self.key = key


class Parked(BaseException):
    """Raised out of ``ctx.sleep`` or ``ctx.wait_for_event`` when the job is parked: its attempt ends
    there (no attempt used, its slot and lease freed) and it runs again at the sleep's end, the event
    or the wait's timeout, its steps replayed.  A BaseException, as asyncio.CancelledError, so that a
    task's ``except Exception`` does not keep the attempt going; let it out of the task."""


class _Exists(Exception):
    """(inside a transactional step) the step was stored meanwhile: roll back, use that result."""

    def __init__(self, result: Any) -> None:
        super().__init__("stored already")
        self.result = result


def check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= NAME_MAX or "\x00" in name:
        raise InvalidArgument(f"{what} must be a str of 1 to {NAME_MAX} characters, not {name!r}")
    return name


def _key(key: Any) -> str:
    if key is None:
        return ""
    if not isinstance(key, str) or len(key) > NAME_MAX or "\x00" in key:
        raise InvalidArgument(f"an event's key must be a str of at most {NAME_MAX} characters, not {key!r}")
    return key


def _timeout(timeout: Any) -> Optional[float]:
    return None if timeout is None else delay_seconds(timeout, "wait_for_event(timeout=...)")


# ------------------------------------------------------------------------------------------------
# The two ways to the database


class _Direct:
    """The SQL itself, on a target (run_inline's), fenced by the job's token."""

    def __init__(self, target: Any, job_id: int, token: int) -> None:
        self.target = target
        self.id = job_id
        self.token = token

    def request(self, req: Dict[str, Any]) -> Dict[str, Any]:
        """Answers a request as the worker would (protocol 3's answer lines)."""
        p = {"id": self.id, "token": self.token}
        if "step" in req:
            p["name"] = req["step"]
            if "result" in req:
                p["value"] = dumps(req["result"], f"the result of step {req['step']!r}", limit=False)
                (outcome, result), = _sql.run(self.target, _STEP_PUT, p)
                if outcome == "lost":
                    return {"error": f"job {self.id}: the lease is lost: step {req['step']!r} not stored"}
                return {"stored": True, "result": result}
            (outcome, result), = _sql.run(self.target, _STEP_GET, p)
            if outcome == "lost":
                return {"error": f"job {self.id}: the lease is lost"}
            return {"stored": outcome == "stored", "result": result}
        if "sleep" in req:
            p.update(name=req["sleep"], delay=req["delay_ms"] / 1000.0)
            (outcome,), = _sql.run(self.target, _SLEEP, p)
            return {"over": True} if outcome == "over" else {"parked": outcome}
        p.update(name=req["wait"], event=req["event"], key=req.get("key", ""),
                 timeout=req["timeout_ms"] / 1000.0 if req.get("timeout_ms") is not None else DELAY_MAX_S)
        (outcome, payload), = _sql.run(self.target, _WAIT, p)
        if outcome == "event":
            return {"event": payload}
        if outcome == "timeout":
            return {"timeout": True}
        return {"parked": outcome}

    async def request_async(self, req: Dict[str, Any]) -> Dict[str, Any]:
        return self.request(req)


class _Lines:
    """Requests to the worker as protocol 3's lines, answered by the Runner (``Runner.answered``).
    One request of a job at a time (its steps run in order)."""

    def __init__(self, runner: Any, ctx: Any) -> None:
        self.runner = runner
        self.ctx = ctx
        self.lock = threading.Lock()

    def _line(self, req: Dict[str, Any]) -> bytes:
        msg = {"id": self.ctx.id}
        msg.update(req)
        return dumps(msg, "a step request", limit=False).encode() + b"\n"

    def request(self, req: Dict[str, Any]) -> Dict[str, Any]:
        """From a sync task's thread: the line goes out on the loop, the answer comes back here."""
        with self.lock:
            fut = asyncio.run_coroutine_threadsafe(self.runner.request(self.ctx, self._line(req)), self.runner.loop)
            return fut.result()

    async def request_async(self, req: Dict[str, Any]) -> Dict[str, Any]:
        return await self.runner.request(self.ctx, self._line(req))


# ------------------------------------------------------------------------------------------------
# What Context's methods do


def _answered(ctx: Any, what: str, ans: Dict[str, Any]) -> Dict[str, Any]:
    if "parked" in ans:
        ctx._parked = True
        raise Parked(f"job {ctx.id} parked ({what})" if ans["parked"] in (True, "parked")
                     else f"job {ctx.id} ended {ans['parked']} ({what})")
    if "error" in ans:
        raise LeaseLost(str(ans["error"]))
    return ans


def _backend(ctx: Any) -> Any:
    if ctx._durable is None:
        raise PgjobqError(f"job {ctx.id}: steps, sleeps and waits need the worker (python3 -m pgjobq worker) or "
                          "app.run_inline(); this Context has neither")
    return ctx._durable


def step(ctx: Any, name: str, fn: Callable[..., Any], transaction: bool) -> Any:
    check_name(name, "a step's name")
    if transaction:
        return _step_tx(ctx, name, fn)
    be = _backend(ctx)
    got = _answered(ctx, "step", be.request({"step": name}))
    if got.get("stored"):
        return got.get("result")
    value = fn()
    check_json(value, f"the result of step {name!r}")
    return _answered(ctx, "step", be.request({"step": name, "result": value})).get("result")


async def step_async(ctx: Any, name: str, fn: Callable[..., Any], transaction: bool) -> Any:
    check_name(name, "a step's name")
    if transaction:
        return await _step_tx_async(ctx, name, fn)
    be = _backend(ctx)
    got = _answered(ctx, "step", await be.request_async({"step": name}))
    if got.get("stored"):
        return got.get("result")
    value = fn()
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        value = await value
    check_json(value, f"the result of step {name!r}")
    return _answered(ctx, "step", await be.request_async({"step": name, "result": value})).get("result")


def _sleep_req(ctx: Any, duration: Any, name: Optional[str]) -> Dict[str, Any]:
    s = delay_seconds(duration, "sleep(duration)")
    if name is None:
        ctx._unnamed_sleeps += 1
        name = f"sleep#{ctx._unnamed_sleeps}"
    return {"sleep": check_name(name, "a sleep's name"), "delay_ms": int(round(s * 1000))}


def sleep(ctx: Any, duration: Any, name: Optional[str]) -> None:
    _answered(ctx, "sleep", _backend(ctx).request(_sleep_req(ctx, duration, name)))


async def sleep_async(ctx: Any, duration: Any, name: Optional[str]) -> None:
    _answered(ctx, "sleep", await _backend(ctx).request_async(_sleep_req(ctx, duration, name)))


def _wait_req(ctx: Any, event: str, key: Any, timeout: Any, name: Optional[str]) -> Dict[str, Any]:
    check_name(event, "an event's name")
    t = _timeout(timeout)
    if name is None:
        ctx._unnamed_waits += 1
        name = f"wait#{ctx._unnamed_waits}"
    req: Dict[str, Any] = {"wait": check_name(name, "a wait's name"), "event": event, "key": _key(key)}
    if t is not None:
        req["timeout_ms"] = int(round(t * 1000))
    return req


def _event(ctx: Any, req: Dict[str, Any], ans: Dict[str, Any]) -> Any:
    ans = _answered(ctx, "wait", ans)
    if ans.get("timeout"):
        raise EventTimeout(ctx.id, req["event"], req["key"])
    return ans.get("event")


def wait_for_event(ctx: Any, event: str, key: Any, timeout: Any, name: Optional[str]) -> Any:
    req = _wait_req(ctx, event, key, timeout, name)
    return _event(ctx, req, _backend(ctx).request(req))


async def wait_for_event_async(ctx: Any, event: str, key: Any, timeout: Any, name: Optional[str]) -> Any:
    req = _wait_req(ctx, event, key, timeout, name)
    return _event(ctx, req, await _backend(ctx).request_async(req))


# ------------------------------------------------------------------------------------------------
# A step in one transaction with its result


def _tx_target(ctx: Any) -> Tuple[Any, int]:
    """Where a transactional step runs: run_inline's target (a caller's connection: in a savepoint
    of its transaction), else the App's database."""
    if ctx._token is None:
        raise PgjobqError(f"job {ctx.id}: a step with transaction=True needs the job's lease token (a worker of "
                          "protocol 3, or app.run_inline())")
    if isinstance(ctx._durable, _Direct) and ctx._durable.target is not None:
        return ctx._durable.target, ctx._token
    url = getattr(ctx.app, "database_url", None) if ctx.app is not None else None
    return _sql.default_url(url), ctx._token


@contextlib.contextmanager
def _step_transaction(target: Any) -> Iterator[Any]:
    """A transaction of the package's own (a URL, an Engine), or a savepoint of the caller's."""
    if _sql.classify(target) in ("url", "sa_engine"):
        with _sql.transaction(target) as conn:
            yield conn
        return
    _sql.run(target, "SAVEPOINT pgjobq_step", {})
    try:
        yield target
    except BaseException:
        _sql.run(target, "ROLLBACK TO SAVEPOINT pgjobq_step", {})
        raise
    _sql.run(target, "RELEASE SAVEPOINT pgjobq_step", {})


def _step_tx(ctx: Any, name: str, fn: Callable[[Any], Any]) -> Any:
    target, token = _tx_target(ctx)
    p = {"id": ctx.id, "token": token, "name": name}
    try:
        with _step_transaction(target) as conn:
            (outcome, result), = _sql.run(conn, _STEP_GET, p)
            if outcome == "lost":
                raise LeaseLost(f"job {ctx.id}: the lease is lost")
            if outcome == "stored":
                return result
            value = fn(conn)
            p["value"] = dumps(value, f"the result of step {name!r}", limit=False)
            (outcome, result), = _sql.run(conn, _STEP_PUT, p)
            if outcome == "lost":
                raise LeaseLost(f"job {ctx.id}: the lease is lost: step {name!r} not stored, its transaction "
                                "rolled back")
            if outcome == "exists":
                raise _Exists(result)
            return result
    except _Exists as e:
        return e.result


async def _step_tx_async(ctx: Any, name: str, fn: Callable[[Any], Any]) -> Any:
    url, token = _tx_target(ctx)
    if not isinstance(url, str):
        raise PgjobqError(f"job {ctx.id}: step_async(transaction=True) runs on a connection of its own: give "
                          "run_inline a URL")
    p = {"id": ctx.id, "token": token, "name": name}
    conn, _ = await _sql._atake(url)
    committed = False
    try:
        try:
            async with conn.transaction():
                (outcome, result), = await _sql.arun(conn, _STEP_GET, p)
                if outcome == "lost":
                    raise LeaseLost(f"job {ctx.id}: the lease is lost")
                if outcome == "stored":
                    value_out = result
                else:
                    value = fn(conn)
                    if asyncio.iscoroutine(value):
                        value = await value
                    p["value"] = dumps(value, f"the result of step {name!r}", limit=False)
                    (outcome, result), = await _sql.arun(conn, _STEP_PUT, p)
                    if outcome == "lost":
                        raise LeaseLost(f"job {ctx.id}: the lease is lost: step {name!r} not stored, its "
                                        "transaction rolled back")
                    if outcome == "exists":
                        raise _Exists(result)
                    value_out = result
            committed = True
            return value_out
        except _Exists as e:
            committed = True  # rolled back cleanly: the connection is sound
            return e.result
    finally:
        await _sql._arelease(url, conn, committed)


# ------------------------------------------------------------------------------------------------
# Events


def send_event(target: Any, name: str, key: Any, payload: Any) -> int:
    check_name(name, "an event's name")
    rows = _sql.run(target, _SEND, {"name": name, "key": _key(key),
                                    "payload": dumps(payload, "the event's payload")})
    return int(rows[0][1])


async def send_event_async(target: Any, name: str, key: Any, payload: Any) -> int:
    check_name(name, "an event's name")
    rows = await _sql.arun(target, _SEND, {"name": name, "key": _key(key),
                                           "payload": dumps(payload, "the event's payload")})
    return int(rows[0][1])


def _shards_in_order(m: Any) -> List[str]:
    return sorted(m.shards, key=lambda s: m.shards[s][0])


def _sent_everywhere(total: int, failed: List[BaseException]) -> int:
    """The jobs resumed over the shards, or the first shard's failure, carrying ``resumed`` (what the
    others resumed) and ``failed`` (every failure, one per shard that did not take it)."""
    if failed:
        e = failed[0]
        e.resumed = total  # type: ignore[attr-defined]
        e.failed = failed  # type: ignore[attr-defined]
        raise e
    return total


def send_event_cluster(cl: Any, name: str, key: Any, payload: Any) -> int:
    """send_event on every shard of the cluster (a job waiting for it may be on any), each in a
    transaction of its own; the others go on when one fails (an event is a fact: sending it again
    changes nothing for the jobs that got it)."""
    check_name(name, "an event's name")
    dumps(payload, "the event's payload")  # (bad input: refused before any shard is asked)
    m = cl.map()
    total, failed = 0, []
    for shard in _shards_in_order(m):
        try:
            total += cl.on_shard(m, shard, send_event, name, key, payload)
        except Exception as e:  # noqa: BLE001 - the other shards still get it
            failed.append(e)
    return _sent_everywhere(total, failed)


async def send_event_cluster_async(cl: Any, name: str, key: Any, payload: Any) -> int:
    check_name(name, "an event's name")
    dumps(payload, "the event's payload")
    m = cl.map()
    total, failed = 0, []
    for shard in _shards_in_order(m):
        try:
            total += await cl.aon_shard(m, shard, send_event_async, name, key, payload)
        except Exception as e:  # noqa: BLE001
            failed.append(e)
    return _sent_everywhere(total, failed)

