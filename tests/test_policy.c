/*
 * test_policy.c - the worker's decisions (src/policy.c), checked as pure functions: when to claim and
 * how much, where a claim starts (the cursor, src/cursor.c), when to write outcomes, how reconnects
 * back off.  No database is involved.
 */
#include <string.h>

#include "engine.h"
#include "harness.h"

static pgjobq__claim_view view(int concurrency, int running)
{
    pgjobq__claim_view v;
    memset(&v, 0, sizeof v);
    v.concurrency = concurrency;
    v.running = running;
    v.batch_max = 100;
    v.next_poll_ms = 1000000; /* far away unless a test says otherwise */
    return v;
}

TEST(policy_claim_takes_free_slots_when_woken_or_polled)
{
    pgjobq__claim_view v = view(32, 0);
    int from_cursor = -1;

    /* Idle and not woken: wait for the poll. */
    CHECK_INT(pgjobq__claim_decide(&v, 0, &from_cursor), 0);
    CHECK_INT(from_cursor, 0);
    CHECK_INT(pgjobq__claim_next_ms(&v), 1000000);
    /* The poll comes: claim every free slot. */
    CHECK_INT(pgjobq__claim_decide(&v, 1000000, &from_cursor), 32);
    /* A notification: claim at once, free slots only, never more than a batch. */
    v.woken = 1;
    v.running = 30;
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 2);
    v.concurrency = 500;
    v.running = 0;
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 100);
    /* Full: nothing, however woken, and nothing to wait for but a finishing handler. */
    v.running = 500;
    CHECK_INT(pgjobq__claim_decide(&v, 2000000, NULL), 0);
    CHECK_INT(pgjobq__claim_next_ms(&v), INT64_MAX);
}

TEST(policy_claim_under_a_backlog_waits_for_half_a_batch)
{
    pgjobq__claim_view v = view(32, 31);

    v.last_full = 1;
    /* One slot free of 32: a claim of one job would fragment the batches. */
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 0);
    v.running = 17;
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 0);
    v.running = 16; /* half of the batch (32) free */
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 16);
    /* With a larger concurrency the batch is capped: half of 100. */
    v = view(1000, 951);
    v.last_full = 1;
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 0);
    v.running = 950;
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 50);
    /* Nothing running: claim whatever is free, even one. */
    v = view(1, 0);
    v.last_full = 1;
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 1);
    /* A backlog is never polled: finishing handlers drive the claims, half a batch at a time (a poll
     * would claim whatever few slots were free at that instant). */
    v.running = 1;
    CHECK_INT(pgjobq__claim_next_ms(&v), INT64_MAX);
    v = view(32, 31);
    v.last_full = 1;
    CHECK_INT(pgjobq__claim_decide(&v, v.next_poll_ms + 1, NULL), 0);
}

TEST(policy_claim_starts_at_the_cursor_and_regularly_at_the_low_water_marks)
{
    pgjobq__claim_view v = view(32, 0);
    int from_cursor = -1;

    v.woken = 1;
    v.low_ms = 1000;
    /* No cursor yet: from the low-water marks. */
    CHECK_INT(pgjobq__claim_decide(&v, 1010, &from_cursor), 32);
    CHECK_INT(from_cursor, 0);
    /* A cursor, and the last claim from the marks was recent: from the cursor, backlog or not (it is
     * behind nothing that can still appear, src/cursor.c). */
    v.cursor_valid = 1;
    CHECK_INT(pgjobq__claim_decide(&v, 1010, &from_cursor), 32);
    CHECK_INT(from_cursor, 1);
    v.last_full = 1;
    CHECK_INT(pgjobq__claim_decide(&v, 1000 + PGJOBQ__LOW_CLAIM_MS - 1, &from_cursor), 32);
    CHECK_INT(from_cursor, 1);
    /* From the marks at least every PGJOBQ__LOW_CLAIM_MS: they find what a rolled-back claim left behind
     * every cursor. */
    CHECK_INT(pgjobq__claim_decide(&v, 1000 + PGJOBQ__LOW_CLAIM_MS, &from_cursor), 32);
    CHECK_INT(from_cursor, 0);
}

/* A claimed job for the cursor tests: priority, key (microseconds), id. */
static pgjobq__claimed job(int priority, int64_t key, int64_t id)
{
    pgjobq__claimed j = {(int16_t)priority, key, id};
    return j;
}

TEST(policy_cursor_moves_to_the_largest_key_claimed_but_never_past_the_cap)
{
    pgjobq__cursor c;
    pgjobq__claimed jobs[4];
    int16_t exhausted[2];

    pgjobq__cursor_reset(&c);
    CHECK_INT(c.nvalid, 0);
    /* Without a cap nothing moves: rows not yet visible could be anywhere after the claim's start. */
    jobs[0] = job(0, 500, 7);
    CHECK_INT((pgjobq__cursor_update(&c, jobs, 1, NULL, 0, PGJOBQ_TIME_NONE), c.nvalid), 0);
    /* A full batch from level 0: to the largest (key, id) claimed there, in any order. */
    jobs[0] = job(0, 500, 9);
    jobs[1] = job(0, 700, 3);
    jobs[2] = job(0, 700, 2);
    jobs[3] = job(5, 100, 50);
    pgjobq__cursor_update(&c, jobs, 4, NULL, 0, 10000);
    CHECK_INT(c.nvalid, 2);
    CHECK(c.valid[100] && c.key_us[100] == 700 && c.id[100] == 3);
    CHECK(c.valid[105] && c.key_us[105] == 100 && c.id[105] == 50);
    /* Past the cap: to the cap, where everything not yet visible is after it. */
    jobs[0] = job(0, 20000, 11);
    pgjobq__cursor_update(&c, jobs, 1, NULL, 0, 15000);
    CHECK(c.key_us[100] == 15000 && c.id[100] == 0);
    /* A level read to its end moves to the cap, claimed rows or not; other levels stay. */
    exhausted[0] = 5;
    exhausted[1] = -100;
    pgjobq__cursor_update(&c, NULL, 0, exhausted, 2, 16000);
    CHECK(c.key_us[105] == 16000 && c.id[105] == 0);
    CHECK(c.valid[0] && c.key_us[0] == 16000);
    CHECK(c.key_us[100] == 15000);
    CHECK_INT(c.nvalid, 3);
    /* Levels out of range are ignored. */
    jobs[0] = job(101, 1, 1);
    exhausted[0] = -101;
    pgjobq__cursor_update(&c, jobs, 1, exhausted, 1, 17000);
    CHECK_INT(c.nvalid, 3);
}

static void count_tick(void *arg, const pgjobq__tick *t)
{
    int64_t *seen = arg;
    seen[0]++;
    if (seen[1] == 0 || t->at_us < seen[1])
        seen[1] = t->at_us;
    if (t->at_us > seen[2])
        seen[2] = t->at_us;
}

TEST(policy_ticks_keep_the_latest_claims_and_older_ones_thinned_out)
{
    pgjobq__ticks t;
    int64_t seen[3] = {0, 0, 0};

    memset(&t, 0, sizeof t);
    /* A claim every millisecond for ten minutes. */
    for (int64_t ms = 1; ms <= 600000; ms++)
        pgjobq__ticks_add(&t, ms * 1000, ms);
    pgjobq__ticks_each(&t, count_tick, seen);
    /* Bounded, the latest claim is there, and ticks reach back minutes (a cap can be found while a
     * transaction runs for that long). */
    CHECK(seen[0] <= PGJOBQ__TIERS * PGJOBQ__TIER_TICKS);
    CHECK_INT(seen[2], 600000 * 1000);
    CHECK(seen[1] <= (600000 - 120000) * 1000);
    /* The first tier holds the last PGJOBQ__TIER_TICKS claims. */
    CHECK_INT(t.tier[0].n, PGJOBQ__TIER_TICKS);
}

TEST(policy_flush_when_nothing_more_can_join_or_after_the_linger)
{
    /* Nothing pending: nothing to do. */
    CHECK_INT(pgjobq__flush_decide(0, 0, 0, 1, 100, 2), 0);
    /* Handlers still running: wait up to the linger for more outcomes to join. */
    CHECK_INT(pgjobq__flush_decide(5, 100, 3, 0, 101, 2), 0);
    CHECK_INT(pgjobq__flush_decide(5, 100, 3, 0, 102, 2), 1);
    /* No handler running: nothing more can join; write now. */
    CHECK_INT(pgjobq__flush_decide(5, 100, 0, 0, 100, 2), 1);
    /* Stopping: write now. */
    CHECK_INT(pgjobq__flush_decide(1, 100, 3, 1, 100, 2), 1);
}

TEST(policy_backoff_doubles_to_a_cap_and_jitter_stays_in_range)
{
    int64_t d = 0;
    unsigned seed = 0;

    d = pgjobq__backoff_next(d, 100, 30000);
    CHECK_INT(d, 100);
    d = pgjobq__backoff_next(d, 100, 30000);
    CHECK_INT(d, 200);
    for (int i = 0; i < 20; i++)
        d = pgjobq__backoff_next(d, 100, 30000);
    CHECK_INT(d, 30000);
    /* Jitter in [d/2, d], and not always the same value. */
    int64_t lo = INT64_MAX, hi = 0;
    for (int i = 0; i < 10000; i++) {
        int64_t j = pgjobq__jitter(1000, &seed);
        CHECK(j >= 500 && j <= 1000);
        lo = j < lo ? j : lo;
        hi = j > hi ? j : hi;
    }
    CHECK_MSG(lo < 550 && hi > 950, "jitter spans only [%lld, %lld] of [500, 1000]", (long long)lo, (long long)hi);
    CHECK(seed != 0);
}

TEST(policy_lease_margin_is_a_tenth_of_the_lease_at_most_five_seconds)
{
    CHECK_INT(pgjobq__lease_margin(2000), 200);
    CHECK_INT(pgjobq__lease_margin(60000), 5000);
    CHECK_INT(pgjobq__lease_margin(3600000), 5000);
}

TEST(policy_prefetch_holds_a_bounded_wait_ahead_and_none_for_slow_or_unknown_handlers)
{
    /* Unknown speed (nothing handled yet): nothing ahead. */
    CHECK_INT(pgjobq__prefetch(1000, 0, 32, 100, 20), 0);
    /* Fast handlers (5 us): a whole batch ahead, whatever the concurrency. */
    CHECK_INT(pgjobq__prefetch(5000, 10, 8, 100, 20), 100);
    CHECK_INT(pgjobq__prefetch(5000, 10, 500, 100, 20), 100);
    /* 1 ms per job on 8 threads: 160 would take 20 ms; capped at the batch.  10 ms on 2 threads: the
     * 4 jobs 2 threads run in 20 ms. */
    CHECK_INT(pgjobq__prefetch(1000000, 10, 8, 100, 20), 100);
    CHECK_INT(pgjobq__prefetch(10000000, 10, 2, 100, 20), 4);
    /* Slower than the whole budget: none. */
    CHECK_INT(pgjobq__prefetch(PGJOBQ__PREFETCH_WAIT_NS, 10, 1024, 100, 20), 0);
    CHECK_INT(pgjobq__prefetch(INT64_C(5000000000), 10, 1024, 100, 20), 0);
    /* Large payloads: at most 8 MiB held ahead (1 MiB payloads: 8 jobs). */
    CHECK_INT(pgjobq__prefetch(5000, 10, 8, 100, 1 << 20), 8);
    CHECK_INT(pgjobq__prefetch(5000, 10, 8, 100, 16 << 20), 0);
}

TEST(policy_claim_counts_prefetched_jobs_against_concurrency_plus_prefetch)
{
    pgjobq__claim_view v = view(32, 32);

    v.woken = 1;
    /* Every handler busy and nothing ahead allowed: no claim. */
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 0);
    /* Fast handlers: the next batch may be claimed while these run. */
    v.prefetch = 32;
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 32);
    v.running = 64;
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 0);
    CHECK_INT(pgjobq__claim_next_ms(&v), INT64_MAX);
    /* Under a backlog the half-batch rule counts the prefetch: half of 64. */
    v.woken = 0;
    v.last_full = 1;
    v.running = 33;
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 0); /* 31 free of 64: less than half */
    v.running = 32;
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 32);
}

TEST(policy_claim_stops_while_outcomes_pile_up_unwritten)
{
    pgjobq__claim_view v = view(32, 0);

    v.woken = 1;
    /* A batch being written does not hold the next claim back... */
    v.unwritten = 32;
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 32);
    /* ...but more unwritten outcomes than slots (a stalled write connection) stop the claims. */
    v.unwritten = 33;
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 0);
    v.prefetch = 32;
    CHECK_INT(pgjobq__claim_decide(&v, 0, NULL), 64);
}

TEST(policy_after_an_empty_claim_sleep_until_the_next_due_job_but_never_spin)
{
    /* The next job is due in 2.5 s, the poll in 1 s: the poll. In 0.3 s from the claim's start
     * (sent at 1000): then. */
    CHECK_INT(pgjobq__claim_after_due(2.5, 1000, 2000, 0), 2000);
    CHECK_INT(pgjobq__claim_after_due(0.3, 1000, 2000, 0), 1301);
    /* Due already, yet the claim got nothing: another claimer holds it; do not claim again at once
     * (forty idle workers did, every millisecond, and starved the database). */
    CHECK_INT(pgjobq__claim_after_due(0.0, 1000, 2000, 0), 2000);
    CHECK_INT(pgjobq__claim_after_due(-5.0, 1000, 2000, 0), 2000);
    /* Nothing queued. */
    CHECK_INT(pgjobq__claim_after_due(0.0 / 0.0, 1000, 2000, 0), 2000);
}

TEST(policy_a_worker_that_handed_back_a_job_it_could_not_run_claims_it_after_the_others)
{
    /* Yielding: PGJOBQ__YIELD_MS after the job is due, so that a worker that can run it (it claims at
     * 1301) takes it first; never after the poll, and nothing changes when nothing is due soon. */
    CHECK_INT(pgjobq__claim_after_due(0.3, 1000, 2000, PGJOBQ__YIELD_MS), 1301 + PGJOBQ__YIELD_MS);
    CHECK(1301 + PGJOBQ__YIELD_MS < 2000);
    CHECK_INT(pgjobq__claim_after_due(0.98, 1000, 2000, PGJOBQ__YIELD_MS), 2000);
    CHECK_INT(pgjobq__claim_after_due(2.5, 1000, 2000, PGJOBQ__YIELD_MS), 2000);
    CHECK_INT(pgjobq__claim_after_due(0.0 / 0.0, 1000, 2000, PGJOBQ__YIELD_MS), 2000);
    CHECK_INT(pgjobq__claim_after_due(0.3, 1000, 2000, -7), 1301);
}

TEST(policy_a_woken_claim_that_keeps_finding_nothing_waits_longer_each_time)
{
    pgjobq__claim_view v = view(32, 0);

    /* No streak: claim on a notification at once. */
    CHECK_INT(pgjobq__claim_hold_ms(0), 0);
    v.woken = 1;
    CHECK_INT(pgjobq__claim_decide(&v, 100, NULL), 32);
    /* After claims on notifications that found nothing (another worker took the jobs), the next one
     * waits 1, 2, 4 ... ms, at most 256; the engine wakes up for it. */
    CHECK_INT(pgjobq__claim_hold_ms(1), 1);
    CHECK_INT(pgjobq__claim_hold_ms(3), 4);
    CHECK_INT(pgjobq__claim_hold_ms(9), 256);
    CHECK_INT(pgjobq__claim_hold_ms(1000), 256);
    v.hold_ms = 100 + pgjobq__claim_hold_ms(3);
    CHECK_INT(pgjobq__claim_decide(&v, 100, NULL), 0);
    CHECK_INT(pgjobq__claim_next_ms(&v), 104);
    CHECK_INT(pgjobq__claim_decide(&v, 104, NULL), 32);
    /* The poll is not held: a worker still claims at least every poll. */
    v.woken = 0;
    v.next_poll_ms = 102;
    CHECK_INT(pgjobq__claim_decide(&v, 102, NULL), 32);
    /* Under a backlog the hold does not apply: finishing handlers drive the claims. */
    v.woken = 1;
    v.last_full = 1;
    CHECK_INT(pgjobq__claim_decide(&v, 100, NULL), 32);
}

TEST(policy_the_gates_promise_makes_a_claim_due_whatever_holds_it_back_but_a_free_slot)
{
    pgjobq__claim_view v = view(4, 1);

    /* Nothing due: the next look is the poll.  The promise (worker.c, "The notification gate") comes
     * first, and at its time the claim is ready though no notification came and the poll is later. */
    v.next_poll_ms = 1000;
    CHECK_INT(pgjobq__claim_decide(&v, 100, NULL), 0);
    CHECK_INT(pgjobq__claim_next_ms(&v), 1000);
    v.gate_ms = 105;
    CHECK_INT(pgjobq__claim_next_ms(&v), 105);
    CHECK_INT(pgjobq__claim_decide(&v, 104, NULL), 0);
    CHECK_INT(pgjobq__claim_decide(&v, 105, NULL), 3);
    /* Nor does a woken claim's hold delay it. */
    v.woken = 1;
    v.hold_ms = 300;
    CHECK_INT(pgjobq__claim_next_ms(&v), 105);
    CHECK_INT(pgjobq__claim_decide(&v, 105, NULL), 3);
    /* Under a backlog too: the promise does not wait for half a batch of free slots. */
    v.woken = 0;
    v.last_full = 1;
    v.running = 3;
    CHECK_INT(pgjobq__claim_decide(&v, 104, NULL), 0);
    CHECK_INT(pgjobq__claim_next_ms(&v), 105);
    CHECK_INT(pgjobq__claim_decide(&v, 105, NULL), 1);
    /* No free slot: no claim and no wakeup for it (the engine hands the promise on, and keeps it for
     * the slot a finishing handler frees). */
    v.running = 4;
    CHECK_INT(pgjobq__claim_decide(&v, 200, NULL), 0);
    CHECK_INT(pgjobq__claim_next_ms(&v), INT64_MAX);
    /* No promise (0): the poll again. */
    v.running = 1;
    v.last_full = 0;
    v.gate_ms = 0;
    CHECK_INT(pgjobq__claim_next_ms(&v), 1000);
}

TEST(policy_a_worker_id_in_use_is_waited_for_until_the_row_could_be_stale_then_refused)
{
    /* Before registering: wait while a row left by a worker that died could still look alive. */
    CHECK_INT(pgjobq__id_in_use(0, 1000, 1000), PGJOBQ__ID_WAIT);
    CHECK_INT(pgjobq__id_in_use(0, 1000, 1000 + PGJOBQ__ID_STALE_MS), PGJOBQ__ID_WAIT);
    CHECK_INT(pgjobq__id_in_use(0, 1000, 1000 + PGJOBQ__ID_STALE_MS + PGJOBQ__BEAT_MS - 1), PGJOBQ__ID_WAIT);
    CHECK_INT(pgjobq__id_in_use(0, 1000, 1000 + PGJOBQ__ID_STALE_MS + PGJOBQ__BEAT_MS), PGJOBQ__ID_GIVE_UP);
    /* Registered before: someone took the id over. */
    CHECK_INT(pgjobq__id_in_use(1, 1000, 1000), PGJOBQ__ID_TAKEN);
}

/* Plays the engine's write loop over n rows, of which the rows bad[] are refused by the database:
 * returns the writes it took, and checks every good row was written once and every bad row found. */
static int play_split(size_t n, const size_t *bad, size_t nbad)
{
    pgjobq__split s;
    size_t rows[64], pending[256], np = n, written = 0, found = 0;
    int writes = 0;

    CHECK(n <= 256);
    memset(&s, 0, sizeof s);
    for (size_t i = 0; i < n; i++)
        pending[i] = i;
    while (np > 0) {
        size_t k = pgjobq__split_take(&s, np), refused = 0;
        CHECK(k >= 1 && k <= np && k <= 64);
        memcpy(rows, pending, k * sizeof *rows);
        memmove(pending, pending + k, (np - k) * sizeof *pending);
        np -= k;
        writes++;
        for (size_t i = 0; i < k; i++)
            for (size_t b = 0; b < nbad; b++)
                refused |= rows[i] == bad[b];
        if (!refused) {
            written += k;
            continue;
        }
        /* Refused: the rows go back to the front. */
        memmove(pending + k, pending, np * sizeof *pending);
        memcpy(pending, rows, k * sizeof *rows);
        np += k;
        if (pgjobq__split_refused(&s, k)) {
            CHECK_INT(k, 1);
            memmove(pending, pending + 1, --np * sizeof *pending);
            found++;
        }
    }
    CHECK_INT(written, n - nbad);
    CHECK_INT(found, nbad);
    return writes;
}

TEST(policy_a_refused_batch_is_written_again_in_halves_until_the_refused_rows_are_alone)
{
    /* One refused row among 64: about two writes per halving. */
    CHECK(play_split(64, (size_t[]){37}, 1) <= 2 * 6 + 1);
    CHECK(play_split(64, (size_t[]){0}, 1) <= 2 * 6 + 1);
    CHECK(play_split(64, (size_t[]){63}, 1) <= 2 * 6 + 1);
    /* Several, and every row. */
    play_split(64, (size_t[]){1, 2, 40}, 3);
    CHECK_INT(play_split(1, (size_t[]){0}, 1), 1);
    size_t all[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    play_split(8, all, 8);
    /* Nothing refused: one write. */
    CHECK_INT(play_split(64, NULL, 0), 1);
    /* A write that did not happen comes back as the next part while parts remain. */
    pgjobq__split s;
    memset(&s, 0, sizeof s);
    CHECK_INT(pgjobq__split_take(&s, 10), 10);
    CHECK_INT(pgjobq__split_refused(&s, 10), 0);
    CHECK_INT(pgjobq__split_take(&s, 10), 5);
    pgjobq__split_requeued(&s, 5);
    CHECK_INT(pgjobq__split_take(&s, 10), 5);
    CHECK_INT(pgjobq__split_take(&s, 5), 5);
    CHECK_INT(pgjobq__split_take(&s, 7), 7); /* no part left: everything pending */
    /* Only refusals of the values split a batch. */
    CHECK(pgjobq__refused_by_value("22003") && pgjobq__refused_by_value("23514") && pgjobq__refused_by_value("54000"));
    CHECK(!pgjobq__refused_by_value("40001") && !pgjobq__refused_by_value("42501") && !pgjobq__refused_by_value(NULL) &&
          !pgjobq__refused_by_value("57014") && !pgjobq__refused_by_value("08006"));
}

/* The gate's entry rule: a claim may stamp the gate only where the queue's notifications come faster
 * than one a window, or while a promise holds. */
TEST(policy_the_gate_shuts_only_for_notifications_faster_than_its_window)
{
    int64_t last = 0, gap = 0;

    /* Nothing known yet (no notification, or no window reported): no stamp. */
    CHECK_INT(pgjobq__gate_wanted(PGJOBQ__GATE_NONE, 0, 5000), 0);
    pgjobq__gate_note(&last, &gap, 1000000, 5000);
    CHECK_INT(gap, 0);
    CHECK_INT(pgjobq__gate_wanted(PGJOBQ__GATE_NONE, gap, 0), 0);
    /* One every 2 ms: the average comes to 2 ms, below a window of 5. */
    for (int i = 1; i <= 20; i++)
        pgjobq__gate_note(&last, &gap, 1000000 + i * 2000, 5000);
    CHECK_INT(gap, 2000);
    CHECK_INT(pgjobq__gate_wanted(PGJOBQ__GATE_NONE, gap, 5000), 1);
    /* The quiet of a shut gate counts as twice the window, once: the gate may shut again at once. */
    pgjobq__gate_note(&last, &gap, 1000000 + 40000 + 3000000, 5000);
    CHECK_INT(gap, 2000 + (10000 - 2000) / 4);
    CHECK_INT(pgjobq__gate_wanted(PGJOBQ__GATE_NONE, gap, 5000), 1);
    /* One every 6.7 ms (a producer of batches at 15,000 jobs/s): never. */
    for (int i = 1; i <= 40; i++)
        pgjobq__gate_note(&last, &gap, last + 6700, 5000);
    CHECK(gap > 6000 && gap <= 6700);
    CHECK_INT(pgjobq__gate_wanted(PGJOBQ__GATE_NONE, gap, 5000), 0);
    /* While a promise holds, whatever the notifications: a steady load keeps the gate shut. */
    CHECK_INT(pgjobq__gate_wanted(PGJOBQ__GATE_WINDOW, gap, 5000), 1);
    CHECK_INT(pgjobq__gate_wanted(PGJOBQ__GATE_HORIZON, 0, 0), 1);
    /* A clock that went back records the time and nothing else. */
    int64_t before = gap;
    pgjobq__gate_note(&last, &gap, last - 100, 5000);
    CHECK_INT(gap, before);
}
