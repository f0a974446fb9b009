/*
 * bench/durable.c - the measurements of bench/durable.sh (issue 40), against the library: built by
 * that script with the build's libpgjobq.a.  Each mode prints one JSON line.
 *
 *   durable CONNINFO jobs N C     N x 10 one-step jobs: enqueued (one statement), claimed and
 *                                 completed by an in-process worker of C threads, no-op: timed from
 *                                 the enqueue to the last completion
 *   durable CONNINFO steps N C    N ten-step workflows the same way, each step a no-op
 *                                 pgjobq_ctx_step (a read and a store)
 *   durable CONNINFO drain J C    J ready no-op jobs of queue "dp" (enqueued here) drained, whatever
 *                                 else the queue holds (the script parks jobs there first)
 *   durable CONNINFO await K      K times: a job claimed, a waiter blocked in pgjobq_job_wait on its own
 *                                 client (registered), the job completed: the waiter's wake after the
 *                                 completion's commit returned, in ms
 */
#define _POSIX_C_SOURCE 200809L
#include <libpq-fe.h>
#include <pgjobq.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *conninfo;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void die(const char *what, const char *why)
{
    fprintf(stderr, "durable bench: %s: %s\n", what, why);
    exit(70);
}

static void sql(PGconn *pg, const char *q)
{
    PGresult *r = PQexec(pg, q);
    if (PQresultStatus(r) != PGRES_TUPLES_OK && PQresultStatus(r) != PGRES_COMMAND_OK)
        die(q, PQerrorMessage(pg));
    PQclear(r);
}

static void enqueue(PGconn *pg, const char *queue, long n)
{
    char q[400];
    snprintf(q, sizeof q,
             "SELECT count(*) FROM pgjobq.enqueue_many(array_fill('%s'::text, ARRAY[%ld]), NULL,"
             " array_fill('{}'::jsonb, ARRAY[%ld]))",
             queue, n, n);
    sql(pg, q);
}

static int noop_step(pgjobq_ctx *ctx, pgjobq_client *tx, void *arg, char **result)
{
    (void)ctx;
    (void)tx;
    (void)arg;
    *result = NULL; /* stored as JSON null */
    return PGJOBQ_OK;
}

static pgjobq_outcome noop(pgjobq_ctx *ctx, void *arg)
{
    (void)ctx;
    (void)arg;
    return PGJOBQ_OUTCOME_COMPLETE;
}

static pgjobq_outcome ten_steps(pgjobq_ctx *ctx, void *arg)
{
    static const char *const names[10] = {"s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10"};
    (void)arg;
    for (int i = 0; i < 10; i++) {
        char *stored = NULL;
        int rc = pgjobq_ctx_step(ctx, names[i], noop_step, NULL, &stored);
        pgjobq_free(stored);
        if (rc != PGJOBQ_OK) {
            pgjobq_ctx_set_error(ctx, pgjobq_ctx_errmsg(ctx));
            return PGJOBQ_OUTCOME_RETRY;
        }
    }
    return PGJOBQ_OUTCOME_COMPLETE;
}

static void *run(void *w)
{
    return (void *)(intptr_t)pgjobq_worker_run(w);
}

static long left(PGconn *pg, const char *queue)
{
    char q[200];
    snprintf(q, sizeof q, "SELECT count(*) FROM pgjobq.jobs WHERE queue = '%s' AND run_at <= now()", queue);
    PGresult *r = PQexec(pg, q);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        die(q, PQerrorMessage(pg));
    long n = atol(PQgetvalue(r, 0, 0));
    PQclear(r);
    return n;
}

static void drained(PGconn *pg, const char *queue)
{
    double t0 = now_s();
    while (left(pg, queue) > 0) {
        if (now_s() - t0 > 3600)
            die(queue, "not drained within an hour");
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
}

/* Enqueue + claim + complete of n jobs of queue (units of work in all), timed from the enqueue to the
 * last completion, with a worker of c threads already running (its start is not timed: a warm-up job
 * goes through it first). */
static void timed(PGconn *pg, const char *mode, const char *queue, long n, long units, int c, pgjobq_handler_fn fn)
{
    pgjobq_worker *w = NULL;
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pthread_t th;
    o.no_maintenance = 1;
    if (pgjobq_worker_new(&w, conninfo, &o) != PGJOBQ_OK || pgjobq_worker_handle(w, queue, NULL, c, fn, NULL) != PGJOBQ_OK ||
        pthread_create(&th, NULL, run, w) != 0)
        die("worker", w ? pgjobq_worker_errmsg(w) : "out of memory");
    enqueue(pg, queue, 1);
    drained(pg, queue);
    sql(pg, "CHECKPOINT");
    double t0 = now_s();
    enqueue(pg, queue, n);
    drained(pg, queue);
    double t = now_s() - t0;
    void *rc;
    pgjobq_worker_stop(w);
    pthread_join(th, &rc);
    if (rc != (void *)(intptr_t)PGJOBQ_OK)
        die("worker", pgjobq_worker_errmsg(w));
    pgjobq_worker_free(w);
    printf("{\"mode\":\"%s\",\"jobs\":%ld,\"units\":%ld,\"concurrency\":%d,\"seconds\":%.3f,\"units_per_s\":%.1f}\n",
           mode, n, units, c, t, (double)units / t);
}

typedef struct waiter {
    pgjobq_client *c;
    int64_t id;
    double woke;
    int rc;
} waiter;

static void *wait_one(void *arg)
{
    waiter *wt = arg;
    pgjobq_job *job = NULL;
    wt->rc = pgjobq_job_wait(wt->c, wt->id, 10000, &job);
    wt->woke = now_s();
    pgjobq_jobs_free(job);
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void await_latency(PGconn *pg, int k)
{
    pgjobq_client *c = NULL, *wc = NULL;
    double *ms = calloc((size_t)k, sizeof *ms);
    if (ms == NULL || pgjobq_client_open(&c, conninfo) != PGJOBQ_OK || pgjobq_client_open(&wc, conninfo) != PGJOBQ_OK)
        die("await", "cannot connect");
    for (int i = 0; i < k; i++) {
        pgjobq_enqueue_opts o = PGJOBQ_ENQUEUE_OPTS_INIT;
        pgjobq_job *jobs = NULL;
        size_t n = 0;
        o.queue = "aw";
        waiter wt = {wc, 0, 0, -1};
        pthread_t th;
        if (pgjobq_enqueue(c, "{}", &o, &wt.id) != PGJOBQ_OK ||
            pgjobq_claim(c, "aw", 1, 60000, "bench", &jobs, &n) != PGJOBQ_OK || n != 1)
            die("await", pgjobq_errmsg(c));
        if (pthread_create(&th, NULL, wait_one, &wt) != 0)
            die("await", "no thread");
        /* Idle: the waiter is registered (and so listening) before the job completes. */
        char q[160];
        snprintf(q, sizeof q, "SELECT count(*) FROM pgjobq.awaited WHERE job_id = %lld", (long long)wt.id);
        for (;;) {
            PGresult *r = PQexec(pg, q);
            int there = PQresultStatus(r) == PGRES_TUPLES_OK && atoi(PQgetvalue(r, 0, 0)) > 0;
            PQclear(r);
            if (there)
                break;
            nanosleep(&(struct timespec){0, 200000}, NULL);
        }
        nanosleep(&(struct timespec){0, 5000000}, NULL); /* its LISTEN and first read done */
        if (pgjobq_job_complete(c, jobs[0].id, jobs[0].lease_token, NULL) != PGJOBQ_OK)
            die("await", pgjobq_errmsg(c));
        double done = now_s();
        pthread_join(th, NULL);
        if (wt.rc != PGJOBQ_OK)
            die("await", "the wait did not see the job finish");
        ms[i] = (wt.woke - done) * 1000 < 0 ? 0 : (wt.woke - done) * 1000;
        pgjobq_jobs_free(jobs);
    }
    qsort(ms, (size_t)k, sizeof *ms, cmp);
    printf("{\"mode\":\"await\",\"waits\":%d,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f}\n", k, ms[k / 2],
           ms[(k * 99) / 100 < k ? (k * 99) / 100 : k - 1], ms[k - 1]);
    free(ms);
    pgjobq_client_close(wc);
    pgjobq_client_close(c);
}

int main(int argc, char **argv)
{
    if (argc < 4)
        die("usage", "durable CONNINFO jobs|steps|drain N [C] | await K");
    conninfo = argv[1];
    PGconn *pg = PQconnectdb(conninfo);
    if (PQstatus(pg) != CONNECTION_OK)
        die("connect", PQerrorMessage(pg));
    long n = atol(argv[3]);
    int c = argc > 4 ? atoi(argv[4]) : 8;
    if (n <= 0 || c <= 0)
        die("usage", "N and C must be positive");
    if (strcmp(argv[2], "jobs") == 0)
        timed(pg, "jobs", "dj", n * 10, n * 10, c, noop);
    else if (strcmp(argv[2], "steps") == 0)
        timed(pg, "steps", "ds", n, n * 10, c, ten_steps);
    else if (strcmp(argv[2], "drain") == 0)
        timed(pg, "drain", "dp", n, n, c, noop);
    else if (strcmp(argv[2], "await") == 0)
        await_latency(pg, (int)n);
    else
        die("usage", "the mode is jobs, steps, drain or await");
    PQfinish(pg);
    return 0;
}
