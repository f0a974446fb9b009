"""Durable execution in Python (docs/durable.md): ctx.step (and its transactional form), ctx.sleep and
ctx.wait_for_event, sync and async, under the worker and under app.run_inline()."""

import os
import time

import psycopg
import pytest

import pgjobq
import py_tasks
from conftest import URL, scalar, wait_until
from test_worker import FAST, wait_finished


@pytest.fixture
def ledger():
    with psycopg.connect(URL, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS durable_ledger (job bigint, what text)")


def runs(d, name):
    path = os.path.join(d, name)
    return len(open(path).read()) if os.path.exists(path) else 0


def test_steps_run_once_over_a_sleep_and_a_retry_sync_and_async(start_worker, queue, tmp_path, ledger):
    worker = start_worker("--queue", f"{queue}:8", *FAST)
    d = str(tmp_path)
    jobs = [py_tasks.durable_sync.configure(queue=queue).defer(URL, d=d) for _ in range(3)]
    jobs += [py_tasks.durable_async.configure(queue=queue).defer(URL, d=d) for _ in range(3)]
    for j in jobs:
        state, attempt, result, error, took = wait_finished(j.id, worker, timeout=30)
        # Parked once by its sleep (no attempt used), then a failed attempt after it, then done.
        assert (state, attempt) == ("completed", 2), (state, attempt, error)
        assert result == {"a": {"a": 1}, "b": "b", "attempt": 2}
        assert runs(d, f"{j.id}.a") == 1 and runs(d, f"{j.id}.b") == 1
        assert scalar("SELECT count(*) FROM durable_ledger WHERE job = %s", j.id) == 1
        names = scalar("SELECT array_agg(name ORDER BY name) FROM pgjobq.job_steps WHERE job_id = %s", j.id)
        assert names in (["a", "b", "nap"], ["a", "b", "sleep#1"])
        info = pgjobq.get(URL, j.id)
        assert [s.name for s in info.steps][:2] == ["a", "b"] and info.parked is None
    assert all(runs(d, f"{j.id}.after") == 2 for j in jobs[:3])  # after the sleep: two attempts


def test_a_wait_for_an_event_parks_the_job_until_the_event_or_its_timeout(start_worker, queue):
    worker = start_worker("--queue", f"{queue}:4", *FAST)
    task = py_tasks.wait_go.configure(queue=queue)
    # Sent before the wait began: found at once.
    assert pgjobq.send_event(URL, "go", f"{queue}-early", {"v": 0}) == 0
    early = task.defer(URL, key=f"{queue}-early")
    waiting = task.defer(URL, key=f"{queue}-1")
    timed = task.defer(URL, key=f"{queue}-never", timeout=0.3)
    assert wait_finished(early.id, worker)[2] == {"event": {"v": 0}}
    wait_until(lambda: pgjobq.get(URL, waiting.id).parked is not None, 20, "the job to wait", worker.log)
    info = pgjobq.get(URL, waiting.id)
    assert (info.state, info.parked.why, info.parked.event, info.parked.key) == (
        "queued", "waiting", "go", f"{queue}-1")
    assert scalar("SELECT count(*) FROM pgjobq.job_parks p JOIN pgjobq.jobs j ON j.id = p.job_id"
                  " WHERE j.id = %s AND j.lease_until IS NULL", waiting.id) == 1
    # Sent in a transaction that rolls back: nothing; committed: the job resumes with it.
    with psycopg.connect(URL) as c:
        assert pgjobq.send_event(c, "go", f"{queue}-1", {"v": 1}) == 1
        c.rollback()
    assert pgjobq.get(URL, waiting.id).parked is not None
    assert py_tasks.app.send_event("go", f"{queue}-1", {"v": 1}, conn=URL) == 1
    assert wait_finished(waiting.id, worker)[:3] == ("completed", 1, {"event": {"v": 1}})
    assert wait_finished(timed.id, worker)[2] == {"timeout": True}


def test_a_late_transactional_step_is_refused_and_rolled_back(queue, ledger):
    py_tasks.late_step.configure(queue=queue, max_attempts=1).defer(URL)
    counts = py_tasks.app.run_inline([queue], conn=URL)
    # The step raised LeaseLost (its store refused), so the attempt's failure found no lease either.
    assert counts == {"lost": 1}, counts
    assert scalar("SELECT count(*) FROM durable_ledger WHERE what = 'late'") == 0
    assert scalar("SELECT count(*) FROM pgjobq.job_steps s JOIN pgjobq.all_jobs j ON j.id = s.job_id"
                  " WHERE j.queue = %s", queue) == 0


def test_run_inline_parks_and_resumes_a_sleeping_job(queue, tmp_path, ledger):
    d = str(tmp_path)
    job = py_tasks.durable_sync.configure(queue=queue).defer(URL, d=d, nap=0.2)
    assert py_tasks.app.run_inline([queue], conn=URL) == {"parked": 1}
    assert pgjobq.get(URL, job.id).parked.why == "sleeping"
    deadline = time.monotonic() + 20
    while pgjobq.get(URL, job.id).state != "completed" and time.monotonic() < deadline:
        time.sleep(0.1)
        py_tasks.app.run_inline([queue], conn=URL)
    info = pgjobq.get(URL, job.id)
    assert (info.state, info.attempt, info.result) == ("completed", 2, {"a": {"a": 1}, "b": "b", "attempt": 2})
    assert runs(d, f"{job.id}.a") == 1 and runs(d, f"{job.id}.b") == 1
    assert scalar("SELECT count(*) FROM durable_ledger WHERE job = %s", job.id) == 1


def test_steps_outside_a_worker_say_why():
    ctx = pgjobq.Context(1, "q", "k", 1, 1, {}, [], time.monotonic() + 10)
    with pytest.raises(pgjobq.PgjobqError, match="need the worker"):
        ctx.step("a", lambda: 1)
    with pytest.raises(pgjobq.InvalidArgument):
        ctx.step("", lambda: 1)
