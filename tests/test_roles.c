/*
 * test_roles.c - least privilege: a producer can only enqueue, a worker can only run jobs, an admin can
 * look; each works with a hostile search_path; and migrations run as a non-superuser owner.
 */
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

    CHECK_OK(app, pgjobq_enqueue_batch(app, specs, N, ids, NULL));
    CHECK(ids[N - 1] > ids[0]);
    pgjobq_client_close(app); /* its statistics reach the server when it leaves */
    fn_wait w = {pg, "enqueue_many", 1};
    CHECK_MSG(t_wait_until(fn_called, &w, 10000), "the producer did not use pgjobq.enqueue_many()");
    CHECK_INT(fn_calls(pg, "reserve_ids"), 0);

    CHECK_OK(bulk, pgjobq_enqueue_batch(bulk, specs, N, ids, NULL));
    CHECK(ids[N - 1] > ids[0]);
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
    CHECK_RC(mon, pgjobq_queue_pause(mon, "default", NULL), PGJOBQ_EPERM);
    CHECK_STR(raw_as(mon, "DELETE FROM pgjobq.jobs"), "42501");
    CHECK_STR(raw_as(mon, "UPDATE pgjobq.workers SET host = 'x'"), "42501");
    CHECK_STR(raw_as(mon, "SELECT pgjobq.worker_beat('w', 'h', 1, 'v', 'q')"), "42501");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued'", (long long)id), 1);
    pgjobq_client_close(mon);
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
