/*
 * test_plans.c - the plans a session keeps: every statement that reads pgjobq.jobs by id reads it
 * through the primary key, even with plans made while the table was empty.
 *
 * Since schema 33, jobs_ready_idx (queue, priority, greatest(run_at, ready_at), id) holds every row
 * of a queue. A statement that names a queue and an id can be served by it, walking the queue's whole
 * range for each id: with plans made on an empty table (every worker's session starts that way after
 * reset_queue, and PL/pgSQL keeps its plans for the session), a rescue pass took 7 s and a prune 90 s
 * at 10,000 jobs/s (bench/README.md). This test makes every plan on an empty table, loads 40,000 jobs
 * behind the planner's back, and runs the same calls again with auto_explain: no node of any
 * statement may scan the table or throw away thousands of rows.  And a keyed claim's plan counts the
 * running jobs once, not once per key.
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* What the plans showed: how many were seen, and the first offending ones. */
static int plans_seen;
static int plans_pkey;
static char offences[16384];

/* A node of pgjobq.jobs that throws away this many rows (per loop) read more than a lookup should: the
 * queue holds 40,000 queued jobs and 3,000 running ones, the calls' own jobs are a dozen.  (A walk from
 * the queue's head, as a claim of a queue with limits makes, reads the running jobs: since schema 33
 * they share jobs_ready_idx with the queued ones.  It reads no further.) */
#define ROWS_THROWN_MAX 10000

static int offences_n;

static void note_offence(const char *why, const char *plan)
{
    size_t used = strlen(offences);
    const char *q = strstr(plan, "Query Text:");
    int qlen = 0;
    while (q[qlen] != '\0' && q[qlen] != '\n' && qlen < 160)
        qlen++;
    /* The whole plan for the first offence, the statement for the others. */
    if (used + 200 >= sizeof offences)
        return;
    if (offences_n == 0)
        snprintf(offences + used, sizeof offences - used, "--- %s in:\n%.3000s\n", why, plan);
    else
        snprintf(offences + used, sizeof offences - used, "--- %s in: %.*s\n", why, qlen, q);
    offences_n++;
}

/* The notice processor: checks each plan as auto_explain sends it. */
static void check_plan(void *arg, const char *msg)
{
    (void)arg;
    if (strstr(msg, "Query Text:") == NULL)
        return;
    plans_seen++;
    if (strstr(msg, "jobs_pkey") != NULL)
        plans_pkey++;
    if (strstr(msg, "Seq Scan on jobs") != NULL)
        note_offence("a scan of pgjobq.jobs", msg);
    /* Line by line: a line with a cost starts a node, the lines after it tell what it threw away. */
    static const char *const thrown[] = {"Rows Removed by Filter: ", "Rows Removed by Index Recheck: "};
    int on_jobs = 0;
    for (const char *line = msg; line != NULL && *line != '\0';) {
        const char *eol = strchr(line, '\n');
        size_t len = eol != NULL ? (size_t)(eol - line) : strlen(line);
        if (memmem(line, len, "(cost=", 6) != NULL)
            on_jobs = memmem(line, len, " on jobs ", 9) != NULL;
        for (size_t i = 0; on_jobs && i < sizeof thrown / sizeof thrown[0]; i++) {
            const char *p = memmem(line, len, thrown[i], strlen(thrown[i]));
            if (p != NULL && strtol(p + strlen(thrown[i]), NULL, 10) >= ROWS_THROWN_MAX)
                note_offence(thrown[i], msg);
        }
        line = eol != NULL ? eol + 1 : NULL;
    }
}

/* One round of every call that finds jobs by id, on the session's own dozen jobs (priority -5: the
 * claim takes them before the 40,000 loaded ones). Run twice on the empty table to make the plans,
 * once on the loaded table to look at them. */
static void every_call(PGconn *pg)
{
    PQclear(t_exec(pg, "TRUNCATE mine RESTART IDENTITY"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(array_fill('q'::text, ARRAY[13]), array_fill('k'::text, ARRAY[13]),"
                       " array_fill('{}'::jsonb, ARRAY[13]), array_fill(-5::smallint, ARRAY[13]))"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('q', 'k', '{}', -5::smallint, concurrency_key => 'ck')"));
    PQclear(t_exec(pg, "INSERT INTO mine (id, tok) SELECT id, lease_token"
                       " FROM pgjobq.claim_next('q', 14, '5 min', 'w') WHERE id IS NOT NULL ORDER BY id"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM mine"), 14);
    /* A parent and its waiting child, claimed in the same way. */
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue('q', 'k', '{}', -5::smallint,"
                       " after => ARRAY[(SELECT id FROM mine WHERE n = 13)])"));

#define IDS(cond)  "ARRAY(SELECT id FROM mine WHERE " cond " ORDER BY n)"
#define TOKS(cond) "ARRAY(SELECT tok FROM mine WHERE " cond " ORDER BY n)"
#define ONE(n)     "(SELECT id FROM mine WHERE n = " #n "), (SELECT tok FROM mine WHERE n = " #n ")"
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.complete_many(" IDS("n IN (1, 2, 13)") ", " TOKS(
                            "n IN (1, 2, 13)") ") WHERE outcome = 'completed'"),
              3);
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.fail_many(" IDS("n IN (3, 4)") ", " TOKS(
                           "n IN (3, 4)") ", ARRAY['e', 'e'], NULL, ARRAY[false, true])"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.extend_many(" IDS("n IN (5, 6)") ", " TOKS("n IN (5, 6)") ", '10 min')"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.release_many(" IDS("n = 7") ", " TOKS("n = 7") ")"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.snooze_many(" IDS("n = 8") ", " TOKS(
                           "n = 8") ", ARRAY['r'], ARRAY['1 s'::interval])"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.cancel_many(" IDS("n = 9") ", " TOKS("n = 9") ")"));
    PQclear(t_exec(
        pg, "SELECT * FROM pgjobq.progress_many(" IDS("n = 10") ", " TOKS("n = 10") ", ARRAY['{\"p\": 1}'::jsonb])"));
    PQclear(t_exec(pg, "SELECT pgjobq.set_progress(" ONE(10) ", '{\"p\": 2}')"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.step_put(" ONE(11) ", 's', '1')"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.step_get(" ONE(11) ", 's')"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.steps_of(" ONE(11) ")"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.steps((SELECT id FROM mine WHERE n = 11))"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.sleep(" ONE(11) ", 'z', '1 hour')"));
    /* Job 12's lease ends by hand (the trigger arms its alarm); every alarm is made due, so the rescue
     * probes the loaded queue's 3,000 running jobs too. */
    PQclear(t_exec(pg, "UPDATE pgjobq.jobs SET lease_until = now() - interval '1 s'"
                       " WHERE id = (SELECT id FROM mine WHERE n = 12)"));
    PQclear(t_exec(pg, "UPDATE pgjobq.lease_alarms SET until = now() - interval '1 s'"));
    PQclear(t_exec(pg, "SELECT pgjobq.rescue_expired(1000)"));
    PQclear(t_exec(pg, "SELECT pgjobq.rescue_expired(1000, now() - interval '1 hour')"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.jobs WHERE id = (SELECT id FROM mine WHERE n = 12)"
                        " AND state = 'queued'"),
              1);
    /* The admin calls by id. */
    PQclear(t_exec(pg, "SELECT pgjobq.retry((SELECT id FROM mine WHERE n = 4))"));
    PQclear(t_exec(pg, "SELECT pgjobq.cancel((SELECT id FROM mine WHERE n = 4))"));
    PQclear(t_exec(pg, "SELECT pgjobq.retry_running((SELECT id FROM mine WHERE n = 5))"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.monitor_job((SELECT id FROM mine WHERE n = 6))"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.job_get((SELECT id FROM mine WHERE n = 6))"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.parents((SELECT max(id) FROM pgjobq.jobs))"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.children((SELECT id FROM mine WHERE n = 13))"));
    /* What a worker and the dashboard read every few seconds. */
    PQclear(t_exec(pg, "SELECT count(*) FROM pgjobq.running_jobs('q')"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.leased_now()"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.queue_ready('q')"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.queue_ready()"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.health()"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.monitor_queue_counts()"));
    PQclear(t_exec(pg, "SELECT pgjobq.monitor_queue_drained('q')"));
    PQclear(t_exec(pg, "SELECT pgjobq.monitor_queue_first_live('q', (SELECT min(id) FROM mine))"));
    PQclear(t_exec(pg, "SELECT pgjobq.next_due('q')"));
    /* The maintenance passes. */
    PQclear(t_exec(pg, "SELECT pgjobq.expire_queued()"));
    PQclear(t_exec(pg, "SELECT pgjobq.age_priorities()"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.prune()"));
    PQclear(t_exec(pg, "SELECT * FROM pgjobq.levels_reclaim('0 s')"));
    /* The rest of the dozen finish, so that the next round's claim takes a fresh dozen. */
    PQclear(t_exec(pg, "SELECT pgjobq.cancel(id) FROM mine"));
    PQclear(t_exec(pg, "SELECT pgjobq.cancel(id) FROM pgjobq.jobs WHERE queue = 'q' AND priority = -5"));
#undef IDS
#undef TOKS
#undef ONE
}

TEST_FULL(lookups_by_id_use_the_primary_key_with_plans_made_on_an_empty_table, 180, 0)
{
    PGconn *pg = t_pg();
    PGconn *loader = t_pg();

    /* No statistics but the empty table's, and nothing to change them behind the test's back. */
    PQclear(t_exec(pg, "ALTER TABLE pgjobq.jobs SET (autovacuum_enabled = off)"));
    PQclear(t_exec(pg, "ANALYZE pgjobq.jobs"));
    PQclear(t_exec(pg, "SELECT pgjobq.queue_set('q', '{\"concurrency\": 100000, \"key_concurrency\": 5,"
                       " \"dead_letter\": \"dl\", \"priority_aging\": \"1 s\"}')"));
    PQclear(t_exec(pg, "CREATE TEMP TABLE mine (n serial, id bigint, tok bigint)"));
    PQclear(t_exec(pg, "SET plan_cache_mode = force_generic_plan"));
    every_call(pg);
    every_call(pg);

    /* 40,000 queued jobs and 3,000 running ones, loaded in another session: the first session's plans
     * stay as they were made. */
    PQclear(t_exec(loader, "SELECT pgjobq.enqueue_many(array_fill('q'::text, ARRAY[43000]),"
                           " array_fill('k'::text, ARRAY[43000]), array_fill('{}'::jsonb, ARRAY[43000]))"));
    for (int i = 0; i < 3; i++)
        CHECK_INT(t_int(loader, "SELECT count(id) FROM pgjobq.claim_next('q', 1000, '5 min', 'loader')"), 1000);
    /* Old enough for the queue's priority aging (1 s) to raise them. */
    PQclear(t_exec(loader, "SELECT pg_sleep(1.1)"));

    t_auto_explain(pg, check_plan, 1);
    every_call(pg);
    PQclear(t_exec(pg, "SET auto_explain.log_min_duration = -1"));
    printf("%d plans, %d through jobs_pkey\n", plans_seen, plans_pkey);
    CHECK_MSG(offences[0] == '\0', "plans that read more of pgjobq.jobs than their jobs:\n%s", offences);
    CHECK_MSG(plans_seen >= 50, "only %d plans were seen", plans_seen);
    CHECK_MSG(plans_pkey >= 20, "only %d plans read pgjobq.jobs through jobs_pkey", plans_pkey);
    /* The calls did what the plans were for: dead letters (one a round), aged priorities. */
    CHECK_INT(t_int(loader, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'dl'"), 3);
    CHECK(t_int(loader, "SELECT count(*) FROM pgjobq.jobs WHERE queue = 'q' AND base_priority IS NOT NULL") > 0);
    /* The loaded jobs are untouched but for the rescue: 3,000 running ones still hold their leases. */
    CHECK_INT(t_int(loader, "SELECT count(*) FROM pgjobq.jobs WHERE state = 'running' AND worker_id = 'loader'"), 3000);
    PQfinish(loader);
    PQfinish(pg);
}

/* A function that turns sequential scans off (so that its lookups by id take the primary key whatever
 * the statistics say) also turns JIT off.  A plan that scans a small table all the same (one without an
 * index for that statement) costs 10^10 with enable_seqscan = off, far past jit_above_cost, and every
 * execution of it compiles itself first: each prune compiled four statements (levels_gone read and
 * updated, pgjobq.levels updated, pgjobq.awaited cleaned), 87 ms for a 0.1 ms read, and a worker
 * prunes every minute.  The other functions' plans showed no such scan: for them it is a precaution. */
TEST(functions_that_turn_seqscans_off_turn_jit_off_too)
{
    PGconn *pg = t_pg();

    CHECK_INT(t_int(pg, "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                        " WHERE n.nspname = 'pgjobq' AND 'enable_seqscan=off' = ANY (p.proconfig)"),
              t_int(pg, "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                        " WHERE n.nspname = 'pgjobq' AND 'enable_seqscan=off' = ANY (p.proconfig)"
                        " AND 'jit=off' = ANY (p.proconfig)"));
    CHECK_MSG(t_int(pg, "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                        " WHERE n.nspname = 'pgjobq' AND 'enable_seqscan=off' = ANY (p.proconfig)") >= 40,
              "fewer functions than expected turn sequential scans off: the test proves nothing");
    PQfinish(pg);
}

/* The running_jobs scans of the plans a notice carries: how many, and the most loops of one. */
static int counts_seen;
static long counts_loops_max;
static void check_counts(void *arg, const char *msg)
{
    (void)arg;
    for (const char *p = strstr(msg, "Function Scan on running_jobs"); p != NULL;
         p = strstr(p + 1, "Function Scan on running_jobs")) {
        const char *eol = strchr(p, '\n');
        const char *loops = strstr(p, "loops=");
        if (loops == NULL || (eol != NULL && loops > eol))
            continue;
        counts_seen++;
        long n = strtol(loops + strlen("loops="), NULL, 10);
        if (n > counts_loops_max)
            counts_loops_max = n;
    }
}

/* A claim of a queue with a limit per key counts each key's running jobs once for the whole claim,
 * not once per key: with the count inlined into the per-key reads, a claim over 1,000 keys ran
 * running_jobs 1,000 times (209 of its 258 ms; bench/README.md, "Queues with a concurrency limit"). */
TEST(a_claim_with_a_limit_per_key_counts_the_running_jobs_once)
{
    PGconn *pg = t_pg();

    PQclear(t_exec(pg, "SELECT pgjobq.queue_set('kc', '{\"key_concurrency\": 2}')"));
    PQclear(t_exec(pg, "SELECT pgjobq.enqueue_many(array_fill('kc'::text, ARRAY[400]), NULL, NULL,"
                       " concurrency_keys => ARRAY(SELECT 'k' || (i %% 50) FROM generate_series(1, 400) i))"));
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('kc', 30, '5 min', 'w')"), 30);
    t_auto_explain(pg, check_counts, 1);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.claim_batch('kc', 100, '5 min', 'w')"), 70);
    PQclear(t_exec(pg, "SET auto_explain.log_min_duration = -1"));
    printf("running_jobs scanned %d times in the claim's plans, at most %ld loops\n", counts_seen, counts_loops_max);
    CHECK_MSG(counts_seen >= 1, "no plan of the keyed claim counted the running jobs: the test proves nothing");
    CHECK_MSG(counts_loops_max == 1, "the keyed claim counted the running jobs %ld times in one statement",
              counts_loops_max);
    PQfinish(pg);
}
