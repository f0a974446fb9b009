/*
 * bench_steady.c - `pgjobq bench steady`: a queue in steady state, for minutes, in a database that
 * other work shares.
 *
 * An open-loop producer offers --rate jobs a second (batches of 100, one enqueue_many statement and
 * one transaction each, from --producers connections on an absolute schedule, so that a slow batch
 * does not lower the rate it offers), while --processes worker processes of --concurrency threads run
 * a handler that records when each job started.  Optionally another session holds a snapshot open for
 * the whole run (--pin snapshot: BEGIN ISOLATION LEVEL REPEATABLE READ and a SELECT, as a long report
 * or an idle transaction does) and, with --pin dump, also ACCESS SHARE on every pgjobq table, as
 * pg_dump does: vacuum can then remove nothing that died after the run began.
 *
 * The run is cut into windows (--window, 60 s by default) and each window reports: jobs offered and
 * completed, the pickup latency (created_at, the enqueuing transaction's start on the database clock,
 * to the handler's start on this machine's clock: the two must be the same clock, so run it on the
 * database's host) and where its p99 went (to the claim's start, to the handler's, the producer's
 * enqueue call), the size and dead tuples of the live table, and (with pg_stat_statements) the
 * server time of a claim.  With --floor the same run drives the floor instead of pgjobq: the minimal
 * queue table of bench/ceiling/schema.sql (here in schema bench_floor), producers that insert each
 * batch of 100 in one INSERT and NOTIFY in the same transaction, and --processes minimal workers that
 * LISTEN, claim 100 at a time with the ceiling's statement (FOR UPDATE SKIP LOCKED, UPDATE ...
 * RETURNING), run nothing and mark the batch done on a second connection while the next claim goes
 * out, woken by notifications (a second's poll besides): what pgjobq's pickup is compared with, the
 * lowest a queue in PostgreSQL gets on this machine at this rate (issue 42).  The targets of issue 21
 * are checked at the end:
 *
 *   S1 (no pin)   completed >= 0.98 of offered, last window >= 0.95 of the first, pickup p99 <= 10 ms
 *                 in every window, the live table's largest size in the second half <= 1.25x the first
 *   S2/S3 (pin)   completed >= 0.98 of offered, last window >= 0.9 of the first, pickup p99 <= 50 ms in
 *                 the last window, the claim's server time in the last window <= 1.5x the first's; S3
 *                 also: no statement of a worker or producer seen waiting for a lock longer than 100 ms
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

enum {
    MAX_WINDOWS = 240,
    BUCKETS_PER_OCTAVE = 16,
    NBUCKETS = 36 * BUCKETS_PER_OCTAVE, /* 1 us .. 2^36 us (19 hours) */
    BATCH = 100,
    MAX_PRODUCERS = 16
};

/* Shared with the worker processes (an anonymous shared mapping, inherited by fork). */
typedef struct steady_mem {
    double t0;   /* the run's start, CLOCK_REALTIME seconds */
    int window_s;
    int nwindows;
    _Atomic uint32_t hist[MAX_WINDOWS][NBUCKETS]; /* pickup latency, by the window the handler started in */
    /* Where the pickup went, by the same windows: created_at to the claim's start (started_at, the
     * database clock: the enqueuing commit, the wakeup, a claim already under way), the claim's start
     * to the handler's (the claim, its commit, the delivery to a thread); and each producer batch's
     * enqueue call, by the window it ended in. */
    _Atomic uint32_t to_claim[MAX_WINDOWS][NBUCKETS];
    _Atomic uint32_t to_handler[MAX_WINDOWS][NBUCKETS];
    _Atomic uint32_t enqueue[MAX_WINDOWS][NBUCKETS];
    _Atomic long long offered[MAX_WINDOWS];       /* jobs enqueued (committed), by window */
} steady_mem;

/* What the sampler reads from the database at each window's end. */
typedef struct window_sample {
    long long completed;
    long long bytes, dead, live, vacuums;
    double claim_ms_total, claim_calls; /* pg_stat_statements, cumulative; -1 when unavailable */
    double pin_age_s;                   /* the oldest open transaction holding a snapshot, seconds */
} window_sample;

static double realtime_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int bucket_of(int64_t us)
{
    if (us < 1)
        return 0;
    int b = (int)(log2((double)us) * BUCKETS_PER_OCTAVE);
    return b < NBUCKETS ? b : NBUCKETS - 1;
}

/* The upper edge of a bucket, ms. */
static double bucket_ms(int b)
{
    return pow(2.0, (double)(b + 1) / BUCKETS_PER_OCTAVE) / 1000.0;
}

/* The handler: records the pickup latency in its window and completes. */
static pgjobq_outcome steady_handler(pgjobq_ctx *ctx, void *arg)
{
    steady_mem *m = arg;
    const pgjobq_job *j = pgjobq_ctx_job(ctx);
    double now = realtime_s();
    int w = (int)((now - m->t0) / m->window_s);

    if (w >= 0 && w < m->nwindows && j->created_at != PGJOBQ_TIME_NONE) {
        int64_t now_us = (int64_t)(now * 1e6);
        atomic_fetch_add_explicit(&m->hist[w][bucket_of(now_us - j->created_at)], 1, memory_order_relaxed);
        if (j->started_at != PGJOBQ_TIME_NONE) {
            atomic_fetch_add_explicit(&m->to_claim[w][bucket_of(j->started_at - j->created_at)], 1,
                                      memory_order_relaxed);
            atomic_fetch_add_explicit(&m->to_handler[w][bucket_of(now_us - j->started_at)], 1,
                                      memory_order_relaxed);
        }
    }
    return PGJOBQ_OUTCOME_COMPLETE;
}

/* The latency at quantile q (0..1) of one window's histogram, ms; -1 when it saw nothing. */
static double hist_quantile_ms(_Atomic uint32_t *hist, double q)
{
    long long n = 0, seen = 0;
    for (int b = 0; b < NBUCKETS; b++)
        n += atomic_load(&hist[b]);
    if (n == 0)
        return -1;
    long long want = (long long)ceil(q * (double)n);
    for (int b = 0; b < NBUCKETS; b++) {
        seen += atomic_load(&hist[b]);
        if (seen >= want)
            return bucket_ms(b);
    }
    return bucket_ms(NBUCKETS - 1);
}

/* The pickup latency at quantile q (0..1) of a window, ms; -1 when it saw no job. */
static double quantile_ms(steady_mem *m, int w, double q)
{
    return hist_quantile_ms(m->hist[w], q);
}

/* ------------------------------------------------------------------------------------------------ */
/* The producers                                                                                     */

typedef struct producer {
    pthread_t th;
    const char *url;
    int floor;       /* insert into the floor's table, not through pgjobq */
    steady_mem *m;
    double rate;     /* this producer's share, jobs/s */
    double offset_s; /* its schedule starts this much after the others' */
    double end;      /* bench_now() at which to stop */
    double start;
    _Atomic int stop; /* stop now (the run failed) */
    _Atomic int failed;
    char err[300];
} producer;

/* The floor's batch: 100 rows in one INSERT and a notification, one transaction (a multi-statement
 * query is one). */
#define FLOOR_ENQUEUE_SQL                                                                                      \
    "INSERT INTO bench_floor.jobs (queue, payload) SELECT 'q', '{\"steady\": true}'::jsonb"                   \
    " FROM generate_series(1, 100); NOTIFY bench_floor"

static PGconn *floor_connect(const char *url)
{
    return bench_connect(url, "pgjobq-floor");
}

static void *producer_main(void *arg)
{
    producer *p = arg;
    pgjobq_client *c = NULL;
    PGconn *fc = NULL;
    pgjobq_job_spec specs[BATCH];
    int rc = PGJOBQ_OK;

    if (p->floor) {
        if ((fc = floor_connect(p->url)) == NULL) {
            snprintf(p->err, sizeof p->err, "cannot connect");
            atomic_store(&p->failed, 1);
            return NULL;
        }
    } else if ((rc = pgjobq_client_open(&c, p->url)) != PGJOBQ_OK) {
        snprintf(p->err, sizeof p->err, "%s", c ? pgjobq_errmsg(c) : pgjobq_strerror(rc));
        atomic_store(&p->failed, 1);
        pgjobq_client_close(c);
        return NULL;
    }
    memset(specs, 0, sizeof specs);
    for (int i = 0; i < BATCH; i++) {
        specs[i].payload = "{\"steady\": true}";
        specs[i].opts.queue = "bench";
    }
    double every = BATCH / p->rate;
    for (long long k = 0;; k++) {
        double due = p->start + p->offset_s + (double)k * every, now = bench_now();
        /* Open loop, and it ends on time: batches it fell behind with are not offered late. */
        if (due >= p->end || now >= p->end || atomic_load(&p->stop))
            break;
        if (due > now)
            bench_pause_ms((long)((due - now) * 1000));
        double sent = realtime_s();
        if (fc) {
            PGresult *r = PQexec(fc, FLOOR_ENQUEUE_SQL);
            int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
            PQclear(r);
            if (!ok) {
                snprintf(p->err, sizeof p->err, "%s", PQerrorMessage(fc));
                atomic_store(&p->failed, 1);
                break;
            }
        } else if ((rc = pgjobq_enqueue_many(c, specs, BATCH, NULL, NULL)) != PGJOBQ_OK) {
            snprintf(p->err, sizeof p->err, "%s", pgjobq_errmsg(c));
            atomic_store(&p->failed, 1);
            break;
        }
        double done = realtime_s();
        int w = (int)((done - p->m->t0) / p->m->window_s);
        /* (A batch that commits just after the end counts in the last window.) */
        w = w < 0 ? 0 : w >= p->m->nwindows ? p->m->nwindows - 1 : w;
        atomic_fetch_add(&p->m->offered[w], BATCH);
        atomic_fetch_add_explicit(&p->m->enqueue[w][bucket_of((int64_t)((done - sent) * 1e6))], 1,
                                  memory_order_relaxed);
    }
    pgjobq_client_close(c);
    PQfinish(fc);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* The floor (--floor)                                                                               */

/* The minimal table: bench/ceiling/schema.sql's, in a schema of its own (made again for each run,
 * untimed). */
#define FLOOR_SCHEMA_SQL                                                                                       \
    "DROP SCHEMA IF EXISTS bench_floor CASCADE; CREATE SCHEMA bench_floor;"                                    \
    " CREATE TABLE bench_floor.jobs (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, queue text NOT NULL," \
    " state text NOT NULL DEFAULT 'available', run_at timestamptz NOT NULL DEFAULT now(), payload jsonb NOT NULL," \
    " attempts integer NOT NULL DEFAULT 0, lease_until timestamptz);"                                          \
    " CREATE INDEX jobs_claim_idx ON bench_floor.jobs (queue, run_at, id) WHERE state = 'available'"

/* The ceiling's claim (bench/ceiling/claim_done.sql), returning what the pickup is measured from: the
 * enqueuing transaction's start (run_at defaults to it) and the claim's, microseconds since 1970. */
#define FLOOR_CLAIM_SQL                                                                                        \
    "WITH c AS MATERIALIZED (SELECT id FROM bench_floor.jobs WHERE queue = 'q' AND state = 'available'"       \
    " AND run_at <= now() ORDER BY run_at, id LIMIT 100 FOR UPDATE SKIP LOCKED)"                               \
    " UPDATE bench_floor.jobs j SET state = 'running', attempts = j.attempts + 1,"                             \
    " lease_until = now() + interval '60 s' WHERE j.id = ANY (ARRAY(SELECT c.id FROM c))"                      \
    " RETURNING j.id, (extract(epoch FROM j.run_at) * 1000000)::bigint,"                                       \
    " (extract(epoch FROM now()) * 1000000)::bigint"

#define FLOOR_DONE_SQL "UPDATE bench_floor.jobs SET state = 'done', lease_until = NULL WHERE id = ANY ($1::bigint[])"

/* Collects the result of the completion sent before (if any) and counts its rows; 0 or -1. */
static int floor_collect(PGconn *wc, int *outstanding, bench_shared *sh, int i)
{
    PGresult *r;
    int ok = 1;

    if (!*outstanding)
        return 0;
    while ((r = PQgetResult(wc)) != NULL) {
        if (PQresultStatus(r) == PGRES_COMMAND_OK)
            atomic_fetch_add(&sh->completed[i], atoll(PQcmdTuples(r)));
        else
            ok = 0;
        PQclear(r);
    }
    *outstanding = 0;
    return ok ? 0 : -1;
}

/* A minimal worker, process i: LISTEN on one connection, claim 100 at a time from it while claims come
 * back full, and wait for a notification (at most a second) when one does not; each batch is marked
 * done on a second connection while the next claim runs.  Exits when the benchmark stops it. */
static void floor_worker(const char *url, steady_mem *m, bench_shared *sh, int i)
{
    PGconn *cc, *wc;
    PGresult *r;
    char *ids = NULL;
    size_t cap = 0;
    int outstanding = 0;

    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() == 1)
        _exit(1);
    if ((cc = floor_connect(url)) == NULL || (wc = floor_connect(url)) == NULL)
        _exit(1);
    r = PQexec(cc, "LISTEN bench_floor");
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        _exit(1);
    PQclear(r);
    atomic_fetch_add(&sh->ready, 1);
    for (;;) {
        r = PQexecParams(cc, FLOOR_CLAIM_SQL, 0, NULL, NULL, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
            cli_err("bench: floor: claim: %s", PQerrorMessage(cc));
            _exit(1);
        }
        int n = PQntuples(r);
        double now = realtime_s();
        int64_t now_us = (int64_t)(now * 1e6);
        int w = (int)((now - m->t0) / m->window_s);
        size_t len = 1;
        if (cap < (size_t)n * 24 + 3) {
            cap = (size_t)n * 24 + 3;
            if ((ids = realloc(ids, cap)) == NULL)
                _exit(1);
        }
        ids[0] = '{';
        for (int k = 0; k < n; k++) {
            int64_t created = atoll(PQgetvalue(r, k, 1)), started = atoll(PQgetvalue(r, k, 2));
            if (w >= 0 && w < m->nwindows) {
                atomic_fetch_add_explicit(&m->hist[w][bucket_of(now_us - created)], 1, memory_order_relaxed);
                atomic_fetch_add_explicit(&m->to_claim[w][bucket_of(started - created)], 1, memory_order_relaxed);
                atomic_fetch_add_explicit(&m->to_handler[w][bucket_of(now_us - started)], 1, memory_order_relaxed);
            }
            len += (size_t)snprintf(ids + len, cap - len, "%s%s", k ? "," : "", PQgetvalue(r, k, 0));
        }
        snprintf(ids + len, cap - len, "}");
        PQclear(r);
        if (floor_collect(wc, &outstanding, sh, i) != 0) {
            cli_err("bench: floor: done: %s", PQerrorMessage(wc));
            _exit(1);
        }
        if (n > 0) {
            const char *values[1] = {ids};
            if (!PQsendQueryParams(wc, FLOOR_DONE_SQL, 1, NULL, values, NULL, NULL, 0))
                _exit(1);
            outstanding = 1;
            atomic_fetch_add(&sh->claims[i], 1);
            atomic_fetch_add(&sh->claimed[i], n);
        }
        if (n == 100)
            continue;
        /* Short: wait for a notification (one that came during the claim is queued already). */
        PGnotify *nf;
        int woken = 0;
        while ((nf = PQnotifies(cc)) != NULL) {
            woken = 1;
            PQfreemem(nf);
        }
        if (woken)
            continue;
        if (floor_collect(wc, &outstanding, sh, i) != 0)
            _exit(1);
        struct pollfd pfd = {PQsocket(cc), POLLIN, 0};
        if (poll(&pfd, 1, 1000) < 0 && errno != EINTR)
            _exit(1);
        if (!PQconsumeInput(cc))
            _exit(1);
        while ((nf = PQnotifies(cc)) != NULL)
            PQfreemem(nf);
    }
}

/* Starts the floor's workers and waits (at most 30 s) until each listens; 0 or -1. */
static int floor_start(const char *url, const bench_args *a, steady_mem *m, bench_shared *sh, pid_t *pids)
{
    for (int i = 0; i < a->processes; i++) {
        pids[i] = fork();
        if (pids[i] < 0) {
            cli_err("bench: fork: %s", strerror(errno));
            return -1;
        }
        if (pids[i] == 0)
            floor_worker(url, m, sh, i);
    }
    for (double give_up = bench_now() + 30; atomic_load(&sh->ready) < a->processes;) {
        if (bench_now() > give_up) {
            cli_err("bench: the floor's workers did not connect within 30 s");
            return -1;
        }
        bench_pause_ms(10);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* The pin                                                                                           */

/* Opens a session that holds a snapshot (and, for "dump", ACCESS SHARE on every table of schema
 * pgjobq, as pg_dump does) until it is closed. */
static PGconn *pin_open(const char *url, const char *mode)
{
    PGconn *pin = bench_control(url);
    if (pin == NULL)
        return NULL;
    if (bench_sql(pin, "BEGIN ISOLATION LEVEL REPEATABLE READ") != 0 ||
        bench_sql(pin, "SELECT count(*) FROM pgjobq.monitor_queue_names()") != 0 ||
        (strcmp(mode, "dump") == 0 &&
         bench_sql(pin, "DO $$ DECLARE t regclass; BEGIN"
                        " FOR t IN SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                        " WHERE n.nspname = 'pgjobq' AND c.relkind IN ('r', 'p') ORDER BY c.oid LOOP"
                        " EXECUTE format('LOCK TABLE %s IN ACCESS SHARE MODE', t); END LOOP; END $$") != 0)) {
        PQfinish(pin);
        return NULL;
    }
    return pin;
}

/* ------------------------------------------------------------------------------------------------ */
/* Sampling                                                                                          */

/* The longest that any claim, write (completions, heartbeats) or enqueue has been waiting for a table's
 * lock right now, ms (0 when none waits): sampled every 50 ms, an S3 run shows whether any of them
 * queues behind the pinned session's locks, or behind a maintenance statement (DDL) waiting for them.
 * (The maintenance statement itself may wait, up to its lock_timeout, and then gives up.  Waits for
 * rows and for the notification queue, which commits that NOTIFY take in turn, are not counted.) */
static double lock_wait_ms(PGconn *ctl)
{
    return bench_number(ctl, "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - query_start)) * 1000, 0)"
                             " FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'relation'"
                             " AND datname = current_database()"
                             " AND application_name IN ('pgjobq', 'pgjobq-claim', 'pgjobq-write', 'pgjobq-floor')");
}

static int have_statements(PGconn *ctl)
{
    return bench_number(ctl, "SELECT count(*) FROM pg_catalog.pg_extension WHERE extname = 'pg_stat_statements'") > 0;
}

/* The oldest open transaction holding a snapshot, seconds. */
#define PIN_AGE_SQL                                                                                            \
    "(SELECT coalesce(extract(epoch FROM max(clock_timestamp() - xact_start)), 0)"                             \
    " FROM pg_stat_activity WHERE backend_xmin IS NOT NULL AND datname = current_database()"                    \
    " AND pid <> pg_backend_pid())"

static int sample(PGconn *ctl, int statements, const bench_args *a, bench_shared *sh, window_sample *s)
{
    /* The live table, with its partitions if it has any (pgjobq.monitor_storage); the floor's table. */
    PGresult *r = PQexec(ctl, a->floor ? "SELECT pg_total_relation_size(s.relid), s.n_dead_tup, s.n_live_tup,"
                                         " s.vacuum_count + s.autovacuum_count, " PIN_AGE_SQL
                                         " FROM pg_stat_user_tables s WHERE s.relid = 'bench_floor.jobs'::regclass"
                                       : "SELECT jobs_bytes, jobs_dead, jobs_live, jobs_vacuums, " PIN_AGE_SQL
                                         " FROM pgjobq.monitor_storage()");
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        cli_err("bench: steady statistics: %s", PQerrorMessage(ctl));
        PQclear(r);
        return -1;
    }
    s->completed = bench_total(sh->completed, a->processes);
    s->bytes = atoll(PQgetvalue(r, 0, 0));
    s->dead = atoll(PQgetvalue(r, 0, 1));
    s->live = atoll(PQgetvalue(r, 0, 2));
    s->vacuums = atoll(PQgetvalue(r, 0, 3));
    s->pin_age_s = atof(PQgetvalue(r, 0, 4));
    PQclear(r);
    s->claim_ms_total = s->claim_calls = -1;
    if (statements) {
        /* The workers' claims (top-level statements that call a claim function; the floor's claim). */
        const char *pattern[1] = {a->floor ? "%SKIP LOCKED%bench_floor.jobs j SET state%" : "%pgjobq.claim%"};
        r = PQexecParams(ctl,
                         "SELECT coalesce(sum(total_exec_time), 0), coalesce(sum(calls), 0) FROM pg_stat_statements"
                         " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
                         " AND query LIKE $1 AND query NOT LIKE '%pg_stat_statements%'",
                         1, NULL, pattern, NULL, NULL, 0);
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
            s->claim_ms_total = atof(PQgetvalue(r, 0, 0));
            s->claim_calls = atof(PQgetvalue(r, 0, 1));
        }
        PQclear(r);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* The scenario                                                                                      */

int bench_steady(const char *url, bench_args *a, PGconn *ctl, pgjobq_client *c)
{
    steady_mem *m = mmap(NULL, sizeof *m, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    bench_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t pids[BENCH_MAX_PROCESSES] = {0};
    producer prod[MAX_PRODUCERS];
    window_sample smp[MAX_WINDOWS + 1];
    int nprod = a->producers ? a->producers : 2, started = 0, status = EX_OK, statements;
    double lock_wait_max = 0;
    PGconn *pin = NULL;

    (void)c;
    memset(prod, 0, sizeof prod);
    if (m == MAP_FAILED || sh == MAP_FAILED) {
        status = EX_OSERR;
        goto out;
    }
    memset(m, 0, sizeof *m);
    memset(sh, 0, sizeof *sh);
    m->window_s = a->window ? a->window : a->seconds >= 180 ? 60 : (a->seconds + 2) / 3;
    if (m->window_s < 1)
        m->window_s = 1;
    m->nwindows = a->seconds / m->window_s;
    if (a->processes > BENCH_MAX_PROCESSES || nprod > MAX_PRODUCERS || m->nwindows < 2 ||
        m->nwindows > MAX_WINDOWS) {
        status = cli_usage_error(a->cmd, "steady: --processes at most %d, --producers at most %d, and --seconds "
                                         "from 2 to %d windows of --window seconds",
                                 BENCH_MAX_PROCESSES, MAX_PRODUCERS, MAX_WINDOWS);
        goto out;
    }
    if (bench_sql(ctl, BENCH_RESET_SQL) != 0 || (a->floor && bench_sql(ctl, FLOOR_SCHEMA_SQL) != 0) ||
        bench_sql(ctl, BENCH_VACUUM_SQL) != 0 || bench_sql(ctl, "CHECKPOINT") != 0)
        goto soft_fail;
    statements = have_statements(ctl);
    a->fn = steady_handler;
    a->fn_arg = m;
    if (a->floor ? floor_start(url, a, m, sh, pids) != 0 : bench_start_ready_workers(url, a, sh, pids, ctl) != 0)
        goto soft_fail;
    if (a->pin && (pin = pin_open(url, a->pin)) == NULL)
        goto soft_fail;
    if (statements && bench_sql(ctl, "SELECT pg_stat_statements_reset()") != 0)
        statements = 0;

    /* Go: the producers' schedules start now; windows count from now. */
    double t0 = bench_now();
    m->t0 = realtime_s();
    for (int i = 0; i < nprod; i++) {
        prod[i].url = url;
        prod[i].floor = a->floor;
        prod[i].m = m;
        prod[i].rate = (double)a->rate / nprod;
        prod[i].offset_s = (double)i * BATCH / a->rate;
        prod[i].start = t0;
        prod[i].end = t0 + (double)m->nwindows * m->window_s;
        if (pthread_create(&prod[i].th, NULL, producer_main, &prod[i]) != 0) {
            cli_err("bench: cannot start a producer thread");
            goto soft_fail;
        }
        started++;
    }
    if (sample(ctl, statements, a, sh, &smp[0]) != 0)
        goto soft_fail;
    for (int w = 1; w <= m->nwindows; w++) {
        double due = t0 + (double)w * m->window_s;
        while (bench_now() < due) {
            for (int i = 0; i < started; i++)
                if (atomic_load(&prod[i].failed)) {
                    cli_err("bench: a producer failed: %s", prod[i].err);
                    goto soft_fail;
                }
            double lw = lock_wait_ms(ctl);
            lock_wait_max = lw > lock_wait_max ? lw : lock_wait_max;
            bench_pause_ms(50);
        }
        if (sample(ctl, statements, a, sh, &smp[w]) != 0)
            goto soft_fail;
        const window_sample *s = &smp[w], *p = &smp[w - 1];
        double calls = s->claim_calls - p->claim_calls;
        fprintf(stderr,
                "steady: %4d s  offered %7.0f/s  completed %7.0f/s  pickup p50 %8.2f ms p99 %8.2f ms"
                "  (p99 to claim %.2f, to handler %.2f, enqueue call %.2f ms)"
                "  table %7.1f MiB  dead %9lld  claim %s%.3f ms  pin %.0f s\n",
                w * m->window_s, (double)atomic_load(&m->offered[w - 1]) / m->window_s,
                (double)(s->completed - p->completed) / m->window_s, quantile_ms(m, w - 1, 0.5),
                quantile_ms(m, w - 1, 0.99), hist_quantile_ms(m->to_claim[w - 1], 0.99),
                hist_quantile_ms(m->to_handler[w - 1], 0.99), hist_quantile_ms(m->enqueue[w - 1], 0.99),
                (double)s->bytes / 1048576.0, s->dead,
                statements && calls > 0 ? "" : "n/a ", statements && calls > 0 ? (s->claim_ms_total - p->claim_ms_total) / calls : 0.0,
                s->pin_age_s);
    }
    for (int i = 0; i < started; i++)
        pthread_join(prod[i].th, NULL);
    started = 0;
    /* The jobs enqueued last get the time to start: a second, then they count as not kept up with. */
    bench_pause_ms(1000);
    long long completed_end = bench_total(sh->completed, a->processes);
    bench_stop_workers(a, pids);

    /* The verdict. */
    int n = m->nwindows, half = n / 2;
    long long offered = 0;
    for (int w = 0; w < n; w++)
        offered += atomic_load(&m->offered[w]);
    double first = (double)(smp[1].completed - smp[0].completed) / m->window_s;
    double last = (double)(smp[n].completed - smp[n - 1].completed) / m->window_s;
    double p99_max = 0, p99_last = quantile_ms(m, n - 1, 0.99);
    long long bytes_first = 0, bytes_second = 0;
    for (int w = 0; w < n; w++) {
        double q = quantile_ms(m, w, 0.99);
        p99_max = q > p99_max ? q : p99_max;
        long long b = smp[w + 1].bytes;
        if (w < half)
            bytes_first = b > bytes_first ? b : bytes_first;
        else
            bytes_second = b > bytes_second ? b : bytes_second;
    }
    double claim_first = -1, claim_last = -1;
    if (statements && smp[1].claim_calls > smp[0].claim_calls && smp[n].claim_calls > smp[n - 1].claim_calls) {
        claim_first = (smp[1].claim_ms_total - smp[0].claim_ms_total) / (smp[1].claim_calls - smp[0].claim_calls);
        claim_last = (smp[n].claim_ms_total - smp[n - 1].claim_ms_total) / (smp[n].claim_calls - smp[n - 1].claim_calls);
    }
    double done_ratio = offered > 0 ? (double)completed_end / (double)offered : 0;
    double last_first = first > 0 ? last / first : 0;
    double size_ratio = bytes_first > 0 ? (double)bytes_second / (double)bytes_first : 0;
    double claim_ratio = claim_first > 0 ? claim_last / claim_first : -1;
    int met;
    const char *target;
    if (a->floor) {
        target = "floor"; /* what the targets are compared with, not held to them */
        met = done_ratio >= 0.98;
    } else if (a->pin) {
        target = strcmp(a->pin, "dump") == 0 ? "S3" : "S2";
        met = done_ratio >= 0.98 && last_first >= 0.9 && p99_last >= 0 && p99_last <= 50 &&
              (claim_ratio < 0 || claim_ratio <= 1.5) && (strcmp(target, "S3") != 0 || lock_wait_max <= 100);
    } else {
        target = "S1";
        met = done_ratio >= 0.98 && last_first >= 0.95 && p99_max >= 0 && p99_max <= 10 && size_ratio <= 1.25;
    }
    printf("{\"scenario\":\"steady\",\"target\":\"%s\",\"pin\":%s%s%s,\"seconds\":%d,\"window_s\":%d,\"rate\":%d,"
           "\"processes\":%d,\"concurrency\":%d,\"producers\":%d,\"offered\":%lld,\"offered_avg_per_s\":%.1f,"
           "\"completed\":%lld,\"completed_over_offered\":%.4f,\"first_window_per_s\":%.1f,\"last_window_per_s\":%.1f,"
           "\"last_over_first\":%.3f,\"pickup_p99_ms_max\":%.2f,\"pickup_p99_ms_last\":%.2f,"
           "\"pickup_p50_ms_last\":%.2f,\"to_claim_p99_ms_last\":%.2f,\"to_handler_p99_ms_last\":%.2f,"
           "\"enqueue_p99_ms_last\":%.2f,\"table_bytes_max_first_half\":%lld,\"table_bytes_max_second_half\":%lld,"
           "\"table_second_over_first\":%.3f,\"dead_end\":%lld,\"vacuums\":%lld,\"claim_ms_first\":%.3f,"
           "\"claim_ms_last\":%.3f,\"claim_last_over_first\":%.3f,\"pin_age_s_end\":%.0f,\"lock_wait_ms_max\":%.0f,\"windows\":[",
           target, a->pin ? "\"" : "", a->pin ? a->pin : "null", a->pin ? "\"" : "", n * m->window_s, m->window_s,
           a->rate, a->processes, a->concurrency, nprod, offered, (double)offered / (n * m->window_s), completed_end,
           done_ratio, first, last, last_first, p99_max, p99_last, quantile_ms(m, n - 1, 0.5),
           hist_quantile_ms(m->to_claim[n - 1], 0.99), hist_quantile_ms(m->to_handler[n - 1], 0.99),
           hist_quantile_ms(m->enqueue[n - 1], 0.99), bytes_first,
           bytes_second, size_ratio, smp[n].dead, smp[n].vacuums - smp[0].vacuums, claim_first, claim_last,
           claim_ratio, smp[n].pin_age_s, lock_wait_max);
    for (int w = 0; w < n; w++) {
        double calls = smp[w + 1].claim_calls - smp[w].claim_calls;
        printf("%s{\"offered_per_s\":%.1f,\"completed_per_s\":%.1f,\"p50_ms\":%.2f,\"p99_ms\":%.2f,"
               "\"max_ms\":%.2f,\"to_claim_p99_ms\":%.2f,\"to_handler_p99_ms\":%.2f,\"enqueue_p99_ms\":%.2f,"
               "\"table_bytes\":%lld,\"dead\":%lld,\"claim_ms\":%.3f}",
               w ? "," : "", (double)atomic_load(&m->offered[w]) / m->window_s,
               (double)(smp[w + 1].completed - smp[w].completed) / m->window_s, quantile_ms(m, w, 0.5),
               quantile_ms(m, w, 0.99), quantile_ms(m, w, 1.0), hist_quantile_ms(m->to_claim[w], 0.99),
               hist_quantile_ms(m->to_handler[w], 0.99), hist_quantile_ms(m->enqueue[w], 0.99), smp[w + 1].bytes,
               smp[w + 1].dead,
               statements && calls > 0 ? (smp[w + 1].claim_ms_total - smp[w].claim_ms_total) / calls : -1.0);
    }
    printf("],\"met\":%s}\n", met ? "true" : "false");
    goto out;
soft_fail:
    status = EX_SOFTWARE;
out:
    for (int i = 0; i < started; i++) {
        atomic_store(&prod[i].stop, 1);
        pthread_join(prod[i].th, NULL);
    }
    if (pin) {
        PQclear(PQexec(pin, "ROLLBACK"));
        PQfinish(pin);
    }
    if (sh != MAP_FAILED) {
        bench_stop_workers(a, pids);
        munmap(sh, sizeof *sh);
    }
    if (m != MAP_FAILED)
        munmap(m, sizeof *m);
    return status;
}
