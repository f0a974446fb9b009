/*
 * worker.c - the worker's engine: pgjobq_worker_run and the loop that owns its three connections
 * (its public functions are in worker_api.c, its statements in worker_sql.c).
 *
 * The engine (the thread in pgjobq_worker_run) is the only one that talks to the database.  Its loop
 * is a list of phases, each a function:
 *
 *   stop       stop requests; past the shutdown timeout, handlers are asked to stop
 *   collect    outcomes from the handler threads become pending writes; their slots are free again
 *   connect    connections that are down and due for a retry start connecting
 *   write      on the write connection, when idle: a heartbeat when due, else the pending outcomes
 *   claim      on the claim connection, when idle: a listener check, a claim, or a next-due query
 *   maintain   on the maintenance connection, when idle: rescue expired leases, tick schedules,
 *              prune history
 *   deadlines  job timeouts; leases that can no longer be known valid are given up
 *   poll       sleep until a socket, a handler or the next timer wants attention; read results
 *
 * Every statement is sent without blocking and one connection carries one statement at a time, so
 * the claim of the next batch runs while the last batch's outcomes are written, outcomes that arrive
 * during a write form the next batch, and a heartbeat never waits behind a blocking call.
 *
 * Time: the engine keeps, per running job, a local monotonic deadline before which its lease is known
 * to be valid: the moment the claim (or the last successful heartbeat) was *sent*, plus the lease.
 * The database set the lease from a later now(), so the estimate is conservative.  A job whose
 * deadline approaches without a renewal is treated as lost: its handler is told to stop and its
 * outcome is not written.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "engine.h"

#define RESCUE_EVERY_MS 1000
/* A rescue looks at the leases that ended since a little before the previous one (RESCUE_MARGIN_US),
 * and at every expired lease at its first run and then this often: that pass reads every lease the
 * index still holds, which while a snapshot is held open is every job claimed since (7 s after ten
 * minutes at 15,000 jobs/s), and only finds a lease whose claim took longer than the margin. */
#define RESCUE_FULL_EVERY_MS 3600000
#define RESCUE_MARGIN_US INT64_C(2000000)
#define TICK_EVERY_MS 1000
/* How often the worker that maintains looks at what holds vacuum back (pgjobq.health()), and from what
 * age of the oldest snapshot it says so in its log. */
#define HEALTH_EVERY_MS 60000
#ifndef HORIZON_WARN_S /* -DHORIZON_WARN_S=1 to see the warning by hand */
#define HORIZON_WARN_S 300
#endif
/* A storm of failing attempts stays readable: at most this many lines about retried attempts per
 * window, then one line saying how many more there were.  A job that failed for good is always
 * logged. */
#define FAIL_LOG_MAX 10
#define FAIL_LOG_WINDOW_MS 10000
/* pgjobq.workers: a worker unseen for three beats is not alive; while its id is in use by another live
 * worker, a worker asks again every BEAT_RETRY_MS. */
#define BEAT_EVERY_MS PGJOBQ__BEAT_MS
#define BEAT_RETRY_MS 1000
/* A worker's first prune and first look at health() come FIRST_PRUNE_MS after its start, spread at
 * random over the next FIRST_SPREAD_MS: workers started together (a deploy of 40) would otherwise run
 * them all in the same instant, each in a new session, where a first prune costs the server about
 * 110 ms (bench/README.md, "What an enqueue costs"). */
#define FIRST_PRUNE_MS 5000
#define FIRST_SPREAD_MS 10000
#define PRUNE_EVERY_MS 60000
#define LISTEN_CHECK_MS 10000
#define DOWN_WARN_EVERY_MS 30000 /* a connection that cannot connect says so at most this often */
#define SUMMARY_EVERY_MS 60000
/* Outcomes wait at most this long for more to join their batch (unless no handler still runs). */
#define FLUSH_AFTER_MS 2
/* Progress is written at most this often (and before outcomes that wait). */
#define PROGRESS_EVERY_MS 250
/* Jobs left waiting on a list are handed to another thread this often. */
#define HELP_AFTER_MS 2
/* Rescue and prune work in batches of this many jobs (a full batch: run again at once). */
#define MAINTENANCE_BATCH 1000

/* A snoozed job's delay, at most: 100 years, as every delay the library takes. */
#define SNOOZE_DELAY_MAX_MS INT64_C(3155760000000)

/* The statement a connection carries, and what the engine must remember about it. */
enum { R_NONE, R_CLAIM, R_HAND_ON, R_LISTEN_CHECK, R_LISTEN, R_WRITE, R_HEARTBEAT, R_BEAT, R_PROGRESS, R_RESCUE, R_PRUNE,
       R_TICK, R_HEALTH };

/* ------------------------------------------------------------------------------------------------ */
/* Small helpers                                                                                     */

static void wlog(pgjobq_worker *w, pgjobq_log_level level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void wlog(pgjobq_worker *w, pgjobq_log_level level, const char *fmt, ...)
{
    char line[1024];
    va_list ap;

    if (w->o.log_fn == NULL || (int)level < w->o.log_level)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    w->o.log_fn(w->o.log_arg, level, line);
}

/* Makes room for n jobs in b: 0, or -1 when out of memory (b unchanged). */
static int batch_reserve(pgjobq__batch *b, size_t n)
{
    size_t cap = b->cap ? b->cap : 64;
    pgjobq_ctx **p;

    if (n <= b->cap)
        return 0;
    while (cap < n)
        cap *= 2;
    if ((p = realloc(b->items, cap * sizeof *p)) == NULL)
        return -1;
    b->items = p;
    b->cap = cap;
    return 0;
}

static int batch_add(pgjobq__batch *b, pgjobq_ctx *ctx)
{
    if (batch_reserve(b, b->n + 1) != 0)
        return -1;
    b->items[b->n++] = ctx;
    return 0;
}

/* Moves the first n jobs of `from` into the empty `to`, which has room for them (batch_reserve):
 * the whole batch by swapping the arrays. */
static void batch_move_front(pgjobq__batch *from, size_t n, pgjobq__batch *to)
{
    if (n == from->n) {
        pgjobq__batch spare = *to;
        *to = *from;
        *from = spare;
        from->n = 0;
        return;
    }
    memcpy(to->items, from->items, n * sizeof *to->items);
    to->n = n;
    memmove(from->items, from->items + n, (from->n - n) * sizeof *from->items);
    from->n -= n;
}

/* The pool's wakeup: a job arrived in its empty mailbox. */
static void pool_wake(void *arg)
{
    pgjobq__worker_wake(arg);
}

/* How long a connection of the worker waits for an unanswered network before giving up: well inside
 * the lease, so that a half-open partition turns into a connection error, and the jobs into lost
 * ones, before another worker can take them. */
static int64_t tcp_timeout(const pgjobq_worker *w)
{
    int64_t t = w->o.lease_ms / 3;
    return t < 1000 ? 1000 : t;
}

/* ------------------------------------------------------------------------------------------------ */
/* The running set and the handlers' outcomes                                                        */

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
    ctx->run_index = w->nrunning;
    w->running[w->nrunning++] = ctx;
    atomic_store(&w->st_running, (int64_t)w->nrunning);
    return 0;
}

/* Removes a job from the running set and frees it. */
static void running_drop(pgjobq_worker *w, pgjobq_ctx *ctx)
{
    size_t i = ctx->run_index;
    if (ctx->unwritten)
        ctx->q->claim.unwritten--;
    if (i < w->nrunning && w->running[i] == ctx) {
        w->running[i] = w->running[--w->nrunning];
        w->running[i]->run_index = i;
    }
    atomic_store(&w->st_running, (int64_t)w->nrunning);
    pgjobq__ctx_free(ctx);
}

static pgjobq_ctx *running_find(pgjobq_worker *w, int64_t id)
{
    for (size_t i = 0; i < w->nrunning; i++)
        if (w->running[i]->job.id == id)
            return w->running[i];
    return NULL;
}

/* A snoozed job goes back with a reason (the handler's, else one saying who handed it back) and a
 * delay of at most 100 years (now() + more would be out of the jobs table's range). */
static int snooze_prepare(pgjobq_worker *w, pgjobq_ctx *ctx)
{
    if (ctx->error == NULL) {
        char why[320];
        snprintf(why, sizeof why, "handed back by its handler on worker %s", w->worker_id);
        pgjobq_ctx_set_error(ctx, why);
    }
    if (ctx->retry_delay_ms > SNOOZE_DELAY_MAX_MS)
        ctx->retry_delay_ms = SNOOZE_DELAY_MAX_MS;
    return PGJOBQ__W_SNOOZE;
}

/* Queues a job's outcome for writing (or drops the job when there is nothing to write). */
static void pend(pgjobq_worker *w, pgjobq_ctx *ctx, int64_t now)
{
    int kind;

    if (atomic_load(&ctx->parked) || (ctx->outcome == PGJOBQ_OUTCOME_PARKED && !ctx->ended)) {
        /* A sleep or a wait parked it (steps.c, or the handler's own connection: an --exec handler's
         * `pgjobq sleep`): the database ended this attempt already. */
        atomic_fetch_add(&w->st_parked, 1);
        running_drop(w, ctx);
        return;
    }
    if (ctx->ended || ctx->outcome == PGJOBQ_OUTCOME_DONE) {
        /* Lost, cancelled in the database already, or ended by its handler: nothing to write. */
        if (ctx->outcome == PGJOBQ_OUTCOME_DONE && !ctx->ended)
            atomic_fetch_add(&w->st_completed, 1);
        running_drop(w, ctx);
        return;
    }
    if (atomic_load(&ctx->stop) == PGJOBQ_STOP_SHUTDOWN && ctx->outcome != PGJOBQ_OUTCOME_COMPLETE)
        kind = PGJOBQ__W_RELEASE;
    else if (ctx->outcome == PGJOBQ_OUTCOME_COMPLETE)
        kind = PGJOBQ__W_COMPLETE;
    else if (ctx->outcome == PGJOBQ_OUTCOME_CANCEL)
        kind = PGJOBQ__W_CANCEL;
    else if (ctx->outcome == PGJOBQ_OUTCOME_SNOOZE || ctx->outcome == PGJOBQ_OUTCOME_HAND_BACK)
        kind = snooze_prepare(w, ctx);
    else
        kind = PGJOBQ__W_FAIL;
    if (ctx->outcome == PGJOBQ_OUTCOME_RETRY && ctx->error == NULL &&
        pgjobq_ctx_stop_reason(ctx) == PGJOBQ_STOP_TIMEOUT) {
        char why[96];
        snprintf(why, sizeof why, "timed out after %lld ms", (long long)w->o.timeout_ms);
        pgjobq_ctx_set_error(ctx, why);
    }
    if (ctx->outcome == PGJOBQ_OUTCOME_HAND_BACK && kind == PGJOBQ__W_SNOOZE) {
        /* Not run here (a kind this worker does not know, a handler that could not start): when it is
         * due again, let another worker claim it first (claim_done), until a poll after then (the
         * delay when the handler gave one, else a minute: the backoff's, roughly). */
        int64_t delay = ctx->retry_delay_ms >= 0 ? ctx->retry_delay_ms : 60000;
        int64_t until = now + delay + 2 * w->o.poll_ms;
        if (until > ctx->q->claim.yield_until_ms)
            ctx->q->claim.yield_until_ms = until;
    }
    if (batch_add(&w->pending[kind], ctx) != 0) {
        wlog(w, PGJOBQ_LOG_ERROR, "out of memory recording job %lld; its lease will expire",
             (long long)ctx->job.id);
        running_drop(w, ctx);
        return;
    }
    if (!ctx->unwritten) {
        ctx->unwritten = 1;
        ctx->q->claim.unwritten++;
    }
    if (w->first_pending_ms == 0)
        w->first_pending_ms = now;
}

/* Puts the jobs of a write that did not happen back at the front of their pending list, in their
 * order (so that the parts of a refused batch stay in place: pgjobq__split). */
static void requeue_front(pgjobq_worker *w, pgjobq__request *rq, int64_t now)
{
    pgjobq__batch *b = &w->pending[rq->wkind];
    size_t n = rq->items.n;

    rq->items.n = 0;
    if (batch_reserve(b, b->n + n) != 0) {
        wlog(w, PGJOBQ_LOG_ERROR, "out of memory keeping %zu outcomes; their leases will expire", n);
        for (size_t i = 0; i < n; i++)
            running_drop(w, rq->items.items[i]);
        return;
    }
    memmove(b->items + n, b->items, b->n * sizeof *b->items);
    memcpy(b->items, rq->items.items, n * sizeof *b->items);
    b->n += n;
    if (w->first_pending_ms == 0)
        w->first_pending_ms = now;
}

/* Logs an attempt that failed (retried: rate-limited; failed for good: always), with its error. */
static void log_failed_attempt(pgjobq_worker *w, const pgjobq__batch *items, int64_t id, int for_good)
{
    const pgjobq_ctx *ctx = NULL;
    int64_t now = pgjobq__mono_ms();

    if (now - w->faillog_window_ms >= FAIL_LOG_WINDOW_MS) {
        if (w->faillog_dropped > 0)
            wlog(w, PGJOBQ_LOG_WARN, "%lld more retried attempts in the last %d s were not logged",
                 (long long)w->faillog_dropped, FAIL_LOG_WINDOW_MS / 1000);
        w->faillog_window_ms = now;
        w->faillog_lines = 0;
        w->faillog_dropped = 0;
    }
    if (!for_good && w->faillog_lines >= FAIL_LOG_MAX) {
        w->faillog_dropped++;
        return;
    }
    if (!for_good)
        w->faillog_lines++;
    for (size_t i = 0; i < items->n && ctx == NULL; i++)
        if (items->items[i]->job.id == id)
            ctx = items->items[i];
    if (ctx == NULL)
        return;
    wlog(w, PGJOBQ_LOG_WARN, "job %lld (%s/%s) attempt %d of %d %s: %.600s", (long long)id, ctx->job.queue,
         ctx->job.kind, ctx->job.attempt, ctx->job.max_attempts, for_good ? "failed for good" : "failed, will retry",
         ctx->error ? ctx->error : "(no error given)");
}

static size_t pending_count(const pgjobq_worker *w)
{
    size_t n = 0;
    for (int k = 0; k < PGJOBQ__W_KINDS; k++)
        n += w->pending[k].n;
    return n;
}

/* Jobs handed to handlers and not yet returned, over all queues. */
static int outstanding(const pgjobq_worker *w)
{
    int n = 0;
    for (int i = 0; i < w->nqueues; i++)
        n += w->queues[i].claim.running;
    return n;
}

/* ------------------------------------------------------------------------------------------------ */
/* Phase: stop                                                                                       */

static void phase_stop(pgjobq_worker *w, int64_t now)
{
    int requests = atomic_load(&w->stop_requests);

    /* Stopping: claim nothing more; after the shutdown timeout (or at once on a second stop), ask the
     * remaining handlers to stop, and hand their jobs back. */
    if (requests > 0 && !w->stopping) {
        size_t waiting = 0;
        w->stopping = 1;
        w->shutdown_at_ms = w->o.shutdown_timeout_ms < 0 ? INT64_MAX : now + w->o.shutdown_timeout_ms;
        /* Jobs claimed ahead that no handler has started go back at once: another worker can run them. */
        for (int i = 0; i < w->nqueues; i++) {
            pgjobq_ctx *ctx = pgjobq__pool_take_waiting(&w->queues[i]);
            while (ctx) {
                pgjobq_ctx *next = ctx->next;
                ctx->next = NULL;
                ctx->q->claim.running--;
                pgjobq__ctx_stop(ctx, PGJOBQ_STOP_SHUTDOWN);
                ctx->outcome = PGJOBQ_OUTCOME_RETRY;
                pend(w, ctx, now);
                waiting++;
                ctx = next;
            }
        }
        char upto[48] = "as long as they take";
        if (w->o.shutdown_timeout_ms >= 0)
            snprintf(upto, sizeof upto, "up to %lld ms", (long long)w->o.shutdown_timeout_ms);
        wlog(w, PGJOBQ_LOG_INFO,
             "stopping: %zu jobs still running, %zu not started handed back; waiting %s for the running ones (a "
             "second stop request hands them back at once)",
             w->nrunning - waiting, waiting, upto);
    }
    if (w->stopping && (requests > 1 || now >= w->shutdown_at_ms)) {
        for (size_t i = 0; i < w->nrunning; i++)
            if (!w->running[i]->ended && atomic_load(&w->running[i]->stop) != PGJOBQ_STOP_SHUTDOWN) {
                pgjobq__ctx_stop(w->running[i], PGJOBQ_STOP_SHUTDOWN);
                w->handed_back = requests > 1 && now < w->shutdown_at_ms ? 2 : 1;
            }
    }
}

/* With opts.burst: once nothing the worker serves is due, it stops as on a stop request.  Nothing is
 * due when each queue's last claim, sent while the worker held no job (so every outcome it had was
 * written first: a retry due now, a child released by its parent, were visible), found none. */
static void phase_burst(pgjobq_worker *w)
{
    if (!w->o.burst || w->stopping || w->nrunning > 0 || pending_count(w) > 0)
        return;
    for (int i = 0; i < w->nqueues; i++)
        if (!w->queues[i].drained)
            return;
    wlog(w, PGJOBQ_LOG_INFO, "burst: nothing due is left in the queues served; stopping");
    atomic_fetch_add(&w->stop_requests, 1);
}

/* ------------------------------------------------------------------------------------------------ */
/* Phase: health (pgjobq_worker_set_unhealthy)                                                        */

/* Claims stop while the worker is unhealthy and resume (every queue looked at now) when it is not,
 * each change said once in the log; the registry hears of a change at once (a beat now). */
static void phase_health(pgjobq_worker *w, int64_t now)
{
    int held = atomic_load(&w->unhealthy);

    if (atomic_load(&w->problem_changed))
        w->next_beat_ms = now;
    if (held == w->claims_held)
        return;
    w->claims_held = held;
    if (held) {
        char problem[PROBLEM_MAX + 1];
        pgjobq__worker_problem(w, problem, sizeof problem);
        wlog(w, PGJOBQ_LOG_WARN, "unhealthy: claiming nothing until it is over (%.*s)", (int)strcspn(problem, "\n"),
             problem);
        return;
    }
    wlog(w, PGJOBQ_LOG_INFO, "healthy again: claiming");
    for (int i = 0; i < w->nqueues; i++)
        w->queues[i].claim.woken = 1;
}

/* ------------------------------------------------------------------------------------------------ */
/* Phase: collect                                                                                    */

static void phase_collect(pgjobq_worker *w, int64_t now)
{
    pgjobq_ctx *list = pgjobq__pool_collect(&w->pool);

    while (list) {
        pgjobq_ctx *ctx = list;
        list = ctx->next;
        ctx->next = NULL;
        ctx->q->claim.running--;
        pend(w, ctx, now);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Phase: write (outcomes and heartbeats, on the write connection)                                   */

/* Sends statement s of the table on the connection that prepared it.  0, or -1 after the connection
 * broke (pgjobq__aconn_send). */
static int send_stmt(pgjobq_worker *w, int s, const char *const *values, const int *lengths, const int *formats,
                     int binary_result, int64_t now)
{
    int c = 0;
    while (s >= pgjobq__worker_conn_stmts[c].first + pgjobq__worker_conn_stmts[c].n) /* the table's ranges */
        c++;
    return pgjobq__aconn_send(&w->conn[c], s - pgjobq__worker_conn_stmts[c].first, values, lengths, formats, binary_result, now);
}

/* Sends the outcomes of one kind pending first (all of them, or the next part of a refused batch,
 * pgjobq__split_take); they move into the request. */
static void send_write(pgjobq_worker *w, int kind, int64_t now)
{
    pgjobq__request *rq = &w->req[PGJOBQ__C_WRITE];
    pgjobq__batch *b = &w->pending[kind];
    size_t n = pgjobq__split_take(&w->split[kind], b->n);
    pgjobq__array a[5];
    const char *values[5] = {NULL};
    int lengths[5] = {0}, formats[5] = {1, 1, 1, 1, 1}, nparams = pgjobq__worker_stmts[PGJOBQ__WRITE_STMT(kind)].nparams;
    char reason[300];

    if (batch_reserve(&rq->items, n) != 0) {
        wlog(w, PGJOBQ_LOG_ERROR, "out of memory writing %zu outcomes; retrying", n);
        pgjobq__split_requeued(&w->split[kind], n);
        return;
    }
    memset(a, 0, sizeof a);
    pgjobq__array_begin(&a[0], OID_INT8);
    pgjobq__array_begin(&a[1], OID_INT8);
    for (size_t i = 0; i < n; i++) {
        pgjobq__array_int8(&a[0], b->items[i]->job.id);
        pgjobq__array_int8(&a[1], b->items[i]->job.lease_token);
    }
    switch (kind) {
    case PGJOBQ__W_COMPLETE:
        pgjobq__array_begin(&a[2], OID_JSONB);
        for (size_t i = 0; i < n; i++) {
            if (b->items[i]->result)
                pgjobq__array_jsonb(&a[2], b->items[i]->result, strlen(b->items[i]->result));
            else
                pgjobq__array_null(&a[2]);
        }
        break;
    case PGJOBQ__W_FAIL:
    case PGJOBQ__W_SNOOZE: /* fail_many's shape: ids, tokens, reasons, delays, and its finals or the hand-backs */
        pgjobq__array_begin(&a[2], OID_TEXT);
        pgjobq__array_begin(&a[3], OID_INTERVAL);
        pgjobq__array_begin(&a[4], OID_BOOL);
        for (size_t i = 0; i < n; i++) {
            const pgjobq_ctx *ctx = b->items[i];
            const char *e = ctx->error ? ctx->error : "failed (the handler gave no error text)";
            pgjobq__array_text(&a[2], e, strlen(e));
            if (ctx->retry_delay_ms == PGJOBQ_BACKOFF || ctx->outcome == PGJOBQ_OUTCOME_FAIL)
                pgjobq__array_null(&a[3]);
            else /* the database judges the delay (the job's run_at range); only the product must fit */
                pgjobq__array_interval_us(&a[3], (ctx->retry_delay_ms > INT64_MAX / 1000 ? INT64_MAX / 1000
                                                                                          : ctx->retry_delay_ms) * 1000);
            /* fail_many's: failed for good; snooze_many's: handed back (not counted as a snooze) */
            pgjobq__array_bool(&a[4], ctx->outcome ==
                                          (kind == PGJOBQ__W_FAIL ? PGJOBQ_OUTCOME_FAIL : PGJOBQ_OUTCOME_HAND_BACK));
        }
        break;
    default:
        snprintf(reason, sizeof reason, "%s by worker %s",
                 kind == PGJOBQ__W_RELEASE ? "handed back at shutdown" : "cancelled by its handler", w->worker_id);
        values[2] = reason;
        formats[2] = 0;
        break;
    }
    for (int k = 0; k < nparams; k++) {
        if (values[k])
            continue; /* a text parameter */
        if (pgjobq__array_end(&a[k]) != 0) {
            wlog(w, PGJOBQ_LOG_ERROR, "out of memory writing %zu outcomes; retrying", n);
            pgjobq__split_requeued(&w->split[kind], n);
            goto out;
        }
        values[k] = a[k].buf.data;
        lengths[k] = (int)a[k].buf.len;
    }
    if (send_stmt(w, PGJOBQ__WRITE_STMT(kind), values, lengths, formats, 1, now) != 0) {
        pgjobq__split_requeued(&w->split[kind], n);
        goto out; /* the connection broke: the outcomes stay pending */
    }
    atomic_fetch_add(&w->st_writes, 1);
    rq->kind = R_WRITE;
    rq->wkind = kind;
    rq->sent_ms = now;
    batch_move_front(b, n, &rq->items);
out:
    for (int k = 0; k < 5; k++)
        pgjobq__buf_free(&a[k].buf);
}

/* Renews every running lease of this process in one statement. */
static void send_heartbeat(pgjobq_worker *w, int64_t now)
{
    pgjobq__array ids, tokens;
    const char *values[3];
    int lengths[3] = {0, 0, 0}, formats[3] = {1, 1, 0};
    size_t n = 0;

    w->next_heartbeat_ms = now + w->o.heartbeat_ms;
    pgjobq__array_begin(&ids, OID_INT8);
    pgjobq__array_begin(&tokens, OID_INT8);
    for (size_t i = 0; i < w->nrunning; i++) {
        if (w->running[i]->ended)
            continue;
        pgjobq__array_int8(&ids, w->running[i]->job.id);
        pgjobq__array_int8(&tokens, w->running[i]->job.lease_token);
        n++;
    }
    if (n > 0 && pgjobq__array_end(&ids) == 0 && pgjobq__array_end(&tokens) == 0) {
        values[0] = ids.buf.data;
        lengths[0] = (int)ids.buf.len;
        values[1] = tokens.buf.data;
        lengths[1] = (int)tokens.buf.len;
        values[2] = w->lease_s;
        if (send_stmt(w, PGJOBQ__S_EXTEND, values, lengths, formats, 1, now) == 0) {
            w->req[PGJOBQ__C_WRITE].kind = R_HEARTBEAT;
            w->req[PGJOBQ__C_WRITE].sent_ms = now;
        }
    }
    pgjobq__buf_free(&ids.buf);
    pgjobq__buf_free(&tokens.buf);
}

/* The refusal of a statement, for a job's error or the log: its message and, when it has one, its
 * detail (jsonb says which escape it refused there). */
static void refusal_text(const PGresult *r, char *buf, size_t size)
{
    const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    const char *detail = PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL);

    snprintf(buf, size, "%s%s%s%s", msg ? msg : "refused", detail ? " (" : "", detail ? detail : "",
             detail ? ")" : "");
}

/* Forgets the progress values of the last progress write. */
static void progress_forget(pgjobq_worker *w)
{
    for (size_t i = 0; i < w->nprogress_sent; i++)
        free(w->progress_sent[i].value);
    w->nprogress_sent = 0;
}

/* Writes the progress the handlers set since the last time (the latest value of each job), in one
 * statement, or one job's only after a refused write (progress_refused).  The values are kept until
 * the answer.  Jobs the database already ended just drop theirs. */
static void send_progress(pgjobq_worker *w, int64_t now)
{
    pgjobq__array a[3];
    const char *values[3];
    int lengths[3], formats[3] = {1, 1, 1};
    size_t n = 0, most = w->progress_alone > 0 ? 1 : w->nrunning;
    int failed = 0;

    if (w->nrunning > w->progress_cap) {
        void *p = realloc(w->progress_sent, w->nrunning * sizeof *w->progress_sent);
        if (p == NULL) {
            wlog(w, PGJOBQ_LOG_WARN, "out of memory writing the progress of %zu jobs: later", w->nrunning);
            return;
        }
        w->progress_sent = p;
        w->progress_cap = w->nrunning;
    }
    if (w->progress_alone > 0) {
        w->progress_alone--;
        w->next_progress_ms = now;
    } else {
        w->next_progress_ms = now + PROGRESS_EVERY_MS;
        atomic_store(&w->pool.progress_set, 0); /* before taking them: a value set meanwhile sets it again */
    }
    pgjobq__array_begin(&a[0], OID_INT8);
    pgjobq__array_begin(&a[1], OID_INT8);
    pgjobq__array_begin(&a[2], OID_JSONB);
    for (size_t i = 0; i < w->nrunning && n < most; i++) {
        pgjobq_ctx *ctx = w->running[i];
        char *p = atomic_load(&ctx->progress) ? atomic_exchange(&ctx->progress, NULL) : NULL;
        if (p == NULL)
            continue;
        if (ctx->ended) {
            free(p);
            continue;
        }
        pgjobq__array_int8(&a[0], ctx->job.id);
        pgjobq__array_int8(&a[1], ctx->job.lease_token);
        pgjobq__array_jsonb(&a[2], p, strlen(p));
        w->progress_sent[n].id = ctx->job.id;
        w->progress_sent[n++].value = p;
    }
    w->nprogress_sent = n;
    for (int k = 0; k < 3 && n > 0; k++) {
        if (pgjobq__array_end(&a[k]) != 0) {
            failed = 1;
            break;
        }
        values[k] = a[k].buf.data;
        lengths[k] = (int)a[k].buf.len;
    }
    if (failed)
        wlog(w, PGJOBQ_LOG_WARN, "out of memory writing the progress of %zu jobs: not written", n);
    else if (n > 0 && send_stmt(w, PGJOBQ__S_PROGRESS, values, lengths, formats, 1, now) == 0)
        w->req[PGJOBQ__C_WRITE].kind = R_PROGRESS;
    if (w->req[PGJOBQ__C_WRITE].kind != R_PROGRESS)
        progress_forget(w);
    for (int k = 0; k < 3; k++)
        pgjobq__buf_free(&a[k].buf);
}

/* A progress write refused for its values (pgjobq__refused_by_value): one job's value, most likely,
 * which must not cost the other jobs theirs.  Each value goes back to its job, unless the handler
 * set a newer one meanwhile, and the next writes take one job's value each, until every value of
 * the refused write had its own; a value refused alone is dropped. */
static void progress_refused(pgjobq_worker *w, const PGresult *r)
{
    char why[512];

    refusal_text(r, why, sizeof why);
    if (w->nprogress_sent == 1) {
        wlog(w, PGJOBQ_LOG_WARN, "job %lld: the database refused its progress: %s; not written",
             (long long)w->progress_sent[0].id, why);
        progress_forget(w);
        return;
    }
    wlog(w, PGJOBQ_LOG_INFO, "writing the progress of %zu jobs was refused: %s; writing it job by job",
         w->nprogress_sent, why);
    for (size_t i = 0; i < w->nprogress_sent; i++) {
        pgjobq_ctx *ctx = running_find(w, w->progress_sent[i].id);
        char *none = NULL;
        if (ctx && !ctx->ended && atomic_compare_exchange_strong(&ctx->progress, &none, w->progress_sent[i].value))
            w->progress_sent[i].value = NULL;
    }
    w->progress_alone += w->nprogress_sent;
    progress_forget(w);
    atomic_store(&w->pool.progress_set, 1);
}

/* The answer to a progress write: a job whose lease was lost says so at its heartbeat; a value too
 * large is the handler's mistake, said here. */
static void progress_done(pgjobq_worker *w, PGresult *r)
{
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        if (pgjobq__refused_by_value(PQresultErrorField(r, PG_DIAG_SQLSTATE)) && w->nprogress_sent > 0)
            progress_refused(w, r);
        else {
            wlog(w, PGJOBQ_LOG_WARN, "writing progress failed: %s", PQresultErrorMessage(r));
            progress_forget(w);
        }
        return;
    }
    progress_forget(w);
    for (int row = 0; row < PQntuples(r); row++) {
        size_t len = 0;
        const char *outcome = pgjobq__get_text(r, row, 1, &len);
        if (len == 9 && memcmp(outcome, "too_large", 9) == 0)
            wlog(w, PGJOBQ_LOG_WARN, "job %lld: its progress is over 8 KiB as stored: not written",
                 (long long)pgjobq__get_int8(r, row, 0));
    }
}

/* Says in pgjobq.workers that this worker is alive, and which queues it serves. */
static void send_beat(pgjobq_worker *w, int64_t now)
{
    char problem[PROBLEM_MAX + 1];
    const char *values[7] = {w->worker_id, w->host, w->pid_s, PGJOBQ_VERSION, w->queues_s, w->secret_s, NULL};

    atomic_store(&w->problem_changed, 0);
    pgjobq__worker_problem(w, problem, sizeof problem);
    if (problem[0])
        values[6] = problem;

    w->next_beat_ms = now + (w->id_refused_ms && !w->registered ? BEAT_RETRY_MS : BEAT_EVERY_MS);
    if (w->queues_s[0] == '\0') {
        size_t len = 0;
        for (int i = 0; i < w->nqueues && len < sizeof w->queues_s; i++) {
            int k = snprintf(w->queues_s + len, sizeof w->queues_s - len, "%s%s:%d", i ? "," : "", w->queues[i].name,
                             w->queues[i].concurrency);
            if (k < 0)
                break;
            len += (size_t)k;
        }
    }
    if (send_stmt(w, PGJOBQ__S_BEAT, values, NULL, NULL, 0, now) == 0)
        w->req[PGJOBQ__C_WRITE].kind = R_BEAT;
}

/* A beat's answer.  The registry refuses a beat (55006, object_in_use) when the id is another live
 * worker's: before this worker registered it waits for a row that a worker which stopped without a
 * word left (claiming nothing meanwhile), then gives up; once registered, the id was taken over while
 * this worker went unseen, and it stops.  Any other failure is only logged: the registry is what the
 * dashboard shows, not something the work needs. */
static void beat_done(pgjobq_worker *w, PGresult *r, int64_t now)
{
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);

    if (PQresultStatus(r) == PGRES_TUPLES_OK) {
        if (!w->registered && w->id_refused_ms)
            wlog(w, PGJOBQ_LOG_INFO, "worker id %s is free again: starting", w->worker_id);
        w->registered = 1;
        return;
    }
    if (state == NULL || strcmp(state, "55006") != 0) {
        wlog(w, PGJOBQ_LOG_WARN, "could not record this worker in pgjobq.workers: %s", PQresultErrorMessage(r));
        w->registered = 1;
        return;
    }
    if (w->id_refused_ms == 0)
        w->id_refused_ms = now;
    switch (pgjobq__id_in_use(w->registered, w->id_refused_ms, now)) {
    case PGJOBQ__ID_WAIT:
        if (w->id_refused_ms == now)
            wlog(w, PGJOBQ_LOG_WARN, "%s; waiting up to %d s for it to go (a worker that stopped without a word)",
                 msg ? msg : "worker id in use", (PGJOBQ__ID_STALE_MS + PGJOBQ__BEAT_MS) / 1000);
        w->next_beat_ms = now + BEAT_RETRY_MS;
        break;
    case PGJOBQ__ID_GIVE_UP:
        w->fatal =
            pgjobq__worker_err(w, PGJOBQ_ECONFLICT, "%s: give each worker its own id (--worker-id)", msg ? msg : "worker id in use");
        wlog(w, PGJOBQ_LOG_ERROR, "%s", w->errmsg);
        break;
    case PGJOBQ__ID_TAKEN:
        w->fatal = pgjobq__worker_err(w, PGJOBQ_ECONFLICT,
                        "worker id %s was taken over by another worker while this one went unseen: %s; stopping",
                        w->worker_id, msg ? msg : "in use");
        wlog(w, PGJOBQ_LOG_ERROR, "%s", w->errmsg);
        break;
    }
}

static void phase_write(pgjobq_worker *w, int64_t now)
{
    if (!pgjobq__aconn_idle(&w->conn[PGJOBQ__C_WRITE]))
        return;
    if (w->nrunning > 0 && now >= w->next_heartbeat_ms) {
        send_heartbeat(w, now);
        if (w->req[PGJOBQ__C_WRITE].kind != R_NONE)
            return;
    }
    if (now >= w->next_beat_ms && !w->stopping) {
        send_beat(w, now);
        if (w->req[PGJOBQ__C_WRITE].kind != R_NONE)
            return;
    }
    /* Progress before outcomes (a value set before the job ended is written first), and otherwise at
     * most every PROGRESS_EVERY_MS. */
    if (atomic_load(&w->pool.progress_set) && (now >= w->next_progress_ms || pending_count(w) > 0)) {
        send_progress(w, now);
        if (w->req[PGJOBQ__C_WRITE].kind != R_NONE)
            return;
    }
    if (!pgjobq__flush_decide(pending_count(w), w->first_pending_ms, outstanding(w), w->stopping, now,
                              FLUSH_AFTER_MS))
        return;
    for (int k = 0; k < PGJOBQ__W_KINDS; k++) {
        if (w->pending[k].n == 0)
            continue;
        send_write(w, k, now);
        break;
    }
    /* Outcomes still pending wait for the next turn; their clock keeps running. */
    if (pending_count(w) == 0)
        w->first_pending_ms = 0;
}

/* A job whose outcome the database refused when written alone: its result (a number beyond
 * numeric's range, a value a CHECK of the user's refuses) or its retry delay (a run_at out of range).
 * It becomes a failed attempt of that job alone (a snooze stays a snooze), retried after the backoff
 * while attempts remain, whose error says why; refused again (or a release or cancel, which carry
 * nothing of the job's), it is left to its lease. */
static void outcome_refused(pgjobq_worker *w, int kind, pgjobq_ctx *ctx, const char *why)
{
    size_t size = strlen(why) + (ctx->error ? strlen(ctx->error) : 0) + 64;
    char *error = malloc(size);

    if (ctx->refused || kind == PGJOBQ__W_RELEASE || kind == PGJOBQ__W_CANCEL || error == NULL) {
        wlog(w, PGJOBQ_LOG_ERROR, "job %lld: the database refused its outcome (%s): %s; its lease will expire and "
                                  "the job run again",
             (long long)ctx->job.id, pgjobq__worker_write_what[kind], why);
        free(error);
        running_drop(w, ctx);
        return;
    }
    ctx->refused = 1;
    if (kind == PGJOBQ__W_COMPLETE) {
        snprintf(error, size, "result not storable: %s", why);
        free(ctx->result);
        ctx->result = NULL;
        ctx->outcome = PGJOBQ_OUTCOME_RETRY;
    } else
        snprintf(error, size, "outcome not storable: %s; the handler's %s: %s", why,
                 kind == PGJOBQ__W_SNOOZE ? "reason" : "error", ctx->error ? ctx->error : "(none)");
    pgjobq_ctx_set_error(ctx, error);
    free(error);
    ctx->retry_delay_ms = PGJOBQ_BACKOFF;
    /* A snooze stays one (its delay the backoff's), so that it still uses no attempt. */
    if (batch_add(&w->pending[kind == PGJOBQ__W_SNOOZE ? PGJOBQ__W_SNOOZE : PGJOBQ__W_FAIL], ctx) != 0) {
        wlog(w, PGJOBQ_LOG_ERROR, "out of memory recording job %lld; its lease will expire", (long long)ctx->job.id);
        running_drop(w, ctx);
    }
}

/* A write the database refused for the values it was given (pgjobq__refused_by_value): one job's
 * result or retry delay, most likely, which must cost the other jobs of the batch nothing.  The
 * batch is written again in halves until each refused job is alone (pgjobq__split), and that job's
 * outcome is rewritten (outcome_refused). */
static void write_refused(pgjobq_worker *w, pgjobq__request *rq, const PGresult *r, int64_t now)
{
    int kind = rq->wkind;
    size_t n = rq->items.n;
    char why[512];

    refusal_text(r, why, sizeof why);
    if (w->split[kind].depth == 0)
        wlog(w, PGJOBQ_LOG_WARN, "writing %zu outcomes (%s) was refused: %s; writing them again in parts to find "
                                 "the jobs refused",
             n, pgjobq__worker_write_what[kind], why);
    if (pgjobq__split_refused(&w->split[kind], n) == 0) {
        requeue_front(w, rq, now);
        return;
    }
    rq->items.n = 0;
    outcome_refused(w, kind, rq->items.items[0], why);
}

/* The result of a write: counts its outcomes, then forgets the jobs. */
static void write_done(pgjobq_worker *w, pgjobq__request *rq, PGresult *r)
{
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        int conflict = state && (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0);
        if (conflict) {
            /* A serialization failure or deadlock changed nothing: write them again. */
            pgjobq__split_requeued(&w->split[rq->wkind], rq->items.n);
            requeue_front(w, rq, pgjobq__mono_ms());
            return;
        }
        if (pgjobq__refused_by_value(state) && rq->items.n > 0) {
            write_refused(w, rq, r, pgjobq__mono_ms());
            return;
        }
        wlog(w, PGJOBQ_LOG_ERROR, "writing %zu outcomes (%s) failed: %s; their leases will expire and the jobs run "
                                  "again",
             rq->items.n, pgjobq__worker_write_what[rq->wkind], PQresultErrorMessage(r));
    } else {
        for (int row = 0; row < PQntuples(r); row++) {
            size_t len = 0;
            const char *outcome = pgjobq__get_text(r, row, 1, &len);
            int64_t id = pgjobq__get_int8(r, row, 0);
            if (outcome == NULL)
                continue;
            switch (pgjobq__outcome_parse(outcome, len)) {
            case PGJOBQ__O_COMPLETED: atomic_fetch_add(&w->st_completed, 1); break;
            case PGJOBQ__O_QUEUED:
                atomic_fetch_add(rq->wkind == PGJOBQ__W_RELEASE || rq->wkind == PGJOBQ__W_SNOOZE ? &w->st_released
                                                                                                 : &w->st_retried,
                                 1);
                if (rq->wkind == PGJOBQ__W_FAIL)
                    log_failed_attempt(w, &rq->items, id, 0);
                break;
            case PGJOBQ__O_FAILED:
                atomic_fetch_add(&w->st_failed, 1);
                log_failed_attempt(w, &rq->items, id, 1);
                break;
            case PGJOBQ__O_CANCELLED: atomic_fetch_add(&w->st_cancelled, 1); break;
            case PGJOBQ__O_LOST:
                atomic_fetch_add(&w->st_lost, 1);
                wlog(w, PGJOBQ_LOG_WARN, "job %lld: lease lost before its outcome could be written; not written",
                     (long long)id);
                break;
            default:
                wlog(w, PGJOBQ_LOG_ERROR, "job %lld: the database reported an unknown outcome '%.*s'", (long long)id,
                     (int)len, outcome);
                break;
            }
            wlog(w, PGJOBQ_LOG_DEBUG, "job %lld finished: %.*s", (long long)id, PQgetlength(r, row, 1), outcome);
        }
    }
    /* Slots of the queue are free in the database now.  When the last claim was cut short by the
     * queue's limit, jobs may be waiting for exactly that: claim again at once rather than at the next
     * poll. */
    for (size_t i = 0; i < rq->items.n; i++) {
        pgjobq__queue *q = rq->items.items[i]->q;
        if (q->claim.limited)
            q->claim.woken = 1;
        running_drop(w, rq->items.items[i]);
    }
    rq->items.n = 0;
}

static void heartbeat_done(pgjobq_worker *w, pgjobq__request *rq, PGresult *r)
{
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        wlog(w, PGJOBQ_LOG_WARN, "heartbeat failed: %s", PQresultErrorMessage(r));
        return;
    }
    for (int row = 0; row < PQntuples(r); row++) {
        int64_t id = pgjobq__get_int8(r, row, 0);
        size_t len = 0;
        const char *outcome = pgjobq__get_text(r, row, 1, &len);
        pgjobq__outcome o = pgjobq__outcome_parse(outcome, len);
        pgjobq_ctx *ctx = running_find(w, id);
        if (ctx == NULL || ctx->ended)
            continue;
        if (o != PGJOBQ__O_EXTENDED && atomic_load(&ctx->parked)) {
            ctx->ended = 1; /* parked by its handler, which is returning: no lease to renew, nothing lost */
            continue;
        }
        if (o == PGJOBQ__O_EXTENDED) {
            /* Never earlier than what its claim showed: a beat sent before the claim's result came can
             * still extend the job (it ran after the claim committed).  So leases only move later,
             * which phase_deadlines' lower bound relies on. */
            if (rq->sent_ms + w->o.lease_ms > ctx->lease_valid_until_ms)
                ctx->lease_valid_until_ms = rq->sent_ms + w->o.lease_ms;
        } else if (o == PGJOBQ__O_CANCELLED) {
            ctx->ended = 1;
            pgjobq__ctx_stop(ctx, PGJOBQ_STOP_CANCELLED);
            atomic_fetch_add(&w->st_cancelled, 1);
            wlog(w, PGJOBQ_LOG_INFO, "job %lld was cancelled; its handler is asked to stop", (long long)id);
        } else {
            ctx->ended = 1;
            pgjobq__ctx_stop(ctx, PGJOBQ_STOP_LEASE_LOST);
            atomic_fetch_add(&w->st_lost, 1);
            wlog(w, PGJOBQ_LOG_WARN, "job %lld: lease lost; its handler is asked to stop", (long long)id);
        }
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Phase: claim (and the listener, on the claim connection)                                          */

/* A monotonic clock, microseconds: the gaps between notifications (pgjobq__gate_note). */
static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Builds a job's context from a claimed row: one allocation for the context, the job and its
 * strings. */
static pgjobq_ctx *make_ctx(pgjobq_worker *w, pgjobq__queue *q, const PGresult *r, int row)
{
    pgjobq_ctx *ctx = calloc(1, sizeof(pgjobq_ctx) + pgjobq__claimed_size(r, row));

    if (ctx == NULL)
        return NULL;
    pgjobq__claimed_read(r, row, &ctx->job, (char *)(ctx + 1));
    ctx->job.queue = q->name;
    ctx->job.worker_id = w->worker_id;
    ctx->q = q;
    ctx->retry_delay_ms = PGJOBQ_BACKOFF;
    return ctx;
}

/* Appends a tick to the claim's tick_times (a[0]) and tick_xids (a[1]) arrays. */
static void put_tick(void *arg, const pgjobq__tick *t)
{
    pgjobq__array *a = arg;
    pgjobq__array_int8(&a[0], t->at_us - PGJOBQ__PG_EPOCH_US); /* on the wire: since 2000-01-01 */
    pgjobq__array_int8(&a[1], t->xid);
}

/* Sends a claim for queue qi: from the worker's cursor, or (from_cursor 0) from the queue's low-water
 * marks, which that claim moves on. */
static void send_claim(pgjobq_worker *w, int qi, int want, int from_cursor, int64_t now)
{
    pgjobq__queue *q = &w->queues[qi];
    pgjobq__array a[5];
    char want_s[16];
    const char *values[11] = {q->name, want_s, w->lease_s, w->worker_id};
    int lengths[11] = {0}, formats[11] = {0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0};

    snprintf(want_s, sizeof want_s, "%d", want);
    memset(a, 0, sizeof a);
    pgjobq__array_begin(&a[0], OID_INT2);
    pgjobq__array_begin(&a[1], OID_TIMESTAMPTZ);
    pgjobq__array_begin(&a[2], OID_INT8);
    pgjobq__array_begin(&a[3], OID_TIMESTAMPTZ);
    pgjobq__array_begin(&a[4], OID_INT8);
    for (int l = 0; from_cursor && l < PGJOBQ__LEVELS; l++) {
        if (!q->cursor.valid[l])
            continue;
        pgjobq__array_int2(&a[0], (int16_t)(l - 100));
        pgjobq__array_int8(&a[1], q->cursor.key_us[l] - PGJOBQ__PG_EPOCH_US); /* on the wire: since 2000-01-01 */
        pgjobq__array_int8(&a[2], q->cursor.id[l]);
    }
    pgjobq__ticks_each(&w->ticks, put_tick, &a[3]);
    /* Claim lanes under a backlog only (the last claim got all it asked for): there, overlapping
     * claims lock one another's new rows and hold them (sql/functions/claim.sql); a claim that
     * follows a wakeup should not queue behind the others' (40 x 8 at 20,000 jobs/s with lanes on
     * every claim: pickup p50 81 ms, p99 200 ms). */
    values[9] = q->claim.last_full ? "t" : "f";
    /* The gate: stamped only where the notifications it would spare come fast (pgjobq__gate_wanted). */
    values[10] = pgjobq__gate_wanted(q->gate.state, q->gate.gap_us, q->gate.window_us) ? "t" : NULL;
    for (int k = 0; k < 5; k++) {
        if (pgjobq__array_end(&a[k]) != 0) {
            wlog(w, PGJOBQ_LOG_ERROR, "out of memory sending a claim");
            goto out;
        }
        /* No cursor (a claim from the low-water marks): NULL levels. */
        if (k < 3 && !from_cursor)
            continue;
        values[4 + k] = a[k].buf.data;
        lengths[4 + k] = (int)a[k].buf.len;
    }
    if (send_stmt(w, PGJOBQ__S_CLAIM, values, lengths, formats, 1, now) != 0)
        goto out;
    atomic_fetch_add(&w->st_claims, 1);
    pgjobq__request *rq = &w->req[PGJOBQ__C_CLAIM];
    rq->kind = R_CLAIM;
    rq->queue = qi;
    rq->want = want;
    rq->from_cursor = from_cursor;
    rq->woken = q->claim.woken;
    rq->idle = w->nrunning == 0;
    rq->sent_ms = now;
    if (!from_cursor)
        q->claim.low_ms = now;
out:
    for (int k = 0; k < 5; k++)
        pgjobq__buf_free(&a[k].buf);
}

/* The claim's rows that say where it got to: the levels it read to their end, its tick and cap, and
 * (when it came back short) when the next queued job is due. */
typedef struct claim_meta {
    int16_t exhausted[PGJOBQ__LEVELS];
    int nexhausted;
    int64_t cap_us;   /* PGJOBQ_TIME_NONE when the claim knew none */
    double next_due;  /* seconds; NaN when nothing is queued */
    int limited;      /* the queue's concurrency or rate limit cut the claim short */
    int64_t tick_us;  /* the claim's tick (PGJOBQ_TIME_NONE: none) */
    int gate;         /* a gate row came (a claim of a paused queue sends none) */
    int64_t gate_end_us; /* the claim stamped the gate: its window ends then (PGJOBQ_TIME_NONE: no stamp) */
    int64_t gate_cap_us; /* the claim's cap, also for a keyed claim (PGJOBQ_TIME_NONE: none) */
    double gate_window_s;
} claim_meta;

static void read_meta(pgjobq_worker *w, const PGresult *r, int row, claim_meta *m)
{
    size_t len = 0;
    const char *what = pgjobq__get_text(r, row, PGJOBQ__K_META, &len);

    if (what == NULL)
        return;
    if (len == 9 && memcmp(what, "exhausted", 9) == 0) {
        if (m->nexhausted < PGJOBQ__LEVELS && !PQgetisnull(r, row, PGJOBQ__K_PRIORITY))
            m->exhausted[m->nexhausted++] = pgjobq__get_int2(r, row, PGJOBQ__K_PRIORITY);
    } else if (len == 4 && memcmp(what, "gate", 4) == 0) {
        m->gate = 1;
        m->gate_end_us = pgjobq__get_time(r, row, PGJOBQ__K_KEY);
        m->gate_cap_us = pgjobq__get_time(r, row, PGJOBQ__K_CAP);
        if (!PQgetisnull(r, row, PGJOBQ__K_NEXT_DUE)) {
            uint64_t u = pgjobq__get_be64(PQgetvalue(r, row, PGJOBQ__K_NEXT_DUE));
            memcpy(&m->gate_window_s, &u, sizeof m->gate_window_s);
        }
    } else if (len == 4 && memcmp(what, "tick", 4) == 0) {
        m->cap_us = pgjobq__get_time(r, row, PGJOBQ__K_CAP);
        m->tick_us = pgjobq__get_time(r, row, PGJOBQ__K_KEY);
        if (!PQgetisnull(r, row, PGJOBQ__K_KEY) && !PQgetisnull(r, row, PGJOBQ__K_TICK_XID))
            pgjobq__ticks_add(&w->ticks, pgjobq__get_time(r, row, PGJOBQ__K_KEY), pgjobq__get_int8(r, row, PGJOBQ__K_TICK_XID));
        if (!PQgetisnull(r, row, PGJOBQ__K_NEXT_DUE)) {
            uint64_t u = pgjobq__get_be64(PQgetvalue(r, row, PGJOBQ__K_NEXT_DUE));
            memcpy(&m->next_due, &u, sizeof m->next_due);
        }
        m->limited = !PQgetisnull(r, row, PGJOBQ__K_LIMITED) && pgjobq__get_bool(r, row, PGJOBQ__K_LIMITED);
    }
}

/* The notification gate.  Every notification wakes every session that listens in the database, and
 * a commit that carries one takes the server's notification lock through its WAL flush, so producers
 * that notify commit one at a time (bench/README.md, "The notification gate").  So a claim that took
 * jobs, but fewer than it asked for, stamps its queue's gate (sql/032_notify_gate.sql), and for the
 * gate's window (5 ms) producers send no notification for that queue: this worker has promised to
 * claim from it again.  It claims at half the window: a claim that finds jobs stamps again (a claim
 * stamps only when no stamp younger than half the window holds the gate shut), so that under steady
 * load the gate stays shut from one window to the next.  Only where the queue's notifications come
 * faster than one a window, or while a promise holds (pgjobq__gate_wanted; its claims pass gate =>
 * NULL otherwise, which reports the window and stamps nothing): slower, a shut gate spares producers
 * next to nothing and delays every pickup by up to half a window.  The promise, per queue (q->gate):
 *
 *   WINDOW    claim once the window has ended: a claim whose tick (its moment on the database clock)
 *             is at or after the window's end.  A producer that skipped its notification read the gate
 *             before that, and its job was written before it read (or committed: the library's own
 *             transactions notify after their commit), so its transaction got its id before that
 *             claim's.
 *   HORIZON   then claim until a claim's cap reaches that claim's tick: every transaction that was
 *             running at the tick has ended, every skipped job is visible.  A wait that doubles from
 *             1 ms to the poll between these claims (a producer's transaction that stays open long
 *             after it enqueued keeps the horizon back).
 *
 * A claim that stamps again starts a new window: the new promise keeps the old one (its horizon is
 * later).  A worker that promised and has no free slot when the claim is due, or whose claim under the
 * promise came back full (jobs are left that nobody announced), hands the promise on: one ungated
 * notification wakes the other workers (PGJOBQ__S_HAND_ON); it keeps its promise for when a slot
 * frees.  So does a worker that stops while it holds one.  What a promise cannot cover: a worker that
 * dies inside its window; its jobs wait for another worker's claim (the poll, 1 s by default). */
static void gate_after_claim(pgjobq_worker *w, pgjobq__queue *q, const claim_meta *m, int n, int want, int64_t now)
{
    if (!m->gate) {
        /* A paused queue's claim: nobody claims from it until it resumes, whose notification wakes the
         * workers.  The promise ends (kept, it would claim the paused queue without pause). */
        q->gate.state = PGJOBQ__GATE_NONE;
        q->claim.gate_ms = 0;
        return;
    }
    if (m->gate_window_s > 0)
        q->gate.window_us = (int64_t)(m->gate_window_s * 1e6);
    if (m->gate_end_us != PGJOBQ_TIME_NONE) {
        int64_t window_ms = m->gate_window_s > 0 ? (int64_t)(m->gate_window_s * 1000.0 + 0.999) : 1; /* rounded up */
        q->gate.state = PGJOBQ__GATE_WINDOW;
        q->gate.end_us = m->gate_end_us;
        q->gate.retry_ms = 0;
        q->gate.handed = q->gate.hand_now = 0;
        /* At half the window (which began at the stamp, before this answer arrived): a claim that finds
         * jobs then stamps again, so under steady load the gate never opens between two windows. */
        q->claim.gate_ms = now + (window_ms / 2 > 0 ? window_ms / 2 : 1);
        return;
    }
    if (q->gate.state == PGJOBQ__GATE_WINDOW) {
        if (m->tick_us == PGJOBQ_TIME_NONE || m->tick_us < q->gate.end_us) {
            /* Claimed before the window's end (at half of it, on a notification, for a freed slot), and
             * stamped nothing: the promise holds, and its claim comes when the window has ended. */
            int64_t left_ms = m->tick_us == PGJOBQ_TIME_NONE ? 1 : (q->gate.end_us - m->tick_us) / 1000 + 1;
            q->claim.gate_ms = now + left_ms;
            if (n > 0 && n == want && !q->gate.handed)
                q->gate.hand_now = 1;
            return;
        }
        q->gate.state = PGJOBQ__GATE_HORIZON;
        q->gate.end_us = m->tick_us;
        q->gate.retry_ms = 0;
    } else if (q->gate.state == PGJOBQ__GATE_HORIZON && m->gate_cap_us != PGJOBQ_TIME_NONE &&
               m->gate_cap_us >= q->gate.end_us) {
        q->gate.state = PGJOBQ__GATE_NONE;
        q->claim.gate_ms = 0;
        return;
    }
    if (q->gate.state == PGJOBQ__GATE_NONE)
        return;
    if (n > 0 && n == want && !q->gate.handed)
        q->gate.hand_now = 1;
    q->gate.retry_ms = pgjobq__backoff_next(q->gate.retry_ms, 1, w->o.poll_ms);
    q->claim.gate_ms = now + q->gate.retry_ms;
}

static void claim_done(pgjobq_worker *w, pgjobq__request *rq, PGresult *r, int64_t now)
{
    pgjobq__queue *q = &w->queues[rq->queue];
    pgjobq_ctx *first = NULL, *last = NULL;
    pgjobq__claimed *claimed = NULL;
    claim_meta meta;
    int n = 0, rows;

    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQnfields(r) != PGJOBQ__K_CLAIM_NCOLS) {
        wlog(w, PGJOBQ_LOG_WARN, "claim from %s failed: %s", q->name, PQresultErrorMessage(r));
        q->claim.next_poll_ms = now + w->o.poll_ms;
        q->claim.woken = q->claim.last_full = 0;
        /* Rows it had locked may be queued again behind the cursor: the next claim starts low. */
        q->claim.cursor_valid = 0;
        /* A promise of the gate is kept: by the next claim, at the poll. */
        if (q->gate.state != PGJOBQ__GATE_NONE)
            q->claim.gate_ms = q->claim.next_poll_ms;
        return;
    }
    memset(&meta, 0, sizeof meta);
    meta.cap_us = meta.tick_us = meta.gate_end_us = meta.gate_cap_us = PGJOBQ_TIME_NONE;
    meta.next_due = NAN;
    rows = PQntuples(r);
    claimed = rows > 0 ? malloc((size_t)rows * sizeof *claimed) : NULL;
    for (int row = 0; row < rows; row++) {
        if (PQgetisnull(r, row, PGJOBQ__K_ID)) {
            read_meta(w, r, row, &meta);
            continue;
        }
        pgjobq_ctx *ctx = make_ctx(w, q, r, row);
        if (ctx == NULL || running_add(w, ctx) != 0) {
            /* Out of memory: the job's lease will expire and it will run elsewhere. */
            wlog(w, PGJOBQ_LOG_ERROR, "out of memory dispatching job %lld",
                 (long long)pgjobq__get_int8(r, row, PGJOBQ__K_ID));
            pgjobq__ctx_free(ctx);
            continue;
        }
        n++;
        if (claimed) {
            claimed[n - 1].priority = (int16_t)ctx->job.priority;
            claimed[n - 1].key_us = pgjobq__get_time(r, row, PGJOBQ__K_KEY);
            claimed[n - 1].id = ctx->job.id;
        }
        ctx->lease_valid_until_ms = rq->sent_ms + w->o.lease_ms;
        atomic_store(&ctx->timeout_at_ms, INT64_MAX); /* set when its handler starts */
        /* Its handler starts from now on, so its timeout comes no sooner than a timeout from now. */
        int64_t due = ctx->lease_valid_until_ms - pgjobq__lease_margin(w->o.lease_ms);
        if (now + q->timeout_ms < due)
            due = now + q->timeout_ms;
        if (due < w->deadlines_at_ms)
            w->deadlines_at_ms = due;
        int64_t plen = (int64_t)strlen(ctx->job.payload ? ctx->job.payload : "");
        q->payload_bytes = q->payload_bytes == 0 ? plen + 1 : q->payload_bytes + (plen - q->payload_bytes) / 16;
        if (w->stopping) {
            /* Claimed while the worker began to stop: hand it back without running it. */
            pgjobq__ctx_stop(ctx, PGJOBQ_STOP_SHUTDOWN);
            ctx->outcome = PGJOBQ_OUTCOME_RETRY;
            pend(w, ctx, now);
            continue;
        }
        q->claim.running++;
        wlog(w, PGJOBQ_LOG_DEBUG, "job %lld (%s/%s) attempt %d starting", (long long)ctx->job.id, q->name,
             ctx->job.kind, ctx->job.attempt);
        if (last)
            last->next = ctx;
        else
            first = ctx;
        last = ctx;
    }
    atomic_fetch_add(&w->st_claimed, n);
    if (first)
        pgjobq__pool_dispatch(q, first, last);
    if (claimed) {
        pgjobq__cursor_update(&q->cursor, claimed, n, meta.exhausted, meta.nexhausted, meta.cap_us);
        q->claim.cursor_valid = q->cursor.nvalid > 0;
    } else if (rows > 0) {
        /* Out of memory for the list: start from the low-water marks next time. */
        q->claim.cursor_valid = 0;
    }
    free(claimed);
    q->drained = n == 0 && rq->idle;
    q->claim.woken = 0;
    q->claim.limited = meta.limited;
    /* A claim on a notification that found nothing: another worker took the jobs; hold the next such
     * claim a little longer (pgjobq__claim_hold_ms). */
    if (n > 0 || !rq->woken)
        q->claim.empty_streak = n > 0 ? 0 : q->claim.empty_streak;
    else
        q->claim.empty_streak++;
    q->claim.hold_ms = now + pgjobq__claim_hold_ms(q->claim.empty_streak);
    q->claim.last_full = n == rq->want;
    q->claim.next_poll_ms = now + w->o.poll_ms;
    /* Nothing due: sleep until the next scheduled job, if it comes before the next poll (40 idle workers
     * that re-claimed at once for a due job another held starved the database:
     * pgjobq__claim_after_due).  Its due time counts from the claim's start (the database's now()),
     * not from its answer; and a worker that lately handed back a job of this queue it could not run
     * lets the others claim first (yield_until_ms: two workers that both woke for that job claimed
     * within a millisecond of each other, and the one that could not run it won every time). */
    if (n == 0)
        q->claim.next_poll_ms =
            pgjobq__claim_after_due(meta.next_due, rq->sent_ms, q->claim.next_poll_ms,
                                    now < q->claim.yield_until_ms ? PGJOBQ__YIELD_MS : 0);
    gate_after_claim(w, q, &meta, n, rq->want, now);
}

/* A notification names a queue with new jobs: claim from it at once.  Or it says that a job this
 * worker holds was asked to stop (pgjobq.cancel_notify: "!cancel:" and this worker's id): renew the
 * leases now, as the heartbeat would, whose answer ends such a job cancelled and stops its handler
 * (heartbeat_done), rather than up to a heartbeat later.  A burst of them costs one early heartbeat
 * at a time: it is sent when the write connection is free. */
static void read_notifications(pgjobq_worker *w)
{
    static const char cancel_prefix[] = "!cancel:";
    PGnotify *n;

    if (w->conn[PGJOBQ__C_CLAIM].pg == NULL)
        return;
    while ((n = PQnotifies(w->conn[PGJOBQ__C_CLAIM].pg)) != NULL) {
        if (strncmp(n->extra, cancel_prefix, sizeof cancel_prefix - 1) == 0) {
            if (strcmp(n->extra + sizeof cancel_prefix - 1, w->worker_id) == 0 && w->nrunning > 0) {
                wlog(w, PGJOBQ_LOG_DEBUG, "a cancel was requested for a job of this worker: renewing the leases now");
                w->next_heartbeat_ms = 0;
            }
        } else {
            for (int i = 0; i < w->nqueues; i++)
                if (strcmp(w->queues[i].name, n->extra) == 0) {
                    w->queues[i].claim.woken = 1;
                    pgjobq__gate_note(&w->queues[i].gate.note_us, &w->queues[i].gate.gap_us, mono_us(),
                                      w->queues[i].gate.window_us);
                }
        }
        PQfreemem(n);
    }
}

static void listen_check_done(pgjobq_worker *w, PGresult *r)
{
    /* A listening connection can stop listening without breaking: then listen again. */
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        wlog(w, PGJOBQ_LOG_WARN, "the claim connection no longer listens for new jobs; listening again");
        w->need_listen = 1;
    }
}

static void phase_claim(pgjobq_worker *w, int64_t now)
{
    pgjobq__aconn *ac = &w->conn[PGJOBQ__C_CLAIM];
    pgjobq__request *rq = &w->req[PGJOBQ__C_CLAIM];

    if (!pgjobq__aconn_idle(ac))
        return;
    if (!w->o.poll_only && w->need_listen) {
        if (pgjobq__aconn_send_simple(ac, pgjobq__worker_listen_sql, now) == 0) {
            rq->kind = R_LISTEN;
            w->need_listen = 0;
            for (int i = 0; i < w->nqueues; i++)
                w->queues[i].claim.woken = 1; /* jobs may have arrived while nobody listened */
        }
        return;
    }
    if (!w->o.poll_only && now >= w->listen_check_ms) {
        w->listen_check_ms = now + LISTEN_CHECK_MS;
        if (pgjobq__aconn_send_simple(ac, pgjobq__worker_listen_check_sql, now) == 0)
            rq->kind = R_LISTEN_CHECK;
        return;
    }
    /* A promise of the gate that this worker cannot keep now is handed on (see gate_after_claim): its
     * claim came back full, or the claim is due and no slot is free, or the worker stops. */
    for (int i = 0; i < w->nqueues; i++) {
        pgjobq__queue *q = &w->queues[i];
        if (q->gate.state == PGJOBQ__GATE_NONE || q->gate.handed)
            continue;
        if (!q->gate.hand_now &&
            !(w->stopping || w->claims_held ||
              (q->claim.gate_ms > 0 && now >= q->claim.gate_ms &&
               q->claim.running >= q->claim.concurrency + q->claim.prefetch)))
            continue;
        const char *values[1] = {q->name};
        q->gate.handed = 1;
        q->gate.hand_now = 0;
        if (send_stmt(w, PGJOBQ__S_HAND_ON, values, NULL, NULL, 0, now) == 0) {
            w->req[PGJOBQ__C_CLAIM].kind = R_HAND_ON;
            wlog(w, PGJOBQ_LOG_DEBUG, "queue %s: handing the gate's promise on", q->name);
        }
        return;
    }
    /* No claim before the registry has taken this worker's id: another live worker may have it; and none
     * while the worker is unhealthy (pgjobq_worker_set_unhealthy). */
    if (w->stopping || !w->registered || w->claims_held)
        return;
    /* Queues in turn, starting after the one served last, so that a busy queue cannot starve others. */
    for (int k = 0; k < w->nqueues; k++) {
        int qi = (w->claim_rr + k) % w->nqueues, from_cursor;
        pgjobq__queue *q = &w->queues[qi];
        q->claim.prefetch = pgjobq__prefetch(atomic_load(&q->handler_ns), atomic_load(&q->handled), q->concurrency,
                                             w->o.batch_max, q->payload_bytes);
        int want = pgjobq__claim_decide(&q->claim, now, &from_cursor);
        if (want > 0) {
            w->claim_rr = (qi + 1) % w->nqueues;
            send_claim(w, qi, want, from_cursor, now);
            return;
        }
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Phase: maintain                                                                                   */

static void phase_maintain(pgjobq_worker *w, int64_t now)
{
    pgjobq__aconn *ac = &w->conn[PGJOBQ__C_MAINT];
    pgjobq__request *rq = &w->req[PGJOBQ__C_MAINT];

    if (w->o.no_maintenance || !pgjobq__aconn_idle(ac))
        return;
    if (now >= w->next_rescue_ms) {
        char since[32];
        const char *values[1] = {NULL};
        if (now >= w->next_full_rescue_ms)
            w->rescue_since_us = PGJOBQ_TIME_NONE;
        if (w->rescue_since_us != PGJOBQ_TIME_NONE) {
            snprintf(since, sizeof since, "%lld", (long long)w->rescue_since_us);
            values[0] = since;
        }
        if (send_stmt(w, PGJOBQ__S_RESCUE, values, NULL, NULL, 0, now) == 0) {
            rq->kind = R_RESCUE;
            if (values[0] == NULL)
                w->next_full_rescue_ms = now + RESCUE_FULL_EVERY_MS;
        }
    } else if (now >= w->next_tick_ms) {
        w->next_tick_ms = now + TICK_EVERY_MS;
        if (send_stmt(w, PGJOBQ__S_TICK, NULL, NULL, NULL, 0, now) == 0)
            rq->kind = R_TICK;
    } else if (now >= w->next_health_ms) {
        w->next_health_ms = now + HEALTH_EVERY_MS;
        if (send_stmt(w, PGJOBQ__S_HEALTH, NULL, NULL, NULL, 0, now) == 0)
            rq->kind = R_HEALTH;
    } else if (now >= w->next_prune_ms) {
        const char *values[2] = {w->completed_s[0] ? w->completed_s : NULL, w->failed_s[0] ? w->failed_s : NULL};
        if (send_stmt(w, PGJOBQ__S_PRUNE, values, NULL, NULL, 0, now) == 0)
            rq->kind = R_PRUNE;
    }
}

static void maintain_done(pgjobq_worker *w, int is_rescue, PGresult *r, int64_t now)
{
    long long n = -1;

    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
        n = atoll(PQgetvalue(r, 0, 0));
        /* A rescue that ran (not another process's turn) and saw everything up to its now(): the next one
         * looks from a little before that. */
        if (is_rescue && n >= 0 && n < MAINTENANCE_BATCH && PQnfields(r) == 2)
            w->rescue_since_us = atoll(PQgetvalue(r, 0, 1)) - RESCUE_MARGIN_US;
    } else
        wlog(w, PGJOBQ_LOG_WARN, "maintenance (%s) failed: %s", is_rescue ? "rescue" : "prune",
             PQresultErrorMessage(r));
    if (is_rescue && n > 0) {
        atomic_fetch_add(&w->st_rescued, n);
        wlog(w, PGJOBQ_LOG_INFO, "rescued %lld jobs whose lease had expired", n);
    } else if (!is_rescue && n > 0) {
        wlog(w, PGJOBQ_LOG_INFO, "pruned %lld finished jobs past their retention", n);
    }
    /* A full batch: more may be waiting; go again at once. */
    int64_t *next = is_rescue ? &w->next_rescue_ms : &w->next_prune_ms;
    *next = n >= MAINTENANCE_BATCH ? now : now + (is_rescue ? RESCUE_EVERY_MS : PRUNE_EVERY_MS);
}

static void tick_done(pgjobq_worker *w, PGresult *r)
{
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        wlog(w, PGJOBQ_LOG_WARN, "schedule tick failed: %s", PQresultErrorMessage(r));
        return;
    }
    long long n = atoll(PQgetvalue(r, 0, 0));
    if (n > 0)
        wlog(w, PGJOBQ_LOG_DEBUG, "schedules enqueued %lld jobs", n);
}

/* What holds vacuum back: said in the log (once a minute while it lasts) when it is older than
 * HORIZON_WARN_S, with what to do; a session is named with its pid, application and state.  And
 * whether autovacuum of pgjobq.jobs was paused or resumed (pgjobq.autovacuum_adapt()). */
static void health_done(pgjobq_worker *w, PGresult *r)
{
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1 || PQnfields(r) != 7) {
        /* Without it nothing says what holds vacuum back, and autovacuum is not paused or resumed:
         * said once at warn (a missing grant, a schema migrated by hand), then each minute at debug. */
        wlog(w, w->health_failed ? PGJOBQ_LOG_DEBUG : PGJOBQ_LOG_WARN,
             "reading pgjobq.health() and pgjobq.autovacuum_adapt() failed: %s; vacuum is not watched",
             PQresultStatus(r) == PGRES_TUPLES_OK ? "unexpected result" : PQresultErrorMessage(r));
        w->health_failed = 1;
        return;
    }
    w->health_failed = 0;
    const char *adapted = PQgetisnull(r, 0, 6) ? "" : PQgetvalue(r, 0, 6);
    if (strcmp(adapted, "paused") == 0)
        wlog(w, PGJOBQ_LOG_INFO,
             "paused autovacuum of pgjobq.jobs: a pass has run since the oldest snapshot was taken, and another "
             "could remove nothing until that snapshot ends (it resumes then)");
    else if (strcmp(adapted, "resumed") == 0)
        wlog(w, PGJOBQ_LOG_INFO, "resumed autovacuum of pgjobq.jobs: the snapshot that held vacuum back has ended");
    if (PQgetisnull(r, 0, 0) || atof(PQgetvalue(r, 0, 0)) < HORIZON_WARN_S)
        return;
    const char *kind = PQgetvalue(r, 0, 1);
    char who[400];
    if (strcmp(kind, "session") == 0)
        snprintf(who, sizeof who, "session pid %s (application \"%.100s\", %.40s)", PQgetvalue(r, 0, 2),
                 PQgetisnull(r, 0, 3) ? "?" : PQgetvalue(r, 0, 3), PQgetisnull(r, 0, 4) ? "?" : PQgetvalue(r, 0, 4));
    else if (strcmp(kind, "slot") == 0)
        snprintf(who, sizeof who, "replication slot \"%.100s\"", PQgetvalue(r, 0, 3));
    else
        snprintf(who, sizeof who, "%s %.100s", kind, PQgetisnull(r, 0, 3) ? PQgetvalue(r, 0, 2) : PQgetvalue(r, 0, 3));
    wlog(w, PGJOBQ_LOG_WARN,
         "vacuum has been held back for %s s by %s: finished jobs leave dead rows (%s now) that nothing can "
         "remove until it ends; claims are not slowed by them, but the table grows (docs/deploy.md, \"Snapshots "
         "held open\")",
         PQgetvalue(r, 0, 0), who, PQgetvalue(r, 0, 5));
}

/* ------------------------------------------------------------------------------------------------ */
/* Phase: deadlines                                                                                  */

/* Jobs past their timeout are told to stop; jobs whose lease can no longer be known valid are lost. */
static void phase_deadlines(pgjobq_worker *w, int64_t now)
{
    int64_t margin = pgjobq__lease_margin(w->o.lease_ms), next = INT64_MAX;

    /* Nothing is due before the lower bound: the whole running set is walked only when something may
     * be (a lease's margin comes about every heartbeat; renewals only move leases later). */
    if (now < w->deadlines_at_ms)
        return;
    for (size_t i = 0; i < w->nrunning; i++) {
        pgjobq_ctx *ctx = w->running[i];
        if (ctx->ended)
            continue;
        int64_t timeout_at = atomic_load(&ctx->timeout_at_ms), lease_at = ctx->lease_valid_until_ms - margin;
        if (now >= timeout_at)
            pgjobq__ctx_stop(ctx, PGJOBQ_STOP_TIMEOUT);
        if (now >= lease_at) {
            ctx->ended = 1;
            if (atomic_load(&ctx->parked))
                continue; /* parked: the database holds it, not this worker */
            pgjobq__ctx_stop(ctx, PGJOBQ_STOP_LEASE_LOST);
            atomic_fetch_add(&w->st_lost, 1);
            wlog(w, PGJOBQ_LOG_WARN, "job %lld: its lease could not be renewed in time; treating it as lost",
                 (long long)ctx->job.id);
            continue;
        }
        /* A job whose handler has not started (a handler thread may start it right after this load)
         * times out no sooner than a whole timeout from now; one told to stop waits only for its lease. */
        if (timeout_at == INT64_MAX)
            timeout_at = now + ctx->q->timeout_ms;
        else if (atomic_load(&ctx->stop) != PGJOBQ_STOP_NONE)
            timeout_at = INT64_MAX;
        if (timeout_at < next)
            next = timeout_at;
        if (lease_at < next)
            next = lease_at;
    }
    w->deadlines_at_ms = next;
}

/* ------------------------------------------------------------------------------------------------ */
/* Phase: poll, and what the connections report                                                      */

/* A connection broke: what it carried is retried (writes), or left to its lease (a claim whose result
 * never came: if it committed, those jobs are rescued when their leases expire). */
static void connection_lost(pgjobq_worker *w, int c, int64_t now)
{
    pgjobq__request *rq = &w->req[c];

    int64_t retry_in = w->conn[c].retry_at_ms > now ? w->conn[c].retry_at_ms - now : 0;

    if (w->down_since_ms[c] == 0)
        w->down_since_ms[c] = now;
    w->failed_connects[c] += !w->was_ready[c];
    if (w->was_ready[c])
        wlog(w, PGJOBQ_LOG_WARN, "lost the %s connection: %s; reconnecting in %lld ms", w->conn[c].name,
             w->conn[c].err, (long long)retry_in);
    else if (now >= w->next_down_warn_ms[c]) {
        /* The first failure of a streak, then one line every 30 s: clear without flooding the log. */
        const char *e = w->conn[c].err;
        int full = strstr(e, "too many clients") != NULL || strstr(e, "remaining connection slots") != NULL;
        wlog(w, PGJOBQ_LOG_WARN, "cannot connect the %s connection (%d attempts in %.1f s): %s%s; retrying in %lld ms",
             w->conn[c].name, w->failed_connects[c], (double)(now - w->down_since_ms[c]) / 1000.0, e,
             full ? " (the server's max_connections is reached: a worker process needs 3 connections)" : "",
             (long long)retry_in);
        w->next_down_warn_ms[c] = now + DOWN_WARN_EVERY_MS;
    } else
        wlog(w, PGJOBQ_LOG_DEBUG, "the %s connection failed: %s; retrying in %lld ms", w->conn[c].name,
             w->conn[c].err, (long long)retry_in);
    if (w->was_ready[c])
        atomic_fetch_sub(&w->st_connected, 1);
    w->was_ready[c] = 0;
    if (rq->kind == R_WRITE) {
        pgjobq__split_requeued(&w->split[rq->wkind], rq->items.n);
        requeue_front(w, rq, now);
    }
    if (rq->kind == R_PROGRESS)
        progress_forget(w);
    if (rq->kind == R_LISTEN)
        w->need_listen = 1;
    /* A claim whose result never came may have rolled back: the rows it had locked are queued again,
     * and other workers' cursors have passed them.  The next claims start at the low-water marks. */
    if (c == PGJOBQ__C_CLAIM)
        for (int i = 0; i < w->nqueues; i++)
            w->queues[i].claim.cursor_valid = 0;
    rq->kind = R_NONE;
}

static void connection_ready(pgjobq_worker *w, int c, int64_t now)
{
    char where[300];

    pgjobq__aconn_where(&w->conn[c], where, sizeof where);
    if (w->down_since_ms[c] != 0 && w->ever_ready[c])
        wlog(w, PGJOBQ_LOG_WARN, "reconnected the %s connection, to %s, after %.1f s (%d failed attempts)",
             w->conn[c].name, where, (double)(now - w->down_since_ms[c]) / 1000.0, w->failed_connects[c]);
    w->down_since_ms[c] = 0;
    w->failed_connects[c] = 0;
    w->next_down_warn_ms[c] = 0;
    w->ever_ready[c] = 1;
    if (c == PGJOBQ__C_CLAIM) {
        wlog(w, PGJOBQ_LOG_INFO, "connected to the database at %s as worker %s%s", where, w->worker_id,
             w->o.poll_only ? " (polling)" : "; listening for new jobs");
        /* Jobs may have arrived while nobody listened. */
        for (int i = 0; i < w->nqueues; i++)
            w->queues[i].claim.woken = 1;
        w->listen_check_ms = now + LISTEN_CHECK_MS;
        w->need_listen = 0;
    } else {
        wlog(w, PGJOBQ_LOG_DEBUG, "the %s connection is ready", w->conn[c].name);
        if (c == PGJOBQ__C_WRITE) {
            w->next_heartbeat_ms = now; /* leases may have gone unrenewed while it was down */
            w->next_beat_ms = now;
        }
        if (c == PGJOBQ__C_MAINT) {
            /* Perhaps another server now (a failover): its leases may end before the point the rescue
             * had reached on the old one (a renewal the standby never received), so the next rescue
             * looks at every expired lease. */
            w->rescue_since_us = PGJOBQ_TIME_NONE;
            w->next_full_rescue_ms = now;
            w->next_rescue_ms = now;
        }
    }
    if (!w->was_ready[c])
        atomic_fetch_add(&w->st_connected, 1);
    w->was_ready[c] = 1;
}

static void result_ready(pgjobq_worker *w, int c, int64_t now)
{
    pgjobq__request *rq = &w->req[c];
    PGresult *r = pgjobq__aconn_take(&w->conn[c]);
    int kind = rq->kind;

    rq->kind = R_NONE;
    if (r == NULL)
        return;
    switch (kind) {
    case R_CLAIM: claim_done(w, rq, r, now); break;
    case R_LISTEN_CHECK: listen_check_done(w, r); break;
    case R_HAND_ON:
        if (PQresultStatus(r) != PGRES_TUPLES_OK)
            wlog(w, PGJOBQ_LOG_WARN, "waking the other workers failed: %s", PQresultErrorMessage(r));
        break;
    case R_LISTEN:
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            w->need_listen = 1;
        break;
    case R_WRITE: write_done(w, rq, r); break;
    case R_HEARTBEAT: heartbeat_done(w, rq, r); break;
    case R_BEAT: beat_done(w, r, now); break;
    case R_PROGRESS: progress_done(w, r); break;
    case R_RESCUE:
    case R_PRUNE: maintain_done(w, kind == R_RESCUE, r, now); break;
    case R_TICK: tick_done(w, r); break;
    case R_HEALTH: health_done(w, r); break;
    default: break;
    }
    PQclear(r);
}

/* Carries a connection's event out. */
static void connection_event(pgjobq_worker *w, int c, int ev, int64_t now)
{
    switch (ev) {
    case PGJOBQ__AC_EV_READY: connection_ready(w, c, now); break;
    case PGJOBQ__AC_EV_RESULT: result_ready(w, c, now); break;
    case PGJOBQ__AC_EV_LOST: connection_lost(w, c, now); break;
    case PGJOBQ__AC_EV_SCHEMA:
        w->fatal = pgjobq__worker_err(w, PGJOBQ_ESCHEMA, "%s", w->conn[c].err);
        wlog(w, PGJOBQ_LOG_ERROR, "%s", w->errmsg);
        break;
    default: break;
    }
    if (c == PGJOBQ__C_CLAIM)
        read_notifications(w);
}

/* When the loop must run again even if nothing happens. */
static int64_t next_timer(pgjobq_worker *w, int64_t now, int waiting)
{
    int64_t next = now + (waiting ? HELP_AFTER_MS : 1000);

#define SOONER(t)         \
    do {                  \
        int64_t t_ = (t); \
        if (t_ < next)    \
            next = t_;    \
    } while (0)
    if (pgjobq__aconn_idle(&w->conn[PGJOBQ__C_WRITE])) {
        if (w->nrunning > 0)
            SOONER(w->next_heartbeat_ms);
        if (!w->stopping)
            SOONER(w->next_beat_ms);
        if (w->first_pending_ms)
            SOONER(w->first_pending_ms + FLUSH_AFTER_MS);
        if (atomic_load(&w->pool.progress_set))
            SOONER(w->next_progress_ms);
    }
    if (w->stopping)
        SOONER(w->shutdown_at_ms);
    SOONER(w->deadlines_at_ms);
    for (int c = 0; c < PGJOBQ__NCONN; c++)
        if (c != PGJOBQ__C_MAINT || !w->o.no_maintenance)
            SOONER(pgjobq__aconn_next_ms(&w->conn[c]));
    if (pgjobq__aconn_idle(&w->conn[PGJOBQ__C_CLAIM])) {
        if (!w->o.poll_only)
            SOONER(w->listen_check_ms);
        for (int i = 0; i < w->nqueues && !w->stopping && !w->claims_held; i++) {
            pgjobq__queue *q = &w->queues[i];
            if (pgjobq__claim_decide(&q->claim, now, NULL) > 0)
                return now;
            SOONER(pgjobq__claim_next_ms(&q->claim));
        }
    }
    if (!w->o.no_maintenance && pgjobq__aconn_idle(&w->conn[PGJOBQ__C_MAINT])) {
        SOONER(w->next_rescue_ms);
        SOONER(w->next_tick_ms);
        SOONER(w->next_health_ms);
        SOONER(w->next_prune_ms);
    }
#undef SOONER
    return next;
}

static void phase_poll(pgjobq_worker *w, int64_t now, int waiting)
{
    struct pollfd p[1 + PGJOBQ__NCONN];
    int64_t next = next_timer(w, now, waiting);
    int timeout = next > now ? (int)(next - now < 60000 ? next - now : 60000) : 0;

    p[0].fd = w->wake_pipe[0];
    p[0].events = POLLIN;
    p[0].revents = 0;
    for (int c = 0; c < PGJOBQ__NCONN; c++) {
        pgjobq__aconn_pollfd(&w->conn[c], &p[1 + c].fd, &p[1 + c].events);
        p[1 + c].revents = 0;
    }
    if (poll(p, 1 + PGJOBQ__NCONN, timeout) < 0 && errno != EINTR)
        wlog(w, PGJOBQ_LOG_WARN, "poll: %s", strerror(errno));
    if (p[0].revents) {
        char buf[256];
        while (read(w->wake_pipe[0], buf, sizeof buf) > 0)
            ;
    }
    now = pgjobq__mono_ms();
    for (int c = 0; c < PGJOBQ__NCONN; c++) {
        int ev = pgjobq__aconn_io(&w->conn[c], p[1 + c].fd >= 0 ? p[1 + c].revents : 0, now);
        connection_event(w, c, ev, now);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* The run loop                                                                                      */

static void log_summary(pgjobq_worker *w, int64_t now)
{
    pgjobq_worker_stats s;

    if (now - w->last_summary_ms < SUMMARY_EVERY_MS)
        return;
    pgjobq_worker_get_stats(w, &s);
    wlog(w, PGJOBQ_LOG_INFO, "running %lld; so far %lld completed, %lld retried, %lld failed, %lld lost",
         (long long)s.running, (long long)s.completed, (long long)s.retried, (long long)s.failed, (long long)s.lost);
    w->last_summary_ms = now;
}

/* Whether the loop is done: stopping with nothing left to run or write, or stopping without a
 * database past the shutdown timeout (then the outcomes that could not be written go back through
 * their leases). */
static int phase_done(pgjobq_worker *w, int64_t now)
{
    if (w->fatal) {
        /* Nothing more can be written: handlers stop now, and their jobs go back through their leases. */
        for (size_t i = 0; i < w->nrunning; i++)
            pgjobq__ctx_stop(w->running[i], PGJOBQ_STOP_SHUTDOWN);
        w->exit_rc = w->fatal;
        return 1;
    }
    if (!w->stopping)
        return 0;
    if (w->nrunning == 0 && w->req[PGJOBQ__C_CLAIM].kind != R_CLAIM)
        return 1;
    int requests = atomic_load(&w->stop_requests);
    if (w->conn[PGJOBQ__C_WRITE].state != PGJOBQ__AC_READY && (requests > 1 || now >= w->shutdown_at_ms) &&
        outstanding(w) == 0) {
        size_t unwritten = pending_count(w) + w->req[PGJOBQ__C_WRITE].items.n;
        if (unwritten)
            w->exit_rc = pgjobq__worker_err(w, PGJOBQ_ETIMEOUT,
                              "stopped without a database: the outcomes of %zu jobs could not be written; their "
                              "leases will expire and they will run again",
                              unwritten);
        return 1;
    }
    return 0;
}

/* A server's notice or warning ("WARNING:  terminating connection due to ..."), into the log as one
 * line instead of onto stderr. */
static void server_notice(void *arg, const char *message)
{
    pgjobq_worker *w = arg;
    size_t n = strcspn(message, "\n");
    wlog(w, strncmp(message, "WARNING:", 8) == 0 ? PGJOBQ_LOG_WARN : PGJOBQ_LOG_INFO, "server: %.*s", (int)n,
         message);
}

static void init_connections(pgjobq_worker *w)
{
    static const char *const names[PGJOBQ__NCONN] = {"claim", "write", "maintenance"};

    for (int c = 0; c < PGJOBQ__NCONN; c++) {
        pgjobq__aconn *ac = &w->conn[c];
        memset(ac, 0, sizeof *ac);
        ac->name = names[c];
        ac->conninfo = w->conninfo;
        ac->setup_sql = c == PGJOBQ__C_CLAIM && !w->o.poll_only ? pgjobq__worker_setup_listen : pgjobq__worker_setup_plain;
        ac->stmts = &pgjobq__worker_stmts[pgjobq__worker_conn_stmts[c].first];
        ac->nstmts = pgjobq__worker_conn_stmts[c].n;
        /* PgBouncer in transaction mode (poll-only) hands each transaction to any server connection:
         * named prepared statements would not be there. */
        ac->prepare = !w->o.poll_only;
        ac->tcp_timeout_ms = tcp_timeout(w);
        ac->notice = server_notice;
        ac->notice_arg = w;
    }
    pgjobq__ms_interval(w->lease_s, sizeof w->lease_s, w->o.lease_ms);
    /* A negative retention means "never": an age nothing reaches.  None given (0): the prune keeps
     * the database's (pgjobq.retention), and the strings stay empty (NULL parameters). */
    if (w->o.retain_completed_ms != 0)
        pgjobq__ms_interval(w->completed_s, sizeof w->completed_s,
                            w->o.retain_completed_ms < 0 ? INT64_C(3155760000000) * 10 : w->o.retain_completed_ms);
    if (w->o.retain_failed_ms != 0)
        pgjobq__ms_interval(w->failed_s, sizeof w->failed_s,
                            w->o.retain_failed_ms < 0 ? INT64_C(3155760000000) * 10 : w->o.retain_failed_ms);
}

/* The secret that makes this worker's row of pgjobq.workers its own: 64 random bits from the kernel,
 * never shown (the row keeps its SHA-256). */
static int draw_secret(pgjobq_worker *w)
{
    uint64_t v = 0;
    size_t got = 0;

    while (got < sizeof v) {
        ssize_t n = getrandom((char *)&v + got, sizeof v - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (got < sizeof v) {
        FILE *f = fopen("/dev/urandom", "rb");
        got = f ? fread(&v, 1, sizeof v, f) : 0;
        if (f)
            fclose(f);
        if (got < sizeof v)
            return pgjobq__worker_err(w, PGJOBQ_ENOMEM, "no random bytes for the worker's secret: %s", strerror(errno));
    }
    snprintf(w->secret_s, sizeof w->secret_s, "%lld", (long long)(int64_t)v);
    return PGJOBQ_OK;
}

/* Everything has returned or given up: write what is left (best effort), then free it all. */
static void finish(pgjobq_worker *w)
{
    /* A clean stop says so in pgjobq.workers at once: stopped, not alive (a crashed worker ages out).
     * On the write connection, or, when it is not up (a worker stopped as soon as it started: its
     * connections come up one by one), on another that is. */
    static const int order[] = {PGJOBQ__C_WRITE, PGJOBQ__C_MAINT, PGJOBQ__C_CLAIM};
    pgjobq__aconn *wc = NULL;
    for (size_t i = 0; i < sizeof order / sizeof order[0] && wc == NULL; i++) {
        pgjobq__aconn *ac = &w->conn[order[i]];
        if (ac->state == PGJOBQ__AC_READY && !ac->busy && ac->pg)
            wc = ac;
    }
    if (wc && !w->fatal) {
        const char *values[2] = {w->worker_id, w->secret_s};
        PGresult *r = PQexecParams(wc->pg, "SELECT pgjobq.worker_gone($1, $2)", 2, NULL, values, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK)
            wlog(w, PGJOBQ_LOG_DEBUG, "could not record this worker as stopped in pgjobq.workers: %s",
                 PQresultErrorMessage(r));
        PQclear(r);
    }
    for (int k = 0; k < PGJOBQ__W_KINDS; k++) {
        for (size_t i = 0; i < w->pending[k].n; i++)
            running_drop(w, w->pending[k].items[i]);
        free(w->pending[k].items);
        w->pending[k].items = NULL;
        w->pending[k].n = 0;
    }
    progress_forget(w);
    free(w->progress_sent);
    w->progress_sent = NULL;
    w->progress_cap = 0;
    for (int c = 0; c < PGJOBQ__NCONN; c++) {
        for (size_t i = 0; i < w->req[c].items.n; i++)
            running_drop(w, w->req[c].items.items[i]);
        free(w->req[c].items.items);
        memset(&w->req[c], 0, sizeof w->req[c]);
        pgjobq__aconn_close(&w->conn[c]);
    }
    /* Whatever is left (jobs whose outcome could not be written) goes back through its lease. */
    while (w->nrunning > 0)
        running_drop(w, w->running[w->nrunning - 1]);
}

/* The pool's mailbox lock and each queue's lock and condition: 0, or the error number of the one
 * that failed (then none is left set up). */
static int init_sync(pgjobq_worker *w)
{
    int e, i;

    if ((e = pgjobq__pool_init(&w->pool, w->worker_id, pool_wake, w)) != 0)
        return e;
    w->pool.conninfo = w->conninfo;
    w->pool.tcp_timeout_ms = tcp_timeout(w);
    for (i = 0; i < w->nqueues; i++) {
        if ((e = pthread_mutex_init(&w->queues[i].mu, NULL)) != 0)
            break;
        if ((e = pthread_cond_init(&w->queues[i].cv, NULL)) != 0) {
            pthread_mutex_destroy(&w->queues[i].mu);
            break;
        }
    }
    if (e == 0)
        return 0;
    while (--i >= 0) {
        pthread_mutex_destroy(&w->queues[i].mu);
        pthread_cond_destroy(&w->queues[i].cv);
    }
    pgjobq__pool_destroy(&w->pool);
    return e;
}

int pgjobq_worker_run(pgjobq_worker *w)
{
    int rc = PGJOBQ_OK, e;
    char err[256];

    if (w == NULL)
        return PGJOBQ_EINVAL;
    if (w->ran)
        return pgjobq__worker_err(w, PGJOBQ_EINVAL, "pgjobq_worker_run was already called");
    w->ran = 1;
    if (w->nqueues == 0)
        return pgjobq__worker_err(w, PGJOBQ_EINVAL, "no queue to serve: add a handler with pgjobq_worker_handle");
    if (atomic_load(&w->stop_requests) > 0)
        return pgjobq__worker_err(w, PGJOBQ_ESTOPPED, "pgjobq_worker_stop was called before the worker ran: it did nothing");
    if ((rc = draw_secret(w)) != PGJOBQ_OK)
        return rc;
    if (pipe(w->wake_pipe) != 0)
        return pgjobq__worker_err(w, PGJOBQ_ENOMEM, "pipe: %s", strerror(errno));
    for (int k = 0; k < 2; k++) {
        if (fcntl(w->wake_pipe[k], F_SETFL, O_NONBLOCK) != 0 || fcntl(w->wake_pipe[k], F_SETFD, FD_CLOEXEC) != 0)
            return pgjobq__worker_err(w, PGJOBQ_ENOMEM, "fcntl: %s", strerror(errno));
    }
    if ((e = init_sync(w)) != 0)
        return pgjobq__worker_err(w, PGJOBQ_ENOMEM, "cannot set up the worker's locks: %s", strerror(e));
    for (int i = 0; i < w->nqueues; i++) {
        pgjobq__queue *q = &w->queues[i];
        q->claim.concurrency = q->concurrency;
        q->claim.batch_max = w->o.batch_max;
        q->timeout_ms = w->o.timeout_ms;
    }
    init_connections(w);
    if ((rc = pgjobq__pool_start(&w->pool, w->queues, w->nqueues, err, sizeof err)) != PGJOBQ_OK) {
        pgjobq__worker_err(w, rc, "%s", err);
        goto done;
    }
    int64_t now = pgjobq__mono_ms();
    w->next_heartbeat_ms = now + w->o.heartbeat_ms;
    w->next_rescue_ms = now;
    w->rescue_since_us = PGJOBQ_TIME_NONE;
    w->next_full_rescue_ms = now;
    w->next_tick_ms = now;
    unsigned seed = (unsigned)getpid() ^ (unsigned)(uintptr_t)w ^ (unsigned)now;
    /* pgjobq__jitter(2d) is uniform in [d, 2d]: less d, in [0, d]. */
    w->next_health_ms = now + FIRST_PRUNE_MS + pgjobq__jitter(2 * FIRST_SPREAD_MS, &seed) - FIRST_SPREAD_MS;
    w->next_prune_ms = now + FIRST_PRUNE_MS + pgjobq__jitter(2 * FIRST_SPREAD_MS, &seed) - FIRST_SPREAD_MS;
    w->last_summary_ms = now;
    {
        /* Each queue with its slots, as --queue takes them: what the worker serves, at a glance. */
        char served[1024];
        size_t len = 0;
        served[0] = '\0';
        for (int i = 0; i < w->nqueues && len < sizeof served; i++) {
            int n = snprintf(served + len, sizeof served - len, "%s%s:%d", i ? ", " : "", w->queues[i].name,
                             w->queues[i].concurrency);
            if (n < 0)
                break;
            len += (size_t)n;
        }
        wlog(w, PGJOBQ_LOG_INFO, "worker %s started: queue%s %s, lease %lld ms, heartbeat %lld ms, timeout %lld ms",
             w->worker_id, w->nqueues == 1 ? "" : "s", served, (long long)w->o.lease_ms,
             (long long)w->o.heartbeat_ms, (long long)w->o.timeout_ms);
    }

    for (;;) {
        now = pgjobq__mono_ms();
        phase_burst(w);
        phase_stop(w, now);
        phase_health(w, now);
        phase_collect(w, now);
        for (int c = 0; c < PGJOBQ__NCONN; c++)
            if (c != PGJOBQ__C_MAINT || !w->o.no_maintenance)
                pgjobq__aconn_start(&w->conn[c], now);
        phase_write(w, now);
        phase_claim(w, now);
        phase_maintain(w, now);
        phase_deadlines(w, now);
        if (phase_done(w, now))
            break;
        log_summary(w, now);
        phase_poll(w, now, pgjobq__pool_help(w->queues, w->nqueues));
    }
    rc = w->exit_rc;
    if (rc == PGJOBQ_OK && w->handed_back)
        rc = pgjobq__worker_err(w, PGJOBQ_ETIMEOUT, "%s",
                  w->handed_back == 2 ? "jobs still running at the second stop request were handed back"
                                      : "jobs still running at the shutdown timeout were handed back");

done:
    pgjobq__pool_stop(w->queues, w->nqueues);
    /* Outcomes that arrived after the loop ended are dropped with the rest. */
    phase_collect(w, pgjobq__mono_ms());
    finish(w);
    for (int i = 0; i < w->nqueues; i++) {
        pthread_mutex_destroy(&w->queues[i].mu);
        pthread_cond_destroy(&w->queues[i].cv);
    }
    pgjobq__pool_destroy(&w->pool);
    wlog(w, PGJOBQ_LOG_INFO, "worker %s stopped", w->worker_id);
    return rc;
}
