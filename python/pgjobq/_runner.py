"""The coprocess side of ``pgjobq work --coproc`` (docs/coproc.md), for an App's tasks.

The worker (the C engine) claims, leases, heartbeats, times out and fences; it sends each job as a
JSON line on this process's standard input and reads one answer line per job on its standard
output.  Here: one asyncio event loop reads the lines, runs ``async def`` tasks on the loop and
plain ``def`` tasks on a thread pool, all concurrently, and writes the answers (a burst of answers
goes out in one write).  A ``{"cancel": id}`` line cancels an async task's asyncio task and sets a
sync task's ``ctx.cancelled``; no answer is expected for it.

The protocol's standard output is kept to this module: file descriptor 1 is pointed at standard
error before the App is imported, so that a ``print()`` in a task lands in the worker's log rather
than breaking the protocol.  ``sys.stdout`` and ``sys.stderr`` write each line as soon as it is
whole, prefixed with the job id of the task that wrote it (``job 42: ...``), and the worker logs it
at the level the line starts with (``WARNING: ...``), else at info; logging, unless the App set it
up itself, writes ``LEVEL: logger: message`` at INFO and above.

With a worker that speaks version 2 of the protocol ($PGJOBQ_COPROC_PROTOCOL): a ``{"ready": true}``
line once the App is imported (a process that dies before it is a broken deployment, not a failed
job), and a job of a kind the App has no task for is handed back (``"status": "snooze"`` with
``"hand_back": true``, which counts no snooze) rather than failed, unless ``--fail-unknown-kinds``.  Version 3 adds the job's lease token to its line and
the step requests (``ctx.step``, ``ctx.sleep``, ``ctx.wait_for_event``: docs/durable.md): a request
line waits for its answer line; ``{"parked": id}`` ends a job a sleep or a wait parked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import importlib
import inspect
import io
import json
import logging
import os
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

from . import _durable
from ._util import check_json, delay_seconds
from .app import App, Task
from .context import Cancelled, Context, ParentResult
from .errors import Fail, InvalidJob, Retry, Snooze

_decode = json.JSONDecoder().raw_decode
ERROR_MAX = 4000  # characters of an error kept (the table keeps 16 KiB)
TRACE_LINES = 8   # lines of a traceback's end kept below the exception
EX_CONFIG = 78    # sysexits.h: the App cannot be loaded (a broken deployment, not a failed job)
UNKNOWN_KIND_DELAY = 60.0  # seconds before a job of a kind the App does not know runs again
UNKNOWN_KIND_WARN_EVERY = 60.0  # seconds between two warnings about one unknown kind

# The job of the task running in this context (its thread, its asyncio task): each line it writes
# carries its id.
_job_id: "contextvars.ContextVar[Optional[int]]" = contextvars.ContextVar("pgjobq_job_id", default=None)


def load_app(spec: str) -> App:
    """``module.path:attribute`` (the attribute defaults to ``app``) -> the App."""
    mod, _, attr = spec.partition(":")
    if not mod:
        raise SystemExit(f"pgjobq: {spec!r} is not MODULE:APP (e.g. myapp.tasks:app)")
    module = importlib.import_module(mod)
    obj = module
    for part in (attr or "app").split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise SystemExit(f"pgjobq: module {mod} has no {attr or 'app'} (give MODULE:APP, e.g. {mod}:app)")
    if not isinstance(obj, App):
        raise SystemExit(f"pgjobq: {spec} is a {type(obj).__name__}, not a pgjobq.App")
    return obj


def load_app_or_exit(spec: str, who: str) -> App:
    """load_app, or exit 78 (EX_CONFIG) with the traceback on standard error: a module that cannot be
    imported (a missing setting, a package not installed) is a broken deployment, said before any job
    is claimed."""
    try:
        return load_app(spec)
    except SystemExit as e:
        if isinstance(e.code, str):  # load_app's own message: not MODULE:APP, no such attribute
            print(e.code, file=sys.stderr, flush=True)
            raise SystemExit(EX_CONFIG) from None
        raise
    except Exception:  # noqa: BLE001 - whatever importing the App raised
        traceback.print_exc()
        print(f"{who}: cannot import {spec} (the traceback above): not starting", file=sys.stderr, flush=True)
        raise SystemExit(EX_CONFIG) from None


class _LogLines(io.TextIOBase):
    """``sys.stdout`` and ``sys.stderr`` of the coprocess: each line written goes to file descriptor 2
    (the worker's log) as soon as it is whole, prefixed with ``job N: `` when a task wrote it.  What a
    thread has written without a line break waits for the rest of its line (or a flush)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self._local = threading.local()
        self._binary = _BinaryLines(self)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "replace"

    @property
    def buffer(self) -> "_BinaryLines":  # for code that writes bytes to sys.stdout.buffer
        return self._binary

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        pending = getattr(self._local, "pending", "") + text
        if "\n" in pending:
            *lines, pending = pending.split("\n")
            self._out(lines)
        self._local.pending = pending
        return len(text)

    def flush(self) -> None:
        pending = getattr(self._local, "pending", "")
        if pending:
            self._local.pending = ""
            self._out([pending])

    def _out(self, lines: List[str]) -> None:
        job = _job_id.get()
        prefix = f"job {job}: " if job is not None else ""
        data = "".join(f"{prefix}{line}\n" for line in lines).encode("utf-8", "replace")
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._fd, view):]
            except InterruptedError:
                continue
            except OSError:
                return  # the worker is gone: nothing to tell


class _BinaryLines:
    """``sys.stdout.buffer`` of the coprocess: bytes, decoded and written as text lines."""

    def __init__(self, text: _LogLines) -> None:
        self._text = text

    def write(self, data: bytes) -> int:
        self._text.write(bytes(data).decode("utf-8", "replace"))
        return len(data)

    def flush(self) -> None:
        self._text.flush()


class _LevelEveryLine(logging.Formatter):
    """``LEVEL: logger: message``, the level at the start of every line of the record (a traceback's
    too), for the worker to log each at the record's level."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return "\n".join(f"{record.levelname}: {line}" for line in text.split("\n"))


def _default_logging() -> None:
    """Unless the App set logging up: records of INFO and above to standard error, with their level."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LevelEveryLine("%(name)s: %(message)s"))
    root.addHandler(handler)
    if root.level == logging.WARNING:  # the default: the worker's --log-level filters what is logged
        root.setLevel(logging.INFO)


_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _internal(filename: str) -> bool:
    """Frames of this package and of the machinery that called the task (thread pool, asyncio)."""
    return (filename.startswith(_HERE) or f"{os.sep}concurrent{os.sep}futures{os.sep}" in filename
            or f"{os.sep}asyncio{os.sep}" in filename)


def describe(exc: BaseException) -> str:
    """The exception, then the last lines of its traceback (the task's frames: where it was
    raised)."""
    head = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _internal(f.filename)]
    lines = [ln for ln in "".join(traceback.format_list(frames)).splitlines()
             if ln.strip() and set(ln.strip()) - set("^~")]  # no caret lines
    text = head + ("\n" + "\n".join(lines[-TRACE_LINES:]) if lines else "")
    return text if len(text) <= ERROR_MAX else text[: ERROR_MAX - 3] + "..."


def _call(job_id: int, fn: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """A sync task on a thread of the pool (which does not carry the caller's context)."""
    token = _job_id.set(job_id)
    try:
        return fn(*args, **kwargs)
    finally:
        _job_id.reset(token)


def _to_the_end(coro: Any, job_id: int) -> Any:
    """The value of a coroutine that cannot suspend (an ``async def`` without await, async with or
    async for), run in a copy of the current context as an asyncio Task would run it."""
    context = contextvars.copy_context()
    context.run(_job_id.set, job_id)
    try:
        context.run(coro.send, None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a task without await suspended")


class _Lines(asyncio.Protocol):
    def __init__(self, runner: "Runner") -> None:
        self.runner = runner
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if b"\n" not in data:
            return
        *lines, self.buf = self.buf.split(b"\n")
        runner = self.runner
        runner.reading = True  # the answers of this read go out in one write, at its end
        try:
            for line in lines:
                if line:
                    runner.on_line(line)
        finally:
            runner.reading = False
            runner.flush()

    def eof_received(self) -> Optional[bool]:
        return False

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self.buf.strip():
            self.runner.on_line(self.buf)
        self.runner.on_eof()


class Runner:
    def __init__(self, app: App, threads: int, out_fd: int, protocol: int = 1, fail_unknown_kinds: bool = False,
                 unknown_kind_delay: float = UNKNOWN_KIND_DELAY) -> None:
        self.app = app
        self.out_fd = out_fd
        self.protocol = protocol
        self.fail_unknown_kinds = fail_unknown_kinds or protocol < 2  # (a version 1 worker knows no snooze)
        self.unknown_kind_delay = unknown_kind_delay
        self.unknown_warned: Dict[str, float] = {}  # kind -> when it was last warned about
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="pgjobq-task")
        self.running: Dict[int, Tuple["asyncio.Task[None]", Context]] = {}
        self.requests: Dict[int, "asyncio.Future[Dict[str, Any]]"] = {}  # a job's step request, until answered
        self.out: List[bytes] = []
        self.flush_pending = False
        self.reading = False
        self.loop: asyncio.AbstractEventLoop
        self.loop_thread = 0
        self.eof: "asyncio.Future[None]"

    # -- input -----------------------------------------------------------------------------------
    def on_line(self, line: bytes) -> None:
        try:
            # (str: json skips guessing the bytes' encoding; raw_decode: the worker's lines start with
            # their object, so there is no whitespace for loads to look for)
            text = line.decode()
            msg = _decode(text if text[:1] == "{" else text.strip())[0]
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            print(f"WARNING: pgjobq.coproc: ignoring a line that is not a JSON object: {line[:200]!r}",
                  file=sys.stderr)
            return
        if "cancel" in msg:
            self.cancel(msg["cancel"])
            return
        if "parked" in msg:
            self.parked(msg["parked"])
            return
        if "payload" not in msg and ("step" in msg or "sleep" in msg or "wait" in msg):
            self.answered(msg.get("id"), msg)
            return
        self.start(self._context(msg))

    def on_eof(self) -> None:
        if not self.eof.done():
            self.eof.set_result(None)

    def cancel(self, job_id: Any) -> None:
        entry = self.running.pop(job_id, None)
        fut = self.requests.pop(job_id, None) if type(job_id) is int else None
        if fut is not None and not fut.done():  # (a sync task's thread waits on it)
            fut.set_exception(Cancelled("the worker gave the job up (cancelled, timed out, lease lost or "
                                        "shutting down)"))
        if entry is None:
            return  # answered already
        task, ctx = entry
        ctx._cancel("the worker gave the job up (cancelled, timed out, lease lost or shutting down)")
        task.cancel()

    # -- step requests (protocol 3, docs/durable.md) -----------------------------------------------
    async def request(self, ctx: Context, line: bytes) -> Dict[str, Any]:
        """A step request's line to the worker, and its answer (on the loop)."""
        if ctx.id not in self.running or ctx.id in self.requests:
            raise Cancelled(f"job {ctx.id}: given up, or a request of it is already waiting for its answer")
        fut: "asyncio.Future[Dict[str, Any]]" = self.loop.create_future()
        self.requests[ctx.id] = fut
        self.out.append(line)
        self._flush_soon()
        try:
            return await fut
        finally:
            if self.requests.get(ctx.id) is fut:
                del self.requests[ctx.id]

    def answered(self, job_id: Any, msg: Dict[str, Any]) -> None:
        fut = self.requests.get(job_id) if type(job_id) is int else None
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def parked(self, job_id: Any) -> None:
        """The worker parked the job (a sleep, a wait): its attempt is over, no answer is wanted."""
        entry = self.running.pop(job_id, None)
        if entry is not None:
            entry[1]._parked = True
        self.answered(job_id, {"parked": True})

    # -- output ----------------------------------------------------------------------------------
    def answer(self, ctx: Context, status: str, fields: Dict[str, Any]) -> None:
        """A running job's answer (from its asyncio Task)."""
        entry = self.running.get(ctx.id)
        if entry is None or entry[1] is not ctx:
            return  # given up meanwhile (and maybe sent again since): this attempt's answer is not wanted
        del self.running[ctx.id]
        self.emit(ctx.id, status, fields)

    def emit(self, job_id: Any, status: str, fields: Dict[str, Any]) -> None:
        if not fields and status == "completed" and type(job_id) is int:
            self.out.append(b'{"id":%d,"status":"completed"}\n' % job_id)  # the common answer, unencoded
        else:
            msg: Dict[str, Any] = {"id": job_id, "status": status}
            msg.update(fields)
            self.out.append(json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
        self._flush_soon()

    def progress(self, ctx: Context, data: bytes) -> None:
        """ctx.set_progress's line to the worker, from the loop or from a sync task's thread."""
        if threading.get_ident() == self.loop_thread:
            self._progress_line(ctx, data)
        else:
            self.loop.call_soon_threadsafe(self._progress_line, ctx, data)

    def _progress_line(self, ctx: Context, data: bytes) -> None:
        entry = self.running.get(ctx.id)
        if entry is None or entry[1] is not ctx:
            return  # answered or given up: the worker would ignore it
        self.out.append(b'{"id":%d,"progress":%s}\n' % (ctx.id, data))
        self._flush_soon()

    def _flush_soon(self) -> None:
        """What was queued goes out at the loop's next turn (or at the end of the read being handled)."""
        if not self.flush_pending and not self.reading:
            self.flush_pending = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_pending = False
        if not self.out:
            return
        data = b"".join(self.out)
        self.out.clear()
        view = memoryview(data)
        try:
            while view:
                n = os.write(self.out_fd, view)
                view = view[n:]
        except BrokenPipeError:
            os._exit(0)  # the worker is gone

    # -- a job -----------------------------------------------------------------------------------
    def _context(self, msg: Dict[str, Any]) -> Context:
        deadline_ms = msg.get("deadline_ms")
        deadline = time.monotonic() + (deadline_ms / 1000.0 if isinstance(deadline_ms, (int, float)) else 1e9)
        given = msg.get("parents")
        parents = [ParentResult(int(p.get("id")), str(p.get("state")), p.get("result"))
                   for p in given if isinstance(p, dict)] if given else []
        ctx = Context(msg["id"], msg.get("queue", ""), msg.get("kind", ""), int(msg.get("attempt", 1)),
                      int(msg.get("max_attempts", 1)), msg.get("payload"), parents, deadline, self.app,
                      msg.get("traceparent") if isinstance(msg.get("traceparent"), str) else None)
        ctx._report = self.progress
        if self.protocol >= 3:
            ctx._durable = _durable._Lines(self, ctx)
            token = msg.get("lease_token")
            ctx._token = token if type(token) is int else None
        return ctx

    def _retry_fields(self, task: Optional[Task], attempt: int, error: str, delay: Any = None) -> Dict[str, Any]:
        fields: Dict[str, Any] = {"error": error}
        try:
            if delay is not None:
                s: Optional[float] = delay_seconds(delay, "Retry(delay=...)")
            else:
                s = task.backoff_delay(attempt) if task is not None else None
        except Exception as e:  # a bad delay or a failing backoff function: the database's backoff
            fields["error"] = f"{error}\n(and the retry delay could not be computed: {describe(e)})"
            s = None
        if s is not None:
            fields["delay_ms"] = int(round(s * 1000))
        return fields

    @staticmethod
    def _binds(task: Task, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
        try:
            task._payload_sig.bind(*args, **kwargs)
        except TypeError:
            return False
        return True

    def start(self, ctx: Context) -> None:
        """Runs a job's task: an ``async def`` that never awaits to its end at once (it cannot
        suspend: no asyncio Task is needed), any other on an asyncio Task of its own, registered in
        ``running`` until it answers."""
        task = self.app.tasks.get(ctx.kind)
        if task is None:
            self.unknown_kind(ctx)
            return
        args, kwargs = task._call_args(ctx.payload)
        if not (task._fits(kwargs) if not args else self._binds(task, args, kwargs)):
            try:
                task._payload_sig.bind(*args, **kwargs)
                why = "it does not fit"
            except TypeError as e:
                why = str(e)
            self.emit(ctx.id, "failed", {"error": f"the payload does not fit {task.name}{task._payload_sig}: {why}"})
            return
        if task.pass_context:
            args = (ctx,) + args
        timeout = task.timeout
        if timeout is not None and timeout >= ctx.time_left():
            timeout = None  # the worker's deadline comes first: it will send a cancel
        if task._at_once and timeout is None:
            try:
                value = _to_the_end(task.fn(*args, **kwargs), ctx.id)
            except BaseException as e:  # noqa: B036 - whatever a task raises is its attempt's failure
                answer = self._raised(ctx, task, e, None)
            else:
                answer = self._returned(ctx, task, value)
            if answer is not None:
                self.emit(ctx.id, *answer)
            return
        # Registered before the task first runs, so that a cancel in the same read finds it.
        self.running[ctx.id] = (self.loop.create_task(self.run_job(ctx, task, args, kwargs, timeout)), ctx)

    def unknown_kind(self, ctx: Context) -> None:
        """A job of a kind the App has no task for: handed back untouched (no attempt used) to run
        after a delay, when a worker of a newer release may have the task (a rolling deploy that
        reached the producers first), with a warning (once a minute per kind); failed for good with
        --fail-unknown-kinds."""
        known = ", ".join(sorted(self.app.tasks)) or "none"
        why = f"no task for the kind {ctx.kind!r} in this App (its tasks: {known})"
        if self.fail_unknown_kinds:
            self.emit(ctx.id, "failed", {"error": why})
            return
        delay = self.unknown_kind_delay
        now = time.monotonic()
        if now - self.unknown_warned.get(ctx.kind, -1e9) >= UNKNOWN_KIND_WARN_EVERY:
            self.unknown_warned[ctx.kind] = now
            print(f"WARNING: job {ctx.id}: {why}: handed back untouched, no attempt used, to run again in "
                  f"{delay:g} s (jobs of this kind are said once a minute; --fail-unknown-kinds fails them)",
                  file=sys.stderr, flush=True)
        # "hand_back": not the task's choice, so no snooze counted against pgjobq.snooze_cap() (a worker
        # older than the marker ignores it and counts one).
        self.emit(ctx.id, "snooze", {"reason": f"{why}: handed back by a worker without it",
                                     "delay_ms": int(round(delay * 1000)), "hand_back": True})

    async def run_job(self, ctx: Context, task: Task, args: Tuple[Any, ...], kwargs: Dict[str, Any],
                      timeout: Optional[float]) -> None:
        _job_id.set(ctx.id)  # in this asyncio task's own context
        try:
            if task.is_async:
                coro = task.fn(*args, **kwargs)
                value = await (asyncio.wait_for(coro, timeout) if timeout is not None else coro)
            else:
                fut = self.loop.run_in_executor(self.pool, _call, ctx.id, task.fn, args, kwargs)
                value = await (asyncio.wait_for(fut, timeout) if timeout is not None else fut)
                if inspect.isawaitable(value):
                    value = await value
        except BaseException as e:  # noqa: B036 - whatever a task raises is its attempt's failure
            answer = self._raised(ctx, task, e, timeout)
        else:
            answer = self._returned(ctx, task, value)
        if answer is not None:
            self.answer(ctx, *answer)

    def _raised(self, ctx: Context, task: Task, e: BaseException,
                timeout: Optional[float]) -> Optional[Tuple[str, Dict[str, Any]]]:
        """The answer for a task that raised ``e``; None when none is wanted (the worker gave it up, or
        the job was parked)."""
        if isinstance(e, _durable.Parked) or ctx._parked:
            return None
        if isinstance(e, asyncio.CancelledError):
            if ctx.cancelled:
                return None
            return "retry", self._retry_fields(task, ctx.attempt, "the task was cancelled (asyncio.CancelledError)")
        if timeout is not None and isinstance(e, asyncio.TimeoutError):
            ctx._cancel(f"timed out after {timeout:g} s")
            return "retry", self._retry_fields(task, ctx.attempt, f"timed out after {timeout:g} s (the task's timeout)")
        if isinstance(e, Retry):
            return "retry", self._retry_fields(task, ctx.attempt, e.message, e.delay)
        if isinstance(e, Snooze):
            return self._snooze(e)
        if isinstance(e, Fail):
            return "failed", {"error": e.message}
        why = task._gives_up(e)  # retry_on, fail_on
        if why is not None:
            return "failed", {"error": f"{describe(e)}\n({why})"}
        return "retry", self._retry_fields(task, ctx.attempt, describe(e))

    def _snooze(self, e: Snooze) -> Tuple[str, Dict[str, Any]]:
        """The answer for a task that raised Snooze: the job handed back, no attempt used (a worker of
        protocol 1 knows no snooze: a retry after the same delay, which uses one)."""
        fields: Dict[str, Any] = {"reason": str(e.reason)}
        if e.delay is not None:
            fields["delay_ms"] = int(round(delay_seconds(e.delay, "Snooze(delay=...)") * 1000))
        if getattr(self, "protocol", 2) < 2:
            fields["error"] = fields.pop("reason") + " (a snooze, run as a retry by a worker without snoozes)"
            return "retry", fields
        return "snooze", fields

    def _returned(self, ctx: Context, task: Task, value: Any) -> Tuple[str, Dict[str, Any]]:
        if value is None:
            return "completed", {}
        try:
            check_json(value, f"the result of {task.name}")
        except InvalidJob as e:
            return "retry", self._retry_fields(task, ctx.attempt, str(e))
        return "completed", {"result": value}

    # -- the whole life --------------------------------------------------------------------------
    async def main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self.eof = self.loop.create_future()
        if self.protocol >= 2:
            self.out.append(b'{"ready":true}\n')  # the App is loaded: from now on a death is a crash
            self.flush()
        try:
            await self.loop.connect_read_pipe(lambda: _Lines(self), sys.stdin.buffer)
        except ValueError:  # stdin is a regular file: read it on a thread
            self.loop.run_in_executor(None, self._read_blocking)
        await self.eof
        # End of input: the worker is stopping and has waited for the jobs it wanted answered.
        for task, ctx in list(self.running.values()):
            ctx._cancel("the worker is shutting down")
            task.cancel()
        if self.out:
            self.flush()

    def _read_blocking(self) -> None:
        for line in sys.stdin.buffer:
            if line.strip():
                self.loop.call_soon_threadsafe(self.on_line, line)
        self.loop.call_soon_threadsafe(self.on_eof)


def _protocol() -> int:
    """The version of the coprocess protocol the worker speaks ($PGJOBQ_COPROC_PROTOCOL; 1 without)."""
    try:
        return max(1, int(os.environ.get("PGJOBQ_COPROC_PROTOCOL", "1")))
    except ValueError:
        return 1


def main(argv: Optional[List[str]] = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python3 -m pgjobq.coproc",
        description="The handler side of `pgjobq work --coproc`: runs an App's tasks for the pgjobq worker "
                    "(python3 -m pgjobq worker starts it for you).")
    ap.add_argument("app", help="MODULE:APP, e.g. myapp.tasks:app")
    ap.add_argument("--threads", type=int, default=32, help="threads for sync tasks (default 32)")
    ap.add_argument("--fail-unknown-kinds", action="store_true",
                    help="fail for good a job whose kind the App has no task for (default: hand it back)")
    ap.add_argument("--unknown-kind-delay", type=float, default=UNKNOWN_KIND_DELAY, metavar="SECONDS",
                    help=f"when a job handed back for its unknown kind runs again (default {UNKNOWN_KIND_DELAY:g})")
    args = ap.parse_args(argv)

    # The protocol's output is a copy of fd 1; fd 1 itself now goes to stderr (the worker's log), and
    # what Python writes there goes a line at a time, each with its job.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = _LogLines(2)
    sys.stderr = _LogLines(2)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    app = load_app_or_exit(args.app, "pgjobq.coproc")
    _default_logging()
    runner = Runner(app, args.threads, out_fd, _protocol(), args.fail_unknown_kinds, args.unknown_kind_delay)
    asyncio.run(runner.main())
    sys.stdout.flush()
    sys.stderr.flush()
    # Sync tasks still running cannot be stopped; the worker has given them up already.
    os._exit(0)
