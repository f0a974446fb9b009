/*
 * policy.c - the worker's decisions: when to claim and how much, when to write outcomes, how long to
 * wait before reconnecting, when a lease must be given up.  Pure functions of the state they are
 * given and the clock; the engine (worker.c) carries them out.  tests/test_policy.c checks them
 * without a database.
 */
#include <string.h>
#include <time.h>

#include "engine.h"

int64_t pgjobq__mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int batch_of(const pgjobq__claim_view *v)
{
    int slots = v->concurrency + v->prefetch;
    return slots < v->batch_max ? slots : v->batch_max;
}

int pgjobq__prefetch(int64_t handler_ns, int64_t handled, int concurrency, int batch_max, int64_t payload_bytes)
{
    int64_t n, by_bytes;

    if (handled <= 0 || handler_ns >= PGJOBQ__PREFETCH_WAIT_NS)
        return 0;
    n = handler_ns <= 0 ? batch_max : PGJOBQ__PREFETCH_WAIT_NS / handler_ns * concurrency;
    by_bytes = PGJOBQ__PREFETCH_BYTES / (payload_bytes > 0 ? payload_bytes : 1);
    if (by_bytes < n)
        n = by_bytes;
    return n < batch_max ? (int)n : batch_max;
}

int pgjobq__claim_decide(const pgjobq__claim_view *v, int64_t now_ms, int *from_cursor)
{
    int free_slots = v->concurrency + v->prefetch - v->running, ready;

    if (from_cursor)
        *from_cursor = 0;
    if (free_slots <= 0 || v->unwritten > v->concurrency + v->prefetch)
        return 0;
    /* Under a backlog, finishing handlers drive the claims (half a batch at a time): a poll then would
     * only claim the few slots free at that instant. */
    if (v->last_full)
        ready = v->woken || free_slots >= (batch_of(v) + 1) / 2 || v->running == 0;
    else
        ready = (v->woken && now_ms >= v->hold_ms) || now_ms >= v->next_poll_ms;
    /* The gate's promise: producers skipped their notifications because this claim would come. */
    if (v->gate_ms > 0 && now_ms >= v->gate_ms)
        ready = 1;
    if (!ready)
        return 0;
    /* From the cursor, which nothing that can still appear is behind (cursor.c), but from the low-water
     * marks regularly: they find what a rolled-back claim left behind. */
    if (from_cursor)
        *from_cursor = v->cursor_valid && now_ms - v->low_ms < PGJOBQ__LOW_CLAIM_MS;
    return free_slots < v->batch_max ? free_slots : v->batch_max;
}

void pgjobq__gate_note(int64_t *last_us, int64_t *gap_us, int64_t now_us, int64_t window_us)
{
    int64_t gap, most = window_us > 0 ? 2 * window_us : 1000000;

    if (*last_us > 0 && now_us >= *last_us) {
        gap = now_us - *last_us < most ? now_us - *last_us : most;
        *gap_us = *gap_us > 0 ? *gap_us + (gap - *gap_us) / 4 : gap;
        if (*gap_us < 1)
            *gap_us = 1;
    }
    *last_us = now_us;
}

int pgjobq__gate_wanted(int state, int64_t gap_us, int64_t window_us)
{
    return state != PGJOBQ__GATE_NONE || (gap_us > 0 && gap_us < window_us);
}

int64_t pgjobq__claim_next_ms(const pgjobq__claim_view *v)
{
    /* Full: a finishing handler wakes the engine.  Under a backlog, so does a finishing handler (the
     * half-batch rule), and the poll would only fragment claims. */
    int64_t t;

    if (v->running >= v->concurrency + v->prefetch)
        return INT64_MAX;
    if (v->last_full)
        t = INT64_MAX;
    else if (v->woken && v->hold_ms < v->next_poll_ms)
        t = v->hold_ms;
    else
        t = v->next_poll_ms;
    return v->gate_ms > 0 && v->gate_ms < t ? v->gate_ms : t;
}

int64_t pgjobq__claim_hold_ms(int streak)
{
    if (streak <= 0)
        return 0;
    return streak >= 9 ? 256 : INT64_C(1) << (streak - 1);
}

int64_t pgjobq__claim_after_due(double due_in_s, int64_t sent_ms, int64_t next_poll_ms, int64_t yield_ms)
{
    if (!(due_in_s > 0)) /* nothing queued (NaN), or due already and held by someone else */
        return next_poll_ms;
    if (due_in_s * 1000.0 >= (double)(next_poll_ms - sent_ms))
        return next_poll_ms;
    int64_t at = sent_ms + (int64_t)(due_in_s * 1000.0) + 1 + (yield_ms > 0 ? yield_ms : 0);
    return at < next_poll_ms ? at : next_poll_ms;
}

int pgjobq__flush_decide(size_t pending, int64_t first_pending_ms, int outstanding, int stopping, int64_t now_ms,
                         int64_t linger_ms)
{
    if (pending == 0)
        return 0;
    return outstanding == 0 || stopping || now_ms - first_pending_ms >= linger_ms;
}

int pgjobq__refused_by_value(const char *sqlstate)
{
    if (sqlstate == NULL || strlen(sqlstate) != 5)
        return 0;
    return strncmp(sqlstate, "22", 2) == 0 || strncmp(sqlstate, "23", 2) == 0 || strncmp(sqlstate, "54", 2) == 0;
}

size_t pgjobq__split_take(pgjobq__split *s, size_t pending)
{
    size_t n;

    if (s->depth == 0)
        return pending;
    n = s->part[--s->depth];
    return n < pending ? n : pending;
}

int pgjobq__split_refused(pgjobq__split *s, size_t n)
{
    if (n <= 1)
        return 1;
    /* Depth grows by one for each halving, so a batch of n rows never needs more than log2(n) + 1
     * parts; a full stack (unreachable below 2^63 rows) writes the rest whole. */
    if (s->depth + 2 > PGJOBQ__SPLIT_DEPTH)
        return 0;
    s->part[s->depth++] = n - n / 2;
    s->part[s->depth++] = n / 2;
    return 0;
}

void pgjobq__split_requeued(pgjobq__split *s, size_t n)
{
    if (s->depth > 0 && s->depth < PGJOBQ__SPLIT_DEPTH)
        s->part[s->depth++] = n;
}

int64_t pgjobq__backoff_next(int64_t current_ms, int64_t min_ms, int64_t max_ms)
{
    if (current_ms <= 0)
        return min_ms;
    return current_ms > max_ms / 2 ? max_ms : current_ms * 2;
}

int64_t pgjobq__jitter(int64_t d, unsigned *seed)
{
    if (*seed == 0)
        *seed = (unsigned)pgjobq__mono_ms() ^ (unsigned)(uintptr_t)seed ^ 0x9e3779b9u;
    *seed = *seed * 1103515245u + 12345u;
    if (*seed == 0)
        *seed = 1;
    if (d <= 1)
        return d;
    return d / 2 + (int64_t)((*seed >> 8) % (unsigned)(d / 2 + 1));
}

int64_t pgjobq__lease_margin(int64_t lease_ms)
{
    return lease_ms / 10 < 5000 ? lease_ms / 10 : 5000;
}

pgjobq__id_verdict pgjobq__id_in_use(int registered, int64_t first_refused_ms, int64_t now_ms)
{
    if (registered)
        return PGJOBQ__ID_TAKEN;
    return now_ms - first_refused_ms < PGJOBQ__ID_STALE_MS + PGJOBQ__BEAT_MS ? PGJOBQ__ID_WAIT : PGJOBQ__ID_GIVE_UP;
}
