/*
 * test_steps.c - durable execution (docs/durable.md): steps stored once, fenced by the lease, and
 * read by later attempts; a late holder's step refused with its effects; steps that go with their
 * job; durable sleeps and waits for events that park a job and resume it.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

static pgjobq_job *claim_one(pgjobq_client *c, const char *queue)
{
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    CHECK_OK(c, pgjobq_claim(c, queue, 1, 60000, "w", &jobs, &n));
    CHECK_INT(n, 1);
    return jobs;
}

static int64_t enqueue_one(pgjobq_client *c, const char *queue, const char *kind)
{
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int64_t id;
    o.queue = queue;
    o.kind = kind;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    return id;
}

/* Makes a running job's lease expire now (as a worker that stalled past it would see): after the
 * start of any transaction already open, so that a fence that compared the lease with the
 * transaction's now() would still take it as valid. */
static void expire(PGconn *pg, int64_t id)
{
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET lease_until = clock_timestamp() WHERE id = %lld", (long long)id));
}

TEST(steps_are_stored_once_fenced_by_the_lease_and_read_by_later_attempts)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_state st;
    char *got = NULL;

    int64_t id = enqueue_one(c, "s", "k");
    pgjobq_job *j = claim_one(c, "s");
    CHECK_RC(c, pgjobq_step_get(c, id, j->lease_token, "charge", &got), PGJOBQ_ENOTFOUND);
    CHECK(got == NULL);
    CHECK_OK(c, pgjobq_step_put(c, id, j->lease_token, "charge", "{\"charged\": 42}", NULL));
    CHECK_OK(c, pgjobq_step_get(c, id, j->lease_token, "charge", &got));
    CHECK_STR(got, "{\"charged\": 42}");
    pgjobq_free(got);
    /* Stored once: a second store of the step keeps the first, and says so with it. */
    CHECK_RC(c, pgjobq_step_put(c, id, j->lease_token, "charge", "{\"charged\": 43}", &got), PGJOBQ_EDUPLICATE);
    CHECK_STR(got, "{\"charged\": 42}");
    pgjobq_free(got);
    /* A step with no result is JSON null; a bad name or result is refused, nothing stored. */
    CHECK_OK(c, pgjobq_step_put(c, id, j->lease_token, "nothing", NULL, NULL));
    CHECK_OK(c, pgjobq_step_get(c, id, j->lease_token, "nothing", &got));
    CHECK_STR(got, "null");
    pgjobq_free(got);
    CHECK_RC(c, pgjobq_step_put(c, id, j->lease_token, "", "1", NULL), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_step_put(c, id, j->lease_token, "bad", "{nope", NULL), PGJOBQ_EINVAL);
    char *long_name = t_str(pg, "SELECT repeat('n', 256)");
    CHECK_RC(c, pgjobq_step_put(c, id, j->lease_token, long_name, "1", NULL), PGJOBQ_EINVAL);
    free(long_name);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_steps WHERE job_id = %lld", (long long)id), 2);
    /* Another token stores and reads nothing. */
    CHECK_RC(c, pgjobq_step_put(c, id, j->lease_token + 1, "other", "1", NULL), PGJOBQ_ELEASE);
    CHECK_RC(c, pgjobq_step_get(c, id, j->lease_token + 1, "charge", &got), PGJOBQ_ELEASE);

    /* The attempt fails; the next one reads the stored step, and the old token reads nothing. */
    CHECK_OK(c, pgjobq_job_fail(c, id, j->lease_token, "boom", 0, 0, &st));
    CHECK_INT(st, PGJOBQ_QUEUED);
    int64_t old_token = j->lease_token;
    pgjobq_jobs_free(j);
    j = claim_one(c, "s");
    CHECK_INT(j->attempt, 2);
    CHECK_RC(c, pgjobq_step_get(c, id, old_token, "charge", &got), PGJOBQ_ELEASE);
    CHECK_OK(c, pgjobq_step_get(c, id, j->lease_token, "charge", &got));
    CHECK_STR(got, "{\"charged\": 42}");
    pgjobq_free(got);
    CHECK_OK(c, pgjobq_step_put(c, id, j->lease_token, "ship", "\"sent\"", NULL));

    /* What `pgjobq show` lists: name, the attempt that stored it, when, its size. */
    pgjobq_step_info *steps = NULL;
    size_t n = 0;
    CHECK_OK(c, pgjobq_job_steps(c, id, &steps, &n));
    CHECK_INT(n, 3);
    CHECK_STR(steps[0].name, "charge");
    CHECK_INT(steps[0].attempt, 1);
    CHECK_INT(steps[0].result_bytes, (long long)strlen("{\"charged\": 42}"));
    CHECK_STR(steps[2].name, "ship");
    CHECK_INT(steps[2].attempt, 2);
    CHECK(steps[2].stored_at >= steps[0].stored_at);
    pgjobq_steps_free(steps);

    /* The job completes: its steps stay with it in the history. */
    CHECK_OK(c, pgjobq_job_complete(c, id, j->lease_token, NULL));
    CHECK_RC(c, pgjobq_step_put(c, id, j->lease_token, "late", "1", NULL), PGJOBQ_ELEASE);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.steps(%lld)", (long long)id), 3);
    pgjobq_jobs_free(j);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* The race the lease's fence is for: a worker whose lease expired while its step ran (with effects
 * in its transaction), the rescue gave the job to another worker, which runs the step; the late
 * worker's store is refused and its transaction rolled back, effects and all: the effect is there
 * once. */
TEST(steps_a_late_holders_store_is_refused_and_its_effects_rolled_back)
{
    pgjobq_client *a = t_client(), *b = t_client(), *m = t_client();
    PGconn *pg = t_pg();
    int rescued = 0;
    char *got = NULL;

    PQclear(t_exec(pg, "CREATE TABLE ledger (job bigint, who text)"));
    int64_t id = enqueue_one(m, "s", "k");
    pgjobq_job *ja = claim_one(a, "s");

    /* Worker a: its step's effect, in its transaction; then it stalls past its lease. */
    CHECK_OK(a, pgjobq_begin(a));
    PQclear(t_exec(pgjobq_client_conn(a), "INSERT INTO ledger VALUES (%lld, 'a')", (long long)id));
    expire(pg, id);
    CHECK_OK(m, pgjobq_rescue_expired(m, 100, &rescued));
    CHECK_INT(rescued, 1);
    pgjobq_job *jb = claim_one(b, "s");
    CHECK_INT(jb->attempt, 2);

    /* Worker b runs the step, effect and store in one transaction. */
    CHECK_RC(b, pgjobq_step_get(b, id, jb->lease_token, "pay", &got), PGJOBQ_ENOTFOUND);
    CHECK_OK(b, pgjobq_begin(b));
    PQclear(t_exec(pgjobq_client_conn(b), "INSERT INTO ledger VALUES (%lld, 'b')", (long long)id));
    CHECK_OK(b, pgjobq_step_put(b, id, jb->lease_token, "pay", "{\"by\": \"b\"}", NULL));
    CHECK_OK(b, pgjobq_commit(b));

    /* Worker a wakes: its store is refused, it rolls back. */
    CHECK_RC(a, pgjobq_step_put(a, id, ja->lease_token, "pay", "{\"by\": \"a\"}", NULL), PGJOBQ_ELEASE);
    CHECK_OK(a, pgjobq_rollback(a));

    /* Before any rescue too: a lease that passed while the transaction ran (judged when the store
     * runs, not when its transaction began) stores nothing. */
    int64_t id2 = enqueue_one(m, "s2", "k");
    pgjobq_job *j2 = claim_one(a, "s2");
    CHECK_OK(a, pgjobq_begin(a));
    PQclear(t_exec(pgjobq_client_conn(a), "INSERT INTO ledger VALUES (%lld, 'a')", (long long)id2));
    expire(pg, id2);
    CHECK_RC(a, pgjobq_step_put(a, id2, j2->lease_token, "pay", "1", NULL), PGJOBQ_ELEASE);
    CHECK_OK(a, pgjobq_rollback(a));
    pgjobq_jobs_free(j2);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM ledger"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM ledger WHERE who = 'b'"), 1);
    CHECK_OK(b, pgjobq_step_get(b, id, jb->lease_token, "pay", &got));
    CHECK_STR(got, "{\"by\": \"b\"}");
    pgjobq_free(got);
    pgjobq_jobs_free(ja);
    pgjobq_jobs_free(jb);
    PQfinish(pg);
    pgjobq_client_close(a);
    pgjobq_client_close(b);
    pgjobq_client_close(m);
}

/* The other order: a step stored under a valid lease, its transaction still open when the lease
 * passes.  The rescue cannot take the job before that transaction ends (the store locks the job's
 * row), so the next holder finds the step stored and does not run it again. */
TEST(steps_a_store_under_a_valid_lease_holds_the_rescue_until_it_commits)
{
    pgjobq_client *a = t_client(), *b = t_client(), *m = t_client();
    PGconn *pg = t_pg();
    int rescued = -1;
    char *got = NULL;

    PQclear(t_exec(pg, "CREATE TABLE ledger (job bigint, who text)"));
    int64_t id = enqueue_one(m, "s", "k");
    pgjobq_job *ja = claim_one(a, "s");
    CHECK_OK(a, pgjobq_begin(a));
    PQclear(t_exec(pgjobq_client_conn(a), "INSERT INTO ledger VALUES (%lld, 'a')", (long long)id));
    CHECK_OK(a, pgjobq_step_put(a, id, ja->lease_token, "pay", "{\"by\": \"a\"}", NULL));
    expire(pg, id);
    CHECK_OK(m, pgjobq_rescue_expired(m, 100, &rescued));
    CHECK_INT(rescued, 0); /* the row is a's until its transaction ends */
    CHECK_OK(a, pgjobq_commit(a));
    CHECK_OK(m, pgjobq_rescue_expired(m, 100, &rescued));
    CHECK_INT(rescued, 1);
    pgjobq_job *jb = claim_one(b, "s");
    CHECK_OK(b, pgjobq_step_get(b, id, jb->lease_token, "pay", &got));
    CHECK_STR(got, "{\"by\": \"a\"}");
    pgjobq_free(got);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM ledger"), 1);
    pgjobq_jobs_free(ja);
    pgjobq_jobs_free(jb);
    PQfinish(pg);
    pgjobq_client_close(a);
    pgjobq_client_close(b);
    pgjobq_client_close(m);
}

/* A job's steps go when retention prunes it (a failed job row by row, a completed one with its hour's
 * partition); a retry by hand of a completed job starts it over, of a failed one resumes it. */
TEST(steps_go_with_their_job_at_retention_and_a_retry_of_a_completed_job_starts_over)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_state st;
    int deleted = 0;

    int64_t failed = enqueue_one(c, "f", "k");
    pgjobq_job *j = claim_one(c, "f");
    CHECK_OK(c, pgjobq_step_put(c, failed, j->lease_token, "one", "1", NULL));
    CHECK_OK(c, pgjobq_job_fail(c, failed, j->lease_token, "for good", 0, 1, &st));
    CHECK_INT(st, PGJOBQ_FAILED);
    pgjobq_jobs_free(j);

    int64_t done = enqueue_one(c, "d", "k");
    j = claim_one(c, "d");
    CHECK_OK(c, pgjobq_step_put(c, done, j->lease_token, "one", "1", NULL));
    CHECK_OK(c, pgjobq_job_complete(c, done, j->lease_token, NULL));
    pgjobq_jobs_free(j);

    int64_t other = enqueue_one(c, "o", "k");
    j = claim_one(c, "o");
    CHECK_OK(c, pgjobq_step_put(c, other, j->lease_token, "one", "1", NULL));
    CHECK_OK(c, pgjobq_job_complete(c, other, j->lease_token, NULL));
    pgjobq_jobs_free(j);

    /* A retry by hand: the failed job resumes with its step, the completed one starts over. */
    CHECK_OK(c, pgjobq_job_retry(c, failed));
    CHECK_OK(c, pgjobq_job_retry(c, done));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_steps WHERE job_id = %lld", (long long)failed), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_steps WHERE job_id = %lld", (long long)done), 0);
    j = claim_one(c, "f");
    CHECK_OK(c, pgjobq_job_fail(c, failed, j->lease_token, "for good again", 0, 1, &st));
    pgjobq_jobs_free(j);

    /* Retention: the failed job (deleted row by row) and the completed one, moved to a past hour's
     * partition, which prune drops. */
    PQclear(t_exec(pg, "SELECT pgjobq.history_partition_create(now() - interval '3 hours')"));
    PQclear(t_exec(pg, "UPDATE pgjobq.history SET finished_at = now() - interval '3 hours' WHERE id = %lld",
                   (long long)other));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history_done_default WHERE id = %lld", (long long)other), 0);
    CHECK_OK(c, pgjobq_prune(c, 3600 * 1000, 0, 1000, &deleted));
    CHECK(deleted >= 2);
    CHECK_INT(
        t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id IN (%lld, %lld)", (long long)failed, (long long)other),
        0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_steps"), 0);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* ------------------------------------------------------------------------------------------------ */
/* The handler's context, in a worker                                                                */

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

static _Atomic int ran_plain, ran_tx, ran_failing;

static int plain_step(pgjobq_ctx *ctx, pgjobq_client *tx, void *arg, char **result_out)
{
    char buf[64];
    (void)arg;
    if (tx != NULL)
        return PGJOBQ_EINVAL;
    atomic_fetch_add(&ran_plain, 1);
    snprintf(buf, sizeof buf, "{\"a\": %lld}", (long long)pgjobq_ctx_job(ctx)->id);
    *result_out = strdup(buf);
    return *result_out ? PGJOBQ_OK : PGJOBQ_ENOMEM;
}

/* Its effect, a row of the ledger, in the transaction that stores its result. */
static int tx_step(pgjobq_ctx *ctx, pgjobq_client *tx, void *arg, char **result_out)
{
    char id_s[24];
    const char *values[1] = {id_s};
    (void)arg;
    atomic_fetch_add(&ran_tx, 1);
    snprintf(id_s, sizeof id_s, "%lld", (long long)pgjobq_ctx_job(ctx)->id);
    PGresult *r = PQexecParams(pgjobq_client_conn(tx), "INSERT INTO ledger VALUES ($1::bigint, 'b')", 1, NULL, values,
                               NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    *result_out = strdup("\"b\"");
    return ok && *result_out ? PGJOBQ_OK : PGJOBQ_EDB;
}

/* Writes its effect, then fails: the effect must not stay, nor a result be stored. */
static int failing_step(pgjobq_ctx *ctx, pgjobq_client *tx, void *arg, char **result_out)
{
    char id_s[24];
    const char *values[1] = {id_s};
    (void)arg;
    (void)result_out;
    atomic_fetch_add(&ran_failing, 1);
    snprintf(id_s, sizeof id_s, "%lld", (long long)pgjobq_ctx_job(ctx)->id);
    PQclear(PQexecParams(pgjobq_client_conn(tx), "INSERT INTO ledger VALUES ($1::bigint, 'failing')", 1, NULL, values,
                         NULL, NULL, 0));
    return 1000;
}

static pgjobq_outcome flow_handler(pgjobq_ctx *ctx, void *arg)
{
    char *a = NULL, *b = NULL, result[256];
    (void)arg;
    if (pgjobq_ctx_step(ctx, "a", plain_step, NULL, &a) != PGJOBQ_OK)
        return PGJOBQ_OUTCOME_FAIL;
    if (pgjobq_ctx_step_tx(ctx, "b", tx_step, NULL, &b) != PGJOBQ_OK) {
        pgjobq_free(a);
        return PGJOBQ_OUTCOME_FAIL;
    }
    int failed = pgjobq_ctx_step_tx(ctx, "c", failing_step, NULL, NULL);
    snprintf(result, sizeof result, "{\"a\": %s, \"b\": %s, \"c\": %d}", a, b, failed);
    pgjobq_free(a);
    pgjobq_free(b);
    if (pgjobq_ctx_job(ctx)->attempt == 1) {
        /* The first attempt fails after its steps: the second replays them. */
        pgjobq_ctx_set_retry_delay(ctx, 0);
        return PGJOBQ_OUTCOME_RETRY;
    }
    return pgjobq_ctx_set_result(ctx, result) == PGJOBQ_OK ? PGJOBQ_OUTCOME_COMPLETE : PGJOBQ_OUTCOME_FAIL;
}

static int all_done(void *arg)
{
    return t_int(arg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'flow'") == 40;
}

TEST_FULL(steps_a_handlers_steps_run_once_and_replay_from_storage_in_its_next_attempt, 90, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    run_arg r;
    pthread_t th;

    PQclear(t_exec(pg, "CREATE TABLE ledger (job bigint, what text)"));
    for (int i = 0; i < 40; i++)
        enqueue_one(c, "flow", "flow");
    o.lease_ms = 10000;
    o.poll_ms = 100;
    CHECK_OK(NULL, pgjobq_worker_new(&w, t_conninfo(), &o));
    CHECK_MSG(pgjobq_worker_handle(w, "flow", NULL, 4, flow_handler, NULL) == PGJOBQ_OK, "%s", pgjobq_worker_errmsg(w));
    r.w = w;
    CHECK(pthread_create(&th, NULL, run_thread, &r) == 0);
    CHECK_MSG(t_wait_until(all_done, pg, 60000), "not all 40 jobs finished");
    pgjobq_worker_stop(w);
    pthread_join(th, NULL);
    CHECK_MSG(r.rc == PGJOBQ_OK, "run: %s", pgjobq_worker_errmsg(w));
    pgjobq_worker_free(w);

    /* Two attempts each, each step run once per job (the failing one each attempt: nothing stored). */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'flow' AND state = 'completed'"
                        " AND attempt = 2 AND result = jsonb_build_object('a', jsonb_build_object('a', id), 'b', 'b',"
                        " 'c', 1000)"),
              40);
    CHECK_INT(atomic_load(&ran_plain), 40);
    CHECK_INT(atomic_load(&ran_tx), 40);
    CHECK_INT(atomic_load(&ran_failing), 80);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM ledger WHERE what = 'b'"), 40);
    CHECK_INT(t_int(pg, "SELECT count(DISTINCT job) FROM ledger WHERE what = 'b'"), 40);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM ledger WHERE what = 'failing'"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_steps WHERE name = 'c'"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_steps s JOIN pgjobq.history h ON h.id = s.job_id"
                        " WHERE h.queue = 'flow' AND s.attempt = 1"),
              80);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* ------------------------------------------------------------------------------------------------ */
/* The command: an --exec handler's steps, sleep and wait (`pgjobq step`), `pgjobq send-event`, show  */

static int parked_waiting(void *arg)
{
    return t_int(arg, "SELECT coalesce(sum(waiting), 0) FROM pgjobq.monitor_parked() WHERE queue = 'ex'") == 5;
}

static int ex_done(void *arg)
{
    return t_int(arg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'ex'") == 5;
}

static pid_t ex_worker;

static void stop_ex_worker(void)
{
    if (ex_worker > 0) {
        kill(ex_worker, SIGTERM);
        t_wait_exit(ex_worker, 20000);
        ex_worker = 0;
    }
}

TEST_FULL(steps_an_exec_handler_runs_its_steps_sleeps_and_waits_with_pgjobq_step, 120, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    char script[4096], *out = NULL, *err = NULL;
    const char *cli = getenv("PGJOBQ_CLI"), *log = t_log_path("ex");
    int64_t ids[5];

    CHECK(cli != NULL);
    /* Step a appends to a ledger (at most once a job), a sleep of 300 ms, a wait for the event "go"
     * keyed by the job's id; the result gathers them. */
    snprintf(script, sizeof script,
             "a=$(%s step a -- sh -c 'echo $PGJOBQ_JOB_ID >> %s/ledger; echo \"{\\\"n\\\": 7}\"') || exit $?\n"
             "%s step nap --sleep 300ms || exit $?\n"
             "ev=$(%s step w --wait-event go --key \"$PGJOBQ_JOB_ID\" --timeout 60s) || exit $?\n"
             "echo \"{\\\"a\\\": $a, \\\"event\\\": $ev}\"\n",
             cli, t_tmpdir(), cli, cli);
    for (int i = 0; i < 5; i++)
        ids[i] = enqueue_one(c, "ex", "k");
    ex_worker = t_spawn(log, NULL, "work", "--queue", "ex:4", "--exec", script, "--shell", "--pass-env",
                        "PGJOBQ_DATABASE_URL", "--poll", "100ms", NULL);
    t_defer(stop_ex_worker);
    if (!t_wait_until(parked_waiting, pg, 60000)) {
        t_show_log(log);
        t_fail(__FILE__, __LINE__, "the 5 jobs did not all come to wait for their event");
    }
    /* Parked: queued, no lease, and `pgjobq show` says so, with the steps stored. */
    char id_s[24];
    snprintf(id_s, sizeof id_s, "%lld", (long long)ids[0]);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", id_s, NULL), 0);
    CHECK_MSG(strstr(out, "state:         queued") && strstr(out, "parked:        waiting in w for the event go key") &&
                  strstr(out, "steps:         a  (attempt 1,") && strstr(out, "nap  (attempt 1,"),
              "show says:\n%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", "--json", id_s, NULL), 0);
    CHECK_MSG(strstr(out, "\"parked\":{\"why\":\"waiting\",\"step\":\"w\"") && strstr(out, "\"steps\":[{\"name\":\"a\""),
              "show --json says:\n%s", out);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'ex' AND state = 'queued'"
                        " AND lease_until IS NULL AND attempt = 0"),
              5);
    /* The events resume them, each with its payload. */
    for (int i = 0; i < 5; i++) {
        char key[24], payload[64];
        snprintf(key, sizeof key, "%lld", (long long)ids[i]);
        snprintf(payload, sizeof payload, "{\"ok\": %d}", i);
        CHECK_INT(t_cli(&out, &err, NULL, 0, "send-event", "go", key, "--payload", payload, NULL), 0);
        CHECK_STR(out, "1\n");
        free(out);
        free(err);
    }
    if (!t_wait_until(ex_done, pg, 60000)) {
        t_show_log(log);
        t_fail(__FILE__, __LINE__, "the 5 jobs did not all finish");
    }
    stop_ex_worker();
    for (int i = 0; i < 5; i++)
        CHECK_INT(t_int(pg,
                        "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'completed' AND attempt = 1"
                        " AND result = jsonb_build_object('a', jsonb_build_object('n', 7), 'event',"
                        " jsonb_build_object('ok', %d))",
                        (long long)ids[i], i),
                  1);
    char path[600];
    snprintf(path, sizeof path, "%s/ledger", t_tmpdir());
    char *ledger = t_read_file(path);
    int lines = 0;
    for (char *p = ledger; *p; p++)
        lines += *p == '\n';
    CHECK_INT(lines, 5);
    free(ledger);

    /* Bad input: a step outside a handler, an event without a name or with a payload that is no JSON. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "step", "a", "--", "true", NULL), 64);
    CHECK_MSG(strstr(err, "PGJOBQ_JOB_ID and PGJOBQ_LEASE_TOKEN are not set"), "%s", err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "send-event", "go", "k", "--payload", "{nope", NULL), 64);
    free(out);
    free(err);
    CHECK(t_cli(&out, &err, NULL, 0, "send-event", "", NULL) != 0);
    CHECK_MSG(strstr(err, "an event's name"), "%s", err);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.events"), 5);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* ------------------------------------------------------------------------------------------------ */
/* Durable sleeps                                                                                    */

static int claim_within(pgjobq_client *c, const char *queue, pgjobq_job **out, int timeout_ms)
{
    int64_t t0 = t_now_ms();
    for (;;) {
        size_t n = 0;
        CHECK_OK(c, pgjobq_claim(c, queue, 1, 60000, "w", out, &n));
        if (n == 1)
            return 1;
        pgjobq_jobs_free(*out);
        *out = NULL;
        if (t_now_ms() - t0 > timeout_ms)
            return 0;
        struct timespec pause = {0, 20 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

/* A sleep ends the attempt without using it (a job of one attempt sleeps and runs again) and without
 * counting a snooze; the job is seen sleeping until its end, holds no lease, and its replay goes on
 * past the sleep; a retry by hand wakes it; a cancel requested meanwhile ends it cancelled. */
TEST(sleeps_park_the_job_without_using_an_attempt_and_resume_it_at_their_end)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    pgjobq_park_info park;
    pgjobq_job *j = NULL, *none = NULL;
    int64_t id, until = 0;
    size_t n = 9;

    o.queue = "nap";
    o.max_attempts = 1;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    j = claim_one(c, "nap");
    CHECK_RC(c, pgjobq_job_sleep(c, id, j->lease_token, "long", 3600000, &until), PGJOBQ_PARKED);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued' AND attempt = 0"
                        " AND snoozes = 0 AND lease_until IS NULL AND run_at BETWEEN now() + interval '59 minutes'"
                        " AND now() + interval '61 minutes'"
                        " AND (extract(epoch FROM run_at) * 1000000)::bigint = %lld",
                    (long long)id, (long long)until),
              1);
    CHECK_OK(c, pgjobq_job_park(c, id, &park));
    CHECK_INT(park.parked, PGJOBQ_PARK_SLEEP);
    CHECK_STR(park.step, "long");
    CHECK_INT(park.until, until);
    CHECK_INT(t_int(pg, "SELECT sleeping FROM pgjobq.monitor_parked() WHERE queue = 'nap'"), 1);
    /* The attempt is over: its token writes nothing, and nothing is due. */
    CHECK_RC(c, pgjobq_job_complete(c, id, j->lease_token, NULL), PGJOBQ_ELEASE);
    CHECK_RC(c, pgjobq_job_sleep(c, id, j->lease_token, "long", 3600000, NULL), PGJOBQ_ELEASE);
    CHECK_OK(c, pgjobq_claim(c, "nap", 1, 60000, "w", &none, &n));
    CHECK_INT(n, 0);
    pgjobq_jobs_free(j);

    /* A retry by hand wakes it: the replay passes the sleep, which is no longer a park. */
    CHECK_OK(c, pgjobq_job_retry(c, id));
    j = claim_one(c, "nap");
    CHECK_INT(j->attempt, 1);
    CHECK_OK(c, pgjobq_job_sleep(c, id, j->lease_token, "long", 3600000, NULL));
    CHECK_OK(c, pgjobq_job_park(c, id, &park));
    CHECK_INT(park.parked, PGJOBQ_PARK_NONE);
    /* A sleep of nothing is over at once; a short one parks the job until its end, then goes on. */
    CHECK_OK(c, pgjobq_job_sleep(c, id, j->lease_token, "none", 0, NULL));
    CHECK_RC(c, pgjobq_job_sleep(c, id, j->lease_token, "short", 200, NULL), PGJOBQ_PARKED);
    pgjobq_jobs_free(j);
    CHECK(claim_within(c, "nap", &j, 30000));
    CHECK_INT(j->attempt, 1);
    CHECK_OK(c, pgjobq_job_sleep(c, id, j->lease_token, "long", 3600000, NULL));
    CHECK_OK(c, pgjobq_job_sleep(c, id, j->lease_token, "short", 200, NULL));
    CHECK_OK(c, pgjobq_job_complete(c, id, j->lease_token, "{\"slept\": true}"));
    pgjobq_jobs_free(j);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'completed' AND attempt = 1"
                        " AND snoozes = 0",
                    (long long)id),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_park_of(%lld)", (long long)id), 0);

    /* Bad input refused, nothing parked; a cancel requested while it runs ends it cancelled. */
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    j = claim_one(c, "nap");
    CHECK_RC(c, pgjobq_job_sleep(c, id, j->lease_token, "neg", -1, NULL), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_job_sleep(c, id, j->lease_token, "", 10, NULL), PGJOBQ_EINVAL);
    CHECK_OK(c, pgjobq_step_put(c, id, j->lease_token, "notasleep", "1", NULL));
    CHECK_RC(c, pgjobq_job_sleep(c, id, j->lease_token, "notasleep", 10, NULL), PGJOBQ_EINVAL);
    pgjobq_state st;
    CHECK_OK(c, pgjobq_job_cancel(c, id, &st));
    CHECK_INT(st, PGJOBQ_RUNNING);
    CHECK_RC(c, pgjobq_job_sleep(c, id, j->lease_token, "nap", 60000, NULL), PGJOBQ_ECANCELLED);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'cancelled'", (long long)id),
              1);
    pgjobq_jobs_free(j);
    PQfinish(pg);
    pgjobq_client_close(c);
}

static _Atomic int ran_nap_step;

static int nap_step(pgjobq_ctx *ctx, pgjobq_client *tx, void *arg, char **result_out)
{
    (void)ctx;
    (void)tx;
    (void)arg;
    atomic_fetch_add(&ran_nap_step, 1);
    *result_out = NULL;
    return PGJOBQ_OK;
}

static pgjobq_outcome nap_handler(pgjobq_ctx *ctx, void *arg)
{
    int rc;
    (void)arg;
    if (pgjobq_ctx_step(ctx, "before", nap_step, NULL, NULL) != PGJOBQ_OK)
        return PGJOBQ_OUTCOME_FAIL;
    if ((rc = pgjobq_ctx_sleep(ctx, NULL, 200)) != PGJOBQ_OK)
        return rc == PGJOBQ_PARKED ? PGJOBQ_OUTCOME_PARKED : PGJOBQ_OUTCOME_RETRY;
    return PGJOBQ_OUTCOME_COMPLETE;
}

static int naps_done(void *arg)
{
    return t_int(arg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'naps'") == 20;
}

TEST_FULL(sleeps_a_handlers_sleep_frees_its_slot_and_resumes_the_job_with_its_steps, 90, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    pgjobq_worker_stats st;
    run_arg r;
    pthread_t th;

    for (int i = 0; i < 20; i++)
        enqueue_one(c, "naps", "nap");
    o.lease_ms = 10000;
    o.poll_ms = 100;
    CHECK_OK(NULL, pgjobq_worker_new(&w, t_conninfo(), &o));
    /* One slot: the 20 jobs sleep side by side, none holding it while it sleeps. */
    CHECK(pgjobq_worker_handle(w, "naps", NULL, 1, nap_handler, NULL) == PGJOBQ_OK);
    r.w = w;
    CHECK(pthread_create(&th, NULL, run_thread, &r) == 0);
    CHECK_MSG(t_wait_until(naps_done, pg, 60000), "the 20 jobs did not all finish");
    pgjobq_worker_stop(w);
    pthread_join(th, NULL);
    CHECK_MSG(r.rc == PGJOBQ_OK, "run: %s", pgjobq_worker_errmsg(w));
    pgjobq_worker_get_stats(w, &st);
    pgjobq_worker_free(w);
    CHECK_INT(st.parked, 20);
    CHECK_INT(st.completed, 20);
    CHECK_INT(st.lost, 0);
    CHECK_INT(atomic_load(&ran_nap_step), 20);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'naps' AND state = 'completed'"
                        " AND attempt = 1 AND snoozes = 0"),
              20);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_steps s JOIN pgjobq.history h ON h.id = s.job_id"
                        " WHERE h.queue = 'naps' AND s.name = 'sleep#1'"),
              20);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* ------------------------------------------------------------------------------------------------ */
/* Events                                                                                            */

typedef struct send_arg {
    pgjobq_client *c;
    int resumed, rc;
} send_arg;

static void *send_thread(void *arg)
{
    send_arg *s = arg;
    s->rc = pgjobq_send_event(s->c, "paid", "race", "{\"r\": 1}", &s->resumed);
    return NULL;
}

static int send_waits_for_a_lock(void *arg)
{
    return t_int(arg, "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'advisory'") > 0;
}

TEST_FULL(events_resume_waiting_jobs_with_the_senders_commit_and_are_kept_for_later_waits, 90, 0)
{
    pgjobq_client *c = t_client(), *s = t_client();
    PGconn *pg = t_pg();
    pgjobq_park_info park;
    pgjobq_job *j = NULL;
    char *payload = NULL;
    int resumed = -1;

    /* A waits: parked, waiting, until its timeout. */
    int64_t a = enqueue_one(c, "ev", "k");
    j = claim_one(c, "ev");
    CHECK_RC(c, pgjobq_job_wait_event(c, a, j->lease_token, "w", "paid", "o1", 60000, &payload), PGJOBQ_PARKED);
    pgjobq_jobs_free(j);
    CHECK_OK(c, pgjobq_job_park(c, a, &park));
    CHECK_INT(park.parked, PGJOBQ_PARK_EVENT);
    CHECK_STR(park.event_name, "paid");
    CHECK_STR(park.event_key, "o1");
    CHECK_INT(t_int(pg, "SELECT waiting FROM pgjobq.monitor_parked() WHERE queue = 'ev'"), 1);
    /* Sent in a transaction that rolls back: nothing happened. */
    CHECK_OK(s, pgjobq_begin(s));
    CHECK_OK(s, pgjobq_send_event(s, "paid", "o1", "{\"amount\": 5}", &resumed));
    CHECK_INT(resumed, 1);
    CHECK_OK(s, pgjobq_rollback(s));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.events"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND run_at > now()", (long long)a), 1);
    /* Committed: A is due at once, and its wait gets the payload (stored: asked again, the same). */
    CHECK_OK(s, pgjobq_send_event(s, "paid", "o1", "{\"amount\": 5}", &resumed));
    CHECK_INT(resumed, 1);
    j = claim_one(c, "ev");
    CHECK_INT(j->id, a);
    CHECK_INT(j->attempt, 1);
    CHECK_OK(c, pgjobq_job_wait_event(c, a, j->lease_token, "w", "paid", "o1", 60000, &payload));
    CHECK_STR(payload, "{\"amount\": 5}");
    pgjobq_free(payload);
    CHECK_OK(c, pgjobq_job_complete(c, a, j->lease_token, NULL));
    pgjobq_jobs_free(j);

    /* An event sent before the wait began: found at once (and by every job that waits for it). */
    CHECK_OK(s, pgjobq_send_event(s, "paid", "o2", "{\"amount\": 7}", &resumed));
    CHECK_INT(resumed, 0);
    for (int i = 0; i < 2; i++) {
        int64_t b = enqueue_one(c, "ev", "k");
        j = claim_one(c, "ev");
        CHECK_OK(c, pgjobq_job_wait_event(c, b, j->lease_token, "w", "paid", "o2", 60000, &payload));
        CHECK_STR(payload, "{\"amount\": 7}");
        pgjobq_free(payload);
        CHECK_OK(c, pgjobq_job_complete(c, b, j->lease_token, NULL));
        pgjobq_jobs_free(j);
    }

    /* A timeout resumes the job with the timeout answer, stored. */
    int64_t t = enqueue_one(c, "ev", "k");
    j = claim_one(c, "ev");
    CHECK_RC(c, pgjobq_job_wait_event(c, t, j->lease_token, "w", "paid", "never", 200, NULL), PGJOBQ_PARKED);
    pgjobq_jobs_free(j);
    CHECK(claim_within(c, "ev", &j, 30000));
    CHECK_RC(c, pgjobq_job_wait_event(c, t, j->lease_token, "w", "paid", "never", 200, NULL), PGJOBQ_ETIMEOUT);
    CHECK_OK(s, pgjobq_send_event(s, "paid", "never", NULL, &resumed));
    CHECK_RC(c, pgjobq_job_wait_event(c, t, j->lease_token, "w", "paid", "never", 200, NULL), PGJOBQ_ETIMEOUT);
    CHECK_OK(c, pgjobq_job_complete(c, t, j->lease_token, NULL));
    pgjobq_jobs_free(j);

    /* A wait and a send that run together do not miss each other: the send waits for the wait's
     * park to commit, and then resumes it. */
    int64_t r = enqueue_one(c, "ev", "k");
    j = claim_one(c, "ev");
    CHECK_OK(c, pgjobq_begin(c));
    CHECK_RC(c, pgjobq_job_wait_event(c, r, j->lease_token, "w", "paid", "race", 60000, NULL), PGJOBQ_PARKED);
    send_arg sa = {s, -1, -1};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, send_thread, &sa) == 0);
    CHECK_MSG(t_wait_until(send_waits_for_a_lock, pg, 30000), "the send did not wait for the wait's lock");
    CHECK_OK(c, pgjobq_commit(c));
    pthread_join(th, NULL);
    CHECK_OK(s, sa.rc);
    CHECK_INT(sa.resumed, 1);
    pgjobq_jobs_free(j);
    j = claim_one(c, "ev");
    CHECK_OK(c, pgjobq_job_wait_event(c, r, j->lease_token, "w", "paid", "race", 60000, &payload));
    CHECK_STR(payload, "{\"r\": 1}");
    pgjobq_free(payload);
    pgjobq_jobs_free(j);

    /* Bad input refused; events older than their retention go at prune. */
    CHECK_RC(s, pgjobq_send_event(s, "", NULL, NULL, NULL), PGJOBQ_EINVAL);
    CHECK_RC(s, pgjobq_send_event(s, "paid", NULL, "{bad", NULL), PGJOBQ_EINVAL);
    PQclear(t_exec(pg, "UPDATE pgjobq.events SET sent_at = now() - interval '8 days' WHERE key = 'o1'"));
    CHECK_OK(c, pgjobq_prune(c, 0, 0, 1000, NULL));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.events WHERE key = 'o1'"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.events WHERE key = 'o2'"), 1);
    PQfinish(pg);
    pgjobq_client_close(c);
    pgjobq_client_close(s);
}

/* docs/durable.md's C tour compiles against the public header and the library and runs as written:
 * the job completes at its second attempt, its steps stored once each (charge and receipt by the
 * first attempt, which failed after them, and not run again by the second), its sleep and its wait
 * each parked it once, and the event resumed it.  The code is read from the page itself, so that the
 * page and what is tested cannot drift apart. */
TEST_FULL(steps_the_c_tour_of_docs_durable_md_runs, 120, 0)
{
    char path[1024], src[1024], cmd[4096];
    const char *cli = getenv("PGJOBQ_CLI");
    PGconn *pg = t_pg();

    CHECK_MSG(cli != NULL && strrchr(cli, '/') != NULL, "PGJOBQ_CLI is not set (run through make check)");
    snprintf(path, sizeof path, "%s/docs/durable.md", t_srcdir());
    char *doc = t_read_file(path);
    const char *tour = strstr(doc, "\n## A tour in C\n");
    CHECK_MSG(tour != NULL, "docs/durable.md has no section \"A tour in C\"");
    const char *end = strstr(tour + 1, "\n## ");
    const char *code = strstr(tour, "\n```c\n");
    CHECK_MSG(code != NULL && (end == NULL || code < end), "the C tour has no ```c block");
    code += strlen("\n```c\n");
    const char *stop = strstr(code, "\n```\n");
    CHECK(stop != NULL);
    snprintf(src, sizeof src, "%s/checkout.c", t_tmpdir());
    FILE *f = fopen(src, "w");
    CHECK(f != NULL);
    fwrite(code, 1, (size_t)(stop - code) + 1, f);
    fclose(f);
    free(doc);

    /* The same code-generation flags as the library (the sanitizer build needs its runtime too). */
    const char *flags = getenv("PGJOBQ_TEST_CFLAGS") ? getenv("PGJOBQ_TEST_CFLAGS") : "";
    snprintf(cmd, sizeof cmd,
             "cc -std=c11 -Wall -Wextra -Werror %s -I'%s/include' $(pkg-config --cflags libpq 2>/dev/null) '%s' "
             "'%.*s/libpgjobq.a' $(pkg-config --libs libpq 2>/dev/null || echo -lpq) -lpthread -o '%s/checkout' 2>&1 && "
             "'%s/checkout' '%s' 2>&1",
             flags, t_srcdir(), src, (int)(strrchr(cli, '/') - cli), cli, t_tmpdir(), t_tmpdir(), t_conninfo());
    static char out[65536];
    int rc = t_shell(out, sizeof out, cmd);
    CHECK_MSG(rc == 0, "the C tour failed (status %d):\n%s", rc, out);
    long long id = 0;
    CHECK_MSG(sscanf(out, "job %lld\n", &id) == 1, "the tour:\n%s", out);
    CHECK_MSG(strstr(out, "\nwaiting\nresumed 1\ncompleted {") != NULL &&
                  strstr(out, "\nran charge 1, receipt 1; parked sleeping 1, waiting 1\n") != NULL &&
                  strstr(out, "\nstep charge at attempt 1\nstep receipt at attempt 1\nstep cool-off at attempt 2\n"
                              "step paid at attempt 1\n") != NULL,
              "the tour:\n%s", out);
    /* What the database holds: the job completed at its second attempt with the stored answers, and
     * one charge (the step's effect, committed with its record). */
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'completed' AND attempt = 2"
                    " AND result = '{\"charged\": {\"charged\": 1200}, \"sent\": {\"sent_at_attempt\": 1},"
                    " \"paid\": {\"amount\": 1200}, \"attempt\": 2}'",
                    id),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM charges WHERE job_id = %lld", id), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_steps WHERE job_id = %lld AND name = 'cool-off'"
                        " AND result ? 'sleep_until'",
                    id),
              1);
    PQfinish(pg);
}

/* A step's store in a transaction that wrote nothing else (a step whose effects are elsewhere) does
 * not wait for the WAL's flush (synchronous_commit off for that transaction alone); a store after
 * the step's effects in the same transaction leaves the caller's setting as it was, so that its
 * effects are flushed at its commit (docs/guarantees.md, promise 15). */
TEST(steps_a_store_alone_does_not_wait_for_the_flush_and_one_with_effects_does)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();

    int64_t id = enqueue_one(c, "sc", "k");
    pgjobq_job *j = claim_one(c, "sc");
    PQclear(t_exec(pg, "CREATE TABLE ledger (n int)"));
    /* (The test server runs with it off: this session asks for it.) */
    PQclear(t_exec(pg, "SET synchronous_commit = on"));
    /* Alone in its transaction: off until that transaction ends. */
    PQclear(t_exec(pg, "BEGIN"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.step_put(%lld, %lld, 'alone', '1') WHERE outcome = 'stored'",
                    (long long)id, (long long)j->lease_token),
              1);
    char *s = t_str(pg, "SHOW synchronous_commit");
    CHECK_STR(s, "off");
    free(s);
    PQclear(t_exec(pg, "COMMIT"));
    s = t_str(pg, "SHOW synchronous_commit");
    CHECK_STR(s, "on");
    free(s);
    /* After an effect of its step: the caller's setting stands. */
    PQclear(t_exec(pg, "BEGIN"));
    PQclear(t_exec(pg, "INSERT INTO ledger VALUES (1)"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.step_put(%lld, %lld, 'with', '2') WHERE outcome = 'stored'",
                    (long long)id, (long long)j->lease_token),
              1);
    s = t_str(pg, "SHOW synchronous_commit");
    CHECK_STR(s, "on");
    free(s);
    PQclear(t_exec(pg, "COMMIT"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_steps WHERE job_id = %lld", (long long)id), 2);
    pgjobq_jobs_free(j);
    pgjobq_client_close(c);
    PQfinish(pg);
}
