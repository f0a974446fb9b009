"""A cluster of shards (docs/python.md, "Shards"): two databases of the test's server, each a shard with
the map installed (pgjobq.cluster_set), and the package routing over them as SQL's route_partition does."""

import asyncio
import json
import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgjobq
from conftest import CLI, HERE, PYDIR, URL

try:
    from pgjobq import _cluster
except ImportError:  # a package without clusters: every test below fails on its own account
    _cluster = None

P = 8
OWNERS = ["a", "b"] * (P // 2)
SPREAD = "pyc_tenants"       # spread over the shards by route_key
PINNED = "pyc_pinned"        # pinned to partition 3: shard b
ON_A = "pyc_on_a"            # pinned to partition 0: shard a (the worker test's)
FLOOR = 100000               # ids at most this are "from before the cluster": any shard


def _db(name):
    return make_conninfo(URL, dbname=name)


def _admin(sql, *params):
    with psycopg.connect(URL, autocommit=True) as c:
        cur = c.execute(sql, params)
        return cur.fetchall() if cur.description else []


def _make_db(name):
    """A migrated database: from the harness's template when there is one, else migrated here."""
    if _admin("SELECT 1 FROM pg_database WHERE datname = 'tmpl_migrated'"):
        _admin(f'CREATE DATABASE "{name}" TEMPLATE tmpl_migrated')
        return
    _admin(f'CREATE DATABASE "{name}"')
    subprocess.run([CLI, "migrate", "--db", _db(name)], check=True, stdout=subprocess.DEVNULL)


def the_map(conninfos, epoch=1, owners=None, queues=None):
    return {"name": "pyc", "epoch": epoch, "partitions": P, "id_floor": FLOOR,
            "shards": {"a": {"number": 0, "conninfo": conninfos["a"]}, "b": {"number": 1, "conninfo": conninfos["b"]}},
            "owners": owners or OWNERS,
            "queues": queues or {SPREAD: {"placement": "spread"}, PINNED: {"placement": "pinned", "partition": 3},
                                ON_A: {"placement": "pinned", "partition": 0}}}


def install(conninfos, m):
    for s in ("a", "b"):
        with psycopg.connect(conninfos[s], autocommit=True) as c:
            c.execute("SELECT pgjobq.cluster_set(%s::jsonb, %s)", (json.dumps(m), s))


@pytest.fixture(scope="module")
def shards():
    """{"a": conninfo, "b": conninfo, "old": the id of a job shard b had before it joined}."""
    base = conninfo_to_dict(URL)["dbname"][:40]
    tag = uuid.uuid4().hex[:6]
    names = {s: f"{base}_{tag}_{s}" for s in ("a", "b")}
    for n in names.values():
        _make_db(n)
    conninfos = {s: _db(n) for s, n in names.items()}
    with psycopg.connect(conninfos["b"], autocommit=True) as c:
        old = c.execute("SELECT id FROM pgjobq.enqueue('pyc_old', 'echo')").fetchone()[0]
    install(conninfos, the_map(conninfos))
    yield {**conninfos, "old": old}
    for n in names.values():
        _admin(f'DROP DATABASE "{n}" WITH (FORCE)')


@pytest.fixture(autouse=True)
def fresh_maps():
    """Each test reads the map anew (the package keeps one per process and spec)."""
    if _cluster is not None:
        _cluster._clusters.clear()
    yield
    if _cluster is not None:
        _cluster._clusters.clear()


def jobs_on(shards):
    out = []
    for s in ("a", "b"):
        with psycopg.connect(shards[s], autocommit=True) as c:
            out.append(c.execute("SELECT count(*) FROM pgjobq.all_jobs").fetchone()[0])
    return out


def key_on(shards, shard, prefix):
    """A routing key of the spread queue that lives on that shard."""
    keys = [f"{prefix}{i}" for i in range(64)]
    return next(k for k, o in zip(keys, sql_owners(shards["a"], [(SPREAD, k) for k in keys])) if o == shard)


def sql_owner(ci, queue, key=None):
    with psycopg.connect(ci, autocommit=True) as c:
        return c.execute("SELECT o.shard FROM pgjobq.cluster_owners o WHERE o.partition = pgjobq.route_partition(%s, %s)",
                         (queue, key)).fetchone()[0]


def shards_of(shards, ids):
    """Which shard has each job (one look at each shard), and that no two have one."""
    ids = [int(i) for i in ids]
    where = {}
    for s in ("a", "b"):
        with psycopg.connect(shards[s], autocommit=True) as c:
            for (i,) in c.execute("SELECT id FROM pgjobq.all_jobs WHERE id = ANY(%s)", (ids,)).fetchall():
                assert i not in where, f"job {i} is on two shards"
                where[i] = s
    return [where.get(i) for i in ids]


def shard_of(shards, job_id):
    return shards_of(shards, [job_id])[0]


def sql_owners(ci, pairs):
    with psycopg.connect(ci, autocommit=True) as c:
        rows = c.execute("SELECT o.shard FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS x(q, k, n) "
                         "JOIN pgjobq.cluster_owners o ON o.partition = pgjobq.route_partition(x.q, x.k) ORDER BY x.n",
                         ([q for q, _ in pairs], [k for _, k in pairs])).fetchall()
    return [r[0] for r in rows]


def make_app(shards, **kw):
    app = pgjobq.App(cluster=shards["a"], name="pyc", **kw)

    @app.task(queue=SPREAD)
    def work(tenant, n=0):
        return {"tenant": tenant, "n": n}

    return app, work


def test_routing_equals_sql_route_partition(shards):
    """route_hash and the partition of pinned, spread and unlisted queues, for many keys (ASCII,
    multibyte, long, one byte), equal the SQL functions'."""
    keys = [f"tenant-{i}" for i in range(150)] + ["", "a", "é", "日本語のキー", "🙂" * 7, "x" * 255, "Straße 1",
                                                 "\u00ff\u0100", "key with spaces", "0"]
    queues = [SPREAD, PINNED, "default", "pyc_other", "mail", "q-1.2:x"]
    m = _cluster.cluster_for(shards["a"]).map()
    with psycopg.connect(shards["a"], autocommit=True) as c:
        rows = c.execute("SELECT k, pgjobq.route_hash(k) FROM unnest(%s::text[]) AS k", (keys,)).fetchall()
        assert [(k, _cluster.route_hash(k)) for k in keys] == rows
        pairs = [(q, k) for q in queues for k in keys[:40] + keys[-10:] + [None]]
        want = c.execute("SELECT pgjobq.route_partition(q, k) FROM unnest(%s::text[], %s::text[]) AS x(q, k)",
                         ([q for q, _ in pairs], [k for _, k in pairs])).fetchall()
    assert [m.partition(q, k) for q, k in pairs] == [w[0] for w in want]
    assert len({m.partition(SPREAD, k) for k in keys}) == P  # the keys do spread
    assert m.partition(PINNED, "anything") == 3 and m.owner(PINNED, None) == "b"
    # FNV-1a's published vectors (32 bits).
    assert [_cluster.route_hash(k) for k in ("", "a", "foobar")] == [0x811C9DC5, 0xE40C292C, 0xBF9CF968]


def test_defer_routes_each_job_to_its_owner(shards):
    app, work = make_app(shards)
    jobs = {}
    for i in range(24):
        t = f"t{i}"
        jobs[t] = work.defer(route_key=t, tenant=t)          # route_key= at defer: the routing key
    owners = sql_owners(shards["a"], [(SPREAD, t) for t in jobs])
    assert shards_of(shards, [j.id for j in jobs.values()]) == owners
    assert [j.id % 1024 for j in jobs.values()] == [{"a": 0, "b": 1}[o] for o in owners]  # the id names its shard
    assert set(owners) == {"a", "b"}
    pinned = app.enqueue("echo", {"x": 1}, queue=PINNED)
    assert shard_of(shards, pinned.id) == "b"
    plain = work.configure(queue="pyc_plain").delay(tenant="x")  # a queue the map does not list: pinned
    assert shard_of(shards, plain.id) == sql_owner(shards["a"], "pyc_plain")
    assert app.get(pinned.id).payload == {"x": 1}
    # async: the same routing
    async def go():
        return [await work.configure(route_key=f"t{i}").defer_async(tenant=f"t{i}") for i in range(6)]

    got = asyncio.run(go())
    assert shards_of(shards, [j.id for j in got]) == sql_owners(shards["a"], [(SPREAD, f"t{i}") for i in range(6)])


def test_a_batch_over_two_shards_lands_each_job_on_its_owner(shards):
    app, work = make_app(shards)
    specs = [work.configure(route_key=f"k{i}").spec(tenant=f"k{i}", n=i) for i in range(20)]
    specs += [work.spec(tenant=f"k{i}", n=i, route_key=f"k{i}") for i in range(20, 40)]   # the same
    assert specs[25].route_key == "k25" and specs[25].payload == {"tenant": "k25", "n": 25}
    specs.append(pgjobq.JobSpec(kind="echo", queue=PINNED, payload={"n": 40}))
    got = app.enqueue_many(specs)
    assert len(got) == len(specs) and len({g.id for g in got}) == len(specs)
    owners = sql_owners(shards["a"], [(s.queue, s.route_key) for s in specs])
    assert set(owners) == {"a", "b"}
    assert shards_of(shards, [g.id for g in got]) == owners
    assert [app.get(g.id).payload for g in got[::7]] == [s.payload for s in specs[::7]]   # input order kept
    assert [app.get(g.id).route_key for g in got[::7]] == [s.route_key for s in specs[::7]]
    # The async functions the same way.
    os.environ["PGJOBQ_CLUSTER"] = shards["a"]
    try:
        agot = asyncio.run(pgjobq.enqueue_many_async(None, specs[:12]))
    finally:
        del os.environ["PGJOBQ_CLUSTER"]
    assert shards_of(shards, [g.id for g in agot]) == owners[:12]
    # The module-level function with $PGJOBQ_CLUSTER does the same.
    os.environ["PGJOBQ_CLUSTER"] = shards["b"]
    try:
        more = pgjobq.enqueue_many(None, specs[:10])
    finally:
        del os.environ["PGJOBQ_CLUSTER"]
    assert shards_of(shards, [g.id for g in more]) == owners[:10]
    with pytest.raises(pgjobq.InvalidJob, match="job 1 is a dict, not a JobSpec"):
        app.enqueue_graph([specs[0], {"kind": "echo"}])
    with pytest.raises(pgjobq.InvalidJob, match="job 0 is a str, not a JobSpec"):
        app.enqueue_many(["echo"])
    # A graph is one statement on one shard: its jobs must share one.
    with pytest.raises(pgjobq.InvalidJob, match="one statement on one shard"):
        app.enqueue_graph([specs[owners.index("a")], specs[owners.index("b")]])
    # A job's parent (a ref of the call) on another shard is refused before anything is sent.
    ia, ib = owners.index("a"), owners.index("b")
    before = jobs_on(shards)
    with pytest.raises(pgjobq.InvalidJob, match="parents must be on its shard"):
        app.enqueue_many([specs[ia].replace(ref="p", tags=["x"]), specs[ib].replace(after=["p"])])
    assert jobs_on(shards) == before


def test_a_stale_map_is_read_again_and_the_job_routed_again(shards):
    app, work = make_app(shards)
    first = app.enqueue("echo", {}, queue=PINNED)                   # reads the map of epoch 1: partition 3 on b
    assert shard_of(shards, first.id) == "b"
    epoch = _cluster.cluster_for(shards["a"]).map().epoch
    moved = list(OWNERS)
    moved[3] = "a"                                                 # partition 3 moves to shard a
    install(shards, the_map(shards, epoch=epoch + 1, owners=moved))
    try:
        job = app.enqueue("echo", {"after": "move"}, queue=PINNED)   # sent to b (stale): PJQ01, read again, to a
        assert shard_of(shards, job.id) == "a"
        assert _cluster.cluster_for(shards["a"]).map().epoch == epoch + 1
        # A batch whose part is refused is routed again too.
        app2, _ = make_app(shards)
        _cluster._clusters.clear()
        stale = _cluster.cluster_for(shards["a"])
        stale._map = _cluster.Map(the_map(shards, epoch=epoch), shards["a"], "test")  # an old map, as if read before
        got = app2.enqueue_many([pgjobq.JobSpec(kind="echo", queue=PINNED), work.configure(route_key="k1").spec(tenant="k1")])
        assert shard_of(shards, got[0].id) == "a"
        assert stale.map().epoch == epoch + 1
    finally:
        install(shards, the_map(shards, epoch=epoch + 2))


def test_get_result_cancel_find_jobs_on_both_shards(shards):
    app, work = make_app(shards)
    on_a = next(j for j in (work.configure(route_key=f"g{i}").delay(tenant="g") for i in range(20))
                if shard_of(shards, j.id) == "a")
    on_b = app.enqueue("echo", {"b": True}, queue=PINNED)
    assert app.get(on_a.id).queue == SPREAD and app.get(on_b.id).payload == {"b": True}
    assert app.get(on_b.id + 1024 * 1000) is None
    # An id at most the floor names no shard: every shard is asked (shard b had it before it joined).
    old = app.get(shards["old"])
    assert old is not None and old.queue == "pyc_old"
    assert app.cancel(shards["old"]) == "cancelled"
    with pytest.raises(pgjobq.JobCancelled):
        app.result(shards["old"], timeout=5)
    assert app.cancel(on_b.id) == "cancelled" and app.cancel(on_a.id) == "cancelled"
    assert app.retry(on_b.id) == "queued" and shard_of(shards, on_b.id) == "b"
    with pytest.raises(pgjobq.JobCancelled):
        app.result(on_a.id, timeout=5)
    with pytest.raises(pgjobq.JobNotFound):
        app.result(7, timeout=1)                                    # at most the floor, on no shard


def test_admin_calls_act_on_the_shards_that_hold_the_queue(shards, tmp_path):
    app, work = make_app(shards)
    key_a, key_b = key_on(shards, "a", "adm"), key_on(shards, "b", "adm")
    jobs = [work.configure(route_key=k).delay(tenant=k) for k in (key_a, key_b, key_a, key_b)]
    assert sorted(shards_of(shards, [j.id for j in jobs])) == ["a", "a", "b", "b"]
    # A filter acts on every shard, summed.
    assert app.cancel_where(SPREAD, "queued", dry_run=True) >= 4
    n = app.cancel_where(SPREAD, "queued")
    assert n >= 4 and all(app.get(j.id).state == "cancelled" for j in jobs)
    assert app.retry_where(SPREAD, "cancelled")["retried"] >= n  # (and those other tests cancelled)
    assert all(app.get(j.id).state == "queued" for j in jobs)
    # A pinned queue's settings go to its owner (b); a spread queue's to every shard.
    assert app.pause(PINNED, "maintenance") is True
    app.set_limits(SPREAD, concurrency=7)

    def setting(shard, queue, col):
        with psycopg.connect(shards[shard], autocommit=True) as c:
            row = c.execute(f"SELECT {col} FROM pgjobq.queue_list() WHERE queue = %s", (queue,)).fetchone()
            return row[0] if row else None
    assert setting("b", PINNED, "paused_at") is not None and setting("a", PINNED, "paused_at") is None
    assert setting("a", SPREAD, "concurrency") == 7 and setting("b", SPREAD, "concurrency") == 7
    rows = app.queues()
    assert {(q.shard, q.queue) for q in rows} >= {("a", SPREAD), ("b", SPREAD), ("b", PINNED)}
    assert rows.down == {} and next(q for q in rows if (q.shard, q.queue) == ("b", PINNED)).paused
    assert app.resume(PINNED) is True and setting("b", PINNED, "paused_at") is None
    app.set_limits(SPREAD, concurrency=None)
    # A shard out of reach: a read goes on with the others and names it; a write that needs it raises.
    down = dict(shards)
    down["b"] = "host=127.0.0.1 port=9 dbname=nowhere connect_timeout=3"
    path = tmp_path / "map.json"
    path.write_text(json.dumps(the_map(down)))
    app_down = pgjobq.App(cluster=f"file:{path}")
    rows = app_down.queues()
    assert set(rows.down) == {"b"} and 'shard "b"' in rows.down["b"]
    assert {q.shard for q in rows} == {"a"}
    with pytest.raises(pgjobq.ShardUnavailable) as e:
        app_down.pause(PINNED)
    assert e.value.shard == "b"
    with pytest.raises(pgjobq.ShardUnavailable):
        app_down.cancel_where(SPREAD, "queued", dry_run=True)


def test_a_transactional_defer_to_another_shard_is_refused(shards):
    app, work = make_app(shards)
    key_a = key_on(shards, "a", "r")
    key_b = key_on(shards, "b", "r")
    with psycopg.connect(shards["a"]) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS pyc_orders (id int PRIMARY KEY)")
        conn.execute("INSERT INTO pyc_orders VALUES (1)")
        mine = work.configure(route_key=key_a).defer(conn, tenant=key_a)     # this shard's: in the transaction
        with pytest.raises(pgjobq.WrongShard) as e:
            work.configure(route_key=key_b).defer(conn, tenant=key_b)
        assert (e.value.shard, e.value.connection_shard, e.value.sqlstate) == ("b", "a", None)
        assert 'lives on shard "b"' in str(e.value) and 'this connection is to shard "a"' in str(e.value)
        assert "nothing was enqueued" in str(e.value)
        with pytest.raises(pgjobq.WrongShard):
            app.enqueue_many([work.configure(route_key=key_a).spec(tenant="x"),
                              work.configure(route_key=key_b).spec(tenant="y")], conn=conn)
        conn.commit()                                                # the transaction was not broken
    assert shard_of(shards, mine.id) == "a"
    with psycopg.connect(shards["b"], autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM pgjobq.all_jobs WHERE queue = %s AND route_key IN (%s, 'x', 'y')",
                         (SPREAD, key_b)).fetchone()[0] == 0
    # Without a cluster, the shard's guard refuses it (PJQ01), raised as WrongShard naming the owner.
    with psycopg.connect(shards["a"]) as conn:
        with pytest.raises(pgjobq.WrongShard) as e:
            pgjobq.enqueue(conn, "echo", {}, queue=PINNED)
        assert (e.value.sqlstate, e.value.shard, e.value.connection_shard) == ("PJQ01", "b", "a")


def test_the_guard_in_a_transaction_says_to_run_it_again(shards, tmp_path):
    """The App's map says shard a owns PINNED's partition, the shards' say b: the check passes, the
    guard refuses (PJQ01), and the error says the transaction is to be run again."""
    stale = the_map(shards, owners=["a"] * P)
    path = tmp_path / "map.json"
    path.write_text(json.dumps(stale))
    app = pgjobq.App(cluster=str(path))
    with psycopg.connect(shards["a"]) as conn:
        with pytest.raises(pgjobq.WrongShard) as e:
            app.enqueue("echo", {}, queue=PINNED, conn=conn)
        assert e.value.sqlstate == "PJQ01" and e.value.shard == "b"
        assert "run it again" in str(e.value)
        conn.rollback()


def test_a_shard_that_is_down_fails_fast_naming_it(shards, tmp_path):
    down = dict(shards)
    down["b"] = "host=127.0.0.1 port=9 dbname=nowhere connect_timeout=3"   # nothing listens there
    path = tmp_path / "map.json"
    path.write_text(json.dumps(the_map(down)))
    app = pgjobq.App(cluster=f"file:{path}")
    m = _cluster.cluster_for(f"file:{path}").map()
    assert "connect_timeout=3" in m.urls["b"]                               # the map's, when it gives one
    if not os.environ.get("PGCONNECT_TIMEOUT"):
        assert "connect_timeout=5" in m.urls["a"]                           # else 5 s
    with pytest.raises(pgjobq.ShardUnavailable) as e:
        app.enqueue("echo", {}, queue=PINNED)
    assert e.value.shard == "b" and 'shard "b"' in str(e.value) and "127.0.0.1" in str(e.value)
    key_a = key_on(shards, "a", "d")
    ok = app.enqueue("echo", {}, queue=SPREAD, route_key=key_a)          # shard a is not held up
    assert shard_of(shards, ok.id) == "a"
    specs = [pgjobq.JobSpec(kind="echo", queue=PINNED), pgjobq.JobSpec(kind="echo", queue=SPREAD, route_key=key_a)]
    with pytest.raises(pgjobq.ShardUnavailable) as e:
        app.enqueue_many(specs)
    partial = e.value.partial
    assert partial[0] is None and shard_of(shards, partial[1].id) == "a"  # a's part written, b's not


def test_a_file_map_and_a_database_without_a_map(shards, tmp_path):
    path = tmp_path / "map.json"
    path.write_text("{not json")
    with pytest.raises(pgjobq.InvalidArgument, match="not JSON"):
        pgjobq.App(cluster=str(path)).enqueue("echo", {})
    # A database with no map is a cluster of one shard: that database.
    app = pgjobq.App(cluster=URL, queue="pyc_single")
    job = app.enqueue("echo", {})
    with psycopg.connect(URL, autocommit=True) as c:
        assert c.execute("SELECT queue FROM pgjobq.all_jobs WHERE id = %s", (job.id,)).fetchone()[0] == "pyc_single"
    assert app.get(job.id).queue == "pyc_single"


class Counting(psycopg.Cursor):
    executed = []

    def execute(self, query, params=None, **kw):
        Counting.executed.append(str(query))
        return super().execute(query, params, **kw)


def test_one_statement_per_defer_and_the_shard_read_once_per_connection(shards):
    app, work = make_app(shards)
    plain = pgjobq.App(queue="pyc_plain")
    key_a = key_on(shards, "a", "c")
    with psycopg.connect(shards["a"], cursor_factory=Counting) as conn:
        Counting.executed.clear()
        for _ in range(3):
            plain.enqueue("echo", {}, conn=conn, queue=SPREAD, route_key=key_a)   # no cluster: one statement each
        assert len(Counting.executed) == 3
        Counting.executed.clear()
        for _ in range(3):
            work.configure(route_key=key_a).defer(conn, tenant=key_a)
        assert len(Counting.executed) == 4 and "pgjobq.cluster" in Counting.executed[0]
        conn.rollback()


def test_schedules_go_to_their_queues_shards(shards):
    app, work = make_app(shards)
    app.periodic("0 3 * * *", name="nightly", kwargs={"tenant": "all"}, queue=PINNED)(work)
    app.periodic("0 4 * * *", name="early", kwargs={"tenant": "all"}, queue="pyc_plain")(work)
    assert app.sync_schedules() == 2
    where = {}
    for s in ("a", "b"):
        with psycopg.connect(shards[s], autocommit=True) as c:
            for (name,) in c.execute("SELECT name FROM pgjobq.schedules WHERE name LIKE 'pyc:%'").fetchall():
                where[name] = s
    assert where == {"pyc:nightly": "b", "pyc:early": sql_owner(shards["a"], "pyc_plain")}
    assert app.sync_schedules() == 0


def test_the_worker_passes_the_cluster_on(shards, start_worker, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([PYDIR, HERE]), "PGJOBQ_DATABASE_URL": shards["a"]}
    r = subprocess.run([sys.executable, "-m", "pgjobq", "worker", "cluster_tasks:app", "--pgjobq", CLI,
                        "--cluster", shards["a"], "--print-command"], env=env, cwd=HERE,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0 and r.stdout.startswith("PGJOBQ_CLUSTER="), r.stdout
    # A task run by the worker of shard a defers a job that lives on shard b: the cluster routes it.
    key_b = key_on(shards, "b", "w")
    queue = ON_A
    app = pgjobq.App(cluster=shards["a"])
    job = app.enqueue("fan_out", {"queue": SPREAD, "tenant": key_b}, queue=queue)
    assert shard_of(shards, job.id) == "a"
    w = start_worker("--queue", f"{queue}:2", "--cluster", shards["a"], "--", "--log-level", "warn",
                     app="cluster_tasks:app", env={"PGJOBQ_DATABASE_URL": shards["a"]})
    deferred = app.result(job.id, timeout=60)["deferred"]
    assert shard_of(shards, deferred) == "b"
    assert app.get(deferred).payload == {"tenant": key_b}
    w.stop()


def test_forward_moves_a_job_to_its_shard_with_the_applications_transaction(shards):
    """pgjobq.forward(): a job of shard b enqueued in shard a's transaction (the application's data is
    there) through the outbox, and a forwarder that writes it to b once."""
    key = key_on(shards, "b", "fw")
    with psycopg.connect(shards["a"]) as c:
        c.execute("CREATE TABLE IF NOT EXISTS public.pyc_fw_orders (n int)")
        c.execute("INSERT INTO public.pyc_fw_orders VALUES (1)")
        pgjobq.forward(c, "echo", {"order": 1}, queue=SPREAD, route_key=key)
        c.rollback()                       # the data rolled back: no job either
        c.execute("CREATE TABLE IF NOT EXISTS public.pyc_fw_orders (n int)")
        c.execute("INSERT INTO public.pyc_fw_orders VALUES (2)")
        outbox_id = pgjobq.forward(c, "echo", {"order": 2}, queue=SPREAD, route_key=key)
        c.commit()
    with pytest.raises(pgjobq.InvalidJob, match="parents must be on its shard"):
        pgjobq.forward(shards["a"], "echo", {}, queue=SPREAD, after=[1])
    with pytest.raises(pgjobq.PgjobqError, match="not a queue name"):
        pgjobq.forward(shards["a"], "echo", {}, queue="no spaces")
    with psycopg.connect(shards["a"], autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM pgjobq.jobs WHERE queue = pgjobq.outbox_queue()").fetchone()[0] == 1
    subprocess.run([CLI, "work", "--db", shards["a"], "--forward-to", shards["a"], "--burst", "--log-level", "warn"],
                   check=True, timeout=60)
    with psycopg.connect(shards["a"], autocommit=True) as c:
        result = c.execute("SELECT result FROM pgjobq.history WHERE id = %s", (outbox_id,)).fetchone()[0]
    assert result["shard"] == "b" and result["duplicate"] is False
    with psycopg.connect(shards["b"], autocommit=True) as c:
        rows = c.execute("SELECT id, payload FROM pgjobq.jobs WHERE queue = %s AND kind = 'echo' AND route_key = %s",
                         (SPREAD, key)).fetchall()
    assert rows == [(result["id"], {"order": 2})]


def _park_for_event(ci, queue, key):
    """A job of queue on the shard ci, claimed and parked waiting for ("paid", key): its id."""
    with psycopg.connect(ci, autocommit=True) as c:
        # (First of the queue, whatever earlier tests left there: lower priorities go first.)
        jid = c.execute("SELECT id FROM pgjobq.enqueue(%s, 'echo', priority => -100::smallint)",
                        (queue,)).fetchone()[0]
        got, token = c.execute("SELECT id, lease_token FROM pgjobq.claim(%s, 1, '30 seconds', 'pytest')",
                               (queue,)).fetchone()
        assert got == jid
        (outcome,) = c.execute("SELECT outcome FROM pgjobq.wait_event(%s, %s, 'w', 'paid', %s, '1 hour')",
                               (jid, token, key)).fetchone()
        assert outcome == "parked"
    return jid


def _resumed_with(ci, queue, jid, key, want):
    """The resumed job, claimed again: its wait answers the event's payload (want); then it completes."""
    with psycopg.connect(ci, autocommit=True) as c:
        got, token = c.execute("SELECT id, lease_token FROM pgjobq.claim(%s, 1, '30 seconds', 'pytest')",
                               (queue,)).fetchone()
        assert got == jid
        assert c.execute("SELECT outcome, payload FROM pgjobq.wait_event(%s, %s, 'w', 'paid', %s, '1 hour')",
                         (jid, token, key)).fetchone() == ("event", want)
        c.execute("SELECT pgjobq.complete_many(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], ARRAY[NULL]::jsonb[])",
                  (jid, token))


def _waiting(ci, key):
    with psycopg.connect(ci, autocommit=True) as c:
        return c.execute("SELECT count(*) FROM pgjobq.job_parks WHERE event_name = 'paid' AND event_key = %s",
                         (key,)).fetchone()[0]


def test_an_event_reaches_the_waiting_jobs_of_every_shard(shards, tmp_path, monkeypatch):
    """app.send_event and pgjobq.send_event(None, ...) in a cluster: every shard (a waiting job may be on
    any); a shard that is down is raised, naming it, after the others took the event."""
    app = pgjobq.App(cluster=shards["a"])
    ja = _park_for_event(shards["a"], ON_A, "py1")
    jb = _park_for_event(shards["b"], PINNED, "py1")
    assert app.send_event("paid", "py1", {"n": 1}) == 2
    assert (_waiting(shards["a"], "py1"), _waiting(shards["b"], "py1")) == (0, 0)
    _resumed_with(shards["a"], ON_A, ja, "py1", {"n": 1})
    _resumed_with(shards["b"], PINNED, jb, "py1", {"n": 1})
    ja = _park_for_event(shards["a"], ON_A, "py2")
    jb = _park_for_event(shards["b"], PINNED, "py2")
    monkeypatch.setenv("PGJOBQ_CLUSTER", shards["a"])
    assert asyncio.run(pgjobq.send_event_async(None, "paid", "py2")) == 2
    assert (_waiting(shards["a"], "py2"), _waiting(shards["b"], "py2")) == (0, 0)
    _resumed_with(shards["a"], ON_A, ja, "py2", None)
    _resumed_with(shards["b"], PINNED, jb, "py2", None)
    # With a connection: that database alone, in its transaction.
    jb = _park_for_event(shards["b"], PINNED, "py3")
    with psycopg.connect(shards["a"]) as c:
        assert app.send_event("paid", "py3", conn=c) == 0
    assert _waiting(shards["b"], "py3") == 1
    with psycopg.connect(shards["b"], autocommit=True) as c:
        c.execute("SELECT pgjobq.cancel(%s)", (jb,))
    # Shard b down: a takes it, b is raised with what a resumed.
    down = dict(shards)
    down["b"] = "host=127.0.0.1 port=9 dbname=nowhere connect_timeout=3"
    path = tmp_path / "map.json"
    path.write_text(json.dumps(the_map(down)))
    _park_for_event(shards["a"], ON_A, "py4")
    with pytest.raises(pgjobq.ShardUnavailable) as e:
        pgjobq.App(cluster=f"file:{path}").send_event("paid", "py4")
    assert e.value.shard == "b" and e.value.resumed == 1 and len(e.value.failed) == 1
    assert _waiting(shards["a"], "py4") == 0
    with pytest.raises(pgjobq.InvalidArgument):
        app.send_event("", "py5")
