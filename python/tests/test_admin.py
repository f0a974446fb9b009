"""Looking and acting: get, result, cancel, retry, queues, schedules; and the package as pip installs it."""

import os
import shutil
import subprocess
import sys
import threading
import time

import psycopg
import pytest

import pgjobq
from conftest import PYDIR, URL, scalar


def claim(queue):
    """Takes the queue's next job as a worker would (the SQL API): (id, lease_token)."""
    with psycopg.connect(URL, autocommit=True) as c:
        return c.execute("SELECT id, lease_token FROM pgjobq.claim(%s, 1, '30 seconds', 'pytest')", (queue,)).fetchone()


def complete(job_id, token, result):
    with psycopg.connect(URL, autocommit=True) as c:
        c.execute("SELECT pgjobq.complete_many(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], ARRAY[%s]::jsonb[])",
                  (job_id, token, result))


def test_get_cancel_retry(queue):
    app = pgjobq.App(URL, queue=queue)
    job = app.enqueue("report", {"month": "2026-11"}, max_attempts=3)
    info = app.get(job.id)
    assert (info.state, info.kind, info.attempt, info.max_attempts, info.finished) == ("queued", "report", 0, 3, False)
    assert app.get(10 ** 15) is None
    assert app.cancel(job.id) == "cancelled"
    assert app.cancel(job.id) == "already_cancelled"
    assert app.get(job.id).state == "cancelled"
    assert app.retry(job.id) == "queued"
    assert app.get(job.id).state == "queued"
    # A running job: cancel is a request its worker sees at its next heartbeat.
    jid, token = claim(queue)
    assert jid == job.id
    assert app.cancel(job.id) == "cancel_requested" and app.get(job.id).cancel_requested
    assert app.retry(job.id) == "running"
    assert app.cancel(10 ** 15) == "not_found"


def test_result_is_woken_by_the_jobs_end_not_by_polling(queue):
    # With the fallback read 60 s away, only the notification can wake the wait within the test.
    app = pgjobq.App(URL, queue=queue)
    job = app.enqueue("work", {"n": 1})
    got = {}

    def wait():
        got["result"] = app.result(job.id, timeout=120, poll=60)
        got["at"] = time.monotonic()

    t = threading.Thread(target=wait)
    t.start()
    deadline = time.monotonic() + 30
    while scalar("SELECT count(*) FROM pgjobq.awaited WHERE job_id = %s", job.id) == 0:
        assert time.monotonic() < deadline, "the wait was not registered"
        time.sleep(0.02)
    jid, token = claim(queue)
    done = time.monotonic()
    complete(jid, token, '{"done": true}')
    t.join(60)
    assert got["result"] == {"done": True} and got["at"] - done < 30, got
    assert scalar("SELECT count(*) FROM pgjobq.awaited") == 0  # the wait removed its registration


def test_result_waits_for_the_job(queue):
    app = pgjobq.App(URL, queue=queue)
    job = app.enqueue("work", {"n": 1})
    with pytest.raises(pgjobq.ResultTimeout) as e:
        app.result(job.id, timeout=0.2)
    assert e.value.state == "queued" and isinstance(e.value, TimeoutError)

    def finish():
        time.sleep(0.3)
        jid, token = claim(queue)
        complete(jid, token, '{"done": true}')

    t = threading.Thread(target=finish)
    t0 = time.monotonic()
    t.start()
    assert app.result(job.id, timeout=10) == {"done": True}
    assert 0.25 < time.monotonic() - t0 < 5
    t.join()
    # On a connection of the caller's too.
    with psycopg.connect(URL, autocommit=True) as c:
        assert pgjobq.result(c, job.id, timeout=1) == {"done": True}

    failing = app.enqueue("work", {}, max_attempts=1)
    jid, token = claim(queue)
    with psycopg.connect(URL, autocommit=True) as c:
        c.execute("SELECT pgjobq.fail_many(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], ARRAY['SMTP 550'], NULL, NULL)",
                  (jid, token))
    with pytest.raises(pgjobq.JobFailed, match="SMTP 550") as f:
        app.result(failing.id, timeout=5)
    assert f.value.job.state == "failed"
    cancelled = app.enqueue("work", {})
    app.cancel(cancelled.id)
    with pytest.raises(pgjobq.JobCancelled):
        app.result(cancelled.id)
    with pytest.raises(pgjobq.JobNotFound):
        app.result(10 ** 15)


def test_queue_pause_resume_limits(queue):
    app = pgjobq.App(URL, queue=queue)
    app.enqueue("k", {})
    assert app.pause(queue, "relay down") is True
    assert app.pause(queue) is False
    assert claim(queue) is None  # paused: the claim takes nothing
    (q,) = [q for q in app.queues() if q.queue == queue]
    assert q.paused and q.queued == 1
    assert app.resume(queue) is True and app.resume(queue) is False
    app.set_limits(queue, concurrency=5, key_concurrency=1, rate_limit=100, rate_period="1m")
    (q,) = [q for q in app.queues() if q.queue == queue]
    assert (q.concurrency, q.key_concurrency, q.rate_limit, q.rate_period.total_seconds()) == (5, 1, 100, 60)
    app.set_limits(queue, concurrency=None)  # removes that one, leaves the others
    (q,) = [q for q in app.queues() if q.queue == queue]
    assert (q.concurrency, q.key_concurrency) == (None, 1)
    assert app.retry_where(queue, "failed", dry_run=True) == {"retried": 0, "skipped": 0}
    assert app.cancel_where(queue, "queued", kind="k") == 1


def test_queues_give_what_an_autoscaler_reads(queue, pg):
    """queues(): besides the live counts, how long the oldest ready job has been claimable and the slots
    of the live workers that serve the queue (pgjobq.queue_ready)."""
    app = pgjobq.App(URL, queue=queue)
    app.enqueue("k", {})
    app.enqueue("k", {})
    app.enqueue("k", {}, delay=3600)
    pg.execute("UPDATE pgjobq.jobs SET run_at = now() - interval '90 seconds', ready_at = now() - interval '90 seconds'"
               " WHERE id = (SELECT min(id) FROM pgjobq.jobs WHERE queue = %s)", (queue,))
    pg.execute("SELECT pgjobq.worker_beat(%s, 'h', 1, '0', %s)", ("w-" + queue, f"{queue}:5,other:1"))
    (q,) = [q for q in app.queues() if q.queue == queue]
    assert (q.queued, q.scheduled, q.worker_slots) == (2, 1, 5)
    assert 90 <= q.oldest_ready.total_seconds() < 3600
    app.cancel_where(queue, "queued")
    pg.execute("SELECT pgjobq.worker_gone(%s)", ("w-" + queue,))
    (q,) = [q for q in app.queues() if q.queue == queue] or [None]
    assert q is None or (q.queued, q.oldest_ready, q.worker_slots) == (0, None, 0)


def test_dead_letters_and_redrive(queue, pg):
    """set_limits(dead_letter=...): a job that fails for good leaves a copy in the dead-letter queue,
    linked to it; retry_where(..., redrive=True) sends it back; a cycle is refused."""
    app = pgjobq.App(URL, queue=queue)
    dlq = queue + ".dead"
    app.set_limits(queue, dead_letter=dlq)
    (q,) = [q for q in app.queues() if q.queue == queue]
    assert q.dead_letter == dlq
    with pytest.raises(pgjobq.InvalidArgument, match="cycle"):
        app.set_limits(dlq, dead_letter=queue)
    job = app.enqueue("charge", {"order": 7}, max_attempts=1)
    jid, token = claim(queue)
    pg.execute("SELECT * FROM pgjobq.fail_many(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], ARRAY['declined'])",
               (jid, token))
    assert app.get(job.id).state == "failed"
    dead = scalar("SELECT id FROM pgjobq.dead_letters WHERE original_id = %s", job.id)
    info = app.get(dead)
    assert (info.queue, info.state, info.kind, info.payload, info.last_error) == (dlq, "queued", "charge",
                                                                                  {"order": 7}, "declined")
    # The links, both ways, on JobInfo; a job with neither has none.
    assert (info.dead_letter_of, info.dead_letters) == (job.id, [])
    assert (app.get(job.id).dead_letter_of, app.get(job.id).dead_letters) == (None, [dead])
    assert app.retry_where(dlq, "queued", redrive=True, dry_run=True) == {"retried": 1, "skipped": 0}
    assert app.retry_where(dlq, "queued", redrive=True) == {"retried": 1, "skipped": 0}
    assert app.get(dead).queue == queue
    app.set_limits(queue, dead_letter=None)
    (q,) = [q for q in app.queues() if q.queue == queue]
    assert q.dead_letter is None


def test_strict_order_per_key_and_skip(queue, pg):
    """set_limits(strict_order=True): the jobs of a key run one at a time in enqueue order; one that
    fails for good blocks its key until retry() or skip(); QueueInfo says so."""
    app = pgjobq.App(URL, queue=queue)
    app.set_limits(queue, strict_order=True)
    first = app.enqueue("post", {"n": 1}, concurrency_key="account:1", max_attempts=1)
    second = app.enqueue("post", {"n": 2}, concurrency_key="account:1", priority=-10)
    other = app.enqueue("post", {"n": 3}, concurrency_key="account:2")
    jid, token = claim(queue)
    assert jid == first.id  # its key's first, though the second has the better priority
    assert claim(queue)[0] == other.id
    assert claim(queue) is None  # account:1's second waits for its first
    pg.execute("SELECT * FROM pgjobq.fail_many(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], ARRAY['declined'])",
               (jid, token))
    (q,) = [q for q in app.queues() if q.queue == queue]
    assert (q.strict_order, q.blocked_keys) == (True, 1)
    assert claim(queue) is None  # blocked
    assert app.skip(second.id) == "not_blocking"
    assert app.skip(10 ** 15) == "not_found"
    assert app.skip(first.id) == "skipped"
    assert app.get(first.id).state == "failed"
    assert claim(queue)[0] == second.id
    with pytest.raises(TypeError, match="strict_order"):
        app.set_limits(queue, strict_order="yes")
    app.set_limits(queue, strict_order=None)
    (q,) = [q for q in app.queues() if q.queue == queue]
    assert (q.strict_order, q.blocked_keys) == (False, 0)


def test_max_lease_and_retry_running(queue):
    """A queue's longest lease (a day unless set) bounds what a claim may ask for; an operator ends a
    running job's lease now: it runs again, and its old holder's writes are refused."""
    app = pgjobq.App(URL, queue=queue)
    job = app.enqueue("k", {}, max_attempts=1)
    (q,) = [q for q in app.queues() if q.queue == queue]
    assert q.max_lease.total_seconds() == 86400
    app.set_limits(queue, max_lease="10m")
    (q,) = [q for q in app.queues() if q.queue == queue]
    assert q.max_lease.total_seconds() == 600
    with psycopg.connect(URL, autocommit=True) as c, pytest.raises(psycopg.errors.InvalidParameterValue,
                                                                   match="max_lease"):
        c.execute("SELECT * FROM pgjobq.claim(%s, 1, '1 hour', 'rogue')", (queue,))
    with pytest.raises(pgjobq.InvalidArgument, match="max_lease"):
        app.set_limits(queue, max_lease="400d")
    app.set_limits(queue, max_lease=None)
    (q,) = [q for q in app.queues() if q.queue == queue]
    assert q.max_lease.total_seconds() == 86400

    jid, token = claim(queue)
    assert jid == job.id
    assert app.retry_running(job.id) == "queued"
    info = app.get(job.id)
    assert (info.state, info.attempt, info.max_attempts) == ("queued", 1, 2)
    with psycopg.connect(URL, autocommit=True) as c:
        outcome = c.execute("SELECT outcome FROM pgjobq.complete_many(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[],"
                            " ARRAY['{}']::jsonb[])", (jid, token)).fetchone()[0]
    assert outcome == "lost"
    assert app.retry_running(job.id) == "not_running"
    assert app.retry_running(10 ** 15) == "not_found"

def test_periodic_tasks_sync_to_schedules(queue):
    name = "app" + queue
    app = pgjobq.App(URL, name=name)

    @app.periodic("0 3 * * *", tz="Europe/Berlin", kwargs={"full": True})
    @app.task(queue=queue, max_attempts=2)
    def nightly(full=False):
        return full

    @app.periodic("*/5 * * * *", name="ping5", catch_up="skip")
    def ping():
        pass

    assert app.sync_schedules() == 2
    rows = {r[0]: r[1:] for r in psycopg.connect(URL, autocommit=True).execute(
        "SELECT name, cron, tz, queue, kind, payload, max_attempts, catch_up, next_run > now() FROM pgjobq.schedules"
        " WHERE name LIKE %s", (name + ":%",)).fetchall()}
    assert rows == {
        f"{name}:nightly": ("0 3 * * *", "Europe/Berlin", queue, "nightly", {"full": True}, 2, "latest", True),
        f"{name}:ping5": ("*/5 * * * *", "UTC", "default", "ping", {}, 10, "skip", True),  # the App's max_attempts
    }
    assert app.sync_schedules() == 0  # nothing changed: left alone, next runs included
    assert scalar("SELECT pgjobq.schedule_trigger(%s)", f"{name}:nightly") > 0

    # The next deploy: ping is gone, nightly moved to 4 o'clock.
    app2 = pgjobq.App(URL, name=name)

    @app2.periodic("0 4 * * *", tz="Europe/Berlin", kwargs={"full": True})
    @app2.task(name="nightly", queue=queue, max_attempts=2)
    def nightly2(full=False):
        return full

    assert app2.sync_schedules() == 2
    assert scalar("SELECT string_agg(name || ' ' || cron, ', ') FROM pgjobq.schedules WHERE name LIKE %s",
                  name + ":%") == f"{name}:nightly 0 4 * * *"
    bad = pgjobq.App(URL, name=name)

    @bad.periodic("0 3 * * *", tz="Mars/Olympus")
    def marsian():
        pass

    with pytest.raises(pgjobq.InvalidArgument, match="Mars/Olympus"):
        bad.sync_schedules()
    with pytest.raises(pgjobq.InvalidJob, match="unexpected keyword"):
        app.periodic("0 3 * * *", name="other", kwargs={"nope": 1})(nightly)
    pgjobq.App(URL, name=name).sync_schedules()  # no schedules left under that name
    assert scalar("SELECT count(*) FROM pgjobq.schedules WHERE name LIKE %s", name + ":%") == 0


def test_pip_installs_the_package_offline(tmp_path):
    """pip builds the package with Debian's setuptools, nothing downloaded (a copy: no build files
    in the source tree)."""
    src = tmp_path / "src"
    shutil.copytree(PYDIR, src, ignore=shutil.ignore_patterns("tests", "__pycache__", "build", "*.egg-info"))
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
                        "--quiet", "--disable-pip-version-check", "--target", str(target), str(src)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert r.returncode == 0, r.stdout
    assert (target / "pgjobq" / "py.typed").exists()
    r = subprocess.run([sys.executable, "-c", "import pgjobq, sys; print(pgjobq.__file__, pgjobq.__version__)"],
                       env={**os.environ, "PYTHONPATH": str(target)}, cwd=str(tmp_path),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0 and r.stdout.startswith(str(target)), r.stdout


def test_priority_aging(queue):
    """set_limits(priority_aging=...): a queued job ready that long at its priority is raised one step
    by the workers' maintenance pass; get tells both priorities, queues() shows the setting."""
    app = pgjobq.App(URL, queue=queue)
    (q,) = [q for q in app.queues() if q.queue == queue] or [None]
    assert q is None or q.priority_aging is None
    app.set_limits(queue, priority_aging="5m")
    (q,) = [q for q in app.queues() if q.queue == queue]
    assert q.priority_aging.total_seconds() == 300
    with pytest.raises(pgjobq.InvalidArgument, match="priority_aging"):
        app.set_limits(queue, priority_aging="400d")
    job = app.enqueue("k", {}, priority=4)
    assert (app.get(job.id).priority, app.get(job.id).base_priority) == (4, None)
    with psycopg.connect(URL, autocommit=True) as c:
        # As if it had been ready for five minutes (time from the database, not a sleep).
        c.execute("UPDATE pgjobq.jobs SET run_at = run_at - interval '5 minutes',"
                  " ready_at = ready_at - interval '5 minutes' WHERE id = %s", (job.id,))
        c.execute("DELETE FROM pgjobq.lows WHERE queue = %s", (queue,))
        assert c.execute("SELECT pgjobq.age_priorities(100)").fetchone()[0] == 1
    info = app.get(job.id)
    assert (info.priority, info.base_priority) == (3, 4)
    app.set_limits(queue, priority_aging=None)
    (q,) = [q for q in app.queues() if q.queue == queue]
    assert q.priority_aging is None
