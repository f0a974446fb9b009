/*
 * test_roles.c - least privilege: a producer can only enqueue, a worker can only run jobs, an admin can
 * look; each works with a hostile search_path; and migrations run as a non-superuser owner.  What a
 * worker role can do to other workers: their jobs' lease tokens, the retention of history, and their
 * rows in the registry of workers.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static pgjobq_client *as_role(const char *role)
{
    char ci[1024];
    pgjobq_client *c = NULL;
    snprintf(ci, sizeof ci, "%s user=%s", t_conninfo(), role);
    int rc = pgjobq_client_open(&c, ci);
    CHECK_MSG(rc == PGJOBQ_OK, "open as %s: %s", role, pgjobq_errmsg(c));
    return c;
}

static void roles_setup(void)
{
    PGconn *pg = t_pg();
    char *out, *err;

    CHECK_INT(t_cli(&out, &err, NULL, 0, "migrate", "--roles", NULL), 0);
    CHECK(strstr(out, "pgjobq_producer") != NULL);
    free(out);
    free(err);
    /* Twice: idempotent. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "migrate", "--roles", NULL), 0);
    free(out);
    free(err);
    /* Roles are cluster-wide: tests in other databases may have made them already. */
    PQclear(t_exec(pg, "DO $$ BEGIN"
                       " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'app') THEN CREATE ROLE app LOGIN; END IF;"
                       " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'wrk') THEN CREATE ROLE wrk LOGIN; END IF;"
                       " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'adm') THEN CREATE ROLE adm LOGIN; END IF;"
                       " END $$"));
    PQclear(t_exec(pg, "GRANT pgjobq_producer TO app"));
    PQclear(t_exec(pg, "GRANT pgjobq_worker TO wrk"));
    PQclear(t_exec(pg, "GRANT pgjobq_admin TO adm"));
    PQfinish(pg);
}

/* Runs raw SQL as a role and returns its SQLSTATE ("" on success). */
static char state[6];
static const char *raw_as(pgjobq_client *c, const char *sql)
{
    PGresult *r = PQexec(pgjobq_client_conn(c), sql);
    const char *s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    snprintf(state, sizeof state, "%s", s ? s : "");
    PQclear(r);
    return state;
}

TEST(roles_each_role_can_do_its_job_and_nothing_more)
{
    pgjobq_job *jobs = NULL;
    pgjobq_stat *stats = NULL;
    size_t n;
    int64_t id;

    roles_setup();
    pgjobq_client *app = as_role("app"), *wrk = as_role("wrk"), *adm = as_role("adm");

    /* The producer enqueues, and can do nothing else. */
    CHECK_OK(app, pgjobq_enqueue(app, "{\"by\": \"app\"}", NULL, &id));
    CHECK_RC(app, pgjobq_claim(app, "default", 1, 30000, NULL, &jobs, &n), PGJOBQ_EPERM);
    CHECK_RC(app, pgjobq_job_get(app, id, &jobs), PGJOBQ_EPERM);
    CHECK_RC(app, pgjobq_job_cancel(app, id, NULL), PGJOBQ_EPERM);
    CHECK_RC(app, pgjobq_stats(app, &stats, &n), PGJOBQ_EPERM);
    CHECK_STR(raw_as(app, "SELECT count(*) FROM pgjobq.jobs"), "42501");
    CHECK_STR(raw_as(app, "SELECT count(*) FROM pgjobq.history"), "42501");
    CHECK_STR(raw_as(app, "SELECT count(*) FROM pgjobq.all_jobs"), "42501");
    CHECK_STR(raw_as(app, "UPDATE pgjobq.jobs SET priority = 5"), "42501");
    CHECK_STR(raw_as(app, "DELETE FROM pgjobq.jobs"), "42501");
    CHECK_STR(raw_as(app, "SELECT pgjobq.prune('0 s', '0 s', 1000)"), "42501");
    pgjobq_health h;
    CHECK_RC(app, pgjobq_health_get(app, &h), PGJOBQ_EPERM);

    /* The worker runs jobs, and cannot enqueue or read the table. */
    CHECK_OK(wrk, pgjobq_claim(wrk, "default", 10, 30000, "wrk", &jobs, &n));
    CHECK_INT(n, 1);
    CHECK_OK(wrk, pgjobq_job_extend(wrk, jobs[0].id, jobs[0].lease_token, 30000));
    CHECK_OK(wrk, pgjobq_job_complete(wrk, jobs[0].id, jobs[0].lease_token, "{\"ok\": true}"));
    pgjobq_jobs_free(jobs);
    CHECK_RC(wrk, pgjobq_enqueue(wrk, "{}", NULL, NULL), PGJOBQ_EPERM);
    CHECK_RC(wrk, pgjobq_job_retry(wrk, id), PGJOBQ_EPERM);
    CHECK_STR(raw_as(wrk, "SELECT count(*) FROM pgjobq.jobs"), "42501");
    CHECK_STR(raw_as(wrk, "SELECT count(*) FROM pgjobq.history"), "42501");
    CHECK_STR(raw_as(wrk, "SELECT count(*) FROM pgjobq.all_jobs"), "42501");
    CHECK_STR(raw_as(wrk, "DELETE FROM pgjobq.history"), "42501");
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.history_partition_create(now())"), "42501");
    CHECK_STR(raw_as(wrk, "UPDATE pgjobq.jobs SET state = 'completed'"), "42501");
    int rescued = -1;
    CHECK_OK(wrk, pgjobq_rescue_expired(wrk, 100, &rescued));
    CHECK_OK(wrk, pgjobq_health_get(wrk, &h)); /* a worker says what holds vacuum back (docs/worker.md) */

    /* The admin looks, cancels and retries. */
    CHECK_OK(adm, pgjobq_job_get(adm, id, &jobs));
    CHECK_INT(jobs[0].state, PGJOBQ_COMPLETED);
    pgjobq_jobs_free(jobs);
    CHECK_OK(adm, pgjobq_stats(adm, &stats, &n));
    pgjobq_stats_free(stats);
    CHECK_OK(adm, pgjobq_health_get(adm, &h));
    CHECK(h.jobs_bytes > 0);
    CHECK_OK(adm, pgjobq_job_retry(adm, id));
    CHECK_OK(adm, pgjobq_job_cancel(adm, id, NULL));
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    int64_t count = -1, skipped = -1;
    f.queue = "default";
    f.state = PGJOBQ_CANCELLED;
    CHECK_OK(adm, pgjobq_retry_where(adm, &f, 0, &count, &skipped));
    CHECK_INT(count, 1);
    f.state = PGJOBQ_QUEUED;
    CHECK_OK(adm, pgjobq_cancel_where(adm, &f, 0, &count));
    CHECK_INT(count, 1);
    CHECK_RC(wrk, pgjobq_cancel_where(wrk, &f, PGJOBQ_DRY_RUN, &count), PGJOBQ_EPERM);
    CHECK_RC(app, pgjobq_retry_where(app, &f, PGJOBQ_DRY_RUN, &count, NULL), PGJOBQ_EPERM);
    CHECK_STR(raw_as(adm, "DELETE FROM pgjobq.jobs"), "42501"); /* reading is not owning */

    /* Ending a running job's lease, and a queue's max lease, are the admin's only. */
    CHECK_OK(app, pgjobq_enqueue(app, "{}", NULL, &id));
    CHECK_OK(wrk, pgjobq_claim(wrk, "default", 1, 30000, "wrk", &jobs, &n));
    CHECK_INT(n, 1);
    CHECK_RC(wrk, pgjobq_job_retry_running(wrk, id, NULL), PGJOBQ_EPERM);
    CHECK_RC(app, pgjobq_job_retry_running(app, id, NULL), PGJOBQ_EPERM);
    CHECK_RC(wrk, pgjobq_queue_set_max_lease(wrk, "default", 3600000), PGJOBQ_EPERM);
    CHECK_OK(adm, pgjobq_queue_set_max_lease(adm, "default", 3600000));
    CHECK_OK(adm, pgjobq_job_retry_running(adm, id, NULL));
    CHECK_RC(wrk, pgjobq_job_complete(wrk, jobs[0].id, jobs[0].lease_token, NULL), PGJOBQ_ELEASE);
    pgjobq_jobs_free(jobs);

    /* Dead letters: the admin sets a queue's, a worker's failure for good makes one (it needs no
     * grant on the table), and the admin redrives it. */
    CHECK_RC(wrk, pgjobq_queue_set_dead_letter(wrk, "orders", "orders.dead"), PGJOBQ_EPERM);
    CHECK_OK(adm, pgjobq_queue_set_dead_letter(adm, "orders", "orders.dead"));
    pgjobq_enqueue_opts eo = PGJOBQ_ENQUEUE_OPTS_INIT;
    eo.queue = "orders";
    eo.max_attempts = 1;
    CHECK_OK(app, pgjobq_enqueue(app, "{}", &eo, &id));
    CHECK_OK(wrk, pgjobq_claim(wrk, "orders", 1, 30000, "wrk", &jobs, &n));
    CHECK_INT(n, 1);
    CHECK_OK(wrk, pgjobq_job_fail(wrk, jobs[0].id, jobs[0].lease_token, "no", 0, 0, NULL));
    pgjobq_jobs_free(jobs);
    CHECK_STR(raw_as(wrk, "SELECT count(*) FROM pgjobq.dead_letters"), "42501");
    CHECK_STR(raw_as(adm, "SELECT count(*) FROM pgjobq.dead_letters"), "");
    f.queue = "orders.dead";
    f.state = PGJOBQ_QUEUED;
    CHECK_RC(wrk, pgjobq_retry_where(wrk, &f, PGJOBQ_REDRIVE, &count, NULL), PGJOBQ_EPERM);
    CHECK_OK(adm, pgjobq_retry_where(adm, &f, PGJOBQ_REDRIVE, &count, NULL));
    CHECK_INT(count, 1);

    pgjobq_client_close(app);
    pgjobq_client_close(wrk);
    pgjobq_client_close(adm);
}

TEST(roles_hostile_search_path_changes_nothing)
{
    PGconn *pg = t_pg();
    pgjobq_job *jobs;
    size_t n;
    int64_t id;

    roles_setup();
    /* A schema full of look-alikes, first on the producer's search_path. */
    PQclear(t_exec(pg, "CREATE SCHEMA IF NOT EXISTS evil"));
    PQclear(t_exec(pg, "GRANT USAGE, CREATE ON SCHEMA evil TO PUBLIC"));
    PQclear(t_exec(pg, "CREATE OR REPLACE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql"
                       " AS $$ SELECT '2000-01-01'::timestamptz $$"));
    PQclear(t_exec(pg, "CREATE OR REPLACE FUNCTION evil.pg_notify(text, text) RETURNS void LANGUAGE sql"
                       " AS $$ SELECT NULL::void $$"));
    PQclear(t_exec(pg, "CREATE OR REPLACE FUNCTION evil.nextval(regclass) RETURNS bigint LANGUAGE sql AS $$ SELECT 1::bigint $$"));
    PQclear(t_exec(pg, "CREATE TABLE IF NOT EXISTS evil.jobs (id int)"));
    pgjobq_client *app = as_role("app"), *wrk = as_role("wrk");
    PQclear(t_exec(pgjobq_client_conn(app), "SET search_path = evil, pg_catalog, pgjobq"));
    PQclear(t_exec(pgjobq_client_conn(wrk), "SET search_path = evil, pg_catalog, pgjobq"));
    CHECK_OK(app, pgjobq_enqueue(app, "{}", NULL, &id));
    CHECK_OK(app, pgjobq_enqueue(app, "{}", NULL, &id));
    CHECK_OK(wrk, pgjobq_claim(wrk, "default", 10, 30000, "wrk", &jobs, &n));
    CHECK_INT(n, 2);
    CHECK_OK(wrk, pgjobq_job_complete(wrk, jobs[1].id, jobs[1].lease_token, NULL));
    pgjobq_jobs_free(jobs);
    /* The real clock and sequence were used, and the look-alike table is untouched. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE created_at > '2020-01-01'"), 2);
    CHECK_INT(t_int(pg, "SELECT count(DISTINCT id) FROM pgjobq.all_jobs"), 2);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM evil.jobs"), 0);
    pgjobq_client_close(app);
    pgjobq_client_close(wrk);
    PQfinish(pg);
}

TEST_FULL(roles_migrations_run_as_a_non_superuser_owner, 60, TEST_DB_EMPTY)
{
    PGconn *pg = t_pg();
    char ci[1024];
    pgjobq_client *c = NULL;

    PQclear(t_exec(pg, "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'jobs_owner') THEN"
                       " CREATE ROLE jobs_owner LOGIN CREATEROLE; END IF; END $$"));
    PQclear(t_exec(pg, "GRANT CREATE ON DATABASE %s TO jobs_owner", t_dbname()));
    snprintf(ci, sizeof ci, "%s user=jobs_owner", t_conninfo());
    CHECK_RC(c, pgjobq_client_open(&c, ci), PGJOBQ_ESCHEMA);
    CHECK_OK(c, pgjobq_migrate(c, NULL));
    CHECK_OK(c, pgjobq_migrate_roles(c));
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, NULL));
    pgjobq_client_close(c);
    CHECK_INT(t_int(pg, "SELECT rolsuper::int FROM pg_roles WHERE rolname = 'jobs_owner'"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                        " WHERE n.nspname = 'pgjobq' AND pg_get_userbyid(p.proowner) <> 'jobs_owner'"),
              0);
    /* Every table (history partitions included) belongs to the owner, none to the superuser. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_tables WHERE schemaname = 'pgjobq' AND tableowner <> 'jobs_owner'"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_tables WHERE schemaname = 'pgjobq' AND tableowner = 'jobs_owner'"
                        " AND tablename IN ('jobs', 'history', 'history_failed', 'history_done')"),
              4);
    PQfinish(pg);
}

static long long fn_calls(PGconn *pg, const char *fn)
{
    return t_int(pg, "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE schemaname = 'pgjobq'"
                     " AND funcname = '%s'",
                 fn);
}

typedef struct fn_wait {
    PGconn *pg;
    const char *fn;
    long long at_least;
} fn_wait;

static int fn_called(void *arg)
{
    fn_wait *f = arg;
    return fn_calls(f->pg, f->fn) >= f->at_least;
}

/* A producer without INSERT on the table enqueues large batches through pgjobq.enqueue_many(); one
 * granted INSERT gets COPY.  Both get every job and its id. */
TEST(roles_a_producer_enqueues_batches_with_copy_only_when_granted_insert)
{
    enum { N = 600 };
    PGconn *pg = t_pg();
    pgjobq_job_spec *specs = calloc(N, sizeof *specs);
    int64_t *ids = calloc(N, sizeof *ids);

    CHECK(specs && ids);
    roles_setup();
    PQclear(t_exec(pg, "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'bulk') THEN"
                       " CREATE ROLE bulk LOGIN; END IF; END $$"));
    PQclear(t_exec(pg, "GRANT pgjobq_producer TO bulk"));
    PQclear(t_exec(pg, "GRANT INSERT (id, queue, kind, payload, priority, run_at, max_attempts) ON pgjobq.jobs TO bulk"));
    PQclear(t_exec(pg, "ALTER DATABASE %s SET track_functions = 'all'", t_dbname()));
    pgjobq_client *app = as_role("app"), *bulk = as_role("bulk");

    CHECK_OK(app, pgjobq_enqueue_many(app, specs, N, ids, NULL));
    CHECK(ids[N - 1] > ids[0]);
    pgjobq_client_close(app); /* its statistics reach the server when it leaves */
    fn_wait w = {pg, "enqueue_many", 1};
    CHECK_MSG(t_wait_until(fn_called, &w, 10000), "the producer did not use pgjobq.enqueue_many()");
    CHECK_INT(fn_calls(pg, "reserve_ids"), 0);

    /* The COPY path records its levels (levels_add, which takes those that have its queued jobs). */
    for (int i = 0; i < N; i++) {
        specs[i].opts.queue = i % 2 ? "bulk-odd" : "bulk-even";
        specs[i].opts.priority = i % 3;
    }
    CHECK_OK(bulk, pgjobq_enqueue_many(bulk, specs, N, ids, NULL));
    CHECK(ids[N - 1] > ids[0]);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue LIKE 'bulk-%%'"), 6);
    pgjobq_client_close(bulk);
    w.fn = "reserve_ids";
    CHECK_MSG(t_wait_until(fn_called, &w, 10000), "the producer granted INSERT did not use COPY");
    CHECK_INT(fn_calls(pg, "enqueue_many"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs"), 2 * N);
    CHECK_INT(t_int(pg, "SELECT count(DISTINCT id) FROM pgjobq.jobs"), 2 * N);
    PQclear(t_exec(pg, "REVOKE INSERT (id, queue, kind, payload, priority, run_at, max_attempts) ON pgjobq.jobs"
                       " FROM bulk"));
    free(ids);
    free(specs);
    PQfinish(pg);
}

TEST(roles_monitor_reads_everything_serve_needs_and_changes_nothing)
{
    PGconn *pg = t_pg();
    pgjobq_client *owner = t_client();
    pgjobq_stat *stats = NULL;
    pgjobq_queue_info *queues = NULL;
    size_t n = 0;
    int64_t id = 0;

    roles_setup();
    PQclear(t_exec(pg, "DO $$ BEGIN"
                       " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mon') THEN CREATE ROLE mon LOGIN; END IF;"
                       " END $$"));
    PQclear(t_exec(pg, "GRANT pgjobq_monitor TO mon"));
    CHECK_OK(owner, pgjobq_enqueue(owner, "{}", NULL, &id));
    pgjobq_client *mon = as_role("mon");

    /* What serve reads. */
    CHECK_STR(raw_as(mon, "SELECT count(*) FROM pgjobq.jobs"), "");
    CHECK_STR(raw_as(mon, "SELECT count(*) FROM pgjobq.history"), "");
    CHECK_STR(raw_as(mon, "SELECT count(*) FROM pgjobq.all_jobs"), "");
    CHECK_STR(raw_as(mon, "SELECT count(*) FROM pgjobq.workers"), "");
    CHECK_STR(raw_as(mon, "SELECT count(*) FROM pgjobq.tallies"), "");
    CHECK_STR(raw_as(mon, "SELECT * FROM pgjobq.schedule_list()"), "");
    CHECK_OK(mon, pgjobq_queue_list(mon, &queues, &n));
    pgjobq_queue_list_free(queues);
    CHECK_OK(mon, pgjobq_stats(mon, &stats, &n));
    pgjobq_stats_free(stats);
    /* What an autoscaler reads (docs/deploy.md: the KEDA trigger's role). */
    pgjobq_queue_ready_info *ready = NULL;
    CHECK_OK(mon, pgjobq_queue_ready(mon, &ready, &n));
    pgjobq_queue_ready_free(ready);
    CHECK_STR(raw_as(mon, "SELECT ready FROM pgjobq.queue_ready('default')"), "");
    CHECK_STR(raw_as(mon, "SELECT * FROM pgjobq.monitor_dead_letters(1)"), "");
    CHECK_STR(raw_as(mon, "SELECT count(*) FROM pgjobq.dead_letters"), "");
    /* pgjobq.health() names another role's session that holds a snapshot, with its application. */
    PGconn *pin = t_pg();
    pgjobq_health h;
    PQclear(t_exec(pin, "SET application_name = 'report'"));
    PQclear(t_exec(pin, "BEGIN ISOLATION LEVEL REPEATABLE READ"));
    PQclear(t_exec(pin, "SELECT 1"));
    CHECK_OK(mon, pgjobq_health_get(mon, &h));
    CHECK_STR(h.holder_kind, "session");
    CHECK_INT(h.holder_pid, PQbackendPID(pin));
    CHECK_STR(h.holder_application, "report");
    PQfinish(pin);

    /* Nothing it could change. */
    CHECK_RC(mon, pgjobq_enqueue(mon, "{}", NULL, NULL), PGJOBQ_EPERM);
    CHECK_RC(mon, pgjobq_job_cancel(mon, id, NULL), PGJOBQ_EPERM);
    CHECK_RC(mon, pgjobq_job_retry(mon, id), PGJOBQ_EPERM);
    CHECK_RC(mon, pgjobq_job_retry_running(mon, id, NULL), PGJOBQ_EPERM);
    CHECK_RC(mon, pgjobq_queue_pause(mon, "default", NULL), PGJOBQ_EPERM);
    CHECK_STR(raw_as(mon, "DELETE FROM pgjobq.jobs"), "42501");
    CHECK_STR(raw_as(mon, "UPDATE pgjobq.workers SET host = 'x'"), "42501");
    CHECK_STR(raw_as(mon, "SELECT pgjobq.worker_beat('w', 'h', 1, 'v', 'q')"), "42501");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued'", (long long)id), 1);
    pgjobq_client_close(mon);
    pgjobq_client_close(owner);
    PQfinish(pg);
}

/* The producer reaches priority levels only through what it enqueues (issue 36, point 4): levels_add
 * with a name that is no queue name, or for a level without a queued job, is refused, and creates no
 * level and no sequence; the functions that record and reclaim levels are no role's. */
TEST(roles_a_producer_makes_levels_only_through_what_it_enqueues)
{
    PGconn *pg = t_pg();

    roles_setup();
    pgjobq_client *app = as_role("app"), *wrk = as_role("wrk");
    long long levels = t_int(pg, "SELECT count(*) FROM pgjobq.levels");
    long long sequences = t_int(pg, "SELECT count(*) FROM pg_class WHERE relkind = 'S'");
    CHECK_STR(raw_as(app, "SELECT pgjobq.levels_add(ARRAY[E'bad\\nname'], ARRAY[0::smallint])"), "22023");
    CHECK_STR(raw_as(app, "SELECT pgjobq.levels_add(ARRAY[repeat('x', 2000)], ARRAY[0::smallint])"), "22023");
    CHECK_STR(raw_as(app, "SELECT pgjobq.levels_add(ARRAY['fresh'], ARRAY[5::smallint])"), "22023");
    CHECK_STR(raw_as(app, "SELECT pgjobq.levels_add(array_agg('q' || g), NULL) FROM generate_series(1, 1000) g"),
              "22023");
    CHECK_STR(raw_as(app, "SELECT pgjobq.levels_record(ARRAY['fresh'], ARRAY[5::smallint])"), "42501");
    CHECK_STR(raw_as(app, "SELECT pgjobq.levels_reclaim('0 s')"), "42501");
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.levels_reclaim('0 s')"), "42501");
    CHECK_STR(raw_as(app, "INSERT INTO pgjobq.levels (queue, priority) VALUES ('fresh', 5)"), "42501");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels"), levels);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_class WHERE relkind = 'S'"), sequences);
    /* What it enqueues gets its level, as before. */
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    o.queue = "fresh";
    o.priority = 5;
    CHECK_OK(app, pgjobq_enqueue(app, "{}", &o, NULL));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue = 'fresh' AND priority = 5"), 1);
    CHECK_STR(raw_as(app, "SELECT pgjobq.levels_add(ARRAY['fresh'], ARRAY[5::smallint])"), "");
    /* A name that is no queue name cannot be a level's at all. */
    PGresult *r = PQexec(pg, "INSERT INTO pgjobq.levels (queue, priority) VALUES (E'bad\\nname', 0)");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "23514");
    PQclear(r);
    pgjobq_client_close(app);
    pgjobq_client_close(wrk);
    PQfinish(pg);
}

/* pgjobq.health() as the monitor: another role's session that holds a snapshot is named (pid, role,
 * application, state, age), but its query is not shown, as pg_stat_activity does not show it to
 * that role; a superuser sees it.  SQL, the C API and `pgjobq health` (issue 36, point 2: the query
 * text of any session reached the monitor and worker roles through the SECURITY DEFINER function). */
TEST(roles_health_shows_another_roles_query_only_to_who_may_see_it)
{
    PGconn *pg = t_pg();
    pgjobq_client *owner = t_client();
    pgjobq_health h;
    char ci[1024], *out, *err;

    roles_setup();
    PQclear(t_exec(
        pg, "DO $$ BEGIN"
            " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mon') THEN CREATE ROLE mon LOGIN; END IF;"
            " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'clerk') THEN CREATE ROLE clerk LOGIN; END IF;"
            " END $$"));
    PQclear(t_exec(pg, "GRANT pgjobq_monitor TO mon"));
    snprintf(ci, sizeof ci, "%s user=clerk application_name=billing", t_conninfo());
    PGconn *clerk = PQconnectdb(ci);
    CHECK_MSG(PQstatus(clerk) == CONNECTION_OK, "connect as clerk: %s", PQerrorMessage(clerk));
    PQclear(t_exec(clerk, "BEGIN ISOLATION LEVEL REPEATABLE READ"));
    PQclear(t_exec(clerk, "SELECT 'ssn=078-05-1120 card=4111111111111111'"));

    pgjobq_client *mon = as_role("mon");
    CHECK_OK(mon, pgjobq_health_get(mon, &h));
    CHECK_STR(h.holder_kind, "session");
    CHECK_INT(h.holder_pid, PQbackendPID(clerk));
    CHECK_STR(h.holder_role, "clerk");
    CHECK_STR(h.holder_application, "billing");
    CHECK_STR(h.holder_state, "idle in transaction");
    CHECK(h.horizon_age_ms >= 0 && h.holder_since != PGJOBQ_TIME_NONE);
    CHECK_MSG(h.holder_query[0] == '\0', "the monitor read another role's query: %s", h.holder_query);
    /* In SQL, and through what health() reads as the owner: no query anywhere. */
    PGresult *r = PQexec(pgjobq_client_conn(mon), "SELECT holder_query IS NULL, holder_role FROM pgjobq.health()");
    CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK, "%s", PQerrorMessage(pgjobq_client_conn(mon)));
    CHECK_STR(PQgetvalue(r, 0, 0), "t");
    CHECK_STR(PQgetvalue(r, 0, 1), "clerk");
    PQclear(r);
    r = PQexec(pgjobq_client_conn(mon), "SELECT f::text FROM pgjobq.health_facts() f");
    CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK, "%s", PQerrorMessage(pgjobq_client_conn(mon)));
    CHECK_MSG(strstr(PQgetvalue(r, 0, 0), "ssn=") == NULL, "health_facts: %s", PQgetvalue(r, 0, 0));
    PQclear(r);
    /* `pgjobq health` as the monitor. */
    snprintf(ci, sizeof ci, "%s user=mon", t_conninfo());
    CHECK_INT(t_cli(&out, &err, NULL, 0, "--db", ci, "health", NULL), 0);
    CHECK_MSG(strstr(out, "ssn=") == NULL && strstr(out, "of role clerk \"billing\" (idle in transaction)") != NULL &&
                  strstr(out, "query        not shown") != NULL,
              "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "--db", ci, "health", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "ssn=") == NULL && strstr(out, "\"role\":\"clerk\"") != NULL &&
                  strstr(out, "\"query\":null") != NULL,
              "%s", out);
    free(out);
    free(err);

    /* A superuser may see every query in pg_stat_activity, and so here. */
    CHECK_OK(owner, pgjobq_health_get(owner, &h));
    CHECK_INT(h.holder_pid, PQbackendPID(clerk));
    CHECK_MSG(strstr(h.holder_query, "ssn=078-05-1120") != NULL, "query: %s", h.holder_query);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "health", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "ssn=078-05-1120") != NULL, "%s", out);
    free(out);
    free(err);
    /* And a role that may see the holder's session (a member of its role) as well. */
    PQclear(t_exec(pg, "GRANT clerk TO mon"));
    CHECK_OK(mon, pgjobq_health_get(mon, &h));
    CHECK_MSG(strstr(h.holder_query, "ssn=078-05-1120") != NULL, "query: %s", h.holder_query);
    PQclear(t_exec(pg, "REVOKE clerk FROM mon"));

    PQfinish(clerk);
    pgjobq_client_close(mon);
    pgjobq_client_close(owner);
    PQfinish(pg);
}

/* The functions a role may run whose result has a lease token (a column named like one, or whole job
 * rows), sorted, comma-separated (malloc'd). */
static char *token_functions(PGconn *pg, const char *role)
{
    return t_str(pg,
                 "SELECT coalesce(string_agg(p.proname, ',' ORDER BY p.proname), '') FROM pg_proc p"
                 " WHERE p.pronamespace = 'pgjobq'::regnamespace AND has_function_privilege('%s', p.oid, 'EXECUTE')"
                 "   AND (p.prorettype IN ('pgjobq.jobs'::regtype, 'pgjobq.history'::regtype,"
                 "                         'pgjobq.all_jobs'::regtype)"
                 "        OR EXISTS (SELECT 1 FROM unnest(p.proargnames, p.proargmodes) AS a(n, m)"
                 "                    WHERE a.m IN ('o', 'b', 't') AND a.n LIKE '%%token%%'))",
                 role);
}

/* The lease token is the holder's secret (issue 23, item 9): the monitor and the admin read every
 * column of the jobs but that one; no function another role may run returns one, but the claims to
 * their claimer; so another worker cannot learn it, nor make it from when the job was claimed, and
 * cannot complete the job. */
TEST(roles_no_role_reads_a_lease_token_and_no_worker_completes_another_workers_job)
{
    PGconn *pg = t_pg();
    pgjobq_client *owner = t_client();
    pgjobq_job *jobs = NULL, *seen = NULL;
    size_t n = 0;
    int64_t id = 0;

    roles_setup();
    PQclear(t_exec(pg,
                   "DO $$ BEGIN"
                   " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mon') THEN CREATE ROLE mon LOGIN; END IF;"
                   " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'wrk2') THEN CREATE ROLE wrk2 LOGIN; END IF;"
                   " END $$"));
    PQclear(t_exec(pg, "GRANT pgjobq_monitor TO mon"));
    PQclear(t_exec(pg, "GRANT pgjobq_worker TO wrk2"));
    CHECK_OK(owner, pgjobq_enqueue(owner, "{\"n\": 1}", NULL, &id));
    CHECK_OK(owner, pgjobq_enqueue(owner, "{\"n\": 2}", NULL, NULL));
    pgjobq_client *wrk = as_role("wrk"), *wrk2 = as_role("wrk2"), *mon = as_role("mon"), *adm = as_role("adm");

    long long before = t_int(pg, "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint");
    CHECK_OK(wrk, pgjobq_claim(wrk, "default", 1, 60000, "wrk", &jobs, &n));
    long long after = t_int(pg, "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint");
    CHECK_INT(n, 1);
    CHECK_INT(jobs[0].id, id);
    /* A finished job keeps its token in the history: hidden there too. */
    pgjobq_job *other = NULL;
    CHECK_OK(wrk2, pgjobq_claim(wrk2, "default", 1, 60000, "wrk2", &other, &n));
    CHECK_OK(wrk2, pgjobq_job_complete(wrk2, other[0].id, other[0].lease_token, NULL));

    /* Reading: every column but the token. */
    pgjobq_client *readers[] = {mon, adm};
    for (int k = 0; k < 2; k++) {
        pgjobq_client *r = readers[k];
        CHECK_STR(raw_as(r, "SELECT lease_token FROM pgjobq.jobs"), "42501");
        CHECK_STR(raw_as(r, "SELECT lease_token FROM pgjobq.history"), "42501");
        CHECK_STR(raw_as(r, "SELECT lease_token FROM pgjobq.all_jobs"), "42501");
        CHECK_STR(raw_as(r, "SELECT * FROM pgjobq.all_jobs"), "42501");
        CHECK_STR(raw_as(r, "SELECT max(lease_token) FROM pgjobq.history_failed"), "42501");
        CHECK_STR(raw_as(r, "SELECT id, state, worker_id, lease_until, result FROM pgjobq.all_jobs"), "");
        CHECK_STR(raw_as(r, "SELECT count(*) FROM pgjobq.jobs"), "");
        /* What the library reads for `pgjobq show` and `list`: everything but the token. */
        CHECK_OK(r, pgjobq_job_get(r, id, &seen));
        CHECK_INT(seen[0].state, PGJOBQ_RUNNING);
        CHECK_STR(seen[0].worker_id, "wrk");
        CHECK_INT(seen[0].lease_token, 0);
        pgjobq_jobs_free(seen);
        pgjobq_list_opts lo = PGJOBQ_LIST_OPTS_INIT;
        CHECK_OK(r, pgjobq_job_list(r, &lo, &seen, &n));
        CHECK_INT(n, 2);
        CHECK_INT(seen[0].lease_token + seen[1].lease_token, 0);
        pgjobq_jobs_free(seen);
    }
    CHECK_STR(raw_as(wrk2, "SELECT lease_token FROM pgjobq.jobs"), "42501");
    /* Functions: only the claims return a token (to their claimer). */
    char *f = token_functions(pg, "pgjobq_monitor");
    CHECK_STR(f, "");
    free(f);
    f = token_functions(pg, "pgjobq_producer");
    CHECK_STR(f, "");
    free(f);
    f = token_functions(pg, "pgjobq_worker");
    CHECK_STR(f, "claim,claim_batch,claim_next");
    free(f);
    f = token_functions(pg, "pgjobq_admin");
    CHECK_STR(f, "claim,claim_batch,claim_next");
    free(f);

    /* The other worker tries every microsecond around the claim (and a millisecond either side) in one
     * statement: nothing is written. */
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT * FROM pgjobq.complete_many(ARRAY(SELECT %lld::bigint FROM generate_series(%lld::bigint - 1000,"
             " %lld::bigint + 1000)), ARRAY(SELECT generate_series(%lld::bigint - 1000, %lld::bigint + 1000)))",
             (long long)id, before, after, before, after);
    PGresult *r = PQexec(pgjobq_client_conn(wrk2), sql);
    CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK, "complete_many as wrk2: %s",
              PQerrorMessage(pgjobq_client_conn(wrk2)));
    for (int i = 0; i < PQntuples(r); i++)
        CHECK_STR(PQgetvalue(r, i, 1), "lost");
    PQclear(r);
    CHECK_RC(wrk2, pgjobq_job_complete(wrk2, id, 0, "{\"forged\": true}"), PGJOBQ_ELEASE);
    CHECK_RC(wrk2, pgjobq_job_fail(wrk2, id, 1, "forged", 0, PGJOBQ_FAIL_PERMANENT, NULL), PGJOBQ_ELEASE);
    CHECK_RC(wrk2, pgjobq_job_progress(wrk2, id, 1, "{\"forged\": true}"), PGJOBQ_ELEASE);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'running' AND progress IS NULL",
                    (long long)id),
              1);
    /* The holder completes it. */
    CHECK_OK(wrk, pgjobq_job_complete(wrk, id, jobs[0].lease_token, "{\"by\": \"wrk\"}"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND result = '{\"by\": \"wrk\"}'",
                    (long long)id),
              1);
    pgjobq_jobs_free(jobs);
    pgjobq_jobs_free(other);
    pgjobq_client_close(wrk);
    pgjobq_client_close(wrk2);
    pgjobq_client_close(mon);
    pgjobq_client_close(adm);
    pgjobq_client_close(owner);
    PQfinish(pg);
}

/* ---------------------------------------------------------------------------------------------- */
/* Retention, and worker processes under the worker role                                           */

/* A worker process run on a thread of the test, as a login role, its log kept. */
typedef struct role_worker {
    pgjobq_worker *w;
    pthread_t th;
    int rc;
    pthread_mutex_t mu;
    char log[32768];
    size_t len;
} role_worker;

static void role_worker_log(void *arg, pgjobq_log_level level, const char *line)
{
    role_worker *rw = arg;
    pthread_mutex_lock(&rw->mu);
    int k = snprintf(rw->log + rw->len, sizeof rw->log - rw->len, "%s: %s\n", pgjobq_log_level_name(level), line);
    if (k > 0 && rw->len + (size_t)k < sizeof rw->log)
        rw->len += (size_t)k;
    pthread_mutex_unlock(&rw->mu);
}

static int role_worker_logged(role_worker *rw, const char *what)
{
    pthread_mutex_lock(&rw->mu);
    int found = strstr(rw->log, what) != NULL;
    pthread_mutex_unlock(&rw->mu);
    return found;
}

static pgjobq_outcome role_worker_job(pgjobq_ctx *ctx, void *arg)
{
    (void)ctx;
    (void)arg;
    return PGJOBQ_OUTCOME_COMPLETE;
}

static void *role_worker_main(void *arg)
{
    role_worker *rw = arg;
    rw->rc = pgjobq_worker_run(rw->w);
    return NULL;
}

/* Starts a worker on queue "rq" as role, with its options (the log goes to rw). */
static void role_worker_start(role_worker *rw, const char *role, pgjobq_worker_opts o)
{
    char ci[1024];

    memset(rw, 0, sizeof *rw);
    pthread_mutex_init(&rw->mu, NULL);
    snprintf(ci, sizeof ci, "%s user=%s", t_conninfo(), role);
    o.log_fn = role_worker_log;
    o.log_arg = rw;
    CHECK_RC(NULL, pgjobq_worker_new(&rw->w, ci, &o), PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(rw->w, "rq", NULL, 1, role_worker_job, NULL) == PGJOBQ_OK);
    CHECK(pthread_create(&rw->th, NULL, role_worker_main, rw) == 0);
}

/* Stops it and returns what pgjobq_worker_run returned. */
static int role_worker_stop(role_worker *rw)
{
    pgjobq_worker_stop(rw->w);
    CHECK(pthread_join(rw->th, NULL) == 0);
    pgjobq_worker_free(rw->w);
    rw->w = NULL;
    pthread_mutex_destroy(&rw->mu);
    return rw->rc;
}

typedef struct log_wait {
    role_worker *rw;
    const char *what;
} log_wait;

static int log_seen(void *arg)
{
    log_wait *l = arg;
    return role_worker_logged(l->rw, l->what);
}

/* Waits for a query to count something. */
typedef struct row_wait {
    PGconn *pg;
    const char *sql;
} row_wait;

static int row_there(void *arg)
{
    row_wait *r = arg;
    return t_int(r->pg, "%s", r->sql) > 0;
}

/* Finished jobs in the history, as the owner writes them: payload {"age": AGE}, finished AGE ago. */
static void history_add(PGconn *pg, const char *st, const char *age)
{
    PQclear(t_exec(
        pg,
        "INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts,"
        " run_at, created_at, finished_at, lease_token)"
        " SELECT nextval(pg_get_serial_sequence('pgjobq.jobs', 'id')), 'rq', 'k', jsonb_build_object('age', '%s'),"
        " 0, '%s', 1, 1, now() - interval '%s', now() - interval '%s', now() - interval '%s', 1",
        age, st, age, age, age));
}

static long long history_count(PGconn *pg)
{
    return t_int(pg, "SELECT count(*) FROM pgjobq.history");
}

/* prune below the configured retention (pgjobq.retention) needs pgjobq_admin: a worker role cannot erase
 * the history (issue 23, item 11); the configured retention, or a longer one, it may keep. */
TEST(roles_a_worker_cannot_prune_below_the_configured_retention_and_an_admin_can)
{
    PGconn *pg = t_pg();
    int removed = -1;

    roles_setup();
    PQclear(t_exec(pg,
                   "DO $$ BEGIN"
                   " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mon') THEN CREATE ROLE mon LOGIN; END IF;"
                   " END $$"));
    PQclear(t_exec(pg, "GRANT pgjobq_monitor TO mon"));
    history_add(pg, "completed", "2 hours");
    history_add(pg, "failed", "2 days");
    pgjobq_client *wrk = as_role("wrk"), *adm = as_role("adm"), *mon = as_role("mon");

    CHECK_STR(raw_as(wrk, "SELECT pgjobq.prune('0 s', '0 s', 1000)"), "42501");
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.prune('0 s')"), "42501");
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.prune(NULL, '1 day')"), "42501");
    CHECK_RC(wrk, pgjobq_prune(wrk, 0, 0, 1000, &removed), PGJOBQ_EPERM);
    CHECK_MSG(strstr(pgjobq_errmsg(wrk), "shorter than the configured retention") != NULL, "%s", pgjobq_errmsg(wrk));
    CHECK_INT(history_count(pg), 2);
    /* The configured retention, or longer: a worker may. */
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.prune()"), "");
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.prune('24 hours', '7 days', 1000)"), "");
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.prune('48 hours', '30 days', 1000)"), "");
    CHECK_INT(history_count(pg), 2);
    /* Only the admin sets it; the monitor reads it. */
    CHECK_STR(raw_as(wrk, "SELECT * FROM pgjobq.retention_set('1 second', '1 second')"), "42501");
    CHECK_STR(raw_as(mon, "SELECT * FROM pgjobq.retention_set('1 second', '1 second')"), "42501");
    CHECK_STR(raw_as(mon, "SELECT completed, failed FROM pgjobq.retention"), "");
    CHECK_STR(raw_as(wrk, "UPDATE pgjobq.retention SET completed = '0 s'"), "42501");
    CHECK_STR(raw_as(adm, "SELECT * FROM pgjobq.retention_set('1 hour', '1 day')"), "");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.retention WHERE completed = '1 hour' AND failed = '1 day'"), 1);
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.prune('59 minutes', '1 day', 1000)"), "42501");
    CHECK_INT(history_count(pg), 2);
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.prune()"), ""); /* now both are past it */
    CHECK_INT(history_count(pg), 0);
    /* The admin prunes below it.  (A completed job goes with its hour's partition, once the hour is
     * over: one of the current hour would stay until then.) */
    history_add(pg, "completed", "61 minutes");
    history_add(pg, "failed", "2 minutes");
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.prune('0 s', '0 s', 1000)"), "42501");
    CHECK_INT(history_count(pg), 2);
    CHECK_OK(adm, pgjobq_prune(adm, 0, 0, 1000, &removed));
    CHECK_INT(history_count(pg), 0);
    pgjobq_client_close(wrk);
    pgjobq_client_close(adm);
    pgjobq_client_close(mon);
    PQfinish(pg);
}

/* A worker process under the worker role prunes with the database's retention when it is given none,
 * and says in its log why a retention shorter than that is refused. */
TEST_FULL(roles_a_worker_process_prunes_with_the_configured_retention, 90, 0)
{
    PGconn *pg = t_pg();
    pgjobq_client *adm;
    role_worker rw;

    roles_setup();
    adm = as_role("adm");
    CHECK_STR(raw_as(adm, "SELECT * FROM pgjobq.retention_set('1 hour', '1 day')"), "");
    history_add(pg, "completed", "3 hours");
    history_add(pg, "failed", "2 days");
    history_add(pg, "completed", "10 minutes");
    history_add(pg, "failed", "10 minutes");

    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    o.worker_id = "pruner";
    role_worker_start(&rw, "wrk", o);
    row_wait pruned = {pg, "SELECT (count(*) = 2)::int FROM pgjobq.history"};
    CHECK_MSG(t_wait_until(row_there, &pruned, 30000), "no prune; the worker's log:\n%s", rw.log);
    /* The rows go at the prune's commit; its log line once the worker has read the answer. */
    log_wait said = {&rw, "pruned"};
    CHECK_MSG(t_wait_until(log_seen, &said, 30000), "the prune was not logged:\n%s", rw.log);
    CHECK_INT(role_worker_stop(&rw), PGJOBQ_OK);
    CHECK_MSG(strstr(rw.log, "failed") == NULL, "%s", rw.log);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE payload->>'age' = '10 minutes'"), 2);

    /* Shorter than the database's: refused, and said. */
    o.retain_completed_ms = 60000;
    o.retain_failed_ms = 60000;
    role_worker_start(&rw, "wrk", o);
    log_wait lw = {&rw, "shorter than the configured retention"};
    CHECK_MSG(t_wait_until(log_seen, &lw, 30000), "no refusal in the worker's log:\n%s", rw.log);
    CHECK_INT(role_worker_stop(&rw), PGJOBQ_OK);
    CHECK_INT(history_count(pg), 2);
    pgjobq_client_close(adm);
    PQfinish(pg);
}

/* ---------------------------------------------------------------------------------------------- */
/* The registry of workers                                                                          */

static long long worker_rows(PGconn *pg, const char *id, const char *host)
{
    return t_int(pg, "SELECT count(*) FROM pgjobq.workers WHERE id = '%s' AND host = '%s'", id, host);
}

/* A row of pgjobq.workers is its worker's (the secret it beats with): another worker role can neither
 * overwrite nor delete it while it is live, whatever signature it calls; a stale row is taken over; the
 * admin may remove any (issue 23, item 11). */
TEST(roles_a_worker_cannot_beat_over_or_remove_another_live_workers_row)
{
    PGconn *pg = t_pg();

    roles_setup();
    PQclear(t_exec(pg,
                   "DO $$ BEGIN"
                   " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'wrk2') THEN CREATE ROLE wrk2 LOGIN; END IF;"
                   " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mon') THEN CREATE ROLE mon LOGIN; END IF;"
                   " END $$"));
    PQclear(t_exec(pg, "GRANT pgjobq_worker TO wrk2"));
    PQclear(t_exec(pg, "GRANT pgjobq_monitor TO mon"));
    pgjobq_client *wrk = as_role("wrk"), *wrk2 = as_role("wrk2"), *adm = as_role("adm"), *mon = as_role("mon");

    CHECK_STR(raw_as(wrk, "SELECT pgjobq.worker_beat('a', 'h1', 1, 'v', 'q:1', 111)"), "");
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.worker_beat('a', 'h1', 1, 'v', 'q:1', 111)"), ""); /* its own again */
    CHECK_INT(worker_rows(pg, "a", "h1"), 1);
    /* Another secret, or none (the signatures of schema 10): refused while the row is live. */
    PGresult *r = PQexec(pgjobq_client_conn(wrk2), "SELECT pgjobq.worker_beat('a', 'h2', 2, 'v', 'q:1', 222)");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "55006");
    CHECK_MSG(strstr(PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY), "worker id a is in use by a live worker") != NULL,
              "%s", PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY));
    PQclear(r);
    CHECK_STR(raw_as(wrk2, "SELECT pgjobq.worker_beat('a', 'h2', 2, 'v', 'q:1')"), "55006");
    CHECK_STR(raw_as(wrk2, "SELECT pgjobq.worker_gone('a', 222)"), "42501");
    CHECK_STR(raw_as(wrk2, "SELECT pgjobq.worker_gone('a')"), "42501");
    CHECK_STR(raw_as(wrk2, "SELECT pgjobq.worker_gone('a', NULL)"), "42501");
    CHECK_STR(raw_as(wrk2, "UPDATE pgjobq.workers SET host = 'h2'"), "42501");
    CHECK_INT(worker_rows(pg, "a", "h1"), 1);
    /* Nobody reads the secret's hash; the rest, the admin and the monitor do. */
    CHECK_STR(raw_as(mon, "SELECT secret_hash FROM pgjobq.workers"), "42501");
    CHECK_STR(raw_as(adm, "SELECT secret_hash FROM pgjobq.workers"), "42501");
    CHECK_STR(raw_as(mon, "SELECT id, host, pid, version, queues, started_at, last_seen FROM pgjobq.workers"), "");
    CHECK_INT(t_int(pg, "SELECT (secret_hash = sha256(int8send(111)))::int FROM pgjobq.workers WHERE id = 'a'"), 1);
    /* Its own goodbye marks it stopped (no longer alive: schema 19); an unknown id is no error. */
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.worker_gone('a', 111)"), "");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.workers WHERE id = 'a' AND stopped_at IS NULL"), 0);
    CHECK_STR(raw_as(mon, "SELECT 1 FROM pgjobq.monitor_workers() WHERE id = 'a' AND state = 'stopped'"), "");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.monitor_workers() WHERE id = 'a' AND state = 'stopped'"), 1);
    CHECK_STR(raw_as(wrk2, "SELECT pgjobq.worker_gone('a', 222)"), "");

    /* A row unseen for three beats (15 s) is taken over, and its old owner is refused. */
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.worker_beat('b', 'h1', 1, 'v', 'q:1', 111)"), "");
    PQclear(t_exec(pg, "UPDATE pgjobq.workers SET last_seen = now() - interval '16 seconds' WHERE id = 'b'"));
    CHECK_STR(raw_as(wrk2, "SELECT pgjobq.worker_beat('b', 'h2', 2, 'v', 'q:1', 222)"), "");
    CHECK_INT(worker_rows(pg, "b", "h2"), 1);
    CHECK_INT(t_int(pg, "SELECT (started_at > now() - interval '5 s')::int FROM pgjobq.workers WHERE id = 'b'"), 1);
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.worker_beat('b', 'h1', 1, 'v', 'q:1', 111)"), "55006");
    /* A stale row may be removed by anyone who may beat. */
    PQclear(t_exec(pg, "UPDATE pgjobq.workers SET last_seen = now() - interval '16 seconds' WHERE id = 'b'"));
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.worker_gone('b', 111)"), "");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.workers WHERE id = 'b' AND stopped_at IS NULL"), 0);

    /* The admin removes a live row (it cannot beat over it: the duplicate would be the same mistake). */
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.worker_beat('c', 'h1', 1, 'v', 'q:1', 111)"), "");
    CHECK_STR(raw_as(adm, "SELECT pgjobq.worker_beat('c', 'h3', 3, 'v', 'q:1', 333)"), "55006");
    CHECK_STR(raw_as(adm, "SELECT pgjobq.worker_gone('c', NULL)"), "");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.workers WHERE id = 'c' AND stopped_at IS NULL"), 0);
    /* A stopped row is taken over at once, by any secret: a new start. */
    CHECK_STR(raw_as(wrk2, "SELECT pgjobq.worker_beat('c', 'h2', 2, 'v', 'q:1', 222)"), "");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.workers WHERE id = 'c' AND host = 'h2' AND stopped_at IS NULL"),
              1);

    /* A row of a library before schema 11 has no secret: a worker of this one takes it over. */
    CHECK_STR(raw_as(wrk2, "SELECT pgjobq.worker_beat('d', 'old', 4, 'v', 'q:1')"), "");
    CHECK_STR(raw_as(wrk2, "SELECT pgjobq.worker_beat('d', 'old', 4, 'v', 'q:1')"), "");
    CHECK_STR(raw_as(wrk, "SELECT pgjobq.worker_beat('d', 'new', 5, 'v', 'q:1', 555)"), "");
    CHECK_INT(worker_rows(pg, "d", "new"), 1);
    CHECK_STR(raw_as(wrk2, "SELECT pgjobq.worker_beat('d', 'old', 4, 'v', 'q:1')"), "55006");
    pgjobq_client_close(wrk);
    pgjobq_client_close(wrk2);
    pgjobq_client_close(adm);
    pgjobq_client_close(mon);
    PQfinish(pg);
}

/* A second worker process under an id a live one has is refused with a clear error, and claims
 * nothing; one that starts while the row of a worker that died still looks alive waits for it to go
 * stale and then takes the id over. */
TEST_FULL(roles_a_second_worker_with_the_same_id_is_refused_and_a_dead_ones_id_is_taken_over, 120, 0)
{
    PGconn *pg = t_pg();
    pgjobq_client *owner = t_client();
    role_worker a, b;
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_enqueue_opts eo = PGJOBQ_ENQUEUE_OPTS_INIT;

    roles_setup();
    eo.queue = "rq";
    o.worker_id = "dup";
    o.no_maintenance = 1;
    o.poll_ms = 100;
    role_worker_start(&a, "wrk", o);
    row_wait rw = {pg, "SELECT count(*) FROM pgjobq.workers WHERE id = 'dup'"};
    CHECK_MSG(t_wait_until(row_there, &rw, 20000), "the first worker never beat:\n%s", a.log);
    char *owner_row =
        t_str(pg, "SELECT ROW(host, pid, started_at, secret_hash)::text FROM pgjobq.workers WHERE id = 'dup'");

    /* The second one, in the same process (so the same host and pid): refused within 20 s and a bit. */
    int64_t t0 = t_now_ms();
    role_worker_start(&b, "wrk", o);
    CHECK(pthread_join(b.th, NULL) == 0);
    CHECK_MSG(b.rc == PGJOBQ_ECONFLICT, "%s: %s\n%s", pgjobq_errname(b.rc), pgjobq_worker_errmsg(b.w), b.log);
    CHECK_MSG(strstr(pgjobq_worker_errmsg(b.w), "worker id dup is in use by a live worker") != NULL, "%s",
              pgjobq_worker_errmsg(b.w));
    CHECK(t_now_ms() - t0 >= 15000);
    CHECK(strstr(b.log, "waiting up to 20 s") != NULL);
    pgjobq_worker_stats st;
    pgjobq_worker_get_stats(b.w, &st);
    CHECK_INT(st.claims, 0); /* not one claim statement */
    pgjobq_worker_free(b.w);
    pthread_mutex_destroy(&b.mu);
    char *row = t_str(pg, "SELECT ROW(host, pid, started_at, secret_hash)::text FROM pgjobq.workers WHERE id = 'dup'");
    CHECK_STR(row, owner_row);
    free(row);
    /* The first one works on, and leaves cleanly. */
    CHECK_OK(owner, pgjobq_enqueue(owner, "{}", &eo, NULL));
    row_wait done = {pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'rq' AND worker_id = 'dup'"};
    CHECK_MSG(t_wait_until(row_there, &done, 20000), "the first worker ran nothing:\n%s", a.log);
    CHECK_INT(role_worker_stop(&a), PGJOBQ_OK);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.workers WHERE id = 'dup' AND stopped_at IS NULL"), 0);
    PQclear(t_exec(pg, "DELETE FROM pgjobq.workers WHERE id = 'dup'"));

    /* A worker that died under the id 10 s ago (its row, with another secret, still looks alive): the
     * next one waits about 5 s for it to go stale, then takes the id over and works. */
    PQclear(t_exec(pg, "INSERT INTO pgjobq.workers (id, host, pid, version, queues, started_at, last_seen, secret_hash)"
                       " VALUES ('dup', 'gone', 9, 'v', 'rq:1', now() - interval '1 hour', now() - interval '10 s',"
                       " sha256(int8send(42)))"));
    t0 = t_now_ms();
    role_worker_start(&b, "wrk", o);
    row_wait taken = {pg, "SELECT count(*) FROM pgjobq.workers WHERE id = 'dup' AND host <> 'gone'"};
    CHECK_MSG(t_wait_until(row_there, &taken, 20000), "the id was not taken over:\n%s", b.log);
    CHECK(t_now_ms() - t0 >= 3000);
    CHECK_OK(owner, pgjobq_enqueue(owner, "{}", &eo, NULL));
    done.sql = "SELECT (count(*) >= 2)::int FROM pgjobq.history WHERE queue = 'rq' AND worker_id = 'dup'";
    CHECK_MSG(t_wait_until(row_there, &done, 20000), "no job ran");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'rq' AND worker_id = 'dup'"), 2);
    CHECK_INT(role_worker_stop(&b), PGJOBQ_OK);
    CHECK(strstr(b.log, "is free again") != NULL);
    free(owner_row);
    pgjobq_client_close(owner);
    PQfinish(pg);
}

/* Workflows across queues (docs/workflows.md, "Parents outside the graph").  A new job's parent must be
 * of the child's queue, or enqueued by the same transaction, or the caller must hold
 * pgjobq_cross_queue (pgjobq_admin does).  Anything else reads exactly like a job that does not exist,
 * and takes no lock. */

static char wf_msg[1024];

/* Runs SQL as a role: its SQLSTATE ("" on success); the error's primary message goes to wf_msg. */
__attribute__((format(printf, 2, 3))) static const char *wf_sql(pgjobq_client *c, const char *fmt, ...)
{
    char sql[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    PGresult *r = PQexec(pgjobq_client_conn(c), sql);
    const char *s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    const char *m = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    snprintf(state, sizeof state, "%s", s ? s : "");
    snprintf(wf_msg, sizeof wf_msg, "%s", m ? m : "");
    PQclear(r);
    return state;
}

/* Runs SQL as a role that must succeed and return one number (a job id). */
__attribute__((format(printf, 2, 3))) static int64_t wf_id(pgjobq_client *c, const char *fmt, ...)
{
    char sql[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    PGresult *r = PQexec(pgjobq_client_conn(c), sql);
    CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) >= 1, "%s: %s", sql, PQresultErrorMessage(r));
    int64_t id = atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    return id;
}

/* The one refusal, whatever the reason: SQLSTATE 23503 and this text. */
static void wf_refused(int64_t parent)
{
    char want[256];

    snprintf(want, sizeof want,
             "pgjobq.enqueue_graph: job %lld cannot be a parent here: no such job in this queue or this transaction",
             (long long)parent);
    CHECK_MSG(strcmp(state, "23503") == 0 && strcmp(wf_msg, want) == 0, "SQLSTATE %s: %s", state, wf_msg);
}

static void wf_roles(void)
{
    PGconn *pg = t_pg();

    roles_setup();
    PQclear(t_exec(pg, "DO $$ BEGIN"
                       " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pw') THEN CREATE ROLE pw LOGIN; END IF;"
                       " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'xq') THEN CREATE ROLE xq LOGIN; END IF;"
                       " END $$"));
    PQclear(t_exec(pg, "GRANT pgjobq_producer, pgjobq_worker TO pw"));
    PQclear(t_exec(pg, "GRANT pgjobq_producer, pgjobq_cross_queue TO xq"));
    CHECK_INT(t_int(pg, "SELECT pg_has_role('adm', 'pgjobq_cross_queue', 'USAGE')::int"), 1);
    PQfinish(pg);
}

TEST(roles_a_producer_cannot_make_a_job_of_another_queue_a_parent_lock_it_or_learn_it_exists)
{
    pgjobq_client *owner = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    int64_t live = 0, live2 = 0, done = 0, id = 0;

    wf_roles();
    pgjobq_client *app = as_role("app"), *wrk = as_role("wrk"), *adm = as_role("adm"), *pw = as_role("pw");
    o.queue = "wf_a";
    CHECK_OK(owner, pgjobq_enqueue(owner, "{}", &o, &done));
    CHECK_OK(owner, pgjobq_enqueue(owner, "{}", &o, &live));
    CHECK_OK(owner, pgjobq_enqueue(owner, "{}", &o, &live2));
    CHECK_OK(wrk, pgjobq_claim(wrk, "wf_a", 1, 60000, "wrk", &jobs, &n));
    CHECK(n == 1 && jobs[0].id == done);
    CHECK_OK(wrk, pgjobq_job_complete(wrk, done, jobs[0].lease_token, "{\"secret\": 42}"));
    pgjobq_jobs_free(jobs);

    /* A job of another queue, live or finished, and a job that does not exist: one error, word for word,
     * through enqueue and enqueue_graph. */
    const int64_t probes[] = {live, done, 987654321};
    for (size_t i = 0; i < 3; i++) {
        wf_sql(app, "SELECT id FROM pgjobq.enqueue('wf_b', after => ARRAY[%lld]::bigint[])", (long long)probes[i]);
        wf_refused(probes[i]);
        wf_sql(app, "SELECT * FROM pgjobq.enqueue_graph('[{\"queue\": \"wf_b\", \"after\": [%lld]}]')",
               (long long)probes[i]);
        wf_refused(probes[i]);
        wf_sql(app, "SELECT * FROM pgjobq.enqueue_graph('[{\"ref\": \"x\"}, {\"after\": [\"x\", %lld]}]')",
               (long long)probes[i]);
        wf_refused(probes[i]);
    }
    /* Through the library too. */
    int64_t after[] = {live, 0};
    o.queue = "wf_b";
    o.after = after;
    CHECK_RC(app, pgjobq_enqueue(app, "{}", &o, &id), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_errmsg(app), "cannot be a parent here") != NULL, "%s", pgjobq_errmsg(app));

    /* No lock is taken: a worker completes the job while the producer's failed transaction is still
     * open, without waiting (it waited for the producer's commit before). */
    CHECK_OK(wrk, pgjobq_claim(wrk, "wf_a", 1, 60000, "wrk", &jobs, &n));
    CHECK(n == 1 && jobs[0].id == live);
    int64_t token = jobs[0].lease_token;
    pgjobq_jobs_free(jobs);
    CHECK_STR(wf_sql(app, "BEGIN"), "");
    wf_sql(app, "SELECT id FROM pgjobq.enqueue('wf_b', after => ARRAY[%lld]::bigint[])", (long long)live);
    wf_refused(live);
    CHECK_STR(wf_sql(wrk, "SET lock_timeout = '2s'"), "");
    CHECK_STR(wf_sql(wrk, "SELECT * FROM pgjobq.complete_many(ARRAY[%lld]::bigint[], ARRAY[%lld]::bigint[], NULL)",
                     (long long)live, (long long)token),
              "");
    CHECK_STR(wf_sql(app, "ROLLBACK"), "");

    /* A job of another queue made the parent of a child of its own queue (allowed) is not thereby the
     * producer's: has_children was written by its transaction, and the next child, of another queue,
     * is still refused. */
    CHECK_STR(wf_sql(app, "BEGIN"), "");
    CHECK_STR(wf_sql(app, "SELECT id FROM pgjobq.enqueue('wf_a', after => ARRAY[%lld]::bigint[])", (long long)live2), "");
    wf_sql(app, "SELECT id FROM pgjobq.enqueue('wf_b', after => ARRAY[%lld]::bigint[])", (long long)live2);
    wf_refused(live2);
    CHECK_STR(wf_sql(app, "ROLLBACK"), "");

    /* A role that is a producer and a worker: a job of another queue that it claimed (and so wrote) in
     * its transaction is not one it enqueued. */
    CHECK_STR(wf_sql(pw, "BEGIN"), "");
    CHECK_INT(wf_id(pw, "SELECT id FROM pgjobq.claim('wf_a', 1, '1 minute', 'pw')"), live2);
    wf_sql(pw, "SELECT id FROM pgjobq.enqueue('wf_b', after => ARRAY[%lld]::bigint[])", (long long)live2);
    wf_refused(live2);
    CHECK_STR(wf_sql(pw, "ROLLBACK"), "");

    /* The caller is the session's role: an admin that SET ROLE to a producer is a producer. */
    CHECK_STR(wf_sql(adm, "SET ROLE pgjobq_producer"), "");
    wf_sql(adm, "SELECT id FROM pgjobq.enqueue('wf_b', after => ARRAY[%lld]::bigint[])", (long long)live2);
    wf_refused(live2);
    CHECK_STR(wf_sql(adm, "RESET ROLE"), "");

    /* Nothing was written by the refusals. */
    PGconn *pg = t_pg();
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue <> 'wf_a'"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.deps"), 0);
    PQfinish(pg);
    pgjobq_client_close(app);
    pgjobq_client_close(wrk);
    pgjobq_client_close(adm);
    pgjobq_client_close(pw);
    pgjobq_client_close(owner);
}

TEST(roles_workflow_parents_of_the_same_queue_this_transaction_or_with_the_cross_queue_role)
{
    pgjobq_client *owner = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    int64_t live = 0, done = 0;

    wf_roles();
    pgjobq_client *app = as_role("app"), *wrk = as_role("wrk"), *adm = as_role("adm"), *xq = as_role("xq");
    PGconn *pg = t_pg();
    o.queue = "wf_a";
    CHECK_OK(owner, pgjobq_enqueue(owner, "{}", &o, &done));
    CHECK_OK(owner, pgjobq_enqueue(owner, "{}", &o, &live));
    CHECK_OK(wrk, pgjobq_claim(wrk, "wf_a", 1, 60000, "wrk", &jobs, &n));
    CHECK(n == 1 && jobs[0].id == done);
    CHECK_OK(wrk, pgjobq_job_complete(wrk, done, jobs[0].lease_token, "{\"secret\": 42}"));
    pgjobq_jobs_free(jobs);

    /* The producer: a job of the child's own queue. */
    int64_t same = wf_id(app, "SELECT id FROM pgjobq.enqueue('wf_a', after => ARRAY[%lld, %lld]::bigint[])",
                         (long long)live, (long long)done);
    CHECK_INT(t_int(pg, "SELECT pending_parents FROM pgjobq.jobs WHERE id = %lld", (long long)same), 1);

    /* Jobs of other queues that its own transaction enqueued: in the transaction itself, after a savepoint
     * released, after the job was written again (has_children, by its first child), and mixed with refs
     * of a graph.  One rolled back to a savepoint is gone. */
    CHECK_STR(wf_sql(app, "BEGIN"), "");
    int64_t x = wf_id(app, "SELECT id FROM pgjobq.enqueue('wf_c')");
    int64_t y = wf_id(app, "SELECT id FROM pgjobq.enqueue('wf_d', after => ARRAY[%lld]::bigint[])", (long long)x);
    int64_t z = wf_id(app, "SELECT id FROM pgjobq.enqueue('wf_e', after => ARRAY[%lld]::bigint[])", (long long)x);
    CHECK_STR(wf_sql(app, "SAVEPOINT s"), "");
    int64_t w = wf_id(app, "SELECT id FROM pgjobq.enqueue('wf_f')");
    CHECK_STR(wf_sql(app, "RELEASE SAVEPOINT s"), "");
    wf_id(app, "SELECT id FROM pgjobq.enqueue('wf_g', after => ARRAY[%lld]::bigint[])", (long long)w);
    int64_t g = wf_id(app, "SELECT id FROM pgjobq.enqueue_graph('[{\"ref\": \"p\", \"queue\": \"wf_h\"},"
                           " {\"ref\": \"q\", \"queue\": \"wf_i\", \"after\": [\"p\", %lld, %lld]}]') WHERE ref = 'q'",
                      (long long)x, (long long)w);
    wf_id(app, "SELECT id FROM pgjobq.enqueue('wf_j', after => ARRAY[%lld]::bigint[])", (long long)g);
    CHECK_STR(wf_sql(app, "SAVEPOINT t"), "");
    int64_t gone = wf_id(app, "SELECT id FROM pgjobq.enqueue('wf_k')");
    CHECK_STR(wf_sql(app, "ROLLBACK TO SAVEPOINT t"), "");
    wf_sql(app, "SELECT id FROM pgjobq.enqueue('wf_l', after => ARRAY[%lld]::bigint[])", (long long)gone);
    wf_refused(gone);
    CHECK_STR(wf_sql(app, "ROLLBACK TO SAVEPOINT t"), "");
    CHECK_STR(wf_sql(app, "COMMIT"), "");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.deps WHERE parent = %lld AND child IN (%lld, %lld, %lld)",
                    (long long)x, (long long)y, (long long)z, (long long)g),
              3);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue IN ('wf_d', 'wf_e', 'wf_g', 'wf_i', 'wf_j')"
                        " AND state = 'waiting'"),
              5);
    /* In the next transaction they are other transactions' jobs. */
    wf_sql(app, "SELECT id FROM pgjobq.enqueue('wf_m', after => ARRAY[%lld]::bigint[])", (long long)x);
    wf_refused(x);

    /* A graph's own refs cross queues freely. */
    CHECK_STR(wf_sql(app, "SELECT * FROM pgjobq.enqueue_graph('[{\"ref\": \"a\", \"queue\": \"wf_n\"},"
                          " {\"queue\": \"wf_o\", \"after\": [\"a\"]}, {\"queue\": \"wf_p\", \"after\": [\"a\"]}]')"),
              "");

    /* A member of pgjobq_cross_queue, and an admin, depend on any job; the child's worker then gets the
     * parent's result. */
    int64_t xc = wf_id(xq, "SELECT id FROM pgjobq.enqueue('wf_q', after => ARRAY[%lld, %lld]::bigint[])",
                       (long long)live, (long long)done);
    CHECK_INT(t_int(pg, "SELECT pending_parents FROM pgjobq.jobs WHERE id = %lld", (long long)xc), 1);
    int64_t ac = wf_id(adm, "SELECT id FROM pgjobq.enqueue('wf_r', after => ARRAY[%lld]::bigint[])", (long long)done);
    CHECK_OK(wrk, pgjobq_claim(wrk, "wf_r", 1, 60000, "wrk", &jobs, &n));
    CHECK(n == 1 && jobs[0].id == ac);
    CHECK_MSG(jobs[0].parents && strstr(jobs[0].parents, "\"secret\": 42") != NULL, "parents %s",
              jobs[0].parents ? jobs[0].parents : "(null)");
    pgjobq_jobs_free(jobs);
    /* Still no such thing as a job that does not exist. */
    wf_sql(xq, "SELECT id FROM pgjobq.enqueue('wf_q', after => ARRAY[987654321]::bigint[])");
    wf_refused(987654321);

    PQfinish(pg);
    pgjobq_client_close(app);
    pgjobq_client_close(wrk);
    pgjobq_client_close(adm);
    pgjobq_client_close(xq);
    pgjobq_client_close(owner);
}
