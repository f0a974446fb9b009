/*
 * test_strict.c - strict order per key (issue 41; docs/queues.md, "Strict order per key") against the
 * real server: in a strict queue the jobs of a key run one at a time in the order of their ids, whatever
 * their priorities, while keys run in parallel; a key's first job that runs, backs off before a retry,
 * waits for its parents or lost its lease holds the rest of the key back; one that fails for good
 * blocks its key until it is retried or skipped (SQL, C, the command); racing claimers never start two
 * jobs of a key, and every key finishes its jobs in order.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

/* Claims from `queue` and returns the concurrency keys (or "-") of the jobs claimed, sorted, joined by
 * commas ("" when none); the jobs keep running. */
static char *claimed_keys(PGconn *pg, const char *queue)
{
    return t_str(pg,
                 "SELECT coalesce(string_agg(coalesce(j.concurrency_key, '-') || ':' || (j.payload ->> 'n'), ','"
                 " ORDER BY j.concurrency_key, j.id), '')"
                 " FROM pgjobq.claim_batch('%s', 10, '1 minute', 'w') c JOIN pgjobq.jobs j ON j.id = c.id",
                 queue);
}

static int64_t enq(pgjobq_client *c, const char *queue, const char *key, int n, int priority)
{
    char payload[32];
    int64_t id = 0;
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;

    o.queue = queue;
    o.concurrency_key = key;
    o.priority = priority;
    snprintf(payload, sizeof payload, "{\"n\": %d}", n);
    CHECK_OK(c, pgjobq_enqueue(c, payload, &o, &id));
    return id;
}

/* Ends running job `id`: complete, fail for a retry after `delay` (SQL interval), or fail for good. */
static void finish(PGconn *pg, int64_t id, const char *how, const char *delay)
{
    if (strcmp(how, "complete") == 0)
        PQclear(t_exec(pg, "SELECT pgjobq.complete_many(ARRAY[%lld::bigint], ARRAY[(SELECT lease_token FROM pgjobq.jobs"
                           " WHERE id = %lld)], NULL)",
                       (long long)id, (long long)id));
    else
        PQclear(t_exec(pg,
                       "SELECT pgjobq.fail_many(ARRAY[%lld::bigint], ARRAY[(SELECT lease_token FROM pgjobq.jobs"
                       " WHERE id = %lld)], ARRAY['boom'], ARRAY['%s'::interval], ARRAY[%s])",
                       (long long)id, (long long)id, delay ? delay : "0", strcmp(how, "fail") == 0 ? "true" : "false"));
}

TEST(strict_jobs_of_a_key_run_one_at_a_time_in_order_and_a_failure_blocks_the_key)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    char *got;

    CHECK_OK(c, pgjobq_queue_set_strict_order(c, "seq", 1));
    /* Priorities do not reorder a key: its third job has the best priority. */
    int64_t a1 = enq(c, "seq", "a", 1, 0), b1 = enq(c, "seq", "b", 1, 0), a2 = enq(c, "seq", "a", 2, 0);
    int64_t b2 = enq(c, "seq", "b", 2, 0), a3 = enq(c, "seq", "a", 3, -5);
    got = claimed_keys(pg, "seq");
    CHECK_STR(got, "a:1,b:1");
    free(got);
    got = claimed_keys(pg, "seq");
    CHECK_STR(got, "");
    free(got);
    /* A claim that keys held back says so (limited): the worker claims again as soon as one of its
     * jobs ends, rather than at its next poll, since that may free a key. */
    got = t_str(pg, "SELECT limited::text FROM pgjobq.claim_next('seq', 10, '1 minute', 'w') WHERE meta = 'tick'");
    CHECK_STR(got, "true");
    free(got);
    finish(pg, a1, "complete", NULL);
    got = claimed_keys(pg, "seq");
    CHECK_STR(got, "a:2");
    free(got);

    /* A first job backing off before its retry holds its key. */
    finish(pg, b1, "retry", "1 hour");
    got = claimed_keys(pg, "seq");
    CHECK_STR(got, "");
    free(got);
    /* Its retry comes due: it runs, before the rest of its key. */
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET run_at = now() - interval '1 second' WHERE id = %lld", (long long)b1));
    got = claimed_keys(pg, "seq");
    CHECK_STR(got, "b:1");
    free(got);

    /* It fails for good: the key is blocked, in the same transaction as the failure. */
    finish(pg, b1, "fail", NULL);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.sequence_blocks WHERE queue = 'seq' AND key = 'b' AND job_id = %lld",
                    (long long)b1),
              1);
    got = claimed_keys(pg, "seq");
    CHECK_STR(got, "");
    free(got);
    pgjobq_queue_info *qs = NULL;
    size_t nq = 0;
    CHECK_OK(c, pgjobq_queue_list(c, &qs, &nq));
    CHECK_INT((long long)nq, 1);
    CHECK_INT(qs[0].strict_order, 1);
    pgjobq_queue_list_free(qs);
    CHECK_INT(t_int(pg, "SELECT blocked_keys FROM pgjobq.queue_list() WHERE queue = 'seq'"), 1);

    /* Retried by hand, it is back first in line and the block is gone. */
    CHECK_OK(c, pgjobq_job_retry(c, b1));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.sequence_blocks"), 0);
    got = claimed_keys(pg, "seq");
    CHECK_STR(got, "b:1");
    free(got);
    finish(pg, b1, "fail", NULL);
    /* Skipped, it stays failed and the key moves on. */
    CHECK_OK(c, pgjobq_job_skip(c, b1));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'failed'", (long long)b1), 1);
    got = claimed_keys(pg, "seq");
    CHECK_STR(got, "b:2");
    free(got);
    CHECK_RC(c, pgjobq_job_skip(c, b1), PGJOBQ_ESTATE);
    CHECK_RC(c, pgjobq_job_skip(c, b2), PGJOBQ_ESTATE);
    CHECK_RC(c, pgjobq_job_skip(c, 987654321), PGJOBQ_ENOTFOUND);

    /* A first job whose lease expired holds its key until the rescue gives it back, and it runs again
     * first. */
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET lease_until = now() - interval '1 second' WHERE id = %lld",
                   (long long)a2));
    got = claimed_keys(pg, "seq");
    CHECK_STR(got, "");
    free(got);
    CHECK_INT(t_int(pg, "SELECT pgjobq.rescue_expired(100)"), 1);
    got = claimed_keys(pg, "seq");
    CHECK_STR(got, "a:2");
    free(got);
    /* Cancelled while backing off, the first job lets the next run. */
    finish(pg, a2, "retry", "1 hour");
    pgjobq_state st;
    CHECK_OK(c, pgjobq_job_cancel(c, a2, &st));
    got = claimed_keys(pg, "seq");
    CHECK_STR(got, "a:3");
    free(got);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'running'", (long long)a3), 1);

    /* A first job waiting for its parents holds its key too; jobs without a key run as in any queue. */
    int64_t parent = enq(c, "elsewhere", NULL, 0, 0);
    int64_t after[] = {parent, 0};
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    o.queue = "seq";
    o.concurrency_key = "c";
    o.after = after;
    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 1}", &o, NULL));
    enq(c, "seq", "c", 2, 0);
    enq(c, "seq", NULL, 7, 0);
    got = claimed_keys(pg, "seq");
    CHECK_STR(got, "-:7");
    free(got);

    /* Off again, the queue claims as any: the rest of c runs without waiting. */
    CHECK_OK(c, pgjobq_queue_set_strict_order(c, "seq", 0));
    got = claimed_keys(pg, "seq");
    CHECK_STR(got, "c:2");
    free(got);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* The settings, the skip and the block through the command; bad input is refused and changes nothing. */
TEST(strict_order_from_the_command_line)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    char *out = NULL, *err = NULL;

    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "orders", "--strict-order", "on", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE name = 'orders' AND strict_order"), 1);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "orders", "--strict-order", "maybe", NULL), 64);
    CHECK_MSG(strstr(err, "--strict-order") != NULL, "%s", err);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE name = 'orders' AND strict_order"), 1);
    free(t_expect_error(pg, "22023", "SELECT pgjobq.queue_set('orders', '{\"strict_order\": \"yes\"}')"));

    int64_t id = enq(c, "orders", "customer:9", 1, 0);
    enq(c, "orders", "customer:9", 2, 0);
    char *got = claimed_keys(pg, "orders");
    CHECK_STR(got, "customer:9:1");
    free(got);
    finish(pg, id, "fail", NULL);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "ls", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"strict_order\":true") && strstr(out, "\"blocked_keys\":1"), "queue ls --json: %s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "ls", NULL), 0);
    CHECK_MSG(strstr(out, "strict") != NULL, "queue ls: %s", out);
    free(out);
    free(err);
    char ids[24];
    snprintf(ids, sizeof ids, "%lld", (long long)id);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", ids, NULL), 0);
    CHECK_MSG(strstr(out, "blocks key:") && strstr(out, "customer:9"), "show: %s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", ids, "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"blocks_key\":\"customer:9\"") && strstr(out, "\"concurrency_key\":\"customer:9\""),
              "show --json: %s", out);
    free(out);
    free(err);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "skip", ids, NULL), 0);
    free(out);
    free(err);
    got = claimed_keys(pg, "orders");
    CHECK_STR(got, "customer:9:2");
    free(got);
    /* Skipped already, the job blocks nothing, and an unknown id is no job: bad input (EX_DATAERR). */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "skip", ids, NULL), 65);
    CHECK_MSG(strstr(err, "blocks no key") != NULL, "%s", err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "skip", "987654321", NULL), 65);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "skip", "x", NULL), 64);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "orders", "--strict-order", "off", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE name = 'orders' AND strict_order"), 0);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* Racing claimers: 8 threads claim from a strict queue of 12 keys, each job completing or failing for a
 * retry at random.  No key ever has two jobs running, every job completes, and each key's jobs finish
 * in the order of their ids. */
static atomic_llong strict_most, strict_claims;

static void *strict_claimer(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u;
    PGconn *pg = PQconnectdb(t_conninfo());
    if (PQstatus(pg) != CONNECTION_OK)
        return (void *)1;
    for (int idle = 0; idle < 300;) {
        PGresult *r = PQexec(pg, "SELECT id, lease_token FROM pgjobq.claim_batch('line', 3, '30 s', 'racer')");
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
            fprintf(stderr, "claim: %s", PQerrorMessage(pg));
            PQclear(r);
            PQfinish(pg);
            return (void *)2;
        }
        int n = PQntuples(r);
        if (n == 0) {
            PQclear(r);
            long long left = 0;
            PGresult *q = PQexec(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'line'");
            if (PQresultStatus(q) == PGRES_TUPLES_OK)
                left = atoll(PQgetvalue(q, 0, 0));
            PQclear(q);
            if (left == 0)
                break;
            idle++;
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
            continue;
        }
        atomic_fetch_add(&strict_claims, n);
        PGresult *look = PQexec(pg, "SELECT coalesce(max(k.n), 0) FROM (SELECT count(*) AS n FROM pgjobq.jobs"
                                    " WHERE queue = 'line' AND state = 'running' GROUP BY concurrency_key) k");
        long long most = PQresultStatus(look) == PGRES_TUPLES_OK ? atoll(PQgetvalue(look, 0, 0)) : 99;
        PQclear(look);
        long long seen = atomic_load(&strict_most);
        while (most > seen && !atomic_compare_exchange_weak(&strict_most, &seen, most))
            ;
        for (int i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            const char *values[2] = {PQgetvalue(r, i, 0), PQgetvalue(r, i, 1)};
            PGresult *w = (seed >> 8) % 6 == 0
                              ? PQexecParams(pg,
                                             "SELECT pgjobq.fail_many(ARRAY[$1::bigint], ARRAY[$2::bigint],"
                                             " ARRAY['again'], ARRAY[interval '0'], ARRAY[false])",
                                             2, NULL, values, NULL, NULL, 0)
                              : PQexecParams(pg, "SELECT pgjobq.complete_many(ARRAY[$1::bigint], ARRAY[$2::bigint], NULL)",
                                             2, NULL, values, NULL, NULL, 0);
            PQclear(w);
        }
        PQclear(r);
    }
    PQfinish(pg);
    return NULL;
}

TEST_FULL(strict_racing_claimers_run_each_key_in_order_one_at_a_time, 180, 0)
{
    enum { KEYS = 12, PER_KEY = 15 };
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pthread_t t[8];

    CHECK_OK(c, pgjobq_queue_set_strict_order(c, "line", 1));
    /* Enough attempts that no job fails for good. */
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(array_agg('line'::text ORDER BY g), NULL,"
                       " array_agg(jsonb_build_object('n', g) ORDER BY g), NULL, NULL, NULL,"
                       " array_fill(1000, ARRAY[%d]), NULL, array_agg('k' || (g %% %d) ORDER BY g))"
                       " FROM generate_series(1, %d) g",
                   KEYS * PER_KEY, KEYS, KEYS * PER_KEY));
    CHECK_INT(t_int(pg, "SELECT count(DISTINCT concurrency_key) FROM pgjobq.jobs WHERE queue = 'line'"), KEYS);
    for (int i = 0; i < 8; i++)
        CHECK(pthread_create(&t[i], NULL, strict_claimer, (void *)(uintptr_t)(i + 1)) == 0);
    for (int i = 0; i < 8; i++) {
        void *rv = NULL;
        pthread_join(t[i], &rv);
        CHECK_MSG(rv == NULL, "claimer %d failed (%ld)", i, (long)(intptr_t)rv);
    }
    printf("8 claimers, %d keys: %lld claims, at most %lld of one key running in any look\n", KEYS,
           (long long)strict_claims, (long long)strict_most);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'line' AND state = 'completed'"),
              KEYS * PER_KEY);
    CHECK_MSG(strict_claims > KEYS * PER_KEY, "no retry happened (%lld claims)", (long long)strict_claims);
    CHECK_MSG(strict_most == 1, "%lld jobs of one key ran at once", (long long)strict_most);
    /* Each key's jobs finished in id order.  (A job's completion begins after its claim committed, which
     * was after the completion of the one before it: its finished_at, the start of that transaction, is
     * later.  Its started_at is not a witness: a claim's transaction may begin before the completion it
     * waits behind.) */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM (SELECT id, lag(id) OVER w AS prev_id FROM pgjobq.history"
                        " WHERE queue = 'line' WINDOW w AS (PARTITION BY concurrency_key ORDER BY finished_at, id)) x"
                        " WHERE x.prev_id > x.id"),
              0);
    PQfinish(pg);
    pgjobq_client_close(c);
}
