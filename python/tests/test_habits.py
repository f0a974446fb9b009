"""The habits Python users bring from Celery, RQ, Dramatiq and Procrastinate: retry_on / fail_on,
positional arguments and .delay(), a test mode (app.run_inline(), worker --burst), worker --reload,
warnings for an enqueue outside a transaction or in a session never committed, and the default
number of attempts of a Python task."""

import os
import signal
import subprocess
import sys
import warnings

import psycopg
import pytest

import pgjobq
import py_tasks
from conftest import CLI, HERE, PYDIR, URL, scalar, wait_until
from test_worker import FAST, history


def on(queue, task):
    return task.configure(queue=queue)


def job_row(job_id):
    with psycopg.connect(URL, autocommit=True) as c:
        return c.execute("SELECT state, attempt, max_attempts, payload, result, last_error FROM pgjobq.all_jobs"
                         " WHERE id = %s", (job_id,)).fetchone()


# -- retry_on / fail_on --------------------------------------------------------------------------------

def test_retry_on_and_fail_on_decide_per_exception(start_worker, queue):
    start_worker("--queue", f"{queue}:4", *FAST)
    conn = on(queue, py_tasks.picky).defer(URL, what="conn")
    value = on(queue, py_tasks.picky).defer(URL, what="value")
    key = on(queue, py_tasks.picky).defer(URL, what="key")

    state, attempt, _, error, _ = _finished(conn.id)
    assert (state, attempt) == ("failed", 3), error  # in retry_on: retried until attempts ran out
    state, attempt, _, error, _ = _finished(value.id)
    assert (state, attempt) == ("failed", 1), error
    assert error.startswith("ValueError: bad input 'value'") and "not in the task's retry_on" in error, error
    state, attempt, _, error, _ = _finished(key.id)
    assert (state, attempt) == ("failed", 1), error
    assert error.startswith("KeyError") and "is in the task's fail_on" in error, error


def _finished(job_id, timeout=30):
    wait_until(lambda: scalar("SELECT state FROM pgjobq.history WHERE id = %s", job_id), timeout, f"job {job_id}")
    return history(job_id)


def test_retry_on_and_fail_on_are_checked_when_the_task_is_declared():
    app = pgjobq.App(URL)
    with pytest.raises(TypeError, match="retry_on must be an exception class"):
        app.task(name="x", retry_on="ConnectionError")(lambda: None)
    with pytest.raises(TypeError, match="fail_on must be an exception class"):
        app.task(name="y", fail_on=(KeyError, 3))(lambda: None)


# -- positional arguments and .delay() -----------------------------------------------------------------

def test_positional_arguments_and_delay(start_worker, queue, monkeypatch):
    monkeypatch.setenv("PGJOBQ_DATABASE_URL", URL)  # .delay() enqueues on the App's own connection
    start_worker("--queue", f"{queue}:4", *FAST)
    added = on(queue, py_tasks.add).delay(2, 3)
    mixed = on(queue, py_tasks.add).delay(2, b=5)
    summed = on(queue, py_tasks.total).delay(1, 2, 3, x=4)
    # A job is the same however it was deferred: its arguments by name.
    assert job_row(added.id)[3] == {"a": 2, "b": 3}
    assert job_row(summed.id)[3] == {"first": 1, "more": [2, 3], "x": 4}
    assert py_tasks.app.result(added.id, timeout=30, conn=URL) == {"sum": 5}
    assert py_tasks.app.result(mixed.id, timeout=30, conn=URL) == {"sum": 7}
    assert py_tasks.app.result(summed.id, timeout=30, conn=URL) == {"total": 10, "more": [2, 3]}

    # A wrong call names the task's signature, and enqueues nothing.
    with pytest.raises(pgjobq.InvalidJob, match=r"add.delay: too many positional arguments \(the task is add\(a, b\)\)"):
        on(queue, py_tasks.add).delay(1, 2, 3)
    with pytest.raises(pgjobq.InvalidJob, match=r"missing a required argument: 'first' \(the task is total\(first, /"):
        on(queue, py_tasks.total).delay()
    with pytest.raises(TypeError, match=r"first argument is where to enqueue .* use add.delay\(...\) .*add\(a, b\)"):
        on(queue, py_tasks.add).defer(2, 3)
    with pytest.raises(TypeError, match="not 'ana@example.org'"):
        on(queue, py_tasks.add).defer("ana@example.org")
    assert scalar("SELECT count(*) FROM pgjobq.all_jobs WHERE queue = %s", queue) == 3


# -- the test mode -------------------------------------------------------------------------------------

def test_run_inline_runs_the_due_jobs_with_the_workers_rules(queue):
    app = pgjobq.App(URL, queue=queue)
    seen = []

    @app.task(pass_context=True, retry_backoff=0)
    def flaky(ctx, n):
        seen.append(("flaky", ctx.attempt))
        if ctx.attempt < 2:
            raise ConnectionError("try again")
        return {"n": n, "attempt": ctx.attempt}

    @app.task(retry_on=ConnectionError)
    def strict(n):
        raise ValueError(n)

    @app.task
    async def double(n):
        return n * 2

    @app.task(pass_context=True)
    def child(ctx):
        return {"parent": [p.result for p in ctx.parents]}

    @app.task(max_attempts=1)
    def not_yet():
        raise pgjobq.Snooze("1h", "not yet")

    a = flaky.delay(7)
    b = strict.delay(1)
    c = double.delay(21)
    kid = child.configure(after=[c]).delay()
    stranger = app.enqueue("not_ours", {"x": 1})
    later = double.configure(delay="1h").delay(1)
    snoozer = not_yet.delay()

    counts = app.run_inline()
    assert counts == {"completed": 3, "retried": 1, "failed": 1, "snoozed": 1, "handed_back": 1}, counts
    assert scalar("SELECT state = 'queued' AND attempt = 0 AND run_at > now() + interval '55 minutes'"
                  " AND last_error = 'not yet' FROM pgjobq.jobs WHERE id = %s", snoozer.id)
    assert app.result(a.id) == {"n": 7, "attempt": 2} and seen == [("flaky", 1), ("flaky", 2)]
    assert job_row(b.id)[:2] == ("failed", 1) and "not in the task's retry_on" in job_row(b.id)[5]
    assert app.result(c.id) == 42
    assert app.result(kid.id) == {"parent": [42]}  # released by its parent, run in the same call
    assert job_row(stranger.id)[:2] == ("queued", 0)  # handed back untouched: no attempt used
    assert job_row(later.id)[0] == "queued"  # not due
    assert app.run_inline() == {"handed_back": 1}


def test_worker_burst_drains_what_is_due_then_exits_0(start_worker, queue):
    jobs = [on(queue, py_tasks.add).defer(URL, a=i, b=1) for i in range(20)]
    later = on(queue, py_tasks.add).configure(delay="1h").defer(URL, a=0, b=0)
    w = start_worker("--queue", f"{queue}:4", "--burst", "--", "--log-level", "warn")
    try:
        rc = w.proc.wait(90)
    except subprocess.TimeoutExpired:
        raise AssertionError("the burst worker did not exit by itself")
    assert rc == 0
    assert [py_tasks.app.result(j.id, timeout=1, conn=URL) for j in jobs] == [{"sum": i + 1} for i in range(20)]
    assert job_row(later.id)[0] == "queued"


def test_worker_burst_and_reload_are_options_of_the_wrapper():
    r = subprocess.run([sys.executable, "-m", "pgjobq", "worker", "py_tasks:app", "--pgjobq", CLI, "--burst",
                        "--print-command"], env={**os.environ, "PYTHONPATH": os.pathsep.join([PYDIR, HERE])},
                       cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0 and r.stdout.rstrip().endswith(" --burst"), r.stdout
    r = subprocess.run([sys.executable, "-m", "pgjobq", "worker", "py_tasks:app", "--pgjobq", CLI, "--burst",
                        "--reload"], env={**os.environ, "PYTHONPATH": os.pathsep.join([PYDIR, HERE])},
                       cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 2 and "--burst and --reload do not go together" in r.stdout, r.stdout


# -- worker --reload -------------------------------------------------------------------------------------

RELOAD_TASKS = """
import os
import time

import pgjobq

app = pgjobq.App()
VERSION = {version}


@app.task(queue="{queue}", pass_context=True, max_attempts=1)
def which(ctx, d, hold=False):
    if hold:
        open(os.path.join(d, "held"), "w").close()
        while not os.path.exists(os.path.join(d, "release")):
            time.sleep(0.02)
    return {{"version": VERSION, "attempt": ctx.attempt}}
"""


def test_reload_restarts_on_a_change_and_loses_no_attempt(tmp_path, queue):
    d = str(tmp_path)
    module = tmp_path / "reload_tasks.py"
    module.write_text(RELOAD_TASKS.format(version=1, queue=queue))
    log = str(tmp_path / "worker.log")
    env = {**os.environ, "PYTHONPATH": PYDIR, "PGJOBQ_DATABASE_URL": URL, "PYTHONDONTWRITEBYTECODE": "1"}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pgjobq", "worker", "reload_tasks:app", "--pgjobq", CLI,
                                 "--reload", "--", "--log-level", "warn", "--poll", "200ms"],
                                env=env, cwd=d, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def log_has(text):
        with open(log) as f:
            return text in f.read()

    def result(job):
        wait_until(lambda: scalar("SELECT state FROM pgjobq.history WHERE id = %s", job.id), 30, f"job {job.id}", log)
        return job_row(job.id)[:2] + (job_row(job.id)[4],)

    try:
        wait_until(lambda: log_has("--reload: watching"), 30, "the reloading worker to start", log)
        held = pgjobq.enqueue(URL, "which", {"d": d, "hold": True}, queue=queue, max_attempts=1)
        wait_until(lambda: os.path.exists(os.path.join(d, "held")), 30, "the held job to start", log)

        # A change while the job runs: the worker restarts once it has finished (max_attempts=1: an
        # attempt lost would have failed the job).
        module.write_text(RELOAD_TASKS.format(version=22, queue=queue))
        wait_until(lambda: log_has("reload_tasks.py changed: restarting"), 30, "the reload", log)
        open(os.path.join(d, "release"), "w").close()
        assert result(held) == ("completed", 1, {"version": 1, "attempt": 1})
        after = pgjobq.enqueue(URL, "which", {"d": d}, queue=queue, max_attempts=1)
        assert result(after) == ("completed", 1, {"version": 22, "attempt": 1})

        # A change that does not import leaves the worker running on the code it has.
        module.write_text("this is not python\n")
        wait_until(lambda: log_has("does not import now"), 30, "the broken change to be noticed", log)
        again = pgjobq.enqueue(URL, "which", {"d": d}, queue=queue, max_attempts=1)
        assert result(again) == ("completed", 1, {"version": 22, "attempt": 1})
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()  # this pid only: the worker we started
            rc = proc.wait(10)
    assert rc == 0, open(log).read()[-3000:]


# -- an enqueue outside a transaction, or in one never committed ----------------------------------------

def test_autocommit_warns_once(queue):
    pgjobq._txn._warned.clear()  # once per process: start afresh
    add = on(queue, py_tasks.add)
    with psycopg.connect(URL, autocommit=True) as conn:
        with pytest.warns(pgjobq.TransactionWarning, match="autocommit mode") as caught:
            add.defer(conn, 1, 2)
        assert caught[0].filename == __file__  # where the defer is
        with warnings.catch_warnings(record=True) as again:
            warnings.simplefilter("always")
            add.defer(conn, 1, 2)  # once
            pgjobq._txn._warned.clear()
            with conn.transaction():  # a transaction block on an autocommit connection: no warning
                add.defer(conn, 1, 2)
        assert not [w for w in again if issubclass(w.category, pgjobq.TransactionWarning)], again
    with psycopg.connect(URL) as conn, warnings.catch_warnings(record=True) as plain:
        warnings.simplefilter("always")
        add.defer(conn, 1, 2)
    assert not [w for w in plain if issubclass(w.category, pgjobq.TransactionWarning)]
    assert scalar("SELECT count(*) FROM pgjobq.all_jobs WHERE queue = %s", queue) == 4


def test_a_session_closed_without_commit_warns(queue):
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    import psycopg2

    engine = create_engine("postgresql+psycopg2://", creator=lambda: psycopg2.connect(URL), future=True)
    add = on(queue, py_tasks.add)
    pgjobq._txn._warned.clear()
    with warnings.catch_warnings(record=True) as fine:
        warnings.simplefilter("always")
        with Session(engine) as s, s.begin():
            add.defer(s, 1, 1)  # committed
        try:
            with Session(engine) as s, s.begin():
                add.defer(s, 1, 1)
                raise RuntimeError("rolled back on purpose")
        except RuntimeError:
            pass
        s = Session(engine)
        add.defer(s, 1, 1)
        s.rollback()  # explicit: meant
        s.close()
    assert not [w for w in fine if issubclass(w.category, pgjobq.TransactionWarning)], [str(w.message) for w in fine]
    with pytest.warns(pgjobq.TransactionWarning, match="ended without a commit"):
        with Session(engine) as s:
            add.defer(s, 2, 2)  # SQLAlchemy 2.0 style: nothing commits this
    assert scalar("SELECT count(*) FROM pgjobq.all_jobs WHERE queue = %s", queue) == 1
    engine.dispose()


# -- the default number of attempts --------------------------------------------------------------------

def test_a_python_task_gets_ten_attempts_and_other_clients_keep_25(queue):
    app = pgjobq.App(URL, queue=queue)

    @app.task
    def plain():
        pass

    @app.task(max_attempts=7)
    def seven():
        pass

    assert job_row(plain.delay().id)[2] == 10
    assert job_row(seven.delay().id)[2] == 7
    assert job_row(plain.configure(max_attempts=2).delay().id)[2] == 2
    three = pgjobq.App(URL, queue=queue, max_attempts=3)
    assert job_row(three.task(name="plain")(lambda: None).delay().id)[2] == 3
    with pytest.raises(pgjobq.InvalidArgument, match="max_attempts"):
        pgjobq.App(URL, max_attempts=0)
    # The SQL API's and the command's default is unchanged.
    assert job_row(app.enqueue("raw", {}).id)[2] == 25
    r = subprocess.run([CLI, "--db", URL, "enqueue", "--queue", queue, "{}"], stdout=subprocess.PIPE, text=True)
    assert r.returncode == 0 and job_row(int(r.stdout))[2] == 25
