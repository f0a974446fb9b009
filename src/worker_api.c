/*
 * worker_api.c - the worker's public functions: creating it and checking its options, adding
 * handlers, stopping it, its statistics and its message.  pgjobq_worker_run, the engine, is worker.c's.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

int pgjobq__worker_err(pgjobq_worker *w, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->errmsg, sizeof w->errmsg, fmt, ap);
    va_end(ap);
    return code;
}

void pgjobq__worker_wake(pgjobq_worker *w)
{
    char c = 1;
    /* A full pipe already holds a wakeup; nothing else can go wrong here that we could act on. */
    ssize_t n = write(w->wake_pipe[1], &c, 1);
    (void)n;
}

/* ------------------------------------------------------------------------------------------------ */
/* Creating and configuring                                                                          */

void pgjobq_worker_opts_defaults(pgjobq_worker_opts *o)
{
    if (o->lease_ms == 0)
        o->lease_ms = 60000;
    if (o->heartbeat_ms == 0)
        o->heartbeat_ms = o->lease_ms / 3;
    if (o->timeout_ms == 0)
        o->timeout_ms = o->lease_ms * 4 / 5;
    if (o->poll_ms == 0)
        o->poll_ms = 1000;
    if (o->shutdown_timeout_ms == 0)
        o->shutdown_timeout_ms = 30000;
    if (o->batch_max == 0)
        o->batch_max = 1000;
}

int pgjobq_worker_new(pgjobq_worker **out, const char *conninfo, const pgjobq_worker_opts *opts)
{
    pgjobq_worker *w;
    char host[128] = "localhost";

    *out = NULL;
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    w = calloc(1, sizeof *w);
    if (w == NULL)
        return PGJOBQ_ENOMEM;
    w->wake_pipe[0] = w->wake_pipe[1] = -1;
    *out = w;
    if (opts)
        w->o = *opts;
    w->conninfo = strdup(conninfo ? conninfo : "");
    if (w->conninfo == NULL)
        return pgjobq__worker_err(w, PGJOBQ_ENOMEM, "out of memory");
    /* A connection string libpq cannot parse would be retried forever by pgjobq_worker_run. */
    char why[400];
    if (pgjobq_conninfo_check(w->conninfo, why, sizeof why) == PGJOBQ_EINVAL)
        return pgjobq__worker_err(w, PGJOBQ_EINVAL, "the connection string is not valid: %s", why);
    pgjobq_worker_opts_defaults(&w->o);

    if (w->o.lease_ms < 100 || w->o.lease_ms > INT64_C(31536000000))
        return pgjobq__worker_err(w, PGJOBQ_EINVAL, "the lease must be between 100 ms and one year");
    if (w->o.heartbeat_ms <= 0 || w->o.heartbeat_ms >= w->o.lease_ms)
        return pgjobq__worker_err(w, PGJOBQ_EINVAL,
                    "the heartbeat interval (%lld ms) must be positive and shorter than the lease (%lld ms): "
                    "a lease that is renewed less often than it lasts expires under a healthy worker",
                    (long long)w->o.heartbeat_ms, (long long)w->o.lease_ms);
    if (w->o.timeout_ms <= 0 || w->o.timeout_ms >= w->o.lease_ms)
        return pgjobq__worker_err(w, PGJOBQ_EINVAL,
                    "the job timeout (%lld ms) must be shorter than the lease (%lld ms): a job that can outlive "
                    "its lease may be claimed and run by another worker while it still runs; raise the lease "
                    "or lower the timeout",
                    (long long)w->o.timeout_ms, (long long)w->o.lease_ms);
    if (w->o.poll_ms < 10)
        return pgjobq__worker_err(w, PGJOBQ_EINVAL, "the poll interval must be at least 10 ms");
    if (w->o.log_level < PGJOBQ_LOG_DEBUG || w->o.log_level > PGJOBQ_LOG_ERROR)
        return pgjobq__worker_err(w, PGJOBQ_EINVAL, "the log level (%d) must be a pgjobq_log_level, %d to %d",
                                  (int)w->o.log_level, PGJOBQ_LOG_DEBUG, PGJOBQ_LOG_ERROR);
    if (w->o.batch_max < 1 || w->o.batch_max > PGJOBQ_BATCH_MAX)
        return pgjobq__worker_err(w, PGJOBQ_EINVAL, "the claim batch size must be between 1 and %d", PGJOBQ_BATCH_MAX);
    if (w->o.worker_id) {
        size_t len = strlen(w->o.worker_id);
        if (len == 0 || len >= sizeof w->worker_id || !pgjobq__utf8_valid(w->o.worker_id, len))
            return pgjobq__worker_err(w, PGJOBQ_EINVAL, "the worker id must be 1 to 255 bytes of UTF-8");
        memcpy(w->worker_id, w->o.worker_id, len + 1);
    } else {
        /* Two live workers cannot share an id: the second and later workers of a process get a
         * number. */
        static _Atomic int made;
        int k = atomic_fetch_add(&made, 1) + 1;
        if (k == 1)
            snprintf(w->worker_id, sizeof w->worker_id, "%s:%d", host, (int)getpid());
        else
            snprintf(w->worker_id, sizeof w->worker_id, "%s:%d.%d", host, (int)getpid(), k);
    }
    snprintf(w->host, sizeof w->host, "%s", host);
    snprintf(w->pid_s, sizeof w->pid_s, "%d", (int)getpid());
    w->o.worker_id = w->worker_id;
    return PGJOBQ_OK;
}

int pgjobq_worker_handle(pgjobq_worker *w, const char *queue, const char *kind, int concurrency,
                         pgjobq_handler_fn fn, void *arg)
{
    pgjobq__queue *q = NULL;

    if (w == NULL)
        return PGJOBQ_EINVAL;
    if (w->ran)
        return pgjobq__worker_err(w, PGJOBQ_EINVAL, "handlers must be added before the worker runs");
    if (pgjobq_name_check(queue) != PGJOBQ_OK)
        return pgjobq__worker_err(w, PGJOBQ_EINVAL, "invalid queue name \"%.80s\"", queue ? queue : "");
    if (kind && pgjobq_name_check(kind) != PGJOBQ_OK)
        return pgjobq__worker_err(w, PGJOBQ_EINVAL, "invalid kind name \"%.80s\"", kind);
    if (concurrency < 1 || concurrency > 1024)
        return pgjobq__worker_err(w, PGJOBQ_EINVAL, "concurrency must be between 1 and 1024, not %d", concurrency);
    if (fn == NULL)
        return pgjobq__worker_err(w, PGJOBQ_EINVAL, "no handler function given");
    for (int i = 0; i < w->nqueues; i++)
        if (strcmp(w->queues[i].name, queue) == 0)
            q = &w->queues[i];
    if (q == NULL) {
        if (w->nqueues == PGJOBQ__MAX_QUEUES)
            return pgjobq__worker_err(w, PGJOBQ_EINVAL, "at most %d queues per worker", PGJOBQ__MAX_QUEUES);
        q = &w->queues[w->nqueues++];
        memset(q, 0, sizeof *q);
        snprintf(q->name, sizeof q->name, "%s", queue);
        q->concurrency = concurrency;
    } else if (q->concurrency != concurrency) {
        return pgjobq__worker_err(w, PGJOBQ_EINVAL, "queue %s was given concurrency %d and %d", queue, q->concurrency,
                    concurrency);
    }
    for (int i = 0; i < q->nhandlers; i++)
        if (strcmp(q->handlers[i].kind, kind ? kind : "") == 0)
            return pgjobq__worker_err(w, PGJOBQ_EINVAL, "queue %s already has a handler for %s%s", queue, kind ? "kind " : "",
                        kind ? kind : "every kind");
    if (q->nhandlers == PGJOBQ__MAX_HANDLERS)
        return pgjobq__worker_err(w, PGJOBQ_EINVAL, "at most %d handlers per queue", PGJOBQ__MAX_HANDLERS);
    pgjobq__handler *h = &q->handlers[q->nhandlers++];
    snprintf(h->kind, sizeof h->kind, "%s", kind ? kind : "");
    h->fn = fn;
    h->arg = arg;
    return PGJOBQ_OK;
}

void pgjobq_worker_stop(pgjobq_worker *w)
{
    if (w == NULL)
        return;
    atomic_fetch_add(&w->stop_requests, 1);
    if (w->wake_pipe[1] >= 0)
        pgjobq__worker_wake(w);
}

static void problem_lock(pgjobq_worker *w)
{
    int free_ = 0;
    while (!atomic_compare_exchange_weak(&w->problem_lock, &free_, 1))
        free_ = 0;
}

static void problem_unlock(pgjobq_worker *w)
{
    atomic_store(&w->problem_lock, 0);
}

int pgjobq_worker_set_unhealthy(pgjobq_worker *w, const char *reason)
{
    char *copy = NULL;

    if (w == NULL)
        return PGJOBQ_EINVAL;
    if (reason && (copy = pgjobq__sanitize_text(reason, strlen(reason), PROBLEM_MAX, 0)) == NULL)
        return PGJOBQ_ENOMEM;
    problem_lock(w);
    char *old = w->problem;
    int changed = (old == NULL) != (copy == NULL) || (old && strcmp(old, copy) != 0);
    w->problem = copy;
    problem_unlock(w);
    free(old);
    if (!changed)
        return PGJOBQ_OK;
    atomic_store(&w->unhealthy, copy != NULL);
    atomic_store(&w->problem_changed, 1);
    if (w->wake_pipe[1] >= 0)
        pgjobq__worker_wake(w);
    return PGJOBQ_OK;
}

void pgjobq__worker_problem(pgjobq_worker *w, char *buf, size_t size)
{
    problem_lock(w);
    snprintf(buf, size, "%s", w->problem ? w->problem : "");
    problem_unlock(w);
}

void pgjobq_worker_get_stats(const pgjobq_worker *cw, pgjobq_worker_stats *out)
{
    pgjobq_worker *w = (pgjobq_worker *)cw;
    out->claimed = atomic_load(&w->st_claimed);
    out->completed = atomic_load(&w->st_completed);
    out->retried = atomic_load(&w->st_retried);
    out->failed = atomic_load(&w->st_failed);
    out->cancelled = atomic_load(&w->st_cancelled);
    out->lost = atomic_load(&w->st_lost);
    out->released = atomic_load(&w->st_released);
    out->running = atomic_load(&w->st_running);
    out->claims = atomic_load(&w->st_claims);
    out->rescued = atomic_load(&w->st_rescued);
    out->writes = atomic_load(&w->st_writes);
    out->parked = atomic_load(&w->st_parked);
}

int pgjobq_worker_connections(const pgjobq_worker *cw)
{
    pgjobq_worker *w = (pgjobq_worker *)cw;
    return w ? atomic_load(&w->st_connected) : 0;
}

const char *pgjobq_worker_errmsg(const pgjobq_worker *w)
{
    return w ? w->errmsg : "no worker";
}

void pgjobq_worker_free(pgjobq_worker *w)
{
    if (w == NULL)
        return;
    free(w->conninfo);
    free(w->problem);
    if (w->wake_pipe[0] >= 0)
        close(w->wake_pipe[0]);
    if (w->wake_pipe[1] >= 0)
        close(w->wake_pipe[1]);
    free(w->running);
    free(w);
}
