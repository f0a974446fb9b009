/*
 * test_transitions.c - failure and retry with backoff, results, cancel, manual retry, and a failure
 * path that cannot fail on its own error text.
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static pgjobq_job *claim_one(pgjobq_client *c)
{
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    CHECK_OK(c, pgjobq_claim(c, "default", 1, 60000, "w", &jobs, &n));
    CHECK_INT(n, 1);
    return jobs;
}

TEST(fail_retries_with_backoff_until_max_attempts)
{
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    PGconn *pg = t_pg();
    pgjobq_state st;
    int64_t id;

    o.max_attempts = 3;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));

    /* Attempt 1 fails with the backoff formula: 2^1 s +-10%, from the database's now().  (The lower
     * bound below leaves room for a stalled machine; the jitter's range is checked exactly further
     * down, on pgjobq.backoff itself.) */
    pgjobq_job *j = claim_one(c);
    CHECK_OK(c, pgjobq_job_fail(c, j->id, j->lease_token, "first failure", PGJOBQ_BACKOFF, 0, &st));
    CHECK_INT(st, PGJOBQ_QUEUED);
    CHECK_INT(t_int(pg,
                    "SELECT (run_at - now() BETWEEN interval '0.5 s' AND interval '2.2 s')::int"
                    " FROM pgjobq.all_jobs WHERE id = %lld",
                    (long long)id),
              1);
    char *err = t_str(pg, "SELECT last_error FROM pgjobq.all_jobs WHERE id = %lld", (long long)id);
    CHECK_STR(err, "first failure");
    free(err);
    pgjobq_jobs_free(j);
    /* Not claimable before its run_at. */
    pgjobq_job *none = NULL;
    size_t n = 9;
    CHECK_OK(c, pgjobq_claim(c, "default", 1, 60000, "w", &none, &n));
    CHECK_INT(n, 0);

    /* The backoff grows with the attempt: check the formula over many draws. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM generate_series(1, 200) g, LATERAL (SELECT pgjobq.backoff(3) b) x"
                        " WHERE b < interval '7.2 s' OR b > interval '8.8 s'"),
              0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM generate_series(1, 50) g WHERE pgjobq.backoff(20) > interval '3960 s'"),
              0);

    /* Move it along: attempt 2 fails with an explicit 0 delay and is claimable at once. */
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET run_at = now() WHERE id = %lld", (long long)id));
    j = claim_one(c);
    CHECK_INT(j->attempt, 2);
    CHECK_OK(c, pgjobq_job_fail(c, j->id, j->lease_token, "second failure", 0, 0, &st));
    CHECK_INT(st, PGJOBQ_QUEUED);
    pgjobq_jobs_free(j);
    j = claim_one(c);
    CHECK_INT(j->attempt, 3);
    /* The last attempt fails: the job ends failed, keeping the error. */
    CHECK_OK(c, pgjobq_job_fail(c, j->id, j->lease_token, "third failure", 0, 0, &st));
    CHECK_INT(st, PGJOBQ_FAILED);
    pgjobq_jobs_free(j);
    CHECK_OK(c, pgjobq_job_get(c, id, &j));
    CHECK_INT(j->state, PGJOBQ_FAILED);
    CHECK_STR(j->last_error, "third failure");
    CHECK(j->finished_at != PGJOBQ_TIME_NONE);
    pgjobq_jobs_free(j);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(fail_permanent_and_retry_at_explicit_delay)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_state st;
    int64_t a, b;

    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &a));
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &b));
    pgjobq_job *j = claim_one(c);
    CHECK_OK(c, pgjobq_job_fail(c, j->id, j->lease_token, "bad payload", 0, PGJOBQ_FAIL_PERMANENT, &st));
    CHECK_INT(st, PGJOBQ_FAILED);
    pgjobq_jobs_free(j);
    j = claim_one(c);
    CHECK_OK(c, pgjobq_job_fail(c, j->id, j->lease_token, "try in an hour", 3600000, 0, &st));
    CHECK_INT(st, PGJOBQ_QUEUED);
    /* The delay counts from the failing statement's now(), which this query cannot see exactly. */
    CHECK_INT(t_int(pg,
                    "SELECT (run_at - now() BETWEEN interval '3590 s' AND interval '3600 s')::int"
                    " FROM pgjobq.all_jobs WHERE id = %lld",
                    (long long)j->id),
              1);
    CHECK_RC(c, pgjobq_job_fail(c, j->id, j->lease_token, "x", -5, 0, &st), PGJOBQ_EINVAL);
    pgjobq_jobs_free(j);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(fail_stores_any_error_text_sanitised_and_capped)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    char *huge = malloc(100000);
    int64_t id;

    CHECK(huge != NULL);
    /* Invalid UTF-8 (a lone continuation byte, an overlong form, a truncated sequence) and 100 KB. */
    memset(huge, 'e', 99999);
    huge[99999] = '\0';
    static const char prefix[] = "bad bytes: \x80 \xc0\xaf \xe2\x82 end";
    memcpy(huge, prefix, sizeof prefix - 1);
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id));
    pgjobq_job *j = claim_one(c);
    CHECK_OK(c, pgjobq_job_fail(c, j->id, j->lease_token, huge, 0, 0, NULL));
    CHECK_INT(t_int(pg,
                    "SELECT (octet_length(last_error) <= %d AND last_error LIKE 'bad bytes: %%')::int"
                    " FROM pgjobq.all_jobs WHERE id = %lld",
                    PGJOBQ_ERROR_MAX, (long long)id),
              1);
    CHECK_INT(t_int(pg, "SELECT (state = 'queued')::int FROM pgjobq.all_jobs WHERE id = %lld", (long long)id), 1);
    pgjobq_jobs_free(j);
    free(huge);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(complete_stores_the_result_and_keeps_history)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    int64_t id;

    CHECK_OK(c, pgjobq_enqueue(c, "{\"n\": 21}", NULL, &id));
    pgjobq_job *j = claim_one(c);
    CHECK_RC(c, pgjobq_job_complete(c, j->id, j->lease_token, "{not json"), PGJOBQ_EINVAL);
    CHECK_OK(c, pgjobq_job_complete(c, j->id, j->lease_token, "{\"answer\": 42}"));
    /* A second completion is refused: the job is no longer running. */
    CHECK_RC(c, pgjobq_job_complete(c, j->id, j->lease_token, "{\"answer\": 43}"), PGJOBQ_ELEASE);
    pgjobq_jobs_free(j);
    CHECK_OK(c, pgjobq_job_get(c, id, &j));
    CHECK_INT(j->state, PGJOBQ_COMPLETED);
    CHECK_STR(j->result, "{\"answer\": 42}");
    CHECK_STR(j->payload, "{\"n\": 21}");
    CHECK(j->finished_at >= j->started_at && j->lease_until == PGJOBQ_TIME_NONE);
    pgjobq_jobs_free(j);
    /* It left the hot table for history. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld", (long long)id), 1);
    /* Finished jobs stay until retention prunes them, completed ones an hour at a time: the hour's
     * partition is dropped once all of the hour is older than the retention, so this hour's job
     * stays even with a retention of 0. */
    int deleted = -1;
    CHECK_OK(c, pgjobq_prune(c, 3600000, 3600000, 100, &deleted));
    CHECK_INT(deleted, 0);
    CHECK_OK(c, pgjobq_prune(c, 0, 0, 100, &deleted));
    CHECK_INT(deleted, 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs"), 1);
    /* Older history: an hour three hours ago that has a partition, two days ago (no partition: the
     * default one), a failure eight days ago and one two days ago. */
    PQclear(t_exec(pg, "SELECT pgjobq.history_partition_create(now() - interval '3 hours')"));
    PQclear(t_exec(pg, "INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts,"
                       " run_at, created_at, finished_at, lease_token)"
                       " SELECT -g, 'old', 'default', '{}', 0, s::pgjobq.job_state, 1, 1, now(), now(),"
                       " now() - a::interval, 1"
                       " FROM (VALUES (1, 'completed', '3 hours'), (2, 'cancelled', '2 days'), (3, 'failed', '8 days'),"
                       " (4, 'failed', '2 days')) v(g, s, a)"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history_done_default"), 1);
    CHECK_OK(c, pgjobq_prune(c, 3600000, INT64_C(7) * 24 * 3600000, 100, &deleted));
    CHECK_INT(deleted, 3);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'old'"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'old' AND state = 'failed'"
                        " AND finished_at > now() - interval '3 days'"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_class WHERE relname = 'history_p' ||"
                        " to_char((now() - interval '3 hours') AT TIME ZONE 'UTC', 'YYYYMMDDHH24')"), 0);
    /* The next 48 hours have partitions. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_class WHERE relname = 'history_p' ||"
                        " to_char((now() + interval '47 hours') AT TIME ZONE 'UTC', 'YYYYMMDDHH24')"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue <> 'old'"), 1);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(cancel_queued_running_and_finished_jobs)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_state st;
    int64_t queued, running, running2;

    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &running));
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &running2));
    pgjobq_job *j1 = claim_one(c), *j2 = claim_one(c);
    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &queued));

    CHECK_OK(c, pgjobq_job_cancel(c, queued, &st));
    CHECK_INT(st, PGJOBQ_CANCELLED);
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'cancelled'"
                    " AND finished_at IS NOT NULL",
                    (long long)queued),
              1);

    /* Running: marked, then the holder learns it at its next heartbeat... */
    CHECK_OK(c, pgjobq_job_cancel(c, running, &st));
    CHECK_INT(st, PGJOBQ_RUNNING);
    CHECK_RC(c, pgjobq_job_extend(c, j1->id, j1->lease_token, 60000), PGJOBQ_ECANCELLED);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'cancelled'", (long long)running),
              1);
    CHECK_RC(c, pgjobq_job_complete(c, j1->id, j1->lease_token, NULL), PGJOBQ_ELEASE);

    /* ...or at its completion, which ends the job cancelled (keeping the result). */
    CHECK_OK(c, pgjobq_job_cancel(c, running2, NULL));
    CHECK_RC(c, pgjobq_job_complete(c, j2->id, j2->lease_token, "{\"partial\": true}"), PGJOBQ_ECANCELLED);
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.all_jobs WHERE id = %lld AND state = 'cancelled'"
                    " AND result = '{\"partial\": true}'",
                    (long long)running2),
              1);

    /* Too late for a finished job. */
    CHECK_RC(c, pgjobq_job_cancel(c, queued, &st), PGJOBQ_ESTATE);
    CHECK_INT(st, PGJOBQ_CANCELLED);
    pgjobq_jobs_free(j1);
    pgjobq_jobs_free(j2);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(retry_runs_a_failed_job_again)
{
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    PGconn *pg = t_pg();
    int64_t id;

    o.max_attempts = 1;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &id));
    pgjobq_job *j = claim_one(c);
    CHECK_RC(c, pgjobq_job_retry(c, id), PGJOBQ_ESTATE); /* running */
    CHECK_OK(c, pgjobq_job_fail(c, j->id, j->lease_token, "boom", 0, 0, NULL));
    pgjobq_jobs_free(j);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'failed'"), 1);
    CHECK_OK(c, pgjobq_job_retry(c, id));
    j = claim_one(c);
    CHECK_INT(j->id, id);
    CHECK_INT(j->attempt, 2);
    CHECK_INT(j->max_attempts, 2);
    CHECK_OK(c, pgjobq_job_complete(c, j->id, j->lease_token, NULL));
    pgjobq_jobs_free(j);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(stats_and_list_report_states)
{
    pgjobq_client *c = t_client();
    pgjobq_job_spec specs[6];
    pgjobq_stat *rows;
    pgjobq_job *jobs;
    size_t n;

    memset(specs, 0, sizeof specs);
    for (int i = 0; i < 6; i++)
        specs[i].opts.queue = i < 4 ? "a" : "b";
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, 6, NULL, NULL));
    CHECK_OK(c, pgjobq_claim(c, "a", 1, 60000, NULL, &jobs, &n));
    pgjobq_jobs_free(jobs);
    CHECK_OK(c, pgjobq_stats(c, &rows, &n));
    CHECK_INT(n, 3);
    CHECK_STR(rows[0].queue, "a");
    CHECK_INT(rows[0].state, PGJOBQ_QUEUED);
    CHECK_INT(rows[0].jobs, 3);
    CHECK_STR(rows[1].queue, "a");
    CHECK_INT(rows[1].state, PGJOBQ_RUNNING);
    CHECK_INT(rows[1].jobs, 1);
    CHECK_STR(rows[2].queue, "b");
    CHECK_INT(rows[2].jobs, 2);
    pgjobq_stats_free(rows);

    pgjobq_list_opts lo = PGJOBQ_LIST_OPTS_INIT;
    lo.queue = "a";
    lo.state = PGJOBQ_QUEUED;
    CHECK_OK(c, pgjobq_job_list(c, &lo, &jobs, &n));
    CHECK_INT(n, 3);
    CHECK(jobs[0].id > jobs[1].id && jobs[1].id > jobs[2].id);
    pgjobq_jobs_free(jobs);
    lo.limit = 2;
    lo.state = -1;
    lo.queue = NULL;
    CHECK_OK(c, pgjobq_job_list(c, &lo, &jobs, &n));
    CHECK_INT(n, 2);
    pgjobq_jobs_free(jobs);
    pgjobq_client_close(c);
}

static char jit_plans[1 << 18];

static void collect_jit_notice(void *arg, const char *msg)
{
    (void)arg;
    strncat(jit_plans, msg, sizeof jit_plans - strlen(jit_plans) - 1);
}

/* Runs sql with auto_explain reporting every nested plan; fails if one of them was JIT-compiled (or
 * if no nested plan was reported at all: then the check would prove nothing). */
static void no_jit(PGconn *pg, const char *what, const char *sql)
{
    jit_plans[0] = '\0';
    PQclear(t_exec(pg, "%s", sql));
    CHECK_MSG(strstr(jit_plans, "Query Text") != NULL, "%s: auto_explain reported no plan", what);
    CHECK_MSG(strstr(jit_plans, "JIT:") == NULL, "%s was JIT-compiled:\n%s", what, jit_plans);
}

/* A plan type turned off costs 1e10 to the planner, so a function that turns one off (the fenced
 * writes turn off sequential scans and nested loops) crosses every JIT threshold whatever its data,
 * unless it turns JIT off too.  fail_many was compiled on every call: 1 s of server CPU on an idle
 * server, 3 s under load, and the worker's heartbeats, queued behind it, lost the leases of every
 * job it held (seen as work_exec_failures_timeouts_and_exit_75 failing in CI). */
TEST(fenced_writes_and_rescue_are_never_jit_compiled)
{
    PGconn *pg = t_pg();

    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('default', 'default', '{}', max_attempts => 2)"
                       " FROM generate_series(1, 7)"));
    PQclear(t_exec(pg, "CREATE TEMP TABLE held AS SELECT id, lease_token, row_number() OVER (ORDER BY id) AS n"
                       " FROM pgjobq.claim('default', 7, '60 seconds', 'w')"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM held"), 7);
    t_auto_explain(pg, collect_jit_notice, 0);
    /* The detector sees a compilation on this server (JIT available, thresholds lowered). */
    PQclear(t_exec(pg, "SET jit_above_cost = 0"));
    jit_plans[0] = '\0';
    PQclear(t_exec(pg, "SELECT sum(g) FROM generate_series(1, 10) g"));
    CHECK_MSG(strstr(jit_plans, "JIT:") != NULL,
              "this server compiled nothing with jit_above_cost = 0 (no llvmjit?): the test cannot see JIT");
    PQclear(t_exec(pg, "RESET jit_above_cost"));

    no_jit(pg, "extend_many", "SELECT * FROM pgjobq.extend_many(ARRAY(SELECT id FROM held ORDER BY n),"
                              " ARRAY(SELECT lease_token FROM held ORDER BY n), '60 seconds')");
    no_jit(pg, "fail_many (a retry)", "SELECT * FROM pgjobq.fail_many(ARRAY(SELECT id FROM held WHERE n = 1),"
                                      " ARRAY(SELECT lease_token FROM held WHERE n = 1), ARRAY['boom'])");
    no_jit(pg, "fail_many (for good)",
           "SELECT * FROM pgjobq.fail_many(ARRAY(SELECT id FROM held WHERE n = 2),"
           " ARRAY(SELECT lease_token FROM held WHERE n = 2), ARRAY['boom'], NULL, ARRAY[true])");
    no_jit(pg, "complete_many", "SELECT * FROM pgjobq.complete_many(ARRAY(SELECT id FROM held WHERE n = 3),"
                                " ARRAY(SELECT lease_token FROM held WHERE n = 3), ARRAY['{\"ok\": 1}'::jsonb])");
    no_jit(pg, "release_many", "SELECT * FROM pgjobq.release_many(ARRAY(SELECT id FROM held WHERE n = 4),"
                               " ARRAY(SELECT lease_token FROM held WHERE n = 4), 'handed back')");
    no_jit(pg, "cancel_many", "SELECT * FROM pgjobq.cancel_many(ARRAY(SELECT id FROM held WHERE n = 5),"
                              " ARRAY(SELECT lease_token FROM held WHERE n = 5), 'stop')");
    no_jit(pg, "cancel (history_move_cancelled)", "SELECT pgjobq.cancel((SELECT id FROM held WHERE n = 4))");
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET lease_until = now() - interval '1 second'"
                       " WHERE id IN (SELECT id FROM held WHERE n >= 6)"));
    no_jit(pg, "rescue_expired", "SELECT pgjobq.rescue_expired()");
    no_jit(pg, "next_due", "SELECT pgjobq.next_due('default')");
    PQclear(t_exec(pg, "SET client_min_messages = 'warning'"));
    /* And each did its work. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs a JOIN held h USING (id) WHERE"
                        " (h.n = 1 AND a.state = 'queued' AND a.last_error = 'boom')"
                        " OR (h.n = 2 AND a.state = 'failed') OR (h.n = 3 AND a.state = 'completed')"
                        " OR (h.n IN (4, 5) AND a.state = 'cancelled')"
                        " OR (h.n >= 6 AND a.state = 'queued' AND a.lease_until IS NULL)"),
              7);
    PQfinish(pg);
}

/* snooze_many's handed_back (a job its worker did not run): given back without counting a snooze, so
 * never failed by the cap; a snooze beside it in the same call is counted, and at the cap is a failed
 * attempt; the four-argument form (older libraries) snoozes, counted.  Arrays of other lengths are
 * refused, whole. */
TEST(snooze_many_counts_snoozes_and_not_hand_backs)
{
    PGconn *pg = t_pg();

    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('sz', 'k', '{}', max_attempts => 1) FROM generate_series(1, 4)"));
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET snoozes = pgjobq.snooze_cap() WHERE queue = 'sz'"));
    PQclear(t_exec(pg, "CREATE TEMP TABLE held AS SELECT id, lease_token, row_number() OVER (ORDER BY id) AS n"
                       " FROM pgjobq.claim('sz', 4, '60 seconds', 'w')"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM held"), 4);
    char *out = t_expect_error(pg, "22023",
                               "SELECT * FROM pgjobq.snooze_many(ARRAY(SELECT id FROM held ORDER BY n),"
                               " ARRAY(SELECT lease_token FROM held ORDER BY n), NULL, NULL, ARRAY[true])");
    CHECK_STR(out, "pgjobq.snooze_many: the arrays must have the same length");
    free(out);
    out = t_str(pg, "SELECT string_agg(s.outcome, ',' ORDER BY h.n) FROM pgjobq.snooze_many("
                    " ARRAY(SELECT id FROM held WHERE n <= 3 ORDER BY n),"
                    " ARRAY(SELECT lease_token FROM held WHERE n <= 3 ORDER BY n),"
                    " ARRAY['unknown kind', 'not yet', 'unknown kind'], ARRAY[interval '1 hour', NULL, NULL],"
                    " ARRAY[true, false, NULL]) s JOIN held h USING (id)");
    CHECK_STR(out, "queued,failed,failed");
    free(out);
    out = t_str(pg, "SELECT string_agg(s.outcome, ',') FROM pgjobq.snooze_many("
                    " ARRAY(SELECT id FROM held WHERE n = 4), ARRAY(SELECT lease_token FROM held WHERE n = 4)) s");
    CHECK_STR(out, "failed");
    free(out);
    /* The hand-back: queued, its attempt given back, its snoozes as they were, due after its delay. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs j JOIN held h USING (id) WHERE h.n = 1"
                        " AND j.state = 'queued' AND j.attempt = 0 AND j.snoozes = pgjobq.snooze_cap()"
                        " AND j.last_error = 'unknown kind' AND j.run_at > now() + interval '59 minutes'"),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history j JOIN held h USING (id) WHERE h.n IN (2, 3, 4)"
                        " AND j.state = 'failed' AND j.last_error LIKE 'snoozed 1000 times, the cap%%'"),
              3);
    PQfinish(pg);
}

/* The first column of the first row of the SQL is expected (a string). */
#define CHECK_SQL_STR(pg, expected, ...)                                                                             \
    do {                                                                                                             \
        char *got_ = t_str(pg, __VA_ARGS__);                                                                         \
        CHECK_STR(got_, expected);                                                                                   \
        free(got_);                                                                                                  \
    } while (0)

/* Every move to the history is tallied where it happens (schema 15), once, as what the job became;
 * the dashboard's last hour (monitor_overview, monitor_finished_per_minute) reads those tallies, not
 * the history; /metrics' tallies (monitor_tallies) stay retries and lost leases. */
TEST(every_move_to_the_history_is_tallied_and_the_last_hour_reads_the_tallies)
{
    PGconn *pg = t_pg();

    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(array_fill('tl'::text, ARRAY[5]), NULL, NULL)"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('tl', max_attempts => 1)"));
    PQclear(t_exec(pg, "CREATE TEMP TABLE h AS SELECT id, lease_token AS t, row_number() OVER (ORDER BY id) AS n"
                       " FROM pgjobq.claim('tl', 6, '1 min', 'w')"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM h"), 6);
    /* 1 and 2 complete; 3 fails for good; 4 fails with attempts left (a retry: not finished); 5 is
     * cancelled by its holder; 6 (one attempt) loses its lease and the rescue ends it failed. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.complete_many(ARRAY(SELECT id FROM h WHERE n <= 2 ORDER BY n),"
                        " ARRAY(SELECT t FROM h WHERE n <= 2 ORDER BY n)) WHERE outcome = 'completed'"),
              2);
    CHECK_SQL_STR(pg, "failed,queued",
                  "SELECT string_agg(outcome, ',' ORDER BY id) FROM pgjobq.fail_many("
                  " ARRAY(SELECT id FROM h WHERE n IN (3, 4) ORDER BY n),"
                  " ARRAY(SELECT t FROM h WHERE n IN (3, 4) ORDER BY n), '{no,again}', NULL, '{true,false}')");
    CHECK_SQL_STR(pg, "cancelled",
                  "SELECT outcome FROM pgjobq.cancel_many(ARRAY(SELECT id FROM h WHERE n = 5),"
                  " ARRAY(SELECT t FROM h WHERE n = 5))");
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET lease_until = now() - interval '1 second'"
                       " WHERE id = (SELECT id FROM h WHERE n = 6)"));
    CHECK_INT(t_int(pg, "SELECT pgjobq.rescue_expired(100)"), 1);
    /* A queued job cancelled (history_move_cancelled), and a workflow whose parent fails for good: its
     * child is cancelled (children_release). */
    CHECK_SQL_STR(pg, "cancelled", "SELECT pgjobq.cancel((SELECT id FROM h WHERE n = 4))");
    PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.enqueue_graph('[{\"ref\": \"a\", \"queue\": \"tl\"},"
                       " {\"ref\": \"b\", \"queue\": \"tl\", \"after\": [\"a\"]}]')"));
    CHECK_SQL_STR(pg, "failed",
                  "SELECT string_agg(f.outcome, ',') FROM pgjobq.claim('tl', 1, '1 min', 'w') c CROSS JOIN LATERAL"
                  " pgjobq.fail_many(ARRAY[c.id], ARRAY[c.lease_token], '{no}', NULL, '{true}') f");

    /* The tallies are what the history holds: completed 2, failed 3 (3, 6, a), cancelled 3 (5, 4, b). */
    const char *by_state = "SELECT string_agg(s || '=' || n, ',' ORDER BY s) FROM (%s) x";
    char *history = t_str(pg, by_state,
                          "SELECT state::text AS s, count(*) AS n FROM pgjobq.history WHERE queue = 'tl' GROUP BY 1");
    char *tallied = t_str(pg, by_state, "SELECT what AS s, sum(n) AS n FROM pgjobq.tallies WHERE queue = 'tl'"
                                        " AND what IN ('completed', 'failed', 'cancelled') GROUP BY 1");
    CHECK_STR(history, "cancelled=3,completed=2,failed=3");
    CHECK_STR(tallied, history);
    free(history);
    free(tallied);
    CHECK_SQL_STR(pg, "lost=1,retried=1",
                  "SELECT string_agg(what || '=' || n, ',' ORDER BY what)"
                  " FROM pgjobq.monitor_tallies(now() - interval '1 hour', now()) WHERE queue = 'tl'");

    /* The last hour counts the moves, from the tallies: the history's rows may go (a retry by hand,
     * retention), what finished then still finished then. */
    PQclear(t_exec(pg, "DELETE FROM pgjobq.history WHERE queue = 'tl'"));
    CHECK_SQL_STR(pg, "2,3",
                  "SELECT completed_1h || ',' || failed_1h FROM pgjobq.monitor_overview() WHERE queue = 'tl'");
    CHECK_SQL_STR(pg, "2,3", "SELECT sum(completed) || ',' || sum(failed) FROM pgjobq.monitor_finished_per_minute()");
    PQfinish(pg);
}

static int plans_seen;

static void count_plans(void *arg, const char *msg)
{
    (void)arg;
    if (strstr(msg, "plan:") != NULL)
        plans_seen++;
}

/* The producer's and the worker's calls plan each of their statements once per session.  Left to
 * choose, PL/pgSQL plans a statement afresh at every call whenever its custom plan looks cheaper than
 * the generic one: that was 0.09 ms of a one-job enqueue's 0.3 ms (levels_add's INSERT) and 0.05-0.17
 * ms of each fenced write.  Counted with debug_print_plan: after a warm-up, every call below, a simple
 * query planned once itself, plans nothing more.  An ANALYZE of the tables (autovacuum's) invalidates
 * the plans that read them once: 13 plans more, measured by running one between two rounds; so the
 * room is a round's worth less one, and a statement planned at every call exceeds it.  The retry
 * names its delay: without one, fail_many calls pgjobq.backoff, an SQL function the user may
 * replace, whose body PostgreSQL plans at each call (it has a SET clause, so it is not inlined): one
 * more plan a retry, of an expression without a table. */
TEST(enqueue_claim_and_fenced_writes_plan_their_statements_once_per_session)
{
    enum { WARM = 8, ROUNDS = 20, PLANNED_PER_ROUND = 8, ROOM = ROUNDS - 1 };
    PGconn *pg = t_pg();

    PQclear(t_exec(pg, "CREATE TEMP TABLE held (id bigint, lease_token bigint, n bigint)"));
    for (int r = 0; r < WARM + ROUNDS; r++) {
        if (r == WARM) {
            PQsetNoticeProcessor(pg, count_plans, NULL);
            PQclear(t_exec(pg, "SET client_min_messages = log"));
            PQclear(t_exec(pg, "SET debug_print_plan = on"));
            plans_seen = 0;
        }
        PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.enqueue_many(array_fill('pl'::text, ARRAY[6]), NULL,"
                           " array_fill('{}'::jsonb, ARRAY[6]))"));
        PQclear(t_exec(pg, "TRUNCATE held"));
        PQclear(t_exec(pg, "INSERT INTO held SELECT id, lease_token, row_number() OVER (ORDER BY id)"
                           " FROM pgjobq.claim_batch('pl', 6, '1 min', 'w')"));
        PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.extend_many(ARRAY(SELECT id FROM held ORDER BY n),"
                           " ARRAY(SELECT lease_token FROM held ORDER BY n), '1 min')"));
        PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.complete_many(ARRAY(SELECT id FROM held WHERE n IN (1, 6)),"
                           " ARRAY(SELECT lease_token FROM held WHERE n IN (1, 6)), NULL)"));
        PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.fail_many(ARRAY(SELECT id FROM held WHERE n = 2),"
                           " ARRAY(SELECT lease_token FROM held WHERE n = 2), ARRAY['boom'],"
                           " ARRAY[interval '1 hour'])"));
        PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.fail_many(ARRAY(SELECT id FROM held WHERE n = 3),"
                           " ARRAY(SELECT lease_token FROM held WHERE n = 3), ARRAY['boom'], NULL, ARRAY[true])"));
        PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.release_many(ARRAY(SELECT id FROM held WHERE n = 4),"
                           " ARRAY(SELECT lease_token FROM held WHERE n = 4), 'handed back')"));
        PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.cancel_many(ARRAY(SELECT id FROM held WHERE n = 5),"
                           " ARRAY(SELECT lease_token FROM held WHERE n = 5), 'stop')"));
    }
    PQclear(t_exec(pg, "RESET debug_print_plan"));
    PQclear(t_exec(pg, "SET client_min_messages = warning"));
    /* Every call did its work: each round completed two jobs, failed two (one for good, one to retry in
     * an hour), handed one back and cancelled one. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'pl' AND state = 'completed'"),
              2 * (WARM + ROUNDS));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'pl' AND state = 'cancelled'"),
              WARM + ROUNDS);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'pl' AND state = 'failed'"), WARM + ROUNDS);
    CHECK_MSG(plans_seen >= ROUNDS * PLANNED_PER_ROUND && plans_seen <= ROUNDS * PLANNED_PER_ROUND + ROOM,
              "%d plans in %d rounds of %d calls, each planned once itself: a statement inside one of them is "
              "planned at every call (SET plan_cache_mode = force_generic_plan on its function?)",
              plans_seen, ROUNDS, PLANNED_PER_ROUND);
    PQfinish(pg);
}
