/*
 * test_steady.c - the claim's cursor and low-water marks (docs/design.md, "The claim's cursor"):
 * nothing claimable is ever passed over for good, and a claim does not step over the dead rows of
 * the jobs claimed before it, even while another session holds a snapshot open.
 *
 * The tests drive pgjobq.claim_next the way the worker does: the cursor and the ticks are moved by the
 * engine's own functions (src/cursor.c).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "harness.h"

/* A claimer: its cursor and ticks, as the engine keeps them, and its lease (NULL: a minute). */
typedef struct claimer {
    pgjobq__cursor cur;
    pgjobq__ticks ticks;
    const char *lease;
} claimer;

typedef struct tick_text {
    char times[4096], xids[4096];
    size_t tl, xl;
} tick_text;

static void tick_to_text(void *arg, const pgjobq__tick *t)
{
    tick_text *tt = arg;
    tt->tl += (size_t)snprintf(tt->times + tt->tl, sizeof tt->times - tt->tl, "%s%lld", tt->tl ? "," : "",
                               (long long)t->at_us);
    tt->xl += (size_t)snprintf(tt->xids + tt->xl, sizeof tt->xids - tt->xl, "%s%lld", tt->xl ? "," : "",
                               (long long)t->xid);
}

/* One claim of up to `want` jobs of queue q, from the claimer's cursor (or, low, from the marks); the
 * cursor and ticks move as the engine's would.  Returns the number of jobs; their ids go to ids (may be
 * NULL) and their lease tokens to tokens (may be NULL). */
static int claim(PGconn *pg, claimer *c, const char *q, int want, int low, int64_t *ids, int64_t *tokens)
{
    char levels[2048] = "", keys[4096] = "", cids[4096] = "", sql[32768]; /* holds all of the above */
    size_t ll = 0, kl = 0, il = 0;
    tick_text tt = {.tl = 0, .xl = 0};
    pgjobq__claimed *jobs = calloc((size_t)want, sizeof *jobs);
    int16_t exhausted[PGJOBQ__LEVELS];
    int nexh = 0, n = 0;
    int64_t cap = PGJOBQ_TIME_NONE;

    CHECK(jobs != NULL);
    tt.times[0] = tt.xids[0] = '\0';
    for (int l = 0; l < PGJOBQ__LEVELS; l++) {
        if (!c->cur.valid[l])
            continue;
        ll += (size_t)snprintf(levels + ll, sizeof levels - ll, "%s%d", ll ? "," : "", l - 100);
        kl += (size_t)snprintf(keys + kl, sizeof keys - kl, "%s%lld", kl ? "," : "", (long long)c->cur.key_us[l]);
        il += (size_t)snprintf(cids + il, sizeof cids - il, "%s%lld", il ? "," : "", (long long)c->cur.id[l]);
    }
    pgjobq__ticks_each(&c->ticks, tick_to_text, &tt);
    if (low)
        snprintf(sql, sizeof sql,
                 "SELECT id, priority, (extract(epoch FROM key) * 1000000)::bigint, meta,"
                 " (extract(epoch FROM cap) * 1000000)::bigint, tick_xid, lease_token"
                 " FROM pgjobq.claim_next('%s', %d, '%s', 'test', NULL, NULL, NULL,"
                 " ARRAY(SELECT 'epoch'::timestamptz + u * interval '1 microsecond' FROM unnest('{%s}'::bigint[]) u),"
                 " '{%s}'::bigint[])",
                 q, want, c->lease ? c->lease : "1 min", tt.times, tt.xids);
    else
        snprintf(sql, sizeof sql,
                 "SELECT id, priority, (extract(epoch FROM key) * 1000000)::bigint, meta,"
                 " (extract(epoch FROM cap) * 1000000)::bigint, tick_xid, lease_token"
                 " FROM pgjobq.claim_next('%s', %d, '%s', 'test', '{%s}'::smallint[],"
                 " ARRAY(SELECT 'epoch'::timestamptz + u * interval '1 microsecond' FROM unnest('{%s}'::bigint[]) u),"
                 " '{%s}'::bigint[],"
                 " ARRAY(SELECT 'epoch'::timestamptz + u * interval '1 microsecond' FROM unnest('{%s}'::bigint[]) u),"
                 " '{%s}'::bigint[])",
                 q, want, c->lease ? c->lease : "1 min", levels, keys, cids, tt.times, tt.xids);
    PGresult *r = t_exec(pg, "%s", sql);
    for (int row = 0; row < PQntuples(r); row++) {
        const char *meta = PQgetisnull(r, row, 3) ? NULL : PQgetvalue(r, row, 3);
        if (meta == NULL) {
            CHECK(n < want);
            jobs[n].id = atoll(PQgetvalue(r, row, 0));
            jobs[n].priority = (int16_t)atoi(PQgetvalue(r, row, 1));
            jobs[n].key_us = atoll(PQgetvalue(r, row, 2));
            if (ids)
                ids[n] = jobs[n].id;
            if (tokens)
                tokens[n] = atoll(PQgetvalue(r, row, 6));
            n++;
        } else if (strcmp(meta, "exhausted") == 0) {
            exhausted[nexh++] = (int16_t)atoi(PQgetvalue(r, row, 1));
        } else if (strcmp(meta, "tick") == 0) {
            if (!PQgetisnull(r, row, 4))
                cap = atoll(PQgetvalue(r, row, 4));
            pgjobq__ticks_add(&c->ticks, atoll(PQgetvalue(r, row, 2)), atoll(PQgetvalue(r, row, 5)));
        }
    }
    PQclear(r);
    pgjobq__cursor_update(&c->cur, jobs, n, exhausted, nexh, cap);
    free(jobs);
    return n;
}

/* Completes the jobs (ids, tokens) in one statement. */
static void complete(PGconn *pg, const int64_t *ids, const int64_t *tokens, int n)
{
    size_t cap = (size_t)n * 48 + 64, il = 0, tl = 0;
    char *is = malloc(cap), *ts = malloc(cap);
    CHECK(is != NULL && ts != NULL);
    is[0] = ts[0] = '\0';
    for (int i = 0; i < n; i++) {
        il += (size_t)snprintf(is + il, cap - il, "%s%lld", i ? "," : "", (long long)ids[i]);
        tl += (size_t)snprintf(ts + tl, cap - tl, "%s%lld", i ? "," : "", (long long)tokens[i]);
    }
    char *ia = malloc(il + 3), *ta = malloc(tl + 3);
    CHECK(ia != NULL && ta != NULL);
    snprintf(ia, il + 3, "{%s}", is);
    snprintf(ta, tl + 3, "{%s}", ts);
    const char *values[2] = {ia, ta};
    PGresult *r = PQexecParams(pg, "SELECT count(*) FROM pgjobq.complete_many($1::bigint[], $2::bigint[])"
                                   " WHERE outcome = 'completed'",
                               2, NULL, values, NULL, NULL, 0);
    CHECK_MSG(PQresultStatus(r) == PGRES_TUPLES_OK, "complete_many: %s", PQerrorMessage(pg));
    CHECK_INT(atoi(PQgetvalue(r, 0, 0)), n);
    PQclear(r);
    free(ia);
    free(ta);
    free(is);
    free(ts);
}

/* Enqueues three jobs of queue q, and claims them from c's cursor and completes them. */
static void take_three(PGconn *pg, claimer *c, const char *q)
{
    int64_t ids[100], tokens[100];

    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(ARRAY['%s', '%s', '%s'], NULL, NULL)", q, q, q));
    CHECK_INT(claim(pg, c, q, 100, 0, ids, tokens), 3);
    complete(pg, ids, tokens, 3);
}

TEST(cursor_claim_finds_a_job_whose_enqueue_commits_after_later_ones_were_claimed)
{
    PGconn *pg = t_pg(), *producer = t_pg();
    claimer c;
    int64_t ids[100];
    char other_db[1024];

    memset(&c, 0, sizeof c);
    /* A transaction of another database of the cluster stays open with an id all along: it holds back
     * every snapshot's oldest transaction, but cannot write these jobs, so the cursor still moves. */
    snprintf(other_db, sizeof other_db, "%s dbname=postgres", t_conninfo());
    PGconn *elsewhere = PQconnectdb(other_db);
    CHECK_MSG(PQstatus(elsewhere) == CONNECTION_OK, "%s", PQerrorMessage(elsewhere));
    PQclear(t_exec(elsewhere, "BEGIN"));
    PQclear(t_exec(elsewhere, "SELECT pg_current_xact_id()"));
    /* A first claim from the marks: the claimer has ticks from now on. */
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('q', payload => '{\"n\": 0}')"));
    CHECK_INT(claim(pg, &c, "q", 10, 1, NULL, NULL), 1);
    /* A transaction enqueues a job and stays open; meanwhile later jobs are enqueued, committed and
     * claimed: its job's key is before theirs. */
    PQclear(t_exec(producer, "BEGIN"));
    PQclear(t_exec(producer, "SELECT pgjobq.enqueue('q', payload => '{\"late\": true}')"));
    for (int round = 0; round < 5; round++)
        take_three(pg, &c, "q");
    CHECK(c.cur.valid[100]);
    /* Committed now, behind every job claimed: a claim from the cursor (not from the marks) takes it,
     * because the cursor never passed a moment when the open transaction was already writing. */
    PQclear(t_exec(producer, "COMMIT"));
    CHECK_INT(claim(pg, &c, "q", 100, 0, ids, NULL), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND payload = '{\"late\": true}'",
                    (long long)ids[0]),
              1);
    /* And its key is before the last job claimed before it: the cursor had to stay behind it. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs a, pgjobq.jobs l WHERE l.id = %lld"
                        " AND a.state = 'completed' AND a.id > l.id",
                    (long long)ids[0]),
              15);
    PQfinish(elsewhere);
    PQfinish(producer);
    PQfinish(pg);
}

/* A level's frontier, in microseconds since the epoch (0: never set). */
static long long frontier_of(PGconn *pg, const char *q)
{
    return t_int(pg,
                 "SELECT coalesce(pg_sequence_last_value(l.frontier), 0) FROM pgjobq.levels l"
                 " WHERE l.queue = '%s' AND l.priority = 0",
                 q);
}

/* A claim moves its level's frontier to where its caller's cursor goes (so that other claimers start
 * after its jobs at once, not after its caller's next claim), and a frontier, like a cursor, never
 * passes a job whose enqueue has not committed yet: another claimer, whose own cursor is far behind,
 * starts at the frontier and still takes that job when it commits. */
TEST(the_frontier_moves_with_each_claim_and_never_passes_a_job_still_to_commit)
{
    PGconn *pg = t_pg(), *producer = t_pg();
    claimer a, b;
    int64_t ids[100], tokens[100];

    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    /* Both claimers get ticks and a cursor from a claim from the marks. */
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(ARRAY['f', 'f'], NULL, NULL)"));
    CHECK_INT(claim(pg, &a, "f", 1, 1, ids, tokens), 1);
    complete(pg, ids, tokens, 1);
    CHECK_INT(claim(pg, &b, "f", 1, 1, ids, tokens), 1);
    complete(pg, ids, tokens, 1);
    /* A claim of b from its cursor that moves the cursor past the frontier leaves the frontier where
     * the cursor went, at once; none leaves it behind b's cursor.  (The cursor moves only as far as
     * the claim's cap, which a transaction of another test of the cluster can hold back for a while:
     * rounds until it has moved on three times.) */
    int moves = 0;
    for (int round = 0; round < 100 && moves < 3; round++) {
        long long before = frontier_of(pg, "f");
        take_three(pg, &b, "f");
        if (!b.cur.valid[100])
            continue;
        long long after = frontier_of(pg, "f");
        CHECK_MSG(after >= b.cur.key_us[100], "round %d: the frontier %lld is behind b's cursor %lld", round, after,
                  (long long)b.cur.key_us[100]);
        if (b.cur.key_us[100] > before) {
            CHECK_INT(after, b.cur.key_us[100]);
            moves++;
        }
        usleep(30 * 1000);
    }
    CHECK_MSG(moves == 3, "b's cursor moved past the frontier %d times in 100 rounds", moves);
    /* A transaction enqueues a job and stays open while b claims later jobs. */
    PQclear(t_exec(producer, "BEGIN"));
    PQclear(t_exec(producer, "SELECT pgjobq.enqueue('f', payload => '{\"late\": true}')"));
    for (int round = 0; round < 3; round++)
        take_three(pg, &b, "f");
    PQclear(t_exec(producer, "COMMIT"));
    long long late_us = t_int(pg, "SELECT (extract(epoch FROM greatest(run_at, ready_at)) * 1000000)::bigint"
                                  " FROM pgjobq.jobs WHERE queue = 'f' AND payload ? 'late'");
    CHECK_MSG(frontier_of(pg, "f") < late_us, "the frontier passed a job still to commit");
    /* a's cursor is behind the frontier: its claim starts there and takes the late job. */
    CHECK_MSG(a.cur.key_us[100] < frontier_of(pg, "f"), "a's cursor is not behind the frontier");
    CHECK_INT(claim(pg, &a, "f", 100, 0, ids, NULL), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND payload ? 'late'", (long long)ids[0]), 1);
    PQfinish(producer);
    PQfinish(pg);
}

TEST(low_claim_finds_what_a_rolled_back_claim_gave_back_and_the_mark_never_passes_it)
{
    PGconn *pg = t_pg(), *other = t_pg();
    claimer c;
    int64_t ids[100], tokens[100];

    memset(&c, 0, sizeof c);
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(ARRAY['r', 'r', 'r', 'r'], NULL, NULL)"));
    CHECK_INT(claim(pg, &c, "r", 1, 1, ids, tokens), 1);
    complete(pg, ids, tokens, 1);
    /* Another claimer takes the next job in a transaction it will roll back; this claimer skips it
     * (locked) and takes the two after it, so its cursor passes it. */
    PQclear(t_exec(other, "BEGIN"));
    long long held = t_int(other, "SELECT id FROM pgjobq.claim_batch('r', 1, '1 min', 'other', 0::smallint,"
                                  " '-infinity', 0)");
    CHECK_INT(claim(pg, &c, "r", 10, 0, ids, tokens), 2);
    complete(pg, ids, tokens, 2);
    CHECK(ids[0] > held && ids[1] > held);
    /* A low claim now moves the mark no further than the held row: it is queued in the claim's
     * snapshot (the other claim may roll back). */
    CHECK_INT(claim(pg, &c, "r", 10, 1, NULL, NULL), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.lows o, pgjobq.jobs j WHERE j.id = %lld AND o.queue = 'r'"
                        " AND (o.key, o.id) >= (greatest(j.run_at, j.ready_at), j.id)",
                    held),
              0);
    /* It rolls back: the job is queued again at its old key, behind the cursor (with the xmax of the
     * claim that rolled back, which holds nothing).  The cursor does not see it; a claim from the
     * marks does. */
    PQclear(t_exec(other, "ROLLBACK"));
    CHECK_INT(claim(pg, &c, "r", 10, 0, NULL, NULL), 0);
    CHECK_INT(claim(pg, &c, "r", 10, 1, ids, NULL), 1);
    CHECK_INT(ids[0], held);
    PQfinish(other);
    PQfinish(pg);
}

/* A claim steps over a row another claim took after its snapshot was taken, without locking it
 * (sql/functions/claim.sql): locking it would lock the row's new, running version and hold that lock
 * to the end of the claim, where the job's owner writes.  In REPEATABLE READ the attempt is an
 * error, so the claim here runs in one: its snapshot is older than the other claim.  A row whose
 * xmax holds nothing (its locker ended before the claim began, or it is the row's writer's) is
 * claimed as any other. */
TEST(a_claim_steps_over_rows_taken_since_its_snapshot_and_takes_rows_whose_lock_holds_nothing)
{
    PGconn *pg = t_pg(), *other = t_pg();
    claimer c;
    int64_t ids[100], tokens[100];

    memset(&c, 0, sizeof c);
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(ARRAY['x', 'x', 'x', 'x', 'x'], NULL, NULL)"));
    long long first = t_int(pg, "SELECT min(id) FROM pgjobq.jobs WHERE queue = 'x'");
    CHECK_INT(claim(pg, &c, "x", 1, 1, ids, tokens), 1);
    CHECK_INT(ids[0], first);
    complete(pg, ids, tokens, 1);
    /* This claimer's snapshot is taken; then the other claims the next job and commits. */
    PQclear(t_exec(pg, "BEGIN ISOLATION LEVEL REPEATABLE READ"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'x' AND state = 'queued'"), 4);
    long long taken = t_int(other, "SELECT id FROM pgjobq.claim_batch('x', 1, '1 min', 'other', 0::smallint,"
                                   " '-infinity', 0)");
    CHECK_INT(taken, first + 1);
    /* Queued in this snapshot, running since: stepped over (an attempt to lock it would fail here with
     * "could not serialize access due to concurrent update"); the claim takes the three after it. */
    CHECK_INT(claim(pg, &c, "x", 10, 0, ids, tokens), 3);
    CHECK(ids[0] > taken && ids[1] > taken && ids[2] > taken);
    PQclear(t_exec(pg, "COMMIT"));
    complete(pg, ids, tokens, 3);

    /* A job locked by a transaction that committed without changing it keeps that xmax, which holds
     * nothing: the transaction ended before the claim began, and a claim from the cursor takes it. */
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(ARRAY['x', 'x', 'x'], NULL, NULL)"));
    long long locked = t_int(pg, "SELECT min(id) FROM pgjobq.jobs WHERE queue = 'x' AND state = 'queued'");
    PQclear(t_exec(other, "BEGIN"));
    PQclear(t_exec(other, "SELECT id FROM pgjobq.jobs WHERE id = %lld FOR UPDATE", locked));
    /* While it is open, the claim steps over the row and takes the two after it. */
    CHECK_INT(claim(pg, &c, "x", 10, 0, ids, tokens), 2);
    CHECK(ids[0] > locked && ids[1] > locked);
    complete(pg, ids, tokens, 2);
    PQclear(t_exec(other, "COMMIT"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued' AND xmax <> xmin"
                        " AND xmax <> '0'",
                    locked),
              1);
    /* Behind the cursor now: the claim from the marks takes it. */
    CHECK_INT(claim(pg, &c, "x", 10, 1, ids, NULL), 1);
    CHECK_INT(ids[0], locked);
    /* Ahead of the cursor, a claim from the cursor takes such a row. */
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('x')"));
    locked = t_int(pg, "SELECT max(id) FROM pgjobq.jobs WHERE queue = 'x' AND state = 'queued'");
    PQclear(t_exec(other, "BEGIN"));
    PQclear(t_exec(other, "SELECT id FROM pgjobq.jobs WHERE id = %lld FOR UPDATE", locked));
    PQclear(t_exec(other, "ROLLBACK"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND xmax <> '0'", locked), 1);
    CHECK_INT(claim(pg, &c, "x", 10, 0, ids, NULL), 1);
    CHECK_INT(ids[0], locked);

    /* A job that failed and is queued again was locked by the transaction that wrote it (xmax =
     * xmin): that lock holds nothing, and a claim from the cursor takes it at once. */
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('x')"));
    CHECK_INT(claim(pg, &c, "x", 10, 0, ids, tokens), 1);
    PQclear(t_exec(pg, "SELECT pgjobq.fail_many(ARRAY[%lld], ARRAY[%lld], ARRAY['boom'], ARRAY[interval '0 s'])",
                   (long long)ids[0], (long long)tokens[0]));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND state = 'queued' AND xmax = xmin",
                    (long long)ids[0]),
              1);
    long long retried = ids[0];
    CHECK_INT(claim(pg, &c, "x", 10, 0, ids, NULL), 1);
    CHECK_INT(ids[0], retried);
    PQfinish(other);
    PQfinish(pg);
}

/* auto_explain's plans, collected from notices. */
static char *plans;
static size_t plans_len;

static void collect(void *arg, const char *msg)
{
    size_t n = strlen(msg);
    (void)arg;
    char *p = realloc(plans, plans_len + n + 1);
    if (p == NULL)
        return;
    plans = p;
    memcpy(plans + plans_len, msg, n + 1);
    plans_len += n;
}

/* The shared buffers the claim's scan touched: the "Buffers:" line under the LockRows of the first
 * claim statement in the collected plans. */
static long scan_buffers(void)
{
    const char *p = plans ? strstr(plans, "LockRows") : NULL;
    const char *b = p ? strstr(p, "Buffers: shared hit=") : NULL;
    return b ? atol(b + strlen("Buffers: shared hit=")) : -1;
}

/* pin takes a snapshot and holds it (vacuum can remove nothing that dies from now on); then rounds x
 * 1,000 jobs of queue q go through, enqueued 1,000 at a time, claimed from c's cursor (the first from
 * the marks) and completed.  ids and tokens: room for 1,000. */
static void through_under_a_snapshot(PGconn *pg, PGconn *pin, claimer *c, const char *q, int rounds, int64_t *ids,
                                     int64_t *tokens)
{
    PQclear(t_exec(pin, "BEGIN ISOLATION LEVEL REPEATABLE READ"));
    PQclear(t_exec(pin, "SELECT count(*) FROM pgjobq.queues"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('%s')", q));
    CHECK_INT(claim(pg, c, q, 10, 1, ids, tokens), 1);
    complete(pg, ids, tokens, 1);
    for (int round = 0; round < rounds; round++) {
        PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.enqueue_many(array_fill('%s'::text, ARRAY[1000]), NULL, NULL)", q));
        int got = 0;
        while (got < 1000) {
            int n = claim(pg, c, q, 1000, 0, ids, tokens);
            CHECK(n > 0);
            complete(pg, ids, tokens, n);
            got += n;
        }
    }
}

TEST_FULL(claims_step_over_no_dead_rows_while_a_snapshot_is_held, 180, 0)
{
    PGconn *pg = t_pg(), *pin = t_pg();
    claimer c;
    int64_t *ids = calloc(1000, sizeof *ids), *tokens = calloc(1000, sizeof *tokens);

    CHECK(ids != NULL && tokens != NULL);
    memset(&c, 0, sizeof c);
    /* 40,000 jobs through: every one leaves dead entries in the claim index, at the head of the level. */
    through_under_a_snapshot(pg, pin, &c, "s", 40, ids, tokens);
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('s', payload => '{\"last\": true}')"));
    t_auto_explain(pg, collect, 1);
    /* The claim from the cursor reads a few pages: at most the last batch it claimed (its cursor stays
     * at the cap, behind rows that became claimable after its previous claim began): 1,000 rows on
     * about 40 pages at the table's fillfactor of 50, each page read about twice (a claim that found
     * its page full, as pages are here with nothing pruned under the snapshot, wrote the running
     * version on another page, with an entry of its own beside the first; 26 pages before schema 33,
     * whose claim index held the queued rows alone)... */
    CHECK_INT(claim(pg, &c, "s", 10, 0, ids, NULL), 1);
    long from_cursor = scan_buffers();
    /* ... where the same scan from the head of the level reads the dead entries of 40,000 jobs. */
    PQclear(t_exec(pg, "SET auto_explain.log_min_duration = -1"));
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET state = 'queued', lease_until = NULL WHERE id = %lld",
                   (long long)ids[0]));
    PQclear(t_exec(pg, "SET enable_seqscan = off"));
    PQclear(t_exec(pg, "SET enable_bitmapscan = off"));
    char *plan = t_str(pg, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT j.id FROM pgjobq.jobs j"
                           " WHERE j.state = 'queued' AND j.queue = 's' AND j.priority = 0"
                           " AND greatest(j.run_at, j.ready_at) <= now()"
                           " ORDER BY greatest(j.run_at, j.ready_at), j.id LIMIT 1 FOR UPDATE SKIP LOCKED");
    const char *hits = strstr(plan, "\"Shared Hit Blocks\": ");
    long from_head = hits ? atol(hits + strlen("\"Shared Hit Blocks\": ")) : -1;
    free(plan);
    printf("claim scan buffers: from the cursor %ld, from the head %ld\n", from_cursor, from_head);
    CHECK_MSG(from_cursor >= 0 && from_cursor <= 200, "the claim from the cursor read %ld buffers", from_cursor);
    CHECK_MSG(from_head >= 10 * from_cursor, "the head (%ld buffers) is not much bigger than the cursor's scan (%ld):"
              " the test proves nothing", from_head, from_cursor);
    PQclear(t_exec(pin, "COMMIT"));
    free(ids);
    free(tokens);
    PQfinish(pin);
    PQfinish(pg);
}

/* The blocks of pgjobq.jobs and its indexes that this transaction has read so far. */
static long long jobs_blocks(PGconn *pg)
{
    return t_int(pg, "SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid)) FROM pg_class c"
                     " WHERE c.oid = 'pgjobq.jobs'::regclass"
                     " OR c.oid IN (SELECT i.indexrelid FROM pg_index i WHERE i.indrelid = 'pgjobq.jobs'::regclass)");
}

/* The counts of the dashboard and /metrics (monitor_queue_counts, monitor_workers) are right, and do
 * not read the dead rows of the jobs claimed and finished while a snapshot is held (docs/sql.md). */
TEST_FULL(monitor_counts_step_over_dead_rows_while_a_snapshot_is_held, 120, 0)
{
    PGconn *pg = t_pg(), *pin = t_pg();
    claimer c;
    int64_t *ids = calloc(1000, sizeof *ids), *tokens = calloc(1000, sizeof *tokens);

    CHECK(ids != NULL && tokens != NULL);
    memset(&c, 0, sizeof c);
    c.lease = "1 second";
    /* 20,000 jobs through, on leases of a second. */
    through_under_a_snapshot(pg, pin, &c, "m", 20, ids, tokens);
    /* Live now: 5 queued (2 of them then claimed, on a lease of a minute), 1 scheduled, and at another
     * priority 1 queued; one job waiting for a parent.  The leases of the 20,000 end meanwhile. */
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(array_fill('m'::text, ARRAY[5]), NULL, NULL)"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('m', run_at => now() + interval '1 hour')"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('m', priority => 5::smallint)"));
    PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.enqueue_graph('[{\"ref\": \"a\", \"queue\": \"m2\","
                       " \"run_at\": \"2100-01-01T00:00:00Z\"}, {\"ref\": \"b\", \"queue\": \"m2\","
                       " \"after\": [\"a\"]}]')"));
    usleep(11500 * 1000);
    /* A rescue pass, as every worker runs each second: it drops the lease alarms of the 20,000, all
     * finished (running jobs are counted through the alarms: running_jobs, claim.sql). */
    CHECK_INT(t_int(pg, "SELECT pgjobq.rescue_expired(1000, now() - interval '1 minute')"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.lease_alarms WHERE queue = 'm'"), 0);
    c.lease = "1 min";
    CHECK_INT(claim(pg, &c, "m", 2, 1, ids, NULL), 2); /* from the marks, which it moves on */
    PQclear(t_exec(pg, "SELECT pgjobq.worker_beat('test', 'h', 1, '0', 'm:8')"));

    PQclear(t_exec(pg, "BEGIN"));
    long long before = jobs_blocks(pg);
    PGresult *r = t_exec(pg, "SELECT queue, due, scheduled, running, waiting, lag_s IS NOT NULL"
                             " FROM pgjobq.monitor_queue_counts() ORDER BY queue");
    long long counts = jobs_blocks(pg) - before;
    CHECK_INT(PQntuples(r), 2);
    CHECK_STR(PQgetvalue(r, 0, 0), "m");
    CHECK_STR(PQgetvalue(r, 0, 1), "4"); /* 3 + the one at priority 5 */
    CHECK_STR(PQgetvalue(r, 0, 2), "1");
    CHECK_STR(PQgetvalue(r, 0, 3), "2");
    CHECK_STR(PQgetvalue(r, 0, 4), "0");
    CHECK_STR(PQgetvalue(r, 0, 5), "t");
    CHECK_STR(PQgetvalue(r, 1, 0), "m2");
    CHECK_STR(PQgetvalue(r, 1, 1), "0");
    CHECK_STR(PQgetvalue(r, 1, 2), "1");
    CHECK_STR(PQgetvalue(r, 1, 4), "1");
    PQclear(r);
    before = jobs_blocks(pg);
    CHECK_INT(t_int(pg, "SELECT jobs FROM pgjobq.monitor_workers() WHERE id = 'test'"), 2);
    long long workers = jobs_blocks(pg) - before;
    /* What an autoscaler reads (queue_ready) reads from the same marks, and the ready rows only. */
    before = jobs_blocks(pg);
    r = t_exec(pg, "SELECT queue, ready, running, worker_slots, oldest_ready_s IS NOT NULL FROM pgjobq.queue_ready()"
                   " WHERE queue IN ('m', 'm2') ORDER BY queue");
    long long ready = jobs_blocks(pg) - before;
    CHECK_INT(PQntuples(r), 2);
    CHECK_STR(PQgetvalue(r, 0, 1), "4");
    CHECK_STR(PQgetvalue(r, 0, 2), "2");
    CHECK_STR(PQgetvalue(r, 0, 3), "8");
    CHECK_STR(PQgetvalue(r, 0, 4), "t");
    CHECK_STR(PQgetvalue(r, 1, 1), "0");
    CHECK_STR(PQgetvalue(r, 1, 2), "0");
    CHECK_STR(PQgetvalue(r, 1, 4), "f");
    PQclear(r);
    /* The jobs page's list of queued jobs reads from the same marks: the 5 queued jobs of m, newest
     * first (2 at priority 0, the scheduled one, the one at priority 5; the 20,000 are not walked). */
    before = jobs_blocks(pg);
    char *queued = t_str(pg, "SELECT string_agg(id::text, ',' ORDER BY id DESC) FROM pgjobq.monitor_jobs('queued', 'm',"
                             " NULL, NULL, NULL, NULL, 50)");
    long long listed = jobs_blocks(pg) - before;
    char *want = t_str(pg, "SELECT string_agg(id::text, ',' ORDER BY id DESC) FROM pgjobq.jobs"
                           " WHERE queue = 'm' AND state = 'queued'");
    CHECK_STR(queued, want);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.monitor_jobs('queued', 'm', NULL, NULL, NULL, NULL, 50)"), 5);
    long long newest = t_int(pg, "SELECT max(id) FROM pgjobq.jobs WHERE queue = 'm' AND state = 'queued'");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.monitor_jobs('queued', NULL, NULL, NULL, %lld, NULL, 50)", newest),
              4); /* the next page: after the newest */
    free(queued);
    free(want);
    /* What a count of the table reads: the dead rows of the 20,000. */
    before = jobs_blocks(pg);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs"), 9);
    long long table = jobs_blocks(pg) - before;
    PQclear(t_exec(pg, "COMMIT"));
    printf("blocks read: monitor_queue_counts %lld, monitor_workers %lld, monitor_jobs('queued') %lld,"
           " queue_ready %lld, a count of the table %lld\n",
           counts, workers, listed, ready, table);
    CHECK_MSG(counts <= 60 && workers <= 30 && listed <= 60 && ready <= 60,
              "monitor_queue_counts read %lld blocks, monitor_workers %lld, monitor_jobs('queued') %lld,"
              " queue_ready %lld",
              counts, workers, listed, ready);
    CHECK_MSG(table >= 5 * (ready + 1), "a count of the table (%lld blocks) is not much bigger than queue_ready's",
              table);
    CHECK_MSG(table >= 5 * (counts + 1), "a count of the table (%lld blocks) is not much bigger: the test proves"
              " nothing", table);
    PQclear(t_exec(pin, "COMMIT"));
    free(ids);
    free(tokens);
    PQfinish(pin);
    PQfinish(pg);
}

TEST(rescue_since_looks_at_recent_leases_and_without_it_at_all)
{
    PGconn *pg = t_pg();

    /* Two running jobs: one lease ended ten minutes ago, one a second ago. */
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(ARRAY['x', 'x'], NULL, ARRAY['{\"old\": true}', '{\"new\": true}']::jsonb[])"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('x', 2, '1 min', 'w')"), 2);
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET lease_until = now() - interval '10 minutes' WHERE payload ? 'old'"));
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET lease_until = now() - interval '1 second' WHERE payload ? 'new'"));
    /* Since five seconds ago: the recent one only. */
    CHECK_INT(t_int(pg, "SELECT pgjobq.rescue_expired(1000, now() - interval '5 seconds')"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE payload ? 'new' AND state = 'queued'"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE payload ? 'old' AND state = 'running'"), 1);
    /* Without since: every expired lease. */
    CHECK_INT(t_int(pg, "SELECT pgjobq.rescue_expired(1000)"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'queued'"), 2);
    PQfinish(pg);
}

TEST(an_enqueue_never_waits_for_another_transaction_recording_the_same_priority)
{
    PGconn *a = t_pg(), *b = t_pg();

    /* A transaction enqueues the first job of a new level and stays open. */
    PQclear(t_exec(a, "BEGIN"));
    PQclear(t_exec(a, "SELECT pgjobq.enqueue('lv', priority => 7::smallint)"));
    /* Another enqueues at the same level: it does not wait for the first to end. */
    PQclear(t_exec(b, "SET statement_timeout = '5s'"));
    long long id = t_int(b, "SELECT id FROM pgjobq.enqueue('lv', priority => 7::smallint)");
    /* Its job is claimable while the first transaction is still open (a claim finds the level). */
    CHECK_INT(t_int(b, "SELECT id FROM pgjobq.claim_batch('lv', 10, '1 min', 'w')"), id);
    PQclear(t_exec(a, "COMMIT"));
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.levels WHERE queue = 'lv' AND priority = 7"), 1);
    CHECK_INT(t_int(b, "SELECT count(*) FROM pgjobq.claim_batch('lv', 10, '1 min', 'w')"), 1);
    PQfinish(a);
    PQfinish(b);
}

typedef struct passes {
    PGconn *pg;
    claimer *c;
    long long after_us; /* the moment the open transaction began writing */
} passes;

/* One more job enqueued and claimed; true once the cursor is past `after_us`. */
static int cursor_passes(void *arg)
{
    passes *p = arg;
    int64_t ids[10], tokens[10];
    PQclear(t_exec(p->pg, "SELECT pgjobq.enqueue('t')"));
    int n = claim(p->pg, p->c, "t", 10, 0, ids, tokens);
    if (n > 0)
        complete(p->pg, ids, tokens, n);
    return p->c->cur.valid[100] && p->c->cur.key_us[100] > p->after_us;
}

TEST(cursor_moves_on_while_a_transaction_that_never_wrote_jobs_stays_open)
{
    PGconn *pg = t_pg(), *idle = t_pg();
    claimer c;

    memset(&c, 0, sizeof c);
    /* A transaction of this very database writes another table and is left open (an application's
     * session idle in transaction): every snapshot's oldest transaction, for as long as it stays. */
    PQclear(t_exec(pg, "CREATE TABLE public.elsewhere (x integer)"));
    PQclear(t_exec(idle, "BEGIN"));
    PQclear(t_exec(idle, "INSERT INTO public.elsewhere VALUES (1)"));
    long long began = t_int(idle, "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint");
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('t')"));
    CHECK_INT(claim(pg, &c, "t", 10, 1, NULL, NULL), 1);
    /* It holds no lock on pgjobq.jobs, so it cannot make a job appear behind the cursor: the cursor
     * moves past the moment it began, within a few seconds (the claim asks the lock manager once its
     * cap lags a second). */
    passes p = {pg, &c, began};
    CHECK_MSG(t_wait_until(cursor_passes, &p, 10000), "the cursor stayed behind the open transaction");
    /* And a job it enqueues itself, once it does, is still found when it commits. */
    PQclear(t_exec(idle, "SELECT pgjobq.enqueue('t', payload => '{\"from_the_idle\": true}')"));
    passes q = {pg, &c, (long long)t_int(pg, "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")};
    (void)cursor_passes(&q);
    PQclear(t_exec(idle, "COMMIT"));
    int64_t ids[10];
    CHECK_INT(claim(pg, &c, "t", 10, 0, ids, NULL), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = %lld AND payload ? 'from_the_idle'",
                    (long long)ids[0]),
              1);
    PQfinish(idle);
    PQfinish(pg);
}

/* ------------------------------------------------------------------------------------------------ */
/* Levels reclaimed (issue 36, point 4)                                                              */

/* The frontier sequences of pgjobq's schema. */
static long long frontiers(PGconn *pg)
{
    return t_int(pg, "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                     " WHERE n.nspname = 'pgjobq' AND c.relkind = 'S' AND c.relname LIKE 'frontier\\_%%'");
}

static PGconn *reclaim_pg;

/* One more call of the reclaim; true once no retired frontier is left. */
static int frontiers_dropped(void *arg)
{
    (void)arg;
    PQclear(t_exec(reclaim_pg, "SELECT pgjobq.levels_reclaim('0 s')"));
    return t_int(reclaim_pg, "SELECT count(*) FROM pgjobq.levels_gone") == 0;
}

/* Claims and completes every job of queue q the way a worker does (cursor claims, and a claim from the
 * marks); returns how many it completed. */
static int drain(PGconn *pg, claimer *c, const char *q)
{
    int64_t ids[50], tokens[50];
    int n, done = 0, round = 0;
    while ((n = claim(pg, c, q, 50, round++ % 2, ids, tokens)) > 0 || round < 2) {
        if (n > 0)
            complete(pg, ids, tokens, n);
        done += n;
    }
    return done;
}

/* The levels of a queue that has had no job for the idle time are reclaimed, with their low-water
 * marks, and their frontier sequences are dropped once no claim can read them; a queue with a job
 * queued, running or waiting keeps its levels; prune (the workers' maintenance) reclaims after an
 * hour; and a queue used again gets new levels whose jobs are claimed. */
TEST(levels_of_an_emptied_queue_are_reclaimed_with_their_frontiers)
{
    PGconn *pg = t_pg();
    claimer c;

    memset(&c, 0, sizeof c);
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('gone', priority => p::smallint) FROM generate_series(0, 3) p"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('busy'), pgjobq.enqueue('held'), pgjobq.enqueue('parent')"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('child', after => ARRAY[(SELECT id FROM pgjobq.jobs"
                       " WHERE queue = 'parent')])"));
    PQclear(t_exec(pg, "SELECT pgjobq.claim_batch('held', 1, '1 hour', 'w')"));
    CHECK_INT(drain(pg, &c, "gone"), 4);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue = 'gone'"), 4);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.lows WHERE queue = 'gone'") > 0, 1);
    long long before = frontiers(pg);

    /* Not idle for an hour yet: only noted. */
    CHECK_INT(t_int(pg, "SELECT pgjobq.levels_reclaim('1 hour')"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue = 'gone' AND idle_since IS NOT NULL"), 4);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE idle_since IS NOT NULL"), 4);
    /* Idle long enough: the rows and marks go now, the frontiers two calls later. */
    CHECK_INT(t_int(pg, "SELECT pgjobq.levels_reclaim('0 s')"), 4);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue = 'gone'"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.lows WHERE queue = 'gone'"), 0);
    CHECK_INT(frontiers(pg), before);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels_gone"), 4);
    CHECK_INT(t_int(pg, "SELECT pgjobq.levels_reclaim('0 s')"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels_gone WHERE safe_after IS NOT NULL"), 4);
    CHECK_INT(frontiers(pg), before);
    /* Dropped by a call once every transaction of the cluster older than that stamp has ended (the
     * tests of other databases run meanwhile). */
    reclaim_pg = pg;
    CHECK_MSG(t_wait_until(frontiers_dropped, NULL, 20000), "the retired frontiers were not dropped");
    CHECK_INT(frontiers(pg), before - 4);
    /* A queue with a job queued, running or waiting keeps its levels. */
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue IN ('busy', 'held', 'parent', 'child')"), 4);

    /* Used again: a new level, and its job claimed from the cursor the claimer kept. */
    long long id = t_int(pg, "SELECT id FROM pgjobq.enqueue('gone', priority => 2::smallint)");
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue = 'gone'"), 1);
    int64_t ids[10], tokens[10];
    CHECK_INT(claim(pg, &c, "gone", 10, 0, ids, tokens), 1);
    CHECK_INT(ids[0], id);
    complete(pg, ids, tokens, 1);

    /* The workers' maintenance: prune reclaims the levels of queues idle for an hour. */
    CHECK_INT(t_int(pg, "SELECT pgjobq.levels_reclaim('1 hour')"), 0);
    PQclear(t_exec(pg, "UPDATE pgjobq.levels SET idle_since = now() - interval '61 minutes' WHERE queue = 'gone'"));
    PQclear(t_exec(pg, "SELECT pgjobq.prune()"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue = 'gone'"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels_gone"), 1);
    PQfinish(pg);
}

/* An enqueue that inserts a job at a level it saw recorded, while the reclaim deletes that level (it
 * cannot see the uncommitted job): the job is not lost, and the next claim from the marks (a worker's
 * claim once a second) records its level again and takes it.  Likewise a new level recorded by an
 * open transaction while the reclaim runs. */
TEST(an_enqueue_racing_the_level_reclaim_loses_no_job)
{
    PGconn *pg = t_pg(), *e = t_pg();
    claimer c;
    int64_t ids[10], tokens[10];

    memset(&c, 0, sizeof c);
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('race')"));
    CHECK_INT(drain(pg, &c, "race"), 1);
    PQclear(t_exec(e, "BEGIN"));
    long long id = t_int(e, "SELECT id FROM pgjobq.enqueue('race', payload => '{\"n\": 1}')");
    long long id5 = t_int(e, "SELECT id FROM pgjobq.enqueue('race', priority => 5::smallint)");
    CHECK_INT(t_int(pg, "SELECT pgjobq.levels_reclaim('0 s')"), 1); /* priority 0's: it saw no job */
    PQclear(t_exec(e, "COMMIT"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue = 'race' AND priority = 0"), 0);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue = 'race' AND priority = 5"), 1);
    /* The worker's claims: from its cursor, the recorded level; from the marks, the other too. */
    CHECK_INT(claim(pg, &c, "race", 10, 0, ids, tokens), 1);
    CHECK_INT(ids[0], id5);
    complete(pg, ids, tokens, 1);
    CHECK_INT(claim(pg, &c, "race", 10, 1, ids, tokens), 1);
    CHECK_INT(ids[0], id);
    complete(pg, ids, tokens, 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue = 'race' AND priority = 0"), 1);
    /* Through the SQL API's claim too (it claims from the marks). */
    PQclear(t_exec(e, "BEGIN"));
    id = t_int(e, "SELECT id FROM pgjobq.enqueue('race')");
    CHECK_INT(t_int(pg, "SELECT pgjobq.levels_reclaim('0 s')"), 2);
    PQclear(t_exec(e, "COMMIT"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels WHERE queue = 'race'"), 0);
    CHECK_INT(t_int(pg, "SELECT id FROM pgjobq.claim_batch('race', 10, '1 min', 'w')"), id);
    PQfinish(e);
    PQfinish(pg);
}

typedef struct race {
    int jobs;
    volatile int produced, stop;
    long long retired;
} race;

static void *race_producer(void *arg)
{
    race *r = arg;
    PGconn *pg = t_pg();
    for (int i = 0; i < r->jobs; i++) {
        /* Each job's transaction goes on a little after its insert (work of the producer's own), so
         * that the reclaim often runs between the two. */
        PQclear(t_exec(pg, "BEGIN"));
        PQclear(
            t_exec(pg, "SELECT pgjobq.enqueue('churn', priority => %d::smallint, payload => '{\"n\": %d}')", i % 3, i));
        PQclear(t_exec(pg, "SELECT count(*) FROM generate_series(1, 20000)"));
        PQclear(t_exec(pg, "COMMIT"));
        __atomic_store_n(&r->produced, i + 1, __ATOMIC_RELEASE);
    }
    PQfinish(pg);
    return NULL;
}

static void *race_reclaimer(void *arg)
{
    race *r = arg;
    PGconn *pg = t_pg();
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE))
        r->retired += t_int(pg, "SELECT pgjobq.levels_reclaim('0 s')");
    PQfinish(pg);
    return NULL;
}

/* Enqueues, claims and the reclaim at once, as a queue that keeps draining would see them: every job
 * runs exactly once, none is left, and the reclaim did retire levels meanwhile. */
TEST_FULL(levels_reclaimed_under_enqueues_and_claims_lose_no_job, 120, 0)
{
    PGconn *pg = t_pg();
    claimer c;
    race r = {.jobs = 600};
    pthread_t producer, reclaimer;
    int64_t ids[50], tokens[50];
    int done = 0, round = 0;

    memset(&c, 0, sizeof c);
    CHECK(pthread_create(&reclaimer, NULL, race_reclaimer, &r) == 0);
    CHECK(pthread_create(&producer, NULL, race_producer, &r) == 0);
    int64_t deadline = t_now_ms() + 90000;
    while (done < r.jobs && t_now_ms() < deadline) {
        /* A claim from the marks every fourth (a worker: once a second), else from the cursor. */
        int n = claim(pg, &c, "churn", 50, round++ % 4 == 0, ids, tokens);
        if (n > 0)
            complete(pg, ids, tokens, n);
        done += n;
    }
    __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
    pthread_join(producer, NULL);
    pthread_join(reclaimer, NULL);
    CHECK_MSG(done == r.jobs, "%d of %d jobs claimed in 90 s", done, r.jobs);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.history WHERE queue = 'churn' AND state = 'completed'"
                        " AND attempt = 1"),
              r.jobs);
    CHECK_INT(t_int(pg, "SELECT count(DISTINCT payload->>'n') FROM pgjobq.history WHERE queue = 'churn'"), r.jobs);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'churn'"), 0);
    CHECK_MSG(r.retired > 0, "the reclaim retired no level while the queue drained");
    fprintf(stderr, "levels retired while %d jobs went through: %lld\n", r.jobs, r.retired);
    PQfinish(pg);
}

/* At most levels_max() levels: a new one past it is refused with its reason (and the enqueue with
 * it), while a claim that finds jobs at an unrecorded level still takes them.  The cap is lowered to
 * 3 here (levels_max() is a constant function) rather than 10,000 levels made. */
TEST(levels_past_the_cap_are_refused_and_claims_still_find_their_jobs)
{
    PGconn *pg = t_pg();

    PQclear(t_exec(pg, "CREATE OR REPLACE FUNCTION pgjobq.levels_max() RETURNS integer LANGUAGE sql IMMUTABLE"
                       " AS 'SELECT 3'"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('a'), pgjobq.enqueue('b'), pgjobq.enqueue('c')"));
    PGresult *r = PQexec(pg, "SELECT pgjobq.enqueue('d')");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "54000");
    CHECK_MSG(strstr(PQresultErrorMessage(r), "3 priority levels") != NULL, "%s", PQresultErrorMessage(r));
    PQclear(r);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'd'"), 0);
    /* A job at a known level is still enqueued. */
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('a')"));
    /* A row written by hand at an unrecorded level: the claim takes it, records nothing, fails nothing. */
    PQclear(t_exec(pg, "INSERT INTO pgjobq.jobs (queue) VALUES ('e')"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('e', 10, '1 min', 'w')"), 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.levels"), 3);
    PQfinish(pg);
}

/* pgjobq.health(), pgjobq_health_get and `pgjobq health`: the table's size and dead rows, and a
 * session that holds a snapshot named as what holds vacuum back, with its pid, application and
 * query; nothing once it ends. */
TEST(health_names_the_session_that_holds_vacuum_back)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg(), *pin = t_pg();
    pgjobq_health h;
    char *out, *err, want[128];

    CHECK_OK(c, pgjobq_health_get(c, &h));
    CHECK(h.jobs_bytes > 8192);
    CHECK_STR(h.holder_kind, "");
    CHECK(h.horizon_age_ms == -1 && h.holder_pid == 0 && h.holder_since == PGJOBQ_TIME_NONE);

    PQclear(t_exec(pin, "SET application_name = 'nightly report'"));
    PQclear(t_exec(pin, "BEGIN ISOLATION LEVEL REPEATABLE READ"));
    PQclear(t_exec(pin, "SELECT count(*) FROM pgjobq.queues"));
    /* 200 jobs through while it holds: each leaves a dead row that nothing can remove. */
    PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.enqueue_many(array_fill('h'::text, ARRAY[200]), NULL, NULL)"));
    PQclear(t_exec(pg, "WITH b AS (SELECT j.id, j.lease_token FROM pgjobq.claim_batch('h', 200, interval '1 minute',"
                       " 'w') j) SELECT count(*) FROM pgjobq.complete_many((SELECT array_agg(id) FROM b),"
                       " (SELECT array_agg(lease_token) FROM b))"));
    PQclear(t_exec(pg, "VACUUM pgjobq.jobs"));
    PQclear(t_exec(pg, "SELECT pg_stat_force_next_flush()"));
    usleep(200 * 1000);
    CHECK_OK(c, pgjobq_health_get(c, &h));
    CHECK_STR(h.holder_kind, "session");
    CHECK_INT(h.holder_pid, PQbackendPID(pin));
    CHECK_STR(h.holder_application, "nightly report");
    CHECK_STR(h.holder_state, "idle in transaction");
    CHECK_STR(h.holder_role, PQuser(pin));
    CHECK(strstr(h.holder_query, "pgjobq.queues") != NULL);
    CHECK(h.horizon_age_ms >= 200 && h.horizon_age_ms < 600000 && h.holder_since != PGJOBQ_TIME_NONE);
    CHECK(h.horizon_xids >= 2);
    CHECK_MSG(h.jobs_dead >= 200, "jobs_dead %lld: the 200 finished jobs' rows are not dead", (long long)h.jobs_dead);
    CHECK(h.vacuums >= 1 && h.last_vacuum != PGJOBQ_TIME_NONE);

    CHECK_INT(t_cli(&out, &err, NULL, 0, "health", "--json", NULL), 0);
    snprintf(want, sizeof want, "\"holder\":{\"kind\":\"session\",");
    CHECK_MSG(strstr(out, want) != NULL, "%s", out);
    snprintf(want, sizeof want,
             "\"pid\":%d,\"role\":\"%s\",\"application\":\"nightly report\",\"state\":\"idle in transaction\"",
             PQbackendPID(pin), PQuser(pin));
    CHECK_MSG(strstr(out, want) != NULL, "%s", out);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "health", NULL), 0);
    snprintf(want, sizeof want,
             "oldest holder  session pid %d of role %s \"nightly report\" (idle in transaction), for ",
             PQbackendPID(pin), PQuser(pin));
    CHECK_MSG(strstr(out, want) != NULL, "%s", out);
    free(out);
    free(err);

    PQclear(t_exec(pin, "COMMIT"));
    CHECK_OK(c, pgjobq_health_get(c, &h));
    CHECK_STR(h.holder_kind, "");
    CHECK_INT(t_cli(&out, &err, NULL, 0, "health", "--json", NULL), 0);
    CHECK_MSG(strstr(out, "\"holder\":null") != NULL, "%s", out);
    free(out);
    free(err);
    pgjobq_client_close(c);
    PQfinish(pin);
    PQfinish(pg);
}

/* ------------------------------------------------------------------------------------------------ */
/* Autovacuum of the live table, paused while a pass could remove nothing                            */

/* 200 jobs enqueued, claimed and completed: 200 dead rows that a held snapshot keeps. */
static void churn(PGconn *pg, const char *queue)
{
    PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.enqueue_many(array_fill('%s'::text, ARRAY[200]), NULL, NULL)",
                   queue));
    PQclear(t_exec(pg, "WITH b AS (SELECT j.id, j.lease_token FROM pgjobq.claim_batch('%s', 200,"
                       " interval '1 minute', 'w') j) SELECT count(*) FROM pgjobq.complete_many("
                       "(SELECT array_agg(id) FROM b), (SELECT array_agg(lease_token) FROM b))",
                   queue));
}

/* "on": the vacuum thresholds of pgjobq.jobs are as the migrations left them (unset); "off": both are
 * out of reach; anything else is printed. */
static char *autovacuum_setting(PGconn *pg)
{
    return t_str(pg, "SELECT CASE coalesce(string_agg(o.option_name || '=' || o.option_value, ','"
                     " ORDER BY o.option_name), '')"
                     " WHEN '' THEN 'on'"
                     " WHEN 'autovacuum_vacuum_insert_threshold=-1,autovacuum_vacuum_threshold=2147483647' THEN 'off'"
                     " ELSE string_agg(o.option_name || '=' || o.option_value, ',') END"
                     " FROM pg_class c LEFT JOIN LATERAL pg_options_to_table(c.reloptions) o ON true"
                     " WHERE c.oid = 'pgjobq.jobs'::regclass AND o.option_name IN ('autovacuum_vacuum_threshold',"
                     " 'autovacuum_vacuum_insert_threshold', 'autovacuum_enabled')");
}

static void vacuum_jobs(PGconn *pg)
{
    PQclear(t_exec(pg, "VACUUM pgjobq.jobs"));
    PQclear(t_exec(pg, "SELECT pg_stat_force_next_flush()"));
}

/* Alone: a transaction of another test's database that is running when a pin takes its snapshot
 * becomes that snapshot's xmin, and so this database's horizon, whichever pin holds it. */
TEST_FULL(autovacuum_pauses_once_a_pass_ran_under_the_held_snapshot_and_resumes_when_it_ends, 60, TEST_EXCLUSIVE)
{
    pgjobq_client *c = t_client();
    PGconn *pg = t_pg(), *pin = t_pg();
    pgjobq_health h;
    char *s;

    /* Nothing holds: nothing to do, however often it is asked. */
    CHECK_STR((s = t_str(pg, "SELECT pgjobq.autovacuum_adapt()")), "");
    free(s);
    vacuum_jobs(pg);
    CHECK_STR((s = t_str(pg, "SELECT pgjobq.autovacuum_adapt()")), "");
    free(s);
    CHECK_STR((s = autovacuum_setting(pg)), "on");
    free(s);

    PQclear(t_exec(pin, "BEGIN ISOLATION LEVEL REPEATABLE READ"));
    PQclear(t_exec(pin, "SELECT count(*) FROM pgjobq.queues"));
    churn(pg, "av");
    /* First sight of this holder: a pass may still remove what died before it. */
    CHECK_STR((s = t_str(pg, "SELECT pgjobq.autovacuum_adapt()")), "");
    free(s);
    CHECK_STR((s = autovacuum_setting(pg)), "on");
    free(s);
    /* A pass entirely under it: the next could remove nothing more. */
    vacuum_jobs(pg);
    CHECK_STR((s = t_str(pg, "SELECT pgjobq.autovacuum_adapt()")), "paused");
    free(s);
    CHECK_STR((s = autovacuum_setting(pg)), "off");
    free(s);
    CHECK_OK(c, pgjobq_health_get(c, &h));
    CHECK(h.autovacuum_paused_since != PGJOBQ_TIME_NONE);
    CHECK_STR(h.holder_kind, "session");
    churn(pg, "av");
    CHECK_STR((s = t_str(pg, "SELECT pgjobq.autovacuum_adapt()")), "");
    free(s);
    CHECK_STR((s = autovacuum_setting(pg)), "off");
    free(s);

    /* The holder ends: on again at the next call, and health says so. */
    PQclear(t_exec(pin, "COMMIT"));
    CHECK_STR((s = t_str(pg, "SELECT pgjobq.autovacuum_adapt()")), "resumed");
    free(s);
    CHECK_STR((s = autovacuum_setting(pg)), "on");
    free(s);
    CHECK_OK(c, pgjobq_health_get(c, &h));
    CHECK(h.autovacuum_paused_since == PGJOBQ_TIME_NONE);

    /* A newer holder replaces a paused one: on again (what died between the two is removable). */
    PQclear(t_exec(pin, "BEGIN ISOLATION LEVEL REPEATABLE READ"));
    PQclear(t_exec(pin, "SELECT count(*) FROM pgjobq.queues"));
    PGconn *pin2 = t_pg();
    churn(pg, "av");
    free(t_str(pg, "SELECT pgjobq.autovacuum_adapt()"));
    vacuum_jobs(pg);
    CHECK_STR((s = t_str(pg, "SELECT pgjobq.autovacuum_adapt()")), "paused");
    free(s);
    PQclear(t_exec(pin2, "BEGIN ISOLATION LEVEL REPEATABLE READ"));
    PQclear(t_exec(pin2, "SELECT count(*) FROM pgjobq.queues"));
    PQclear(t_exec(pin, "COMMIT"));
    CHECK_STR((s = t_str(pg, "SELECT pgjobq.autovacuum_adapt()")), "resumed");
    free(s);
    CHECK_STR((s = autovacuum_setting(pg)), "on");
    free(s);
    PQclear(t_exec(pin2, "COMMIT"));

    /* Turned off, or tuned, by someone else: left as it is, during a holder and after. */
    const char *theirs[][2] = {{"autovacuum_enabled = false", "autovacuum_enabled=false"},
                               {"autovacuum_vacuum_threshold = 500", "autovacuum_vacuum_threshold=500"}};
    for (int i = 0; i < 2; i++) {
        PQclear(t_exec(pg, "ALTER TABLE pgjobq.jobs SET (%s)", theirs[i][0]));
        PQclear(t_exec(pin, "BEGIN ISOLATION LEVEL REPEATABLE READ"));
        PQclear(t_exec(pin, "SELECT count(*) FROM pgjobq.queues"));
        churn(pg, "av");
        free(t_str(pg, "SELECT pgjobq.autovacuum_adapt()"));
        vacuum_jobs(pg);
        CHECK_STR((s = t_str(pg, "SELECT pgjobq.autovacuum_adapt()")), "");
        free(s);
        CHECK_STR((s = autovacuum_setting(pg)), theirs[i][1]);
        free(s);
        PQclear(t_exec(pin, "COMMIT"));
        CHECK_STR((s = t_str(pg, "SELECT pgjobq.autovacuum_adapt()")), "");
        free(s);
        CHECK_STR((s = autovacuum_setting(pg)), theirs[i][1]);
        free(s);
        PQclear(t_exec(pg, "ALTER TABLE pgjobq.jobs RESET (autovacuum_enabled, autovacuum_vacuum_threshold)"));
    }

    /* Not for anyone to call: EXECUTE is pgjobq_worker's (sql/roles.sql). */
    PQclear(t_exec(pg, "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'av_nobody') THEN"
                       " CREATE ROLE av_nobody; END IF; END $$"));
    PQclear(t_exec(pg, "SET ROLE av_nobody"));
    PGresult *r = PQexec(pg, "SELECT pgjobq.autovacuum_adapt()");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "42501");
    PQclear(r);
    PQclear(t_exec(pg, "RESET ROLE"));

    PQfinish(pin2);
    PQfinish(pin);
    PQfinish(pg);
    pgjobq_client_close(c);
}

typedef struct log_seen {
    pthread_mutex_t mu;
    int paused;
} log_seen;

static void watch_log(void *arg, pgjobq_log_level level, const char *msg)
{
    log_seen *l = arg;
    (void)level;
    pthread_mutex_lock(&l->mu);
    l->paused += strstr(msg, "paused autovacuum of pgjobq.jobs") != NULL;
    pthread_mutex_unlock(&l->mu);
}

static int log_says_paused(void *arg)
{
    log_seen *l = arg;
    pthread_mutex_lock(&l->mu);
    int paused = l->paused;
    pthread_mutex_unlock(&l->mu);
    return paused > 0;
}

static _Atomic int worker_rc = -1;

static void *worker_run(void *arg)
{
    atomic_store(&worker_rc, pgjobq_worker_run(arg));
    return NULL;
}

static pgjobq_outcome noop(pgjobq_ctx *ctx, void *arg)
{
    (void)ctx;
    (void)arg;
    return PGJOBQ_OUTCOME_COMPLETE;
}

static int autovacuum_off(void *arg)
{
    char *s = autovacuum_setting(arg);
    int off = strcmp(s, "off") == 0;
    free(s);
    return off;
}

TEST_FULL(the_maintaining_worker_pauses_autovacuum_and_says_so, 60, 0)
{
    PGconn *pg = t_pg(), *pin = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    log_seen seen = {PTHREAD_MUTEX_INITIALIZER, 0};
    pthread_t th;

    PQclear(t_exec(pin, "BEGIN ISOLATION LEVEL REPEATABLE READ"));
    PQclear(t_exec(pin, "SELECT count(*) FROM pgjobq.queues"));
    churn(pg, "avw");
    free(t_str(pg, "SELECT pgjobq.autovacuum_adapt()"));
    vacuum_jobs(pg);
    vacuum_jobs(pg); /* two: one more is needed if an autovacuum was running at the first sight */
    o.log_fn = watch_log;
    o.log_arg = &seen;
    CHECK(pgjobq_worker_new(&w, t_conninfo(), &o) == PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(w, "avw", NULL, 1, noop, NULL) == PGJOBQ_OK);
    CHECK(pthread_create(&th, NULL, worker_run, w) == 0);
    /* Its first look at health() is 5 to 15 s after it starts. */
    CHECK_MSG(t_wait_until(autovacuum_off, pg, 30000), "the worker did not pause autovacuum");
    /* The setting is visible once the worker's statement commits; its log line follows when the
     * worker reads the answer (a stop in between would lose it: seen under the sanitizers). */
    CHECK_MSG(t_wait_until(log_says_paused, &seen, 10000), "the worker did not say it paused autovacuum");
    pgjobq_worker_stop(w);
    pthread_join(th, NULL);
    CHECK_INT(atomic_load(&worker_rc), PGJOBQ_OK);
    pgjobq_worker_free(w);
    pthread_mutex_lock(&seen.mu);
    CHECK_INT(seen.paused, 1);
    pthread_mutex_unlock(&seen.mu);
    PQclear(t_exec(pin, "COMMIT"));
    char *s = t_str(pg, "SELECT pgjobq.autovacuum_adapt()");
    CHECK_STR(s, "resumed");
    free(s);
    PQfinish(pin);
    PQfinish(pg);
}

typedef struct warn_seen {
    pthread_mutex_t mu;
    int health_failed;
} warn_seen;

static void watch_warn(void *arg, pgjobq_log_level level, const char *msg)
{
    warn_seen *l = arg;
    pthread_mutex_lock(&l->mu);
    l->health_failed += level == PGJOBQ_LOG_WARN && strstr(msg, "reading pgjobq.health() and") != NULL &&
                        strstr(msg, "vacuum is not watched") != NULL;
    pthread_mutex_unlock(&l->mu);
}

static int health_warned(void *arg)
{
    warn_seen *l = arg;
    pthread_mutex_lock(&l->mu);
    int n = l->health_failed;
    pthread_mutex_unlock(&l->mu);
    return n > 0;
}

static int queue_empty_hw(void *arg)
{
    return t_int(arg, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'hw'") == 0;
}

/* A worker whose health check fails when it runs (a missing grant: the test's superuser has every
 * privilege, so the function is replaced by one that fails as a missing grant would) says so at warn,
 * and goes on working. */
TEST_FULL(a_failing_health_check_is_said_at_warn_and_the_worker_goes_on, 60, 0)
{
    PGconn *pg = t_pg();
    pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
    pgjobq_worker *w = NULL;
    warn_seen seen = {PTHREAD_MUTEX_INITIALIZER, 0};
    pthread_t th;

    PQclear(t_exec(pg, "CREATE OR REPLACE FUNCTION pgjobq.autovacuum_adapt() RETURNS text LANGUAGE plpgsql AS"
                       " $$BEGIN RAISE EXCEPTION 'permission denied for function autovacuum_adapt'"
                       " USING ERRCODE = 'insufficient_privilege'; END$$"));
    o.log_fn = watch_warn;
    o.log_arg = &seen;
    CHECK(pgjobq_worker_new(&w, t_conninfo(), &o) == PGJOBQ_OK);
    CHECK(pgjobq_worker_handle(w, "hw", NULL, 1, noop, NULL) == PGJOBQ_OK);
    CHECK(pthread_create(&th, NULL, worker_run, w) == 0);
    /* Its first look at health() is 5 s after it starts. */
    CHECK_MSG(t_wait_until(health_warned, &seen, 30000), "no warning about the failed health check");
    PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.enqueue_many(ARRAY['hw'], NULL, NULL)"));
    CHECK_MSG(t_wait_until(queue_empty_hw, pg, 20000), "the worker stopped running jobs");
    pgjobq_worker_stop(w);
    pthread_join(th, NULL);
    CHECK_INT(atomic_load(&worker_rc), PGJOBQ_OK);
    pgjobq_worker_free(w);
    PQfinish(pg);
}
