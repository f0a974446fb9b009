/*
 * test_dead_letters.c - dead-letter queues (issue 41; docs/queues.md, "Dead letters") against the real
 * server: a job that fails for good (attempts spent, failed permanently, or its last lease expired;
 * never a cancelled one) leaves a copy in its queue's dead-letter queue, in the failing transaction,
 * linked to it; a paused and limited dead-letter queue receives all the same; cycles are refused, also
 * when two settings race; a redrive sends the dead letters back (queued ones, and finished ones), and
 * leaves a dead letter a claim holds at that instant where it runs.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

static int64_t put(pgjobq_client *c, const char *queue, const char *payload, int max_attempts)
{
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int64_t id = 0;
    o.queue = queue;
    o.max_attempts = max_attempts;
    o.priority = 3;
    CHECK_OK(c, pgjobq_enqueue(c, payload, &o, &id));
    return id;
}

/* Claims the one queued job of the queue; returns its lease token (the id must be want). */
static int64_t take(pgjobq_client *c, const char *queue, int64_t want)
{
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    CHECK_OK(c, pgjobq_claim(c, queue, 1, 60000, "w1", &jobs, &n));
    CHECK_INT((long long)n, 1);
    CHECK_INT(jobs[0].id, want);
    int64_t token = jobs[0].lease_token;
    pgjobq_jobs_free(jobs);
    return token;
}

/* The dead letter of job `id` (its id), or 0 when it left none. */
static long long dead_letter_of(PGconn *pg, int64_t id)
{
    return t_int(pg, "SELECT coalesce((SELECT d.id FROM pgjobq.dead_letters d WHERE d.original_id = %lld), 0)",
                 (long long)id);
}

TEST(dead_letters_are_made_when_a_job_fails_for_good_and_only_then)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_state st;

    CHECK_OK(c, pgjobq_queue_set_dead_letter(c, "orders", "orders.dead"));
    /* The dead-letter queue is paused and limited: it receives all the same. */
    CHECK_OK(c, pgjobq_queue_pause(c, "orders.dead", "nobody works it"));
    CHECK_OK(c, pgjobq_queue_set_concurrency(c, "orders.dead", 1));
    CHECK_OK(c, pgjobq_queue_set_rate(c, "orders.dead", 1, 60000));

    /* Attempts spent: the first failure is retried (no dead letter), the second is for good. */
    int64_t a = put(c, "orders", "{\"order\": 1}", 2);
    PQclear(t_exec(pg,
                   "UPDATE pgjobq.jobs SET tags = ARRAY['eu', 'vip'], concurrency_key = 'customer:7'"
                   " WHERE id = %lld",
                   (long long)a));
    CHECK_OK(c, pgjobq_job_fail(c, a, take(c, "orders", a), "card declined", 0, 0, &st));
    CHECK_INT(st, PGJOBQ_QUEUED);
    CHECK_INT(dead_letter_of(pg, a), 0);
    CHECK_OK(c, pgjobq_job_fail(c, a, take(c, "orders", a), "card declined again", 0, 0, &st));
    CHECK_INT(st, PGJOBQ_FAILED);
    long long da = dead_letter_of(pg, a);
    CHECK(da > 0);
    /* The original keeps its id and its history row; the dead letter is a new queued job, due now,
     * with its kind, payload, priority, attempts, tags and keys, and the last error. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE id = %lld AND state = 'failed' AND queue = 'orders'",
                    (long long)a),
              1);
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND queue = 'orders.dead' AND state = 'queued'"
                    " AND payload = '{\"order\": 1}' AND kind = 'default' AND priority = 3 AND attempt = 0"
                    " AND max_attempts = 2 AND last_error = 'card declined again' AND tags = '{eu,vip}'"
                    " AND concurrency_key = 'customer:7' AND unique_key IS NULL AND run_at <= now()",
                    da),
              1);
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.dead_letters WHERE id = %lld AND original_id = %lld"
                    " AND original_queue = 'orders' AND queue = 'orders.dead' AND redriven_at IS NULL",
                    da, (long long)a),
              1);
    /* Its level is recorded (the claims and the counts find it) and the dashboard's view of both jobs. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue = 'orders.dead' AND priority = 3"), 1);
    CHECK_INT(t_int(pg, "SELECT ready FROM pgjobq.queue_ready('orders.dead')"), 1);
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.monitor_dead_letters(%lld) WHERE relation = 'to' AND id = %lld"
                    " AND queue = 'orders.dead'",
                    (long long)a, da),
              1);
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.monitor_dead_letters(%lld) WHERE relation = 'of' AND id = %lld"
                    " AND queue = 'orders'",
                    da, (long long)a),
              1);

    /* Failed permanently on its first attempt: for good too. */
    int64_t b = put(c, "orders", "{\"order\": 2}", 25);
    CHECK_OK(c, pgjobq_job_fail(c, b, take(c, "orders", b), "no such customer", 0, PGJOBQ_FAIL_PERMANENT, &st));
    CHECK_INT(st, PGJOBQ_FAILED);
    CHECK(dead_letter_of(pg, b) > 0);

    /* Its last lease expired (the worker died): the rescue ends it failed, with a dead letter. */
    int64_t e = put(c, "orders", "{\"order\": 3}", 1);
    (void)take(c, "orders", e);
    PQclear(
        t_exec(pg, "UPDATE pgjobq.jobs SET lease_until = now() - interval '1 second' WHERE id = %lld", (long long)e));
    int rescued = 0;
    CHECK_OK(c, pgjobq_rescue_expired(c, 100, &rescued));
    CHECK_INT(rescued, 1);
    long long de = dead_letter_of(pg, e);
    CHECK(de > 0);
    CHECK_INT(
        t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND last_error LIKE 'lease expired at %%'", de), 1);

    /* Cancelled: never a dead letter (queued, and running with the cancel requested before it failed). */
    int64_t k1 = put(c, "orders", "{\"order\": 4}", 1);
    CHECK_OK(c, pgjobq_job_cancel(c, k1, &st));
    int64_t k2 = put(c, "orders", "{\"order\": 5}", 1);
    int64_t t2 = take(c, "orders", k2);
    CHECK_OK(c, pgjobq_job_cancel(c, k2, &st));
    CHECK_INT(st, PGJOBQ_RUNNING);
    CHECK_RC(c, pgjobq_job_fail(c, k2, t2, "stopped", 0, 0, &st), PGJOBQ_ECANCELLED);
    CHECK_INT(dead_letter_of(pg, k1), 0);
    CHECK_INT(dead_letter_of(pg, k2), 0);

    /* A failure whose transaction rolls back leaves no dead letter, and the job runs on. */
    int64_t r = put(c, "orders", "{\"order\": 6}", 1);
    int64_t tr = take(c, "orders", r);
    PQclear(t_exec(pg, "BEGIN"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.fail_many(ARRAY[%lld]::bigint[], ARRAY[%lld]::bigint[], ARRAY['x'])",
                   (long long)r, (long long)tr));
    CHECK(dead_letter_of(pg, r) > 0); /* inside it */
    PQclear(t_exec(pg, "ROLLBACK"));
    CHECK_INT(dead_letter_of(pg, r), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'running'", (long long)r), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'orders.dead'"), 3);

    /* A queue without a dead-letter queue: a failure is only a failure. */
    int64_t p = put(c, "plain", "{}", 1);
    CHECK_OK(c, pgjobq_job_fail(c, p, take(c, "plain", p), "boom", 0, 0, &st));
    CHECK_INT(dead_letter_of(pg, p), 0);

    /* A dead-letter queue may have its own: a dead letter that fails for good there goes on. */
    CHECK_OK(c, pgjobq_queue_set_dead_letter(c, "orders.dead", "graveyard"));
    CHECK_OK(c, pgjobq_queue_resume(c, "orders.dead"));
    CHECK_OK(c, pgjobq_queue_set_rate(c, "orders.dead", 0, 0));
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET max_attempts = 1 WHERE id = %lld", da));
    int64_t tda = take(c, "orders.dead", da);
    CHECK_OK(c, pgjobq_job_fail(c, da, tda, "still declined", 0, 0, &st));
    CHECK(dead_letter_of(pg, da) > 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'graveyard'"), 1);

    /* A link lives as long as its dead letter, live or in the history: prune drops those whose job is
     * gone, old as they may be, and keeps the others. */
    long long db = dead_letter_of(pg, b);
    PQclear(t_exec(pg, "UPDATE pgjobq.dead_letters SET at = now() - interval '30 days'"));
    PQclear(t_exec(pg, "DELETE FROM pgjobq.jobs WHERE id = %lld", de));
    PQclear(t_exec(pg, "SELECT pgjobq.prune()"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.dead_letters WHERE id = %lld", de), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.dead_letters WHERE id IN (%lld, %lld)", da, db), 2);

    /* The settings: listed, removed with NULL. */
    pgjobq_queue_info *q = NULL;
    size_t n = 0;
    CHECK_OK(c, pgjobq_queue_list(c, &q, &n));
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(q[i].name, "orders") == 0) {
            CHECK_STR(q[i].dead_letter, "orders.dead");
            seen++;
        } else if (strcmp(q[i].name, "orders.dead") == 0) {
            CHECK_STR(q[i].dead_letter, "graveyard");
            seen++;
        } else if (strcmp(q[i].name, "graveyard") == 0) {
            CHECK(q[i].dead_letter == NULL);
            seen++;
        }
    }
    CHECK_INT(seen, 3);
    pgjobq_queue_list_free(q);
    CHECK_OK(c, pgjobq_queue_set_dead_letter(c, "orders", NULL));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE name = 'orders' AND dead_letter IS NULL"), 1);
    pgjobq_client_close(c);
    PQfinish(pg);
}

TEST(dead_letter_settings_refuse_cycles_and_bad_names)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();

    CHECK_RC(c, pgjobq_queue_set_dead_letter(c, "a", "a"), PGJOBQ_EINVAL);
    CHECK_OK(c, pgjobq_queue_set_dead_letter(c, "a", "b"));
    CHECK_OK(c, pgjobq_queue_set_dead_letter(c, "b", "c"));
    CHECK_RC(c, pgjobq_queue_set_dead_letter(c, "c", "a"), PGJOBQ_EINVAL);
    CHECK_MSG(strstr(pgjobq_errmsg(c), "cycle") != NULL, "%s", pgjobq_errmsg(c));
    CHECK_RC(c, pgjobq_queue_set_dead_letter(c, "b", "a"), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_queue_set_dead_letter(c, "a", "no spaces"), PGJOBQ_EINVAL);
    char *why = t_expect_error(pg, "22023", "SELECT pgjobq.queue_set('a', '{\"dead_letter\": 7}')");
    free(why);
    why = t_expect_error(pg, "23514", "UPDATE pgjobq.queues SET dead_letter = name WHERE name = 'a'");
    free(why);
    /* What was refused changed nothing. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE (name, dead_letter) IN (('a', 'b'), ('b', 'c'))"), 2);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE name = 'c' AND dead_letter IS NOT NULL"), 0);
    /* A chain that ends is fine, and removing a link opens the way. */
    CHECK_OK(c, pgjobq_queue_set_dead_letter(c, "b", NULL));
    CHECK_OK(c, pgjobq_queue_set_dead_letter(c, "c", "a"));
    pgjobq_client_close(c);
    PQfinish(pg);
}

/* Whether the session `pid` waits for a lock (an advisory or a row lock). */
static int waits_for_lock(PGconn *pg, int pid)
{
    return t_int(pg, "SELECT count(*) FROM pg_stat_activity WHERE pid = %d AND wait_event_type = 'Lock'", pid) > 0;
}

static void wait_for_lock(PGconn *pg, int pid)
{
    int64_t t0 = t_now_ms();
    while (!waits_for_lock(pg, pid)) {
        CHECK_MSG(t_now_ms() - t0 < 15000, "session %d never waited for a lock", pid);
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Two settings that close a cycle between them, made at once on two connections: the second waits for
 * the first's commit and then sees the cycle (each alone saw none). */
TEST(dead_letter_settings_racing_cannot_close_a_cycle)
{
    PGconn *first = t_pg(), *second = t_pg(), *pg = t_pg();

    PQclear(t_exec(first, "BEGIN"));
    PQclear(t_exec(first, "SELECT pgjobq.queue_set('x', '{\"dead_letter\": \"y\"}')"));
    CHECK(PQsendQuery(second, "SELECT pgjobq.queue_set('y', '{\"dead_letter\": \"x\"}')") == 1);
    wait_for_lock(pg, PQbackendPID(second));
    PQclear(t_exec(first, "COMMIT"));
    PGresult *r = PQgetResult(second);
    CHECK_MSG(PQresultStatus(r) == PGRES_FATAL_ERROR, "the second setting was accepted: a cycle x -> y -> x");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22023");
    PQclear(r);
    while ((r = PQgetResult(second)) != NULL)
        PQclear(r);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE dead_letter IS NOT NULL"), 1);
    PQfinish(first);
    PQfinish(second);
    PQfinish(pg);
}

/* Makes a dead letter of a new job of `queue` (max_attempts 1): returns the dead letter's id. */
static long long make_dead(pgjobq_client *c, PGconn *pg, const char *queue, const char *payload)
{
    pgjobq_state st;
    int64_t id = put(c, queue, payload, 1);
    CHECK_OK(c, pgjobq_job_fail(c, id, take(c, queue, id), "boom", 0, 0, &st));
    long long d = dead_letter_of(pg, id);
    CHECK(d > 0);
    return d;
}

TEST(redrive_sends_dead_letters_back_to_their_queues)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    int64_t retried = -1, skipped = -1;
    pgjobq_state st;

    /* Two queues share one dead-letter queue; a job enqueued there directly is no dead letter. */
    CHECK_OK(c, pgjobq_queue_set_dead_letter(c, "mail", "dlq"));
    CHECK_OK(c, pgjobq_queue_set_dead_letter(c, "sms", "dlq"));
    long long m1 = make_dead(c, pg, "mail", "{\"m\": 1}"), m2 = make_dead(c, pg, "mail", "{\"m\": 2}");
    long long s1 = make_dead(c, pg, "sms", "{\"s\": 1}");
    put(c, "dlq", "{\"direct\": true}", 1);
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET run_at = now() + interval '1 hour' WHERE id = %lld", m2)); /* not due */

    f.queue = "dlq";
    f.state = PGJOBQ_QUEUED;
    CHECK_OK(c, pgjobq_retry_where(c, &f, PGJOBQ_REDRIVE | PGJOBQ_DRY_RUN, &retried, &skipped));
    CHECK_INT(retried, 3);
    CHECK_INT(skipped, 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'dlq'"), 4);

    /* A dead letter a worker of the dead-letter queue claims at this instant stays where it runs: the
     * redrive waits for the claim's row lock and sees it running. */
    PGconn *claimer = t_pg();
    PQclear(t_exec(claimer, "BEGIN"));
    PQclear(t_exec(claimer,
                   "UPDATE pgjobq.jobs SET state = 'running', lease_until = now() + interval '1 minute',"
                   " started_at = now(), attempt = 1, lease_token = 99 WHERE id = %lld",
                   s1));
    PGconn *admin = t_pg();
    CHECK(PQsendQuery(admin, "SELECT retried, skipped FROM pgjobq.retry_where('dlq', 'queued', redrive => true)") == 1);
    wait_for_lock(pg, PQbackendPID(admin));
    PQclear(t_exec(claimer, "COMMIT"));
    PGresult *r = PQgetResult(admin);
    CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK, "%s", PQresultErrorMessage(r));
    CHECK_STR(PQgetvalue(r, 0, 0), "2");
    CHECK_STR(PQgetvalue(r, 0, 1), "1");
    PQclear(r);
    while ((r = PQgetResult(admin)) != NULL)
        PQclear(r);

    /* Back where they came from, due now (the one scheduled for later too), claimable there; the
     * links say when; the direct job and the running one stay. */
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.jobs WHERE id IN (%lld, %lld) AND queue = 'mail'"
                    " AND state = 'queued' AND run_at <= now()",
                    m1, m2),
              2);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.dead_letters WHERE id IN (%lld, %lld) AND redriven_at IS NOT NULL",
                    m1, m2),
              2);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND queue = 'dlq' AND state = 'running'", s1),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'dlq' AND state = 'queued'"), 1);
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    CHECK_OK(c, pgjobq_claim(c, "mail", 10, 60000, "w2", &jobs, &n));
    CHECK_INT((long long)n, 2);
    /* Redriven and failing for good again: a new dead letter, linked to it. */
    CHECK_OK(c, pgjobq_job_fail(c, jobs[0].id, jobs[0].lease_token, "boom again", 0, 0, &st));
    CHECK_INT(st, PGJOBQ_FAILED);
    CHECK(dead_letter_of(pg, jobs[0].id) > 0);
    CHECK_OK(c, pgjobq_job_complete(c, jobs[1].id, jobs[1].lease_token, NULL));
    pgjobq_jobs_free(jobs);

    /* A finished dead letter (its worker in the dead-letter queue failed it) is redriven from the
     * history, by the command: back to sms, queued. */
    CHECK_OK(c, pgjobq_job_fail(c, s1, 99, "could not fix it", 0, PGJOBQ_FAIL_PERMANENT, &st));
    CHECK_INT(st, PGJOBQ_FAILED);
    char *out = NULL, *err = NULL;
    CHECK_INT(t_cli(&out, &err, NULL, 0, "retry", "--queue", "dlq", "--state", "failed", "--redrive", "--json", NULL),
              0);
    CHECK_MSG(strstr(out, "\"retried\":1,") != NULL, "%s %s", out, err);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND queue = 'sms' AND state = 'queued'", s1),
              1);
    /* Without --redrive the filter's queue is kept, as ever; --redrive with a job ID is a usage error. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "retry", "1", "--redrive", NULL), 64);
    free(out);
    free(err);
    PQfinish(claimer);
    PQfinish(admin);
    pgjobq_client_close(c);
    PQfinish(pg);
}

TEST(dead_letters_from_the_command_line)
{
    PGconn *pg = t_pg();
    char *out = NULL, *err = NULL;

    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "orders", "--dead-letter", "orders.dead", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "ls", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"dead_letter\":\"orders.dead\",") != NULL, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "ls", NULL), 0);
    CHECK_MSG(strstr(out, "DEAD LETTER") != NULL && strstr(out, "orders.dead") != NULL, "%s", out);
    free(out);
    free(err);
    /* A cycle: refused with 65 and a message; a bad name: 64, before any database. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "orders.dead", "--dead-letter", "orders", NULL), 65);
    CHECK_MSG(strstr(err, "cycle") != NULL, "%s", err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "orders", "--dead-letter", "9bad", NULL), 64);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE name = 'orders.dead' AND dead_letter IS NOT NULL"),
              0);
    /* `pgjobq show` links a job that failed for good and its dead letter, both ways, in text and JSON;
     * a job with neither says so in JSON. */
    pgjobq_client *c = t_client();
    long long orig = put(c, "orders", "{\"o\": 1}", 1);
    pgjobq_state st;
    CHECK_OK(c, pgjobq_job_fail(c, orig, take(c, "orders", orig), "boom", 0, 0, &st));
    CHECK_INT(st, PGJOBQ_FAILED);
    long long dead = dead_letter_of(pg, orig);
    CHECK(dead > 0);
    char ids[2][24], want[96];
    snprintf(ids[0], sizeof ids[0], "%lld", orig);
    snprintf(ids[1], sizeof ids[1], "%lld", dead);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", ids[0], NULL), 0);
    snprintf(want, sizeof want, "dead letters:  %lld in orders.dead (", dead);
    CHECK_MSG(strstr(out, want) != NULL && strstr(out, "dead letter of:") == NULL, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", ids[1], NULL), 0);
    snprintf(want, sizeof want, "dead letter of: %lld in orders (", orig);
    CHECK_MSG(strstr(out, want) != NULL && strstr(out, "dead letters:") == NULL, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", ids[0], "--json", NULL), 0);
    snprintf(want, sizeof want, "\"dead_letter_of\":null,\"dead_letters\":[{\"id\":%lld,\"queue\":\"orders.dead\",\"at\":\"", dead);
    CHECK_MSG(strstr(out, want) != NULL && strstr(out, "\"redriven_at\":null}]") != NULL, "%s", out);
    free(out);
    free(err);
    /* Redriven: the link says when. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "retry", "--queue", "orders.dead", "--state", "queued", "--redrive", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", ids[1], "--json", NULL), 0);
    snprintf(want, sizeof want, "\"dead_letter_of\":{\"id\":%lld,\"queue\":\"orders\",\"at\":\"", orig);
    CHECK_MSG(strstr(out, want) != NULL && strstr(out, "\"redriven_at\":\"") != NULL &&
                  strstr(out, "\"dead_letters\":[]") != NULL,
              "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "show", ids[1], NULL), 0);
    CHECK_MSG(strstr(out, ", redriven ") != NULL, "%s", out);
    free(out);
    free(err);
    pgjobq_client_close(c);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "orders", "--dead-letter", "none", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE name = 'orders' AND dead_letter IS NULL"), 1);
    PQfinish(pg);
}

/* A durable job's stored steps go with its dead letter: the dead letter, and a redrive of it, resume
 * after them (a step with effects is not run twice), as a retry of the failed job would. */
TEST(dead_letters_keep_the_jobs_stored_steps)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_state st;
    char *got = NULL;

    CHECK_OK(c, pgjobq_queue_set_dead_letter(c, "flows", "flows.dead"));
    int64_t id = put(c, "flows", "{\"flow\": 1}", 1);
    int64_t token = take(c, "flows", id);
    CHECK_OK(c, pgjobq_step_put(c, id, token, "charge", "{\"charged\": 1200}", NULL));
    CHECK_OK(c, pgjobq_job_fail(c, id, token, "the second step failed", 0, 0, &st));
    CHECK_INT(st, PGJOBQ_FAILED);
    long long dead = dead_letter_of(pg, id);
    CHECK(dead > 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_steps WHERE job_id = %lld AND name = 'charge'"
                        " AND result = '{\"charged\": 1200}'",
                    dead),
              1);
    /* The failed job keeps its own (its history). */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.job_steps WHERE job_id = %lld", (long long)id), 1);

    /* Redriven: back in flows, and the step answers from storage. */
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    int64_t n = 0;
    f.queue = "flows.dead";
    f.state = PGJOBQ_QUEUED;
    CHECK_OK(c, pgjobq_retry_where(c, &f, PGJOBQ_REDRIVE, &n, NULL));
    CHECK_INT(n, 1);
    token = take(c, "flows", dead);
    CHECK_OK(c, pgjobq_step_get(c, dead, token, "charge", &got));
    CHECK_STR(got, "{\"charged\": 1200}");
    pgjobq_free(got);
    CHECK_RC(c, pgjobq_step_get(c, dead, token, "ship", &got), PGJOBQ_ENOTFOUND);
    CHECK_OK(c, pgjobq_job_complete(c, dead, token, NULL));
    pgjobq_client_close(c);
    PQfinish(pg);
}
