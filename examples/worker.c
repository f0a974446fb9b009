/*
 * worker.c - run jobs with a C handler on a pool of threads; stop cleanly on SIGINT or SIGTERM.
 *
 *   worker [CONNINFO]
 *
 * CONNINFO defaults to $PGJOBQ_DATABASE_URL.  Serves the queue "example" (see producer.c).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pgjobq.h>

static pgjobq_worker *worker;

static void on_signal(int sig)
{
    (void)sig;
    pgjobq_worker_stop(worker); /* async-signal-safe */
}

/* Runs on one of the worker's threads, once per job. */
static pgjobq_outcome greet(pgjobq_ctx *ctx, void *arg)
{
    const pgjobq_job *job = pgjobq_ctx_job(ctx);
    char result[256];

    (void)arg;
    if (strstr(job->payload, "\"name\"") == NULL) {
        pgjobq_ctx_set_error(ctx, "no name in the payload");
        return PGJOBQ_OUTCOME_FAIL; /* no point retrying */
    }
    snprintf(result, sizeof result, "{\"greeted\": %s, \"attempt\": %d}", strchr(job->payload, ':') + 1,
             job->attempt);
    result[strcspn(result, "}")] = '\0'; /* the payload's closing brace */
    strncat(result, ", \"ok\": true}", sizeof result - strlen(result) - 1);
    if (pgjobq_ctx_set_result(ctx, result) != PGJOBQ_OK)
        return PGJOBQ_OUTCOME_RETRY;
    return PGJOBQ_OUTCOME_COMPLETE;
}

static void log_line(void *arg, pgjobq_log_level level, const char *msg)
{
    (void)arg;
    if (level >= PGJOBQ_LOG_INFO)
        fprintf(stderr, "worker: %s: %s\n", pgjobq_log_level_name(level), msg);
}

int main(int argc, char **argv)
{
    const char *conninfo = argc > 1 ? argv[1] : getenv("PGJOBQ_DATABASE_URL");
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker_stats s;
    int rc;

    if (conninfo == NULL) {
        fprintf(stderr, "usage: worker CONNINFO\n");
        return 64;
    }
    o.lease_ms = 30000;
    o.log_fn = log_line;
    if (pgjobq_worker_new(&worker, conninfo, &o) != PGJOBQ_OK ||
        pgjobq_worker_handle(worker, "example", "greet", 4, greet, NULL) != PGJOBQ_OK) {
        fprintf(stderr, "worker: %s\n", pgjobq_worker_errmsg(worker));
        pgjobq_worker_free(worker);
        return 64;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    rc = pgjobq_worker_run(worker);
    pgjobq_worker_get_stats(worker, &s);
    printf("worker: %lld completed, %lld failed\n", (long long)s.completed, (long long)s.failed);
    if (rc != PGJOBQ_OK)
        fprintf(stderr, "worker: %s\n", pgjobq_worker_errmsg(worker));
    pgjobq_worker_free(worker);
    return rc == PGJOBQ_OK ? 0 : 75;
}
