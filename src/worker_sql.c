/*
 * worker_sql.c - the worker's statements, in one table: every statement the engine prepares and
 * sends, the session setup of its connections, and its LISTEN.  The indexes (PGJOBQ__S_*) and the
 * columns of the claim (PGJOBQ__K_*) are in engine.h; worker.c sends and reads them.
 */
#include "engine.h"

/* The claim connection's, the write connection's, then the maintenance connection's: each connection
 * prepares its own. */
const pgjobq__stmt_range pgjobq__worker_conn_stmts[PGJOBQ__NCONN] = {
    [PGJOBQ__C_CLAIM] = {PGJOBQ__S_CLAIM, 2},
    [PGJOBQ__C_WRITE] = {PGJOBQ__S_COMPLETE, PGJOBQ__S_PROGRESS + 1 - PGJOBQ__S_COMPLETE},
    [PGJOBQ__C_MAINT] = {PGJOBQ__S_RESCUE, PGJOBQ__NSTMTS - PGJOBQ__S_RESCUE}};

static const Oid claim_types[] = {OID_TEXT,       OID_INT4,      OID_INTERVAL,          OID_TEXT,      OID_INT2_ARRAY,
                                  OID_TIMESTAMPTZ_ARRAY, OID_INT8_ARRAY, OID_TIMESTAMPTZ_ARRAY, OID_INT8_ARRAY, OID_BOOL,
                                  OID_BOOL};
static const Oid complete_types[] = {OID_INT8_ARRAY, OID_INT8_ARRAY, OID_JSONB_ARRAY};
static const Oid fail_types[] = {OID_INT8_ARRAY, OID_INT8_ARRAY, OID_TEXT_ARRAY, OID_INTERVAL_ARRAY, OID_BOOL_ARRAY};
static const Oid reason_types[] = {OID_INT8_ARRAY, OID_INT8_ARRAY, OID_TEXT};
static const Oid extend_types[] = {OID_INT8_ARRAY, OID_INT8_ARRAY, OID_INTERVAL};
static const Oid progress_types[] = {OID_INT8_ARRAY, OID_INT8_ARRAY, OID_JSONB_ARRAY};
static const Oid snooze_types[] = {OID_INT8_ARRAY, OID_INT8_ARRAY, OID_TEXT_ARRAY, OID_INTERVAL_ARRAY, OID_BOOL_ARRAY};
static const Oid beat_types[] = {OID_TEXT, OID_TEXT, OID_INT4, OID_TEXT, OID_TEXT, OID_INT8, OID_TEXT};
static const Oid prune_types[] = {OID_INTERVAL, OID_INTERVAL};
static const Oid since_type[] = {OID_INT8};
static const Oid text_type[] = {OID_TEXT};

const pgjobq__stmtdef pgjobq__worker_stmts[PGJOBQ__NSTMTS] = {
    /* claim_next's columns, in the order of PGJOBQ__K_*: a row per claimed job (meta NULL), then rows
     * that say where the claim got to (meta 'exhausted': a level read to its end; 'tick': the claim's
     * tick, cap and the next due job; 'gate': the notification gate, below).  $10, lanes: under a
     * backlog, at most two such claims of a queue at once (schema 13; each is a transaction of its
     * own, so its lane is held only while it runs).  $11, gate: true, the claim may stamp the gate
     * and the worker keeps the promise; NULL, it only reports the gate (schema 32; worker.c, "The
     * notification gate"). */
    [PGJOBQ__S_CLAIM] = {"pgjobq_claim",
                         "SELECT " PGJOBQ__CLAIMED_COLUMNS ", key, meta, cap, tick_xid, next_due, limited"
                         " FROM pgjobq.claim_next($1, $2, $3, $4, $5, $6, $7, $8, $9, lanes => $10, gate => $11)",
                         11, claim_types},
    /* A worker that promised a claim it cannot make (no free slot, or its claim came back full) wakes
     * the others: pgjobq.notify's notification, without the gate, which the promise holds shut. */
    [PGJOBQ__S_HAND_ON] = {"pgjobq_hand_on", "SELECT pg_catalog.pg_notify('pgjobq', $1)", 1, text_type},
    [PGJOBQ__S_COMPLETE] = {"pgjobq_complete", "SELECT id, outcome FROM pgjobq.complete_many($1, $2, $3)", 3,
                            complete_types},
    [PGJOBQ__S_FAIL] = {"pgjobq_fail", "SELECT id, outcome FROM pgjobq.fail_many($1, $2, $3, $4, $5)", 5, fail_types},
    [PGJOBQ__S_RELEASE] = {"pgjobq_release", "SELECT id, outcome FROM pgjobq.release_many($1, $2, $3)", 3,
                           reason_types},
    [PGJOBQ__S_CANCEL] = {"pgjobq_cancel", "SELECT id, outcome FROM pgjobq.cancel_many($1, $2, $3)", 3, reason_types},
    /* Jobs their handlers handed back (PGJOBQ_OUTCOME_SNOOZE, schema 18; HAND_BACK, which counts no
     * snooze, 26): $3 why, $4 when they run again (NULL: the backoff), $5 which were hand-backs.  The
     * same shape as fail_many's. */
    [PGJOBQ__S_SNOOZE] = {"pgjobq_snooze", "SELECT id, outcome FROM pgjobq.snooze_many($1, $2, $3, $4, $5)", 5,
                          snooze_types},
    [PGJOBQ__S_EXTEND] = {"pgjobq_extend", "SELECT id, outcome FROM pgjobq.extend_many($1, $2, $3)", 3, extend_types},
    /* The registry of live workers (pgjobq.workers) that `pgjobq serve` shows; $6 is the worker's
     * secret, which makes the row its own; $7 why it claims nothing (pgjobq_worker_set_unhealthy,
     * schema 18), NULL while it claims. */
    [PGJOBQ__S_BEAT] = {"pgjobq_beat", "SELECT pgjobq.worker_beat($1, $2, $3, $4, $5, $6, $7)", 7, beat_types},
    /* The latest progress each handler set (schema 13), fenced by the jobs' leases. */
    [PGJOBQ__S_PROGRESS] = {"pgjobq_progress", "SELECT id, outcome FROM pgjobq.progress_many($1, $2, $3)", 3,
                            progress_types},
    /* Maintenance: only one process of the fleet does each pass at a time (the others get -1).
     * $1: the leases to look at ended at or after this (microseconds since the epoch; NULL: all). */
    [PGJOBQ__S_RESCUE] = {"pgjobq_rescue",
                          "SELECT CASE WHEN pg_catalog.pg_try_advisory_xact_lock(" PGJOBQ__LOCK(2) ")"
                          " THEN pgjobq.rescue_expired(1000, pg_catalog.to_timestamp($1 / 1000000.0)) ELSE -1 END,"
                          " (pg_catalog.date_part('epoch', pg_catalog.now()) * 1000000)::bigint",
                          1, since_type},
    [PGJOBQ__S_PRUNE] = {"pgjobq_prune",
                         "SELECT CASE WHEN pg_catalog.pg_try_advisory_xact_lock(" PGJOBQ__LOCK(3) ")"
                         " THEN pgjobq.prune($1, $2, 1000) ELSE -1 END",
                         2, prune_types},
    /* Schedules need no lock: each due schedule is taken by one tick (FOR UPDATE SKIP LOCKED). */
    [PGJOBQ__S_TICK] = {"pgjobq_tick", "SELECT pgjobq.schedule_tick(100)", 0, NULL},
    /* health() is read before autovacuum_adapt() runs (a function in FROM is materialised first). */
    [PGJOBQ__S_HEALTH] = {"pgjobq_health",
                          "SELECT round(horizon_age_s), holder_kind, holder_pid, holder_application, holder_state,"
                          " jobs_dead, pgjobq.autovacuum_adapt() FROM pgjobq.health()",
                          0, NULL}};

const char *const pgjobq__worker_write_what[PGJOBQ__W_KINDS] = {"complete", "fail", "release", "cancel", "snooze"};

/* The claim connection's simple queries (not prepared): its LISTEN, again after a reconnect, and the
 * check that it still listens. */
#define LISTEN_SQL "LISTEN pgjobq"
const char pgjobq__worker_listen_sql[] = LISTEN_SQL;
const char pgjobq__worker_listen_check_sql[] =
    "SELECT 1 FROM pg_catalog.pg_listening_channels() c WHERE c = 'pgjobq'";

/* Session setup of every connection: the isolation level pgjobq's statements are designed for, and
 * the schema check (its result must be last).  The claim connection also listens. */
#define SETUP_SQL "SET default_transaction_isolation = 'read committed';"
#define SCHEMA_SQL                                                                                   \
    "SELECT " PGJOBQ__SCHEMA_VERSION_COLS ", pg_catalog.pg_is_in_recovery() OR"                    \
    " pg_catalog.current_setting('transaction_read_only')::boolean" PGJOBQ__SCHEMA_VERSION_FROM
const char pgjobq__worker_setup_plain[] = SETUP_SQL SCHEMA_SQL;
const char pgjobq__worker_setup_listen[] = SETUP_SQL LISTEN_SQL ";" SCHEMA_SQL;
