/*
 * test_claim.c - the claim: order, batches, SKIP LOCKED without waiting, exactly-once under 40
 * concurrent claimers in several processes, and the partial index under a large history.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

TEST(claim_follows_priority_then_run_at_then_id)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_job *jobs = NULL;
    size_t n = 0;

    /* Built with raw SQL so that run_at values are exact; ids follow insertion order. */
    PQclear(t_exec(pg, "INSERT INTO pgjobq.jobs (queue, priority, run_at, payload) VALUES"
                       " ('q', 5, now() - interval '3 s', '{\"n\": \"p5-old\"}'),"
                       " ('q', 0, now() - interval '1 s', '{\"n\": \"p0-new\"}'),"
                       " ('q', 0, now() - interval '2 s', '{\"n\": \"p0-old\"}'),"
                       " ('q', -3, now() - interval '1 s', '{\"n\": \"pm3\"}'),"
                       " ('q', 0, now() - interval '1 s', '{\"n\": \"p0-new-later-id\"}'),"
                       " ('q', -100, now() + interval '1 hour', '{\"n\": \"future\"}'),"
                       " ('other', -100, now() - interval '1 s', '{\"n\": \"other-queue\"}')"));
    CHECK_OK(c, pgjobq_claim(c, "q", 100, 30000, "w1", &jobs, &n));
    CHECK_INT(n, 5);
    const char *expect[] = {"pm3", "p0-old", "p0-new", "p0-new-later-id", "p5-old"};
    for (size_t i = 0; i < n; i++) {
        char want[64];
        snprintf(want, sizeof want, "{\"n\": \"%s\"}", expect[i]);
        CHECK_STR(jobs[i].payload, want);
        CHECK_INT(jobs[i].state, PGJOBQ_RUNNING);
        CHECK_INT(jobs[i].attempt, 1);
        CHECK(jobs[i].lease_token > 0);
        CHECK_STR(jobs[i].worker_id, "w1");
        CHECK(jobs[i].lease_until > jobs[i].started_at);
    }
    pgjobq_jobs_free(jobs);
    /* The future job and the other queue's job were not taken. */
    CHECK_OK(c, pgjobq_claim(c, "q", 100, 30000, "w1", &jobs, &n));
    CHECK_INT(n, 0);
    CHECK(jobs == NULL);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(claim_returns_batches_of_at_most_max_jobs)
{
    pgjobq_client *c = t_client();
    pgjobq_job_spec specs[10];
    pgjobq_job *jobs;
    size_t n, sizes[4];

    memset(specs, 0, sizeof specs);
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, 10, NULL, NULL));
    for (int i = 0; i < 4; i++) {
        CHECK_OK(c, pgjobq_claim(c, "default", 4, 30000, NULL, &jobs, &n));
        sizes[i] = n;
        pgjobq_jobs_free(jobs);
    }
    CHECK_INT(sizes[0], 4);
    CHECK_INT(sizes[1], 4);
    CHECK_INT(sizes[2], 2);
    CHECK_INT(sizes[3], 0);
    CHECK_RC(c, pgjobq_claim(c, "default", 0, 30000, NULL, &jobs, &n), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_claim(c, "default", PGJOBQ_BATCH_MAX + 1, 30000, NULL, &jobs, &n), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_claim(c, "default", 1, 0, NULL, &jobs, &n), PGJOBQ_EINVAL);
    CHECK_RC(c, pgjobq_claim(c, "bad queue", 1, 1000, NULL, &jobs, &n), PGJOBQ_EINVAL);
    pgjobq_client_close(c);
}

/* A claim's lease alarm names its jobs in two bigint[]: past about 120 jobs the row is longer than
 * the 2 kB at which PostgreSQL compresses a row's values, and pglz took about 1.3 ms for a claim of
 * 850 (schema 34 stores them out of line, uncompressed).  The alarm must still name every job. */
TEST(claim_stores_its_lease_alarm_uncompressed)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_job *jobs = NULL;
    size_t n = 0;

    PQclear(t_exec(pg, "INSERT INTO pgjobq.jobs (queue, payload) SELECT 'big', '{}' FROM generate_series(1, 900)"));
    CHECK_OK(c, pgjobq_claim(c, "big", 850, 30000, "w1", &jobs, &n));
    CHECK_INT(n, 850);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.lease_alarms WHERE queue = 'big'"), 1);
    CHECK_INT(t_int(pg, "SELECT cardinality(ids) + cardinality(tokens) FROM pgjobq.lease_alarms WHERE queue = 'big'"),
              1700);
    /* Stored out of line (the row is far past a page's 2 kB threshold) and not compressed. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.lease_alarms WHERE queue = 'big'"
                        " AND pg_column_compression(ids) IS NULL AND pg_column_compression(tokens) IS NULL"
                        " AND pg_column_size(ids) >= 850 * 8"),
              1);
    /* Every job of the claim is named with its token. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.lease_alarms a, unnest(a.ids, a.tokens) AS u(id, token)"
                        " JOIN pgjobq.jobs j ON j.id = u.id AND j.lease_token = u.token AND j.state = 'running'"
                        " WHERE a.queue = 'big'"),
              850);
    pgjobq_jobs_free(jobs);
    PQfinish(pg);
    pgjobq_client_close(c);
}

TEST(claim_skips_a_locked_head_job_without_waiting)
{
    pgjobq_client *c = t_client();
    PGconn *holder = t_pg();
    pgjobq_job_spec specs[3];
    int64_t ids[3];
    pgjobq_job *jobs;
    size_t n;

    memset(specs, 0, sizeof specs);
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, 3, ids, NULL));
    /* Another transaction holds the head job's row lock and keeps it. */
    PQclear(t_exec(holder, "BEGIN"));
    PQclear(t_exec(holder, "SELECT id FROM pgjobq.jobs WHERE id = %lld FOR UPDATE", (long long)ids[0]));
    /* Were the claim to wait for that lock, this timeout would turn the wait into an error. */
    PQclear(t_exec(pgjobq_client_conn(c), "SET lock_timeout = '200ms'"));
    CHECK_OK(c, pgjobq_claim(c, "default", 1, 30000, NULL, &jobs, &n));
    CHECK_INT(n, 1);
    CHECK_INT(jobs[0].id, ids[1]);
    pgjobq_jobs_free(jobs);
    PQclear(t_exec(holder, "ROLLBACK"));
    /* Once released, the head job is claimable again. */
    CHECK_OK(c, pgjobq_claim(c, "default", 5, 30000, NULL, &jobs, &n));
    CHECK_INT(n, 2);
    CHECK_INT(jobs[0].id, ids[0]);
    pgjobq_jobs_free(jobs);
    PQfinish(holder);
    pgjobq_client_close(c);
}

/* The worker's claims take one of two lanes of their queue (advisory locks held to the claim's end);
 * the SQL API's take none; a claim that finds both lanes held waits about a second, then claims
 * without one. */
TEST(claim_lanes_are_the_workers_and_a_held_lane_delays_a_claim_by_a_second_at_most)
{
    PGconn *a = t_pg(), *b = t_pg(), *claimer = t_pg();
    const char *lane_locks = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1885825651"
                             " AND pid = pg_backend_pid()";

    PQclear(t_exec(claimer, "SELECT pgjobq.enqueue('lanes', 'k', '{}') FROM generate_series(1, 4)"));
    /* The SQL API's claim, inside a transaction: no lane, so it keeps nobody waiting. */
    PQclear(t_exec(claimer, "BEGIN"));
    CHECK_INT(t_int(claimer, "SELECT count(*) FROM pgjobq.claim('lanes', 1, '1 min', 'sql')"), 1);
    CHECK_INT(t_int(claimer, "%s", lane_locks), 0);
    PQclear(t_exec(claimer, "COMMIT"));
    /* The worker's: a lane, held to the end of the claim's transaction. */
    PQclear(t_exec(claimer, "BEGIN"));
    CHECK_INT(t_int(claimer, "SELECT count(*) FROM pgjobq.claim_next('lanes', 1, '1 min', 'w', lanes => true)"
                             " WHERE id IS NOT NULL"),
              1);
    CHECK_INT(t_int(claimer, "%s", lane_locks), 1);
    PQclear(t_exec(claimer, "COMMIT"));
    /* Both lanes held elsewhere (a claim stuck mid-way): the claim waits for one, then goes ahead. */
    PQclear(t_exec(a, "BEGIN"));
    PQclear(t_exec(a, "SELECT pg_advisory_xact_lock(1885825651, hashtext('lanes:0'))"));
    PQclear(t_exec(b, "BEGIN"));
    PQclear(t_exec(b, "SELECT pg_advisory_xact_lock(1885825651, hashtext('lanes:1'))"));
    PQclear(t_exec(claimer, "SET lock_timeout = '30s'")); /* the claim's own bound must win */
    int64_t t0 = t_now_ms();
    CHECK_INT(t_int(claimer, "SELECT count(*) FROM pgjobq.claim_next('lanes', 5, '1 min', 'w', lanes => true)"
                             " WHERE id IS NOT NULL"),
              2);
    int64_t waited = t_now_ms() - t0;
    CHECK_MSG(waited >= 900 && waited < 20000, "the claim waited %lld ms for a lane", (long long)waited);
    /* ... and left the session's lock_timeout as it was. */
    char *lt = t_str(claimer, "SHOW lock_timeout");
    CHECK_STR(lt, "30s");
    free(lt);
    PQclear(t_exec(a, "ROLLBACK"));
    PQclear(t_exec(b, "ROLLBACK"));
    PQfinish(a);
    PQfinish(b);
    PQfinish(claimer);
}

/* 10,000 jobs, 40 claimers: 2 processes of 20 threads, each thread with its own client. */
enum { EXACT_JOBS = 10000, EXACT_PROCS = 2, EXACT_THREADS = 20 };

typedef struct shared_counts {
    _Atomic int claims[EXACT_JOBS + 1]; /* indexed by payload number */
    _Atomic int errors;
} shared_counts;

static shared_counts *shared;

static void *claimer(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    pgjobq_client *c = NULL;

    if (pgjobq_client_open(&c, t_conninfo()) != PGJOBQ_OK) {
        fprintf(stderr, "claimer: %s\n", pgjobq_errmsg(c));
        atomic_fetch_add(&shared->errors, 1);
        pgjobq_client_close(c);
        return NULL;
    }
    for (;;) {
        pgjobq_job *jobs;
        size_t n;
        seed = seed * 1103515245u + 12345u;
        int rc = pgjobq_claim(c, "default", 1 + (int)((seed >> 16) % 16), 60000, "claimer", &jobs, &n);
        if (rc != PGJOBQ_OK) {
            fprintf(stderr, "claim: %s\n", pgjobq_errmsg(c));
            atomic_fetch_add(&shared->errors, 1);
            break;
        }
        if (n == 0)
            break;
        for (size_t i = 0; i < n; i++) {
            int k = atoi(jobs[i].payload + 1); /* payload is [k] */
            if (k < 1 || k > EXACT_JOBS || jobs[i].attempt != 1)
                atomic_fetch_add(&shared->errors, 1);
            else
                atomic_fetch_add(&shared->claims[k], 1);
        }
        pgjobq_jobs_free(jobs);
    }
    pgjobq_client_close(c);
    return NULL;
}

static void claim_process(void)
{
    pthread_t th[EXACT_THREADS];
    for (int i = 0; i < EXACT_THREADS; i++)
        if (pthread_create(&th[i], NULL, claimer, (void *)(uintptr_t)(i * 7919 + getpid())) != 0)
            _exit(2);
    for (int i = 0; i < EXACT_THREADS; i++)
        pthread_join(th[i], NULL);
}

TEST_FULL(claim_is_exactly_once_under_40_concurrent_claimers, 180, 0)
{
    pgjobq_client *c = t_client();
    pgjobq_job_spec *specs = calloc(EXACT_JOBS, sizeof *specs);
    char(*payloads)[16] = calloc(EXACT_JOBS, sizeof *payloads);
    pid_t pids[EXACT_PROCS];

    shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(shared != MAP_FAILED && specs && payloads);
    for (int i = 0; i < EXACT_JOBS; i++) {
        snprintf(payloads[i], sizeof payloads[i], "[%d]", i + 1);
        specs[i].payload = payloads[i];
    }
    CHECK_OK(c, pgjobq_enqueue_many(c, specs, EXACT_JOBS, NULL, NULL));
    pgjobq_client_close(c);

    for (int p = 0; p < EXACT_PROCS; p++) {
        pids[p] = fork();
        CHECK(pids[p] >= 0);
        if (pids[p] == 0) {
            claim_process();
            _exit(0);
        }
    }
    for (int p = 0; p < EXACT_PROCS; p++) {
        int status;
        CHECK(waitpid(pids[p], &status, 0) == pids[p]);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "claiming process %d failed", p);
    }
    CHECK_INT(atomic_load(&shared->errors), 0);
    int missing = 0, twice = 0;
    for (int k = 1; k <= EXACT_JOBS; k++) {
        int n = atomic_load(&shared->claims[k]);
        missing += n == 0;
        twice += n > 1;
    }
    CHECK_INT(missing, 0);
    CHECK_INT(twice, 0);
    PGconn *pg = t_pg();
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE state = 'running' AND attempt = 1 "
                        "AND lease_token > 0"),
              EXACT_JOBS);
    PQfinish(pg);
    free(specs);
    free(payloads);
}

/* Collects auto_explain's plans, which it sends as notices. */
static char plans[65536];

static void collect_notice(void *arg, const char *msg)
{
    (void)arg;
    strncat(plans, msg, sizeof plans - strlen(plans) - 1);
}

TEST_FULL(claim_uses_the_partial_index_under_a_million_finished_jobs, 240, 0)
{
    PGconn *pg = t_pg();
    pgjobq_client *c = NULL;
    pgjobq_job *jobs;
    size_t n;

    /* 1,000,000 completed jobs of history, 200,000 queued jobs of another queue, 10,000 queued ones. */
    PQclear(t_exec(pg, "INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts,"
                       " run_at, created_at, started_at, finished_at, lease_token)"
                       " SELECT nextval(pg_get_serial_sequence('pgjobq.jobs', 'id')), 'default', 'default', '{}', 0,"
                       " 'completed', 1, 25, now(), now(), now(), now(), 1 FROM generate_series(1, 1000000)"));
    PQclear(t_exec(pg, "INSERT INTO pgjobq.jobs (queue) SELECT 'other' FROM generate_series(1, 200000)"));
    PQclear(t_exec(pg, "INSERT INTO pgjobq.jobs (payload) SELECT jsonb_build_object('i', g)"
                       " FROM generate_series(1, 10000) g"));
    PQclear(t_exec(pg, "ANALYZE pgjobq.jobs"));
    CHECK_OK(c, pgjobq_client_wrap(&c, pg));
    /* auto_explain reports the plan of the statement inside pgjobq.claim() itself. */
    t_auto_explain(pg, collect_notice, 0);
    CHECK_OK(c, pgjobq_claim(c, "default", 10, 30000, NULL, &jobs, &n));
    CHECK_INT(n, 10);
    pgjobq_jobs_free(jobs);
    PQclear(t_exec(pg, "SET auto_explain.log_min_duration = -1"));
    printf("%s\n", plans);
    CHECK_MSG(strstr(plans, "Index Scan using jobs_ready_idx") != NULL, "the claim did not use jobs_ready_idx");
    CHECK_MSG(strstr(plans, "Seq Scan on jobs") == NULL, "the claim scanned the table");
    pgjobq_client_close(c);
    PQfinish(pg);
}

TEST(claim_batch_starts_after_the_key_it_is_given)
{
    PGconn *pg = t_pg();

    /* Inserted by hand: no enqueue recorded their priorities, which a claim without a key finds. */
    PQclear(t_exec(pg, "INSERT INTO pgjobq.jobs (queue, priority, run_at, payload)"
                       " SELECT 'q', 0, now() - interval '1 minute', jsonb_build_object('n', g)"
                       " FROM generate_series(1, 10) g"));
    PQclear(t_exec(pg, "INSERT INTO pgjobq.jobs (queue, priority, run_at) VALUES ('q', 5, now() - interval '1 s')"));
    /* Without a key: the first three in (priority, key, id) order; the key of a job due before it was
     * enqueued is when it was enqueued. */
    CHECK_INT(t_int(pg, "SELECT max((payload->>'n')::int) FROM pgjobq.claim_batch('q', 3, '30 s', 'w')"), 3);
    /* After the key of job 3: jobs 4 and 5. */
    CHECK_INT(t_int(pg, "SELECT (string_agg(payload->>'n', ',' ORDER BY id) = '4,5')::int FROM pgjobq.claim_batch("
                        "'q', 2, '30 s', 'w', 0::smallint,"
                        " (SELECT greatest(run_at, ready_at) FROM pgjobq.jobs WHERE payload->>'n' = '3'),"
                        " (SELECT id FROM pgjobq.jobs WHERE payload->>'n' = '3'))"),
              1);
    /* A job put back to queued, even by hand, is claimable from that moment on: its key is then, after
     * any key a claimer has passed (jobs_ready_stamp), so a claim after the key of job 9 sees it, with
     * job 10 and the priority-5 job (another level: from its low-water mark). */
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET state = 'queued', lease_until = NULL WHERE payload->>'n' = '1'"));
    CHECK_INT(t_int(pg, "SELECT (string_agg(coalesce(payload->>'n', 'p5'), ',' ORDER BY priority, id) = '1,10,p5')::int"
                        " FROM pgjobq.claim_batch('q', 100, '30 s', 'w', 0::smallint,"
                        " (SELECT greatest(run_at, ready_at) FROM pgjobq.jobs WHERE payload->>'n' = '9'),"
                        " (SELECT id FROM pgjobq.jobs WHERE payload->>'n' = '9'))"),
              1);
    /* What the key skipped, a claim without one takes. */
    CHECK_INT(t_int(pg, "SELECT (string_agg(payload->>'n', ',' ORDER BY id) = '6,7,8,9')::int"
                        " FROM pgjobq.claim_batch('q', 100, '30 s', 'w')"),
              1);
    /* The key is all three columns or none. */
    PGresult *r = PQexec(pg, "SELECT * FROM pgjobq.claim_batch('q', 1, '30 s', 'w', 0::smallint, now(), NULL)");
    CHECK(PQresultStatus(r) == PGRES_FATAL_ERROR);
    CHECK(strstr(PQresultErrorMessage(r), "after_priority, after_run_at and after_id") != NULL);
    PQclear(r);
    PQfinish(pg);
}

TEST_FULL(fenced_writes_look_jobs_up_by_id_when_statistics_say_none_run, 120, 0)
{
    PGconn *pg = t_pg();

    /* The statistics are taken while all 3,000 jobs are queued: to the planner, "running with this
     * token and a live lease" matches nothing, which once made completing 2,000 jobs a sequential
     * scan or a join filtering every row (seconds per batch). */
    PQclear(t_exec(pg, "INSERT INTO pgjobq.jobs (payload) SELECT jsonb_build_object('i', g)"
                       " FROM generate_series(1, 3000) g"));
    PQclear(t_exec(pg, "ANALYZE pgjobq.jobs"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('default', 2000, '5 min', 'w')"), 2000);
    /* The input, read before the plans are collected (no index holds the running jobs by state: this
     * read is a scan of the table, the completion's must not be). */
    PQclear(t_exec(pg, "CREATE TEMP TABLE held AS SELECT id, lease_token FROM pgjobq.jobs WHERE state = 'running'"));
    plans[0] = '\0';
    t_auto_explain(pg, collect_notice, 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.complete_many("
                        " (SELECT array_agg(id ORDER BY id) FROM held),"
                        " (SELECT array_agg(lease_token ORDER BY id) FROM held))"
                        " WHERE outcome = 'completed'"),
              2000);
    PQclear(t_exec(pg, "SET auto_explain.log_min_duration = -1"));
    /* The plan of the DELETE inside complete_many: the table's rows are read through the primary key,
     * only those of the input's ids (not the whole key, as a hash join of the input did). */
    const char *del = strstr(plans, "Delete on jobs");
    CHECK_MSG(del != NULL, "no plan for the DELETE in:\n%s", plans);
    printf("%.900s\n", del);
    CHECK_MSG(strstr(del, "jobs_pkey") != NULL, "the completion did not use jobs_pkey");
    CHECK_MSG(strstr(del, "Index Cond: (id = ANY") != NULL || strstr(del, "Index Cond: (id = input") != NULL,
              "the completion read rows of jobs that are not in its input");
    CHECK_MSG(strstr(plans, "Seq Scan on jobs") == NULL, "the completion scanned the table");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE state = 'completed'"), 2000);
    PQfinish(pg);
}

/* pgjobq_claim is claim_next's, as the worker's claim is, not the compatibility claim_batch's (the
 * claim of version 9, kept for SQL callers): it claims with claim_batch gone. */
TEST(claim_of_the_library_is_claim_next)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg();
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    int64_t id;

    CHECK_OK(c, pgjobq_enqueue(c, "{}", NULL, &id));
    PQclear(
        t_exec(pg, "DROP FUNCTION pgjobq.claim_batch(text, integer, interval, text, smallint, timestamptz, bigint)"));
    CHECK_OK(c, pgjobq_claim(c, "default", 10, 30000, NULL, &jobs, &n));
    CHECK_INT(n, 1);
    CHECK_INT(jobs[0].id, id);
    pgjobq_jobs_free(jobs);
    pgjobq_client_close(c);
    PQfinish(pg);
}
