/*
 * test_bulk.c - retry and cancel by filter against the real server: what a filter chooses (queue,
 * state, kind, age), what a dry run leaves alone, unique keys, bulk calls racing claimers and each
 * other, and the command line's answers.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Enqueues a job of queue/kind (unique key optional) and returns its id. */
static int64_t put(pgjobq_client *c, const char *queue, const char *kind, const char *unique_key)
{
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int64_t id = 0;

    o.queue = queue;
    o.kind = kind;
    o.unique_key = unique_key;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    return id;
}

/* Claims every due job of the queue and fails each for good. */
static void fail_all(pgjobq_client *c, const char *queue)
{
    pgjobq_job *jobs = NULL;
    size_t n = 0;

    CHECK_OK(c, pgjobq_claim(c, queue, 1000, 60000, "t", &jobs, &n));
    for (size_t i = 0; i < n; i++)
        CHECK_OK(c, pgjobq_job_fail(c, jobs[i].id, jobs[i].lease_token, "boom", 0, PGJOBQ_FAIL_PERMANENT, NULL));
    pgjobq_jobs_free(jobs);
}

TEST(retry_where_moves_the_failed_jobs_a_filter_matches)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    int64_t n = -1, skipped = -1;

    for (int i = 0; i < 3; i++)
        put(c, "mail", "send", NULL);
    put(c, "mail", "bounce", NULL);
    int64_t old = put(c, "mail", "send", NULL);
    put(c, "sms", "send", NULL);
    fail_all(c, "mail");
    fail_all(c, "sms");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE state = 'failed'"), 6);
    /* One of them failed two hours ago. */
    PQclear(t_exec(pg, "UPDATE pgjobq.history SET finished_at = now() - interval '2 hours' WHERE id = %lld",
                   (long long)old));

    /* A dry run counts and changes nothing. */
    f.queue = "mail";
    f.state = PGJOBQ_FAILED;
    CHECK_OK(c, pgjobq_retry_where(c, &f, PGJOBQ_DRY_RUN, &n, &skipped));
    CHECK_INT(n, 5);
    CHECK_INT(skipped, 0);
    f.kind = "send";
    f.since_ms = 3600 * 1000;
    CHECK_OK(c, pgjobq_retry_where(c, &f, PGJOBQ_DRY_RUN, &n, &skipped));
    CHECK_INT(n, 3);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE state = 'failed'"), 6);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs"), 0);

    /* The retry moves exactly those, keeping ids and attempts and allowing one more attempt. */
    CHECK_OK(c, pgjobq_retry_where(c, &f, 0, &n, &skipped));
    CHECK_INT(n, 3);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'queued' AND queue = 'mail' AND kind = 'send'"
                        " AND attempt = 1 AND max_attempts >= 2 AND last_error = 'boom' AND run_at <= now()"),
              3);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE state = 'failed'"), 3);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld", (long long)old), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 6); /* nothing lost, nothing doubled */
    /* Again: nothing left to match. */
    CHECK_OK(c, pgjobq_retry_where(c, &f, 0, &n, &skipped));
    CHECK_INT(n, 0);
    /* The retried jobs run again. */
    pgjobq_job *jobs = NULL;
    size_t got = 0;
    CHECK_OK(c, pgjobq_claim(c, "mail", 10, 60000, "t", &jobs, &got));
    CHECK_INT((long long)got, 3);
    for (size_t i = 0; i < got; i++) {
        CHECK_INT(jobs[i].attempt, 2);
        CHECK_OK(c, pgjobq_job_complete(c, jobs[i].id, jobs[i].lease_token, NULL));
    }
    pgjobq_jobs_free(jobs);

    /* Completed and cancelled jobs can be retried the same way; sms was never touched. */
    f.kind = NULL;
    f.since_ms = 0;
    f.state = PGJOBQ_COMPLETED;
    CHECK_OK(c, pgjobq_retry_where(c, &f, 0, &n, NULL));
    CHECK_INT(n, 3);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'sms' AND state = 'failed'"), 1);
    pgjobq_client_close(c);
    PQfinish(pg);
}

TEST(retry_where_leaves_a_job_whose_unique_key_is_held)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    int64_t n = -1, skipped = -1;

    int64_t k1_old = put(c, "q", "k", "k1");
    fail_all(c, "q");
    int64_t k1_new = put(c, "q", "k", "k1"); /* the key is free again once the first failed */
    put(c, "q", "k", "k2");
    put(c, "q", "k", NULL);
    fail_all(c, "q");
    put(c, "q", "k", "k2"); /* k2 is held by a live job */
    PQclear(t_exec(pg, "UPDATE pgjobq.history SET finished_at = now() - interval '1 minute' WHERE id = %lld",
                   (long long)k1_old));

    f.queue = "q";
    CHECK_OK(c, pgjobq_retry_where(c, &f, PGJOBQ_DRY_RUN, &n, &skipped));
    CHECK_INT(n, 2);
    CHECK_INT(skipped, 2);
    CHECK_OK(c, pgjobq_retry_where(c, &f, 0, &n, &skipped));
    CHECK_INT(n, 2); /* the newest k1 and the one without a key */
    CHECK_INT(skipped, 2);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld", (long long)k1_new), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'failed'",
                    (long long)k1_old),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE unique_key = 'k2' AND state = 'failed'"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 5);
    pgjobq_client_close(c);
    PQfinish(pg);
}

TEST(retry_where_queued_makes_scheduled_jobs_due_now)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    int64_t n = -1;

    for (int i = 0; i < 4; i++)
        put(c, "later", "k", NULL);
    put(c, "later", "other", NULL);
    put(c, "now", "k", NULL);
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET run_at = now() + interval '1 hour'"));
    f.queue = "later";
    f.state = PGJOBQ_QUEUED;
    f.kind = "k";
    CHECK_OK(c, pgjobq_retry_where(c, &f, PGJOBQ_DRY_RUN, &n, NULL));
    CHECK_INT(n, 4);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE run_at <= now()"), 0);
    CHECK_OK(c, pgjobq_retry_where(c, &f, 0, &n, NULL));
    CHECK_INT(n, 4);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE run_at <= now()"), 4);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE run_at <= now() AND queue = 'later' AND kind = 'k'"),
              4);
    pgjobq_client_close(c);
    PQfinish(pg);
}

TEST(cancel_where_cancels_queued_jobs_and_marks_running_ones)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    pgjobq_job *jobs = NULL;
    size_t got = 0;
    int64_t n = -1;

    for (int i = 0; i < 2; i++)
        put(c, "work", "a", NULL);
    CHECK_OK(c, pgjobq_claim(c, "work", 2, 60000, "t", &jobs, &got));
    CHECK_INT((long long)got, 2);
    for (int i = 0; i < 5; i++)
        put(c, "work", "a", NULL);
    put(c, "work", "b", NULL);
    put(c, "other", "a", NULL);

    f.queue = "work";
    f.state = PGJOBQ_QUEUED;
    f.kind = "a";
    CHECK_OK(c, pgjobq_cancel_where(c, &f, PGJOBQ_DRY_RUN, &n));
    CHECK_INT(n, 5);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'queued'"), 7);
    CHECK_OK(c, pgjobq_cancel_where(c, &f, 0, &n));
    CHECK_INT(n, 5);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE state = 'cancelled' AND queue = 'work'"
                        " AND kind = 'a'"),
              5);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'queued'"), 2); /* b and other */

    /* Running jobs: a cancel is requested, and the holder learns it at its next heartbeat. */
    f.state = PGJOBQ_RUNNING;
    f.kind = NULL;
    CHECK_OK(c, pgjobq_cancel_where(c, &f, PGJOBQ_DRY_RUN, &n));
    CHECK_INT(n, 2);
    CHECK_OK(c, pgjobq_cancel_where(c, &f, 0, &n));
    CHECK_INT(n, 2);
    CHECK_OK(c, pgjobq_cancel_where(c, &f, 0, &n));
    CHECK_INT(n, 0); /* already requested */
    CHECK_RC(c, pgjobq_job_extend(c, jobs[0].id, jobs[0].lease_token, 60000), PGJOBQ_ECANCELLED);
    CHECK_RC(c, pgjobq_job_complete(c, jobs[1].id, jobs[1].lease_token, NULL), PGJOBQ_ECANCELLED);
    pgjobq_jobs_free(jobs);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE state = 'cancelled'"), 7);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 9);
    pgjobq_client_close(c);
    PQfinish(pg);
}

TEST(bulk_calls_reject_bad_filters_by_name)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    int64_t n = 0;

    put(c, "q", "k", NULL);
    CHECK_RC(c, pgjobq_retry_where(c, NULL, 0, &n, NULL), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_retry_where(c, &f, 0, &n, NULL), PGJOBQ_EINVAL); /* no queue */
    f.queue = "bad queue";
    CHECK_RC(c, pgjobq_cancel_where(c, &f, 0, &n), PGJOBQ_EINVAL);
    CHECK(strstr(pgjobq_errmsg(c), "queue name") != NULL);
    f.queue = "q";
    f.state = PGJOBQ_RUNNING;
    CHECK_RC(c, pgjobq_retry_where(c, &f, 0, &n, NULL), PGJOBQ_EINVAL);
    f.state = PGJOBQ_FAILED;
    CHECK_RC(c, pgjobq_cancel_where(c, &f, 0, &n), PGJOBQ_EINVAL);
    f.state = PGJOBQ_QUEUED;
    f.since_ms = -1;
    CHECK_RC(c, pgjobq_cancel_where(c, &f, 0, &n), PGJOBQ_EINVAL);
    f.since_ms = 0;
    CHECK_RC(c, pgjobq_cancel_where(c, &f, 4, &n), PGJOBQ_EINVAL); /* unknown flag */

    /* The SQL API names the argument and the rule, with no page of CONTEXT. */
    const struct {
        const char *sql, *want;
    } cases[] = {
        {"SELECT * FROM pgjobq.retry_where('q', 'running')", "state must be failed, cancelled, completed or queued"},
        {"SELECT * FROM pgjobq.retry_where(NULL, 'failed')", "queue must not be null"},
        {"SELECT pgjobq.cancel_where('q', 'failed')", "state must be queued or running"},
        {"SELECT pgjobq.cancel_where('q', 'queued', '9kind')", "kind \"9kind\" is not a kind name"},
        {"SELECT pgjobq.cancel_where('q', 'queued', NULL, '-1 hour')", "since must be a positive interval"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        PGresult *r = PQexec(pg, cases[i].sql);
        CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22023");
        CHECK_MSG(strstr(PQresultErrorMessage(r), cases[i].want) != NULL, "%s: %s", cases[i].sql,
                  PQresultErrorMessage(r));
        PQclear(r);
    }
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'queued'"), 1);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* Claimers racing a bulk cancel: each job ends either claimed or cancelled, never both, never neither,
 * and the count the cancel returns is what it did. */
#define RACE_JOBS 3000

typedef struct race {
    atomic_int stop;
    atomic_llong claimed;
} race;

static void *claimer(void *arg)
{
    race *r = arg;
    pgjobq_client *c = NULL;
    CHECK_OK(c, pgjobq_client_open(&c, t_conninfo()));
    while (!atomic_load(&r->stop)) {
        pgjobq_job *jobs = NULL;
        size_t n = 0;
        CHECK_OK(c, pgjobq_claim(c, "race", 20, 60000, "t", &jobs, &n));
        atomic_fetch_add(&r->claimed, (long long)n);
        pgjobq_jobs_free(jobs);
        if (n == 0)
            break;
    }
    pgjobq_client_close(c);
    return NULL;
}

TEST(cancel_where_racing_claimers_loses_and_doubles_nothing)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    pthread_t th[2];
    race r;
    int64_t n = -1;

    atomic_init(&r.stop, 0);
    atomic_init(&r.claimed, 0);
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(array_fill('race'::text, ARRAY[%d]), NULL,"
                       " array_fill('{}'::jsonb, ARRAY[%d]))",
                   RACE_JOBS, RACE_JOBS));
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&th[i], NULL, claimer, &r) == 0);
    /* Cancel while they claim: once they have started, and well before they could be done. */
    int64_t t0 = t_now_ms();
    while (atomic_load(&r.claimed) < 40 && t_now_ms() - t0 < 10000)
        sched_yield();
    f.queue = "race";
    f.state = PGJOBQ_QUEUED;
    CHECK_OK(c, pgjobq_cancel_where(c, &f, 0, &n));
    atomic_store(&r.stop, 1);
    for (int i = 0; i < 2; i++)
        CHECK(pthread_join(th[i], NULL) == 0);

    long long claimed = atomic_load(&r.claimed);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE state = 'cancelled'"), n);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'running'"), claimed);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'queued'"), 0);
    CHECK_INT(n + claimed, RACE_JOBS);
    CHECK_MSG(claimed > 0 && n > 0, "no race: claimed %lld, cancelled %lld", claimed, (long long)n);
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* Two bulk retries at once: each job moves once, and the counts add up. */
typedef struct retry_arg {
    int64_t retried;
} retry_arg;

static void *retrier(void *arg)
{
    retry_arg *a = arg;
    pgjobq_client *c = NULL;
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    CHECK_OK(c, pgjobq_client_open(&c, t_conninfo()));
    f.queue = "again";
    f.state = PGJOBQ_CANCELLED;
    CHECK_OK(c, pgjobq_retry_where(c, &f, 0, &a->retried, NULL));
    pgjobq_client_close(c);
    return NULL;
}

TEST(retry_where_twice_at_once_moves_each_job_once)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    retry_arg a[2] = {{-1}, {-1}};
    pthread_t th[2];
    int64_t n = -1;

    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(array_fill('again'::text, ARRAY[%d]), NULL,"
                       " array_fill('{}'::jsonb, ARRAY[%d]))",
                   RACE_JOBS, RACE_JOBS));
    f.queue = "again";
    f.state = PGJOBQ_QUEUED;
    CHECK_OK(c, pgjobq_cancel_where(c, &f, 0, &n));
    CHECK_INT(n, RACE_JOBS);
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&th[i], NULL, retrier, &a[i]) == 0);
    for (int i = 0; i < 2; i++)
        CHECK(pthread_join(th[i], NULL) == 0);
    CHECK_INT(a[0].retried + a[1].retried, RACE_JOBS);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'queued'"), RACE_JOBS);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history"), 0);
    pgjobq_client_close(c);
    PQfinish(pg);
}

TEST(cli_retry_and_cancel_by_filter)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    char *out = NULL, *err = NULL;

    for (int i = 0; i < 3; i++)
        put(c, "mail", "send", NULL);
    put(c, "mail", "other", NULL);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "cancel", "--queue", "mail", "--state", "queued", "--kind", "send",
                    "--dry-run", NULL),
              0);
    CHECK_STR(out, "would cancel 3 queued jobs of queue mail\n");
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'queued'"), 4);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "cancel", "-q", "mail", "-s", "queued", "-k", "send", "--since", "1h",
                    "--json", NULL),
              0);
    CHECK_STR(out, "{\"cancelled\":3,\"dry_run\":false}\n");
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "retry", "--queue", "mail", "--state", "cancelled", NULL), 0);
    CHECK_STR(out, "retried 3 cancelled jobs of queue mail: queued to run again now\n");
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'queued'"), 4);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "retry", "--queue", "mail", "--state", "failed", "--json", NULL), 0);
    CHECK_STR(out, "{\"retried\":0,\"skipped\":0,\"dry_run\":false}\n");
    free(out);
    free(err);

    /* Bad input: a usage error (EX_USAGE), and nothing changed. */
    const char *const bad[][10] = {
        {"retry", "--queue", "mail", NULL},
        {"retry", "--state", "failed", NULL},
        {"retry", "--queue", "mail", "--state", "running", NULL},
        {"retry", "7", "--queue", "mail", "--state", "failed", NULL},
        {"retry", "7", "--dry-run", NULL},
        {"cancel", "--queue", "mail", "--state", "completed", NULL},
        {"cancel", "--queue", "mail", "--state", "queued", "--since", "0s", NULL},
        {"cancel", "--queue", "no such queue", "--state", "queued", NULL},
        {"cancel", "--queue", "mail", "--state", "sleeping", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *const *a = bad[i];
        int rc = t_cli(&out, &err, NULL, 0, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], NULL);
        CHECK_MSG(rc == 64, "pgjobq %s %s %s %s %s: exit %d, stderr %s", a[0], a[1], a[2], a[3] ? a[3] : "",
                  a[4] ? a[4] : "", rc, err);
        CHECK_MSG(strncmp(err, "pgjobq ", 7) == 0, "stderr: %s", err);
        free(out);
        free(err);
    }
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'queued'"), 4);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history"), 0);
    pgjobq_client_close(c);
    PQfinish(pg);
}
