"""Enqueueing: in the caller's transaction with every driver, all the options, many at once, errors."""

import asyncio
import datetime as dt
import math
import os
import time

import psycopg
import psycopg2
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

import pgjobq
from conftest import URL, scalar


def make_app(queue):
    app = pgjobq.App(URL, queue=queue)

    @app.task
    def send_mail(to, subject="hello"):
        return {"sent": to}

    return app, send_mail


def jobs_in(queue):
    return scalar("SELECT count(*) FROM pgjobq.all_jobs WHERE queue = %s", queue)


@pytest.fixture
def orders(pg, queue):
    """A table of the test's own: the caller's data that the job must go with."""
    name = f"orders_{queue}"
    pg.execute(f"CREATE TABLE {name} (id int PRIMARY KEY)")
    yield name
    pg.execute(f"DROP TABLE {name}")


def rows_in(table):
    return scalar(f"SELECT count(*) FROM {table}")


def test_psycopg_sync_joins_the_transaction(queue, orders):
    app, send_mail = make_app(queue)
    with psycopg.connect(URL) as conn:
        conn.execute(f"INSERT INTO {orders} VALUES (1)")
        job = send_mail.defer(conn, to="ana@example.org")
        assert not job.duplicate
        assert jobs_in(queue) == 0  # not committed yet: nobody else sees it
        conn.rollback()
        assert (rows_in(orders), jobs_in(queue)) == (0, 0)
        conn.execute(f"INSERT INTO {orders} VALUES (2)")
        job = send_mail.defer(conn, to="bo@example.org")
        conn.commit()
    assert (rows_in(orders), jobs_in(queue)) == (1, 1)
    got = app.get(job.id)
    assert (got.kind, got.queue, got.payload, got.state) == ("send_mail", queue, {"to": "bo@example.org"}, "queued")


def test_psycopg_async_joins_the_transaction(queue, orders):
    app, send_mail = make_app(queue)

    async def go():
        async with await psycopg.AsyncConnection.connect(URL) as conn:
            await conn.execute(f"INSERT INTO {orders} VALUES (1)")
            await send_mail.defer_async(conn, to="ana@example.org")
            await pgjobq.enqueue_many_async(conn, [send_mail.spec(to="x"), send_mail.spec(to="y")])
            await conn.rollback()
            assert (rows_in(orders), jobs_in(queue)) == (0, 0)
            await conn.execute(f"INSERT INTO {orders} VALUES (2)")
            j = await send_mail.defer_async(conn, to="bo@example.org")
            await conn.commit()
            return j

    job = asyncio.run(go())
    assert (rows_in(orders), jobs_in(queue)) == (1, 1)
    assert app.get(job.id).payload == {"to": "bo@example.org"}


def test_psycopg2_joins_the_transaction(queue, orders):
    app, send_mail = make_app(queue)
    conn = psycopg2.connect(URL)
    try:
        cur = conn.cursor()
        cur.execute(f"INSERT INTO {orders} VALUES (1)")
        send_mail.defer(conn, to="ana@example.org")
        pgjobq.enqueue_many(conn, [send_mail.spec(to="x")])
        conn.rollback()
        assert (rows_in(orders), jobs_in(queue)) == (0, 0)
        cur.execute(f"INSERT INTO {orders} VALUES (2)")
        job = send_mail.defer(conn, to="bo@example.org")
        conn.commit()
    finally:
        conn.close()
    assert (rows_in(orders), jobs_in(queue)) == (1, 1)
    assert app.get(job.id).state == "queued"


@pytest.mark.parametrize("future", [False, True], ids=["sqlalchemy-1.4-style", "sqlalchemy-2.0-style"])
def test_sqlalchemy_session_joins_the_transaction(queue, orders, future):
    app, send_mail = make_app(queue)
    engine = create_engine("postgresql+psycopg2://", creator=lambda: psycopg2.connect(URL), future=future)
    try:
        with Session(engine) as session:
            session.execute(text(f"INSERT INTO {orders} VALUES (:id)"), {"id": 1})
            send_mail.defer(session, to="ana@example.org")
            session.rollback()
        assert (rows_in(orders), jobs_in(queue)) == (0, 0)

        with Session(engine) as session:
            with session.begin():  # commits at the end of the block, or rolls back if it raises
                session.execute(text(f"INSERT INTO {orders} VALUES (:id)"), {"id": 2})
                job = send_mail.defer(session, to="bo@example.org")
        assert (rows_in(orders), jobs_in(queue)) == (1, 1)

        with pytest.raises(RuntimeError):
            with engine.begin() as db:  # a Connection
                db.execute(text(f"INSERT INTO {orders} VALUES (:id)"), {"id": 3})
                send_mail.defer(db, to="cy@example.org")
                raise RuntimeError("payment declined")
        assert (rows_in(orders), jobs_in(queue)) == (1, 1)

        with engine.begin() as db:
            db.execute(text(f"INSERT INTO {orders} VALUES (:id)"), {"id": 4})
            send_mail.defer(db, to="di@example.org")
        send_mail.defer(engine, to="ed@example.org")  # an Engine: a transaction of its own
        assert (rows_in(orders), jobs_in(queue)) == (2, 3)

        with engine.connect() as db:  # no begin(): 2.0 style began a transaction, 1.4 style autocommits writes
            send_mail.defer(db, to="fy@example.org")
            if future:
                db.commit()
        assert jobs_in(queue) == 4
        with Session(engine) as session:  # reading through a session too
            assert app.get(job.id, conn=session).payload == {"to": "bo@example.org"}
    finally:
        engine.dispose()


def test_defer_of_what_json_cannot_hold_writes_nothing(queue):
    app, send_mail = make_app(queue)
    with psycopg.connect(URL) as conn:
        bad = [
            ({"to": dt.datetime(2026, 1, 1)}, "to is a datetime.datetime"),
            ({"to": {1, 2}}, "to is a builtins.set"),
            ({"to": b"bytes"}, "to is a builtins.bytes"),
            ({"to": [1, math.nan]}, "to[1] is nan"),
            ({"to": {"nested": {3: "x"}}}, "has the key 3 (int)"),
            ({"to": "x", "subject": object()}, "subject is a builtins.object"),
        ]
        for kwargs, message in bad:
            with pytest.raises(pgjobq.InvalidJob, match="send_mail.defer") as e:
                send_mail.defer(conn, **kwargs)
            assert message in str(e.value)
        with pytest.raises(pgjobq.InvalidJob, match="unexpected keyword argument 'too'"):
            send_mail.defer(conn, to="ana@example.org", too="bo@example.org")
        with pytest.raises(pgjobq.InvalidJob, match="missing a required argument: 'to'"):
            send_mail.defer(conn)
        with pytest.raises(pgjobq.InvalidJob, match="1 MiB"):
            send_mail.defer(conn, to="x" * 1100000)
        with pytest.raises(pgjobq.InvalidJob, match=r"enqueue_many: job 1: payload\['to'\] is a builtins.set"):
            pgjobq.enqueue_many(conn, [send_mail.spec(to="fine"), pgjobq.JobSpec(kind="k", payload={"to": {1}})])
        with pytest.raises(pgjobq.InvalidJob, match="no time zone"):
            send_mail.configure(run_at=dt.datetime(2030, 1, 1)).defer(conn, to="x")
        # Nothing was sent: the connection never even began a transaction.
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert jobs_in(queue) == 0


def test_options_reach_the_row(queue):
    app, send_mail = make_app(queue)
    parent = app.enqueue("parent", {"p": 1})
    at = dt.datetime(2030, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
    with psycopg.connect(URL) as conn:
        a = send_mail.configure(priority=-7, max_attempts=3, concurrency_key="customer:42", delay="10m").defer(conn, to="a")
        b = send_mail.configure(run_at=at, unique_key="digest:ana").defer(conn, to="b")
        c = send_mail.configure(after=[parent], tags=["nightly", "mail"], on_parent_failure="run").defer(conn, to="c")
        d = pgjobq.enqueue(conn, "raw", [1, "two"], queue=queue, delay=dt.timedelta(seconds=30))
        conn.commit()
    ga, gb, gc, gd = (app.get(j.id) for j in (a, b, c, d))
    assert (ga.priority, ga.max_attempts, ga.concurrency_key) == (-7, 3, "customer:42")
    assert 590 < (ga.run_at - ga.created_at).total_seconds() < 610
    assert (gb.run_at, gb.unique_key) == (at, "digest:ana")
    assert (gc.state, sorted(gc.tags)) == ("waiting", ["mail", "nightly"])
    assert scalar("SELECT on_parent_failure FROM pgjobq.jobs WHERE id = %s", gc.id) == "run"
    assert scalar("SELECT count(*) FROM pgjobq.deps WHERE parent = %s AND child = %s", parent.id, gc.id) == 1
    assert (gd.kind, gd.payload) == ("raw", [1, "two"])


def test_many_in_one_statement_in_order(queue):
    app, send_mail = make_app(queue)
    with psycopg.connect(URL) as conn:
        jobs = pgjobq.enqueue_many(conn, [send_mail.configure(priority=i % 3).spec(to=f"n{i}") for i in range(500)])
        conn.commit()
    assert len(jobs) == 500 and len({j.id for j in jobs}) == 500
    assert [j.id for j in jobs] == sorted(j.id for j in jobs)
    assert app.get(jobs[123].id).payload == {"to": "n123"}
    assert app.get(jobs[124].id).priority == 124 % 3
    # Jobs that wait for others go through enqueue_graph, still one statement.
    more = app.enqueue_many([send_mail.spec(to="x"), send_mail.configure(after=[jobs[0]], tags=["t"]).spec(to="y")])
    assert [app.get(j.id).state for j in more] == ["queued", "waiting"]


def test_unique_key_duplicates(queue):
    app, send_mail = make_app(queue)
    first = send_mail.configure(unique_key="digest:ana").defer(to="ana")
    again = send_mail.configure(unique_key="digest:ana").defer(to="ana")
    assert again == pgjobq.Enqueued(first.id, duplicate=True)
    with pytest.raises(pgjobq.DuplicateJob) as e:
        send_mail.configure(unique_key="digest:ana", on_duplicate="raise").defer(to="ana")
    assert e.value.holder_id == first.id and "digest:ana" in str(e.value)
    many = app.enqueue_many([send_mail.configure(unique_key="digest:ana").spec(to="a"),
                             send_mail.configure(unique_key="digest:bo").spec(to="b")])
    assert many[0] == pgjobq.Enqueued(first.id, True) and not many[1].duplicate
    # Raised from the package's own transaction: rolled back, digest:cy not enqueued either.
    with pytest.raises(pgjobq.DuplicateJob):
        app.enqueue_many([send_mail.configure(unique_key="digest:cy").spec(to="c"),
                          send_mail.configure(unique_key="digest:ana").spec(to="a")], on_duplicate="raise")
    assert scalar("SELECT count(*) FROM pgjobq.jobs WHERE unique_key = 'digest:cy'") == 0
    assert jobs_in(queue) == 2


def test_unique_key_debounce_and_throttle(queue, pg):
    """on_conflict="replace": the queued holder takes the last payload and run_at (a debounce);
    "keep" with unique_for: the key is held for the window, even after the job ran (a throttle)."""
    app, send_mail = make_app(queue)
    first = send_mail.configure(unique_key="digest:ana", on_conflict="replace", delay="1h").defer(to="a")
    later = send_mail.configure(unique_key="digest:ana", on_conflict="replace", delay="2h").defer(to="b")
    assert later == pgjobq.Enqueued(first.id, duplicate=True, replaced=True)
    info = app.get(first.id)
    assert info.payload == {"to": "b"} and info.run_at > dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=100)
    # (A replacement is what was asked: not a duplicate to raise.)
    again = send_mail.configure(unique_key="digest:ana", on_conflict="replace", on_duplicate="raise").defer(to="c")
    assert again.replaced and app.get(first.id).payload == {"to": "c"}
    many = app.enqueue_many([send_mail.configure(unique_key="digest:ana", on_conflict="replace").spec(to="d"),
                             send_mail.configure(unique_key="digest:bo", unique_for="10m").spec(to="e"),
                             send_mail.configure(unique_key="digest:bo", unique_for="10m").spec(to="f")])
    assert [(m.id == first.id, m.duplicate, m.replaced) for m in many] == [(True, True, True), (False, False, False),
                                                                           (False, True, False)]
    assert many[2].id == many[1].id
    # The throttle's job ran and finished: its key is still held for the window.
    app.cancel(many[1].id)
    held = send_mail.configure(unique_key="digest:bo", on_conflict="keep", unique_for=600).defer(to="g")
    assert held == pgjobq.Enqueued(many[1].id, duplicate=True)
    assert jobs_in(queue) == 2
    with pytest.raises(pgjobq.InvalidJob, match="keep"):
        send_mail.configure(unique_key="digest:cy", on_conflict="keep").defer(to="h")
    with pytest.raises(pgjobq.InvalidJob, match="unique_for"):
        send_mail.configure(unique_key="digest:cy", unique_for="soon").defer(to="h")


def test_errors_carry_the_sql_apis_message(queue):
    app, send_mail = make_app(queue)
    with pytest.raises(pgjobq.InvalidJob, match=r'queues\[1\] "9x" is not a queue name') as e:
        app.enqueue("k", queue="9x")
    assert e.value.sqlstate == "23514" and isinstance(e.value.__cause__, psycopg.Error)
    with pytest.raises(pgjobq.InvalidJob, match=r"priorities\[2\] is 500"):
        app.enqueue_many([pgjobq.JobSpec(queue=queue), pgjobq.JobSpec(queue=queue, priority=500)])
    with pytest.raises(pgjobq.InvalidJob, match="give run_at or delay, not both"):
        app.enqueue("k", delay=5, run_at="2030-01-01 00:00Z")
    with pytest.raises(pgjobq.InvalidJob, match=r"job 99999999999 cannot be a parent here") as e:
        app.enqueue("k", after=[99999999999])
    assert e.value.sqlstate == "23503"
    with pytest.raises(pgjobq.InvalidJob, match="cannot have a unique key"):
        app.enqueue("k", unique_key="u", tags=["t"])
    with pytest.raises(pgjobq.InvalidArgument, match="queues_concurrency_range"):
        pgjobq.set_limits(URL, queue, concurrency=-1)
    # Through SQLAlchemy the same (the driver's exception is wrapped twice).
    engine = create_engine("postgresql+psycopg2://", creator=lambda: psycopg2.connect(URL))
    try:
        with Session(engine) as s:
            with pytest.raises(pgjobq.InvalidJob, match=r'kinds\[1\] "no way"'):
                pgjobq.enqueue(s, "no way", queue=queue)
    finally:
        engine.dispose()
    assert jobs_in(queue) == 0


def test_graph_and_batch(queue):
    app, send_mail = make_app(queue)
    with psycopg.connect(URL) as conn:
        ids = pgjobq.enqueue_graph(conn, [
            pgjobq.JobSpec(ref="fetch", kind="fetch", queue=queue),
            pgjobq.JobSpec(ref="merge", kind="merge", queue=queue, after=["fetch"]),
            send_mail.configure(ref="mail", after=["merge"]).spec(to="ana"),
        ])
        batch = pgjobq.enqueue_batch(conn, [send_mail.spec(to="a"), send_mail.spec(to="b")],
                                     pgjobq.JobSpec(kind="done", queue=queue, payload={"report": 1}))
        with pytest.raises(pgjobq.InvalidJob, match="cycle"):
            pgjobq.enqueue_graph(conn, [pgjobq.JobSpec(ref="a", after=["b"]), pgjobq.JobSpec(ref="b", after=["a"])])
        conn.rollback()
        # (the failed statement aborted the transaction: the graph and batch above are gone too)
        ids = pgjobq.enqueue_graph(conn, [pgjobq.JobSpec(ref="fetch", kind="fetch", queue=queue),
                                          pgjobq.JobSpec(ref="merge", kind="merge", queue=queue, after=["fetch"])])
        batch = pgjobq.enqueue_batch(conn, [send_mail.spec(to="a"), send_mail.spec(to="b")],
                                     pgjobq.JobSpec(kind="done", queue=queue))
        conn.commit()
    assert list(ids) == ["fetch", "merge"]
    assert [app.get(i).state for i in ids.values()] == ["queued", "waiting"]
    assert len(batch.job_ids) == 2 and app.get(batch.id).state == "waiting"


def test_a_url_or_the_apps_database_commits_by_itself(queue):
    app, send_mail = make_app(queue)
    send_mail.defer(to="own connection")  # App(URL)
    pgjobq.enqueue(URL, "plain", {"x": 1}, queue=queue)
    app2 = pgjobq.App()  # $PGJOBQ_DATABASE_URL, read when needed
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PGJOBQ_DATABASE_URL", URL)
        app2.enqueue("from_env", queue=queue)
        mp.delenv("PGJOBQ_DATABASE_URL")
        mp.delenv("DATABASE_URL", raising=False)
        with pytest.raises(pgjobq.PgjobqError, match="no database"):
            app2.enqueue("nowhere", queue=queue)
    assert jobs_in(queue) == 3


def test_what_is_not_a_connection_is_refused():
    with pytest.raises(TypeError, match="cannot run SQL on a builtins.int"):
        pgjobq.enqueue(42, "k")
    with psycopg.connect(URL) as conn:
        with pytest.raises(TypeError, match="_async"):
            asyncio.run(pgjobq.enqueue_async(conn, "k"))


def _named(url, name):
    """url with application_name set, so that the test can find the package's own session."""
    if "://" in url:
        return url + ("&" if "?" in url else "?") + "application_name=" + name
    return url + " application_name=" + name


def _sessions(name):
    import psycopg

    with psycopg.connect(URL, autocommit=True) as c:
        return [r[0] for r in c.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s ORDER BY pid",
                                        (name,))]


def test_a_url_keeps_its_connection_between_calls(queue):
    own = _named(URL, queue)
    pgjobq.enqueue(own, "first", queue=queue)
    first = _sessions(queue)
    assert len(first) == 1  # kept, idle, after a commit
    with pytest.raises(pgjobq.InvalidJob):
        pgjobq.enqueue(own, "no way", queue=queue)
    assert _sessions(queue) == first  # rolled back, and kept
    for i in range(20):
        pgjobq.enqueue(own, "more", {"i": i}, queue=queue)
    assert _sessions(queue) == first  # the same backend ran all 21
    assert jobs_in(queue) == 21


def test_a_kept_connection_that_the_server_ended_is_replaced(queue, monkeypatch):
    own = _named(URL, queue)
    pgjobq.enqueue(own, "before", queue=queue)
    (pid,) = _sessions(queue)
    assert scalar("SELECT pg_terminate_backend(%s)", pid) is True
    deadline = time.monotonic() + 10
    while _sessions(queue) and time.monotonic() < deadline:
        time.sleep(0.02)
    # Seen as ended before use (the server's goodbye is waiting on the socket):
    pgjobq.enqueue(own, "after", queue=queue)
    (pid2,) = _sessions(queue)
    assert pid2 != pid
    # Ended unseen (as if between the look and the statement): the statement fails on the dead
    # connection and runs once on a new one.
    monkeypatch.setattr(pgjobq._sql, "_healthy", lambda conn: True)
    assert scalar("SELECT pg_terminate_backend(%s)", pid2) is True
    while _sessions(queue) and time.monotonic() < deadline:
        time.sleep(0.02)
    pgjobq.enqueue(own, "unseen", queue=queue)
    assert scalar("SELECT count(*) FROM pgjobq.all_jobs WHERE queue = %s AND kind = 'unseen'", queue) == 1
    assert jobs_in(queue) == 3


def test_a_forked_child_leaves_its_parents_connection_alone(queue):
    own = _named(URL, queue)
    pgjobq.enqueue(own, "parent", queue=queue)
    (pid,) = _sessions(queue)
    child = os.fork()
    if child == 0:
        code = 1
        try:
            pgjobq.enqueue(own, "child", queue=queue)
            pgjobq._sql._close_idle()  # what exiting runs (atexit)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    pgjobq.enqueue(own, "parent_again", queue=queue)
    assert pid in _sessions(queue)  # the parent's session was not ended by its child
    assert jobs_in(queue) == 3


def test_the_async_functions_keep_their_connection_per_event_loop(queue):
    own = _named(URL, queue)

    async def go(n):
        for i in range(n):
            await pgjobq.enqueue_async(own, "more", {"i": i}, queue=queue)
        deadline = time.monotonic() + 10
        while len(_sessions(queue)) > 1 and time.monotonic() < deadline:
            time.sleep(0.02)  # a session being ended (a closed loop's) leaves the list shortly
        kept = _sessions(queue)
        with pytest.raises(pgjobq.InvalidJob):
            await pgjobq.enqueue_async(own, "no way", queue=queue)
        assert _sessions(queue) == kept  # rolled back, and kept
        await pgjobq.enqueue_async(own, "after", queue=queue)
        return kept

    first = asyncio.run(go(20))
    assert len(first) == 1  # one backend ran all 22 statements of that loop
    # A new event loop cannot use the last one's connection: it opens its own, and the closed loop's
    # connection is ended (a kept connection never outlives its loop by more than this).
    second = asyncio.run(go(1))
    assert len(second) == 1 and second != first
    assert jobs_in(queue) == 20 + 1 + 2


def test_a_kept_async_connection_that_the_server_ended_is_replaced(queue, monkeypatch):
    own = _named(URL, queue)

    async def go():
        await pgjobq.enqueue_async(own, "before", queue=queue)
        (pid,) = _sessions(queue)
        assert scalar("SELECT pg_terminate_backend(%s)", pid) is True
        deadline = time.monotonic() + 10
        while _sessions(queue) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await pgjobq.enqueue_async(own, "after", queue=queue)  # seen as ended before use
        (pid2,) = _sessions(queue)
        assert pid2 != pid
        # Ended unseen: the statement fails on the dead connection and runs once on a new one.
        monkeypatch.setattr(pgjobq._sql, "_healthy", lambda conn: True)
        assert scalar("SELECT pg_terminate_backend(%s)", pid2) is True
        while _sessions(queue) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await pgjobq.enqueue_async(own, "unseen", queue=queue)

    asyncio.run(go())
    assert scalar("SELECT count(*) FROM pgjobq.all_jobs WHERE queue = %s AND kind = 'unseen'", queue) == 1
    assert jobs_in(queue) == 3
    pgjobq._sql._close_idle()  # what exiting runs: the connection of the closed loop ends
    deadline = time.monotonic() + 10
    while _sessions(queue) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _sessions(queue) == []
