/*
 * worker.c - the worker runtime: threads that run handlers, and one engine thread that owns the
 * claiming connection and the listener, plus a maintenance thread with its own connection.
 *
 * The engine (the thread in pgjobq_worker_run) is the only one that talks to the database about
 * running jobs.  It claims batches sized to free slots, hands jobs to each queue's threads, collects
 * their outcomes from a completion list, writes them in batches (each write fenced by the job's
 * lease token), and renews every running lease of the process in one statement.  Handler threads
 * never touch a connection, so the connection count is fixed at three whatever the concurrency.
 *
 * Time: the engine keeps, per running job, a local monotonic deadline before which its lease is
 * known to be valid: the moment the claim (or the last successful heartbeat) was *sent*, plus the
 * lease.  The database set the lease from a later now(), so the estimate is conservative.  A job
 * whose deadline approaches without a renewal is treated as lost: its handler is told to stop and its
 * outcome is not written.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define MAX_QUEUES 64
#define MAX_HANDLERS 64
#define LISTEN_CHECK_MS 10000
#define RESCUE_EVERY_MS 1000
#define PRUNE_EVERY_MS 60000
#define RECONNECT_MIN_MS 100
#define RECONNECT_MAX_MS 30000
/* Outcomes wait at most this long for more to join their batch (unless every running job is done). */
#define FLUSH_AFTER_MS 2
/* Handlers faster than this on average run a batch on one thread, without waking helpers; slower
 * ones fan out.  Jobs left waiting in a list are handed to another thread within HELP_AFTER_MS. */
#define FAST_HANDLER_NS 50000
#define HELP_AFTER_MS 2

typedef struct handler {
    char kind[PGJOBQ_NAME_MAX + 1]; /* "" for any kind */
    pgjobq_handler_fn fn;
    void *arg;
} handler;

struct pgjobq_ctx {
    pgjobq_job *job;
    struct wqueue *q;
    _Atomic int stop;           /* a pgjobq_stop_reason */
    int64_t started_ms;
    int64_t timeout_at_ms;
    /* Engine only. */
    int64_t lease_valid_until_ms;
    int ended;                  /* the database already ended the job (cancelled) or we lost it */
    /* Set by the handler. */
    pgjobq_outcome outcome;
    char *result;
    char *error;
    int64_t retry_delay_ms;     /* PGJOBQ_BACKOFF unless set */
    struct pgjobq_ctx *next;
};

typedef struct wqueue {
    struct pgjobq_worker *w;
    char name[PGJOBQ_NAME_MAX + 1];
    int concurrency;
    handler handlers[MAX_HANDLERS];
    int nhandlers;
    /* Dispatch list, shared with the queue's threads. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pgjobq_ctx *head, *tail;
    int exit_threads;
    pthread_t *threads;
    int nthreads;
    /* Moving average of handler run time, ns: fast handlers share a batch among few threads. */
    _Atomic int64_t handler_ns;
    /* Engine only. */
    int running;
    int woken;
    int last_full;
    int64_t next_claim_ms;
} wqueue;

struct pgjobq_worker {
    char *conninfo;
    char worker_id[256];
    pgjobq_worker_opts o;
    wqueue queues[MAX_QUEUES];
    int nqueues;
    char errmsg[512];
    int ran;

    /* Stop requests (signal-safe). */
    _Atomic int stop_requests;
    int wake_pipe[2];

    /* Completions from handler threads. */
    pthread_mutex_t done_mu;
    pgjobq_ctx *done_head;

    /* Engine state. */
    pgjobq_client *main;
    int connected;
    int64_t reconnect_at_ms;
    int64_t reconnect_delay_ms;
    PGconn *listener;
    int64_t listener_retry_at_ms;
    int64_t listener_retry_delay_ms;
    int64_t listener_check_ms;
    pgjobq_ctx **running;
    size_t nrunning, caprunning;
    int64_t next_heartbeat_ms;
    int64_t first_pending_ms; /* when the oldest unwritten outcome arrived; 0 when none */

    /* Maintenance thread. */
    pthread_t maint;
    int maint_started;
    pthread_mutex_t maint_mu;
    pthread_cond_t maint_cv;
    int maint_exit;

    /* Statistics. */
    _Atomic int64_t st_claimed, st_completed, st_retried, st_failed, st_cancelled, st_lost, st_released,
        st_running, st_claims, st_rescued, st_writes;
};

/* ------------------------------------------------------------------------------------------------ */
/* Small helpers                                                                                     */

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void wlog(pgjobq_worker *w, pgjobq_log_level level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void wlog(pgjobq_worker *w, pgjobq_log_level level, const char *fmt, ...)
{
    char line[1024];
    va_list ap;

    if (w->o.log_fn == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    w->o.log_fn(w->o.log_arg, level, line);
}

static int werr(pgjobq_worker *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int werr(pgjobq_worker *w, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->errmsg, sizeof w->errmsg, fmt, ap);
    va_end(ap);
    return code;
}

/* A delay with full jitter in [d/2, d], for reconnect backoff. */
static int64_t jittered(int64_t d)
{
    static _Thread_local unsigned seed;
    if (seed == 0)
        seed = (unsigned)mono_ms() ^ (unsigned)getpid();
    seed = seed * 1103515245u + 12345u;
    return d / 2 + (int64_t)((seed >> 8) % (unsigned)(d / 2 + 1));
}

static void wake(pgjobq_worker *w)
{
    char c = 1;
    /* A full pipe already holds a wakeup; nothing else can go wrong here that we could act on. */
    ssize_t n = write(w->wake_pipe[1], &c, 1);
    (void)n;
}

/* ------------------------------------------------------------------------------------------------ */
/* The handler's context                                                                             */

const pgjobq_job *pgjobq_ctx_job(const pgjobq_ctx *ctx)
{
    return ctx->job;
}

int pgjobq_ctx_set_result(pgjobq_ctx *ctx, const char *json)
{
    char *copy;
    if (json == NULL) {
        free(ctx->result);
        ctx->result = NULL;
        return PGJOBQ_OK;
    }
    if (pgjobq__json_check(json, strlen(json), NULL, 0) != 0)
        return PGJOBQ_EINVAL;
    if ((copy = strdup(json)) == NULL)
        return PGJOBQ_ENOMEM;
    free(ctx->result);
    ctx->result = copy;
    return PGJOBQ_OK;
}

void pgjobq_ctx_set_error(pgjobq_ctx *ctx, const char *text)
{
    free(ctx->error);
    ctx->error = pgjobq__sanitize_text(text ? text : "", text ? strlen(text) : 0, PGJOBQ_ERROR_MAX, 0);
}

void pgjobq_ctx_set_retry_delay(pgjobq_ctx *ctx, int64_t delay_ms)
{
    ctx->retry_delay_ms = delay_ms < 0 ? 0 : delay_ms;
}

int pgjobq_ctx_should_stop(const pgjobq_ctx *ctx)
{
    return atomic_load(&((pgjobq_ctx *)ctx)->stop) != PGJOBQ_STOP_NONE ||
           mono_ms() >= ctx->timeout_at_ms;
}

pgjobq_stop_reason pgjobq_ctx_stop_reason(const pgjobq_ctx *ctx)
{
    int s = atomic_load(&((pgjobq_ctx *)ctx)->stop);
    if (s == PGJOBQ_STOP_NONE && mono_ms() >= ctx->timeout_at_ms)
        return PGJOBQ_STOP_TIMEOUT;
    return (pgjobq_stop_reason)s;
}

int64_t pgjobq_ctx_time_left_ms(const pgjobq_ctx *ctx)
{
    int64_t left = ctx->timeout_at_ms - mono_ms();
    return left > 0 ? left : 0;
}

static void ctx_free(pgjobq_ctx *ctx)
{
    if (ctx == NULL)
        return;
    pgjobq_jobs_free(ctx->job);
    free(ctx->result);
    free(ctx->error);
    free(ctx);
}

/* Asks a handler to stop, keeping the first reason given. */
static void ctx_stop(pgjobq_ctx *ctx, pgjobq_stop_reason why)
{
    int none = PGJOBQ_STOP_NONE;
    atomic_compare_exchange_strong(&ctx->stop, &none, (int)why);
}

/* ------------------------------------------------------------------------------------------------ */
/* Creating and configuring                                                                          */

int pgjobq_worker_new(pgjobq_worker **out, const char *conninfo, const pgjobq_worker_opts *opts)
{
    pgjobq_worker *w;
    char host[128] = "localhost";

    *out = NULL;
    w = calloc(1, sizeof *w);
    if (w == NULL)
        return PGJOBQ_ENOMEM;
    w->wake_pipe[0] = w->wake_pipe[1] = -1;
    *out = w;
    if (opts)
        w->o = *opts;
    w->conninfo = strdup(conninfo ? conninfo : "");
    if (w->conninfo == NULL)
        return werr(w, PGJOBQ_ENOMEM, "out of memory");
    if (w->o.lease_ms == 0)
        w->o.lease_ms = 60000;
    if (w->o.heartbeat_ms == 0)
        w->o.heartbeat_ms = w->o.lease_ms / 3;
    if (w->o.timeout_ms == 0)
        w->o.timeout_ms = w->o.lease_ms * 4 / 5;
    if (w->o.poll_ms == 0)
        w->o.poll_ms = 1000;
    if (w->o.shutdown_timeout_ms == 0)
        w->o.shutdown_timeout_ms = 30000;
    if (w->o.batch_max == 0)
        w->o.batch_max = 100;
    if (w->o.retain_completed_ms == 0)
        w->o.retain_completed_ms = INT64_C(24) * 3600 * 1000;
    if (w->o.retain_failed_ms == 0)
        w->o.retain_failed_ms = INT64_C(7) * 24 * 3600 * 1000;

    if (w->o.lease_ms < 100 || w->o.lease_ms > INT64_C(31536000000))
        return werr(w, PGJOBQ_EINVAL, "the lease must be between 100 ms and one year");
    if (w->o.heartbeat_ms <= 0 || w->o.heartbeat_ms >= w->o.lease_ms)
        return werr(w, PGJOBQ_EINVAL,
                    "the heartbeat interval (%lld ms) must be positive and shorter than the lease (%lld ms): "
                    "a lease that is renewed less often than it lasts expires under a healthy worker",
                    (long long)w->o.heartbeat_ms, (long long)w->o.lease_ms);
    if (w->o.timeout_ms <= 0 || w->o.timeout_ms >= w->o.lease_ms)
        return werr(w, PGJOBQ_EINVAL,
                    "the job timeout (%lld ms) must be shorter than the lease (%lld ms): a job that can outlive "
                    "its lease may be claimed and run by another worker while it still runs; raise the lease "
                    "or lower the timeout",
                    (long long)w->o.timeout_ms, (long long)w->o.lease_ms);
    if (w->o.poll_ms < 10)
        return werr(w, PGJOBQ_EINVAL, "the poll interval must be at least 10 ms");
    if (w->o.batch_max < 1 || w->o.batch_max > PGJOBQ_BATCH_MAX)
        return werr(w, PGJOBQ_EINVAL, "the claim batch size must be between 1 and %d", PGJOBQ_BATCH_MAX);
    if (w->o.worker_id) {
        size_t len = strlen(w->o.worker_id);
        if (len == 0 || len >= sizeof w->worker_id || !pgjobq__utf8_valid(w->o.worker_id, len))
            return werr(w, PGJOBQ_EINVAL, "the worker id must be 1 to 255 bytes of UTF-8");
        memcpy(w->worker_id, w->o.worker_id, len + 1);
    } else {
        if (gethostname(host, sizeof host) != 0)
            snprintf(host, sizeof host, "localhost");
        host[sizeof host - 1] = '\0';
        snprintf(w->worker_id, sizeof w->worker_id, "%s:%d", host, (int)getpid());
    }
    w->o.worker_id = w->worker_id;
    return PGJOBQ_OK;
}

int pgjobq_worker_handle(pgjobq_worker *w, const char *queue, const char *kind, int concurrency,
                         pgjobq_handler_fn fn, void *arg)
{
    wqueue *q = NULL;

    if (w == NULL)
        return PGJOBQ_EINVAL;
    if (w->ran)
        return werr(w, PGJOBQ_EINVAL, "handlers must be added before the worker runs");
    if (pgjobq_name_check(queue) != PGJOBQ_OK)
        return werr(w, PGJOBQ_EINVAL, "invalid queue name \"%.80s\"", queue ? queue : "");
    if (kind && pgjobq_name_check(kind) != PGJOBQ_OK)
        return werr(w, PGJOBQ_EINVAL, "invalid kind name \"%.80s\"", kind);
    if (concurrency < 1 || concurrency > 1024)
        return werr(w, PGJOBQ_EINVAL, "concurrency must be between 1 and 1024, not %d", concurrency);
    if (fn == NULL)
        return werr(w, PGJOBQ_EINVAL, "no handler function given");
    for (int i = 0; i < w->nqueues; i++)
        if (strcmp(w->queues[i].name, queue) == 0)
            q = &w->queues[i];
    if (q == NULL) {
        if (w->nqueues == MAX_QUEUES)
            return werr(w, PGJOBQ_EINVAL, "at most %d queues per worker", MAX_QUEUES);
        q = &w->queues[w->nqueues++];
        memset(q, 0, sizeof *q);
        q->w = w;
        snprintf(q->name, sizeof q->name, "%s", queue);
        q->concurrency = concurrency;
    } else if (q->concurrency != concurrency) {
        return werr(w, PGJOBQ_EINVAL, "queue %s was given concurrency %d and %d", queue, q->concurrency,
                    concurrency);
    }
    for (int i = 0; i < q->nhandlers; i++)
        if (strcmp(q->handlers[i].kind, kind ? kind : "") == 0)
            return werr(w, PGJOBQ_EINVAL, "queue %s already has a handler for %s%s", queue, kind ? "kind " : "",
                        kind ? kind : "every kind");
    if (q->nhandlers == MAX_HANDLERS)
        return werr(w, PGJOBQ_EINVAL, "at most %d handlers per queue", MAX_HANDLERS);
    handler *h = &q->handlers[q->nhandlers++];
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
        wake(w);
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
    if (w->wake_pipe[0] >= 0)
        close(w->wake_pipe[0]);
    if (w->wake_pipe[1] >= 0)
        close(w->wake_pipe[1]);
    free(w->running);
    free(w);
}

/* ------------------------------------------------------------------------------------------------ */
/* Handler threads                                                                                   */

static const handler *find_handler(const wqueue *q, const char *kind)
{
    const handler *any = NULL;
    for (int i = 0; i < q->nhandlers; i++) {
        if (q->handlers[i].kind[0] == '\0')
            any = &q->handlers[i];
        else if (strcmp(q->handlers[i].kind, kind) == 0)
            return &q->handlers[i];
    }
    return any;
}

static void push_done(pgjobq_worker *w, pgjobq_ctx *ctx)
{
    int was_empty;
    pthread_mutex_lock(&w->done_mu);
    was_empty = w->done_head == NULL;
    ctx->next = w->done_head;
    w->done_head = ctx;
    pthread_mutex_unlock(&w->done_mu);
    /* The engine drains the whole list when it wakes: one wakeup per batch is enough. */
    if (was_empty)
        wake(w);
}

static void *queue_thread(void *arg)
{
    wqueue *q = arg;

    for (;;) {
        pgjobq_ctx *ctx;

        pthread_mutex_lock(&q->mu);
        while (q->head == NULL && !q->exit_threads)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->head == NULL) {
            pthread_mutex_unlock(&q->mu);
            return NULL;
        }
        ctx = q->head;
        q->head = ctx->next;
        if (q->head == NULL)
            q->tail = NULL;
        else if (atomic_load(&q->handler_ns) > FAST_HANDLER_NS)
            pthread_cond_signal(&q->cv); /* more work for slow handlers: wake a thread to share it */
        ctx->next = NULL;
        pthread_mutex_unlock(&q->mu);

        const handler *h = find_handler(q, ctx->job->kind);
        if (atomic_load(&ctx->stop) != PGJOBQ_STOP_NONE) {
            /* Told to stop before it started (shutdown or a lost lease): nothing ran. */
            ctx->outcome = PGJOBQ_OUTCOME_RETRY;
            pgjobq_ctx_set_error(ctx, "not started: the worker was stopping");
        } else if (h == NULL) {
            char why[512];
            snprintf(why, sizeof why, "no handler for kind %s in queue %s on worker %s", ctx->job->kind, q->name,
                     q->w->worker_id);
            ctx->outcome = PGJOBQ_OUTCOME_FAIL;
            pgjobq_ctx_set_error(ctx, why);
        } else {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            ctx->started_ms = (int64_t)t0.tv_sec * 1000 + t0.tv_nsec / 1000000;
            ctx->outcome = h->fn(ctx, h->arg);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            int64_t ns = (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec);
            int64_t avg = atomic_load(&q->handler_ns);
            atomic_store(&q->handler_ns, avg + (ns - avg) / 8); /* racy updates only blur the average */
        }
        push_done(q->w, ctx);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Engine: connections                                                                               */

static void main_disconnected(pgjobq_worker *w, const char *why)
{
    if (w->connected)
        wlog(w, PGJOBQ_LOG_WARN, "lost the database connection: %s; reconnecting", why);
    w->connected = 0;
    if (w->reconnect_delay_ms == 0)
        w->reconnect_delay_ms = RECONNECT_MIN_MS;
    w->reconnect_at_ms = mono_ms() + jittered(w->reconnect_delay_ms);
    w->reconnect_delay_ms = w->reconnect_delay_ms * 2 > RECONNECT_MAX_MS ? RECONNECT_MAX_MS : w->reconnect_delay_ms * 2;
}

/* How long a connection of the worker waits for an unanswered network before giving up: well inside
 * the lease, so that a half-open partition turns into a connection error, and the jobs into lost
 * ones, before another worker can take them. */
static int64_t tcp_timeout(const pgjobq_worker *w)
{
    int64_t t = w->o.lease_ms / 3;
    return t < 1000 ? 1000 : t;
}

/* Connects the main client; returns PGJOBQ_OK, PGJOBQ_ECONN (try later) or a fatal code. */
static int main_connect(pgjobq_worker *w)
{
    int rc;

    if (w->main == NULL) {
        rc = pgjobq__client_open_timeout(&w->main, w->conninfo, tcp_timeout(w));
    } else {
        PQreset(w->main->conn);
        rc = PQstatus(w->main->conn) == CONNECTION_OK ? pgjobq__check_schema(w->main) : PGJOBQ_ECONN;
        if (rc == PGJOBQ_OK) {
            PGresult *r = PQexec(w->main->conn, "SET default_transaction_isolation = 'read committed'");
            PQclear(r);
        }
    }
    if (rc == PGJOBQ_OK) {
        if (!w->connected)
            wlog(w, PGJOBQ_LOG_INFO, "connected to the database as worker %s", w->worker_id);
        w->connected = 1;
        w->reconnect_delay_ms = 0;
        for (int i = 0; i < w->nqueues; i++)
            w->queues[i].woken = 1;
        return PGJOBQ_OK;
    }
    if (rc == PGJOBQ_ESCHEMA || rc == PGJOBQ_ENOMEM) {
        werr(w, rc, "%s", pgjobq_errmsg(w->main));
        return rc;
    }
    main_disconnected(w, pgjobq_errmsg(w->main));
    return PGJOBQ_ECONN;
}

static void listener_close(pgjobq_worker *w)
{
    if (w->listener)
        PQfinish(w->listener);
    w->listener = NULL;
}

static void listener_failed(pgjobq_worker *w, const char *why)
{
    wlog(w, PGJOBQ_LOG_WARN, "listener connection failed (%s); polling until it is back", why);
    listener_close(w);
    if (w->listener_retry_delay_ms == 0)
        w->listener_retry_delay_ms = RECONNECT_MIN_MS;
    w->listener_retry_at_ms = mono_ms() + jittered(w->listener_retry_delay_ms);
    w->listener_retry_delay_ms =
        w->listener_retry_delay_ms * 2 > RECONNECT_MAX_MS ? RECONNECT_MAX_MS : w->listener_retry_delay_ms * 2;
}

static void listener_connect(pgjobq_worker *w)
{
    char timeout_s[32];
    snprintf(timeout_s, sizeof timeout_s, "%lld", (long long)tcp_timeout(w));
    const char *const keys[] = {"dbname", "client_encoding", "fallback_application_name", "tcp_user_timeout", NULL};
    const char *const vals[] = {w->conninfo, "UTF8", "pgjobq-listener", timeout_s, NULL};
    PGresult *r;

    w->listener = PQconnectdbParams(keys, vals, 1);
    if (w->listener == NULL || PQstatus(w->listener) != CONNECTION_OK) {
        listener_failed(w, w->listener ? PQerrorMessage(w->listener) : "out of memory");
        return;
    }
    r = PQexec(w->listener, "LISTEN pgjobq");
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        PQclear(r);
        listener_failed(w, PQerrorMessage(w->listener));
        return;
    }
    PQclear(r);
    w->listener_retry_delay_ms = 0;
    w->listener_check_ms = mono_ms() + LISTEN_CHECK_MS;
    /* Jobs may have arrived while nobody listened. */
    for (int i = 0; i < w->nqueues; i++)
        w->queues[i].woken = 1;
    wlog(w, PGJOBQ_LOG_INFO, "listening for new jobs");
}

/* Reads notifications; a queue named in one is claimed from at once. */
static void listener_read(pgjobq_worker *w)
{
    PGnotify *n;

    if (!PQconsumeInput(w->listener)) {
        listener_failed(w, PQerrorMessage(w->listener));
        return;
    }
    while ((n = PQnotifies(w->listener)) != NULL) {
        for (int i = 0; i < w->nqueues; i++)
            if (strcmp(w->queues[i].name, n->extra) == 0)
                w->queues[i].woken = 1;
        PQfreemem(n);
    }
}

/* A listening connection can die silently: ask it now and then whether it still listens. */
static void listener_check(pgjobq_worker *w)
{
    PGresult *r = PQexec(w->listener, "SELECT 1 FROM pg_catalog.pg_listening_channels() c WHERE c = 'pgjobq'");
    int ok = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;

    PQclear(r);
    if (!ok) {
        listener_failed(w, PQstatus(w->listener) == CONNECTION_OK ? "no longer listening" : PQerrorMessage(w->listener));
        return;
    }
    w->listener_check_ms = mono_ms() + LISTEN_CHECK_MS;
    listener_read(w); /* the query may have brought notifications along */
}

/* ------------------------------------------------------------------------------------------------ */
/* Engine: the running set, claims, outcomes                                                         */

static int running_add(pgjobq_worker *w, pgjobq_ctx *ctx)
{
    if (w->nrunning == w->caprunning) {
        size_t cap = w->caprunning ? w->caprunning * 2 : 64;
        pgjobq_ctx **p = realloc(w->running, cap * sizeof *p);
        if (p == NULL)
            return -1;
        w->running = p;
        w->caprunning = cap;
    }
    w->running[w->nrunning++] = ctx;
    atomic_store(&w->st_running, (int64_t)w->nrunning);
    return 0;
}

static void running_remove(pgjobq_worker *w, pgjobq_ctx *ctx)
{
    for (size_t i = 0; i < w->nrunning; i++) {
        if (w->running[i] == ctx) {
            w->running[i] = w->running[--w->nrunning];
            break;
        }
    }
    atomic_store(&w->st_running, (int64_t)w->nrunning);
}

/* Whether to claim for q now.  A notification or the poll claims whatever slots are free.  Under a
 * backlog (the last claim came back full) the engine waits until half a batch of slots is free, or
 * nothing runs: refilling slot by slot as each job ends would fragment claims into tiny batches. */
static int claim_ready(const pgjobq_worker *w, const wqueue *q, int64_t now)
{
    int free_slots = q->concurrency - q->running;
    int batch = q->concurrency < w->o.batch_max ? q->concurrency : w->o.batch_max;

    if (free_slots <= 0)
        return 0;
    if (q->woken || now >= q->next_claim_ms)
        return 1;
    return q->last_full && (free_slots >= (batch + 1) / 2 || q->running == 0);
}

static int claim_queue(pgjobq_worker *w, wqueue *q, int64_t now)
{
    int free_slots = q->concurrency - q->running;
    int want = free_slots < w->o.batch_max ? free_slots : w->o.batch_max;
    pgjobq_job *jobs = NULL;
    size_t n = 0;
    int rc;

    rc = pgjobq_claim(w->main, q->name, want, w->o.lease_ms, w->worker_id, &jobs, &n);
    atomic_fetch_add(&w->st_claims, 1);
    if (rc != PGJOBQ_OK)
        return rc;
    q->woken = 0;
    q->last_full = (int)n == want;
    q->next_claim_ms = now + w->o.poll_ms;
    /* The batch goes onto the queue's list under one lock, and one thread is woken: each thread that
     * takes a job wakes another only if jobs remain (queue_thread).  Cheap handlers then drain a batch
     * with a few threads instead of waking one per job; slow ones still fan out to all of them. */
    pgjobq_ctx *first = NULL, *last = NULL;
    for (size_t i = 0; i < n; i++) {
        pgjobq_ctx *ctx = calloc(1, sizeof *ctx);
        if (ctx)
            ctx->job = pgjobq__job_dup(&jobs[i]);
        if (ctx == NULL || ctx->job == NULL || running_add(w, ctx) != 0) {
            /* Out of memory: the job's lease will expire and it will run elsewhere. */
            wlog(w, PGJOBQ_LOG_ERROR, "out of memory dispatching job %lld", (long long)jobs[i].id);
            ctx_free(ctx);
            continue;
        }
        ctx->q = q;
        ctx->retry_delay_ms = PGJOBQ_BACKOFF;
        ctx->lease_valid_until_ms = now + w->o.lease_ms;
        ctx->timeout_at_ms = now + w->o.timeout_ms;
        q->running++;
        wlog(w, PGJOBQ_LOG_DEBUG, "job %lld (%s/%s) attempt %d starting", (long long)ctx->job->id, q->name,
             ctx->job->kind, ctx->job->attempt);
        if (last)
            last->next = ctx;
        else
            first = ctx;
        last = ctx;
    }
    if (first) {
        pthread_mutex_lock(&q->mu);
        if (q->tail)
            q->tail->next = first;
        else
            q->head = first;
        q->tail = last;
        pthread_cond_signal(&q->cv);
        pthread_mutex_unlock(&q->mu);
    }
    atomic_fetch_add(&w->st_claimed, (int64_t)n);
    if (n == 0 && w->connected) {
        /* Nothing due: sleep until the next scheduled job, if it comes before the next poll. */
        static const Oid types[] = {OID_TEXT};
        const char *values[] = {q->name};
        pgjobq__stmt st = {"next due", "SELECT pgjobq.next_due($1)", 1, types, values, NULL, NULL, 0};
        PGresult *r;
        if (pgjobq__exec(w->main, &st, &r) == PGJOBQ_OK) {
            if (!PQgetisnull(r, 0, 0)) {
                double secs = atof(PQgetvalue(r, 0, 0));
                int64_t at = now + (secs < 0 ? 0 : (int64_t)(secs * 1000.0)) + 1;
                if (at < q->next_claim_ms)
                    q->next_claim_ms = at;
            }
            PQclear(r);
        }
    }
    pgjobq_jobs_free(jobs);
    return PGJOBQ_OK;
}

/* The kinds of write the engine batches. */
enum { W_COMPLETE, W_FAIL, W_RELEASE, W_CANCEL, W_KINDS };

typedef struct batch {
    pgjobq_ctx **items;
    size_t n, cap;
} batch;

static int batch_add(batch *b, pgjobq_ctx *ctx)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        pgjobq_ctx **p = realloc(b->items, cap * sizeof *p);
        if (p == NULL)
            return -1;
        b->items = p;
        b->cap = cap;
    }
    b->items[b->n++] = ctx;
    return 0;
}

/* Runs one *_many statement for a batch; outcome text per id goes to on_outcome. */
static int write_batch(pgjobq_worker *w, int kind, batch *b)
{
    static const char *const sql[W_KINDS] = {
        "SELECT id, outcome FROM pgjobq.complete_many($1, $2, $3)",
        "SELECT id, outcome FROM pgjobq.fail_many($1, $2, $3, $4, $5)",
        "SELECT id, outcome FROM pgjobq.release_many($1, $2, $3)",
        "SELECT id, outcome FROM pgjobq.cancel_many($1, $2, $3)"};
    static const char *const what[W_KINDS] = {"complete", "fail", "release", "cancel"};
    Oid types[5] = {OID_INT8_ARRAY, OID_INT8_ARRAY, 0, OID_INTERVAL_ARRAY, OID_BOOL_ARRAY};
    int formats[5] = {1, 1, 1, 1, 1}, lengths[5] = {0};
    const char *values[5] = {NULL};
    pgjobq__array a[5];
    char reason[300];
    int nparams, rc = PGJOBQ_OK;
    PGresult *r = NULL;

    memset(a, 0, sizeof a);
    pgjobq__array_begin(&a[0], OID_INT8);
    pgjobq__array_begin(&a[1], OID_INT8);
    for (size_t i = 0; i < b->n; i++) {
        pgjobq__array_int8(&a[0], b->items[i]->job->id);
        pgjobq__array_int8(&a[1], b->items[i]->job->lease_token);
    }
    switch (kind) {
    case W_COMPLETE:
        nparams = 3;
        types[2] = OID_JSONB_ARRAY;
        pgjobq__array_begin(&a[2], OID_JSONB);
        for (size_t i = 0; i < b->n; i++) {
            if (b->items[i]->result)
                pgjobq__array_jsonb(&a[2], b->items[i]->result, strlen(b->items[i]->result));
            else
                pgjobq__array_null(&a[2]);
        }
        break;
    case W_FAIL:
        nparams = 5;
        types[2] = OID_TEXT_ARRAY;
        pgjobq__array_begin(&a[2], OID_TEXT);
        pgjobq__array_begin(&a[3], OID_INTERVAL);
        pgjobq__array_begin(&a[4], OID_BOOL);
        for (size_t i = 0; i < b->n; i++) {
            const pgjobq_ctx *ctx = b->items[i];
            const char *e = ctx->error ? ctx->error : "failed (the handler gave no error text)";
            pgjobq__array_text(&a[2], e, strlen(e));
            if (ctx->retry_delay_ms == PGJOBQ_BACKOFF || ctx->outcome == PGJOBQ_OUTCOME_FAIL)
                pgjobq__array_null(&a[3]);
            else
                pgjobq__array_interval_us(&a[3], ctx->retry_delay_ms * 1000);
            pgjobq__array_bool(&a[4], ctx->outcome == PGJOBQ_OUTCOME_FAIL);
        }
        break;
    default:
        nparams = 3;
        types[2] = OID_TEXT;
        formats[2] = 0;
        snprintf(reason, sizeof reason, "%s by worker %s", kind == W_RELEASE ? "handed back at shutdown" : "cancelled by its handler",
                 w->worker_id);
        values[2] = reason;
        break;
    }
    for (int k = 0; k < nparams; k++) {
        if (k == 2 && kind >= W_RELEASE)
            continue;
        if (pgjobq__array_end(&a[k]) != 0) {
            rc = PGJOBQ_ENOMEM;
            goto out;
        }
        values[k] = a[k].buf.data;
        lengths[k] = (int)a[k].buf.len;
    }
    pgjobq__stmt st = {what[kind], sql[kind], nparams, types, values, lengths, formats, 1};
    atomic_fetch_add(&w->st_writes, 1);
    rc = pgjobq__exec(w->main, &st, &r);
    if (rc != PGJOBQ_OK)
        goto out;
    for (int row = 0; row < PQntuples(r); row++) {
        const char *outcome = pgjobq__get_text(r, row, 1, NULL);
        int64_t id = pgjobq__get_int8(r, row, 0);
        if (outcome == NULL)
            continue;
        if (strncmp(outcome, "completed", 9) == 0)
            atomic_fetch_add(&w->st_completed, 1);
        else if (strncmp(outcome, "queued", 6) == 0)
            atomic_fetch_add(kind == W_RELEASE ? &w->st_released : &w->st_retried, 1);
        else if (strncmp(outcome, "failed", 6) == 0)
            atomic_fetch_add(&w->st_failed, 1);
        else if (strncmp(outcome, "cancelled", 9) == 0)
            atomic_fetch_add(&w->st_cancelled, 1);
        else if (strncmp(outcome, "lost", 4) == 0) {
            atomic_fetch_add(&w->st_lost, 1);
            wlog(w, PGJOBQ_LOG_WARN, "job %lld: lease lost before its outcome could be written; not written",
                 (long long)id);
        }
        wlog(w, PGJOBQ_LOG_DEBUG, "job %lld finished: %.*s", (long long)id, PQgetlength(r, row, 1), outcome);
    }
out:
    PQclear(r);
    for (int k = 0; k < 5; k++)
        pgjobq__buf_free(&a[k].buf);
    return rc;
}

/* Takes the handler threads' finished jobs and sorts them into the batches to write. */
static void collect_done(pgjobq_worker *w, batch writes[W_KINDS])
{
    pgjobq_ctx *list;

    pthread_mutex_lock(&w->done_mu);
    list = w->done_head;
    w->done_head = NULL;
    pthread_mutex_unlock(&w->done_mu);
    while (list) {
        pgjobq_ctx *ctx = list;
        int kind;
        list = ctx->next;
        ctx->next = NULL;
        ctx->q->running--;
        if (ctx->ended || ctx->outcome == PGJOBQ_OUTCOME_DONE) {
            /* Lost, cancelled in the database already, or ended by its handler: nothing to write. */
            if (ctx->outcome == PGJOBQ_OUTCOME_DONE && !ctx->ended)
                atomic_fetch_add(&w->st_completed, 1);
            running_remove(w, ctx);
            ctx_free(ctx);
            continue;
        }
        if (atomic_load(&ctx->stop) == PGJOBQ_STOP_SHUTDOWN && ctx->outcome != PGJOBQ_OUTCOME_COMPLETE)
            kind = W_RELEASE;
        else if (ctx->outcome == PGJOBQ_OUTCOME_COMPLETE)
            kind = W_COMPLETE;
        else if (ctx->outcome == PGJOBQ_OUTCOME_CANCEL)
            kind = W_CANCEL;
        else
            kind = W_FAIL;
        if (ctx->outcome == PGJOBQ_OUTCOME_RETRY && ctx->error == NULL &&
            pgjobq_ctx_stop_reason(ctx) == PGJOBQ_STOP_TIMEOUT) {
            char why[96];
            snprintf(why, sizeof why, "timed out after %lld ms", (long long)w->o.timeout_ms);
            pgjobq_ctx_set_error(ctx, why);
        }
        if (w->first_pending_ms == 0)
            w->first_pending_ms = mono_ms();
        if (batch_add(&writes[kind], ctx) != 0) {
            wlog(w, PGJOBQ_LOG_ERROR, "out of memory recording job %lld", (long long)ctx->job->id);
            running_remove(w, ctx);
            ctx_free(ctx);
        }
    }
}

/* Writes every pending batch; a batch that fails on a broken connection stays for the next try. */
static void flush_writes(pgjobq_worker *w, batch writes[W_KINDS])
{
    w->first_pending_ms = 0;
    for (int k = 0; k < W_KINDS; k++) {
        if (writes[k].n == 0 || !w->connected)
            continue;
        int rc = write_batch(w, k, &writes[k]);
        if (rc == PGJOBQ_ECONN) {
            main_disconnected(w, pgjobq_errmsg(w->main));
            continue;
        }
        if (rc != PGJOBQ_OK)
            wlog(w, PGJOBQ_LOG_ERROR, "writing %zu outcomes failed: %s; their leases will expire and the jobs "
                                      "run again",
                 writes[k].n, pgjobq_errmsg(w->main));
        for (size_t i = 0; i < writes[k].n; i++) {
            running_remove(w, writes[k].items[i]);
            ctx_free(writes[k].items[i]);
        }
        writes[k].n = 0;
    }
    for (int k = 0; k < W_KINDS; k++)
        if (writes[k].n > 0 && w->first_pending_ms == 0)
            w->first_pending_ms = mono_ms(); /* kept for the next try */
}

/* Whether to write the pending outcomes now: when no handler is still running (nothing more can join
 * the batch), when the oldest has waited FLUSH_AFTER_MS, or when stopping. */
static int flush_due(const pgjobq_worker *w, int64_t now, int stopping)
{
    int outstanding = 0;
    if (w->first_pending_ms == 0)
        return 0;
    for (int i = 0; i < w->nqueues; i++)
        outstanding += w->queues[i].running;
    return outstanding == 0 || stopping || now - w->first_pending_ms >= FLUSH_AFTER_MS;
}

/* Renews every running lease of this process in one statement. */
static void heartbeat(pgjobq_worker *w, int64_t now)
{
    static const Oid types[] = {OID_INT8_ARRAY, OID_INT8_ARRAY, OID_INTERVAL};
    static const int formats[] = {1, 1, 0};
    pgjobq__array ids, tokens;
    const char *values[3];
    int lengths[3] = {0, 0, 0};
    char lease_s[48];
    size_t n = 0;
    PGresult *r;

    memset(&ids, 0, sizeof ids);
    memset(&tokens, 0, sizeof tokens);
    pgjobq__array_begin(&ids, OID_INT8);
    pgjobq__array_begin(&tokens, OID_INT8);
    for (size_t i = 0; i < w->nrunning; i++) {
        if (w->running[i]->ended)
            continue;
        pgjobq__array_int8(&ids, w->running[i]->job->id);
        pgjobq__array_int8(&tokens, w->running[i]->job->lease_token);
        n++;
    }
    w->next_heartbeat_ms = now + w->o.heartbeat_ms;
    if (n == 0 || pgjobq__array_end(&ids) != 0 || pgjobq__array_end(&tokens) != 0)
        goto out;
    pgjobq__ms_interval(lease_s, sizeof lease_s, w->o.lease_ms);
    values[0] = ids.buf.data;
    lengths[0] = (int)ids.buf.len;
    values[1] = tokens.buf.data;
    lengths[1] = (int)tokens.buf.len;
    values[2] = lease_s;
    pgjobq__stmt st = {"heartbeat", "SELECT id, outcome FROM pgjobq.extend_many($1, $2, $3)", 3, types, values,
                       lengths, formats, 1};
    int rc = pgjobq__exec(w->main, &st, &r);
    if (rc != PGJOBQ_OK) {
        if (rc == PGJOBQ_ECONN)
            main_disconnected(w, pgjobq_errmsg(w->main));
        else
            wlog(w, PGJOBQ_LOG_WARN, "heartbeat failed: %s", pgjobq_errmsg(w->main));
        goto out;
    }
    for (int row = 0; row < PQntuples(r); row++) {
        int64_t id = pgjobq__get_int8(r, row, 0);
        const char *outcome = pgjobq__get_text(r, row, 1, NULL);
        for (size_t i = 0; i < w->nrunning; i++) {
            pgjobq_ctx *ctx = w->running[i];
            if (ctx->job->id != id || ctx->ended)
                continue;
            if (outcome && strncmp(outcome, "extended", 8) == 0) {
                ctx->lease_valid_until_ms = now + w->o.lease_ms;
            } else if (outcome && strncmp(outcome, "cancelled", 9) == 0) {
                ctx->ended = 1;
                ctx_stop(ctx, PGJOBQ_STOP_CANCELLED);
                atomic_fetch_add(&w->st_cancelled, 1);
                wlog(w, PGJOBQ_LOG_INFO, "job %lld was cancelled; its handler is asked to stop", (long long)id);
            } else {
                ctx->ended = 1;
                ctx_stop(ctx, PGJOBQ_STOP_LEASE_LOST);
                atomic_fetch_add(&w->st_lost, 1);
                wlog(w, PGJOBQ_LOG_WARN, "job %lld: lease lost; its handler is asked to stop", (long long)id);
            }
            break;
        }
    }
    PQclear(r);
out:
    pgjobq__buf_free(&ids.buf);
    pgjobq__buf_free(&tokens.buf);
}

/* Jobs past their timeout are told to stop; jobs whose lease can no longer be known valid are lost. */
static void check_deadlines(pgjobq_worker *w, int64_t now)
{
    /* Give a stopping handler a tenth of the lease (at most 5 s) before the lease could expire. */
    int64_t margin = w->o.lease_ms / 10 < 5000 ? w->o.lease_ms / 10 : 5000;

    for (size_t i = 0; i < w->nrunning; i++) {
        pgjobq_ctx *ctx = w->running[i];
        if (ctx->ended)
            continue;
        if (now >= ctx->timeout_at_ms)
            ctx_stop(ctx, PGJOBQ_STOP_TIMEOUT);
        if (now >= ctx->lease_valid_until_ms - margin) {
            ctx->ended = 1;
            ctx_stop(ctx, PGJOBQ_STOP_LEASE_LOST);
            atomic_fetch_add(&w->st_lost, 1);
            wlog(w, PGJOBQ_LOG_WARN, "job %lld: its lease could not be renewed in time; treating it as lost",
                 (long long)ctx->job->id);
        }
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Maintenance thread                                                                                */

/* Runs a maintenance statement under a try-lock, batch after batch; returns rows handled or -1. */
static int64_t maintain(pgjobq_worker *w, pgjobq_client *c, const char *what, const char *sql, int nparams,
                        const Oid *types, const char *const *values)
{
    int64_t total = 0;
    for (;;) {
        PGresult *r;
        pgjobq__stmt st = {what, sql, nparams, types, values, NULL, NULL, 0};
        if (pgjobq__exec(c, &st, &r) != PGJOBQ_OK) {
            wlog(w, PGJOBQ_LOG_WARN, "maintenance (%s) failed: %s", what, pgjobq_errmsg(c));
            return -1;
        }
        int n = atoi(PQgetvalue(r, 0, 0));
        PQclear(r);
        if (n <= 0)
            return total;
        total += n;
        if (n < 1000)
            return total;
    }
}

static void *maintenance_thread(void *arg)
{
    pgjobq_worker *w = arg;
    pgjobq_client *c = NULL;
    int64_t next_prune = mono_ms() + 5000, retry_delay = RECONNECT_MIN_MS;
    char completed_s[48], failed_s[48];
    /* A negative retention means "never": an age nothing reaches. */
    pgjobq__ms_interval(completed_s, sizeof completed_s,
                        w->o.retain_completed_ms < 0 ? INT64_C(3155760000000) * 10 : w->o.retain_completed_ms);
    pgjobq__ms_interval(failed_s, sizeof failed_s,
                        w->o.retain_failed_ms < 0 ? INT64_C(3155760000000) * 10 : w->o.retain_failed_ms);

    for (;;) {
        int64_t wait_ms = RESCUE_EVERY_MS;

        pthread_mutex_lock(&w->maint_mu);
        int exit_now = w->maint_exit;
        pthread_mutex_unlock(&w->maint_mu);
        if (exit_now)
            break;
        if (c == NULL || PQstatus(c->conn) != CONNECTION_OK) {
            pgjobq_client_close(c);
            c = NULL;
            if (pgjobq__client_open_timeout(&c, w->conninfo, tcp_timeout(w)) != PGJOBQ_OK) {
                pgjobq_client_close(c);
                c = NULL;
                wait_ms = jittered(retry_delay);
                retry_delay = retry_delay * 2 > RECONNECT_MAX_MS ? RECONNECT_MAX_MS : retry_delay * 2;
            } else {
                retry_delay = RECONNECT_MIN_MS;
            }
        }
        if (c) {
            /* Only one process in the fleet does each pass; the others skip it (-1). */
            int64_t n = maintain(w, c, "rescue",
                                 "SELECT CASE WHEN pg_catalog.pg_try_advisory_xact_lock(1885825649, 2)"
                                 " THEN pgjobq.rescue_expired(1000) ELSE -1 END",
                                 0, NULL, NULL);
            if (n > 0) {
                atomic_fetch_add(&w->st_rescued, n);
                wlog(w, PGJOBQ_LOG_INFO, "rescued %lld jobs whose lease had expired", (long long)n);
            }
            if (mono_ms() >= next_prune) {
                static const Oid types[] = {OID_INTERVAL, OID_INTERVAL};
                const char *values[] = {completed_s, failed_s};
                n = maintain(w, c, "prune",
                             "SELECT CASE WHEN pg_catalog.pg_try_advisory_xact_lock(1885825649, 3)"
                             " THEN pgjobq.prune($1, $2, 1000) ELSE -1 END",
                             2, types, values);
                if (n > 0)
                    wlog(w, PGJOBQ_LOG_INFO, "pruned %lld finished jobs past their retention", (long long)n);
                next_prune = mono_ms() + PRUNE_EVERY_MS;
            }
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += wait_ms / 1000;
        until.tv_nsec += (wait_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&w->maint_mu);
        if (!w->maint_exit)
            pthread_cond_timedwait(&w->maint_cv, &w->maint_mu, &until);
        pthread_mutex_unlock(&w->maint_mu);
    }
    pgjobq_client_close(c);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* The run loop                                                                                      */

static int start_threads(pgjobq_worker *w)
{
    for (int i = 0; i < w->nqueues; i++) {
        wqueue *q = &w->queues[i];
        atomic_store(&q->handler_ns, INT64_C(1000000)); /* unknown: assume slow until measured */
        q->threads = calloc((size_t)q->concurrency, sizeof *q->threads);
        if (q->threads == NULL)
            return werr(w, PGJOBQ_ENOMEM, "out of memory starting threads");
        for (int t = 0; t < q->concurrency; t++) {
            if (pthread_create(&q->threads[t], NULL, queue_thread, q) != 0)
                return werr(w, PGJOBQ_ENOMEM, "cannot start thread %d of queue %s: %s", t, q->name, strerror(errno));
            q->nthreads++;
        }
    }
    return PGJOBQ_OK;
}

static void stop_threads(pgjobq_worker *w)
{
    for (int i = 0; i < w->nqueues; i++) {
        wqueue *q = &w->queues[i];
        pthread_mutex_lock(&q->mu);
        q->exit_threads = 1;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        for (int t = 0; t < q->nthreads; t++)
            pthread_join(q->threads[t], NULL);
        free(q->threads);
        q->threads = NULL;
        q->nthreads = 0;
    }
}

int pgjobq_worker_run(pgjobq_worker *w)
{
    batch writes[W_KINDS];
    int rc = PGJOBQ_OK, stopping = 0, handed_back = 0, queues_inited = 0;
    int64_t shutdown_at = 0, last_summary;

    if (w == NULL)
        return PGJOBQ_EINVAL;
    if (w->ran)
        return werr(w, PGJOBQ_EINVAL, "pgjobq_worker_run was already called");
    w->ran = 1;
    if (w->nqueues == 0)
        return werr(w, PGJOBQ_EINVAL, "no queue to serve: add a handler with pgjobq_worker_handle");
    memset(writes, 0, sizeof writes);
    if (pipe(w->wake_pipe) != 0)
        return werr(w, PGJOBQ_ENOMEM, "pipe: %s", strerror(errno));
    for (int k = 0; k < 2; k++) {
        fcntl(w->wake_pipe[k], F_SETFL, O_NONBLOCK);
        fcntl(w->wake_pipe[k], F_SETFD, FD_CLOEXEC);
    }
    pthread_mutex_init(&w->done_mu, NULL);
    pthread_mutex_init(&w->maint_mu, NULL);
    pthread_cond_init(&w->maint_cv, NULL);
    for (int i = 0; i < w->nqueues; i++) {
        pthread_mutex_init(&w->queues[i].mu, NULL);
        pthread_cond_init(&w->queues[i].cv, NULL);
    }
    queues_inited = 1;

    /* First connection: a schema problem is fatal; an unreachable database is retried forever. */
    while ((rc = main_connect(w)) == PGJOBQ_ECONN) {
        if (atomic_load(&w->stop_requests) > 0)
            goto done;
        int64_t wait_ms = w->reconnect_at_ms - mono_ms();
        struct pollfd p = {w->wake_pipe[0], POLLIN, 0};
        if (wait_ms > 0)
            poll(&p, 1, (int)wait_ms);
    }
    if (rc != PGJOBQ_OK)
        goto done;
    if ((rc = start_threads(w)) != PGJOBQ_OK)
        goto done;
    if (!w->o.no_maintenance) {
        if (pthread_create(&w->maint, NULL, maintenance_thread, w) == 0)
            w->maint_started = 1;
        else
            wlog(w, PGJOBQ_LOG_WARN, "cannot start the maintenance thread: %s", strerror(errno));
    }
    if (!w->o.poll_only)
        listener_connect(w);
    w->next_heartbeat_ms = mono_ms() + w->o.heartbeat_ms;
    last_summary = mono_ms();
    wlog(w, PGJOBQ_LOG_INFO, "worker %s started: %d queue%s, lease %lld ms, heartbeat %lld ms, timeout %lld ms",
         w->worker_id, w->nqueues, w->nqueues == 1 ? "" : "s", (long long)w->o.lease_ms,
         (long long)w->o.heartbeat_ms, (long long)w->o.timeout_ms);

    for (;;) {
        int64_t now = mono_ms(), next;
        int requests = atomic_load(&w->stop_requests);

        /* Stopping: claim nothing more; after the shutdown timeout (or at once on a second stop),
         * ask the remaining handlers to stop, and hand their jobs back. */
        if (requests > 0 && !stopping) {
            stopping = 1;
            shutdown_at = w->o.shutdown_timeout_ms < 0 ? INT64_MAX : now + w->o.shutdown_timeout_ms;
            wlog(w, PGJOBQ_LOG_INFO, "stopping: %zu jobs still running", w->nrunning);
        }
        if (stopping && (requests > 1 || now >= shutdown_at)) {
            for (size_t i = 0; i < w->nrunning; i++)
                if (!w->running[i]->ended && atomic_load(&w->running[i]->stop) != PGJOBQ_STOP_SHUTDOWN) {
                    ctx_stop(w->running[i], PGJOBQ_STOP_SHUTDOWN);
                    handed_back = 1;
                }
        }

        collect_done(w, writes);
        if (!w->connected && now >= w->reconnect_at_ms) {
            rc = main_connect(w);
            if (rc != PGJOBQ_OK && rc != PGJOBQ_ECONN)
                break;
            rc = PGJOBQ_OK;
        }
        if (w->connected && flush_due(w, now, stopping))
            flush_writes(w, writes);
        if (w->connected && now >= w->next_heartbeat_ms)
            heartbeat(w, now);
        check_deadlines(w, now);

        if (stopping && w->nrunning == 0)
            break;
        if (stopping && !w->connected && (requests > 1 || now >= shutdown_at)) {
            /* Stopping without a database, after a second signal or past the shutdown timeout: outcomes
             * still unwritten go back through their leases (rescued when they expire). */
            int outstanding = 0;
            for (int i = 0; i < w->nqueues; i++)
                outstanding += w->queues[i].running;
            if (outstanding == 0) {
                size_t unwritten = 0;
                for (int k = 0; k < W_KINDS; k++)
                    unwritten += writes[k].n;
                if (unwritten)
                    rc = werr(w, PGJOBQ_ETIMEOUT,
                              "stopped without a database: the outcomes of %zu jobs could not be written; their "
                              "leases will expire and they will run again",
                              unwritten);
                break;
            }
        }

        if (!stopping && w->connected) {
            for (int i = 0; i < w->nqueues && w->connected; i++) {
                wqueue *q = &w->queues[i];
                if (!claim_ready(w, q, now))
                    continue;
                int crc = claim_queue(w, q, now);
                if (crc == PGJOBQ_ECONN)
                    main_disconnected(w, pgjobq_errmsg(w->main));
                else if (crc != PGJOBQ_OK) {
                    wlog(w, PGJOBQ_LOG_WARN, "claim from %s failed: %s", q->name, pgjobq_errmsg(w->main));
                    q->next_claim_ms = now + w->o.poll_ms;
                    q->woken = q->last_full = 0;
                }
            }
        }

        if (!w->o.poll_only && w->listener == NULL && !stopping && now >= w->listener_retry_at_ms)
            listener_connect(w);
        if (w->listener && now >= w->listener_check_ms)
            listener_check(w);

        if (now - last_summary >= 60000) {
            pgjobq_worker_stats s;
            pgjobq_worker_get_stats(w, &s);
            wlog(w, PGJOBQ_LOG_INFO, "running %lld; so far %lld completed, %lld retried, %lld failed, %lld lost",
                 (long long)s.running, (long long)s.completed, (long long)s.retried, (long long)s.failed,
                 (long long)s.lost);
            last_summary = now;
        }

        /* Jobs still waiting in a list (their handlers are fast, or all threads are busy): hand one to
         * another thread, and look again soon, so that a slow job cannot hold the rest back. */
        int waiting = 0;
        for (int i = 0; i < w->nqueues; i++) {
            wqueue *q = &w->queues[i];
            pthread_mutex_lock(&q->mu);
            if (q->head) {
                waiting = 1;
                pthread_cond_signal(&q->cv);
            }
            pthread_mutex_unlock(&q->mu);
        }

        /* Sleep until something is due: a claim, a heartbeat, a reconnect, a deadline. */
        now = mono_ms();
        next = now + (waiting ? HELP_AFTER_MS : 1000);
        if (w->nrunning > 0 && w->next_heartbeat_ms < next)
            next = w->next_heartbeat_ms;
        if (!w->connected && w->reconnect_at_ms < next)
            next = w->reconnect_at_ms;
        if (stopping && shutdown_at < next)
            next = shutdown_at;
        if (w->first_pending_ms && w->first_pending_ms + FLUSH_AFTER_MS < next)
            next = w->first_pending_ms + FLUSH_AFTER_MS;
        for (size_t i = 0; i < w->nrunning; i++)
            if (!w->running[i]->ended && w->running[i]->timeout_at_ms < next)
                next = w->running[i]->timeout_at_ms;
        int claim_now = 0;
        for (int i = 0; i < w->nqueues && !stopping; i++) {
            wqueue *q = &w->queues[i];
            if (q->running >= q->concurrency)
                continue;
            if (claim_ready(w, q, now))
                claim_now = 1;
            else if (!q->last_full && q->next_claim_ms < next)
                next = q->next_claim_ms; /* under a backlog, finishing handlers wake the engine */
        }
        if (!w->o.poll_only && w->listener == NULL && !stopping && w->listener_retry_at_ms < next)
            next = w->listener_retry_at_ms;
        int timeout = claim_now && w->connected ? 0 : (int)(next > now ? next - now : 0);
        struct pollfd p[2] = {{w->wake_pipe[0], POLLIN, 0}, {w->listener ? PQsocket(w->listener) : -1, POLLIN, 0}};
        if (poll(p, 2, timeout) < 0 && errno != EINTR)
            wlog(w, PGJOBQ_LOG_WARN, "poll: %s", strerror(errno));
        if (p[0].revents) {
            char buf[256];
            while (read(w->wake_pipe[0], buf, sizeof buf) > 0)
                ;
        }
        if (w->listener && p[1].revents)
            listener_read(w);
    }

    /* Everything has returned; write what is left (best effort), then stop the helpers. */
    collect_done(w, writes);
    if (w->connected)
        flush_writes(w, writes);
    for (int k = 0; k < W_KINDS; k++) {
        for (size_t i = 0; i < writes[k].n; i++) {
            running_remove(w, writes[k].items[i]);
            ctx_free(writes[k].items[i]);
        }
        writes[k].n = 0;
    }
    if (rc == PGJOBQ_OK && handed_back)
        rc = werr(w, PGJOBQ_ETIMEOUT, "jobs still running at the shutdown timeout were handed back");
    /* (Outcomes left unwritten without a database were reported above; they are freed below.) */

done:
    if (queues_inited)
        stop_threads(w);
    if (w->maint_started) {
        pthread_mutex_lock(&w->maint_mu);
        w->maint_exit = 1;
        pthread_cond_signal(&w->maint_cv);
        pthread_mutex_unlock(&w->maint_mu);
        pthread_join(w->maint, NULL);
        w->maint_started = 0;
    }
    /* Jobs never started (still on a queue's list when the threads left) go back via their lease. */
    for (int i = 0; i < w->nqueues; i++) {
        pgjobq_ctx *ctx = w->queues[i].head;
        while (ctx) {
            pgjobq_ctx *next = ctx->next;
            running_remove(w, ctx);
            ctx_free(ctx);
            ctx = next;
        }
        w->queues[i].head = w->queues[i].tail = NULL;
    }
    for (size_t i = 0; i < w->nrunning; i++)
        ctx_free(w->running[i]);
    w->nrunning = 0;
    for (int k = 0; k < W_KINDS; k++)
        free(writes[k].items);
    listener_close(w);
    pgjobq_client_close(w->main);
    w->main = NULL;
    if (queues_inited) {
        for (int i = 0; i < w->nqueues; i++) {
            pthread_mutex_destroy(&w->queues[i].mu);
            pthread_cond_destroy(&w->queues[i].cv);
        }
        pthread_mutex_destroy(&w->done_mu);
        pthread_mutex_destroy(&w->maint_mu);
        pthread_cond_destroy(&w->maint_cv);
    }
    wlog(w, PGJOBQ_LOG_INFO, "worker %s stopped", w->worker_id);
    return rc;
}
