/*
 * test_worker.c - the worker runtime: the C API in-process, and `pgjobq work --exec` processes under
 * crashes, stalls, restarts, lost listeners and shutdowns.
 */
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"

/* ------------------------------------------------------------------------------------------------ */
/* Polling helpers                                                                                   */

static const char *cond_sql;
static long long cond_want;

static int sql_reaches(void *arg)
{
    PGconn *pg = arg;
    return t_int(pg, "%s", cond_sql) >= cond_want;
}

/* Waits until the integer result of sql is at least want. */
static void wait_sql(PGconn *pg, const char *sql, long long want, int timeout_ms)
{
    cond_sql = sql;
    cond_want = want;
    if (!t_wait_until(sql_reaches, pg, timeout_ms))
        t_fail(__FILE__, __LINE__, "after %d ms, %s is %lld, not >= %lld", timeout_ms, sql, t_int(pg, "%s", sql), want);
}

static void enqueue_n(int n, const char *queue)
{
    pgjobq_client *c = t_client();
    pgjobq_job_spec *specs = calloc((size_t)n, sizeof *specs);
    char(*payloads)[32] = calloc((size_t)n, sizeof *payloads);
    CHECK(specs && payloads);
    for (int i = 0; i < n; i++) {
        snprintf(payloads[i], sizeof payloads[i], "{\"n\": %d}", i);
        specs[i].payload = payloads[i];
        specs[i].opts.queue = queue;
    }
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, (size_t)n, NULL, NULL));
    free(specs);
    free(payloads);
    pgjobq_client_close(c);
}

/* ------------------------------------------------------------------------------------------------ */
/* The C API, in-process                                                                             */

typedef struct run_arg {
    pgjobq_worker *w;
    int rc;
} run_arg;

static void *run_thread(void *arg)
{
    run_arg *r = arg;
    r->rc = pgjobq_worker_run(r->w);
    return NULL;
}

static _Atomic int handled;
static _Atomic int long_started; /* handlers of kind "long" entered, over the whole run */

static pgjobq_outcome outcome_handler(pgjobq_ctx *ctx, void *arg)
{
    const pgjobq_job *j = pgjobq_ctx_job(ctx);
    (void)arg;
    atomic_fetch_add(&handled, 1);
    if (strcmp(j->kind, "ok") == 0) {
        char result[64];
        snprintf(result, sizeof result, "{\"doubled\": %d}", 2 * atoi(strchr(j->payload, ':') + 1));
        if (pgjobq_ctx_set_result(ctx, result) != PGJOBQ_OK || pgjobq_ctx_set_result(ctx, "{bad") == PGJOBQ_OK)
            return PGJOBQ_OUTCOME_FAIL;
        return PGJOBQ_OUTCOME_COMPLETE;
    }
    if (strcmp(j->kind, "flaky") == 0) {
        if (j->attempt < 3) {
            pgjobq_ctx_set_error(ctx, "not yet");
            pgjobq_ctx_set_retry_delay(ctx, 0);
            return PGJOBQ_OUTCOME_RETRY;
        }
        return PGJOBQ_OUTCOME_COMPLETE;
    }
    if (strcmp(j->kind, "doomed") == 0) {
        pgjobq_ctx_set_error(ctx, "cannot ever work");
        return PGJOBQ_OUTCOME_FAIL;
    }
    if (strcmp(j->kind, "pointless") == 0)
        return PGJOBQ_OUTCOME_CANCEL;
    if (strcmp(j->kind, "nap") == 0) {
        /* Takes as many milliseconds as its payload's n. */
        long ms = atol(strchr(j->payload, ':') + 1);
        struct timespec pause = {ms / 1000, (ms % 1000) * 1000 * 1000};
        nanosleep(&pause, NULL);
        return PGJOBQ_OUTCOME_COMPLETE;
    }
    if (strcmp(j->kind, "long") == 0) {
        /* Runs until told to stop, and reports why through its error. */
        atomic_fetch_add(&long_started, 1);
        while (!pgjobq_ctx_should_stop(ctx)) {
            struct timespec pause = {0, 5 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
        char why[32];
        snprintf(why, sizeof why, "stopped: %d", (int)pgjobq_ctx_stop_reason(ctx));
        pgjobq_ctx_set_error(ctx, why);
        return PGJOBQ_OUTCOME_RETRY;
    }
    return PGJOBQ_OUTCOME_COMPLETE;
}

static void add_jobs(pgjobq_client *c, const char *kind, int n, int max_attempts)
{
    for (int i = 0; i < n; i++) {
        pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
        char payload[32];
        o.kind = kind;
        o.max_attempts = max_attempts;
        snprintf(payload, sizeof payload, "{\"n\": %d}", i);
        CHECK_OK(c, pgjobq_enqueue(c, payload, &o, NULL));
    }
}

/* Enqueues n jobs of kind in one batch, each with payload {"n": arg} and the given priority. */
static void add_batch(pgjobq_client *c, const char *kind, int n, int arg, int priority)
{
    pgjobq_job_spec *specs = calloc((size_t)n, sizeof *specs);
    char payload[32];
    CHECK(specs);
    snprintf(payload, sizeof payload, "{\"n\": %d}", arg);
    for (int i = 0; i < n; i++) {
        specs[i].payload = payload;
        specs[i].opts.kind = kind;
        specs[i].opts.priority = priority;
    }
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, (size_t)n, NULL, NULL));
    free(specs);
}

TEST_FULL(worker_api_runs_handlers_and_records_each_outcome, 120, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    pgjobq_worker_stats st;
    run_arg r;
    pthread_t th;

    add_jobs(c, "ok", 300, 0);
    add_jobs(c, "flaky", 5, 5);
    add_jobs(c, "doomed", 3, 10);
    add_jobs(c, "pointless", 2, 0);
    add_jobs(c, "nobody-handles-this", 1, 5);
    o.lease_ms = 5000;
    o.poll_ms = 200;
    o.worker_id = "api-test";
    CHECK_RC(NULL, pgjobq_worker_new(&w, t_conninfo(), &o), PGJOBQ_OK);
    for (const char *const *k = (const char *const[]){"ok", "flaky", "doomed", "pointless", NULL}; *k; k++)
        CHECK_MSG(pgjobq_worker_handle(w, "default", *k, 8, outcome_handler, NULL) == PGJOBQ_OK, "%s",
                  pgjobq_worker_errmsg(w));
    /* A second handler for the same kind, or another concurrency for the queue, is refused. */
    CHECK(pgjobq_worker_handle(w, "default", "ok", 8, outcome_handler, NULL) == PGJOBQ_EINVAL);
    CHECK(pgjobq_worker_handle(w, "default", "other", 3, outcome_handler, NULL) == PGJOBQ_EINVAL);
    r.w = w;
    CHECK(pthread_create(&th, NULL, run_thread, &r) == 0);

    wait_sql(pg,
             "SELECT count(*) FROM pgjobq.all_jobs WHERE state IN ('completed', 'failed', 'cancelled')",
             300 + 5 + 3 + 2 + 1, 60000);
    pgjobq_worker_stop(w);
    pthread_join(th, NULL);
    CHECK_MSG(r.rc == PGJOBQ_OK, "run: %s", pgjobq_worker_errmsg(w));
    pgjobq_worker_get_stats(w, &st);
    CHECK_INT(st.running, 0);
    CHECK_INT(st.completed, 305);
    CHECK_INT(st.retried, 10);   /* flaky: two failed attempts each */
    CHECK_INT(st.failed, 4);     /* doomed, and the kind nobody handles */
    CHECK_INT(st.cancelled, 2);
    CHECK_INT(st.lost, 0);
    pgjobq_worker_free(w);

    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE kind = 'ok' AND state = 'completed'"
                        " AND result = jsonb_build_object('doubled', 2 * (payload->>'n')::int) AND attempt = 1"
                        " AND worker_id = 'api-test'"),
              300);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE kind = 'flaky' AND state = 'completed' AND attempt = 3"),
              5);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE kind = 'doomed' AND state = 'failed'"
                        " AND attempt = 1 AND last_error = 'cannot ever work'"),
              3);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE kind = 'pointless' AND state = 'cancelled'"), 2);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE kind = 'nobody-handles-this' AND state = 'failed'"
                        " AND last_error LIKE 'no handler for kind%%'"),
              1);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* Snoozes: "later" is handed back (200 ms) the first time it runs, then completes; "far" asks for
 * more than 100 years, taken as 100; "quiet" gives no reason and no delay (the backoff). */
static _Atomic int later_runs;

static pgjobq_outcome snooze_handler(pgjobq_ctx *ctx, void *arg)
{
    const pgjobq_job *j = pgjobq_ctx_job(ctx);
    (void)arg;
    if (strcmp(j->kind, "later") == 0) {
        if (atomic_fetch_add(&later_runs, 1) > 0)
            return PGJOBQ_OUTCOME_COMPLETE;
        pgjobq_ctx_set_error(ctx, "not mine yet");
        pgjobq_ctx_set_retry_delay(ctx, 200);
        return PGJOBQ_OUTCOME_SNOOZE;
    }
    if (strcmp(j->kind, "far") == 0) {
        pgjobq_ctx_set_retry_delay(ctx, INT64_MAX);
        return PGJOBQ_OUTCOME_SNOOZE;
    }
    return strcmp(j->kind, "quiet") == 0 ? PGJOBQ_OUTCOME_SNOOZE : PGJOBQ_OUTCOME_COMPLETE;
}

static pgjobq_worker *stats_of;
static int claimed_some(void *arg)
{
    pgjobq_worker_stats st;
    (void)arg;
    pgjobq_worker_get_stats(stats_of, &st);
    return st.claims > 0;
}

TEST_FULL(worker_api_snoozes_jobs_and_an_unhealthy_worker_claims_nothing, 90, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    pgjobq_worker_stats st;
    run_arg r;
    pthread_t th;

    add_jobs(c, "later", 1, 1);
    add_jobs(c, "far", 1, 1);
    add_jobs(c, "quiet", 1, 1);
    add_jobs(c, "ok", 5, 1);
    o.lease_ms = 5000;
    o.poll_ms = 100;
    o.worker_id = "snoozer";
    CHECK_RC(NULL, pgjobq_worker_new(&w, t_conninfo(), &o), PGJOBQ_OK);
    CHECK_RC(NULL, pgjobq_worker_handle(w, "default", NULL, 4, snooze_handler, NULL), PGJOBQ_OK);
    /* Unhealthy before it runs: it registers, says why, and claims nothing. */
    CHECK_RC(NULL, pgjobq_worker_set_unhealthy(w, "the disk is full\nsecond line"), PGJOBQ_OK);
    r.w = w;
    CHECK(pthread_create(&th, NULL, run_thread, &r) == 0);
    wait_sql(pg,
             "SELECT count(*) FROM pgjobq.monitor_unhealthy_workers() WHERE id = 'snoozer'"
             " AND reason = E'the disk is full\\nsecond line' AND since IS NOT NULL",
             1, 20000);
    stats_of = w;
    CHECK_MSG(!t_wait_until(claimed_some, NULL, 1500), "an unhealthy worker claimed");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'queued' AND attempt = 0"), 8);
    /* Healthy again: it claims, and says so in the registry. */
    CHECK_RC(NULL, pgjobq_worker_set_unhealthy(w, NULL), PGJOBQ_OK);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.history WHERE kind IN ('ok', 'later') AND state = 'completed'", 6, 30000);
    wait_sql(pg,
             "SELECT count(*) FROM pgjobq.workers WHERE id = 'snoozer' AND unhealthy IS NULL"
             " AND unhealthy_since IS NULL",
             1, 20000);
    /* The snoozed one ran twice and its attempt was given back: it completed at attempt 1. */
    CHECK_INT(atomic_load(&later_runs), 2);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE kind = 'later' AND attempt = 1"), 1);
    /* A delay over 100 years is 100 years; no reason: who handed it back; no delay: the backoff. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE kind = 'far' AND state = 'queued' AND attempt = 0"
                        " AND run_at BETWEEN now() + interval '99 years' AND now() + interval '101 years'"),
              1);
    wait_sql(
        pg,
        "SELECT count(*) FROM pgjobq.jobs WHERE kind = 'quiet' AND state = 'queued' AND attempt = 0"
        " AND last_error = 'handed back by its handler on worker snoozer' AND run_at > now() + interval '1 second'",
        1, 20000);
    pgjobq_worker_stop(w);
    pthread_join(th, NULL);
    CHECK_MSG(r.rc == PGJOBQ_OK, "run: %s", pgjobq_worker_errmsg(w));
    pgjobq_worker_get_stats(w, &st);
    CHECK_MSG(st.released >= 3 && st.retried == 0 && st.failed == 0, "released %lld, retried %lld, failed %lld",
              (long long)st.released, (long long)st.retried, (long long)st.failed);
    pgjobq_worker_free(w);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST_FULL(worker_api_tells_a_handler_its_job_was_cancelled, 60, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    run_arg r;
    pthread_t th;
    int64_t id;
    pgjobq_enqueue_opts eo = PGJOBQ_ENQUEUE_OPTS_INIT;

    eo.kind = "long";
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &eo, &id));
    o.lease_ms = 3000;
    o.heartbeat_ms = 200;
    CHECK(pgjobq_worker_new(&w, t_conninfo(), &o) == PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(w, "default", NULL, 2, outcome_handler, NULL) == PGJOBQ_OK);
    r.w = w;
    CHECK(pthread_create(&th, NULL, run_thread, &r) == 0);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'running'", 1, 10000);
    pgjobq_state state;
    CHECK_OK(c, pgjobq_job_cancel(c, id, &state));
    CHECK_INT(state, PGJOBQ_RUNNING);
    /* The next heartbeat ends it cancelled and the handler is told to stop. */
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'cancelled'", 1, 10000);
    pgjobq_worker_stop(w);
    pthread_join(th, NULL);
    CHECK_INT(r.rc, PGJOBQ_OK);
    pgjobq_worker_stats st;
    pgjobq_worker_get_stats(w, &st);
    CHECK_INT(st.cancelled, 1);
    CHECK_INT(st.running, 0);
    pgjobq_worker_free(w);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* A cancel reaches the handler of a running job at once, not at the holder's next heartbeat: the
 * holder is notified, renews its leases now, and that heartbeat ends the job and stops the handler.
 * With a 20 s heartbeat, the handler has stopped well before the next one would have come (a
 * deadline of 10 s; it takes milliseconds), and the job says when the cancel was requested and when
 * the handler was told. */
TEST_FULL(worker_api_a_cancel_reaches_the_handler_before_the_next_heartbeat, 60, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    pgjobq_enqueue_opts eo = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_worker_stats st;
    pgjobq_job *j = NULL;
    pgjobq_state state;
    run_arg r;
    pthread_t th;
    int64_t id;
    char sql[128];

    eo.kind = "long";
    eo.queue = "told";
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &eo, &id));
    o.lease_ms = 60000;
    o.heartbeat_ms = 20000;
    CHECK(pgjobq_worker_new(&w, t_conninfo(), &o) == PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(w, "told", NULL, 1, outcome_handler, NULL) == PGJOBQ_OK);
    r.w = w;
    CHECK(pthread_create(&th, NULL, run_thread, &r) == 0);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'running'", (long long)id);
    wait_sql(pg, sql, 1, 10000);
    CHECK_OK(c, pgjobq_job_cancel(c, id, &state));
    CHECK_INT(state, PGJOBQ_RUNNING);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'cancelled'",
             (long long)id);
    wait_sql(pg, sql, 1, 10000);
    /* (The worker counts it once the answer of its write is in: a moment after the commit is seen.) */
    int64_t t0 = t_now_ms();
    do {
        pgjobq_worker_get_stats(w, &st);
        if (st.cancelled == 1 || t_now_ms() - t0 > 10000)
            break;
        usleep(10000);
    } while (1);
    CHECK_INT(st.cancelled, 1);
    /* The handler was told: the worker stops at once, with nothing to hand back. */
    pgjobq_worker_stop(w);
    pthread_join(th, NULL);
    CHECK_MSG(r.rc == PGJOBQ_OK, "run: %s", pgjobq_worker_errmsg(w));
    pgjobq_worker_free(w);
    CHECK_OK(c, pgjobq_job_get(c, id, &j));
    CHECK_INT(j->cancel_requested, 1);
    long long asked = t_int(pg,
                            "SELECT (pg_catalog.date_part('epoch', cancel_requested_at) * 1000000)::int8"
                            " FROM pgjobq.history WHERE id = %lld",
                            (long long)id);
    CHECK_MSG(j->cancel_requested_at != PGJOBQ_TIME_NONE && llabs(j->cancel_requested_at - asked) <= 1,
              "cancel_requested_at %lld, the table's %lld", (long long)j->cancel_requested_at, asked);
    pgjobq_jobs_free(j);
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND cancel_told_at >= cancel_requested_at"
                    " AND cancel_told_at < cancel_requested_at + interval '10 seconds'",
                    (long long)id),
              1);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(worker_api_refuses_a_timeout_not_shorter_than_the_lease)
{
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;

    o.lease_ms = 10000;
    o.timeout_ms = 10000;
    CHECK(pgjobq_worker_new(&w, t_conninfo(), &o) == PGJOBQ_EINVAL);
    CHECK(strstr(pgjobq_worker_errmsg(w), "shorter than the lease") != NULL);
    pgjobq_worker_free(w);
    o.timeout_ms = 5000;
    o.heartbeat_ms = 20000;
    CHECK(pgjobq_worker_new(&w, t_conninfo(), &o) == PGJOBQ_EINVAL);
    CHECK(strstr(pgjobq_worker_errmsg(w), "heartbeat") != NULL);
    pgjobq_worker_free(w);
    o.heartbeat_ms = 0;
    CHECK(pgjobq_worker_new(&w, t_conninfo(), &o) == PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(w, "bad queue", NULL, 1, outcome_handler, NULL) == PGJOBQ_EINVAL);
    CHECK(pgjobq_worker_handle(w, "q", NULL, 0, outcome_handler, NULL) == PGJOBQ_EINVAL);
    CHECK(pgjobq_worker_run(w) == PGJOBQ_EINVAL); /* no queue */
    pgjobq_worker_free(w);

    char *out, *err;
    CHECK_INT(t_cli(&out, &err, NULL, 0, "work", "--exec", "true", "--lease", "10s", "--timeout", "20s", NULL),
              EX_USAGE);
    CHECK(strstr(err, "shorter than the lease") != NULL);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "work", NULL), EX_USAGE);
    CHECK(strstr(err, "--exec") != NULL);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "work", "--exec", "'unbalanced", NULL), EX_USAGE);
    free(out);
    free(err);
}

/* ------------------------------------------------------------------------------------------------ */
/* pgjobq work --exec                                                                                */


TEST_FULL(work_exec_runs_2000_jobs_exactly_once_across_processes, 240, 0)
{
    PGconn *pg = t_pg();
    char ledger[512], body[1024];
    pid_t pids[3];

    snprintf(ledger, sizeof ledger, "%s/ledger", t_tmpdir());
    /* The handler records each run in a ledger (O_APPEND lines are atomic) and answers with JSON. */
    snprintf(body, sizeof body,
             "read -r payload\n"
             "echo \"$PGJOBQ_JOB_ID $PGJOBQ_ATTEMPT $PGJOBQ_QUEUE $PGJOBQ_MAX_ATTEMPTS\" >> %s\n"
             "echo \"{\\\"id\\\": $PGJOBQ_JOB_ID, \\\"in\\\": $payload, \\\"pw\\\": \\\"${PGPASSWORD:-}\\\"}\"",
             ledger);
    const char *handler = t_script("handler.sh", body);
    enqueue_n(2000, "bulk");
    for (int i = 0; i < 3; i++) {
        char id[32];
        snprintf(id, sizeof id, "worker-%d", i);
        pids[i] = t_spawn(t_log_path(id), "PGPASSWORD=hunter2", "work", "--queue", "bulk:6", "--exec", handler,
                          "--worker-id", id, NULL);
    }
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 2000, 180000);
    for (int i = 0; i < 3; i++)
        kill(pids[i], SIGTERM);
    for (int i = 0; i < 3; i++) {
        int status = t_wait_exit(pids[i], 30000);
        if (status != 0)
            t_show_log(t_log_path("worker-0"));
        CHECK_MSG(status == 0, "worker %d exited with %d", i, status);
    }
    /* Each job ran exactly once, on attempt 1, with its environment. */
    PQclear(t_exec(pg, "CREATE TEMP TABLE ledger (id bigint, attempt int, queue text, max_attempts int)"));
    PQclear(t_exec(pg, "COPY ledger FROM '%s' WITH (DELIMITER ' ')", ledger));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM ledger"), 2000);
    CHECK_INT(t_int(pg, "SELECT count(DISTINCT id) FROM ledger"), 2000);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM ledger l JOIN pgjobq.all_jobs j USING (id)"
                        " WHERE l.attempt = 1 AND l.queue = 'bulk' AND l.max_attempts = 25"),
              2000);
    /* Results are stored; the database password never reached the handler. */
    PGresult *bad = t_exec(pg, "SELECT id, payload, result, attempt, worker_id FROM pgjobq.all_jobs"
                               " WHERE NOT ((result->>'id')::bigint = id AND result->'in' = payload AND result->>'pw' = '')"
                               " OR result IS NULL LIMIT 5");
    for (int i = 0; i < PQntuples(bad); i++)
        fprintf(stderr, "mismatch: id %s payload %s result %s attempt %s worker %s\n", PQgetvalue(bad, i, 0),
                PQgetvalue(bad, i, 1), PQgetvalue(bad, i, 2), PQgetvalue(bad, i, 3), PQgetvalue(bad, i, 4));
    PQclear(bad);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE (result->>'id')::bigint = id"
                        " AND result->'in' = payload AND result->>'pw' = ''"),
              2000);
    CHECK_INT(t_int(pg, "SELECT count(DISTINCT worker_id) FROM pgjobq.all_jobs"), 3);
    PQfinish(pg);
}

TEST_FULL(work_exec_failures_timeouts_and_exit_75, 120, 0)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int64_t fail_id, temp_id, slow_id, text_id, garbage_id;

    const char *handler = t_script("h.sh", "payload=$(cat)\n"
                                           "case \"$payload\" in\n"
                                           "  *fail*) printf 'bad\\000bytes \\377 here\\n' >&2; exit 3;;\n"
                                           "  *temp*) echo 'try later' >&2; exit 75;;\n"
                                           "  *slow*) exec sleep 30;;\n"
                                           "  *text*) echo 'plain text, not JSON'; exit 0;;\n"
                                           "  *garbage*) head -c 1048576 /dev/urandom >&2; exit 1;;\n"
                                           "esac");
    o.max_attempts = 2;
    CHECK_OK(c, pgjobq_enqueue(c, "\"fail\"", &o, &fail_id));
    CHECK_OK(c, pgjobq_enqueue(c, "\"temp\"", &o, &temp_id));
    o.max_attempts = 1;
    CHECK_OK(c, pgjobq_enqueue(c, "\"slow\"", &o, &slow_id));
    CHECK_OK(c, pgjobq_enqueue(c, "\"text\"", &o, &text_id));
    CHECK_OK(c, pgjobq_enqueue(c, "\"garbage\"", &o, &garbage_id));
    pid_t pid = t_spawn(t_log_path("w"), NULL, "work", "--exec", handler, "--lease", "3s", "--timeout", "1s", "--poll",
                        "100ms", NULL);
    /* The failing job: its stderr (NUL and invalid UTF-8 included) is stored, sanitised. */
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND last_error LIKE '%%exit status 3%%'",
             (long long)fail_id);
    wait_sql(pg, sql, 1, 30000);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND last_error LIKE '%%temporary failure (exit status 75)%%try later%%'",
             (long long)temp_id);
    wait_sql(pg, sql, 1, 30000);
    /* The slow job is killed at its timeout and, with one attempt, fails. */
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'failed'"
                              " AND last_error LIKE '%%timed out%%'",
             (long long)slow_id);
    wait_sql(pg, sql, 1, 30000);
    /* 1 MiB of binary on stderr: the job fails (one attempt) with the tail, made storable. */
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'failed'"
                              " AND last_error LIKE 'failed (exit status 1)%%' AND octet_length(last_error) <= %d",
             (long long)garbage_id, PGJOBQ_ERROR_MAX);
    wait_sql(pg, sql, 1, 30000);
    /* Plain-text output is stored as a JSON string. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND result = '\"plain text, not JSON\"'",
                    (long long)text_id),
              1);
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* Exit 99 snoozes the job: handed back untouched, no attempt used, due after the duration on stdout
 * (none: the backoff), stderr kept as the reason; a stdout that is no duration is a failed attempt. */
TEST_FULL(work_exec_exit_99_snoozes_without_using_an_attempt, 120, 0)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int64_t later, backoff, bad;
    char sql[320];

    const char *handler = t_script("h.sh", "payload=$(cat)\n"
                                           "case \"$payload\" in\n"
                                           "  *later*) echo 'waiting for the bank' >&2; echo 1h; exit 99;;\n"
                                           "  *backoff*) exit 99;;\n"
                                           "  *bad*) echo soon; exit 99;;\n"
                                           "esac");
    o.max_attempts = 1;
    CHECK_OK(c, pgjobq_enqueue(c, "\"later\"", &o, &later));
    CHECK_OK(c, pgjobq_enqueue(c, "\"backoff\"", &o, &backoff));
    CHECK_OK(c, pgjobq_enqueue(c, "\"bad\"", &o, &bad));
    pid_t pid = t_spawn(t_log_path("w"), NULL, "work", "--exec", handler, "--poll", "100ms", NULL);
    /* An hour on stdout: queued again for an hour from now, its attempt given back (one attempt in all:
     * a failed attempt would have ended it failed), stderr as the reason. */
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued' AND attempt = 0"
             " AND run_at > now() + interval '55 minutes'"
             " AND last_error = 'snoozed by the handler (exit status 99): waiting for the bank'",
             (long long)later);
    wait_sql(pg, sql, 1, 30000);
    /* Nothing on stdout: the backoff; still no attempt used, and it comes back and snoozes again. */
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued' AND attempt = 0"
             " AND last_error = 'snoozed by the handler (exit status 99)'",
             (long long)backoff);
    wait_sql(pg, sql, 1, 30000);
    /* Not a duration: a failed attempt that says so (the only one: failed for good). */
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'failed'"
             " AND last_error LIKE 'exit status 99 asks for a snooze, but its standard output (''soon'') is not a duration%%'",
             (long long)bad);
    wait_sql(pg, sql, 1, 30000);
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* At pgjobq.snooze_cap() snoozes, a snooze is a failed attempt instead, which says so: a handler that
 * snoozes for ever ends as its attempts say.  Below it, each snooze is counted and uses no attempt. */
TEST_FULL(work_snoozes_past_the_cap_are_failed_attempts, 120, 0)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int64_t id;
    char sql[400];

    CHECK_INT(t_int(pg, "SELECT pgjobq.snooze_cap()"), 1000);
    const char *handler = t_script("h.sh", "cat >/dev/null; echo 'not yet' >&2; echo 0; exit 99");
    o.max_attempts = 2;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET snoozes = 998 WHERE id = %lld", (long long)id));
    pid_t pid = t_spawn(t_log_path("w"), NULL, "work", "--exec", handler, "--poll", "100ms", NULL);
    /* Snoozes 999 and 1000 give the attempt back; the next two are failed attempts, the second the
     * last one it had. */
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'failed' AND attempt = 2"
             " AND snoozes = 1000 AND last_error = 'snoozed 1000 times, the cap (pgjobq.snooze_cap()): this snooze is"
             " a failed attempt; snoozed by the handler (exit status 99): not yet'",
             (long long)id);
    wait_sql(pg, sql, 1, 60000);
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST_FULL(work_sigterm_drains_then_hands_back_unfinished_jobs, 120, 0)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int64_t quick, slow;

    char body[600];
    snprintf(body, sizeof body,
             "touch %s/started.$PGJOBQ_JOB_ID\n"
             "payload=$(cat)\n"
             "case \"$payload\" in *slow*) exec sleep 60;; esac\n"
             "sleep 1; echo '{\"done\": true}'",
             t_tmpdir());
    const char *handler = t_script("h.sh", body);
    o.kind = "quick";
    CHECK_OK(c, pgjobq_enqueue(c, "\"quick\"", &o, &quick));
    o.kind = "slow";
    CHECK_OK(c, pgjobq_enqueue(c, "\"slow\"", &o, &slow));
    pid_t pid = t_spawn(t_log_path("w"), NULL, "work", "--exec", handler, "--queue", "default:2", "--lease", "120s",
                        "--timeout", "100s", "--shutdown-timeout", "3s", NULL);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'running'", 2, 20000);
    /* Claimed is not started: wait until both handlers run (a job not started yet would be handed
     * back at once, and the stop would be clean). */
    char marker[2][600];
    snprintf(marker[0], sizeof marker[0], "%s/started.%lld", t_tmpdir(), (long long)quick);
    snprintf(marker[1], sizeof marker[1], "%s/started.%lld", t_tmpdir(), (long long)slow);
    for (int64_t t0 = t_now_ms(); access(marker[0], F_OK) != 0 || access(marker[1], F_OK) != 0;) {
        CHECK_MSG(t_now_ms() - t0 < 20000, "the two handlers did not both start");
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGTERM);
    /* The quick job finishes within the shutdown timeout; the slow one is stopped and handed back at
     * once, without using up its attempt: exit 75 says jobs had to be handed back. */
    int status = t_wait_exit(pid, 30000);
    if (status != EX_TEMPFAIL)
        t_show_log(t_log_path("w"));
    CHECK_INT(status, EX_TEMPFAIL);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'completed'", (long long)quick), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'queued' AND attempt = 0"
                        " AND run_at <= now() AND last_error LIKE 'handed back%%' AND snoozes = 0",
                    (long long)slow),
              1);

    /* A clean drain exits 0. */
    CHECK_OK(c, pgjobq_job_cancel(c, slow, NULL));
    o.kind = "quick";
    CHECK_OK(c, pgjobq_enqueue(c, "\"quick\"", &o, &quick));
    pid = t_spawn(t_log_path("w2"), NULL, "work", "--exec", handler, "--shutdown-timeout", "20s", NULL);
    snprintf(marker[0], sizeof marker[0], "%s/started.%lld", t_tmpdir(), (long long)quick);
    for (int64_t t0 = t_now_ms(); access(marker[0], F_OK) != 0;) {
        CHECK_MSG(t_now_ms() - t0 < 20000, "the handler did not start");
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'completed'", (long long)quick), 1);

    /* A second signal hands the running job back at once, and the log says which it was; the first
     * said how long it would wait and that a second one would not. */
    o.kind = "slow";
    CHECK_OK(c, pgjobq_enqueue(c, "\"slow\"", &o, &slow));
    pid = t_spawn(t_log_path("w3"), NULL, "work", "--exec", handler, "--shutdown-timeout", "60s", NULL);
    snprintf(marker[1], sizeof marker[1], "%s/started.%lld", t_tmpdir(), (long long)slow);
    for (int64_t t0 = t_now_ms(); access(marker[1], F_OK) != 0;) {
        CHECK_MSG(t_now_ms() - t0 < 20000, "the handler did not start");
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGTERM);
    struct timespec pause = {0, 300 * 1000000L};
    nanosleep(&pause, NULL);
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), EX_TEMPFAIL);
    char *log3 = NULL;
    {
        FILE *f = fopen(t_log_path("w3"), "r");
        CHECK(f != NULL);
        size_t cap = 1 << 20, len;
        log3 = calloc(1, cap + 1);
        CHECK(log3 != NULL);
        len = fread(log3, 1, cap, f);
        log3[len] = '\0';
        fclose(f);
    }
    CHECK_MSG(strstr(log3, "waiting up to 60000 ms for the running ones (a second stop request hands them back at once)") &&
                  strstr(log3, "jobs still running at the second stop request were handed back") &&
                  strstr(log3, "at the shutdown timeout") == NULL,
              "log: %s", log3);
    free(log3);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST_FULL(work_kill_9_mid_job_another_worker_finishes_it, 120, 0)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    int64_t id;

    const char *handler = t_script("h.sh", "cat >/dev/null\n"
                                           "if [ \"$PGJOBQ_ATTEMPT\" = 1 ]; then sleep 20; fi\n"
                                           "echo \"{\\\"by\\\": \\\"$WHO\\\"}\"");
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id));
    pid_t a = t_spawn(t_log_path("a"), "WHO=a", "work", "--exec", handler, "--lease", "2s", "--timeout", "1500ms",
                      "--worker-id", "a", NULL);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'running' AND worker_id = 'a'", 1, 20000);
    kill(a, SIGKILL);
    CHECK_INT(t_wait_exit(a, 10000), 128 + SIGKILL);
    int64_t killed_at = t_now_ms();
    pid_t b = t_spawn(t_log_path("b"), "WHO=b", "work", "--exec", handler, "--lease", "2s", "--timeout", "1500ms",
                      "--worker-id", "b", "--poll", "200ms", NULL);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 1, 30000);
    printf("kill -9 to completion by another worker: %lld ms\n", (long long)(t_now_ms() - killed_at));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND attempt = 2 AND worker_id = 'b'"
                        " AND result = '{\"by\": \"b\"}' AND last_error LIKE 'lease expired%%'",
                    (long long)id),
              1);
    kill(b, SIGTERM);
    CHECK_INT(t_wait_exit(b, 30000), 0);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST_FULL(work_stalled_worker_cannot_write_after_losing_its_lease, 120, 0)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    int64_t id;

    /* Attempt 1 takes a moment, so the worker is frozen while its handler is in flight. */
    const char *handler = t_script("h.sh", "cat >/dev/null\n"
                                           "if [ \"$PGJOBQ_ATTEMPT\" = 1 ]; then sleep 0.5; fi\n"
                                           "echo \"{\\\"by\\\": \\\"$WHO\\\"}\"");
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id));
    pid_t a = t_spawn(t_log_path("a"), "WHO=a", "work", "--exec", handler, "--lease", "2s", "--timeout", "1500ms",
                      "--worker-id", "a", "--no-maintenance", NULL);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'running' AND worker_id = 'a'", 1, 20000);
    kill(a, SIGSTOP);
    /* Frozen past its lease: another worker rescues and completes the job. */
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'running' AND lease_until < now()", 1, 20000);
    pid_t b = t_spawn(t_log_path("b"), "WHO=b", "work", "--exec", handler, "--lease", "2s", "--timeout", "1500ms",
                      "--worker-id", "b", "--poll", "200ms", NULL);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 1, 30000);
    /* The zombie wakes up with a finished handler and a lost lease: it must write nothing. */
    kill(a, SIGCONT);
    kill(a, SIGTERM);
    CHECK_INT(t_wait_exit(a, 30000), 0);
    kill(b, SIGTERM);
    CHECK_INT(t_wait_exit(b, 30000), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'completed' AND attempt = 2"
                        " AND worker_id = 'b' AND result = '{\"by\": \"b\"}'",
                    (long long)id),
              1);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* The claim connection also listens (LISTEN is part of its set-up, before its first claim). */
static int listener_pid(PGconn *pg)
{
    return (int)t_int(pg, "SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE application_name = 'pgjobq-claim'"
                          " AND datname = current_database()");
}

TEST_FULL(work_notify_wakes_an_idle_worker_and_survives_a_killed_listener, 120, 0)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    const char *handler = t_script("h.sh", "cat >/dev/null; echo '{}'");
    int64_t t0;

    /* Polling every minute: only a notification can explain a pickup within a few seconds.  The
     * first job is taken by the worker's start-up claim; the second finds it idle. */
    pid_t pid = t_spawn(t_log_path("w"), NULL, "work", "--exec", handler, "--poll", "60s", NULL);
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, NULL));
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 1, 20000);
    /* Listening: the claim connection is past its set-up query (which holds the LISTEN). */
    wait_sql(pg, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgjobq-claim'"
                 " AND datname = current_database() AND query <> '' AND query NOT LIKE '%schema_version%'",
             1, 20000);
    t0 = t_now_ms();
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, NULL));
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 2, 10000);
    printf("pickup of a new job by an idle worker: %lld ms (poll interval 60 s)\n", (long long)(t_now_ms() - t0));

    /* Kill the listener's backend: the worker notices, reconnects (listening again before it claims),
     * and is woken again. */
    int old = listener_pid(pg);
    CHECK(old > 0);
    PQclear(t_exec(pg, "SELECT pg_terminate_backend(%d)", old));
    char sql[300];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgjobq-claim'"
                              " AND datname = current_database() AND pid <> %d AND query <> ''"
                              " AND query NOT LIKE '%%schema_version%%'",
             old);
    wait_sql(pg, sql, 1, 20000);
    t0 = t_now_ms();
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, NULL));
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 3, 10000);
    printf("pickup after the listener was killed: %lld ms\n", (long long)(t_now_ms() - t0));
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST_FULL(work_uses_at_most_three_connections_at_concurrency_64, 120, 0)
{
    PGconn *pg = t_pg();
    const char *handler = t_script("h.sh", "cat >/dev/null; sleep 0.2; echo '{}'");
    long long most = 0;

    enqueue_n(400, "default");
    pid_t pid = t_spawn(t_log_path("w"), NULL, "work", "--exec", handler, "--queue", "default:64", NULL);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'running'", 32, 30000);
    for (int i = 0; i < 20; i++) {
        long long n = t_int(pg, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'");
        if (n > most)
            most = n;
        struct timespec pause = {0, 50 * 1000 * 1000};
        nanosleep(&pause, NULL); /* samples spread over a second; nothing waits on them */
    }
    printf("connections held at concurrency 64: %lld\n", most);
    CHECK(most >= 2); /* the measurement sees the worker at all */
    CHECK(most <= 3);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 400, 60000);
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    PQfinish(pg);
}

TEST_FULL(work_survives_a_database_restart, 180, TEST_EXCLUSIVE)
{
    PGconn *pg = t_pg();
    const char *handler = t_script("h.sh", "cat >/dev/null; sleep 0.05; echo '{}'");
    pid_t pids[2];

    enqueue_n(600, "default");
    for (int i = 0; i < 2; i++)
        pids[i] = t_spawn(t_log_path(i ? "w1" : "w0"), NULL, "work", "--exec", handler, "--queue", "default:4",
                          "--lease", "5s", "--timeout", "4s", "--poll", "200ms", NULL);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 50, 60000);
    PQfinish(pg);
    CHECK_INT(t_pg_ctl("restart", "-m", "fast", "-w", "-t", "60", NULL), 0);
    /* The workers reconnect on their own; every job completes and none is lost. */
    PGconn *again = NULL;
    for (int64_t deadline = t_now_ms() + 30000; t_now_ms() < deadline;) {
        again = PQconnectdb(t_conninfo());
        if (PQstatus(again) == CONNECTION_OK)
            break;
        PQfinish(again);
        again = NULL;
        struct timespec pause = {0, 100 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    CHECK(again != NULL);
    wait_sql(again, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 600, 120000);
    for (int i = 0; i < 2; i++)
        kill(pids[i], SIGTERM);
    for (int i = 0; i < 2; i++)
        CHECK_INT(t_wait_exit(pids[i], 30000), 0);
    CHECK_INT(t_int(again, "SELECT count(*) FROM pgjobq.all_jobs WHERE state <> 'completed'"), 0);
    PQfinish(again);
}

TEST_FULL(work_sigterm_without_a_database_gives_up_after_the_shutdown_timeout, 120, TEST_EXCLUSIVE)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    const char *handler = t_script("h.sh", "cat >/dev/null; sleep 1; echo '{}'");
    int64_t id;

    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id));
    pgjobq_client_close(c);
    pid_t pid = t_spawn(t_log_path("w"), NULL, "work", "--exec", handler, "--shutdown-timeout", "2s", NULL);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'running'", 1, 20000);
    PQfinish(pg);
    /* The database goes away while the job runs; then the worker is asked to stop. */
    CHECK_INT(t_pg_ctl("stop", "-m", "fast", "-w", NULL), 0);
    kill(pid, SIGTERM);
    int64_t t0 = t_now_ms();
    int status = t_wait_exit(pid, 30000);
    int64_t took = t_now_ms() - t0;
    CHECK_INT(t_pg_ctl("start", "-w", "-t", "60", NULL), 0);
    if (status != EX_TEMPFAIL)
        t_show_log(t_log_path("w"));
    /* It gave up after its shutdown timeout and said the outcome was not written (75). */
    CHECK_INT(status, EX_TEMPFAIL);
    CHECK_MSG(took < 15000, "it took %lld ms to give up", (long long)took);
    /* The job is still running in the database; its lease will expire and it will run again. */
    pg = t_pg();
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'running'", (long long)id), 1);
    PQfinish(pg);
}

TEST_FULL(worker_api_a_slow_job_does_not_hold_back_fast_ones, 60, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    run_arg r;
    pthread_t th;

    /* 300 instant jobs teach the worker that this queue's handlers are fast: it then runs batches on
     * few threads. */
    add_jobs(c, "ok", 300, 0);
    o.lease_ms = 10000;
    o.poll_ms = 100;
    CHECK(pgjobq_worker_new(&w, t_conninfo(), &o) == PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(w, "default", NULL, 4, outcome_handler, NULL) == PGJOBQ_OK);
    r.w = w;
    CHECK(pthread_create(&th, NULL, run_thread, &r) == 0);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 300, 30000);

    /* Then one batch: a long job first (lowest priority value), three instant ones behind it. */
    pgjobq_job_spec specs[4];
    memset(specs, 0, sizeof specs);
    specs[0].opts.kind = "long";
    specs[0].opts.priority = -10;
    for (int i = 1; i < 4; i++) {
        specs[i].opts.kind = "ok";
        specs[i].payload = "{\"n\": 1}";
    }
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, 4, NULL, NULL));
    /* The instant ones finish while the long one still runs: another thread took them. */
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 303, 3000);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE kind = 'long' AND state = 'running'"), 1);
    pgjobq_worker_stop(w);
    pgjobq_worker_stop(w); /* fast: the long job is handed back */
    pthread_join(th, NULL);
    pgjobq_worker_free(w);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* ------------------------------------------------------------------------------------------------ */
/* Claiming ahead, and the claim's start key                                                          */

/* The most jobs the database shows running at once, sampled until cond_sql reaches cond_want. */
static long long most_running_until(PGconn *pg, const char *done_sql, long long done_want, int timeout_ms)
{
    long long most = 0;
    for (int64_t deadline = t_now_ms() + timeout_ms;;) {
        long long n = t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'running'");
        if (n > most)
            most = n;
        if (t_int(pg, "%s", done_sql) >= done_want)
            return most;
        CHECK_MSG(t_now_ms() < deadline, "after %d ms, %s is below %lld", timeout_ms, done_sql, done_want);
    }
}

TEST_FULL(worker_api_claims_ahead_only_for_fast_handlers_and_hands_unstarted_jobs_back, 120, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    pgjobq_worker_stats st;
    run_arg r;
    pthread_t th;
    long long most;

    /* Handlers of 30 ms (longer than the 20 ms a claimed job may wait for a thread): the worker claims
     * only for free threads.  A job the database shows running beyond the two threads is one finished
     * but not yet written. */
    add_batch(c, "nap", 40, 30, 0);
    o.lease_ms = 20000;
    o.batch_max = 50;
    o.poll_ms = 50;
    CHECK(pgjobq_worker_new(&w, t_conninfo(), &o) == PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(w, "default", NULL, 2, outcome_handler, NULL) == PGJOBQ_OK);
    r.w = w;
    CHECK(pthread_create(&th, NULL, run_thread, &r) == 0);
    most = most_running_until(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 40, 60000);
    printf("slow handlers, 2 threads: at most %lld jobs running in the database\n", most);
    CHECK(most >= 1);
    CHECK(most <= 2 * 2);

    /* Instant handlers: the worker learns they are fast, and claims whole batches ahead of them. */
    add_batch(c, "ok", 2000, 1, 0);
    most = most_running_until(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 2040, 60000);
    printf("instant handlers, 2 threads: at most %lld jobs running in the database\n", most);
    CHECK(most <= 2 * (2 + o.batch_max));

    /* Then jobs that hold both threads until the worker stops: the ones claimed ahead wait, unstarted.
     * Both handlers must have started before the stop requests: a claimed job the database shows
     * running may still sit in the worker's queue, and one not started is not running at the stop. */
    int long_before = atomic_load(&long_started);
    add_batch(c, "long", 200, 0, 0);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'running'", 3, 20000);
    for (int64_t deadline = t_now_ms() + 20000; atomic_load(&long_started) - long_before < 2;) {
        struct timespec pause = {0, 2 * 1000 * 1000};
        CHECK_MSG(t_now_ms() < deadline, "after 20 s, %d of the two long handlers started",
                  atomic_load(&long_started) - long_before);
        nanosleep(&pause, NULL);
    }
    most = t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'running'");
    printf("two handlers blocked: %lld jobs claimed\n", most);
    CHECK(most <= 2 + o.batch_max);
    pgjobq_worker_stop(w);
    pgjobq_worker_stop(w); /* now: the two running jobs are handed back too */
    pthread_join(th, NULL);
    CHECK_MSG(r.rc == PGJOBQ_ETIMEOUT, "run: %s", pgjobq_worker_errmsg(w));
    pgjobq_worker_get_stats(w, &st);
    CHECK_INT(st.lost, 0);
    CHECK(st.released >= most);
    pgjobq_worker_free(w);
    /* All handed back: queued, none running, the unstarted ones without a spent attempt. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE kind = 'long' AND state = 'queued'"), 200);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state <> 'queued'"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE attempt <> 0"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'"), 2040);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST_FULL(worker_api_a_higher_priority_job_overtakes_a_backlog, 120, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    run_arg r;
    pthread_t th;
    int64_t id;

    /* 10,000 jobs of 1 ms on 4 threads: at least 2.5 s of work.  Once the backlog is under way the
     * worker claims after the largest key it has seen, which a new job of higher priority sorts
     * before: it must still go back to the head of the queue. */
    add_batch(c, "nap", 10000, 1, 0);
    o.lease_ms = 30000;
    o.batch_max = 200;
    CHECK(pgjobq_worker_new(&w, t_conninfo(), &o) == PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(w, "default", NULL, 4, outcome_handler, NULL) == PGJOBQ_OK);
    r.w = w;
    CHECK(pthread_create(&th, NULL, run_thread, &r) == 0);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 1000, 60000);
    pgjobq_enqueue_opts eo = PGJOBQ_ENQUEUE_OPTS_INIT;
    eo.kind = "ok";
    eo.priority = -10;
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 7}", &eo, &id));
    char sql[200];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'completed'",
             (long long)id);
    wait_sql(pg, sql, 1, 60000);
    long long left = t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE kind = 'nap' AND state = 'queued'");
    printf("the high-priority job finished with %lld of the backlog still queued\n", left);
    /* It did not wait for the backlog: most of it was still queued. */
    CHECK(left >= 2000);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 10001, 60000);
    pgjobq_worker_stop(w);
    pthread_join(th, NULL);
    CHECK_INT(r.rc, PGJOBQ_OK);
    pgjobq_worker_free(w);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* ------------------------------------------------------------------------------------------------ */
/* A connection that hangs while connecting                                                           */

/* A forwarding proxy on a Unix socket in front of the test server's socket.  While black_hole is set,
 * new connections are accepted and then ignored (a server that never answers); connections made
 * before keep forwarding. */
typedef struct proxy {
    int lfd;
    char target[108];
    _Atomic int black_hole, stop, swallowed;
    pthread_t th;
} proxy;

#define PROXY_PAIRS 16

static int unix_socket(const char *path, int listening)
{
    struct sockaddr_un sa;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    CHECK(strlen(path) < sizeof sa.sun_path);
    strcpy(sa.sun_path, path);
    if (listening) {
        CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
        CHECK(listen(fd, 16) == 0);
    } else if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Copies what one end has to the other; returns 0 when the pair should close. */
static int forward(int from, int to)
{
    char buf[65536];
    ssize_t n = read(from, buf, sizeof buf);
    if (n <= 0)
        return 0;
    for (ssize_t off = 0; off < n;) {
        ssize_t m = write(to, buf + off, (size_t)(n - off));
        if (m <= 0)
            return 0;
        off += m;
    }
    return 1;
}

static void *proxy_thread(void *arg)
{
    proxy *p = arg;
    int pairs[PROXY_PAIRS][2], npairs = 0, held[PROXY_PAIRS], nheld = 0;

    while (!atomic_load(&p->stop)) {
        struct pollfd pfd[1 + 2 * PROXY_PAIRS];
        pfd[0] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
        for (int i = 0; i < npairs; i++) {
            pfd[1 + 2 * i] = (struct pollfd){.fd = pairs[i][0], .events = POLLIN};
            pfd[2 + 2 * i] = (struct pollfd){.fd = pairs[i][1], .events = POLLIN};
        }
        if (poll(pfd, (nfds_t)(1 + 2 * npairs), 20) < 0)
            continue;
        for (int i = npairs - 1; i >= 0; i--) {
            int ok = 1;
            if (pfd[1 + 2 * i].revents)
                ok = forward(pairs[i][0], pairs[i][1]);
            if (ok && pfd[2 + 2 * i].revents)
                ok = forward(pairs[i][1], pairs[i][0]);
            if (!ok) {
                close(pairs[i][0]);
                close(pairs[i][1]);
                memcpy(pairs[i], pairs[--npairs], sizeof pairs[i]);
            }
        }
        if (pfd[0].revents & POLLIN) {
            int cfd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC), sfd;
            if (cfd < 0)
                continue;
            if (atomic_load(&p->black_hole) && nheld < PROXY_PAIRS) {
                held[nheld++] = cfd;
                atomic_fetch_add(&p->swallowed, 1);
            } else if (npairs < PROXY_PAIRS && (sfd = unix_socket(p->target, 0)) >= 0) {
                pairs[npairs][0] = cfd;
                pairs[npairs++][1] = sfd;
            } else {
                close(cfd);
            }
        }
    }
    for (int i = 0; i < npairs; i++) {
        close(pairs[i][0]);
        close(pairs[i][1]);
    }
    for (int i = 0; i < nheld; i++)
        close(held[i]);
    return NULL;
}

static void print_log(void *arg, pgjobq_log_level level, const char *msg)
{
    (void)arg;
    printf("%lld worker %s: %s\n", (long long)t_now_ms(), pgjobq_log_level_name(level), msg);
}

TEST_FULL(worker_heartbeats_go_on_while_a_reconnect_hangs, 120, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    pgjobq_worker_stats st;
    static proxy p;
    run_arg r;
    pthread_t th;
    int64_t id;
    char path[200], conninfo[400], sql[300];

    /* The worker reaches the server through the proxy: host is the proxy's directory, same port. */
    snprintf(p.target, sizeof p.target, "%s/.s.PGSQL.5432", getenv("PGJOBQ_TEST_SOCKDIR"));
    snprintf(path, sizeof path, "%s/.s.PGSQL.5432", t_tmpdir());
    p.lfd = unix_socket(path, 1);
    CHECK(pthread_create(&p.th, NULL, proxy_thread, &p) == 0);
    snprintf(conninfo, sizeof conninfo, "host=%s port=5432 user=postgres dbname=%s", t_tmpdir(), t_dbname());

    pgjobq_enqueue_opts eo = PGJOBQ_ENQUEUE_OPTS_INIT;
    eo.kind = "long";
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &eo, &id));
    o.lease_ms = 10000;
    o.heartbeat_ms = 200;
    o.timeout_ms = 9500;
    o.poll_ms = 100;
    o.log_fn = print_log;
    CHECK(pgjobq_worker_new(&w, conninfo, &o) == PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(w, "default", NULL, 2, outcome_handler, NULL) == PGJOBQ_OK);
    r.w = w;
    CHECK(pthread_create(&th, NULL, run_thread, &r) == 0);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'running'", 1, 20000);
    long long token = t_int(pg, "SELECT lease_token FROM pgjobq.jobs WHERE id = %lld", (long long)id);

    /* New connections now hang; the claim connection is killed, and its reconnect hangs. */
    atomic_store(&p.black_hole, 1);
    int claim_pid = listener_pid(pg);
    CHECK(claim_pid > 0);
    PQclear(t_exec(pg, "SELECT pg_terminate_backend(%d)", claim_pid));
    int64_t t0 = t_now_ms();
    while (atomic_load(&p.swallowed) == 0) {
        CHECK_MSG(t_now_ms() - t0 < 20000, "the worker did not try to reconnect");
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    /* Heartbeats go out on the write connection meanwhile: every 200 ms the lease is renewed to 10 s
     * from then, so it never has less than 8 s left (it would within 2 s of a stall).  The reconnect
     * hangs for 10 s (libpq's default connect timeout, which the worker applies itself); 4 s of it are
     * watched, well before the job's 9.5 s timeout. */
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'running' AND lease_token = %lld"
             " AND lease_until > now() + interval '8 seconds'",
             (long long)id, token);
    long long renewed = 0;
    for (t0 = t_now_ms(); t_now_ms() - t0 < 4000;) {
        CHECK_MSG(t_int(pg, "%s", sql) == 1, "the job lost its lease while a reconnect hung (after %lld ms): %s",
                  (long long)(t_now_ms() - t0),
                  t_str(pg, "SELECT format('%%s %%s %%s', state, lease_token, lease_until - now()) FROM pgjobq.jobs"
                            " WHERE id = %lld", (long long)id));
        renewed++;
        struct timespec pause = {0, 50 * 1000 * 1000};
        nanosleep(&pause, NULL); /* samples spread over the period; nothing waits on them */
    }
    CHECK(renewed > 0);
    printf("the lease was renewed for 4 s while %d connection attempt(s) hung\n", (int)atomic_load(&p.swallowed));

    /* The server answers again: the worker reconnects and claims again. */
    atomic_store(&p.black_hole, 0);
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 1}", NULL, NULL));
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'completed'", 1, 30000);
    pgjobq_worker_stop(w);
    pgjobq_worker_stop(w);
    pthread_join(th, NULL);
    /* The long job was handed back, or had reached its timeout and waits for a retry. */
    CHECK_MSG(r.rc == PGJOBQ_OK || r.rc == PGJOBQ_ETIMEOUT, "run: %s", pgjobq_worker_errmsg(w));
    pgjobq_worker_get_stats(w, &st);
    CHECK_INT(st.lost, 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued'", (long long)id), 1);
    pgjobq_worker_free(w);
    atomic_store(&p.stop, 1);
    pthread_join(p.th, NULL);
    close(p.lfd);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(worker_api_stop_before_run_returns_estopped_and_does_nothing)
{
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();

    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, NULL));
    CHECK_RC(NULL, pgjobq_worker_new(&w, t_conninfo(), &o), PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(w, "default", NULL, 2, outcome_handler, NULL) == PGJOBQ_OK);
    pgjobq_worker_stop(w);
    CHECK_INT(pgjobq_worker_run(w), PGJOBQ_ESTOPPED);
    CHECK(strstr(pgjobq_worker_errmsg(w), "before the worker ran") != NULL);
    CHECK_INT(pgjobq_worker_connections(w), 0);
    pgjobq_worker_free(w);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'queued'"), 1);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* Mistakes named at start (a concurrency that is not a number, a handler that cannot be run), the
 * queues served in the start line, and failed attempts in the log: every job that failed for good,
 * and retried attempts at most 10 lines per 10 s. */
TEST_FULL(work_names_bad_handlers_and_logs_failed_attempts, 120, 0)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    char *out, *err;

    CHECK_INT(t_cli(&out, &err, NULL, 0, "work", "--queue", "mail:abc", "--exec", "/bin/true", NULL), 64);
    CHECK_MSG(strstr(err, "mail:abc") && strstr(err, "must be a number"), "stderr: %s", err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "work", "--queue", "mail:-3", "--exec", "/bin/true", NULL), 64);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "work", "--exec", "./does-not-exist", NULL), 64);
    CHECK_MSG(strstr(err, "./does-not-exist is not an executable file"), "stderr: %s", err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "work", "--coproc", "no-such-program-anywhere --flag", NULL), 64);
    CHECK_MSG(strstr(err, "no-such-program-anywhere is not an executable file on PATH"), "stderr: %s", err);
    free(out);
    free(err);

    const char *handler = t_script("fails.sh", "cat >/dev/null\necho \"boom $PGJOBQ_JOB_ID\" >&2\nexit 3\n");
    o.queue = "flog";
    o.max_attempts = 1;
    for (int i = 0; i < 25; i++)
        CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, NULL));
    o.max_attempts = 3;
    for (int i = 0; i < 15; i++)
        CHECK_OK(c, pgjobq_enqueue(c, "{\"again\": true}", &o, NULL));
    const char *log = t_log_path("flog");
    pid_t pid = t_spawn(log, NULL, "work", "--queue", "flog:4", "--exec", handler, "--poll", "100ms", NULL);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'flog' AND state = 'failed'", 25, 60000);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'flog' AND max_attempts = 3 AND last_error LIKE '%boom%'",
             15, 60000);
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);

    FILE *f = fopen(log, "r");
    char line[2048];
    int started = 0, for_good = 0, retried = 0;
    CHECK(f != NULL);
    while (fgets(line, sizeof line, f)) {
        started += strstr(line, "started: queue flog:4,") != NULL;
        for_good += strstr(line, "(flog/default) attempt 1 of 1 failed for good:") != NULL && strstr(line, "boom") != NULL;
        retried += strstr(line, "of 3 failed, will retry:") != NULL && strstr(line, "boom") != NULL;
    }
    fclose(f);
    if (started != 1 || for_good != 25 || retried < 1 || retried > 10)
        t_show_log(log);
    CHECK_INT(started, 1);
    CHECK_INT(for_good, 25);
    CHECK_MSG(retried >= 1 && retried <= 10, "%d lines about retried attempts (1 to 10 expected)", retried);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* Handlers that return PENDING: a separate thread ends the jobs of two queues, those it holds together
 * with pgjobq_ctx_finish_many (complete, retry), and a job that times out while pending with
 * pgjobq_ctx_finish when it sees pgjobq_ctx_should_stop.  The handler threads are free meanwhile: 8 + 4
 * slots, 250 jobs, at the finisher at most as many as the slots.  Every other turn the finisher uses
 * pgjobq_ctx_finish_many_and_run, which starts the jobs waiting for the freed slots on its own thread:
 * the handler counts the jobs it sees started there. */
typedef struct finisher {
    pthread_mutex_t mu;
    pgjobq_ctx *held[64];
    int n;
    _Atomic int quit;
    _Atomic int max_held;
    pthread_t thread;
    _Atomic int started_here; /* handler calls on the finisher's thread */
    _Atomic int said_started; /* what pgjobq_ctx_finish_many_and_run returned, summed */
} finisher;

static pgjobq_outcome pending_handler(pgjobq_ctx *ctx, void *arg)
{
    finisher *f = arg;
    if (pthread_equal(pthread_self(), f->thread))
        atomic_fetch_add(&f->started_here, 1);
    pthread_mutex_lock(&f->mu);
    if (f->n == 64) {
        pthread_mutex_unlock(&f->mu);
        pgjobq_ctx_set_error(ctx, "finisher full");
        return PGJOBQ_OUTCOME_RETRY;
    }
    f->held[f->n++] = ctx;
    if (f->n > atomic_load(&f->max_held))
        atomic_store(&f->max_held, f->n);
    pthread_mutex_unlock(&f->mu);
    return PGJOBQ_OUTCOME_PENDING;
}

static void *finisher_thread(void *arg)
{
    finisher *f = arg;
    for (int turn = 0; !atomic_load(&f->quit); turn++) {
        pgjobq_ctx *ready[64];
        int n = 0;
        pthread_mutex_lock(&f->mu);
        for (int i = 0; i < f->n;) {
            const pgjobq_job *j = pgjobq_ctx_job(f->held[i]);
            /* "hang" jobs are held until they must stop; the others end now. */
            if (strcmp(j->kind, "hang") != 0 || pgjobq_ctx_should_stop(f->held[i])) {
                ready[n++] = f->held[i];
                f->held[i] = f->held[--f->n];
            } else {
                i++;
            }
        }
        pthread_mutex_unlock(&f->mu);
        /* The others end together, with pgjobq_ctx_finish_many (a NULL entry is skipped). */
        pgjobq_ctx *many[65];
        pgjobq_outcome outcome[65], pending[65];
        int m = 0;
        many[m] = NULL;
        outcome[m] = pending[m] = PGJOBQ_OUTCOME_COMPLETE;
        m++;
        for (int i = 0; i < n; i++) {
            const pgjobq_job *j = pgjobq_ctx_job(ready[i]);
            if (strcmp(j->kind, "hang") == 0) {
                pgjobq_ctx_set_error(ready[i], pgjobq_ctx_stop_reason(ready[i]) == PGJOBQ_STOP_TIMEOUT ? "gave up: timeout"
                                                                                                   : "gave up");
                pgjobq_ctx_finish(ready[i], PGJOBQ_OUTCOME_FAIL);
                continue;
            }
            many[m] = ready[i];
            pending[m] = PGJOBQ_OUTCOME_PENDING;
            if (strcmp(j->kind, "flaky") == 0 && j->attempt == 1) {
                pgjobq_ctx_set_error(ready[i], "first attempt fails");
                pgjobq_ctx_set_retry_delay(ready[i], 0);
                outcome[m++] = PGJOBQ_OUTCOME_RETRY;
            } else {
                char result[64];
                snprintf(result, sizeof result, "{\"id\": %lld}", (long long)j->id);
                CHECK_OK(NULL, pgjobq_ctx_set_result(ready[i], result));
                outcome[m++] = PGJOBQ_OUTCOME_COMPLETE;
            }
        }
        /* PENDING as the outcome ends nothing; the real finish follows.  (A second finish would touch a
         * ctx the worker may have freed: the contract is exactly once.) */
        pgjobq_ctx_finish_many(many, pending, (size_t)m);
        if (turn % 2)
            atomic_fetch_add(&f->said_started, (int)pgjobq_ctx_finish_many_and_run(many, outcome, (size_t)m, (size_t)m));
        else
            pgjobq_ctx_finish_many(many, outcome, (size_t)m);
        struct timespec ts = {0, 2 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

TEST_FULL(worker_api_pending_handlers_are_finished_from_another_thread, 90, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_enqueue_opts eo = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_worker *w = NULL;
    finisher f;
    pthread_t th, fin;
    run_arg r;

    memset(&f, 0, sizeof f);
    pthread_mutex_init(&f.mu, NULL);
    eo.queue = "async";
    eo.kind = "ok";
    for (int i = 0; i < 150; i++)
        CHECK_OK(c, pgjobq_enqueue(c, "{}", &eo, NULL));
    eo.kind = "flaky";
    for (int i = 0; i < 50; i++)
        CHECK_OK(c, pgjobq_enqueue(c, "{}", &eo, NULL));
    eo.queue = "async2";
    eo.kind = "ok";
    for (int i = 0; i < 50; i++)
        CHECK_OK(c, pgjobq_enqueue(c, "{}", &eo, NULL));
    eo.queue = "async";
    eo.kind = "hang";
    eo.max_attempts = 1;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &eo, NULL));
    o.lease_ms = 4000;
    o.timeout_ms = 1000;
    o.poll_ms = 100;
    CHECK(pgjobq_worker_new(&w, t_conninfo(), &o) == PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(w, "async", NULL, 8, pending_handler, &f) == PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(w, "async2", NULL, 4, pending_handler, &f) == PGJOBQ_OK);
    pthread_mutex_lock(&f.mu); /* f.thread is set before the finisher starts a handler */
    CHECK(pthread_create(&fin, NULL, finisher_thread, &f) == 0);
    f.thread = fin;
    pthread_mutex_unlock(&f.mu);
    r.w = w;
    CHECK(pthread_create(&th, NULL, run_thread, &r) == 0);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue IN ('async', 'async2') AND state = 'completed'", 250,
             60000);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'async' AND state = 'failed'"
                 " AND last_error = 'gave up: timeout'",
             1, 30000);
    pgjobq_worker_stop(w);
    pthread_join(th, NULL);
    atomic_store(&f.quit, 1);
    pthread_join(fin, NULL);
    CHECK_INT(r.rc, PGJOBQ_OK);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'async' AND kind = 'flaky'"
                        " AND state = 'completed' AND attempt = 2"),
              50);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue IN ('async', 'async2') AND state = 'completed'"
                        " AND result ->> 'id' = id::text"),
              250);
    /* At most the slots were ever pending at once (a pending job keeps its slot). */
    CHECK_MSG(atomic_load(&f.max_held) <= 12, "%d jobs were pending at once with 8 + 4 slots", atomic_load(&f.max_held));
    /* The finisher started jobs itself (more are claimed than the slots: they wait), as many as it said. */
    CHECK_MSG(atomic_load(&f.started_here) > 0, "no job was started by pgjobq_ctx_finish_many_and_run");
    CHECK_INT(atomic_load(&f.said_started), atomic_load(&f.started_here));
    pgjobq_worker_stats st;
    pgjobq_worker_get_stats(w, &st);
    CHECK_INT(st.running, 0);
    pgjobq_worker_free(w);
    pthread_mutex_destroy(&f.mu);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* A handler that reports progress twice: the first value while it waits for the test to see it in the
 * database, the second just before it completes the job. */
static _Atomic int progress_seen;
static _Atomic int progress_refused;

static pgjobq_outcome progress_handler(pgjobq_ctx *ctx, void *arg)
{
    (void)arg;
    char big[PGJOBQ_PROGRESS_MAX + 16];
    memset(big, ' ', sizeof big - 1);
    memcpy(big, "\"x\"", 3);
    big[sizeof big - 1] = '\0'; /* valid JSON, one byte too many at least */
    int bad = pgjobq_ctx_set_progress(ctx, "{\"done\": ") == PGJOBQ_EINVAL &&
              pgjobq_ctx_set_progress(ctx, big) == PGJOBQ_EINVAL && pgjobq_ctx_set_progress(ctx, NULL) == PGJOBQ_EINVAL;
    atomic_store(&progress_refused, bad);
    if (pgjobq_ctx_set_progress(ctx, "{\"done\": 1, \"of\": 2}") != PGJOBQ_OK)
        return PGJOBQ_OUTCOME_FAIL;
    for (int i = 0; i < 2000 && !atomic_load(&progress_seen) && !pgjobq_ctx_should_stop(ctx); i++)
        usleep(10000);
    if (pgjobq_ctx_set_progress(ctx, "{\"done\": 2, \"of\": 2}") != PGJOBQ_OK)
        return PGJOBQ_OUTCOME_FAIL;
    return atomic_load(&progress_seen) ? PGJOBQ_OUTCOME_COMPLETE : PGJOBQ_OUTCOME_FAIL;
}

TEST_FULL(worker_api_writes_the_progress_handlers_report, 60, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_enqueue_opts eo = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_worker *w = NULL;
    run_arg r;
    pthread_t th;
    int64_t id;
    char sql[256];

    eo.queue = "progress";
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &eo, &id));
    o.lease_ms = 60000; /* the heartbeat (20 s) is not what writes it */
    CHECK(pgjobq_worker_new(&w, t_conninfo(), &o) == PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(w, "progress", NULL, 1, progress_handler, NULL) == PGJOBQ_OK);
    r.w = w;
    CHECK(pthread_create(&th, NULL, run_thread, &r) == 0);
    /* Written while the job runs, by the worker alone. */
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'running'"
             " AND progress = '{\"done\": 1, \"of\": 2}'",
             (long long)id);
    wait_sql(pg, sql, 1, 15000);
    atomic_store(&progress_seen, 1);
    /* The value set just before the job ended is written before its completion, and stays with it. */
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'completed'", (long long)id);
    wait_sql(pg, sql, 1, 15000);
    char *p = t_str(pg, "SELECT progress::text FROM pgjobq.history WHERE id = %lld", (long long)id);
    CHECK_STR(p, "{\"of\": 2, \"done\": 2}");
    free(p);
    CHECK(atomic_load(&progress_refused)); /* bad JSON, too long, NULL: refused, the job went on */
    pgjobq_worker_stop(w);
    pthread_join(th, NULL);
    CHECK_INT(r.rc, PGJOBQ_OK);
    pgjobq_worker_free(w);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* pgjobq_worker_opts.log_level: the records below it never reach log_fn (the job's debug records are
 * not even formatted); 0 gives every record. */
static _Atomic int log_counts[4];

static void count_log(void *arg, pgjobq_log_level level, const char *msg)
{
    (void)arg;
    (void)msg;
    if ((int)level >= 0 && (int)level < 4)
        atomic_fetch_add(&log_counts[level], 1);
}

TEST_FULL(worker_api_log_level_keeps_records_below_it_from_the_callback, 60, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_enqueue_opts eo = PGJOBQ_ENQUEUE_OPTS_INIT;

    /* A level that is none: refused, not a worker that logs nothing. */
    {
        pgjobq_worker_opts bad = PGJOBQ_WORKER_OPTS_INIT;
        pgjobq_worker *w = NULL;
        bad.log_fn = count_log;
        bad.log_level = PGJOBQ_LOG_ERROR + 1;
        CHECK_INT(pgjobq_worker_new(&w, t_conninfo(), &bad), PGJOBQ_EINVAL);
        CHECK_MSG(strstr(pgjobq_worker_errmsg(w), "log level") != NULL, "%s", pgjobq_worker_errmsg(w));
        pgjobq_worker_free(w);
    }
    eo.queue = "loglevel";
    eo.kind = "ok";
    for (int level = PGJOBQ_LOG_INFO; level >= PGJOBQ_LOG_DEBUG; level--) {
        pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
        pgjobq_worker *w = NULL;
        run_arg r;
        pthread_t th;

        for (int i = 0; i < 4; i++)
            atomic_store(&log_counts[i], 0);
        for (int i = 0; i < 3; i++)
            CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 1}", &eo, NULL));
        o.poll_ms = 100;
        o.log_fn = count_log;
        o.log_level = level;
        CHECK(pgjobq_worker_new(&w, t_conninfo(), &o) == PGJOBQ_OK);
        CHECK(pgjobq_worker_handle(w, "loglevel", NULL, 2, outcome_handler, NULL) == PGJOBQ_OK);
        r.w = w;
        CHECK(pthread_create(&th, NULL, run_thread, &r) == 0);
        wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'loglevel' AND state = 'completed'",
                 level == PGJOBQ_LOG_INFO ? 3 : 6, 30000);
        pgjobq_worker_stop(w);
        pthread_join(th, NULL);
        CHECK_INT(r.rc, PGJOBQ_OK);
        pgjobq_worker_free(w);
        /* "worker ... started" and "stopped" are info; each job "starting" and "finished" are debug. */
        CHECK_MSG(atomic_load(&log_counts[PGJOBQ_LOG_INFO]) >= 2, "%d info records at level %d",
                  atomic_load(&log_counts[PGJOBQ_LOG_INFO]), level);
        if (level == PGJOBQ_LOG_INFO)
            CHECK_INT(atomic_load(&log_counts[PGJOBQ_LOG_DEBUG]), 0);
        else
            CHECK_MSG(atomic_load(&log_counts[PGJOBQ_LOG_DEBUG]) >= 6, "%d debug records for 3 jobs",
                      atomic_load(&log_counts[PGJOBQ_LOG_DEBUG]));
    }
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* A batch of outcomes the database refuses one row of: the handlers of the jobs n < 8 wait for one
 * another, so that their outcomes (and their progress) reach the engine together and are written in
 * the same statements; four of them give what PostgreSQL refuses and the C checks let through: a
 * number beyond numeric's range, a result a CHECK of the user's refuses, a retry delay past the
 * table's range, a progress value beyond numeric's range. */
#define LONG_TEXT "a result longer than the 100 bytes the CHECK constraint of the test allows in history"
static _Atomic int refusal_gate;
static char refused_error[512]; /* what n = 3's second attempt was told of its first */

static pgjobq_outcome refusing_handler(pgjobq_ctx *ctx, void *arg)
{
    const pgjobq_job *j = pgjobq_ctx_job(ctx);
    int n = atoi(strchr(j->payload, ':') + 1);
    char value[64];
    (void)arg;
    snprintf(value, sizeof value, "{\"n\": %d}", n);
    if (pgjobq_ctx_set_progress(ctx, n == 4 ? "{\"p\": 1e1000000}" : value) != PGJOBQ_OK ||
        pgjobq_ctx_set_result(ctx, value) != PGJOBQ_OK)
        return PGJOBQ_OUTCOME_FAIL;
    if (n < 8 && j->attempt == 1) {
        atomic_fetch_add(&refusal_gate, 1);
        for (int i = 0; i < 2000 && atomic_load(&refusal_gate) < 8 && !pgjobq_ctx_should_stop(ctx); i++)
            usleep(10000);
    }
    if (n == 1 && pgjobq_ctx_set_result(ctx, "{\"n\": 1e1000000}") != PGJOBQ_OK) /* beyond numeric */
        return PGJOBQ_OUTCOME_FAIL;
    if (n == 2 && pgjobq_ctx_set_result(ctx, "{\"s\": \"" LONG_TEXT LONG_TEXT "\"}") != PGJOBQ_OK) /* the CHECK below */
        return PGJOBQ_OUTCOME_FAIL;
    if (n == 3) {
        if (j->attempt == 2 && j->last_error)
            snprintf(refused_error, sizeof refused_error, "%s", j->last_error);
        pgjobq_ctx_set_error(ctx, "see you in a long while");
        pgjobq_ctx_set_retry_delay(ctx, INT64_MAX); /* a run_at past the table's range */
        return PGJOBQ_OUTCOME_RETRY;
    }
    if (n == 5 && j->attempt == 1) {
        pgjobq_ctx_set_error(ctx, "an innocent retry");
        pgjobq_ctx_set_retry_delay(ctx, 0);
        return PGJOBQ_OUTCOME_RETRY;
    }
    return PGJOBQ_OUTCOME_COMPLETE;
}

TEST_FULL(worker_api_an_outcome_the_database_refuses_costs_its_batch_mates_nothing, 120, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    pgjobq_worker_stats st;
    run_arg r;
    pthread_t th;

    /* 400 jobs, n = 0..399; the refused results (1, 2) have one attempt, the refused retry (3) two,
     * the others three. */
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(array_fill('rf'::text, ARRAY[400]), NULL,"
                       " (SELECT array_agg(jsonb_build_object('n', i) ORDER BY i) FROM generate_series(0, 399) i),"
                       " max_attempts => (SELECT array_agg(CASE i WHEN 1 THEN 1 WHEN 2 THEN 1 WHEN 3 THEN 2 ELSE 3 END ORDER BY i)"
                       "                    FROM generate_series(0, 399) i))"));
    /* Something else PostgreSQL refuses: a constraint of the user's, on history. */
    PQclear(t_exec(pg, "ALTER TABLE pgjobq.history ADD CONSTRAINT results_under_100_bytes"
                       " CHECK (octet_length(result::text) < 100)"));
    o.lease_ms = 20000;
    o.worker_id = "refusals";
    CHECK(pgjobq_worker_new(&w, t_conninfo(), &o) == PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(w, "rf", NULL, 16, refusing_handler, NULL) == PGJOBQ_OK);
    r.w = w;
    CHECK(pthread_create(&th, NULL, run_thread, &r) == 0);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'rf'", 400, 60000);
    pgjobq_worker_stop(w);
    pthread_join(th, NULL);
    CHECK_MSG(r.rc == PGJOBQ_OK, "run: %s", pgjobq_worker_errmsg(w));
    pgjobq_worker_get_stats(w, &st);
    CHECK_INT(st.lost, 0);
    CHECK_INT(st.failed, 3);
    pgjobq_worker_free(w);

    /* Every other job completed on its first attempt (n = 5 on its second, as it asked), with its
     * result; every job kept its progress, the refused failures too, but n = 4's refused one. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'rf' AND state = 'completed'"
                        " AND result = jsonb_build_object('n', (payload->>'n')::int)"
                        " AND attempt = CASE WHEN payload->>'n' = '5' THEN 2 ELSE 1 END"),
              397);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'rf' AND progress = payload"), 399);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'rf' AND payload->>'n' = '4'"
                        " AND state = 'completed' AND progress IS NULL"),
              1);
    /* Each refused job alone failed its attempt, saying why. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'rf' AND payload->>'n' = '1'"
                        " AND state = 'failed' AND attempt = 1 AND result IS NULL"
                        " AND last_error = 'result not storable: value overflows numeric format'"),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'rf' AND payload->>'n' = '2'"
                        " AND state = 'failed' AND last_error LIKE 'result not storable: new row for relation%%"
                        "violates check constraint \"results_under_100_bytes\"%%'"),
              1);
    /* The refused retry delay: a failed attempt retried after the backoff, which said why. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'rf' AND payload->>'n' = '3'"
                        " AND state = 'failed' AND attempt = 2 AND last_error = 'see you in a long while'"),
              1);
    CHECK_MSG(strncmp(refused_error, "outcome not storable: timestamp out of range", 44) == 0 &&
                  strstr(refused_error, "; the handler's error: see you in a long while") != NULL,
              "the second attempt was told: %s", refused_error);
    PQfinish(pg);
    pgjobq_client_close(c);
}
