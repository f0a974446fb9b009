"""The App the worker tests run (python3 -m pgjobq worker py_tasks:app).  Tasks talk back to the test
through files in a directory the test gives them (``d``)."""

import asyncio
import contextvars
import os
import time

import pgjobq

app = pgjobq.App(name="pytests")


def mark(d, name, text=""):
    with open(os.path.join(d, name), "a") as f:
        f.write(text)


@app.task
def add(a, b):
    print(f"add({a}, {b}) prints, and the protocol survives it")
    return {"sum": a + b}


@app.task(pass_context=True)
async def about(ctx):
    await asyncio.sleep(0)
    return {"id": ctx.id, "attempt": ctx.attempt, "max_attempts": ctx.max_attempts, "kind": ctx.kind,
            "parents": [[p.id, p.state, p.result] for p in ctx.parents], "time_left": ctx.time_left() > 0}


@app.task(pass_context=True)
def trace_of(ctx):
    """The trace context the job was enqueued with (docs/queues.md, "Trace context")."""
    return {"traceparent": ctx.traceparent}


@app.task(pass_context=True, retry_backoff=0.3, max_attempts=5)
def flaky(ctx, until, d):
    mark(d, "flaky.times", f"{time.time()}\n")
    if ctx.attempt < until:
        raise ConnectionError(f"attempt {ctx.attempt} fails")
    return {"attempt": ctx.attempt}


@app.task(pass_context=True)
async def retry_later(ctx, delay, d):
    mark(d, "retry_later.times", f"{time.time()}\n")
    if ctx.attempt == 1:
        raise pgjobq.Retry("not yet", delay=delay)
    return {"attempt": ctx.attempt}


@app.task(pass_context=True, max_attempts=1)
def snooze_once(ctx, d):
    mark(d, "snooze_once.times", f"{time.time()}\n")
    if len(open(os.path.join(d, "snooze_once.times")).read().split()) == 1:
        raise pgjobq.Snooze(0.5, "the bank is closed")
    return {"attempt": ctx.attempt}


@app.task(max_attempts=5)
def give_up():
    raise pgjobq.Fail("no such mailbox")


def _deep(n):
    if n == 0:
        raise KeyError("missing")
    return _deep(n - 1)


@app.task(max_attempts=2, retry_backoff=pgjobq.exponential_backoff(first=0.1, jitter=0))
def broken():
    return _deep(2)


_last = contextvars.ContextVar("last", default=None)


@app.task(max_attempts=2, retry_backoff=0.1)
async def at_once(n, fail=""):
    """No await: the coprocess side runs it to its end at once, without an asyncio Task."""
    before = _last.get()
    _last.set(n)  # seen by the next job if it ran in the reader's own context rather than a copy
    if fail == "raise":
        return _deep(1)
    if fail == "fail":
        raise pgjobq.Fail("failed at once, for good")
    if fail == "nonjson":
        return {"when": object()}
    if fail == "timeout":  # its own TimeoutError, not a timeout of the task's: an exception like any
        raise TimeoutError("slow upstream")
    return {"n": n, "before": before}


@app.task(timeout=0.5, max_attempts=1)
async def sleepy_async(d):
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        mark(d, "sleepy_async.cancelled")
        raise


@app.task(timeout="500ms", max_attempts=1, pass_context=True)
def sleepy_sync(ctx, d):
    t0 = time.monotonic()
    while not ctx.cancelled and time.monotonic() - t0 < 20:
        time.sleep(0.01)
    mark(d, "sleepy_sync.saw_cancel" if ctx.cancelled else "sleepy_sync.never_told")


@app.task
async def wait_for_cancel(d):
    mark(d, "started")
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        mark(d, "cancelled")
        raise
    mark(d, "finished")


@app.task(pass_context=True, max_attempts=3)
def crash(ctx, d):
    if ctx.attempt == 1:
        mark(d, "crashing")
        os._exit(3)  # the whole coprocess dies
    return {"survived": ctx.attempt}


@app.task(pass_context=True, max_attempts=3)
async def held(ctx, d):
    """Runs while the coprocess crashes under it."""
    if ctx.attempt == 1:
        mark(d, f"held.{ctx.id}")
        await asyncio.sleep(30)
    return {"attempt": ctx.attempt}


_active = 0
_peak = 0


@app.task(max_attempts=1)
async def count(d, i):
    global _active, _peak
    _active += 1
    _peak = max(_peak, _active)
    try:
        await asyncio.sleep(0.005)
        fd = os.open(os.path.join(d, "runs"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{i}\n".encode())
        finally:
            os.close(fd)
        return {"peak": _peak}
    finally:
        _active -= 1


@app.task
def nonjson():
    return {"when": object()}


@app.task
async def block_loop(d, seconds):
    mark(d, "blocking")
    time.sleep(seconds)  # blocks the event loop: a bug, but the lease is the engine's business
    return {"blocked": seconds}


@app.task(pass_context=True)
async def progressing(ctx, d):
    ctx.set_progress({"step": 1})
    while not os.path.exists(os.path.join(d, "seen")):
        await asyncio.sleep(0.02)
    try:
        ctx.set_progress({"big": "x" * 9000})
    except pgjobq.InvalidJob as e:
        mark(d, "refused", str(e))
    ctx.set_progress({"step": 2})
    return {"done": True}


@app.task(pass_context=True)
def progressing_sync(ctx, d):
    ctx.set_progress({"sync": 1})  # from the thread pool
    t0 = time.monotonic()
    while not os.path.exists(os.path.join(d, "seen_sync")) and time.monotonic() - t0 < 20:
        time.sleep(0.02)
    ctx.set_progress({"sync": 2})
    return None


@app.task(retry_on=ConnectionError, fail_on=KeyError, retry_backoff=0.1, max_attempts=3)
def picky(what):
    """retry_on and fail_on: ConnectionError retried, KeyError and anything else failed for good."""
    if what == "key":
        raise KeyError("no such key")
    if what == "conn":
        raise ConnectionError("the upstream hung up")
    raise ValueError(f"bad input {what!r}")


@app.task
def total(first, /, *more, **named):
    """Positional-only and *args parameters: deferred positionally, run positionally."""
    return {"total": first + sum(more) + sum(named.values()), "more": list(more)}


@app.task(pass_context=True, max_attempts=1)
def until_told(ctx, d):
    """Waits until the worker tells it to stop (a cancel), and writes when it was told."""
    mark(d, "started")
    told = ctx.cancel_event.wait(120)
    mark(d, "told" if told else "never_told", f"{time.time()}")


@app.task(pass_context=True, max_attempts=2)
def gathered(ctx, n, d, k):
    """Its first attempts wait until k jobs of its kind have started, then ask for a retry, so that
    their outcomes are written together; the one with n == 0 asks for it 4,000,000 days away, which
    PostgreSQL cannot store, the others at once.  A second attempt completes (n > 0)."""
    if ctx.attempt == 1:
        mark(d, f"gathered.{n}")
        t0 = time.monotonic()
        while sum(1 for f in os.listdir(d) if f.startswith("gathered.")) < k and time.monotonic() - t0 < 20:
            time.sleep(0.02)
    if n == 0:
        raise pgjobq.Retry("much later", delay="4000000d")
    if ctx.attempt == 1:
        raise pgjobq.Retry("soon", delay=0)
    return {"n": n}


@app.task(pass_context=True)
def configured(ctx):
    """The application's own configuration, and the App's database with no setup (test_deploy.py)."""
    print(f"configured sees {os.environ.get('DATABASE_URL')}")  # a password in it never reaches the log
    child = add.configure(queue=ctx.queue).defer(a=20, b=22)
    me = app.get(ctx.id)
    return {"setting": os.environ.get("APP_SETTING"), "database_url": "DATABASE_URL" in os.environ,
            "child": child.id, "me": [me.id, me.state]}


@app.task(pass_context=True)
def talk(ctx, d):
    """Writes to its output and its log, then waits (test_deploy.py: each line is in the worker's log while
    the task still runs)."""
    import logging
    import sys

    print(f"printed by {ctx.kind}")
    logging.getLogger("shop.tasks").info("an info record")
    logging.getLogger("shop.tasks").warning("a warning record")
    print("ERROR: said at error", file=sys.stderr)
    t0 = time.monotonic()
    while not os.path.exists(os.path.join(d, "go")) and time.monotonic() - t0 < 30:
        time.sleep(0.02)
    return {"talked": True}


@app.task(max_attempts=1)
def far_retry():
    raise pgjobq.Retry("much later", delay="4000000d")


# -- durable execution (test_durable.py) --------------------------------------------------------------

def _ledger_sync(conn, job_id, what):
    cur = conn.cursor()
    cur.execute("INSERT INTO durable_ledger VALUES (%s, %s)", (job_id, what))


@app.task(pass_context=True, retry_backoff=0.1, max_attempts=5)
def durable_sync(ctx, d, nap=0.3):
    def first():
        mark(d, f"{ctx.id}.a", "x")
        return {"a": ctx.attempt}

    def write(conn):
        mark(d, f"{ctx.id}.b", "x")
        _ledger_sync(conn, ctx.id, "sync")
        return "b"

    a = ctx.step("a", first)
    b = ctx.step("b", write, transaction=True)
    ctx.sleep(nap, name="nap")
    mark(d, f"{ctx.id}.after", "x")
    if ctx.attempt == 1:
        raise ConnectionError("once more, after the sleep")
    return {"a": a, "b": b, "attempt": ctx.attempt}


@app.task(pass_context=True, retry_backoff=0.1, max_attempts=5)
async def durable_async(ctx, d):
    async def first():
        await asyncio.sleep(0)
        mark(d, f"{ctx.id}.a", "x")
        return {"a": ctx.attempt}

    async def write(conn):
        mark(d, f"{ctx.id}.b", "x")
        await conn.execute("INSERT INTO durable_ledger VALUES (%s, 'async')", (ctx.id,))
        return "b"

    a = await ctx.step_async("a", first)
    b = await ctx.step_async("b", write, transaction=True)
    await ctx.sleep_async(0.3)
    if ctx.attempt == 1:
        raise ConnectionError("once more, after the sleep")
    return {"a": a, "b": b, "attempt": ctx.attempt}


@app.task(pass_context=True)
def wait_go(ctx, key, timeout=30):
    try:
        got = ctx.wait_for_event("go", key, timeout=timeout)
    except pgjobq.EventTimeout:
        return {"timeout": True}
    return {"event": got}


@app.task(pass_context=True, max_attempts=2)
def late_step(ctx):
    """Its transactional step finds its lease gone (expired under it, as after a stall): refused."""
    def write(conn):
        _ledger_sync(conn, ctx.id, "late")
        import psycopg

        with psycopg.connect(os.environ.get("PGJOBQ_TEST_DATABASE_URL", ""), autocommit=True) as other:
            other.execute("UPDATE pgjobq.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (ctx.id,))
        return "late"

    return {"b": ctx.step("b", write, transaction=True)}
