"""End to end through the C engine: `python3 -m pgjobq worker py_tasks:app` becomes
`pgjobq work --coproc "python3 -m pgjobq.coproc py_tasks:app"`, started here and stopped by its pid."""

import os
import time

import psycopg
import pytest

import pgjobq
import py_tasks
from conftest import URL, scalar, wait_until

# Leases short enough that a cancel is seen within a fraction of a second (at the heartbeat).
FAST = ["--", "--lease", "6s", "--heartbeat", "300ms", "--timeout", "5s", "--log-level", "warn"]


def finished(job_id):
    return scalar("SELECT state FROM pgjobq.history WHERE id = %s", job_id)


def history(job_id):
    with psycopg.connect(URL, autocommit=True) as c:
        return c.execute("SELECT state, attempt, result, last_error, extract(epoch FROM finished_at - created_at)"
                         " FROM pgjobq.history WHERE id = %s", (job_id,)).fetchone()


def wait_finished(job_id, worker, timeout=20):
    wait_until(lambda: finished(job_id), timeout, f"job {job_id} to finish", worker.log)
    return history(job_id)


@pytest.fixture
def worker(start_worker, queue):
    return start_worker("--queue", f"{queue}:16", *FAST)


def on(queue, task):
    return task.configure(queue=queue)


def attempt_times(d, name):
    with open(os.path.join(d, f"{name}.times")) as f:
        return [float(x) for x in f.read().split()]


def test_results_retries_and_failures(worker, queue, tmp_path):
    app = py_tasks.app
    added = on(queue, py_tasks.add).defer(URL, a=2, b=3)
    about = on(queue, py_tasks.about).defer(URL)
    d = str(tmp_path)
    flaky = on(queue, py_tasks.flaky).defer(URL, until=3, d=d)
    later = on(queue, py_tasks.retry_later).defer(URL, delay=0.5, d=d)
    snoozed = on(queue, py_tasks.snooze_once).defer(URL, d=d)
    given_up = on(queue, py_tasks.give_up).defer(URL)
    broken = on(queue, py_tasks.broken).defer(URL)
    unknown = app.enqueue("no_such_task", {}, queue=queue, conn=URL)
    misfit = app.enqueue("add", {"a": 1, "c": 2}, queue=queue, conn=URL)
    nonjson = on(queue, py_tasks.nonjson).configure(queue=queue, max_attempts=1).defer(URL)

    assert app.result(added.id, timeout=20, conn=URL) == {"sum": 5}
    r = app.result(about.id, timeout=20, conn=URL)
    assert r == {"id": about.id, "attempt": 1, "max_attempts": 10, "kind": "about", "parents": [], "time_left": True}

    # Raised exceptions are retried with the task's backoff: 0.3 s each time (the database's would
    # be 2 s, then 4: at least 5.4 s from the first attempt to the third).
    state, attempt, result, error, took = wait_finished(flaky.id, worker)
    assert (state, attempt, result) == ("completed", 3, {"attempt": 3})
    times = attempt_times(d, "flaky")
    assert len(times) == 3 and all(b - a >= 0.29 for a, b in zip(times, times[1:])) and times[2] - times[0] < 5, times

    # Retry(delay=0.5): attempt 2, at least half a second later.
    state, attempt, result, error, took = wait_finished(later.id, worker)
    assert (state, attempt, result) == ("completed", 2, {"attempt": 2})
    times = attempt_times(d, "retry_later")
    assert len(times) == 2 and times[1] - times[0] >= 0.49, times

    # Snooze(0.5): run again at least half a second later, no attempt used (one attempt in all: a
    # failed attempt would have ended it failed), its reason kept meanwhile.
    state, attempt, result, error, took = wait_finished(snoozed.id, worker)
    assert (state, attempt, result) == ("completed", 1, {"attempt": 1}), (state, attempt, result, error)
    times = attempt_times(d, "snooze_once")
    assert len(times) == 2 and times[1] - times[0] >= 0.49, times

    # Fail: failed for good at the first attempt, whatever attempts remain.
    state, attempt, result, error, took = wait_finished(given_up.id, worker)
    assert (state, attempt, error) == ("failed", 1, "no such mailbox")

    # An exception: the error is the exception and the end of its traceback, in the task's file.
    state, attempt, result, error, took = wait_finished(broken.id, worker)
    assert (state, attempt) == ("failed", 2)
    assert error.startswith("KeyError: 'missing'\n"), error
    assert 'py_tasks.py", line' in error and "in _deep" in error and 'raise KeyError("missing")' in error
    assert "_runner.py" not in error  # the package's own frames are left out

    # A kind the App has no task for is handed back untouched (docs/python.md, "Deploying").
    def handed_back():
        return scalar("SELECT state = 'queued' AND attempt = 0 AND run_at > now() + interval '50 seconds'"
                      " AND strpos(last_error, 'no task for the kind ''no_such_task''') > 0 FROM pgjobq.jobs WHERE id = %s",
                      unknown.id)
    wait_until(handed_back, 20, f"job {unknown.id} to be handed back", worker.log)
    state, attempt, result, error, took = wait_finished(misfit.id, worker)
    assert state == "failed" and "the payload does not fit add(a, b)" in error
    state, attempt, result, error, took = wait_finished(nonjson.id, worker)
    assert state == "failed" and "the result of nonjson" in error and "builtins.object" in error

    with pytest.raises(pgjobq.JobFailed, match="no such mailbox"):
        app.result(given_up.id, conn=URL)
    assert worker.alive()  # a task's print() went to the worker's log, not into the protocol (test_deploy.py)


def test_an_async_task_without_await_runs_at_once_with_the_same_outcomes(worker, queue):
    assert py_tasks.at_once._at_once and not py_tasks.about._at_once and not py_tasks.add._at_once
    done = [on(queue, py_tasks.at_once).defer(URL, n=i) for i in range(3)]
    raised = on(queue, py_tasks.at_once).defer(URL, n=9, fail="raise")
    failed = on(queue, py_tasks.at_once).defer(URL, n=9, fail="fail")
    nonjson = on(queue, py_tasks.at_once).defer(URL, n=9, fail="nonjson")
    timeout = on(queue, py_tasks.at_once).defer(URL, n=9, fail="timeout")
    for i, job in enumerate(done):  # each in a context of its own: nothing seen of the job before
        assert wait_finished(job.id, worker)[:3] == ("completed", 1, {"n": i, "before": None})
    state, attempt, result, error, took = wait_finished(raised.id, worker)
    assert (state, attempt) == ("failed", 2) and error.startswith("KeyError: 'missing'\n"), error
    assert "in _deep" in error and "in at_once" in error and "_runner.py" not in error, error
    assert wait_finished(failed.id, worker)[:4] == ("failed", 1, None, "failed at once, for good")
    state, attempt, result, error, took = wait_finished(nonjson.id, worker)
    assert (state, attempt) == ("failed", 2) and "the result of at_once" in error, error
    state, attempt, result, error, took = wait_finished(timeout.id, worker)
    assert (state, attempt) == ("failed", 2) and error.startswith("TimeoutError: slow upstream"), error
    assert worker.alive()


def test_parents_results_reach_the_context(worker, queue):
    ids = pgjobq.enqueue_graph(URL, [
        py_tasks.add.configure(queue=queue, ref="a").spec(a=1, b=1),
        py_tasks.add.configure(queue=queue, ref="b").spec(a=2, b=2),
        py_tasks.about.configure(queue=queue, ref="c", after=["a", "b"]).spec(),
    ])
    r = py_tasks.app.result(ids["c"], timeout=20, conn=URL)
    assert r["parents"] == [[ids["a"], "completed", {"sum": 2}], [ids["b"], "completed", {"sum": 4}]]


def test_timeouts_stop_async_and_tell_sync_tasks(worker, queue, tmp_path):
    d = str(tmp_path)
    a = on(queue, py_tasks.sleepy_async).defer(URL, d=d)
    s = on(queue, py_tasks.sleepy_sync).defer(URL, d=d)
    for job in (a, s):
        state, attempt, result, error, took = wait_finished(job.id, worker)
        assert (state, attempt) == ("failed", 1)
        assert error == "timed out after 0.5 s (the task's timeout)", error  # not the worker's (5 s)
    wait_until(lambda: os.path.exists(os.path.join(d, "sleepy_async.cancelled")), 5, "the async task to be cancelled")
    wait_until(lambda: os.path.exists(os.path.join(d, "sleepy_sync.saw_cancel")), 5, "the sync task to see ctx.cancelled")


def test_cancel_of_a_running_async_task(worker, queue, tmp_path):
    d = str(tmp_path)
    job = on(queue, py_tasks.wait_for_cancel).defer(URL, d=d)
    wait_until(lambda: os.path.exists(os.path.join(d, "started")), 20, "the task to start", worker.log)
    assert py_tasks.app.cancel(job.id, conn=URL) == "cancel_requested"
    state, attempt, result, error, took = wait_finished(job.id, worker)
    assert state == "cancelled"
    wait_until(lambda: os.path.exists(os.path.join(d, "cancelled")), 5, "asyncio.CancelledError in the task")
    assert not os.path.exists(os.path.join(d, "finished"))  # (a timeout would have been a failed attempt)


def test_a_task_that_blocks_the_event_loop_keeps_its_lease(worker, queue, tmp_path):
    d = str(tmp_path)
    job = on(queue, py_tasks.block_loop).defer(URL, d=d, seconds=3)
    wait_until(lambda: os.path.exists(os.path.join(d, "blocking")), 20, "the task to start", worker.log)
    leases = set()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2.5 and not finished(job.id):
        leases.add(scalar("SELECT lease_until FROM pgjobq.jobs WHERE id = %s", job.id))
        time.sleep(0.1)
    leases.discard(None)
    assert len(leases) >= 2, leases  # renewed while the Python process did nothing (heartbeat: 300 ms)
    state, attempt, result, error, took = wait_finished(job.id, worker)
    assert (state, attempt, result) == ("completed", 1, {"blocked": 3})


def test_a_crashed_coprocess_is_restarted_and_its_jobs_retried(start_worker, queue, tmp_path):
    d = str(tmp_path)
    w = start_worker("--queue", f"{queue}:8", *FAST)
    held = [on(queue, py_tasks.held).defer(URL, d=d) for _ in range(3)]
    wait_until(lambda: all(os.path.exists(os.path.join(d, f"held.{j.id}")) for j in held), 20,
               "the held jobs to start", w.log)
    crash = on(queue, py_tasks.crash).defer(URL, d=d)
    state, attempt, result, error, took = wait_finished(crash.id, w, 30)
    assert (state, attempt, result) == ("completed", 2, {"survived": 2})
    assert os.path.exists(os.path.join(d, "crashing"))
    for j in held:  # they were running in the process that died: a failed attempt each, then run again
        state, attempt, result, error, took = wait_finished(j.id, w, 30)
        assert (state, attempt, result) == ("completed", 2, {"attempt": 2})
    assert w.alive()
    assert py_tasks.app.result(on(queue, py_tasks.add).defer(URL, a=1, b=2).id, timeout=20, conn=URL) == {"sum": 3}
    with open(w.log) as f:
        assert "exited with status 3" in f.read()


def test_a_thousand_jobs_over_eight_async_slots_each_run_once(start_worker, queue, tmp_path):
    d = str(tmp_path)
    jobs = py_tasks.app.enqueue_many([on(queue, py_tasks.count).spec(d=d, i=i) for i in range(1000)], conn=URL)
    t0 = time.monotonic()
    w = start_worker("--queue", f"{queue}:8", "--", "--log-level", "warn")
    wait_until(lambda: scalar("SELECT count(*) FROM pgjobq.history WHERE queue = %s", queue) == 1000, 60,
               "1000 jobs to finish", w.log)
    took = time.monotonic() - t0
    with psycopg.connect(URL, autocommit=True) as c:
        states = c.execute("SELECT state, attempt, count(*) FROM pgjobq.history WHERE queue = %s GROUP BY 1, 2",
                           (queue,)).fetchall()
        peak = c.execute("SELECT max((result ->> 'peak')::int) FROM pgjobq.history WHERE queue = %s",
                         (queue,)).fetchone()[0]
    assert states == [("completed", 1, 1000)]
    with open(os.path.join(d, "runs")) as f:
        runs = [int(x) for x in f.read().split()]
    assert sorted(runs) == list(range(1000))  # each ran exactly once
    assert 1 < peak <= 8, peak  # concurrently, and never more than the worker's slots
    assert len(jobs) == 1000
    print(f"1000 no-op async jobs through the worker: {took:.2f} s from start, peak concurrency {peak}")


def test_progress_reaches_the_job_while_it_runs_and_stays(worker, queue, tmp_path):
    d = str(tmp_path)
    a = on(queue, py_tasks.progressing).defer(URL, d=d)
    s = on(queue, py_tasks.progressing_sync).defer(URL, d=d)
    for job, first, seen in ((a, {"step": 1}, "seen"), (s, {"sync": 1}, "seen_sync")):
        wait_until(lambda: py_tasks.app.get(job.id, conn=URL).progress == first, 20,
                   f"job {job.id}'s first progress", worker.log)
        assert py_tasks.app.get(job.id, conn=URL).state == "running"
        open(os.path.join(d, seen), "w").close()
    for job, last in ((a, {"step": 2}), (s, {"sync": 2})):
        state, attempt, result, error, took = wait_finished(job.id, worker)
        assert state == "completed", error
        assert py_tasks.app.get(job.id, conn=URL).progress == last  # written before the completion
    with open(os.path.join(d, "refused")) as f:
        refused = f.read()
    assert "progress is 90" in refused and "at most 8192" in refused, refused
    # Outside a worker (the function called directly) it does nothing.
    ctx = pgjobq.Context(1, queue, "progressing", 1, 1, {}, [], time.monotonic() + 5)
    ctx.set_progress({"ignored": True})
    with pytest.raises(pgjobq.InvalidJob):
        ctx.set_progress(object())
