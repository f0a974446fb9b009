/*
 * test_queues.c - queue settings against the real server: pause and resume (on every worker, woken by
 * NOTIFY), the concurrency limit under racing worker processes, the rate limit on the database clock,
 * and the command line's answers to bad input.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"


static void enqueue_n(pgjobq_client *c, const char *queue, int n)
{
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    o.queue = queue;
    for (int i = 0; i < n; i++)
        CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, NULL));
}

/* Waits until the SQL count reaches want, or fails after timeout_ms. */
static void wait_count(PGconn *pg, const char *sql, long long want, int timeout_ms)
{
    int64_t t0 = t_now_ms();
    long long have;
    while ((have = t_int(pg, "%s", sql)) < want) {
        if (t_now_ms() - t0 > timeout_ms)
            t_fail(__FILE__, __LINE__, "%s: %lld after %d ms, expected %lld", sql, have, timeout_ms, want);
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

TEST(queue_pause_holds_every_claim_and_resume_notifies)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg(), *listener = t_pg();
    pgjobq_queue_info *q = NULL;
    size_t n = 0;

    enqueue_n(c, "mail", 3);
    CHECK_OK(c, pgjobq_queue_pause(c, "mail", "smtp relay down"));
    CHECK_OK(c, pgjobq_queue_pause(c, "mail", "smtp relay still down")); /* again: the reason is replaced */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('mail', 10, '30 s', 'w')"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim('mail', 10)"), 0);
    CHECK(t_int(pg, "SELECT (pgjobq.next_due('mail') IS NULL)::int") == 1);

    CHECK_OK(c, pgjobq_queue_list(c, &q, &n));
    CHECK_INT((long long)n, 1);
    CHECK_STR(q[0].name, "mail");
    CHECK(q[0].paused_at != PGJOBQ_TIME_NONE);
    CHECK_STR(q[0].pause_reason, "smtp relay still down");
    CHECK_INT(q[0].queued, 3);
    CHECK_INT(q[0].concurrency, 0);
    pgjobq_queue_list_free(q);

    /* Resuming wakes listeners, with the queue's name. */
    PQclear(t_exec(listener, "LISTEN pgjobq"));
    CHECK_OK(c, pgjobq_queue_resume(c, "mail"));
    CHECK_OK(c, pgjobq_queue_resume(c, "mail")); /* not paused: nothing to do */
    int64_t t0 = t_now_ms();
    PGnotify *note = NULL;
    while (note == NULL && t_now_ms() - t0 < 5000) {
        CHECK(PQconsumeInput(listener) == 1);
        if ((note = PQnotifies(listener)) == NULL)
            sleep_ms(10);
    }
    CHECK_MSG(note != NULL, "no notification after resume");
    CHECK_STR(note->extra, "mail");
    PQfreemem(note);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('mail', 10, '30 s', 'w')"), 3);

    /* Bad input changes nothing. */
    CHECK_RC(c, pgjobq_queue_pause(c, "no spaces", NULL), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_queue_set_concurrency(c, "mail", -1), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_queue_set_rate(c, "mail", 5, 0), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_queue_set_rate(c, "mail", 10001, 1000), PGJOBQ_EINVAL);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE concurrency IS NOT NULL OR rate_limit IS NOT NULL"),
              0);
    PQfinish(pg);
    PQfinish(listener);
    pgjobq_client_close(c);
}

TEST(queue_claim_from_a_limited_queue_needs_read_committed)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();

    enqueue_n(c, "limited", 2);
    CHECK_OK(c, pgjobq_queue_set_concurrency(c, "limited", 1));
    PQclear(t_exec(pg, "BEGIN ISOLATION LEVEL REPEATABLE READ"));
    PGresult *r = PQexec(pg, "SELECT * FROM pgjobq.claim_batch('limited', 5, '30 s', 'w')");
    CHECK(PQresultStatus(r) == PGRES_FATAL_ERROR);
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "25000");
    PQclear(r);
    PQclear(t_exec(pg, "ROLLBACK"));
    /* In READ COMMITTED: one at a time, whatever the batch asks for. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('limited', 5, '30 s', 'w')"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('limited', 5, '30 s', 'w')"), 0);
    /* An expired lease frees its slot at once, before any rescue. */
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET lease_until = now() - interval '1 s' WHERE state = 'running'"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('limited', 5, '30 s', 'w')"), 1);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* The test: 4 worker processes x 8 slots on a queue limited to 3; handlers that sleep and
 * record their start and end.  The overlap never exceeds 3, and every job completes. */
TEST_FULL(queue_concurrency_limit_holds_across_worker_processes, 180, 0)
{
    enum { JOBS = 30, PROCS = 4 };
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    char ledger[512], body[1024];
    pid_t pids[PROCS];

    snprintf(ledger, sizeof ledger, "%s/ledger", t_tmpdir());
    snprintf(body, sizeof body,
             "cat >/dev/null\n"
             "start=$(date +%%s%%N)\n"
             "sleep 0.3\n"
             "echo \"$PGJOBQ_JOB_ID $start $(date +%%s%%N)\" >> %s\n"
             "echo '{}'",
             ledger);
    const char *handler = t_script("handler.sh", body);
    CHECK_OK(c, pgjobq_queue_set_concurrency(c, "limited", 3));
    enqueue_n(c, "limited", JOBS);
    for (int i = 0; i < PROCS; i++) {
        char id[32];
        snprintf(id, sizeof id, "w%d", i);
        pids[i] = t_spawn(t_log_path(id), NULL, "work", "--queue", "limited:8", "--exec", handler, "--worker-id", id,
                          "--poll", "200ms", NULL);
    }
    wait_count(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'limited' AND state = 'completed'", JOBS,
               150000);
    for (int i = 0; i < PROCS; i++)
        kill(pids[i], SIGTERM);
    for (int i = 0; i < PROCS; i++) {
        int status = t_wait_exit(pids[i], 30000);
        if (status != 0)
            t_show_log(t_log_path("w0"));
        CHECK_MSG(status == 0, "worker %d exited with %d", i, status);
    }
    PQclear(t_exec(pg, "CREATE TEMP TABLE ledger (id bigint, s numeric, e numeric)"));
    PQclear(t_exec(pg, "COPY ledger FROM '%s' WITH (DELIMITER ' ')", ledger));
    CHECK_INT(t_int(pg, "SELECT count(DISTINCT id) FROM ledger"), JOBS);
    /* The most handlers running at one instant: at each start, those started and not yet ended. */
    long long overlap = t_int(pg, "SELECT max((SELECT count(*) FROM ledger b WHERE b.s <= a.s AND b.e > a.s))"
                                  " FROM ledger a");
    long long workers_used = t_int(pg, "SELECT count(DISTINCT worker_id) FROM pgjobq.all_jobs WHERE queue = 'limited'");
    printf("limit 3: at most %lld handlers at once, %lld workers took jobs\n", overlap, workers_used);
    CHECK_MSG(overlap <= 3, "%lld handlers ran at once on a queue limited to 3", overlap);
    CHECK_MSG(overlap >= 2, "the limit was never approached (%lld at once): the test proves nothing", overlap);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* Eight claimers on their own connections, racing: claim up to 5, look at how many jobs of the queue
 * run under a valid lease, complete, again.  Every look is a snapshot of committed state; none may see
 * more than the limit. */
static _Atomic long long race_most, race_claimed;
/* What the claimers claim, and the look: the most running where the limit applies. */
static const char *race_claim_sql = "SELECT coalesce(array_agg(id), '{}'), coalesce(array_agg(lease_token), '{}'),"
                                    " count(*) FROM pgjobq.claim_batch('race', 5, '30 s', 'racer')";
static const char *race_look_sql = "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'race' AND state = 'running'"
                                   " AND lease_until > now()";
static void *race_claimer(void *arg)
{
    PGconn *pg = PQconnectdb(t_conninfo());
    unsigned seed = (unsigned)(uintptr_t)arg;
    (void)arg;
    if (PQstatus(pg) != CONNECTION_OK) {
        PQfinish(pg);
        return (void *)1;
    }
    for (int round = 0; round < 60; round++) {
        PGresult *r = PQexec(pg, race_claim_sql);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
            PQclear(r);
            PQfinish(pg);
            return (void *)2;
        }
        char ids[4096], tokens[4096];
        snprintf(ids, sizeof ids, "%s", PQgetvalue(r, 0, 0));
        snprintf(tokens, sizeof tokens, "%s", PQgetvalue(r, 0, 1));
        race_claimed += atoll(PQgetvalue(r, 0, 2));
        PQclear(r);
        r = PQexec(pg, race_look_sql);
        long long running = PQresultStatus(r) == PGRES_TUPLES_OK ? atoll(PQgetvalue(r, 0, 0)) : 0;
        PQclear(r);
        long long most = atomic_load(&race_most);
        while (running > most && !atomic_compare_exchange_weak(&race_most, &most, running))
            ;
        seed = seed * 1103515245u + 12345u;
        sleep_ms((long)((seed >> 8) % 4));
        const char *values[2] = {ids, tokens};
        r = PQexecParams(pg, "SELECT count(*) FROM pgjobq.complete_many($1::bigint[], $2::bigint[], NULL)", 2, NULL,
                         values, NULL, NULL, 0);
        PQclear(r);
    }
    PQfinish(pg);
    return NULL;
}

TEST_FULL(queue_concurrency_limit_holds_between_racing_claimers, 120, 0)
{
    pgjobq_client *c = t_client();
    pthread_t t[8];

    CHECK_OK(c, pgjobq_queue_set_concurrency(c, "race", 3));
    enqueue_n(c, "race", 2000);
    for (int i = 0; i < 8; i++)
        CHECK(pthread_create(&t[i], NULL, race_claimer, (void *)(uintptr_t)(i + 1)) == 0);
    for (int i = 0; i < 8; i++) {
        void *rv = NULL;
        pthread_join(t[i], &rv);
        CHECK_MSG(rv == NULL, "claimer %d failed (%ld)", i, (long)(intptr_t)rv);
    }
    printf("8 claimers, limit 3: %lld jobs claimed, at most %lld running in any look\n", (long long)race_claimed,
           (long long)race_most);
    CHECK_MSG(race_most <= 3, "%lld jobs ran at once under a limit of 3", (long long)race_most);
    CHECK_MSG(race_most == 3 && race_claimed >= 100, "the limit was not exercised (%lld claimed, %lld at most)",
              (long long)race_claimed, (long long)race_most);
    pgjobq_client_close(c);
}

/* The same race under a per-key limit of 2 over four keys and jobs without a key: no key ever has more
 * than 2 running, and jobs of other keys keep flowing. */
TEST_FULL(queue_key_concurrency_holds_between_racing_claimers, 120, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    static const char *const keys[] = {"customer:1", "customer:2", "customer:3", "customer:4", NULL};
    pthread_t t[8];

    o.queue = "keyed";
    for (int i = 0; i < 600; i++) {
        o.concurrency_key = keys[i % 5];
        CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, NULL));
    }
    CHECK_OK(c, pgjobq_queue_set_key_concurrency(c, "keyed", 2));
    race_claim_sql = "SELECT coalesce(array_agg(id), '{}'), coalesce(array_agg(lease_token), '{}'), count(*)"
                     " FROM pgjobq.claim_batch('keyed', 5, '30 s', 'racer')";
    race_look_sql = "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM pgjobq.jobs WHERE queue = 'keyed'"
                    " AND state = 'running' AND lease_until > now() AND concurrency_key IS NOT NULL"
                    " GROUP BY concurrency_key) k";
    race_most = race_claimed = 0;
    for (int i = 0; i < 8; i++)
        CHECK(pthread_create(&t[i], NULL, race_claimer, (void *)(uintptr_t)(i + 1)) == 0);
    for (int i = 0; i < 8; i++) {
        void *rv = NULL;
        pthread_join(t[i], &rv);
        CHECK_MSG(rv == NULL, "claimer %d failed (%ld)", i, (long)(intptr_t)rv);
    }
    printf("8 claimers, 2 per key: %lld jobs claimed, at most %lld of one key running in any look\n",
           (long long)race_claimed, (long long)race_most);
    CHECK_MSG(race_most <= 2, "%lld jobs of one key ran at once under a limit of 2", (long long)race_most);
    CHECK_MSG(race_most == 2 && race_claimed >= 100, "the limit was not exercised (%lld claimed, %lld at most)",
              (long long)race_claimed, (long long)race_most);
    /* Every job of every key ran: no key was starved behind another. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'keyed' AND state = 'completed'"), 600);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* A rescue pass as a worker runs it (src/worker.c): the alarms due since a little (2 s) before the
 * previous pass's now().  Returns how many jobs it rescued; *since_s carries the next pass's since. */
static long long rescue_like_a_worker(PGconn *pg, char *since_s, size_t size)
{
    PGresult *r = t_exec(pg, "SELECT pgjobq.rescue_expired(1000, %s%s%s), (now() - interval '2 s')::text",
                         since_s[0] ? "'" : "", since_s[0] ? since_s : "NULL", since_s[0] ? "'" : "");
    long long n = atoll(PQgetvalue(r, 0, 0));
    snprintf(since_s, size, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    return n;
}

/* Passes of the rescue, one every 100 ms, until job id is queued again; how long that took (ms), or -1
 * after timeout_ms. */
static long long rescued_within(PGconn *pg, char *since_s, size_t size, long long id, int timeout_ms)
{
    int64_t t0 = t_now_ms();
    while (t_now_ms() - t0 < timeout_ms) {
        rescue_like_a_worker(pg, since_s, size);
        if (t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued'", id) == 1)
            return t_now_ms() - t0;
        sleep_ms(100);
    }
    return -1;
}

/* The claims of a limited queue count its running jobs through the alarms of their leases, and fold
 * those alarms as they count (pgjobq.running_fold): after 40 claims of 3, each completed, the alarms
 * name the job still running and the last claim's, not the 120 claims of the last seconds, which every
 * count read before (27 ms a claim at 3,900 jobs/s).  The job left running keeps its alarm through the
 * folds, due at its lease's end: when the lease ends, the rescue passes a worker runs put it back in
 * the queue. */
TEST(queue_limited_claims_fold_the_alarms_and_keep_every_running_job_named)
{
    PGconn *pg = t_pg();
    char since[64] = "";

    PQclear(t_exec(pg, "SELECT pgjobq.queue_set('folded', '{\"concurrency\": 4}')"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(array_fill('folded'::text, ARRAY[200]), NULL, NULL)"));
    CHECK_INT(rescue_like_a_worker(pg, since, sizeof since), 0);
    long long held = t_int(pg, "SELECT id FROM pgjobq.claim_batch('folded', 1, '10 min', 'stalled')");
    for (int round = 0; round < 40; round++) {
        CHECK_INT(t_int(pg,
                        "WITH c AS (SELECT * FROM pgjobq.claim_batch('folded', 3, '60 s', 'w'))"
                        " SELECT count(*) FROM pgjobq.complete_many((SELECT array_agg(id) FROM c),"
                        "                                           (SELECT array_agg(lease_token) FROM c))"
                        " WHERE outcome = 'completed'"),
                  3);
    }
    long long named = t_int(pg, "SELECT coalesce(sum(cardinality(ids)), 0) FROM pgjobq.lease_alarms"
                                " WHERE queue = 'folded'");
    printf("after 40 claims of 3, the alarms name %lld jobs\n", named);
    CHECK_MSG(named <= 4, "the alarms of a limited queue name %lld jobs: the held one and the last claim's 3 at most",
              named);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.lease_alarms, unnest(ids) AS i WHERE queue = 'folded' AND i = %lld",
                    held),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.running_jobs('folded')"), 1);
    /* The limit still counts it: 3 slots are left. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('folded', 10, '60 s', 'w')"), 3);
    PQclear(t_exec(pg, "SELECT pgjobq.complete_many(array_agg(id), array_agg(lease_token)) FROM pgjobq.jobs"
                       " WHERE queue = 'folded' AND state = 'running' AND id <> %lld",
                   held));
    /* Its worker stalls: the lease is cut to end in a second (the trigger arms an alarm of its own, which
     * the next claims fold with the rest), and the claims go on. */
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET lease_until = now() + interval '1 s' WHERE id = %lld", held));
    for (int round = 0; round < 3; round++)
        PQclear(t_exec(pg, "WITH c AS (SELECT * FROM pgjobq.claim_batch('folded', 1, '60 s', 'w'))"
                           " SELECT pgjobq.complete_many((SELECT array_agg(id) FROM c), (SELECT array_agg(lease_token) FROM c))"));
    /* Named by an alarm due at its lease's end (or at the fold, if the lease had ended by then). */
    CHECK_MSG(t_int(pg, "SELECT count(*) FROM pgjobq.lease_alarms a WHERE %lld = ANY (a.ids)"
                        " AND a.until <= (SELECT greatest(j.lease_until, now()) FROM pgjobq.jobs j WHERE j.id = %lld)",
                    held, held) >= 1,
              "no alarm names the stalled job at its lease's end");
    /* Once that alarm is due, it is the rescue's: a claim's fold leaves it as it is (folded again, it
     * was due at each fold's clock, a time that a queue claimed without pause kept moving on). */
    int64_t t0 = t_now_ms();
    while (t_int(pg, "SELECT count(*) FROM pgjobq.lease_alarms a WHERE %lld = ANY (a.ids) AND a.until < now()",
                 held) == 0) {
        CHECK_MSG(t_now_ms() - t0 < 15000, "the stalled job's alarm did not fall due within 15 s");
        sleep_ms(50);
    }
    char *due = t_str(pg, "SELECT min(a.until)::text FROM pgjobq.lease_alarms a WHERE %lld = ANY (a.ids)"
                          " AND a.until < now()",
                      held);
    PQclear(t_exec(pg, "WITH c AS (SELECT * FROM pgjobq.claim_batch('folded', 1, '60 s', 'w'))"
                       " SELECT pgjobq.complete_many((SELECT array_agg(id) FROM c), (SELECT array_agg(lease_token) FROM c))"));
    CHECK_MSG(t_int(pg, "SELECT count(*) FROM pgjobq.lease_alarms a WHERE %lld = ANY (a.ids) AND a.until = '%s'", held,
                    due) == 1,
              "a claim folded the stalled job's due alarm (due at %s) into a new one", due);
    free(due);
    long long ms = rescued_within(pg, since, sizeof since, held, 15000);
    printf("the stalled job was rescued %lld ms after its alarm fell due\n", ms);
    CHECK_MSG(ms >= 0, "the stalled job was not rescued within 15 s");
    CHECK_INT(t_int(pg, "SELECT attempt FROM pgjobq.jobs WHERE id = %lld", held), 1);
    PQfinish(pg);
}

/* A limited queue claimed without pause (one claim after the other, as a busy fleet claims): a job
 * whose lease ends meanwhile is still rescued within a few passes.  The folds leave a due alarm to
 * the rescue; when they took it too, each claim folded it again into an alarm due at its own clock,
 * always just made or held, and the job stayed running as long as the claims went on. */
static _Atomic int busy_stop;
static void *busy_claimer(void *arg)
{
    PGconn *pg = PQconnectdb(t_conninfo());
    long long n = 0;
    (void)arg;
    if (PQstatus(pg) != CONNECTION_OK) {
        PQfinish(pg);
        return (void *)-1;
    }
    while (!atomic_load(&busy_stop)) {
        /* Each claim's transaction lasts 20 ms (a claim of many rows, or one inside the caller's
         * transaction), so that one of the two always holds the queue's lock, and with it what it folded. */
        PGresult *r = PQexec(pg, "BEGIN;"
                                 " WITH c AS (SELECT * FROM pgjobq.claim_batch('busy', 2, '60 s', 'w'))"
                                 " SELECT count(*) FROM pgjobq.complete_many((SELECT array_agg(id) FROM c),"
                                 "                                           (SELECT array_agg(lease_token) FROM c));"
                                 " SELECT pg_sleep(0.02);"
                                 " COMMIT");
        int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        if (!ok) {
            PQfinish(pg);
            return (void *)-2;
        }
        n++;
    }
    PQfinish(pg);
    return (void *)(intptr_t)n;
}

TEST_FULL(queue_limited_claims_without_pause_leave_an_ended_lease_to_the_rescue, 120, 0)
{
    PGconn *pg = t_pg();
    pthread_t t[2];
    char since[64] = "";

    PQclear(t_exec(pg, "SELECT pgjobq.queue_set('busy', '{\"concurrency\": 50}')"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(array_fill('busy'::text, ARRAY[100000]), NULL, NULL)"));
    CHECK_INT(rescue_like_a_worker(pg, since, sizeof since), 0);
    long long held = t_int(pg, "SELECT id FROM pgjobq.claim_batch('busy', 1, '1 s', 'stalled')");
    atomic_store(&busy_stop, 0);
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&t[i], NULL, busy_claimer, NULL) == 0);
    long long ms = rescued_within(pg, since, sizeof since, held, 20000);
    atomic_store(&busy_stop, 1);
    long long claims = 0;
    for (int i = 0; i < 2; i++) {
        void *rv = NULL;
        pthread_join(t[i], &rv);
        CHECK_MSG((intptr_t)rv >= 0, "claimer %d failed (%ld)", i, (long)(intptr_t)rv);
        claims += (intptr_t)rv;
    }
    printf("%lld claims without pause; the job whose lease of 1 s ended was rescued after %lld ms\n", claims, ms);
    CHECK_MSG(ms >= 0, "a job whose lease ended was not rescued within 20 s while claims went on (%lld claims)",
              claims);
    CHECK_MSG(claims >= 10, "only %lld claims ran while the test waited: it proves nothing", claims);
    PQfinish(pg);
}

/* A count never misses the jobs of an alarm that a rescue pass holds (the fold skips such an alarm,
 * SKIP LOCKED, and reads it as running_jobs does): with the limit reached by the jobs of one alarm,
 * locked by another session, a claim takes nothing. */
TEST(queue_limited_claims_count_the_alarms_a_rescue_holds)
{
    PGconn *pg = t_pg(), *other = t_pg();

    PQclear(t_exec(pg, "SELECT pgjobq.queue_set('foldheld', '{\"concurrency\": 3}')"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(array_fill('foldheld'::text, ARRAY[10]), NULL, NULL)"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('foldheld', 3, '60 s', 'w')"), 3);
    PQclear(t_exec(other, "BEGIN"));
    CHECK_INT(t_int(other, "SELECT count(*) FROM (SELECT 1 FROM pgjobq.lease_alarms WHERE queue = 'foldheld'"
                           " FOR UPDATE) a"),
              1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('foldheld', 3, '60 s', 'w')"), 0);
    PQclear(t_exec(other, "ROLLBACK"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('foldheld', 3, '60 s', 'w')"), 0);
    PQclear(t_exec(pg, "SELECT pgjobq.complete_many(array_agg(id), array_agg(lease_token)) FROM pgjobq.jobs"
                       " WHERE queue = 'foldheld' AND state = 'running'"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('foldheld', 5, '60 s', 'w')"), 3);
    PQfinish(other);
    PQfinish(pg);
}

/* A busy key does not hold back the others (no head-of-line blocking), whatever the order of the
 * backlog; the key's next job runs once one of its slots is free. */
TEST(queue_key_concurrency_takes_keys_in_turn)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    char *out = NULL, *err = NULL;

    o.queue = "api";
    o.concurrency_key = "big-customer";
    for (int i = 0; i < 50; i++)
        CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, NULL));
    o.concurrency_key = "small-customer";
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, NULL));
    o.concurrency_key = NULL;
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, NULL));
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "api", "--key-concurrency", "1", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('api', 10, '30 s', 'w')"), 3);
    CHECK_INT(t_int(pg, "SELECT count(DISTINCT coalesce(concurrency_key, '-')) FROM pgjobq.jobs WHERE state = 'running'"),
              3);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('api', 10, '30 s', 'w')"), 0);
    PQclear(t_exec(pg, "SELECT pgjobq.complete_many(array_agg(id), array_agg(lease_token)) FROM pgjobq.jobs"
                       " WHERE state = 'running' AND concurrency_key = 'big-customer'"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('api', 10, '30 s', 'w')"), 1);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "ls", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"key_concurrency\":1"), "queue ls --json: %s", out);
    free(out);
    free(err);
    /* Bad keys and limits are refused and write nothing. */
    o.concurrency_key = "";
    CHECK_RC(c, pgjobq_enqueue(c, "{}", &o, NULL), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_queue_set_key_concurrency(c, "api", 1000001), PGJOBQ_EINVAL);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "api", "--key-concurrency", "0", NULL), 64);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'api'"), 51);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "enqueue", "--queue", "api", "--concurrency-key", "small-customer", "{}", NULL),
              0);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE concurrency_key = 'small-customer' AND state = 'queued'"),
              1);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST_FULL(queue_rate_limit_spaces_starts_on_the_database_clock, 120, 0)
{
    enum { JOBS = 12 };
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pid_t pids[2];

    const char *handler = t_script("noop.sh", "cat >/dev/null\necho '{}'");
    CHECK_OK(c, pgjobq_queue_set_rate(c, "paced", 4, 2000));
    enqueue_n(c, "paced", JOBS);
    for (int i = 0; i < 2; i++) {
        char id[32];
        snprintf(id, sizeof id, "r%d", i);
        pids[i] = t_spawn(t_log_path(id), NULL, "work", "--queue", "paced:8", "--exec", handler, "--worker-id", id,
                          "--poll", "5s", NULL);
    }
    wait_count(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'paced' AND state = 'completed'", JOBS, 90000);
    for (int i = 0; i < 2; i++)
        kill(pids[i], SIGTERM);
    for (int i = 0; i < 2; i++)
        CHECK_INT(t_wait_exit(pids[i], 30000), 0);
    /* In any 2 s window starting at a start, at most 4 starts (started_at: the database clock). */
    long long most = t_int(pg, "SELECT max((SELECT count(*) FROM pgjobq.all_jobs b WHERE b.queue = 'paced'"
                               " AND b.started_at >= a.started_at AND b.started_at < a.started_at + interval '2 s'))"
                               " FROM pgjobq.all_jobs a WHERE a.queue = 'paced'");
    double spread = (double)t_int(pg, "SELECT (extract(epoch FROM max(started_at) - min(started_at)) * 1000)::bigint"
                                      " FROM pgjobq.all_jobs WHERE queue = 'paced'") / 1000.0;
    printf("rate 4/2s: at most %lld starts in a 2 s window; 12 starts over %.2f s\n", most, spread);
    CHECK_MSG(most <= 4, "%lld jobs started within 2 s under a limit of 4 per 2 s", most);
    CHECK_MSG(spread >= 3.9, "12 jobs at 4 per 2 s started within %.2f s", spread);
    /* The workers learned when the window opened (next_due), not at their 5 s poll: done in well under
     * 3 polls' time after the last window opened. */
    CHECK_MSG(spread < 9.0, "starts spread over %.2f s: the workers waited for their poll", spread);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST_FULL(queue_paused_with_a_worker_running_then_resumed, 120, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();

    const char *handler = t_script("noop.sh", "cat >/dev/null\necho '{}'");
    pid_t pid = t_spawn(t_log_path("p"), NULL, "work", "--queue", "held:4", "--exec", handler, "--poll", "30s", NULL);
    enqueue_n(c, "held", 2);
    wait_count(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'held' AND state = 'completed'", 2, 60000);
    CHECK_OK(c, pgjobq_queue_pause(c, "held", "test"));
    enqueue_n(c, "held", 5);
    sleep_ms(1500);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'held' AND state = 'queued'"), 5);
    int64_t t0 = t_now_ms();
    CHECK_OK(c, pgjobq_queue_resume(c, "held"));
    /* The worker polls every 30 s: only the resume's notification can bring it back this soon. */
    wait_count(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'held' AND state = 'completed'", 7, 20000);
    printf("resumed: 5 jobs done %lld ms later\n", (long long)(t_now_ms() - t0));
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(queue_command_sets_lists_and_refuses_bad_input)
{
    PGconn *pg = t_pg();
    char *out = NULL, *err = NULL;

    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "api", "--concurrency", "5", "--rate", "100/1m", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "pause", "api", "--reason", "<b>quota</b>", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "ls", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"queue\":\"api\"") && strstr(out, "\"concurrency\":5") &&
                  strstr(out, "\"rate_limit\":100,\"rate_period_ms\":60000") &&
                  strstr(out, "\"pause_reason\":\"<b>quota</b>\""),
              "queue ls --json printed: %s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "ls", NULL), 0);
    CHECK_MSG(strstr(out, "paused") && strstr(out, "100/1m") && strstr(out, "MAX LEASE") && strstr(out, " 1d "),
              "queue ls printed: %s", out);
    free(out);
    free(err);
    /* The longest lease a worker may take (a day by default). */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "api", "--max-lease", "10m", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "ls", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"max_lease_ms\":600000"), "queue ls --json printed: %s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "ls", NULL), 0);
    CHECK_MSG(strstr(out, " 10m "), "queue ls printed: %s", out);
    free(out);
    free(err);
    /* A typo: pausing or draining a queue nobody uses is refused (it would create the queue), unless
     * --create says so; setting limits ahead of the first job is noted. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "pause", "apj", NULL), 65);
    CHECK_MSG(strstr(err, "queue apj has no jobs and no settings") && strstr(err, "--create"), "stderr: %s", err);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "drain", "apj", NULL), 65);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE name = 'apj'"), 0);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "pause", "later", "--create", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "fresh", "--concurrency", "3", NULL), 0);
    CHECK_MSG(strstr(err, "note: queue fresh has no jobs yet"), "stderr: %s", err);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE name IN ('later', 'fresh')"), 2);
    /* Drain of a paused queue with nothing running returns at once. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "drain", "api", "--wait", "5s", NULL), 0);
    free(out);
    free(err);

    /* Bad input: exit 64, a message, nothing changed. */
    static const char *const bad[][6] = {
        {"queue", "set", "api", "--concurrency", "0", NULL},
        {"queue", "set", "api", "--rate", "5", NULL},
        {"queue", "set", "api", "--rate", "10001/1s", NULL},
        {"queue", "set", "api", "--rate", "5/2d", NULL},
        {"queue", "set", "api", "--max-lease", "500ms", NULL},
        {"queue", "set", "api", "--max-lease", "366d", NULL},
        {"queue", "set", "api", "--max-lease", "forever", NULL},
        {"queue", "pause", "api", "--max-lease", "1h", NULL},
        {"queue", "set", "bad name", "--concurrency", "2", NULL},
        {"queue", "set", "api", NULL},
        {"queue", "pause", NULL},
        {"queue", "resume", "api", "--concurrency", "2", NULL},
        {"queue", "explode", "api", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int status = t_cli(&out, &err, NULL, 0, bad[i][0], bad[i][1], bad[i][2], bad[i][3], bad[i][4], bad[i][5]);
        CHECK_MSG(status == 64 && err && strlen(err) > 10, "pgjobq %s %s %s: status %d, stderr %s", bad[i][1],
                  bad[i][2] ? bad[i][2] : "", bad[i][3] ? bad[i][3] : "", status, err ? err : "");
        free(out);
        free(err);
    }
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE name = 'api' AND concurrency = 5"
                        " AND rate_limit = 100 AND rate_period = '1 minute' AND paused_at IS NOT NULL"
                        " AND max_lease = '10 minutes'"),
              1);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "resume", "api", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "queue", "set", "api", "--concurrency", "none", "--rate", "none",
                    "--max-lease", "default", NULL),
              0);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.queues WHERE name = 'api' AND concurrency IS NULL"
                        " AND rate_limit IS NULL AND paused_at IS NULL AND max_lease IS NULL"),
              1);
    PQfinish(pg);
}

/* The calendar of schedules, pinned, daylight saving included (Europe/Berlin and America/New_York,
 * 2026: spring forward on 29 March and 8 March, fall back on 25 October and 1 November). */
TEST(cron_next_follows_the_calendar_and_daylight_saving)
{
    static const char *const cases[][4] = {
        /* schedule, tz, after, expected (UTC) */
        {"0 3 * * *", "UTC", "2026-01-01 05:00Z", "2026-01-02 03:00:00"},
        {"*/15 * * * *", "UTC", "2026-01-01 10:07Z", "2026-01-01 10:15:00"},
        {"*/10 * * * * *", "UTC", "2026-01-01 10:00:05Z", "2026-01-01 10:00:10"},
        {"0 9 * * mon-fri", "Europe/Berlin", "2026-12-04 10:00+01", "2026-12-07 08:00:00"},
        {"0 0 13 * fri", "UTC", "2026-02-01Z", "2026-02-06 00:00:00"},     /* either day field */
        {"0 12 29 feb *", "UTC", "2026-02-01Z", "2028-02-29 12:00:00"},
        {"0 0 * * 7", "UTC", "2026-12-01Z", "2026-12-06 00:00:00"},        /* 7 is Sunday too */
        {"5/20 1 1 jan *", "UTC", "2026-06-01Z", "2027-01-01 01:05:00"},
        /* Spring forward: 02:30 does not exist; it fires at the first instant after the gap. */
        {"30 2 * * *", "Europe/Berlin", "2026-03-28 12:00Z", "2026-03-29 01:00:00"},
        {"30 2 * * *", "America/New_York", "2026-03-07 12:00Z", "2026-03-08 07:00:00"},
        {"* * * * *", "Europe/Berlin", "2026-03-29 00:59:30Z", "2026-03-29 01:00:00"},
        /* Fall back: 02:30 (Berlin) and 01:30 (New York) happen twice; they fire once, the first time. */
        {"30 2 * * *", "Europe/Berlin", "2026-10-24 12:00Z", "2026-10-25 00:30:00"},
        {"30 2 * * *", "Europe/Berlin", "2026-10-25 00:30Z", "2026-10-26 01:30:00"},
        {"30 1 * * *", "America/New_York", "2026-10-31 12:00Z", "2026-11-01 05:30:00"},
        {"30 1 * * *", "America/New_York", "2026-11-01 05:30Z", "2026-11-02 06:30:00"},
        {"* * * * *", "Europe/Berlin", "2026-10-25 00:59:30Z", "2026-10-25 02:00:00"},
        /* The usual macros. */
        {"@hourly", "UTC", "2026-01-01 10:07Z", "2026-01-01 11:00:00"},
        {"@daily", "Europe/Berlin", "2026-01-01 10:07Z", "2026-01-01 23:00:00"},
        {"@midnight", "UTC", "2026-01-01 10:07Z", "2026-01-02 00:00:00"},
        {"@weekly", "UTC", "2026-12-01Z", "2026-12-06 00:00:00"},
        {"@monthly", "UTC", "2026-12-01 00:00:01Z", "2027-01-01 00:00:00"},
        {" @YEARLY ", "UTC", "2026-12-01Z", "2027-01-01 00:00:00"},
        {"@annually", "UTC", "2026-12-01Z", "2027-01-01 00:00:00"},
        {"0 3 * * *", "Etc/GMT-14", "2026-01-01 00:00Z", "2026-01-01 13:00:00"},
    };
    PGconn *pg = t_pg();

    PQclear(t_exec(pg, "SET timezone = 'UTC'"));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *values[3] = {cases[i][0], cases[i][1], cases[i][2]};
        PGresult *r = PQexecParams(pg, "SELECT to_char(pgjobq.cron_next($1, $2, $3::timestamptz),"
                                       " 'YYYY-MM-DD HH24:MI:SS')",
                                   3, NULL, values, NULL, NULL, 0);
        CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK, "cron_next('%s', '%s', '%s'): %s", cases[i][0], cases[i][1],
                  cases[i][2], PQresultErrorMessage(r));
        CHECK_MSG(strcmp(PQgetvalue(r, 0, 0), cases[i][3]) == 0, "cron_next('%s', '%s', '%s') = %s, expected %s",
                  cases[i][0], cases[i][1], cases[i][2], PQgetvalue(r, 0, 0), cases[i][3]);
        PQclear(r);
    }
    CHECK_INT(t_int(pg, "SELECT (pgjobq.cron_next('0 0 30 2 *', 'UTC', now()) IS NULL)::int"), 1);

    static const char *const bad[][2] = {{"61 * * * *", "UTC"}, {"a b c", "UTC"},      {"*/0 * * * *", "UTC"},
                                         {"* * * * mon-xyz", "UTC"}, {"5-1 * * * *", "UTC"}, {"* * * * *", "Mars/Olympus"},
                                         {"@fortnightly", "UTC"}, {"0 3 * * *", "+14"}, {"0 3 * * *", "-03:00"},
                                         {"0 3 * * *", "UTC+3"}, {"0 3 * * *", " 5"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *values[2] = {bad[i][0], bad[i][1]};
        PGresult *r = PQexecParams(pg, "SELECT pgjobq.cron_next($1, $2, now())", 2, NULL, values, NULL, NULL, 0);
        CHECK_MSG(PQresultStatus(r) == PGRES_FATAL_ERROR, "cron_next('%s', '%s') was accepted", bad[i][0], bad[i][1]);
        CHECK_MSG(strncmp(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22", 2) == 0, "cron_next('%s'): SQLSTATE %s",
                  bad[i][0], PQresultErrorField(r, PG_DIAG_SQLSTATE));
        PQclear(r);
    }
    PQfinish(pg);
}

/* ------------------------------------------------------------------------------------------------ */
/* Schedules                                                                                         */

/* Eight tickers at once, as eight workers' maintenance connections would: every fire time of an
 * every-second schedule (catch-up all) enqueues exactly one job, none twice, none missed. */
static _Atomic int tick_failures;
static void *ticker(void *arg)
{
    PGconn *pg = PQconnectdb(t_conninfo());
    int64_t until = t_now_ms() + 3000;
    (void)arg;
    while (PQstatus(pg) == CONNECTION_OK && t_now_ms() < until) {
        PGresult *r = PQexec(pg, "SELECT pgjobq.schedule_tick(100)");
        if (PQresultStatus(r) != PGRES_TUPLES_OK)
            atomic_fetch_add(&tick_failures, 1);
        PQclear(r);
        sleep_ms(7);
    }
    PQfinish(pg);
    return NULL;
}

TEST_FULL(schedule_ticks_from_many_workers_enqueue_each_fire_time_once, 60, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_schedule_opts o = PGJOBQ_SCHEDULE_OPTS_INIT;
    pthread_t t[8];
    int64_t first = 0;

    o.queue = "cron";
    o.catch_up = "all";
    o.payload = "{\"report\": \"pulse\"}";
    CHECK_OK(c, pgjobq_schedule_set(c, "pulse", "* * * * * *", &o, &first));
    CHECK(first != PGJOBQ_TIME_NONE);
    for (int i = 0; i < 8; i++)
        CHECK(pthread_create(&t[i], NULL, ticker, NULL) == 0);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    CHECK_INT(tick_failures, 0);
    long long jobs = t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'cron' AND payload = '{\"report\": \"pulse\"}'");
    long long fire_times = t_int(pg, "SELECT extract(epoch FROM last_run - to_timestamp(%lld / 1e6))::bigint + 1"
                                     " FROM pgjobq.schedules WHERE name = 'pulse'",
                                 (long long)first);
    printf("8 tickers for 3 s: %lld fire times, %lld jobs\n", fire_times, jobs);
    CHECK_MSG(fire_times >= 2, "the schedule fired %lld times in 3 s", fire_times);
    CHECK_INT(jobs, fire_times);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(schedule_catch_up_policies_and_settings)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_schedule_opts o = PGJOBQ_SCHEDULE_OPTS_INIT;
    static const char *const policies[][2] = {{"latest", "1"}, {"all", "11"}, {"skip", "1"}};

    o.queue = "catchup";
    /* Ten fire times missed (next_run 10 s ago), the eleventh due now. */
    for (size_t i = 0; i < 3; i++) {
        o.catch_up = policies[i][0];
        CHECK_OK(c, pgjobq_schedule_set(c, "s", "* * * * * *", &o, NULL));
        PQclear(t_exec(pg, "DELETE FROM pgjobq.jobs WHERE queue = 'catchup'"));
        PQclear(t_exec(pg, "UPDATE pgjobq.schedules SET next_run = date_trunc('second', now()) - interval '10 s'"));
        /* The next fire time is after the tick's own time (not the time of the check: on a slow
         * machine a second can pass in between). */
        long long before_us = t_int(pg, "SELECT (extract(epoch FROM now()) * 1e6)::bigint");
        CHECK_INT(t_int(pg, "SELECT pgjobq.schedule_tick(100)"), atoll(policies[i][1]));
        CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'catchup'"), atoll(policies[i][1]));
        CHECK_INT(t_int(pg, "SELECT (next_run > to_timestamp(%lld / 1e6))::int FROM pgjobq.schedules", before_us), 1);
    }
    /* A yearly schedule last due two hours ago: skip runs nothing that late; latest runs it once. */
    o.catch_up = "skip";
    CHECK_OK(c, pgjobq_schedule_set(c, "yearly", "0 0 1 1 *", &o, NULL));
    PQclear(t_exec(pg, "UPDATE pgjobq.schedules SET next_run = now() - interval '2 hours' WHERE name = 'yearly'"));
    PQclear(t_exec(pg, "DELETE FROM pgjobq.schedules WHERE name = 's'"));
    CHECK_INT(t_int(pg, "SELECT pgjobq.schedule_tick(100)"), 0);
    CHECK_INT(t_int(pg, "SELECT (next_run > now() + interval '1 day')::int FROM pgjobq.schedules"), 1);

    /* Disabled schedules do not fire; enabling starts from the next fire time, without catching up. */
    o.catch_up = "all";
    CHECK_OK(c, pgjobq_schedule_set(c, "often", "* * * * * *", &o, NULL));
    CHECK_OK(c, pgjobq_schedule_enable(c, "often", 0));
    PQclear(t_exec(pg, "UPDATE pgjobq.schedules SET next_run = now() - interval '1 minute' WHERE name = 'often'"));
    PQclear(t_exec(pg, "DELETE FROM pgjobq.jobs WHERE queue = 'catchup'"));
    CHECK_INT(t_int(pg, "SELECT pgjobq.schedule_tick(100)"), 0);
    CHECK_OK(c, pgjobq_schedule_enable(c, "often", 1));
    CHECK_INT(t_int(pg, "SELECT (next_run > now())::int FROM pgjobq.schedules WHERE name = 'often'"), 1);

    pgjobq_schedule_info *s = NULL;
    size_t n = 0;
    CHECK_OK(c, pgjobq_schedule_list(c, &s, &n));
    CHECK_INT((long long)n, 2);
    CHECK_STR(s[0].name, "often");
    CHECK_STR(s[0].catch_up, "all");
    CHECK_STR(s[0].queue, "catchup");
    CHECK(s[0].enabled && s[0].next_run != PGJOBQ_TIME_NONE);
    CHECK_STR(s[1].cron, "0 0 1 1 *");
    pgjobq_schedule_list_free(s);

    /* Bad input changes nothing. */
    CHECK_RC(c, pgjobq_schedule_set(c, "often", "61 * * * *", NULL, NULL), PGJOBQ_EINVAL);
    o.tz = "Nowhere/Atlantis";
    CHECK_RC(c, pgjobq_schedule_set(c, "often", "* * * * *", &o, NULL), PGJOBQ_EINVAL);
    o.tz = NULL;
    o.catch_up = "sometimes";
    CHECK_RC(c, pgjobq_schedule_set(c, "often", "* * * * *", &o, NULL), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_schedule_enable(c, "missing", 1), PGJOBQ_ENOTFOUND);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.schedules WHERE name = 'often' AND cron = '* * * * * *'"), 1);
    CHECK_OK(c, pgjobq_schedule_delete(c, "often"));
    CHECK_RC(c, pgjobq_schedule_delete(c, "often"), PGJOBQ_ENOTFOUND);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* A worker ticks schedules itself, and runs what they enqueue. */
TEST_FULL(schedule_jobs_are_enqueued_by_a_running_worker, 60, 0)
{
    PGconn *pg = t_pg();
    char *out = NULL, *err = NULL;

    const char *handler = t_script("noop.sh", "cat >/dev/null\necho '{}'");
    CHECK_INT(t_cli(&out, &err, NULL, 0, "cron", "add", "heartbeat", "--schedule", "* * * * * *", "--queue", "beats",
                    "--payload", "{\"beat\": true}", NULL),
              0);
    CHECK_MSG(strstr(out, "next run"), "schedule set printed: %s", out);
    free(out);
    free(err);
    pid_t pid = t_spawn(t_log_path("sw"), NULL, "work", "--queue", "beats:2", "--exec", handler, NULL);
    wait_count(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'beats' AND state = 'completed'"
                   " AND payload = '{\"beat\": true}'", 2, 30000);
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "cron", "ls", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"name\":\"heartbeat\"") && strstr(out, "\"queue\":\"beats\""), "schedule ls: %s", out);
    free(out);
    free(err);
    static const char *const bad[][8] = {
        {"cron", "add", "x", NULL},
        {"cron", "add", "x", "--schedule", "61 * * * *", NULL},
        {"cron", "add", "bad name", "--schedule", "* * * * *", NULL},
        {"cron", "rm", NULL},
        {"cron", "enable", "x", "--tz", "UTC", NULL},
        {"cron", "add", "x", "--schedule", "0 0 31 2 *", NULL}, /* never fires */
        {"cron", "add", "x", "--schedule", "0 3 * * *", "--tz", "+14", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int status = t_cli(&out, &err, NULL, 0, bad[i][0], bad[i][1], bad[i][2], bad[i][3], bad[i][4], bad[i][5],
                           bad[i][6], bad[i][7]);
        CHECK_MSG((status == 64 || status == 65) && err && strlen(err) > 10, "pgjobq cron %s %s: status %d, %s",
                  bad[i][1], bad[i][2] ? bad[i][2] : "", status, err ? err : "");
        free(out);
        free(err);
    }
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.schedules"), 1);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "cron", "add", "tick", "--schedule", "@hourly", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.schedules WHERE name = 'tick'"
                        " AND next_run = date_trunc('hour', now()) + interval '1 hour'"),
              1);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "cron", "rm", "tick", NULL), 0);
    free(out);
    free(err);
    /* trigger enqueues one job now; sync makes the set exactly the file's. */
    CHECK_INT(t_cli(&out, &err, NULL, 0, "cron", "trigger", "heartbeat", NULL), 0);
    CHECK_MSG(strstr(out, "triggered: job "), "cron trigger printed: %s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "cron", "trigger", "missing", NULL), 65);
    free(out);
    free(err);
    char path[600];
    snprintf(path, sizeof path, "%s/schedules.jsonl", t_tmpdir());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs("# the whole set\n"
          "{\"name\": \"nightly\", \"schedule\": \"0 3 * * *\", \"tz\": \"Europe/Berlin\", \"queue\": \"reports\"}\n"
          "\n"
          "{\"name\": \"hourly\", \"schedule\": \"0 * * * *\", \"payload\": {\"n\": 1}, \"catch_up\": \"skip\"}\n",
          f);
    CHECK(fclose(f) == 0);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "cron", "sync", path, NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.schedules"), 2); /* heartbeat is gone */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.schedules WHERE name = 'hourly' AND catch_up = 'skip'"
                        " AND payload = '{\"n\": 1}'"),
              1);
    long long next = t_int(pg, "SELECT extract(epoch FROM next_run)::bigint FROM pgjobq.schedules WHERE name = 'nightly'");
    CHECK_INT(t_cli(&out, &err, NULL, 0, "cron", "sync", path, NULL), 0); /* again: nothing changes */
    CHECK_MSG(strstr(out, ": 0 created"), "second sync printed: %s", out);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT extract(epoch FROM next_run)::bigint FROM pgjobq.schedules WHERE name = 'nightly'"), next);
    /* A bad file changes nothing. */
    f = fopen(path, "w");
    CHECK(f != NULL);
    fputs("{\"name\": \"nightly\", \"schedule\": \"0 3 * * *\"}\n{\"name\": \"broken\", \"schedule\": \"77 * * * *\"}\n", f);
    CHECK(fclose(f) == 0);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "cron", "sync", path, NULL), 65);
    free(out);
    free(err);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.schedules"), 2);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "cron", "rm", "hourly", NULL), 0);
    free(out);
    free(err);
    PQfinish(pg);
}

/* The test: three worker processes and a schedule that fires every second, for 10 seconds:
 * one job per fire time (catch-up all: a fire time a tick came late for still counts once). */
TEST_FULL(schedule_three_workers_ten_seconds_one_job_per_tick, 90, 0)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_schedule_opts o = PGJOBQ_SCHEDULE_OPTS_INIT;
    pid_t pids[3];
    int64_t first = 0;

    const char *handler = t_script("noop.sh", "cat >/dev/null\necho '{}'");
    for (int i = 0; i < 3; i++) {
        char id[32];
        snprintf(id, sizeof id, "t%d", i);
        pids[i] = t_spawn(t_log_path(id), NULL, "work", "--queue", "ticks:4", "--exec", handler, "--worker-id", id,
                          NULL);
    }
    o.queue = "ticks";
    o.catch_up = "all";
    CHECK_OK(c, pgjobq_schedule_set(c, "every-second", "* * * * * *", &o, &first));
    sleep_ms(10000);
    CHECK_OK(c, pgjobq_schedule_enable(c, "every-second", 0));
    sleep_ms(1500); /* a tick that took the schedule before it was disabled commits */
    for (int i = 0; i < 3; i++)
        kill(pids[i], SIGTERM);
    for (int i = 0; i < 3; i++) {
        int status = t_wait_exit(pids[i], 30000);
        if (status != 0)
            t_show_log(t_log_path("t0"));
        CHECK_MSG(status == 0, "worker %d exited with %d", i, status);
    }
    long long jobs = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'ticks'");
    long long fire_times = t_int(pg, "SELECT extract(epoch FROM last_run - to_timestamp(%lld / 1e6))::bigint + 1"
                                     " FROM pgjobq.schedules WHERE name = 'every-second'",
                                 (long long)first);
    long long done = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'ticks' AND state = 'completed'");
    printf("3 workers, 10 s: %lld fire times, %lld jobs, %lld completed\n", fire_times, jobs, done);
    CHECK_MSG(fire_times >= 8, "only %lld fire times in 10 s", fire_times);
    CHECK_INT(jobs, fire_times);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* Unique keys are scoped to their queue. */
TEST(unique_keys_are_scoped_to_their_queue)
{
    pgjobq_client *c = t_client();
    pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
    int64_t a = 0, b = 0, again = 0;

    o.unique_key = "digest:ana";
    o.queue = "mail";
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &a));
    o.queue = "sms";
    CHECK_OK(c, pgjobq_enqueue(c, "{}", &o, &b));
    CHECK(a != b);
    CHECK_RC(c, pgjobq_enqueue(c, "{}", &o, &again), PGJOBQ_EDUPLICATE);
    CHECK_INT(again, b);
    /* The same in one batch through the SQL function, across the two queues and within one. */
    PGconn *pg = t_pg();
    CHECK_INT(t_int(pg, "SELECT count(*) FILTER (WHERE NOT duplicate) FROM pgjobq.enqueue_many("
                        "ARRAY['push', 'push', 'web'], NULL, ARRAY['{}', '{}', '{}']::jsonb[], unique_keys => ARRAY['k', 'k', 'k'])"),
              2);
    PQfinish(pg);
    pgjobq_client_close(c);
}

/* Bad input through the SQL API names the argument and the rule, and writes nothing. */
TEST(sql_enqueue_errors_name_the_argument_and_the_rule)
{
    PGconn *pg = t_pg();
    static const char *const cases[][2] = {
        {"SELECT pgjobq.enqueue('bad queue!')", "queues[1] \"bad queue!\" is not a queue name"},
        {"SELECT pgjobq.enqueue('mail', '9kind')", "kinds[1] \"9kind\" is not a kind name"},
        {"SELECT * FROM pgjobq.enqueue_many(ARRAY['a', 'b'], NULL, ARRAY['{}', '{}']::jsonb[], ARRAY[0, 200]::smallint[])",
         "priorities[2] is 200"},
        {"SELECT pgjobq.enqueue('mail', max_attempts => 0)", "max_attempts[1] is 0"},
        {"SELECT pgjobq.enqueue('mail', unique_key => '')", "unique_keys[1] has 0 characters"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        PGresult *r = PQexec(pg, cases[i][0]);
        CHECK_MSG(PQresultStatus(r) == PGRES_FATAL_ERROR, "%s was accepted", cases[i][0]);
        CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "23514");
        CHECK_MSG(strstr(PQresultErrorMessage(r), cases[i][1]) != NULL, "%s: %s", cases[i][0], PQresultErrorMessage(r));
        PQclear(r);
    }
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs"), 0);
    PQfinish(pg);
}
