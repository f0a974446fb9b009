/*
 * test_gate.c - the notification gate (issue 42; docs/design.md, "The notification gate") against the
 * real server: a worker's claim that took jobs but fewer than it asked for stamps its queue's gate, and
 * for the gate's window producers of that queue send no notification (and only of that queue: another
 * queue of the same slot still notifies); the worker then claims again after the window, and goes on
 * claiming until a producer that skipped its notification has committed, however late; a worker whose
 * promised claim comes back full wakes the others.
 *
 * The window is pgjobq.notify_gate_window(), 5 ms, which these tests replace in their own database (as
 * pgjobq.backoff may be replaced) with seconds or an hour, so that nothing depends on how fast this
 * machine is.  Workers poll once a minute here: only the gate's claims explain a pickup within seconds.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

static void set_window(PGconn *pg, const char *interval)
{
    PQclear(t_exec(pg,
                   "CREATE OR REPLACE FUNCTION pgjobq.notify_gate_window() RETURNS interval LANGUAGE sql IMMUTABLE"
                   " AS $$ SELECT interval '%s' $$",
                   interval));
}

/* Notifications that reached `listener` on channel pgjobq with payload `queue`, consumed; *from_pid
 * (may be NULL) gets the backend of the last one. */
static int notified(PGconn *listener, const char *queue, int *from_pid)
{
    PGnotify *n;
    int count = 0;

    PQclear(t_exec(listener, "SELECT 1")); /* a round trip: what was sent before has arrived */
    CHECK(PQconsumeInput(listener) == 1);
    while ((n = PQnotifies(listener)) != NULL) {
        if (strcmp(n->relname, "pgjobq") == 0 && strcmp(n->extra, queue) == 0) {
            count++;
            if (from_pid)
                *from_pid = n->be_pid;
        }
        PQfreemem(n);
    }
    return count;
}

static int gate_shut(PGconn *pg, const char *queue)
{
    return (int)t_int(pg,
                      "SELECT pgjobq.notify_gate_shut(pg_sequence_last_value(pgjobq.notify_gate_slot('%s')), '%s',"
                      " pgjobq.notify_gate_window())::int",
                      queue, queue);
}

static void enqueue_sql(PGconn *pg, const char *queue, const char *payload)
{
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('%s', payload => '%s')", queue, payload));
}

/* The gate row of a claim of `queue` (meta 'gate'): "stamped <window s>", "no stamp", or "no row". */
static char *claim_gate(PGconn *pg, const char *queue, int max_jobs, const char *gate)
{
    return t_str(pg,
                 "SELECT coalesce((SELECT CASE WHEN key IS NULL THEN 'no stamp' ELSE 'stamped ' || next_due END"
                 " FROM pgjobq.claim_next('%s', %d, '1 minute', 'w', gate => %s) WHERE meta = 'gate'), 'no row')",
                 queue, max_jobs, gate);
}

TEST(gate_a_short_claim_stamps_its_queue_and_silences_that_queue_alone)
{
    PGconn *pg = t_pg(), *listener = t_pg();
    char *s;

    set_window(pg, "1 hour");
    PQclear(t_exec(listener, "LISTEN pgjobq"));
    for (int i = 0; i < 2; i++)
        enqueue_sql(pg, "ga", "{}");
    CHECK_INT(notified(listener, "ga", NULL), 2);
    CHECK_INT(gate_shut(pg, "ga"), 0);

    /* A claim that does not ask for the gate (a library of version 31, SQL) says nothing of it and
     * stamps nothing. */
    CHECK_STR((s = claim_gate(pg, "ga", 10, "false")), "no row");
    free(s);
    CHECK_INT(gate_shut(pg, "ga"), 0);
    /* A full claim stamps nothing: there is more to claim, and the claimer claims again anyway. */
    for (int i = 0; i < 2; i++)
        enqueue_sql(pg, "ga", "{}");
    CHECK_STR((s = claim_gate(pg, "ga", 2, "true")), "no stamp");
    free(s);
    /* Nor does an empty one: an idle worker promises nothing (else it would claim every window). */
    CHECK_STR((s = claim_gate(pg, "ga", 10, "true")), "no stamp");
    free(s);
    CHECK_INT(gate_shut(pg, "ga"), 0);
    CHECK_INT(notified(listener, "ga", NULL), 2);

    /* A short claim that only asks for the gate's row (NULL: a worker whose notifications come slowly)
     * stamps nothing either. */
    for (int i = 0; i < 2; i++)
        enqueue_sql(pg, "ga", "{}");
    CHECK_STR((s = claim_gate(pg, "ga", 10, "NULL")), "no stamp");
    free(s);
    CHECK_INT(gate_shut(pg, "ga"), 0);
    CHECK_INT(notified(listener, "ga", NULL), 2);

    /* A short claim stamps: the worker will claim again after the window (3600 s here). */
    for (int i = 0; i < 2; i++)
        enqueue_sql(pg, "ga", "{}");
    CHECK_INT(notified(listener, "ga", NULL), 2);
    CHECK_STR((s = claim_gate(pg, "ga", 10, "true")), "stamped 3600");
    free(s);
    CHECK_INT(gate_shut(pg, "ga"), 1);
    /* Another short claim while the gate is shut stamps nothing: one promise at a time per queue. */
    for (int i = 0; i < 2; i++)
        enqueue_sql(pg, "ga", "{}");
    CHECK_INT(notified(listener, "ga", NULL), 0);
    CHECK_STR((s = claim_gate(pg, "ga", 10, "true")), "no stamp");
    free(s);
    CHECK_INT(gate_shut(pg, "ga"), 1);

    /* Producers of the queue send nothing now, by every path: enqueue, enqueue_many, a transaction of
     * the caller's, the C library. */
    enqueue_sql(pg, "ga", "{}");
    PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.enqueue_many(ARRAY['ga','ga'], NULL, ARRAY['{}','{}']::jsonb[])"));
    PQclear(t_exec(pg, "BEGIN"));
    enqueue_sql(pg, "ga", "{}");
    PQclear(t_exec(pg, "COMMIT"));
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = {0};
    o.queue = "ga";
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, NULL));
    pgjobq_client_close(c);
    CHECK_INT(notified(listener, "ga", NULL), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'ga' AND state = 'queued'"), 5);

    /* A queue that shares the slot but not the tag still notifies: the stamp is of "ga" alone. */
    char *other = t_str(pg, "SELECT 'q' || i FROM generate_series(1, 100000) i"
                            " WHERE hashtext('q' || i) & 63 = hashtext('ga') & 63"
                            " AND pgjobq.notify_gate_tag('q' || i) <> pgjobq.notify_gate_tag('ga') LIMIT 1");
    CHECK(other[0] == 'q');
    CHECK_INT(gate_shut(pg, other), 0);
    enqueue_sql(pg, other, "{}");
    CHECK_INT(notified(listener, other, NULL), 1);
    free(other);

    /* Once the window has passed, producers notify again. */
    set_window(pg, "0");
    CHECK_INT(gate_shut(pg, "ga"), 0);
    enqueue_sql(pg, "ga", "{}");
    CHECK_INT(notified(listener, "ga", NULL), 1);
    PQfinish(listener);
    PQfinish(pg);
}

static const char *wait_sql_text;
static long long wait_sql_want;
static int sql_reaches(void *arg)
{
    return t_int(arg, "%s", wait_sql_text) >= wait_sql_want;
}

static void wait_sql(PGconn *pg, const char *sql, long long want, int timeout_ms)
{
    wait_sql_text = sql;
    wait_sql_want = want;
    if (!t_wait_until(sql_reaches, pg, timeout_ms))
        t_fail(__FILE__, __LINE__, "after %d ms, %s is %lld, not >= %lld", timeout_ms, sql, t_int(pg, "%s", sql), want);
}

static void pause_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Starts `pgjobq work` on queue spec `queue` (NAME:N) with `handler`, polling once a minute, and
 * waits until it listens (its claim connection is past its set-up). */
static pid_t start_worker(PGconn *pg, const char *handler, const char *queue)
{
    pid_t pid = t_spawn(t_log_path("w"), NULL, "work", "--exec", handler, "--queue", queue, "--poll", "60s", NULL);
    wait_sql(pg, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgjobq-claim'"
                 " AND datname = current_database() AND query <> '' AND query NOT LIKE '%schema_version%'",
             1, 20000);
    return pid;
}

/* A worker stamps the gate only for a queue whose notifications come faster than one a window
 * (pgjobq__gate_wanted): two notified jobs of `queue` in quick succession, run, then the gate open
 * again (if their claims stamped it) and what `listener` (may be NULL) was sent consumed. */
static void prime(PGconn *pg, PGconn *listener, const char *queue)
{
    char sql[200];

    enqueue_sql(pg, queue, "{\"prime\": 1}");
    enqueue_sql(pg, queue, "{\"prime\": 2}");
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = '%s' AND state = 'completed'", queue);
    wait_sql(pg, sql, 2, 20000);
    snprintf(sql, sizeof sql,
             "SELECT (NOT pgjobq.notify_gate_shut(pg_sequence_last_value(pgjobq.notify_gate_slot('%s')), '%s',"
             " pgjobq.notify_gate_window()))::int",
             queue, queue);
    wait_sql(pg, sql, 1, 20000);
    if (listener)
        notified(listener, queue, NULL);
}

/* A worker whose queue's notifications come slower than one a window never stamps the gate: every
 * job is notified, and no claim waits for a window (the pickup under a sustained load of batches
 * stayed what it was before the gate; bench/README.md, "The floor, and the gate under a sustained
 * load"). */
TEST_FULL(gate_a_worker_stamps_only_for_notifications_faster_than_the_window, 120, 0)
{
    PGconn *pg = t_pg(), *listener = t_pg();
    const char *handler = t_script("h.sh", "cat >/dev/null; echo '{}'");

    set_window(pg, "200 milliseconds");
    PQclear(t_exec(listener, "LISTEN pgjobq"));
    pid_t pid = start_worker(pg, handler, "gs:4");
    /* One job a second: each claim is short (1 of 4 slots), none stamps, each job is notified. */
    for (int i = 1; i <= 4; i++) {
        enqueue_sql(pg, "gs", "{}");
        CHECK_INT(notified(listener, "gs", NULL), 1);
        wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'gs' AND state = 'completed'", i, 20000);
        CHECK_INT(gate_shut(pg, "gs"), 0);
        pause_ms(1000);
    }
    /* Then notifications faster than the window: a later short claim stamps. */
    set_window(pg, "1 hour");
    pause_ms(100);
    int shut = 0;
    for (int i = 0; i < 40 && !shut; i++) {
        enqueue_sql(pg, "gs", "{}");
        pause_ms(20);
        shut = gate_shut(pg, "gs");
    }
    CHECK_INT(shut, 1);
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    PQfinish(listener);
    PQfinish(pg);
}

/* The worker's promise, kept until a producer that skipped its notification commits: the producer's
 * transaction enqueues while the gate is shut, and commits after the window has ended and after the
 * worker's first claim past it, which could not see the job.  Without the horizon (claiming until a
 * claim's cap passes that claim) the job would wait for the poll, a minute away. */
TEST_FULL(gate_a_worker_claims_until_a_producer_that_skipped_its_notification_commits, 120, 0)
{
    PGconn *pg = t_pg(), *producer = t_pg(), *listener = t_pg();
    const char *handler = t_script("h.sh", "cat >/dev/null; echo '{}'");

    set_window(pg, "3 seconds");
    PQclear(t_exec(listener, "LISTEN pgjobq"));
    pid_t pid = start_worker(pg, handler, "gw:4");
    prime(pg, listener, "gw");

    /* A notified job, claimed alone by a worker with four slots: a short claim, so the gate shuts. */
    enqueue_sql(pg, "gw", "{\"n\": 1}");
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'gw' AND state = 'completed'", 3, 20000);
    CHECK_INT(gate_shut(pg, "gw"), 1);
    CHECK_INT(notified(listener, "gw", NULL), 1);

    /* A producer enqueues while the gate is shut (no notification), and commits late. */
    PQclear(t_exec(producer, "BEGIN"));
    enqueue_sql(producer, "gw", "{\"n\": 2}");
    CHECK_INT(gate_shut(pg, "gw"), 1);
    wait_sql(pg, "SELECT (NOT pgjobq.notify_gate_shut(pg_sequence_last_value(pgjobq.notify_gate_slot('gw')), 'gw',"
                 " pgjobq.notify_gate_window()))::int",
             1, 10000);
    pause_ms(1500); /* the worker's first claims past the window run, and find nothing */
    int64_t t0 = t_now_ms();
    PQclear(t_exec(producer, "COMMIT"));
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'gw' AND state = 'completed'", 4, 20000);
    printf("a job whose producer skipped its notification and committed 1.5 s after the window: picked up %lld ms"
           " after its commit (poll: 60 s)\n",
           (long long)(t_now_ms() - t0));
    CHECK_INT(notified(listener, "gw", NULL), 0);
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    PQfinish(listener);
    PQfinish(producer);
    PQfinish(pg);
}

/* A worker whose promised claim comes back full (jobs are left that no producer announced), or falls
 * due with no free slot, wakes the other workers with one notification of its own. */
TEST_FULL(gate_a_worker_whose_promised_claim_comes_back_full_wakes_the_others, 120, 0)
{
    PGconn *pg = t_pg(), *listener = t_pg();
    /* (The priming jobs take 50 ms: handlers slower than 20 ms get no jobs claimed ahead, so that the
     * claim below asks for the one free slot only.) */
    const char *handler =
        t_script("h.sh", "p=$(cat); case \"$p\" in *block*) sleep 6;; *prime*) sleep 0.05;; esac; echo '{}'");
    int from = 0;

    set_window(pg, "3 seconds");
    PQclear(t_exec(listener, "LISTEN pgjobq"));
    pid_t pid = start_worker(pg, handler, "gh:2");
    prime(pg, listener, "gh");
    enqueue_sql(pg, "gh", "{\"block\": 1}");
    wait_sql(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'gh' AND state = 'running'", 1, 20000);
    CHECK_INT(gate_shut(pg, "gh"), 1);
    CHECK_INT(notified(listener, "gh", NULL), 1);
    /* Two more while the gate is shut: no notification.  After the window the worker claims the one
     * slot it has left, gets one of them (a full claim), and hands the promise on. */
    enqueue_sql(pg, "gh", "{\"block\": 2}");
    enqueue_sql(pg, "gh", "{\"block\": 3}");
    CHECK_INT(notified(listener, "gh", NULL), 0);
    wait_sql(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'gh' AND state = 'running'", 2, 20000);
    /* (Its start-up claim may have taken the first job, and the notification of that job the second,
     * before the window's end: then the promised claim finds no free slot, and is handed on all the
     * same.) */
    int got = 0;
    for (int64_t deadline = t_now_ms() + 15000; got == 0 && t_now_ms() < deadline; pause_ms(100))
        got = notified(listener, "gh", &from);
    CHECK_INT(got, 1);
    CHECK_INT(from, t_int(pg, "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgjobq-claim'"
                              " AND datname = current_database()"));
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'gh' AND state = 'completed'", 5, 60000);
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    PQfinish(listener);
    PQfinish(pg);
}

/* A worker's promise ends at a claim of its queue paused: kept, it would claim the paused queue again
 * and again without pause (a claim of a paused queue says nothing of the gate).  Counted in the
 * database's commits: each claim is one. */
TEST_FULL(gate_a_promise_ends_when_its_queue_is_paused, 120, 0)
{
    PGconn *pg = t_pg();
    const char *handler = t_script("h.sh", "cat >/dev/null; echo '{}'");

    set_window(pg, "2 seconds");
    pid_t pid = start_worker(pg, handler, "gp:4");
    prime(pg, NULL, "gp");
    enqueue_sql(pg, "gp", "{}");
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'gp' AND state = 'completed'", 3, 20000);
    CHECK_INT(gate_shut(pg, "gp"), 1);
    CHECK_INT(t_int(pg, "SELECT pgjobq.queue_pause('gp')::int"), 1);
    pause_ms(2500); /* the promised claims (at 1 s, and after the window) find the queue paused */
    long long before = t_int(pg, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()");
    pause_ms(2000);
    long long commits = t_int(pg, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()") - before;
    printf("commits in 2 s with the queue paused: %lld\n", commits);
    CHECK_MSG(commits < 300, "%lld commits in 2 s: the worker claims the paused queue without pause", commits);
    /* Resumed: its notification wakes the worker. */
    CHECK_INT(t_int(pg, "SELECT pgjobq.queue_resume('gp')::int"), 1);
    enqueue_sql(pg, "gp", "{}");
    wait_sql(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'gp' AND state = 'completed'", 4, 20000);
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    PQfinish(pg);
}
