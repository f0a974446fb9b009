"""A real application's deployment (issue 37): tasks that see the application's configuration, a
broken release that loses no attempt, a rolling deploy with new kinds, task output in the worker's
log, a database down at start, SQLAlchemy's URLs; and names and delays the database would refuse."""

import asyncio
import os
import socket
import subprocess
import sys
import threading

import psycopg
import pytest

import pgjobq
import py_tasks
from conftest import CLI, HERE, PYDIR, URL, scalar, wait_until

FAST = ["--", "--lease", "6s", "--heartbeat", "300ms", "--timeout", "5s"]


def job_row(job_id):
    with psycopg.connect(URL, autocommit=True) as c:
        return c.execute("SELECT state, attempt, result, last_error, run_at > now() + interval '50 seconds'"
                         " FROM pgjobq.all_jobs WHERE id = %s", (job_id,)).fetchone()


def log_text(worker):
    with open(worker.log) as f:
        return f.read()


def sqlalchemy_url(driver):
    """The test database as a SQLAlchemy URL (postgresql+DRIVER://user@/db?host=...&port=...)."""
    from urllib.parse import quote

    d = psycopg.conninfo.conninfo_to_dict(URL)
    query = "&".join(f"{k}={quote(str(d[k]), safe='/')}" for k in ("host", "port") if d.get(k))
    return f"postgresql+{driver}://{quote(d.get('user', ''))}@/{quote(d.get('dbname', ''))}" + (
        f"?{query}" if query else "")


# -- names and delays the database would refuse ---------------------------------------------------

def test_a_name_ending_in_a_newline_is_refused():
    app = pgjobq.App()
    for make in (lambda: app.task(name="send\n")(lambda: None), lambda: pgjobq.App(queue="mail\n"),
                 lambda: pgjobq.App(name="shop\n"), lambda: app.task(queue="mail\n")(lambda: None),
                 lambda: app.periodic("* * * * *", name="tick\n")(lambda: None)):
        with pytest.raises(pgjobq.InvalidArgument, match="is not a name"):
            make()
    assert app.task(name="send")(lambda: None).name == "send"


def test_a_retry_delay_beyond_100_years_is_a_clear_error(start_worker, queue):
    with pytest.raises(pgjobq.InvalidArgument, match=r"Retry\(delay=...\): '4000000d' is more than 100 years"):
        pgjobq.Retry("x", delay="4000000d")
    assert pgjobq.Retry("x", delay="36500d").delay == "36500d"
    with pytest.raises(pgjobq.InvalidArgument, match=r"Snooze\(delay=...\): '4000000d' is more than 100 years"):
        pgjobq.Snooze("4000000d")
    assert pgjobq.Snooze("5m").delay == "5m" and pgjobq.Snooze().reason == "snoozed by the task"
    # In a task: the attempt fails with that error (where the task raised it), like any exception.
    w = start_worker("--queue", f"{queue}:2", *FAST)
    job = py_tasks.far_retry.configure(queue=queue).defer(URL)
    wait_until(lambda: (job_row(job.id) or ("",))[0] == "failed", 20, "the job to fail", w.log)
    state, attempt, result, error, later = job_row(job.id)
    assert attempt == 1 and error.startswith("InvalidArgument: Retry(delay=...): '4000000d' is more than 100 years")
    assert "in far_retry" in error, error


# -- SQLAlchemy's URLs ----------------------------------------------------------------------------

def test_sqlalchemy_urls_work_everywhere_the_package_takes_a_url(start_worker, queue):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    url = sqlalchemy_url("psycopg2")
    assert pgjobq.enqueue(sqlalchemy.engine.make_url(url), "add", {"a": 1, "b": 1}, queue=queue).id > 0
    app = pgjobq.App(database_url=sqlalchemy.engine.make_url(sqlalchemy_url("psycopg")))
    assert app.get(py_tasks.add.configure(queue=queue).defer(url, a=2, b=2).id).state == "queued"
    # The worker takes one from $DATABASE_URL (it used to refuse it: "not postgresql://").
    w = start_worker("--queue", f"{queue}:2", *FAST, env={"PGJOBQ_DATABASE_URL": None, "DATABASE_URL": url})
    wait_until(lambda: scalar("SELECT count(*) FROM pgjobq.history WHERE queue = %s AND state = 'completed'",
                              queue) == 2, 30, "the jobs to run", w.log)


# -- the application's configuration in its tasks -------------------------------------------------

def test_a_task_sees_the_applications_environment_and_database(start_worker, queue):
    d = psycopg.conninfo.conninfo_to_dict(URL)
    d["password"] = "hunter2-not-in-the-log"  # ignored by the test server (trust), never to be logged
    database_url = psycopg.conninfo.make_conninfo(**d)
    w = start_worker("--queue", f"{queue}:4", *FAST,
                     env={"APP_SETTING": "eu-west", "DATABASE_URL": database_url})
    job = py_tasks.configured.configure(queue=queue).defer(URL)
    result = py_tasks.app.result(job.id, timeout=30, conn=URL)
    assert result["setting"] == "eu-west" and result["database_url"] is True
    assert result["me"] == [job.id, "running"]  # app.get() inside the task: the App knows its database
    assert py_tasks.app.result(result["child"], timeout=30, conn=URL) == {"sum": 42}  # deferred from the task
    wait_until(lambda: "configured sees" in log_text(w), 10, "the task's line in the log", w.log)
    assert "hunter2-not-in-the-log" not in log_text(w)


# -- task output ----------------------------------------------------------------------------------

def test_task_output_reaches_the_log_as_written_at_its_level_with_the_job_id(start_worker, queue, tmp_path):
    d = str(tmp_path)
    w = start_worker("--queue", f"{queue}:2", "--", "--lease", "6s", "--heartbeat", "300ms", "--timeout", "5s",
                     "--log-level", "info")
    job = py_tasks.talk.configure(queue=queue).defer(URL, d=d)
    want = [f"info  coprocess 0: job {job.id}: printed by talk\n",
            f"info  coprocess 0: job {job.id}: shop.tasks: an info record\n",
            f"warn  coprocess 0: job {job.id}: shop.tasks: a warning record\n",
            f"error coprocess 0: job {job.id}: said at error\n"]
    # Each line is there while the task still runs (print() used to appear only when the process ended).
    wait_until(lambda: all(x in log_text(w) for x in want), 20, f"the task's lines: {want}", w.log)
    assert scalar("SELECT state FROM pgjobq.jobs WHERE id = %s", job.id) == "running"
    open(os.path.join(d, "go"), "w").close()
    assert py_tasks.app.result(job.id, timeout=20, conn=URL) == {"talked": True}


# -- a rolling deploy: kinds this worker does not know -----------------------------------------------

def test_a_kind_the_app_does_not_know_is_handed_back_for_a_newer_worker(start_worker, queue):
    # The producers run the new release (deploy_tasks: charge), the worker still the old (py_tasks).
    job = pgjobq.enqueue(URL, "charge", {"order": 7}, queue=queue)
    # (Both workers wake for the job when it is due again; the old one, which handed it back, claims
    # 50 ms late (src/worker.c, yield_until_ms): a CI run saw it win for 30 s, within a millisecond of
    # the new one each time.  A delay longer than the 1 s poll: with 1 s, the new worker's poll could
    # also keep landing while the old one held the job, and it never learnt when the job was due.)
    old = start_worker("--queue", f"{queue}:2", "--unknown-kind-delay", "2s", *FAST)
    wait_until(lambda: "no task for the kind 'charge'" in (job_row(job.id)[3] or ""), 20, "the hand-back", old.log)
    state, attempt, result, error, later = job_row(job.id)
    assert state == "queued" and attempt == 0 and "handed back by a worker without it" in error
    wait_until(lambda: f"warn  coprocess 0: job {job.id}: no task for the kind 'charge'" in log_text(old), 10,
               "the warning", old.log)
    # The new release's worker runs it, at its first attempt.
    new = start_worker("--queue", f"{queue}:2", *FAST, app="deploy_tasks:app")
    try:
        got = pgjobq.result(URL, job.id, timeout=60)
    except pgjobq.ResultTimeout:
        raise AssertionError(f"job {job.id} not finished in 60 s: {job_row(job.id)}, held by"
                             f" {scalar('SELECT worker_id FROM pgjobq.jobs WHERE id = %s', job.id)}\n"
                             f"old worker:\n{log_text(old)}\nnew worker:\n{log_text(new)}") from None
    assert got == {"charged": 7, "attempt": 1}
    # Failing them for good is asked for.
    doomed = pgjobq.enqueue(URL, "refund", {}, queue=queue + "x")
    w = start_worker("--queue", f"{queue}x:1", "--fail-unknown-kinds", *FAST)
    wait_until(lambda: job_row(doomed.id)[0] == "failed", 20, "the job to fail", w.log)
    assert "no task for the kind 'refund'" in job_row(doomed.id)[3]


def test_a_kind_handed_back_past_the_snooze_cap_uses_no_attempt_while_a_snooze_counts(start_worker, queue, tmp_path):
    # A hand-back is not the task's choice: it counts no snooze, so that pgjobq.snooze_cap() never
    # fails a job a rolling deploy keeps handing back; the task's own Snooze counts, at the cap a
    # failed attempt (one attempt each: a failed attempt would end them).
    job = pgjobq.enqueue(URL, "charge", {"order": 8}, queue=queue, max_attempts=1)
    snoozer = py_tasks.snooze_once.configure(queue=queue).defer(URL, d=str(tmp_path))
    cap = scalar("SELECT pgjobq.snooze_cap()")
    with psycopg.connect(URL, autocommit=True) as c:
        c.execute("UPDATE pgjobq.jobs SET snoozes = pgjobq.snooze_cap() WHERE queue = %s", (queue,))
    w = start_worker("--queue", f"{queue}:2", "--unknown-kind-delay", "200ms", *FAST)
    seen = set()  # the times it was due again, one per hand-back

    def handed_back_thrice():
        row = scalar("SELECT run_at FROM pgjobq.jobs WHERE id = %s AND state = 'queued'"
                     " AND last_error LIKE '%%handed back by a worker without it'", job.id)
        if row is not None:
            seen.add(row)
        return len(seen) >= 3

    wait_until(handed_back_thrice, 30, "three hand-backs", w.log)
    with psycopg.connect(URL, autocommit=True) as c:
        state, attempt, snoozes = c.execute("SELECT state, attempt, snoozes FROM pgjobq.all_jobs WHERE id = %s",
                                            (job.id,)).fetchone()
    assert state in ("queued", "running") and attempt <= 1 and snoozes == cap, (state, attempt, snoozes)
    wait_until(lambda: job_row(snoozer.id)[0] == "failed", 20, "the snoozing task to fail", w.log)
    assert job_row(snoozer.id)[3] == f"snoozed {cap} times, the cap (pgjobq.snooze_cap()): this snooze is a failed" \
        " attempt; the bank is closed"


# -- a broken release ---------------------------------------------------------------------------------

def test_a_module_that_cannot_be_imported_stops_the_worker_before_it_claims(queue):
    job = pgjobq.enqueue(URL, "charge", {"order": 1}, queue=queue)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PYDIR, HERE]), PGJOBQ_DATABASE_URL=URL,
               DEPLOY_BROKEN="everywhere")
    r = subprocess.run([sys.executable, "-m", "pgjobq", "worker", "deploy_tasks:app", "--queue", f"{queue}:1",
                        "--pgjobq", CLI], env=env, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    assert r.returncode == 78, r.stderr  # EX_CONFIG
    assert "Traceback (most recent call last)" in r.stderr
    assert "ModuleNotFoundError: No module named 'stripe_is_not_installed'" in r.stderr
    assert "pgjobq worker: cannot import deploy_tasks:app" in r.stderr
    assert job_row(job.id)[:2] == ("queued", 0)


def test_a_coprocess_that_cannot_start_uses_no_attempt_and_the_worker_is_unhealthy(start_worker, queue, tmp_path):
    fixed = str(tmp_path / "fixed")
    jobs = [pgjobq.enqueue(URL, "charge", {"order": i}, queue=queue, max_attempts=3) for i in range(3)]
    # The module imports where the worker starts, and not in its coprocess (a release changed under it).
    w = start_worker("--queue", f"{queue}:4", *FAST, "--worker-id", f"broken-{queue}", app="deploy_tasks:app",
                     env={"DEPLOY_FIXED": fixed})

    def unhealthy():
        return scalar("SELECT reason FROM pgjobq.monitor_unhealthy_workers() WHERE id = %s", f"broken-{queue}")

    reason = wait_until(unhealthy, 30, "the worker to say it is unhealthy", w.log)
    assert "No module named 'stripe_is_not_installed'" in reason, reason
    # Claimed before the coprocess died, or not at all since: queued, no attempt used, no snooze counted.
    wait_until(lambda: all(job_row(j.id)[:2] == ("queued", 0) for j in jobs), 20, "the jobs to be handed back", w.log)
    assert scalar("SELECT sum(snoozes) FROM pgjobq.jobs WHERE queue = %s", queue) == 0
    assert w.alive()
    out = subprocess.run([CLI, "health"], env=dict(os.environ, PGJOBQ_DATABASE_URL=URL), stdout=subprocess.PIPE,
                         text=True).stdout
    assert f"broken-{queue} (pid" in out and "No module named 'stripe_is_not_installed'" in out, out
    # The deployment fixed: the same worker starts its coprocess and runs every job at its first attempt.
    open(fixed, "w").close()
    for j in jobs:
        assert pgjobq.result(URL, j.id, timeout=60)["attempt"] == 1
    wait_until(lambda: unhealthy() is None, 20, "the worker to be healthy again", w.log)


# -- a database that is down at start ----------------------------------------------------------------

class _Proxy:
    """A TCP port that forwards to the test database once started (until then nothing listens)."""

    def __init__(self) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        d = psycopg.conninfo.conninfo_to_dict(URL)
        self.host, self.db_port = d.get("host", "localhost"), int(d.get("port", 5432))
        self.loop = asyncio.new_event_loop()

    async def _pipe(self, r, w) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def _client(self, cr, cw) -> None:
        if self.host.startswith("/"):
            sr, sw = await asyncio.open_unix_connection(f"{self.host}/.s.PGSQL.{self.db_port}")
        else:
            sr, sw = await asyncio.open_connection(self.host, self.db_port)
        await asyncio.gather(self._pipe(cr, sw), self._pipe(sr, cw))

    def start(self) -> None:
        async def serve() -> None:
            self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(serve(), self.loop).result(10)

    def url(self) -> str:
        d = psycopg.conninfo.conninfo_to_dict(URL)
        d.update(host="127.0.0.1", port=str(self.port))
        return psycopg.conninfo.make_conninfo(**d)


def test_a_database_down_at_start_is_waited_for(start_worker, queue):
    proxy = _Proxy()
    w = start_worker("--queue", f"{queue}:2", *FAST, env={"PGJOBQ_DATABASE_URL": proxy.url()})
    wait_until(lambda: log_text(w).count("cannot reach the database") >= 2, 30, "two tries", w.log)
    assert w.alive() and "Traceback" not in log_text(w)
    lines = [ln for ln in log_text(w).splitlines() if "cannot reach the database" in ln]
    assert lines[0].startswith("pgjobq worker: cannot reach the database to write the App's schedules (")
    proxy.start()
    job = py_tasks.add.configure(queue=queue).defer(URL, a=1, b=1)
    assert py_tasks.app.result(job.id, timeout=60, conn=URL) == {"sum": 2}
