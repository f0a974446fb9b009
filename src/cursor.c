/*
 * cursor.c - where a worker's next claim starts.
 *
 * Every claimed and finished job leaves dead row versions and index entries behind.  Vacuum removes
 * them, but while any session holds a snapshot open (pg_dump, a long report, an idle transaction, a
 * standby with hot_standby_feedback) it can remove nothing that died after the snapshot was taken, and
 * a claim that starts at the head of the queue steps over every entry claimed since.  So a worker
 * starts each claim, per priority level, at its cursor: the key (claim key, then id) after which the
 * level holds everything it has not yet seen.
 *
 * The cursor must never pass a place where a row can still appear.  A row appears when the transaction
 * that wrote it commits, and its claim key is at least the database's clock when it was written, read
 * after that transaction got its id (pgjobq.jobs.ready_at; sql/functions/claim.sql).  Each claim
 * reports a tick: its moment on the database clock, read before its own transaction got an id, and that
 * id.  When the oldest transaction still running at a later claim's snapshot is younger than a tick's
 * id, every transaction that was running at the tick's moment has ended, so every row not yet visible
 * to that claim has a key after the tick's moment: the claim's cap.  A cursor never goes past the cap
 * of the claim that moves it, so whatever commits later is still ahead of it.
 *
 * Rows that a claim locked and then gave back by rolling back sit behind every cursor; the claims that
 * start at the queue's published low-water marks (PGJOBQ__LOW_CLAIM_MS) find them.
 */
#include <string.h>

#include "engine.h"

/* Each tier keeps its latest ticks at least this far apart (microseconds), at most PGJOBQ__TIER_TICKS:
 * the last 16 claims, then about 1.6 s, 16 s and 3 minutes back. */
static const int64_t tier_spacing_us[PGJOBQ__TIERS] = {0, INT64_C(100000), INT64_C(1000000), INT64_C(10000000)};

void pgjobq__ticks_add(pgjobq__ticks *t, int64_t at_us, int64_t xid)
{
    for (int k = 0; k < PGJOBQ__TIERS; k++) {
        pgjobq__tick_tier *r = &t->tier[k];
        if (r->n > 0) {
            const pgjobq__tick *last = &r->t[(r->next + PGJOBQ__TIER_TICKS - 1) % PGJOBQ__TIER_TICKS];
            if (at_us - last->at_us < tier_spacing_us[k])
                continue;
        }
        r->t[r->next].at_us = at_us;
        r->t[r->next].xid = xid;
        r->next = (r->next + 1) % PGJOBQ__TIER_TICKS;
        if (r->n < PGJOBQ__TIER_TICKS)
            r->n++;
    }
}

void pgjobq__ticks_each(const pgjobq__ticks *t, void (*fn)(void *arg, const pgjobq__tick *tick), void *arg)
{
    for (int k = 0; k < PGJOBQ__TIERS; k++)
        for (int i = 0; i < t->tier[k].n; i++)
            fn(arg, &t->tier[k].t[i]);
}

void pgjobq__cursor_reset(pgjobq__cursor *c)
{
    memset(c, 0, sizeof *c);
}

static void set(pgjobq__cursor *c, int level, int64_t key_us, int64_t id)
{
    if (!c->valid[level])
        c->nvalid++;
    c->valid[level] = 1;
    c->key_us[level] = key_us;
    c->id[level] = id;
}

void pgjobq__cursor_update(pgjobq__cursor *c, const pgjobq__claimed *jobs, int n, const int16_t *exhausted,
                           int nexhausted, int64_t cap_us)
{
    unsigned char seen[PGJOBQ__LEVELS];
    int64_t key[PGJOBQ__LEVELS], id[PGJOBQ__LEVELS];

    /* Without a cap nothing is known about the rows still to appear: stay. */
    if (cap_us == PGJOBQ_TIME_NONE)
        return;
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < n; i++) {
        int l = jobs[i].priority + 100;
        if (l < 0 || l >= PGJOBQ__LEVELS)
            continue;
        if (!seen[l] || jobs[i].key_us > key[l] || (jobs[i].key_us == key[l] && jobs[i].id > id[l])) {
            key[l] = jobs[i].key_us;
            id[l] = jobs[i].id;
        }
        seen[l] = 1;
    }
    for (int l = 0; l < PGJOBQ__LEVELS; l++)
        if (seen[l])
            set(c, l, key[l] < cap_us ? key[l] : cap_us, key[l] < cap_us ? id[l] : 0);
    /* Read to the end: everything that can still appear there is after the cap. */
    for (int i = 0; i < nexhausted; i++) {
        int l = exhausted[i] + 100;
        if (l >= 0 && l < PGJOBQ__LEVELS)
            set(c, l, cap_us, 0);
    }
}
