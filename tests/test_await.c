/* Waiting for a job to finish: pgjobq_job_wait, `pgjobq wait` (docs/durable.md, "Awaiting a result"). */

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* A waiter on a thread of its own, with a client of its own. */
typedef struct waiter {
    pthread_t thread;
    int64_t id, timeout_ms;
    int rc;
    pgjobq_job *job;
    int64_t returned_ms;
} waiter;

static void *wait_main(void *arg)
{
    waiter *w = arg;
    pgjobq_client *c = NULL;
    if (pgjobq_client_open(&c, t_conninfo()) != PGJOBQ_OK) {
        w->rc = -1;
        return NULL;
    }
    w->rc = pgjobq_job_wait(c, w->id, w->timeout_ms, &w->job);
    w->returned_ms = t_now_ms();
    pgjobq_client_close(c);
    return NULL;
}

static void start_waiter(waiter *w, int64_t id, int64_t timeout_ms)
{
    memset(w, 0, sizeof *w);
    w->id = id;
    w->timeout_ms = timeout_ms;
    CHECK(pthread_create(&w->thread, NULL, wait_main, w) == 0);
}

static void join_waiter(waiter *w)
{
    CHECK(pthread_join(w->thread, NULL) == 0);
}

typedef struct {
    PGconn *pg;
    int64_t id;
    int n;
} registered_arg;

static int registered(void *arg)
{
    registered_arg *a = arg;
    return t_int(a->pg, "SELECT count(*) FROM pgjobq.awaited WHERE job_id = %lld", (long long)a->id) >= a->n;
}

static void wait_registered(PGconn *pg, int64_t id, int n)
{
    registered_arg a = {pg, id, n};
    CHECK_MSG(t_wait_until(registered, &a, 30000), "%d waits for job %lld were not registered", n, (long long)id);
}

/* Claims job id (the only one of its queue) and returns its lease token. */
static long long claim(PGconn *pg, const char *queue, int64_t id)
{
    long long token = t_int(pg, "SELECT lease_token FROM pgjobq.claim('%s', 1, interval '1 minute', 'w1')", queue);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'running'", (long long)id), 1);
    return token;
}

/* A waiter is woken by the job's end, well before the 10 s fallback, and reads it: completed with its
 * result, failed with its error, cancelled; several waiters on one job all wake. */
TEST_FULL(await_wakes_on_each_end_of_the_job, 120, 0)
{
    PGconn *pg = t_pg();
    waiter w[3];

    int64_t a = t_int(pg, "SELECT id FROM pgjobq.enqueue('qa')");
    for (int i = 0; i < 3; i++)
        start_waiter(&w[i], a, 60000);
    wait_registered(pg, a, 3);
    long long token = claim(pg, "qa", a);
    int64_t done_at = t_now_ms();
    PQclear(t_exec(pg,
                   "SELECT pgjobq.complete_many(ARRAY[%lld]::bigint[], ARRAY[%lld]::bigint[],"
                   " ARRAY['{\"sum\": 5}']::jsonb[])",
                   (long long)a, token));
    for (int i = 0; i < 3; i++) {
        join_waiter(&w[i]);
        CHECK_INT(w[i].rc, PGJOBQ_OK);
        CHECK_INT(w[i].job->state, PGJOBQ_COMPLETED);
        CHECK_STR(w[i].job->result, "{\"sum\": 5}");
        /* Woken by the notification: the fallback would have read it 10 s after the wait began. */
        CHECK_MSG(w[i].returned_ms - done_at < 8000, "woken %lld ms after the job completed",
                  (long long)(w[i].returned_ms - done_at));
        pgjobq_jobs_free(w[i].job);
    }
    /* Each wait removed its registration. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.awaited"), 0);

    int64_t f = t_int(pg, "SELECT id FROM pgjobq.enqueue('qf', max_attempts => 1)");
    start_waiter(&w[0], f, 60000);
    wait_registered(pg, f, 1);
    token = claim(pg, "qf", f);
    done_at = t_now_ms();
    PQclear(t_exec(pg, "SELECT pgjobq.fail_many(ARRAY[%lld]::bigint[], ARRAY[%lld]::bigint[], ARRAY['boom'])",
                   (long long)f, token));
    join_waiter(&w[0]);
    CHECK_INT(w[0].rc, PGJOBQ_OK);
    CHECK(w[0].returned_ms - done_at < 8000);
    CHECK_INT(w[0].job->state, PGJOBQ_FAILED);
    CHECK_STR(w[0].job->last_error, "boom");
    pgjobq_jobs_free(w[0].job);

    int64_t k = t_int(pg, "SELECT id FROM pgjobq.enqueue('qk')");
    start_waiter(&w[0], k, 60000);
    wait_registered(pg, k, 1);
    done_at = t_now_ms();
    PQclear(t_exec(pg, "SELECT pgjobq.cancel(%lld)", (long long)k));
    join_waiter(&w[0]);
    CHECK_INT(w[0].rc, PGJOBQ_OK);
    CHECK(w[0].returned_ms - done_at < 8000);
    CHECK_INT(w[0].job->state, PGJOBQ_CANCELLED);
    pgjobq_jobs_free(w[0].job);
    PQfinish(pg);
}

/* An unknown id, a job finished long ago, a timeout, and a connection in a transaction answer each
 * in their own way. */
TEST(await_unknown_finished_timeout_and_transaction)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = t_client();
    pgjobq_job *job = NULL;

    CHECK_RC(c, pgjobq_job_wait(c, 987654321, 1000, &job), PGJOBQ_ENOTFOUND);
    CHECK(job == NULL);

    int64_t old = t_int(pg, "SELECT id FROM pgjobq.enqueue('qo')");
    long long token = claim(pg, "qo", old);
    PQclear(t_exec(pg, "SELECT pgjobq.complete_many(ARRAY[%lld]::bigint[], ARRAY[%lld]::bigint[], NULL)",
                   (long long)old, token));
    CHECK_OK(c, pgjobq_job_wait(c, old, 0, &job));
    CHECK_INT(job->state, PGJOBQ_COMPLETED);
    pgjobq_jobs_free(job);

    int64_t q = t_int(pg, "SELECT id FROM pgjobq.enqueue('qq')");
    CHECK_RC(c, pgjobq_job_wait(c, q, 300, &job), PGJOBQ_ETIMEOUT);
    CHECK(job != NULL && job->state == PGJOBQ_QUEUED);
    CHECK(strstr(pgjobq_errmsg(c), "has not finished (it is queued)") != NULL);
    pgjobq_jobs_free(job);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.awaited"), 0);

    /* On a connection of the caller's in a transaction: refused, nothing registered. */
    PGconn *own = t_connect(t_conninfo());
    pgjobq_client *in_tx = NULL;
    CHECK(pgjobq_client_wrap(&in_tx, own) == PGJOBQ_OK);
    PQclear(t_exec(own, "BEGIN"));
    CHECK_RC(in_tx, pgjobq_job_wait(in_tx, q, 300, &job), PGJOBQ_EINVAL);
    PQclear(t_exec(own, "ROLLBACK"));
    pgjobq_client_close(in_tx);
    PQfinish(own);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* Nobody waiting costs nothing: finishing a job nobody waits for sends no notification; one that
 * somebody waits for sends one, naming it. */
TEST(await_a_job_nobody_waits_for_sends_no_notification)
{
    PGconn *pg = t_pg(), *listener = t_connect(t_conninfo());
    PGnotify *n;
    waiter w;

    PQclear(t_exec(listener, "LISTEN pgjobq_done"));
    int64_t a = t_int(pg, "SELECT id FROM pgjobq.enqueue('qn')");
    long long token = claim(pg, "qn", a);
    PQclear(t_exec(pg, "SELECT pgjobq.complete_many(ARRAY[%lld]::bigint[], ARRAY[%lld]::bigint[], NULL)", (long long)a,
                   token));
    int64_t b = t_int(pg, "SELECT id FROM pgjobq.enqueue('qn')");
    PQclear(t_exec(pg, "SELECT pgjobq.cancel(%lld)", (long long)b));
    PQclear(t_exec(listener, "SELECT 1")); /* (a round trip: what was sent before it has come) */
    CHECK(PQconsumeInput(listener));
    n = PQnotifies(listener);
    CHECK_MSG(n == NULL, "a notification nobody waited for: %s", n ? n->extra : "");

    int64_t c = t_int(pg, "SELECT id FROM pgjobq.enqueue('qn')");
    start_waiter(&w, c, 60000);
    wait_registered(pg, c, 1);
    token = claim(pg, "qn", c);
    PQclear(t_exec(pg, "SELECT pgjobq.complete_many(ARRAY[%lld]::bigint[], ARRAY[%lld]::bigint[], NULL)", (long long)c,
                   token));
    join_waiter(&w);
    CHECK_INT(w.rc, PGJOBQ_OK);
    pgjobq_jobs_free(w.job);
    PQclear(t_exec(listener, "SELECT 1"));
    CHECK(PQconsumeInput(listener));
    n = PQnotifies(listener);
    CHECK(n != NULL);
    char want[24];
    snprintf(want, sizeof want, "%lld", (long long)c);
    CHECK_STR(n->extra, want);
    PQfreemem(n);
    PQfinish(listener);
    PQfinish(pg);
}

/* `pgjobq wait ID`: the result and exit 0; a failed job 1, a cancelled one 2, an unknown id 65, a
 * timeout 75 (docs/pgjobq.1). */
TEST(await_cli_exit_status_by_outcome)
{
    PGconn *pg = t_pg();
    char id_s[24], *out = NULL, *err = NULL;

    int64_t a = t_int(pg, "SELECT id FROM pgjobq.enqueue('qc')");
    long long token = claim(pg, "qc", a);
    PQclear(t_exec(pg,
                   "SELECT pgjobq.complete_many(ARRAY[%lld]::bigint[], ARRAY[%lld]::bigint[],"
                   " ARRAY['{\"sum\": 5}']::jsonb[])",
                   (long long)a, token));
    snprintf(id_s, sizeof id_s, "%lld", (long long)a);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "wait", id_s, NULL), 0);
    CHECK_STR(out, "{\"sum\": 5}\n");
    free(out);
    free(err);

    int64_t f = t_int(pg, "SELECT id FROM pgjobq.enqueue('qcf', max_attempts => 1)");
    token = claim(pg, "qcf", f);
    PQclear(t_exec(pg, "SELECT pgjobq.fail_many(ARRAY[%lld]::bigint[], ARRAY[%lld]::bigint[], ARRAY['boom'])",
                   (long long)f, token));
    snprintf(id_s, sizeof id_s, "%lld", (long long)f);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "wait", id_s, NULL), 1);
    CHECK_MSG(strstr(err, "failed") && strstr(err, "boom"), "%s", err);
    free(out);
    free(err);

    int64_t k = t_int(pg, "SELECT id FROM pgjobq.enqueue('qck')");
    PQclear(t_exec(pg, "SELECT pgjobq.cancel(%lld)", (long long)k));
    snprintf(id_s, sizeof id_s, "%lld", (long long)k);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "wait", id_s, "--json", NULL), 2);
    CHECK_MSG(strstr(out, "\"state\":\"cancelled\"") != NULL, "%s", out);
    free(out);
    free(err);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "wait", "987654321", NULL), 65);
    CHECK_MSG(strstr(err, "no job 987654321") != NULL, "%s", err);
    free(out);
    free(err);

    int64_t q = t_int(pg, "SELECT id FROM pgjobq.enqueue('qcq')");
    snprintf(id_s, sizeof id_s, "%lld", (long long)q);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "wait", id_s, "--timeout", "200ms", NULL), 75);
    CHECK_MSG(strstr(err, "has not finished") != NULL, "%s", err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "wait", "x1", NULL), 64);
    free(out);
    free(err);
    PQfinish(pg);
}
