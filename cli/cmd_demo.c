/*
 * cmd_demo.c - pgjobq demo: enqueue many jobs in bulk, run them with an in-process worker pool whose
 * built-in handler does a small real piece of work (a SHA-256 over the payload), with a few injected
 * transient failures (retried) and a few permanent ones (failed), then summarise.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "cli.h"
#include "sha256.h"

#define OPT_JOBS 'n'
#define OPT_CONCURRENCY 'c'
#define OPT_QUIET 3001
#define OPT_JSON 3002

const cli_opt demo_opts[] = {
    {"jobs", OPT_JOBS, "N", "jobs to enqueue and run, 1..10000000 (default 100000)"},
    {"concurrency", OPT_CONCURRENCY, "N", "worker threads, 1..1024 (default 64)"},
    {"quiet", OPT_QUIET, NULL, "no progress, only the summary"},
    {"json", OPT_JSON, NULL, "print the summary as one JSON object"},
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};

typedef struct demo_args {
    const cli_cmd *cmd;
    long long jobs;
    int concurrency;
    int quiet;
    int json;
} demo_args;

static int demo_opt(int key, const char *arg, void *ctx)
{
    demo_args *a = ctx;
    char why[160];
    long long v;

    switch (key) {
    case OPT_JOBS:
        if (cli_parse_int(arg, 1, 10000000, &v, why, sizeof why) != 0) {
            cli_usage_error(a->cmd, "--jobs: %s", why);
            return -1;
        }
        a->jobs = v;
        return 0;
    case OPT_CONCURRENCY:
        if (cli_parse_int(arg, 1, 1024, &v, why, sizeof why) != 0) {
            cli_usage_error(a->cmd, "--concurrency: %s", why);
            return -1;
        }
        a->concurrency = (int)v;
        return 0;
    case OPT_QUIET: a->quiet = 1; return 0;
    case OPT_JSON: a->json = 1; return 0;
    }
    return -1;
}

/* The built-in handler: hash the payload; fail as the payload asks, to show retries and failures. */
static pgjobq_outcome demo_handler(pgjobq_ctx *ctx, void *arg)
{
    const pgjobq_job *job = pgjobq_ctx_job(ctx);
    char hex[65], result[96];
    size_t n = 0, flaky_len = 0;
    int ok;
    const char *poison = json_member(job->payload, "poison", &n);
    int is_poison = poison && n == 4 && memcmp(poison, "true", 4) == 0;
    const char *flaky_v = json_member(job->payload, "flaky", &flaky_len);
    int64_t flaky = json_integer(flaky_v, flaky_len, &ok);

    (void)arg;
    if (is_poison) {
        pgjobq_ctx_set_error(ctx, "demo: this job always fails (an injected permanent failure)");
        pgjobq_ctx_set_retry_delay(ctx, 100);
        return PGJOBQ_OUTCOME_RETRY;
    }
    if (ok && job->attempt <= flaky) {
        pgjobq_ctx_set_error(ctx, "demo: an injected transient failure; the next attempt may succeed");
        pgjobq_ctx_set_retry_delay(ctx, 100);
        return PGJOBQ_OUTCOME_RETRY;
    }
    sha256_hex(job->payload, strlen(job->payload), hex);
    snprintf(result, sizeof result, "{\"sha256\": \"%s\"}", hex);
    if (pgjobq_ctx_set_result(ctx, result) != PGJOBQ_OK)
        return PGJOBQ_OUTCOME_FAIL;
    return PGJOBQ_OUTCOME_COMPLETE;
}

/* Enqueues the demo's jobs in batches; returns the first and last id through the pointers. */
static int enqueue_jobs(pgjobq_client *c, const demo_args *a, int64_t *first_id, int64_t *last_id)
{
    enum { BATCH = 5000 };
    pgjobq_job_spec *specs = calloc(BATCH, sizeof *specs);
    int64_t *ids = calloc(BATCH, sizeof *ids);
    char(*payloads)[128] = calloc(BATCH, sizeof *payloads);
    unsigned seed = (unsigned)time(NULL);
    progress p;
    int rc = PGJOBQ_OK;

    if (specs == NULL || ids == NULL || payloads == NULL) {
        free(specs);
        free(ids);
        free(payloads);
        return PGJOBQ_ENOMEM;
    }
    progress_init(&p, "enqueue", a->jobs, a->quiet || a->json);
    *first_id = 0;
    for (long long done = 0; done < a->jobs && rc == PGJOBQ_OK;) {
        size_t n = (size_t)(a->jobs - done < BATCH ? a->jobs - done : BATCH);
        for (size_t i = 0; i < n; i++) {
            long long k = done + (long long)i;
            seed = seed * 1103515245u + 12345u;
            unsigned r = (seed >> 8) % 1000;
            /* 3% fail once or twice before succeeding; 0.5% always fail. */
            if (r < 5)
                snprintf(payloads[i], sizeof payloads[i], "{\"n\": %lld, \"poison\": true}", k);
            else if (r < 35)
                snprintf(payloads[i], sizeof payloads[i], "{\"n\": %lld, \"flaky\": %u, \"data\": \"%08x\"}", k,
                         1 + r % 2, seed);
            else
                snprintf(payloads[i], sizeof payloads[i], "{\"n\": %lld, \"data\": \"%08x%08x\"}", k, seed, ~seed);
            specs[i].payload = payloads[i];
            specs[i].opts.queue = "demo";
            specs[i].opts.kind = "sha256";
            specs[i].opts.max_attempts = 3;
        }
        rc = pgjobq_enqueue_many(c, specs, n, ids, NULL);
        if (rc == PGJOBQ_OK) {
            if (*first_id == 0)
                *first_id = ids[0];
            *last_id = ids[n - 1];
            done += (long long)n;
            progress_update(&p, done, NULL);
        }
    }
    if (rc == PGJOBQ_OK)
        progress_done(&p, a->jobs, NULL);
    free(specs);
    free(ids);
    free(payloads);
    return rc;
}

typedef struct watcher {
    pgjobq_worker *w;
    const demo_args *a;
    _Atomic int finished;
} watcher;

/* Draws the live status line and stops the worker once every job has ended. */
static void *watch(void *arg)
{
    watcher *wt = arg;
    progress p;
    pgjobq_worker_stats s;

    progress_init(&p, "run", wt->a->jobs, wt->a->quiet || wt->a->json);
    for (;;) {
        char extra[160];
        pgjobq_worker_get_stats(wt->w, &s);
        int64_t done = s.completed + s.failed + s.cancelled;
        long long queued = wt->a->jobs - done - s.running;
        snprintf(extra, sizeof extra, "queued %lld  running %lld  retried %lld  failed %lld",
                 queued < 0 ? 0 : queued, (long long)s.running, (long long)s.retried, (long long)s.failed);
        if (done >= wt->a->jobs || atomic_load(&wt->finished)) {
            progress_done(&p, done, extra);
            pgjobq_worker_stop(wt->w);
            return NULL;
        }
        progress_update(&p, done, extra);
        struct timespec pause = {0, 50 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

static double seconds_since(double t0)
{
    return cli_mono_s() - t0;
}

/* What the database says of this run's jobs (ids first..last), pgjobq.monitor_run: completed, failed,
 * pickup p50 and p99 (ms), jobs that ended after 1, 2 and 3 attempts; a value it has not (a NULL, an
 * error) is 0. */
static void run_summary(PGconn *c, int64_t first, int64_t last, double out[7])
{
    char a[24], b[24];
    const char *values[2] = {a, b};

    snprintf(a, sizeof a, "%lld", (long long)first);
    snprintf(b, sizeof b, "%lld", (long long)last);
    for (int k = 0; k < 7; k++)
        out[k] = 0;
    PGresult *r = PQexecParams(c,
                               "SELECT completed, failed, pickup_p50_ms, pickup_p99_ms, attempts_1, attempts_2, attempts_3"
                               " FROM pgjobq.monitor_run($1, $2)",
                               2, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
        for (int k = 0; k < 7; k++)
            if (!PQgetisnull(r, 0, k))
                out[k] = atof(PQgetvalue(r, 0, k));
    PQclear(r);
}

int cmd_demo(const cli_cmd *cmd, int argc, char **argv)
{
    demo_args a = {cmd, 100000, 64, 0, 0};
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    pgjobq_client *c = NULL;
    int64_t first = 0, last = 0;
    double t0;
    const char *url;
    int status, rc, first_arg;
    pthread_t th;
    watcher wt;

    first_arg = cli_parse(cmd, argc, argv, demo_opt, &a);
    if (first_arg == -2)
        return EX_OK;
    if (first_arg < 0)
        return EX_USAGE;
    if (first_arg < argc)
        return cli_usage_error(cmd, "unexpected argument '%s'", argv[first_arg]);
    if ((url = cli_resolve_db(&status)) == NULL)
        return status;
    rc = pgjobq_client_open(&c, url);
    if (rc == PGJOBQ_ESCHEMA && c)
        rc = pgjobq_migrate(c, NULL);
    if (rc != PGJOBQ_OK) {
        status = cli_fail(c, rc);
        pgjobq_client_close(c);
        return status;
    }
    /* A paused demo queue would hold every job: say so instead of waiting forever. */
    pgjobq_queue_info *qs = NULL;
    size_t nq = 0;
    if ((rc = pgjobq_queue_list(c, &qs, &nq)) != PGJOBQ_OK) {
        status = cli_fail(c, rc);
        pgjobq_client_close(c);
        return status;
    }
    for (size_t i = 0; i < nq; i++)
        if (strcmp(qs[i].name, "demo") == 0 && qs[i].paused_at != PGJOBQ_TIME_NONE) {
            cli_err("queue demo is paused%s%s%s: no job of the demo would run; resume it with `%s queue resume demo`",
                    qs[i].pause_reason ? " (" : "", qs[i].pause_reason ? qs[i].pause_reason : "",
                    qs[i].pause_reason ? ")" : "", cli_self);
            pgjobq_queue_list_free(qs);
            pgjobq_client_close(c);
            return EX_TEMPFAIL;
        }
    pgjobq_queue_list_free(qs);
    t0 = cli_mono_s();
    if ((rc = enqueue_jobs(c, &a, &first, &last)) != PGJOBQ_OK) {
        status = cli_fail(c, rc);
        pgjobq_client_close(c);
        return status;
    }
    double enqueue_s = seconds_since(t0);

    o.lease_ms = 30000;
    o.poll_ms = 100;
    o.batch_max = 1000;
    o.worker_id = "pgjobq-demo";
    rc = pgjobq_worker_new(&w, url, &o);
    if (rc == PGJOBQ_OK)
        rc = pgjobq_worker_handle(w, "demo", NULL, a.concurrency, demo_handler, NULL);
    if (rc != PGJOBQ_OK) {
        cli_err("%s", pgjobq_worker_errmsg(w));
        pgjobq_worker_free(w);
        pgjobq_client_close(c);
        return EX_SOFTWARE;
    }
    wt.w = w;
    wt.a = &a;
    atomic_store(&wt.finished, 0);
    if (pthread_create(&th, NULL, watch, &wt) != 0) {
        cli_err("cannot start a thread");
        pgjobq_worker_free(w);
        pgjobq_client_close(c);
        return EX_OSERR;
    }
    rc = pgjobq_worker_run(w);
    atomic_store(&wt.finished, 1);
    pthread_join(th, NULL);
    double total_s = seconds_since(t0);
    pgjobq_worker_stats s;
    pgjobq_worker_get_stats(w, &s);
    if (rc != PGJOBQ_OK) {
        cli_err("the worker stopped: %s", pgjobq_worker_errmsg(w));
        pgjobq_worker_free(w);
        pgjobq_client_close(c);
        return EX_SOFTWARE;
    }
    pgjobq_worker_free(w);

    /* The summary comes from the database: this run's jobs are ids first..last. */
    PGconn *pg = pgjobq_client_conn(c);
    double sum[7];
    run_summary(pg, first, last, sum);
    double completed = sum[0], failed = sum[1];
    /* Pickup latency: from when a job became due (created, for first attempts) to when it started,
     * both by the database clock.  With everything enqueued up front, it mostly measures queueing. */
    double p50 = sum[2], p99 = sum[3];
    double attempts[4] = {0, sum[4], sum[5], sum[6]};
    double rate = total_s > 0 ? (double)a.jobs / total_s : 0;
    if (a.json) {
        printf("{\"jobs\":%lld,\"concurrency\":%d,\"wall_s\":%.3f,\"enqueue_s\":%.3f,\"jobs_per_s\":%.1f,"
               "\"completed\":%.0f,\"failed\":%.0f,\"retried\":%lld,\"pickup_p50_ms\":%.1f,\"pickup_p99_ms\":%.1f,"
               "\"attempts\":{\"1\":%.0f,\"2\":%.0f,\"3\":%.0f},\"first_id\":%lld,\"last_id\":%lld}\n",
               a.jobs, a.concurrency, total_s, enqueue_s, rate, completed, failed, (long long)s.retried, p50, p99,
               attempts[1], attempts[2], attempts[3], (long long)first, (long long)last);
    } else {
        printf("\npgjobq demo: %lld jobs, %d worker threads\n", a.jobs, a.concurrency);
        printf("  wall time        %.2f s (enqueue %.2f s)\n", total_s, enqueue_s);
        printf("  throughput       %.0f jobs/s, enqueue to completion\n", rate);
        printf("  completed        %.0f\n", completed);
        printf("  failed           %.0f (injected permanent failures, after 3 attempts)\n", failed);
        printf("  retried          %lld attempts (injected transient failures)\n", (long long)s.retried);
        printf("  pickup latency   p50 %.1f ms, p99 %.1f ms (created to started; all jobs were enqueued first)\n",
               p50, p99);
        printf("  attempts         1: %.0f   2: %.0f   3: %.0f\n", attempts[1], attempts[2], attempts[3]);
        printf("\nLook further:\n"
               "  %s stats\n"
               "  %s list --state failed --queue demo\n"
               "  %s show %lld\n",
               cli_self, cli_self, cli_self, (long long)last);
    }
    pgjobq_client_close(c);
    return EX_OK;
}
