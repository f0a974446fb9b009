/*
 * test_outbox.c - the outbox (docs/shards.md, "The outbox"): a job enqueued in the producer's own
 * transaction at its source (pgjobq.forward) and written to its shard exactly once
 * (pgjobq.enqueue_forwarded), whatever the number of forwarders and of attempts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <time.h>

#include "harness.h"
#include "internal.h"

/* A forwarded job is checked by enqueue's judges when it is forwarded, in the producer's transaction:
 * what its shard would refuse is refused to the producer, and a rolled-back transaction forwards
 * nothing. */
TEST(outbox_forward_is_judged_like_an_enqueue_and_joins_the_callers_transaction)
{
    PGconn *pg = t_pg();
    char *msg;

    msg = t_expect_error(pg, "23514", "SELECT pgjobq.forward('no spaces')");
    CHECK_MSG(strstr(msg, "is not a queue name"), "%s", msg);
    free(msg);
    msg = t_expect_error(pg, "22023", "SELECT pgjobq.forward('mail', run_at => '1901-01-01')");
    CHECK_MSG(strstr(msg, "within 100 years"), "%s", msg);
    free(msg);
    free(t_expect_error(pg, "22023", "SELECT pgjobq.forward('mail', delay => '-1 s')"));
    free(t_expect_error(pg, "22023", "SELECT pgjobq.forward('pgjobq.outbox')"));
    free(t_expect_error(pg, "23514", "SELECT pgjobq.forward('mail', max_attempts => 0)"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs"), 0);

    PQclear(t_exec(pg, "BEGIN"));
    t_int(pg, "SELECT pgjobq.forward('mail', 'send', '{\"to\": \"a\"}')");
    PQclear(t_exec(pg, "ROLLBACK"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs"), 0);

    PQclear(t_exec(pg, "BEGIN"));
    long long id = t_int(pg, "SELECT pgjobq.forward('mail', 'send', '{\"to\": \"a\"}', 3::smallint,"
                             " delay => '1 hour', route_key => 'tenant-7', max_attempts => 4)");
    PQclear(t_exec(pg, "COMMIT"));
    /* One job of the outbox's queue, its payload the job to write at the shard (a delay became run_at). */
    CHECK_INT(t_int(pg,
                    "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND queue = pgjobq.outbox_queue()"
                    " AND kind = 'pgjobq.forward' AND run_at <= now() AND payload->>'queue' = 'mail'"
                    " AND payload->>'kind' = 'send' AND payload->'payload' = '{\"to\": \"a\"}'"
                    " AND (payload->>'priority')::int = 3 AND (payload->>'max_attempts')::int = 4"
                    " AND payload->>'route_key' = 'tenant-7'"
                    " AND (payload->>'run_at')::timestamptz BETWEEN now() + interval '59 minutes'"
                    "                                         AND now() + interval '61 minutes'"
                    " AND (payload->>'source')::uuid = pgjobq.outbox_self()",
                    id),
              1);
    PQfinish(pg);
}

struct waiter {
    PGconn *pg;
    int pid;
};

static int waits_for_a_lock(void *arg)
{
    struct waiter *w = arg;
    return t_int(w->pg, "SELECT count(*) FROM pg_stat_activity WHERE pid = %d AND wait_event_type = 'Lock'", w->pid) >
           0;
}

/* enqueue_forwarded makes one job per (source, source id): again, it returns that job; at the same
 * time from another session, the second waits for the first and returns its job; rolled back, it
 * leaves nothing and may be done again. */
TEST(outbox_enqueue_forwarded_makes_one_job_per_source_job)
{
    PGconn *a = t_pg(), *b = t_pg();
    const char *src = "'7a4c3e8e-1111-4a4a-9c9c-000000000001'::uuid";
    const char *spec = "'{\"queue\": \"mail\", \"kind\": \"send\", \"payload\": {\"n\": 1}, \"priority\": 2,"
                       " \"max_attempts\": 5, \"route_key\": \"r1\"}'::jsonb";

    long long id = t_int(a, "SELECT id FROM pgjobq.enqueue_forwarded(%s, 42, %s)", src, spec);
    CHECK_INT(t_int(a, "SELECT duplicate::int FROM pgjobq.enqueue_forwarded(%s, 42, %s)", src, spec), 1);
    CHECK_INT(t_int(a, "SELECT id FROM pgjobq.enqueue_forwarded(%s, 42, %s)", src, spec), id);
    CHECK_INT(t_int(a,
                    "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'mail' AND kind = 'send' AND payload = '{\"n\": 1}'"
                    " AND priority = 2 AND max_attempts = 5 AND route_key = 'r1'"),
              1);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.forwarded WHERE id = %lld", id), 1);

    /* Rolled back: nothing, and the next call makes it. */
    PQclear(t_exec(a, "BEGIN"));
    t_int(a, "SELECT id FROM pgjobq.enqueue_forwarded(%s, 43, %s)", src, spec);
    PQclear(t_exec(a, "ROLLBACK"));
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.forwarded WHERE source_id = 43"), 0);

    /* Two at once: b waits for a's transaction, then returns a's job. */
    PQclear(t_exec(a, "BEGIN"));
    long long first = t_int(a, "SELECT id FROM pgjobq.enqueue_forwarded(%s, 43, %s)", src, spec);
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT id, duplicate::int FROM pgjobq.enqueue_forwarded(%s, 43, %s)", src, spec);
    CHECK(PQsendQuery(b, sql) == 1);
    struct waiter w = {a, PQbackendPID(b)};
    CHECK_MSG(t_wait_until(waits_for_a_lock, &w, 30000), "the second call never waited for the first");
    PQclear(t_exec(a, "COMMIT"));
    PGresult *r = PQgetResult(b);
    CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK, "%s", PQerrorMessage(b));
    CHECK_INT(atoll(PQgetvalue(r, 0, 0)), first);
    CHECK_INT(atoll(PQgetvalue(r, 0, 1)), 1);
    PQclear(r);
    while ((r = PQgetResult(b)) != NULL)
        PQclear(r);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'mail'"), 2);

    /* A bad call is refused clearly. */
    free(t_expect_error(a, "22023", "SELECT * FROM pgjobq.enqueue_forwarded(NULL, 1, '{}')"));
    free(t_expect_error(a, "22023", "SELECT * FROM pgjobq.enqueue_forwarded(gen_random_uuid(), 1, '[]')"));
    PQfinish(a);
    PQfinish(b);
}

/* In a shard, the outbox's queue is the shard's own whatever partition the map gives its name, while
 * a job forwarded to it is guarded as any job (PJQ01 when another shard owns it). */
TEST(outbox_queue_stays_in_a_shard_that_the_map_would_route_it_away_from)
{
    PGconn *pg = t_pg();
    /* Every partition is the other shard's: this shard owns none. */
    PQclear(t_exec(pg, "SELECT pgjobq.cluster_set('{\"name\": \"t\", \"epoch\": 1, \"partitions\": 1, \"shards\": {"
                       "\"sa\": {\"number\": 0, \"conninfo\": \"host=/nowhere dbname=a\"},"
                       " \"sb\": {\"number\": 1, \"conninfo\": \"host=/nowhere dbname=b\"}}, \"owners\": [\"sb\"]}',"
                       " 'sa')"));
    free(t_expect_error(pg, "PJQ01", "SELECT pgjobq.enqueue('mail')"));
    long long id = t_int(pg, "SELECT pgjobq.forward('mail', 'send')");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld", id), 1);
    free(t_expect_error(pg, "PJQ01",
                        "SELECT * FROM pgjobq.enqueue_forwarded(gen_random_uuid(), 1, '{\"queue\": \"mail\"}')"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.forwarded"), 0);
    PQfinish(pg);
}

/* The forwarder reads the job's queue and routing key out of the outbox job's payload: a top-level
 * string member, its escapes decoded, found past nested values of every kind. */
TEST(outbox_payload_members_are_read_past_nested_values)
{
    const char *doc = "{\"payload\": {\"queue\": \"inner\", \"a\": [1, -2.5e3, true, null, {\"q\": [\"x\\\"]\"]}]},"
                      " \"n\": null, \"queue\": \"mail\", \"route_key\": \"t\\u00e9\\ud83d\\ude00\\n\\\"\"}";
    char *v = NULL;
    CHECK_INT(pgjobq__json_get_string(doc, strlen(doc), "queue", &v), 1);
    CHECK_STR(v, "mail");
    free(v);
    CHECK_INT(pgjobq__json_get_string(doc, strlen(doc), "route_key", &v), 1);
    CHECK_STR(v, "t\xc3\xa9\xf0\x9f\x98\x80\n\"");
    free(v);
    CHECK_INT(pgjobq__json_get_string(doc, strlen(doc), "n", &v), 0);
    CHECK(v == NULL);
    CHECK_INT(pgjobq__json_get_string(doc, strlen(doc), "absent", &v), 0);
    CHECK_INT(pgjobq__json_get_string(doc, strlen(doc), "payload", &v), 0);
    CHECK_INT(pgjobq__json_get_string("{}", 2, "queue", &v), 0);
    CHECK_INT(pgjobq__json_get_string("[\"queue\"]", 9, "queue", &v), -1);
    CHECK_INT(pgjobq__json_get_string("{\"a\": [1, 2}", 12, "queue", &v), -1);
    CHECK_INT(pgjobq__json_get_string("{\"queue\": \"unterminated", 23, "queue", &v), -1);
    CHECK(v == NULL);
}

/* ---- the forwarder --------------------------------------------------------------------------- */

/* A map of two shards "sa" (number 0, partitions 0-3) and "sb" (1, 4-7), the queue "t" spread. */
static const char *two_shards(int epoch, const char *ci_a, const char *ci_b)
{
    static char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"name\": \"ob\", \"epoch\": %d, \"partitions\": 8, \"shards\": {"
             "\"sa\": {\"number\": 0, \"conninfo\": \"%s\"}, \"sb\": {\"number\": 1, \"conninfo\": \"%s\"}},"
             " \"owners\": [\"sa\", \"sa\", \"sa\", \"sa\", \"sb\", \"sb\", \"sb\", \"sb\"],"
             " \"queues\": {\"t\": {\"placement\": \"spread\"}}}",
             epoch, ci_a, ci_b);
    return buf;
}

/* Jobs forwarded from a database outside the cluster (the application's) land each on its owner,
 * once, the outbox jobs completed with where they went; one whose job a forwarder had already made
 * before it died (enqueue_forwarded done, the outbox job not completed) is not made again. */
TEST_FULL(outbox_forwarder_moves_each_job_to_its_shard_once, 120, 0)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1);
    PGconn *src = t_pg(), *a = t_connect(ci_a), *b = t_connect(ci_b);
    t_cluster_install(a, two_shards(1, ci_a, ci_b), "sa");
    t_cluster_install(b, two_shards(1, ci_a, ci_b), "sb");

    PQclear(t_exec(src, "BEGIN"));
    PQclear(t_exec(src, "SELECT pgjobq.forward('t', 'k', jsonb_build_object('g', g), route_key => 'tenant-' || g)"
                        " FROM generate_series(1, 200) g"));
    PQclear(
        t_exec(src, "SELECT pgjobq.forward('mail', 'send', jsonb_build_object('g', g)) FROM generate_series(1, 20) g"));
    PQclear(t_exec(src, "COMMIT"));
    /* The first outbox job was forwarded by a forwarder that died before it could complete it. */
    long long first = t_int(src, "SELECT min(id) FROM pgjobq.jobs WHERE queue = pgjobq.outbox_queue()");
    char *spec = t_str(src, "SELECT payload::text FROM pgjobq.jobs WHERE id = %lld", first);
    char *source = t_str(src, "SELECT pgjobq.outbox_self()::text");
    PGconn *owner = t_int(a, "SELECT (pgjobq.route_partition('t', '%s') < 4)::int", "tenant-1") ? a : b;
    long long made = t_int(owner, "SELECT id FROM pgjobq.enqueue_forwarded('%s', %lld, '%s')", source, first, spec);

    pgjobq_forwarder *f = NULL;
    CHECK_RC(NULL, pgjobq_forwarder_new(&f, ci_a), PGJOBQ_OK);
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    o.burst = 1;
    o.worker_id = "forwarder";
    CHECK_RC(NULL, pgjobq_worker_new(&w, t_conninfo(), &o), PGJOBQ_OK);
    CHECK_MSG(pgjobq_worker_handle(w, PGJOBQ_OUTBOX_QUEUE, NULL, 4, pgjobq_forward_handler, f) == PGJOBQ_OK, "%s",
              pgjobq_worker_errmsg(w));
    CHECK_MSG(pgjobq_worker_run(w) == PGJOBQ_OK, "%s", pgjobq_worker_errmsg(w));
    pgjobq_worker_free(w);
    pgjobq_forwarder_free(f);

    /* At the source: every outbox job completed, its result naming the shard and the job's id. */
    CHECK_INT(t_int(src, "SELECT count(*) FROM pgjobq.jobs"), 0);
    CHECK_INT(t_int(src,
                    "SELECT count(*) FROM pgjobq.history WHERE queue = pgjobq.outbox_queue() AND state = 'completed'"
                    " AND result->>'shard' IN ('sa', 'sb') AND (result->>'id')::bigint > 0"),
              220);
    CHECK_INT(t_int(src, "SELECT (result->>'id')::bigint FROM pgjobq.history WHERE id = %lld", first), made);
    CHECK_INT(t_int(src, "SELECT (result->>'duplicate')::boolean::int FROM pgjobq.history WHERE id = %lld", first), 1);
    /* At the shards: 220 jobs, each once (by its payload), each on the shard its result names. */
    long long on_a = t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE queue IN ('t', 'mail')");
    long long on_b = t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE queue IN ('t', 'mail')");
    CHECK_INT(on_a + on_b, 220);
    CHECK_INT(t_int(a, "SELECT count(DISTINCT (queue, payload)) FROM pgjobq.jobs WHERE queue IN ('t', 'mail')"), on_a);
    CHECK_INT(t_int(b, "SELECT count(DISTINCT (queue, payload)) FROM pgjobq.jobs WHERE queue IN ('t', 'mail')"), on_b);
    CHECK_MSG(on_a > 0 && on_b > 0, "the spread queue's jobs went to one shard only (%lld, %lld)", on_a, on_b);
    CHECK_INT(
        t_int(src,
              "SELECT count(*) FROM pgjobq.history WHERE queue = pgjobq.outbox_queue() AND result->>'shard' = 'sa'"),
        on_a);
    CHECK_INT(t_int(a, "SELECT count(*) FROM pgjobq.forwarded") + t_int(b, "SELECT count(*) FROM pgjobq.forwarded"),
              220);
    free(spec);
    free(source);
    free(ci_a);
    free(ci_b);
    PQfinish(a);
    PQfinish(b);
    PQfinish(src);
}

struct drained {
    PGconn *pg;
};

static int outbox_empty(void *arg)
{
    struct drained *d = arg;
    return t_int(d->pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = pgjobq.outbox_queue()") == 0 &&
           t_int(d->pg, "SELECT count(*) FROM pgjobq.workers WHERE id = 'last-forwarder'") == 1;
}

/* pgjobq work --forward-to, killed with SIGKILL again and again while it forwards (between a job's
 * write at its shard and its completion at the source, among other moments): every job ends on its
 * shard exactly once, and every outbox job completed. */
TEST_FULL(outbox_forwarder_killed_again_and_again_forwards_each_job_exactly_once, 240, 0)
{
    char *ci_a = t_extra_db("sa", 1), *ci_b = t_extra_db("sb", 1);
    PGconn *src = t_pg(), *a = t_connect(ci_a), *b = t_connect(ci_b);
    t_cluster_install(a, two_shards(1, ci_a, ci_b), "sa");
    t_cluster_install(b, two_shards(1, ci_a, ci_b), "sb");
    PQclear(t_exec(src, "SELECT pgjobq.forward('t', 'k', jsonb_build_object('g', g), route_key => 'tenant-' || g)"
                        " FROM generate_series(1, 1500) g"));

    const char *log = t_log_path("forwarder");
    for (int round = 0; round < 12; round++) {
        pid_t pid = t_spawn(log, NULL, "work", "--forward-to", ci_a, "--lease", "2s", "--log-level", "warn", NULL);
        /* Killed at a different moment of its work each round: 150 to 700 ms after it starts. */
        struct timespec ts = {0, (150 + 50 * round) * 1000000L};
        nanosleep(&ts, NULL);
        CHECK(kill(pid, SIGKILL) == 0);
        CHECK_INT(t_wait_exit(pid, 10000), 128 + SIGKILL);
    }
    long long left = t_int(src, "SELECT count(*) FROM pgjobq.jobs WHERE queue = pgjobq.outbox_queue()");
    /* The last one runs until every outbox job is done (those the killed ones held come back when
     * their leases end: the rescue) and it has registered (a SIGTERM before it has its handler would
     * kill it). */
    pid_t pid = t_spawn(log, NULL, "work", "--forward-to", ci_a, "--lease", "2s", "--log-level", "warn", "--worker-id",
                        "last-forwarder", NULL);
    struct drained d = {src};
    int done = t_wait_until(outbox_empty, &d, 120000);
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    if (!done)
        t_show_log(log);
    CHECK_MSG(done, "outbox jobs left: %lld", t_int(src, "SELECT count(*) FROM pgjobq.jobs"));
    CHECK_MSG(left < 1500, "the killed forwarders forwarded nothing (%lld left)", left);

    long long on_a = t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't'");
    long long on_b = t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't'");
    CHECK_INT(on_a + on_b, 1500);
    CHECK_INT(t_int(a, "SELECT count(DISTINCT payload) FROM pgjobq.jobs WHERE queue = 't'"), on_a);
    CHECK_INT(t_int(b, "SELECT count(DISTINCT payload) FROM pgjobq.jobs WHERE queue = 't'"), on_b);
    CHECK_INT(
        t_int(src, "SELECT count(*) FROM pgjobq.history WHERE queue = pgjobq.outbox_queue() AND state = 'completed'"),
        1500);
    /* Forwarded again after a kill: found, not made again. */
    printf("  forwarded again after a kill (duplicate): %lld of 1500\n",
           t_int(src, "SELECT count(*) FROM pgjobq.history WHERE queue = pgjobq.outbox_queue()"
                      " AND (result->>'duplicate')::boolean"));
    free(ci_a);
    free(ci_b);
    PQfinish(a);
    PQfinish(b);
    PQfinish(src);
}

/* The target shard crashes (its postmaster and every backend killed with SIGKILL) again and again
 * while one forwarder moves jobs to it: every job ends on its shard exactly once, every outbox job
 * completed, none left behind.  A forward whose write at sb was lost with the crash (not committed)
 * is written again; one whose write committed before the crash is found (enqueue_forwarded's key)
 * when the outbox job comes back. */
TEST_FULL(outbox_target_shard_crashed_again_and_again_gets_each_job_exactly_once, 240, 0)
{
    char *ci_a = t_extra_db("sa", 1), ci_b[800];
    t_server2_start(ci_b, sizeof ci_b);
    PGconn *src = t_pg(), *a = t_connect(ci_a), *b = t_connect(ci_b);
    t_cluster_install(a, two_shards(1, ci_a, ci_b), "sa");
    t_cluster_install(b, two_shards(1, ci_a, ci_b), "sb");
    PQfinish(b);
    PQclear(t_exec(src, "SELECT pgjobq.forward('t', 'k', jsonb_build_object('g', g), route_key => 'tenant-' || g)"
                        " FROM generate_series(1, 600) g"));

    const char *log = t_log_path("forwarder");
    pid_t pid = t_spawn(log, NULL, "work", "--forward-to", ci_a, "--lease", "2s", "--log-level", "warn", "--worker-id",
                        "last-forwarder", NULL);
    long long left[5];
    for (int round = 0; round < 5; round++) {
        /* At a different moment of the forwarding each round: 300 to 900 ms after sb came back. */
        struct timespec ts = {0, (300 + 150 * round) * 1000000L};
        nanosleep(&ts, NULL);
        t_server2_crash();
        left[round] = t_int(src, "SELECT count(*) FROM pgjobq.jobs WHERE queue = pgjobq.outbox_queue()");
        CHECK_INT(t_server2_ctl("start", NULL, NULL), 0);
    }
    struct drained d = {src};
    int done = t_wait_until(outbox_empty, &d, 150000);
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    if (!done)
        t_show_log(log);
    CHECK_MSG(done, "outbox jobs left: %lld", t_int(src, "SELECT count(*) FROM pgjobq.jobs"));
    int during = 0; /* crashes that fell while jobs were being forwarded */
    for (int round = 0; round < 5; round++)
        during += left[round] > 0 && left[round] < 600;
    CHECK_MSG(during > 0, "no crash fell while jobs were forwarded (%lld, %lld, %lld, %lld, %lld left)", left[0],
              left[1], left[2], left[3], left[4]);

    b = t_connect(ci_b);
    long long on_a = t_int(a, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't'");
    long long on_b = t_int(b, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 't'");
    CHECK_INT(on_a + on_b, 600);
    CHECK_MSG(on_a > 0 && on_b > 0, "the spread queue's jobs went to one shard only (%lld, %lld)", on_a, on_b);
    CHECK_INT(t_int(a, "SELECT count(DISTINCT payload) FROM pgjobq.jobs WHERE queue = 't'"), on_a);
    CHECK_INT(t_int(b, "SELECT count(DISTINCT payload) FROM pgjobq.jobs WHERE queue = 't'"), on_b);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.forwarded"), on_b);
    CHECK_INT(
        t_int(src, "SELECT count(*) FROM pgjobq.history WHERE queue = pgjobq.outbox_queue() AND state = 'completed'"),
        600);
    CHECK_INT(t_int(src, "SELECT count(*) FROM pgjobq.history WHERE queue = pgjobq.outbox_queue()"
                         " AND result->>'shard' = 'sb'"),
              on_b);
    printf("  outbox jobs left at each crash: %lld %lld %lld %lld %lld; forwarded again (duplicate): %lld of 600\n",
           left[0], left[1], left[2], left[3], left[4],
           t_int(src, "SELECT count(*) FROM pgjobq.history WHERE queue = pgjobq.outbox_queue()"
                      " AND (result->>'duplicate')::boolean"));
    free(ci_a);
    PQfinish(a);
    PQfinish(b);
    PQfinish(src);
}
