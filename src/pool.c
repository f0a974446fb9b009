/*
 * pool.c - the handler threads of a worker and the handler's view of its job (pgjobq_ctx_*).
 *
 * Each queue has its own threads and its own dispatch list.  The engine appends a claimed batch to the
 * list under one lock and wakes one thread; a thread that takes a job wakes another only while jobs
 * remain and the queue's handlers are slow.  Cheap handlers thus drain a batch on few threads
 * (waking a thread per job made futex waits and context switches the worker's whole profile), and
 * slow ones still fan out; the engine hands jobs still waiting to another thread every few
 * milliseconds (pgjobq__pool_help), so that one slow job cannot hold back the rest.
 *
 * A job that ended goes back through the pool's mailbox (pgjobq__pool), under its own lock, and the
 * wakeup the engine registered is called only when the mailbox was empty: the engine takes the whole
 * list when it wakes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

/* Handlers faster than this on average run a batch on one thread, without waking helpers. */
#define FAST_HANDLER_NS 50000

/* ------------------------------------------------------------------------------------------------ */
/* The handler's context                                                                             */

const pgjobq_job *pgjobq_ctx_job(const pgjobq_ctx *ctx)
{
    return &ctx->job;
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
           pgjobq__mono_ms() >= atomic_load(&((pgjobq_ctx *)ctx)->timeout_at_ms);
}

pgjobq_stop_reason pgjobq_ctx_stop_reason(const pgjobq_ctx *ctx)
{
    int s = atomic_load(&((pgjobq_ctx *)ctx)->stop);
    if (s == PGJOBQ_STOP_NONE && pgjobq__mono_ms() >= atomic_load(&((pgjobq_ctx *)ctx)->timeout_at_ms))
        return PGJOBQ_STOP_TIMEOUT;
    return (pgjobq_stop_reason)s;
}

int64_t pgjobq_ctx_time_left_ms(const pgjobq_ctx *ctx)
{
    int64_t left = atomic_load(&((pgjobq_ctx *)ctx)->timeout_at_ms) - pgjobq__mono_ms();
    return left > 0 ? left : 0;
}

int pgjobq_ctx_set_progress(pgjobq_ctx *ctx, const char *json)
{
    size_t len;
    char *copy;

    if (ctx == NULL || json == NULL || (len = strlen(json)) > PGJOBQ_PROGRESS_MAX ||
        pgjobq__json_check(json, len, NULL, 0) != 0)
        return PGJOBQ_EINVAL;
    if ((copy = strdup(json)) == NULL)
        return PGJOBQ_ENOMEM;
    free(atomic_exchange(&ctx->progress, copy)); /* a value the engine has not taken yet is replaced */
    pgjobq__pool *pool = ctx->q->pool;
    if (!atomic_exchange(&pool->progress_set, 1))
        pool->wake(pool->wake_arg); /* once until the engine takes them */
    return PGJOBQ_OK;
}

void pgjobq__ctx_free(pgjobq_ctx *ctx)
{
    if (ctx == NULL)
        return;
    if (ctx->lent)
        pgjobq__pool_give_back(ctx->q->pool, ctx->lent);
    pgjobq__ctx_steps_forget(ctx);
    free(atomic_load(&ctx->progress));
    free(ctx->result);
    free(ctx->error);
    free(ctx);
}

void pgjobq__ctx_stop(pgjobq_ctx *ctx, pgjobq_stop_reason why)
{
    int none = PGJOBQ_STOP_NONE;
    atomic_compare_exchange_strong(&ctx->stop, &none, (int)why);
}

/* ------------------------------------------------------------------------------------------------ */
/* Threads                                                                                           */

/* Hands ended jobs back (first..last, linked by next): into the mailbox, waking the engine when it was
 * empty (one lock and at most one wakeup per call; the engine drains the whole list when it wakes). */
static void post_list(pgjobq__pool *pool, pgjobq_ctx *first, pgjobq_ctx *last)
{
    int was_empty;

    pthread_mutex_lock(&pool->mu);
    was_empty = pool->done == NULL;
    last->next = pool->done;
    pool->done = first;
    pthread_mutex_unlock(&pool->mu);
    if (was_empty)
        pool->wake(pool->wake_arg);
}

static void post(pgjobq__pool *pool, pgjobq_ctx *ctx)
{
    post_list(pool, ctx, ctx);
}

static const pgjobq__handler *find_handler(const pgjobq__queue *q, const char *kind)
{
    const pgjobq__handler *any = NULL;
    for (int i = 0; i < q->nhandlers; i++) {
        if (q->handlers[i].kind[0] == '\0')
            any = &q->handlers[i];
        else if (strcmp(q->handlers[i].kind, kind) == 0)
            return &q->handlers[i];
    }
    return any;
}

/* A moving average of handler times: the first measurement replaces the guess (racy updates only
 * blur it). */
static void average(_Atomic int64_t *avg, int64_t handled, int64_t ns)
{
    int64_t a = atomic_load(avg);
    atomic_store(avg, handled == 0 ? ns : a + (ns - a) / 8);
}

/* Runs one job's handler (or explains why it did not run) and hands the job back to the engine (or,
 * when the handler returns PENDING, leaves that to pgjobq_ctx_finish).  Returns 1 when the job ended
 * here: its slot is then the calling thread's to give back (under the lock it takes next anyway). */
static int run_one(pgjobq__queue *q, pgjobq_ctx *ctx)
{
    const pgjobq__handler *h = find_handler(q, ctx->job.kind);

    if (atomic_load(&ctx->stop) != PGJOBQ_STOP_NONE) {
        /* Told to stop before it started (shutdown or a lost lease): nothing ran. */
        ctx->outcome = PGJOBQ_OUTCOME_RETRY;
        pgjobq_ctx_set_error(ctx, "not started: the worker was stopping");
    } else if (h == NULL) {
        char why[512];
        snprintf(why, sizeof why, "no handler for kind %s in queue %s on worker %s", ctx->job.kind, q->name,
                 q->pool->worker_id);
        ctx->outcome = PGJOBQ_OUTCOME_FAIL;
        pgjobq_ctx_set_error(ctx, why);
    } else {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        ctx->started_ms = (int64_t)t0.tv_sec * 1000 + t0.tv_nsec / 1000000;
        int64_t started_ns = (int64_t)t0.tv_sec * 1000000000 + t0.tv_nsec;
        ctx->started_ns = started_ns;
        atomic_store(&ctx->timeout_at_ms, ctx->started_ms + q->timeout_ms);
        atomic_store(&ctx->pending, 1); /* so that a finish from another thread during the call counts */
        pgjobq_outcome out = h->fn(ctx, h->arg);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        int64_t ns = (int64_t)t1.tv_sec * 1000000000 + t1.tv_nsec - started_ns;
        average(&q->busy_ns, atomic_load(&q->handled), ns);
        /* PENDING: ctx belongs to whoever finishes it, and may be gone already.  Otherwise the handler
         * ended the job here, unless it (wrongly) also finished it. */
        int was = 1;
        if (out == PGJOBQ_OUTCOME_PENDING || !atomic_compare_exchange_strong(&ctx->pending, &was, 0))
            return 0;
        ctx->outcome = out;
        average(&q->handler_ns, atomic_load(&q->handled), ns);
        atomic_fetch_add(&q->handled, 1);
    }
    post(q->pool, ctx);
    return 1;
}

/* Under q->mu: wakes a sleeping thread for the jobs waiting when a slot is free for one, unless a
 * thread signalled before has not run yet (it takes every job the free slots allow, one after
 * another).  A thread that is not sleeping looks for work itself before it sleeps. */
static void wake_one(pgjobq__queue *q)
{
    if (q->head && q->active < q->concurrency && q->sleeping > 0 && !q->signalled) {
        q->signalled = 1;
        pthread_cond_signal(&q->cv);
    }
}

/* Under q->mu: takes the first job waiting, and a slot for it. */
static pgjobq_ctx *take_job(pgjobq__queue *q)
{
    pgjobq_ctx *ctx = q->head;
    q->head = ctx->next;
    if (q->head == NULL)
        q->tail = NULL;
    ctx->next = NULL;
    q->active++;
    return ctx;
}

/* Gives back `freed` slots of q, waking a thread for the jobs waiting. */
static void give_slots(pgjobq__queue *q, int freed)
{
    pthread_mutex_lock(&q->mu);
    q->active -= freed;
    wake_one(q);
    pthread_mutex_unlock(&q->mu);
}

/* Gives back `freed` slots of q and runs, on the calling thread, up to *budget of the jobs waiting for
 * them, one after another as a handler thread would (each slot taken before its handler runs); then
 * wakes a thread for what is left. */
static void run_here(pgjobq__queue *q, int freed, size_t *budget)
{
    pthread_mutex_lock(&q->mu);
    q->active -= freed;
    while (*budget > 0 && q->head && q->active < q->concurrency) {
        pgjobq_ctx *ctx = take_job(q);
        (*budget)--;
        pthread_mutex_unlock(&q->mu);
        int holding = run_one(q, ctx);
        pthread_mutex_lock(&q->mu);
        q->active -= holding;
    }
    wake_one(q);
    pthread_mutex_unlock(&q->mu);
}

/* Hands the ended jobs of one queue (first..last) to the engine, then their slots to the jobs waiting:
 * on this thread while *budget lasts (budget not NULL), else by waking a handler thread. */
static void release(pgjobq__queue *q, int freed, pgjobq_ctx *first, pgjobq_ctx *last, size_t *budget)
{
    post_list(q->pool, first, last);
    if (budget)
        run_here(q, freed, budget);
    else
        give_slots(q, freed);
}

static void finish_many(pgjobq_ctx *const *ctx, const pgjobq_outcome *outcome, size_t n, size_t *budget)
{
    struct timespec t1;
    pgjobq__queue *q = NULL;        /* the queue of the jobs being gathered */
    int freed = 0;
    pgjobq_ctx *first = NULL, *last = NULL; /* its ended jobs */

    clock_gettime(CLOCK_MONOTONIC, &t1);
    int64_t now_ns = (int64_t)t1.tv_sec * 1000000000 + t1.tv_nsec;
    for (size_t i = 0; i < n; i++) {
        pgjobq_ctx *c = ctx[i];
        int was = 1;
        if (c == NULL || outcome[i] == PGJOBQ_OUTCOME_PENDING || !atomic_compare_exchange_strong(&c->pending, &was, 0))
            continue;
        if (c->q != q) { /* the jobs of one queue in one post, and its slots under one lock */
            if (q)
                release(q, freed, first, last, budget);
            q = c->q;
            freed = 0;
            first = NULL;
        }
        average(&q->handler_ns, atomic_load(&q->handled), now_ns - c->started_ns);
        atomic_fetch_add(&q->handled, 1);
        c->outcome = outcome[i];
        freed++;
        c->next = NULL;
        if (first == NULL)
            first = c;
        else
            last->next = c;
        last = c;
    }
    if (q)
        release(q, freed, first, last, budget);
}

void pgjobq_ctx_finish_many(pgjobq_ctx *const *ctx, const pgjobq_outcome *outcome, size_t n)
{
    finish_many(ctx, outcome, n, NULL);
}

size_t pgjobq_ctx_finish_many_and_run(pgjobq_ctx *const *ctx, const pgjobq_outcome *outcome, size_t n,
                                      size_t max_run)
{
    size_t budget = max_run;
    finish_many(ctx, outcome, n, &budget);
    return max_run - budget;
}

void pgjobq_ctx_finish(pgjobq_ctx *ctx, pgjobq_outcome outcome)
{
    finish_many(&ctx, &outcome, 1, NULL);
}

static void *queue_thread(void *arg)
{
    pgjobq__queue *q = arg;
    int holding = 0; /* the slot of the job this thread ended last, given back under the next lock */

    for (;;) {
        pgjobq_ctx *ctx;

        pthread_mutex_lock(&q->mu);
        q->active -= holding;
        /* A job for each slot: a handler that returned PENDING still holds its slot (its finish gives
         * it back, and wakes a thread).  This thread takes the next job itself: waking another would
         * only hand the work over. */
        while ((q->head == NULL || q->active >= q->concurrency) && !q->exit_threads) {
            q->sleeping++;
            pthread_cond_wait(&q->cv, &q->mu);
            q->sleeping--;
            q->signalled = 0;
        }
        if (q->head == NULL) {
            pthread_mutex_unlock(&q->mu);
            return NULL;
        }
        ctx = take_job(q);
        if (q->head && atomic_load(&q->busy_ns) > FAST_HANDLER_NS)
            wake_one(q); /* more work for slow handlers: wake a thread to share it */
        pthread_mutex_unlock(&q->mu);
        holding = run_one(q, ctx);
    }
}

int pgjobq__pool_init(pgjobq__pool *pool, const char *worker_id, void (*wake)(void *arg), void *wake_arg)
{
    int e;

    pool->worker_id = worker_id;
    pool->wake = wake;
    pool->wake_arg = wake_arg;
    pool->done = NULL;
    pool->idle = NULL;
    pool->nidle = pool->capidle = 0;
    atomic_store(&pool->progress_set, 0);
    if ((e = pthread_mutex_init(&pool->mu, NULL)) != 0)
        return e;
    if ((e = pthread_mutex_init(&pool->lend_mu, NULL)) != 0)
        pthread_mutex_destroy(&pool->mu);
    return e;
}

void pgjobq__pool_destroy(pgjobq__pool *pool)
{
    for (size_t i = 0; i < pool->nidle; i++)
        pgjobq_client_close(pool->idle[i]);
    free(pool->idle);
    pool->idle = NULL;
    pool->nidle = pool->capidle = 0;
    pthread_mutex_destroy(&pool->lend_mu);
    pthread_mutex_destroy(&pool->mu);
}

/* ------------------------------------------------------------------------------------------------ */
/* Connections lent to jobs (steps.c)                                                                */

int pgjobq__pool_lend(pgjobq__pool *pool, pgjobq_client **out, char *errbuf, size_t errsize)
{
    pgjobq_client *c = NULL;
    int rc;

    pthread_mutex_lock(&pool->lend_mu);
    if (pool->nidle > 0)
        c = pool->idle[--pool->nidle];
    pthread_mutex_unlock(&pool->lend_mu);
    if (c) {
        *out = c;
        return PGJOBQ_OK;
    }
    /* Connecting happens outside the lock: another job's connection is not held up by this one. */
    rc = pgjobq__client_open_timeout(&c, pool->conninfo, pool->tcp_timeout_ms);
    if (rc != PGJOBQ_OK) {
        snprintf(errbuf, errsize, "cannot open the connection lent to the job: %s",
                 c ? pgjobq_errmsg(c) : pgjobq_strerror(rc));
        pgjobq_client_close(c);
        return rc;
    }
    *out = c;
    return PGJOBQ_OK;
}

void pgjobq__pool_give_back(pgjobq__pool *pool, pgjobq_client *c)
{
    if (c == NULL)
        return;
    /* A connection left in a transaction (a handler that returned from inside one), or broken, is not
     * given to the next job: closing it rolls its transaction back. */
    if (PQstatus(c->conn) != CONNECTION_OK || PQtransactionStatus(c->conn) != PQTRANS_IDLE) {
        pgjobq_client_close(c);
        return;
    }
    pthread_mutex_lock(&pool->lend_mu);
    if (pool->nidle == pool->capidle) {
        size_t cap = pool->capidle ? pool->capidle * 2 : 8;
        pgjobq_client **p = realloc(pool->idle, cap * sizeof *p);
        if (p == NULL) {
            pthread_mutex_unlock(&pool->lend_mu);
            pgjobq_client_close(c);
            return;
        }
        pool->idle = p;
        pool->capidle = cap;
    }
    pool->idle[pool->nidle++] = c;
    pthread_mutex_unlock(&pool->lend_mu);
}

pgjobq_ctx *pgjobq__pool_collect(pgjobq__pool *pool)
{
    pgjobq_ctx *list;

    pthread_mutex_lock(&pool->mu);
    list = pool->done;
    pool->done = NULL;
    pthread_mutex_unlock(&pool->mu);
    return list;
}

int pgjobq__pool_start(pgjobq__pool *pool, pgjobq__queue *queues, int nqueues, char *err, size_t err_size)
{
    for (int i = 0; i < nqueues; i++) {
        pgjobq__queue *q = &queues[i];
        q->pool = pool;
        atomic_store(&q->handler_ns, INT64_C(1000000)); /* unknown: assume slow until measured */
        atomic_store(&q->busy_ns, INT64_C(1000000));
        q->threads = calloc((size_t)q->concurrency, sizeof *q->threads);
        if (q->threads == NULL) {
            snprintf(err, err_size, "out of memory starting threads");
            return PGJOBQ_ENOMEM;
        }
        for (int t = 0; t < q->concurrency; t++) {
            int rc = pthread_create(&q->threads[t], NULL, queue_thread, q);
            if (rc != 0) {
                snprintf(err, err_size, "cannot start thread %d of queue %s: %s", t, q->name, strerror(rc));
                return PGJOBQ_ENOMEM;
            }
            q->nthreads++;
        }
    }
    return PGJOBQ_OK;
}

void pgjobq__pool_stop(pgjobq__queue *queues, int nqueues)
{
    for (int i = 0; i < nqueues; i++) {
        pgjobq__queue *q = &queues[i];
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

void pgjobq__pool_dispatch(pgjobq__queue *q, pgjobq_ctx *first, pgjobq_ctx *last)
{
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = first;
    else
        q->head = first;
    q->tail = last;
    wake_one(q);
    pthread_mutex_unlock(&q->mu);
}

pgjobq_ctx *pgjobq__pool_take_waiting(pgjobq__queue *q)
{
    pgjobq_ctx *list;
    pthread_mutex_lock(&q->mu);
    list = q->head;
    q->head = q->tail = NULL;
    pthread_mutex_unlock(&q->mu);
    return list;
}

int pgjobq__pool_help(pgjobq__queue *queues, int nqueues)
{
    int waiting = 0;
    for (int i = 0; i < nqueues; i++) {
        pgjobq__queue *q = &queues[i];
        pthread_mutex_lock(&q->mu);
        if (q->head) {
            waiting = 1;
            wake_one(q);
        }
        pthread_mutex_unlock(&q->mu);
    }
    return waiting;
}
