/*
 * pgjobq.h - the whole public API of libpgjobq, a job queue that lives in PostgreSQL.
 *
 * What is not in this file is not API.
 *
 * Threading: one handle, one thread.  A pgjobq_client (and the PGconn inside it) must not be used by
 * two threads at the same time; give each thread its own client.  Functions that take no handle
 * (pgjobq_strerror, pgjobq_version, ...) are safe from any thread.
 *
 * Errors: every fallible function returns an int, PGJOBQ_OK (0) on success or one of the PGJOBQ_E*
 * codes below, which are never renumbered.  pgjobq_strerror(code) describes a code; pgjobq_errmsg(c)
 * describes the last failure on a handle in full (owned by the library, valid until the next call on
 * that handle); pgjobq_sqlstate(c) gives the PostgreSQL SQLSTATE behind it, if any.
 *
 * The library never prints, never exits and never aborts on bad input.  It reports through return
 * codes and, if installed, a log callback (pgjobq_client_set_log), which also receives libpq notices.
 *
 * Times: every lease, schedule and backoff is computed by the database clock (now()).  Times returned
 * to the caller are microseconds since the Unix epoch, UTC; PGJOBQ_TIME_NONE marks an absent time.
 *
 * ABI: the shared library's soname is libpgjobq.so.0 for the whole 0.x series.  Every public struct
 * ends with pgjobq_reserved[] (keep it zero): fields added later take that room, so a struct's size,
 * and the stride of the arrays the library returns, do not change; initialise option structs with
 * their *_INIT macro (designated initialisers in C; a value-initialising function in C++).  The exported symbols are listed in
 * pgjobq.sym and checked at every build; a symbol is never removed, and a result code never
 * renumbered, without a new soname.  Everything the library allocates has its own *_free function.
 */
#ifndef PGJOBQ_H
#define PGJOBQ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(PGJOBQ_BUILDING) && defined(__GNUC__)
#define PGJOBQ_EXPORT __attribute__((visibility("default")))
#else
#define PGJOBQ_EXPORT
#endif

#if defined(__GNUC__)
#define PGJOBQ_WUR __attribute__((warn_unused_result))
#else
#define PGJOBQ_WUR
#endif

/* ------------------------------------------------------------------------------------------------ */
/* Versions                                                                                          */

/* Compile-time version: major * 10000 + minor * 100 + patch. */
#define PGJOBQ_VERSION     "0.1.0"
#define PGJOBQ_VERSION_NUM 100

/* The schema version this library creates with pgjobq_migrate() and requires. */
#define PGJOBQ_SCHEMA_VERSION 34

/* Run-time version of the linked library, e.g. "0.1.0". */
PGJOBQ_EXPORT const char *pgjobq_version(void);

/* Run-time version number of the linked library, same encoding as PGJOBQ_VERSION_NUM. */
PGJOBQ_EXPORT int pgjobq_version_num(void);

/* ------------------------------------------------------------------------------------------------ */
/* Errors                                                                                            */

/* Result codes.  Values are stable and are never renumbered; new codes are only ever appended. */
enum pgjobq_code {
    PGJOBQ_OK = 0,          /* success */
    PGJOBQ_EINVAL = 1,      /* an argument or input value is invalid; nothing was written */
    PGJOBQ_ENOMEM = 2,      /* out of memory */
    PGJOBQ_ECONN = 3,       /* the connection to the database failed or was lost */
    PGJOBQ_EDB = 4,         /* the database reported an error not covered by another code */
    PGJOBQ_ESCHEMA = 5,     /* the pgjobq schema is missing, older, or newer than this library */
    PGJOBQ_ENOTFOUND = 6,   /* no job with that id */
    PGJOBQ_ESTATE = 7,      /* the job's state does not allow the operation */
    PGJOBQ_ELEASE = 8,      /* the lease is lost: token stale, lease expired, or job no longer running */
    PGJOBQ_ECANCELLED = 9,  /* the job was cancelled while held; it is now in state cancelled */
    PGJOBQ_EDUPLICATE = 10, /* a queued or running job of the queue already holds this unique key */
    PGJOBQ_ECONFLICT = 11,  /* serialization failure or deadlock (40001, 40P01); retry the transaction */
    PGJOBQ_EPERM = 12,      /* the database role lacks a privilege the operation needs */
    PGJOBQ_ETIMEOUT = 13,   /* a statement or lock timeout fired */
    PGJOBQ_ESTOPPED = 14,   /* pgjobq_worker_run: pgjobq_worker_stop came first, nothing ran */
    PGJOBQ_PARKED = 15      /* not an error: a durable sleep or a wait for an event parked the job
                               (pgjobq_ctx_sleep, pgjobq_ctx_wait_event): its attempt is over, the
                               handler returns (PGJOBQ_OUTCOME_PARKED) */
};

/* One sentence describing a result code ("invalid argument"); never NULL. */
PGJOBQ_EXPORT const char *pgjobq_strerror(int code);

/* The symbolic name of a result code ("PGJOBQ_EINVAL"); never NULL. */
PGJOBQ_EXPORT const char *pgjobq_errname(int code);

/* ------------------------------------------------------------------------------------------------ */
/* Jobs                                                                                              */

/* A job's state.  queued -> running -> completed, or failed (attempts exhausted or failed for good),
 * or cancelled.  A retry is queued again with a later run_at.  A job enqueued after other jobs
 * (pgjobq_enqueue_opts.after) is waiting until they have all completed, then queued. */
typedef enum pgjobq_state {
    PGJOBQ_QUEUED = 0,
    PGJOBQ_RUNNING = 1,
    PGJOBQ_COMPLETED = 2,
    PGJOBQ_FAILED = 3,
    PGJOBQ_CANCELLED = 4,
    PGJOBQ_WAITING = 5
} pgjobq_state;

/* The state's name as stored in the database ("queued", ...); "unknown" for an out-of-range value. */
PGJOBQ_EXPORT const char *pgjobq_state_name(pgjobq_state state);

/* Parses a state name.  Returns PGJOBQ_OK and sets *out, or PGJOBQ_EINVAL for an unknown name. */
PGJOBQ_EXPORT int pgjobq_state_parse(const char *name, pgjobq_state *out) PGJOBQ_WUR;

#define PGJOBQ_TIME_NONE INT64_MIN

/* Limits, checked by the library and by the database's CHECK constraints alike. */
#define PGJOBQ_NAME_MAX             64      /* queue and kind names: [A-Za-z][A-Za-z0-9_.:-]{0,63} */
#define PGJOBQ_PAYLOAD_MAX          1048576 /* payload JSON text, bytes */
#define PGJOBQ_UNIQUE_KEY_MAX       255     /* unique key, characters */
#define PGJOBQ_PRIORITY_MIN         (-100)  /* lower priority values run first */
#define PGJOBQ_PRIORITY_MAX         100
#define PGJOBQ_MAX_ATTEMPTS_MAX     1000
#define PGJOBQ_DEFAULT_MAX_ATTEMPTS 25
#define PGJOBQ_ERROR_MAX            8192  /* last_error is cut to this many bytes */
#define PGJOBQ_BATCH_MAX            10000 /* most jobs one claim returns */
#define PGJOBQ_PROGRESS_MAX         8192  /* a job's progress, JSON text, bytes */
#define PGJOBQ_MAX_LEASE_DEFAULT_MS 86400000 /* the longest lease in a queue without max_lease: a day */

/* A job as read from the database.  Strings are NUL-terminated UTF-8; those marked "or NULL" are NULL
 * when the column is NULL.  The whole array a function returns is one allocation owned by the caller
 * and released with pgjobq_jobs_free(); the strings live inside it. */
typedef struct pgjobq_job {
    int64_t id;
    const char *queue;
    const char *kind;
    const char *payload; /* JSON text */
    int priority;
    pgjobq_state state;
    int attempt; /* 1 for the first run; incremented by every claim */
    int max_attempts;
    int64_t lease_token; /* fencing token of the claim that returned the job (the holder's secret:
                            0 in jobs read with pgjobq_job_get, _list or _parents) */
    int64_t run_at;      /* microseconds since the epoch; see PGJOBQ_TIME_NONE */
    int64_t created_at;
    int64_t started_at;
    int64_t finished_at;
    int64_t lease_until;
    const char *worker_id;  /* or NULL */
    const char *result;     /* JSON text, or NULL */
    const char *last_error; /* or NULL */
    const char *unique_key; /* or NULL */
    int cancel_requested;   /* nonzero when a cancel was requested while the job was running */
    union {
        const char *tags; /* the job's tags as a JSON array of strings, or NULL (none, or a claimed job) */
        uint64_t pgjobq_slot0_;
    };
    union {
        const char *progress; /* the last progress the job reported (JSON), or NULL */
        uint64_t pgjobq_slot1_;
    };
    union {
        /* A claimed job that waited for parents: a JSON array of {"id", "state", "result"} of each
           parent, in id order; NULL for other jobs, and from pgjobq_job_get and pgjobq_job_list (use
           pgjobq_job_parents there). */
        const char *parents;
        uint64_t pgjobq_slot2_;
    };
    int64_t cancel_requested_at; /* when that cancel was requested (schema 16; PGJOBQ_TIME_NONE: none, or
                                    one requested before the upgrade).  When its holder then told the
                                    handler is pgjobq.all_jobs.cancel_told_at.  (In place of the last
                                    reserved field.) */
} pgjobq_job;

/* Releases an array returned by pgjobq_claim, pgjobq_job_get or pgjobq_job_list.  Accepts NULL. */
PGJOBQ_EXPORT void pgjobq_jobs_free(pgjobq_job *jobs);

/* The trace context a job was enqueued with (pgjobq_job_spec.traceparent: a W3C traceparent), or NULL
 * when it has none.  For a job the library returned (pgjobq_claim, pgjobq_ctx_job, pgjobq_job_get,
 * pgjobq_job_list, pgjobq_job_parents), whose allocation holds it (pgjobq_job has no room left for a
 * field: this keeps its size); never for a pgjobq_job the caller made.  The string lives as long as
 * the job.  Accepts NULL. */
PGJOBQ_EXPORT const char *pgjobq_job_traceparent(const pgjobq_job *job);

/* ------------------------------------------------------------------------------------------------ */
/* Client                                                                                            */

typedef struct pgjobq_client pgjobq_client;

/* Log levels for the log callback. */
typedef enum pgjobq_log_level {
    PGJOBQ_LOG_DEBUG = 0,
    PGJOBQ_LOG_INFO = 1,
    PGJOBQ_LOG_WARN = 2,
    PGJOBQ_LOG_ERROR = 3
} pgjobq_log_level;

/* A log callback.  msg is one line without a trailing newline, valid only during the call.  It is
 * called on the thread that made the library call. */
typedef void (*pgjobq_log_fn)(void *arg, pgjobq_log_level level, const char *msg);

/* The level's name ("debug", "info", "warn", "error"). */
PGJOBQ_EXPORT const char *pgjobq_log_level_name(pgjobq_log_level level);

struct pg_conn; /* libpq's PGconn */

/*
 * Opens a client on its own connection.  conninfo is anything libpq accepts: "host=... dbname=..." or
 * a postgresql:// URL ("" means libpq's defaults and PG* environment variables).
 *
 * Then checks the pgjobq schema version.  Like sqlite3_open, *out is set to a handle whenever one
 * could be allocated, even when an error is returned, so that pgjobq_errmsg() can explain it; the
 * caller must pgjobq_client_close() it in every case.
 *
 * Returns PGJOBQ_OK; PGJOBQ_ECONN when the connection fails (the handle is unusable);
 * PGJOBQ_ESCHEMA when the schema is missing or older (the handle works for pgjobq_migrate() only) or
 * newer than this library (the handle is unusable); PGJOBQ_ENOMEM (then *out is NULL).
 */
PGJOBQ_EXPORT int pgjobq_client_open(pgjobq_client **out, const char *conninfo) PGJOBQ_WUR;

/*
 * Wraps a connection the caller owns, typically to enqueue inside the caller's own transaction: the job
 * then exists if and only if the caller's transaction commits.  The library borrows conn: it never
 * begins, commits or rolls back on it, never closes it, and does not retry a statement that fails
 * inside the caller's transaction.  conn must stay open until pgjobq_client_close().
 *
 * Checks the schema version like pgjobq_client_open (with one query on conn) and follows the same
 * rules for *out and the return value.
 */
PGJOBQ_EXPORT int pgjobq_client_wrap(pgjobq_client **out, struct pg_conn *conn) PGJOBQ_WUR;

/* Closes a client; closes the connection only if the client opened it.  Accepts NULL. */
PGJOBQ_EXPORT void pgjobq_client_close(pgjobq_client *c);

/* The client's connection (owned by the client unless it was wrapped).  Use it for your own queries
 * between library calls, on the same thread; do not close it. */
PGJOBQ_EXPORT struct pg_conn *pgjobq_client_conn(pgjobq_client *c);

/* Installs (or with fn == NULL removes) a log callback for this client.  On a connection the client
 * opened, libpq notices and warnings are routed to it too (a wrapped connection's notice processor is
 * left to its owner). */
PGJOBQ_EXPORT void pgjobq_client_set_log(pgjobq_client *c, pgjobq_log_fn fn, void *arg);

/* The last error on this client, one line; "" when the last call succeeded.  Owned by the library,
 * valid until the next call on the client.  Connection passwords never appear in it. */
PGJOBQ_EXPORT const char *pgjobq_errmsg(const pgjobq_client *c);

/* The SQLSTATE of the last database error on this client ("40001", ...), or "" if there was none. */
PGJOBQ_EXPORT const char *pgjobq_sqlstate(const pgjobq_client *c);

/*
 * Transactions on a connection the client opened: pgjobq_begin() starts one, and the library calls that
 * follow join it until pgjobq_commit() or pgjobq_rollback().  Statements inside it are not retried on
 * serialization failures (the transaction as a whole must be).  For a wrapped connection, use your own
 * BEGIN/COMMIT instead.  Returns PGJOBQ_OK, PGJOBQ_ESTATE (begin inside a transaction, or commit or
 * rollback outside one, or a wrapped connection), or a connection/database error.  A commit of a
 * transaction that failed earlier rolls it back and returns PGJOBQ_EDB.
 */
PGJOBQ_EXPORT int pgjobq_begin(pgjobq_client *c) PGJOBQ_WUR;
PGJOBQ_EXPORT int pgjobq_commit(pgjobq_client *c) PGJOBQ_WUR;
PGJOBQ_EXPORT int pgjobq_rollback(pgjobq_client *c) PGJOBQ_WUR;

/*
 * Creates or upgrades the pgjobq schema to PGJOBQ_SCHEMA_VERSION.  Each migration runs in its own
 * transaction under a transaction-scoped advisory lock, so running it twice, or from many hosts at
 * once, is safe (the later runs find nothing to do).  Then the SQL functions are created or replaced
 * when they differ from those the database has, with the last migration or in a transaction of their
 * own, never on a newer schema (a replaced pgjobq.backoff is kept), and the roles of
 * pgjobq_migrate_roles are granted them again where they have grants.  Needs an owned connection (not
 * inside a transaction).  *applied_out (may be NULL) receives the number of migrations applied by
 * this call (the functions do not count).
 * Returns PGJOBQ_OK, PGJOBQ_ESCHEMA (the database is newer than this library), PGJOBQ_ESTATE (the
 * connection is inside a transaction), or a connection/database error; a failed migration leaves the
 * schema at the previous version.
 */
PGJOBQ_EXPORT int pgjobq_migrate(pgjobq_client *c, int *applied_out) PGJOBQ_WUR;

/*
 * Creates (if missing) the roles pgjobq_producer (enqueue only), pgjobq_worker (claim, complete, fail,
 * heartbeat, maintenance), pgjobq_admin (both, plus reading jobs, stats, cancel, retry) and
 * pgjobq_monitor (reading only), and grants them their functions; idempotent.  Needs the schema's ownership, and the CREATEROLE privilege while
 * a role is missing.
 * Grant the roles to your login roles yourself.  Returns PGJOBQ_OK, PGJOBQ_EPERM, or an error.
 */
PGJOBQ_EXPORT int pgjobq_migrate_roles(pgjobq_client *c) PGJOBQ_WUR;

/*
 * Creates or upgrades a router database (docs/shards.md): the extension plproxy (creating it needs a
 * superuser, unless it exists), the cluster map's tables, and the PL/Proxy functions that run a shard's
 * pgjobq.enqueue, pgjobq.enqueue_many, pgjobq.stats and pgjobq.monitor_job on the cluster's shards,
 * then grants them to the pgjobq roles that exist.  A router holds no jobs: a database with the pgjobq
 * schema of a shard is refused (PGJOBQ_ESCHEMA), as pgjobq_migrate refuses a router.  Install the map
 * with pgjobq.cluster_set(map, NULL) afterwards.  Each migration runs in its own transaction under
 * pgjobq_migrate's advisory lock, then the function files when they differ from those recorded, as
 * pgjobq_migrate does.  *applied_out (may be NULL) is the number of router migrations applied.  Needs an
 * owned connection outside a transaction (PGJOBQ_ESTATE otherwise); returns PGJOBQ_OK or an error, and
 * a failed migration leaves the router at the previous version.
 */
PGJOBQ_EXPORT int pgjobq_migrate_router(pgjobq_client *c, int *applied_out) PGJOBQ_WUR;

/* Reads the schema version installed in the database into *version (0 when not installed). */
PGJOBQ_EXPORT int pgjobq_schema_version(pgjobq_client *c, int *version) PGJOBQ_WUR;

/* ------------------------------------------------------------------------------------------------ */
/* Enqueue                                                                                           */

/* Options for one job.  Zero-initialise (PGJOBQ_ENQUEUE_OPTS_INIT) and set what you need: every zero
 * or NULL field takes its default. */
typedef struct pgjobq_enqueue_opts {
    const char *queue;      /* NULL: "default" */
    const char *kind;       /* NULL: "default" */
    int priority;           /* PGJOBQ_PRIORITY_MIN..MAX, lower runs first; 0 by default */
    int max_attempts;       /* 1..PGJOBQ_MAX_ATTEMPTS_MAX; 0: PGJOBQ_DEFAULT_MAX_ATTEMPTS */
    int64_t delay_ms;       /* run no sooner than the database's now() + delay_ms: 0 to 100 years */
    const char *run_at;     /* or an absolute time, as PostgreSQL timestamptz text; NULL: none.
                               Giving both run_at and a non-zero delay_ms is PGJOBQ_EINVAL, and so
                               is a time more than 100 years from the database's now(), before or
                               after.  The database judges both rules (sql/functions/enqueue.sql,
                               enqueue_when_why), as it does for every interface. */
    const char *unique_key; /* NULL: none.  While a queued or running job of the same queue holds the
                               key, enqueueing another job with it returns the existing job instead
                               (on_conflict says what else it may do). */
    const char *concurrency_key; /* NULL: none.  When the queue has a key concurrency limit
                                    (pgjobq_queue_set_key_concurrency), at most that many jobs with
                                    the same key run at once.  1 to 255 characters. */
    union {
        /* NULL: none.  Ids of jobs this job waits for, ending with 0 (at most 10000).  The job is
           waiting until every one has completed, then queued.  Not with unique_key. */
        const int64_t *after;
        uint64_t pgjobq_slot0_;
    };
    union {
        /* NULL: none.  Tags, ending with NULL: 1 to 20 of 1 to 64 characters (pgjobq_list_opts.tag
           finds the jobs of a tag).  Not with unique_key. */
        const char *const *tags;
        uint64_t pgjobq_slot1_;
    };
    int32_t on_parent_failure; /* with after: PGJOBQ_PARENT_FAILURE_CANCEL (0, the default: a parent
                                  that fails for good or is cancelled cancels this job) or
                                  PGJOBQ_PARENT_FAILURE_RUN (it runs once every parent has finished) */
    int32_t on_conflict;       /* with unique_key, when the key is held (docs/queues.md, "Debounce and
                                  throttle"): PGJOBQ_ON_CONFLICT_SKIP (0, the default: the holder is
                                  returned), PGJOBQ_ON_CONFLICT_REPLACE (a debounce: a queued holder
                                  takes this job's kind, payload, priority, run_at, attempts and
                                  concurrency key, the last one wins; a running holder is left alone
                                  and returned) or PGJOBQ_ON_CONFLICT_KEEP (a throttle: the key is held
                                  for pgjobq_job_spec.unique_for_ms from the enqueue that took it,
                                  whatever became of that job).  (In place of a reserved field.) */
    union {
        /* NULL: none.  The job's routing key in a cluster of shards (docs/shards.md): the jobs of a
           spread queue are placed by it (a tenant, an account); stored with the job (jobs.route_key)
           and ignored for routing by a pinned queue.  pgjobq_cluster_enqueue routes by it.  (In
           place of the last reserved field.) */
        const char *route_key;
        uint64_t pgjobq_slot2_;
    };
} pgjobq_enqueue_opts;

/* pgjobq_enqueue_opts.on_parent_failure */
#define PGJOBQ_PARENT_FAILURE_CANCEL 0
#define PGJOBQ_PARENT_FAILURE_RUN    1

/* pgjobq_enqueue_opts.on_conflict */
#define PGJOBQ_ON_CONFLICT_SKIP    0
#define PGJOBQ_ON_CONFLICT_REPLACE 1
#define PGJOBQ_ON_CONFLICT_KEEP    2

#ifdef __cplusplus
static inline pgjobq_enqueue_opts pgjobq_enqueue_opts_init_(void)
{
    pgjobq_enqueue_opts o = {};
    return o;
}
#define PGJOBQ_ENQUEUE_OPTS_INIT pgjobq_enqueue_opts_init_()
#else
#define PGJOBQ_ENQUEUE_OPTS_INIT {.queue = NULL}
#endif

/*
 * Enqueues one job.  payload is JSON text (NULL: "{}").  opts may be NULL for all defaults.
 * On PGJOBQ_OK *id_out (may be NULL) receives the new job's id.  When a queued or running job
 * already holds opts->unique_key, returns PGJOBQ_EDUPLICATE, inserts nothing, and *id_out receives
 * the existing job's id; with opts->on_conflict PGJOBQ_ON_CONFLICT_REPLACE and a queued holder, the
 * holder takes this job's fields and PGJOBQ_OK is returned with its id (pgjobq_enqueue_spec tells
 * the two apart).  Invalid input returns PGJOBQ_EINVAL with the reason in pgjobq_errmsg(), and
 * writes nothing.  Workers listening on the queue are notified when the transaction commits (on the
 * client's own idle connection, by a notification sent right after the commit, in the same round
 * trip: a commit that carries one makes concurrent producers commit one at a time).
 */
PGJOBQ_EXPORT int pgjobq_enqueue(pgjobq_client *c, const char *payload, const pgjobq_enqueue_opts *opts,
                                 int64_t *id_out) PGJOBQ_WUR;

/* One job of a batch. */
typedef struct pgjobq_job_spec {
    const char *payload; /* JSON text; NULL: "{}" */
    pgjobq_enqueue_opts opts;
    int64_t unique_for_ms;   /* 0: none.  With opts.unique_key, a throttle's window (1 second to
                                365 days): the key is held that long from the enqueue that took it,
                                whatever became of that job; within it a job with the key is not
                                inserted, and the job that took it is returned.  Goes with
                                PGJOBQ_ON_CONFLICT_KEEP (which needs it; SKIP with a window is
                                refused, as is REPLACE).  (In place of a reserved field.) */
    int64_t expire_after_ms; /* 0: none.  Expiry while queued (docs/queues.md, "Expiry"): no attempt of
                                the job starts later than this long after its run_at (1 second to 365
                                days); past it the job ends cancelled, last_error "expired: ...".
                                Neither this nor expires_at: the queue's default, if it has one
                                (pgjobq_queue_set_expire_after).  (In place of a reserved field.) */
    union {
        /* NULL: none.  Or the expiry as an absolute time (PostgreSQL timestamptz text), later than the
           job's run_at; giving both it and expire_after_ms is PGJOBQ_EINVAL.  (In place of a reserved
           field.) */
        const char *expires_at;
        uint64_t pgjobq_slot3_;
    };
    union {
        /* NULL: none.  The job's trace context (docs/queues.md, "Trace context"): a W3C traceparent of
           version 00, "00-<32 lowercase hex digits of trace id>-<16 of parent id>-<2 of flags>", ids
           not all zero; anything else is PGJOBQ_EINVAL (the database judges it), and a batch with
           one is written not at all.  Stored with the job and handed to its handler at every attempt
           (pgjobq_job_traceparent).  (In place of the last reserved field.) */
        const char *traceparent;
        uint64_t pgjobq_slot4_;
    };
} pgjobq_job_spec;

/* What became of a job enqueued with a unique key (pgjobq_enqueue_spec; pgjobq_enqueue_many's dup_out). */
#define PGJOBQ_ENQUEUED 0 /* inserted */
#define PGJOBQ_HELD     1 /* not inserted: another job holds the key (or took its window); its id is given */
#define PGJOBQ_REPLACED 2 /* not inserted: the queued job holding the key took this one's fields (a debounce) */

/*
 * Enqueues one job given as a spec, which holds what pgjobq_enqueue_opts has no room for
 * (unique_for_ms).  Returns what pgjobq_enqueue returns (PGJOBQ_EDUPLICATE when the key is held,
 * *id_out then the holder's), and PGJOBQ_OK for a job inserted or a queued job replaced, *id_out its
 * id; *outcome_out (may be NULL) receives PGJOBQ_ENQUEUED, PGJOBQ_HELD or PGJOBQ_REPLACED.
 */
PGJOBQ_EXPORT int pgjobq_enqueue_spec(pgjobq_client *c, const pgjobq_job_spec *job, int64_t *id_out,
                                      int *outcome_out) PGJOBQ_WUR;

/*
 * Enqueues n jobs in one statement (one round trip; a large batch with COPY), atomically: if any job
 * is invalid, none is inserted, PGJOBQ_EINVAL is returned, and pgjobq_errmsg() names the first bad
 * job: "job 17: ..." (its index) for what the library checks itself and for a run_at the database
 * cannot read, and as the SQL function names it for a rule the database judges ("run_ats[18] ...",
 * enqueue_many's 1-based arrays; "job 17: ..." for jobs with parents or tags, which go through
 * pgjobq.enqueue_graph).  ids_out (may be NULL) receives n ids in input order; dup_out (may be NULL)
 * receives n flags, nonzero where the job was not inserted because its unique key was held (ids_out
 * then has the holder's id): PGJOBQ_HELD, or PGJOBQ_REPLACED when the queued holder took the job's
 * fields (opts.on_conflict PGJOBQ_ON_CONFLICT_REPLACE).  Sends one notification per queue, not one
 * per job.  (pgjobq.enqueue_many in SQL, enqueue_many in Python: "many" jobs in one call; a "batch" in
 * SQL and Python is jobs with a callback, pgjobq.enqueue_batch.)
 */
PGJOBQ_EXPORT int pgjobq_enqueue_many(pgjobq_client *c, const pgjobq_job_spec *jobs, size_t n, int64_t *ids_out,
                                      unsigned char *dup_out) PGJOBQ_WUR;

/* Deprecated: pgjobq_enqueue_many's former name, kept for the programs that call it; the same function. */
PGJOBQ_EXPORT int pgjobq_enqueue_batch(pgjobq_client *c, const pgjobq_job_spec *jobs, size_t n, int64_t *ids_out,
                                       unsigned char *dup_out) PGJOBQ_WUR;

/*
 * Enqueues a graph of jobs in one transaction, all or none: graph_json is what the SQL function
 * pgjobq.enqueue_graph takes (docs/workflows.md): a JSON array of jobs, each with optional "ref",
 * "queue", "kind", "payload", "priority", "max_attempts", "concurrency_key", "run_at" or "delay"
 * (seconds), "tags", "after" (refs of jobs of the graph, or ids of jobs already enqueued),
 * "on_parent_failure" ("cancel" or "run") and "callback" (a batch callback).  A cycle, an unknown
 * ref or parent, or a bad field is PGJOBQ_EINVAL and writes nothing.  ids_out (may be NULL) receives
 * the jobs' ids in input order, at most max_ids of them; *n_out (may be NULL) the number of jobs.
 */
PGJOBQ_EXPORT int pgjobq_enqueue_graph(pgjobq_client *c, const char *graph_json, int64_t *ids_out, size_t max_ids,
                                       size_t *n_out) PGJOBQ_WUR;

/* ------------------------------------------------------------------------------------------------ */
/* Claim, complete, fail, heartbeat                                                                  */

/*
 * Claims up to max_jobs (1..PGJOBQ_BATCH_MAX) due jobs of one queue in (priority, run_at, id) order,
 * with FOR UPDATE SKIP LOCKED in a single statement: it never waits for rows other claimers hold, and
 * holds no lock once it returns.  Each job becomes running, with attempt + 1, a new lease_token, and a
 * lease ending at the database's now() + lease_ms.  worker_id (may be NULL) is recorded on the jobs.
 * A lease longer than the queue's max lease (pgjobq_queue_set_max_lease; a day by default) is
 * refused: PGJOBQ_EINVAL.
 *
 * On PGJOBQ_OK *jobs_out is an array of *n_out jobs (NULL and 0 when none was due), to be released
 * with pgjobq_jobs_free().  A serialization failure or deadlock is retried a few times when the
 * connection is not inside a caller's transaction.
 */
PGJOBQ_EXPORT int pgjobq_claim(pgjobq_client *c, const char *queue, int max_jobs, int64_t lease_ms,
                               const char *worker_id, pgjobq_job **jobs_out, size_t *n_out) PGJOBQ_WUR;

/*
 * Completes a job held under lease_token, storing result (JSON text, or NULL for none).  Accepted only
 * while the job is running under that token and its lease has not expired.  Returns PGJOBQ_OK;
 * PGJOBQ_ELEASE when the lease is lost (nothing is written); PGJOBQ_ECANCELLED when a cancel was
 * requested (the job ends cancelled, with the result stored); PGJOBQ_EINVAL for a bad result.
 */
PGJOBQ_EXPORT int pgjobq_job_complete(pgjobq_client *c, int64_t id, int64_t lease_token, const char *result) PGJOBQ_WUR;

/* Pass as retry_delay_ms to pgjobq_job_fail to use the backoff formula (pgjobq.backoff). */
#define PGJOBQ_BACKOFF (-1)

/* Flags for pgjobq_job_fail. */
#define PGJOBQ_FAIL_PERMANENT 1 /* no further attempts: the job ends failed now */

/*
 * Records a failed attempt of a job held under lease_token, with an error text (any bytes: NUL-free
 * by construction, invalid UTF-8 is replaced and the text cut to PGJOBQ_ERROR_MAX bytes, so recording
 * a failure never fails on its text).  While attempts remain the job is queued again to run after
 * retry_delay_ms, or after the backoff when PGJOBQ_BACKOFF; otherwise, or with PGJOBQ_FAIL_PERMANENT,
 * it ends failed.  *state_out (may be NULL) receives the new state (PGJOBQ_QUEUED or PGJOBQ_FAILED).
 * Returns PGJOBQ_OK, PGJOBQ_ELEASE, PGJOBQ_ECANCELLED, or an error as above.
 */
PGJOBQ_EXPORT int pgjobq_job_fail(pgjobq_client *c, int64_t id, int64_t lease_token, const char *error,
                                  int64_t retry_delay_ms, int flags, pgjobq_state *state_out) PGJOBQ_WUR;

/*
 * Heartbeat: extends the lease of a held job to the database's now() + lease_ms, or + the queue's max
 * lease when that is shorter (pgjobq_queue_set_max_lease).  Returns PGJOBQ_OK;
 * PGJOBQ_ELEASE when the lease is already lost; PGJOBQ_ECANCELLED when a cancel was requested (the
 * job has now ended cancelled: stop working on it).
 */
PGJOBQ_EXPORT int pgjobq_job_extend(pgjobq_client *c, int64_t id, int64_t lease_token, int64_t lease_ms) PGJOBQ_WUR;

/*
 * Records the progress of a running job (any JSON text of at most 8 KiB), fenced like a completion:
 * PGJOBQ_ELEASE, and nothing written, when lease_token is no longer the job's running lease.  The
 * last progress stays on the job, in history too (pgjobq_job.progress, `pgjobq show`).
 */
PGJOBQ_EXPORT int pgjobq_job_progress(pgjobq_client *c, int64_t id, int64_t lease_token, const char *json) PGJOBQ_WUR;

/*
 * Reads the jobs that job `id` waits (or waited) for, with their results: *parents_out holds *n_out
 * jobs in id order (NULL, 0 when it has none), to release with pgjobq_jobs_free().  A parent that
 * retention has removed is left out.
 */
PGJOBQ_EXPORT int pgjobq_job_parents(pgjobq_client *c, int64_t id, pgjobq_job **parents_out,
                                     size_t *n_out) PGJOBQ_WUR;

/* ------------------------------------------------------------------------------------------------ */
/* Administration                                                                                    */

/*
 * Cancels a job.  A queued job becomes cancelled at once (*state_out = PGJOBQ_CANCELLED); a running
 * job is marked and ends cancelled at its holder's next heartbeat or completion, or when its lease
 * expires (*state_out = PGJOBQ_RUNNING).  Returns PGJOBQ_OK, PGJOBQ_ENOTFOUND, or PGJOBQ_ESTATE when the
 * job had already finished (*state_out then says how).  state_out may be NULL.
 */
PGJOBQ_EXPORT int pgjobq_job_cancel(pgjobq_client *c, int64_t id, pgjobq_state *state_out) PGJOBQ_WUR;

/*
 * Runs a finished or scheduled job again now: it becomes queued with run_at = now(), keeping its
 * attempt count (max_attempts is raised if needed to allow one more attempt).  Returns PGJOBQ_OK,
 * PGJOBQ_ENOTFOUND, PGJOBQ_ESTATE for a running job, or PGJOBQ_EDUPLICATE when a queued or running
 * job of the queue holds the job's unique key.
 */
PGJOBQ_EXPORT int pgjobq_job_retry(pgjobq_client *c, int64_t id) PGJOBQ_WUR;

/*
 * Lets the key that job `id` blocks move on without it: the job failed for good in a strict-order
 * queue (pgjobq_queue_set_strict_order), stays failed, and the next job of its key may start.
 * Returns PGJOBQ_OK, PGJOBQ_ENOTFOUND, or PGJOBQ_ESTATE when the job blocks no key (it did not fail in
 * a strict-order queue, or was retried or skipped already).  Needs pgjobq_admin.
 */
PGJOBQ_EXPORT int pgjobq_job_skip(pgjobq_client *c, int64_t id) PGJOBQ_WUR;

/*
 * Ends a running job's lease now (for an operator: a worker that holds a job too long, or for ever):
 * the job is queued to run again now (*state_out = PGJOBQ_QUEUED), and every later write of the
 * holder (complete, fail, heartbeat, hand-back) finds its lease gone (PGJOBQ_ELEASE).  The attempt
 * it was running counts, as an expired lease's does; max_attempts is raised if needed to allow one
 * more.  A job whose cancel was requested ends cancelled instead (*state_out = PGJOBQ_CANCELLED).
 * Returns PGJOBQ_OK, PGJOBQ_ENOTFOUND, or PGJOBQ_ESTATE when the job is not running.  state_out may
 * be NULL.  Needs pgjobq_admin.
 */
PGJOBQ_EXPORT int pgjobq_job_retry_running(pgjobq_client *c, int64_t id, pgjobq_state *state_out) PGJOBQ_WUR;

/* Which jobs a bulk retry or cancel acts on; initialise with PGJOBQ_FILTER_INIT. */
typedef struct pgjobq_filter {
    const char *queue;  /* the queue (required) */
    pgjobq_state state; /* the state the jobs are in (required; each call says which it accepts) */
    const char *kind;   /* NULL: every kind */
    int64_t since_ms;   /* 0: any age; otherwise only jobs that finished (finished jobs) or were created
                           (live jobs) within the last since_ms milliseconds of the database clock */
    uint64_t pgjobq_reserved[4]; /* zero: room for fields added before 1.0 without changing the size */
} pgjobq_filter;
#ifdef __cplusplus
static inline pgjobq_filter pgjobq_filter_init_(void)
{
    pgjobq_filter o = {};
    o.state = PGJOBQ_FAILED;
    return o;
}
#define PGJOBQ_FILTER_INIT pgjobq_filter_init_()
#else
#define PGJOBQ_FILTER_INIT {.queue = NULL, .state = PGJOBQ_FAILED}
#endif

/* A flag for pgjobq_retry_where and pgjobq_cancel_where: count, change nothing. */
#define PGJOBQ_DRY_RUN 1
/* A flag for pgjobq_retry_where: the filter's queue is a dead-letter queue, and its dead letters go back
 * to the queues they came from (docs/queues.md, "Dead letters"). */
#define PGJOBQ_REDRIVE 2

/*
 * Runs again now every job the filter matches, in one statement (all of them or, on an error, none).
 * state PGJOBQ_FAILED, PGJOBQ_CANCELLED or PGJOBQ_COMPLETED: finished jobs become queued as with
 * pgjobq_job_retry; one whose unique key a queued or running job of the queue holds (or a newer match
 * with the same key) stays finished and is counted in *skipped_out.  state PGJOBQ_QUEUED: jobs waiting
 * for a later run_at (scheduled, or backing off) become due now.  *retried_out (may be NULL) receives
 * how many were retried, or with PGJOBQ_DRY_RUN in flags would be.  With PGJOBQ_REDRIVE the filter's
 * queue is a dead-letter queue: its dead letters go back to the queues they came from, as well (state
 * PGJOBQ_QUEUED: every one of them, due or not; a finished state: those in it, run again as above), and
 * a job of the queue that is no dead letter is counted in *skipped_out.  Returns PGJOBQ_OK;
 * PGJOBQ_EINVAL for a bad filter; PGJOBQ_EDUPLICATE when a job with one of the unique keys was
 * enqueued meanwhile (nothing moved: call again).
 */
PGJOBQ_EXPORT int pgjobq_retry_where(pgjobq_client *c, const pgjobq_filter *filter, int flags, int64_t *retried_out,
                                     int64_t *skipped_out) PGJOBQ_WUR;

/*
 * Cancels every job the filter matches, in one statement.  state PGJOBQ_QUEUED: the jobs end cancelled
 * at once; a job being claimed at that instant is waited for and left alone if it started.  state
 * PGJOBQ_RUNNING: a cancel is requested, as pgjobq_job_cancel does for a running job.  *count_out (may
 * be NULL) receives how many jobs were cancelled or marked (with PGJOBQ_DRY_RUN, would be).  Returns
 * PGJOBQ_OK or PGJOBQ_EINVAL for a bad filter.
 */
PGJOBQ_EXPORT int pgjobq_cancel_where(pgjobq_client *c, const pgjobq_filter *filter, int flags,
                                      int64_t *count_out) PGJOBQ_WUR;

/* Reads one job with all its fields.  On PGJOBQ_OK *job_out is a one-element array to release with
 * pgjobq_jobs_free().  Returns PGJOBQ_ENOTFOUND for an unknown id. */
PGJOBQ_EXPORT int pgjobq_job_get(pgjobq_client *c, int64_t id, pgjobq_job **job_out) PGJOBQ_WUR;

/* Waits until job id has finished (completed, failed or cancelled), at most timeout_ms (negative: no
 * limit; 0: look once), and reads it: on PGJOBQ_OK *job_out is the finished job (its state, result
 * and last_error), a one-element array to release with pgjobq_jobs_free().  Woken by a notification
 * sent in the transaction that finishes the job (LISTEN pgjobq_done; a job nobody waits for sends
 * none), with a read every 10 s as the fallback; a job finished long ago (in the history) is answered
 * at once.  Returns PGJOBQ_ENOTFOUND for an id no job has (never, or pruned by retention),
 * PGJOBQ_ETIMEOUT when the job has not finished by then (*job_out is the job as it is: release it too),
 * PGJOBQ_EINVAL when the connection is in a transaction (it would hold the notification back).  The
 * client is busy for the wait: use a client of its own to wait while doing other work.  Needs the
 * pgjobq_monitor or pgjobq_admin role (docs/durable.md, "Awaiting a result"). */
PGJOBQ_EXPORT int pgjobq_job_wait(pgjobq_client *c, int64_t id, int64_t timeout_ms, pgjobq_job **job_out) PGJOBQ_WUR;

/* Filter for pgjobq_job_list. */
typedef struct pgjobq_list_opts {
    const char *queue; /* NULL: all queues */
    int state;         /* a pgjobq_state, or -1 for all states */
    int limit;         /* 1..100000; 0: 100 */
    int64_t before_id; /* only jobs with id < before_id (paging); 0: no bound */
    union {
        const char *tag; /* NULL: any; else only jobs with this tag */
        uint64_t pgjobq_slot0_;
    };
    uint64_t pgjobq_reserved[3]; /* zero: room for fields added before 1.0 without changing the size */
} pgjobq_list_opts;

#ifdef __cplusplus
static inline pgjobq_list_opts pgjobq_list_opts_init_(void)
{
    pgjobq_list_opts o = {};
    o.state = -1;
    return o;
}
#define PGJOBQ_LIST_OPTS_INIT pgjobq_list_opts_init_()
#else
#define PGJOBQ_LIST_OPTS_INIT {.queue = NULL, .state = -1}
#endif

/* Lists jobs, newest (highest id) first.  On PGJOBQ_OK *jobs_out holds *n_out jobs (NULL, 0 if none),
 * to release with pgjobq_jobs_free(). */
PGJOBQ_EXPORT int pgjobq_job_list(pgjobq_client *c, const pgjobq_list_opts *opts, pgjobq_job **jobs_out,
                                  size_t *n_out) PGJOBQ_WUR;

/* One line of statistics: the number of jobs of one queue in one state. */
typedef struct pgjobq_stat {
    const char *queue;
    pgjobq_state state;
    int64_t jobs;
    uint64_t pgjobq_reserved[4]; /* zero: room for fields added before 1.0 without changing the size */
} pgjobq_stat;

/* Counts jobs per queue and state.  On PGJOBQ_OK *stats_out holds *n_out rows ordered by queue and
 * state (NULL, 0 for an empty table), to release with pgjobq_stats_free(). */
PGJOBQ_EXPORT int pgjobq_stats(pgjobq_client *c, pgjobq_stat **stats_out, size_t *n_out) PGJOBQ_WUR;

/* Releases what pgjobq_stats returned.  Accepts NULL. */
PGJOBQ_EXPORT void pgjobq_stats_free(pgjobq_stat *stats);

/* What decides whether pgjobq.jobs stays small (pgjobq.health(); docs/deploy.md, "Snapshots held
 * open").  The counts are the statistics' estimates.  The holder is the oldest thing that keeps vacuum
 * from removing the rows finished jobs leave: holder_kind "session" (a transaction or snapshot of this
 * database: a pg_dump, a report, a session idle in a transaction; holder_pid, holder_role,
 * holder_application, holder_state and holder_query say which), "standby" (hot_standby_feedback), "slot"
 * (a replication slot, named in holder_application) or "prepared" (a prepared transaction, its gid in
 * holder_application, its owner in holder_role); "" when nothing holds.  holder_query is "" unless the
 * caller's role may see that session's query in pg_stat_activity (a superuser, a member of
 * pg_read_all_stats or of the holder's role): another role's query text is its own.  Strings are
 * truncated to fit. */
typedef struct pgjobq_health {
    int64_t jobs_bytes;         /* pgjobq.jobs with its indexes and TOAST */
    int64_t jobs_live, jobs_dead;
    int64_t vacuums;            /* vacuums and autovacuums of pgjobq.jobs since the statistics' reset */
    int64_t last_vacuum;        /* microseconds since the epoch; PGJOBQ_TIME_NONE when never */
    int64_t horizon_age_ms;     /* how long the holder has held (database clock); -1 when nothing holds */
    int64_t horizon_xids;       /* transactions begun since the holder's snapshot; 0 when nothing holds */
    char holder_kind[16];
    int32_t holder_pid;         /* 0 when not a session or standby */
    char holder_application[64];
    char holder_state[32];
    int64_t holder_since;       /* microseconds since the epoch; PGJOBQ_TIME_NONE when unknown */
    char holder_query[256];
    int64_t autovacuum_paused_since; /* since when pgjobq has autovacuum of pgjobq.jobs off, because a
                                        pass could remove nothing while the holder holds (microseconds
                                        since the epoch; PGJOBQ_TIME_NONE when it is not) */
    char holder_role[24];            /* the holder's role (a session's, a standby's, a prepared
                                        transaction's owner); "" for a slot; truncated to 23 bytes */
} pgjobq_health;

/* Fills *out with pgjobq.jobs' size and what holds its vacuum back.  Needs pgjobq_worker or
 * pgjobq_monitor.  On an error *out is zeroed (horizon_age_ms -1). */
PGJOBQ_EXPORT int pgjobq_health_get(pgjobq_client *c, pgjobq_health *out) PGJOBQ_WUR;

/*
 * Queue settings.  They live in the database (pgjobq.queues) and hold for every worker on every host,
 * enforced inside the claim: a paused queue's claims return nothing; a concurrency limit caps the jobs
 * of the queue running under a valid lease; a rate limit caps the jobs started in any window of its
 * period.  A queue without settings behaves as if it had none.  Queue names follow
 * pgjobq_name_check().  See docs/queues.md.
 */

/* Pauses a queue: from the call's commit on, no worker claims from it; jobs already running go on
 * under their leases.  reason (may be NULL) is kept for `pgjobq queue ls`, at most 1,024 bytes.
 * Pausing a paused queue replaces its reason. */
PGJOBQ_EXPORT int pgjobq_queue_pause(pgjobq_client *c, const char *queue, const char *reason) PGJOBQ_WUR;

/* Resumes a paused queue and wakes the workers that serve it.  Resuming a queue that is not paused
 * does nothing and succeeds. */
PGJOBQ_EXPORT int pgjobq_queue_resume(pgjobq_client *c, const char *queue) PGJOBQ_WUR;

/* At most `limit` jobs of the queue running at once (1..1000000), across all workers; 0 removes the
 * limit.  A job whose lease expired no longer counts. */
PGJOBQ_EXPORT int pgjobq_queue_set_concurrency(pgjobq_client *c, const char *queue, int limit) PGJOBQ_WUR;

/* At most `limit` jobs with the same concurrency key (pgjobq_enqueue_opts.concurrency_key) running at
 * once (1..1000000); 0 removes the limit.  Jobs of other keys, and jobs without a key, do not wait
 * behind a busy key: a claim takes the keys in turn. */
PGJOBQ_EXPORT int pgjobq_queue_set_key_concurrency(pgjobq_client *c, const char *queue, int limit) PGJOBQ_WUR;

/* At most `limit` jobs of the queue started in any window of period_ms (limit 1..10000, period 1 ms
 * to one day), on the database clock; limit 0 removes the limit (period_ms is then ignored). */
PGJOBQ_EXPORT int pgjobq_queue_set_rate(pgjobq_client *c, const char *queue, int limit, int64_t period_ms) PGJOBQ_WUR;

/* The longest lease a claim may ask for in the queue, and a heartbeat renew (1 second to 365 days,
 * in milliseconds); 0 restores the default, PGJOBQ_MAX_LEASE_DEFAULT_MS.  A claim with a longer
 * lease is refused (PGJOBQ_EINVAL), so that no worker holds a job for ever; a heartbeat asking for
 * more gets this much.  Workers' leases must fit: their default is a minute. */
PGJOBQ_EXPORT int pgjobq_queue_set_max_lease(pgjobq_client *c, const char *queue, int64_t max_lease_ms) PGJOBQ_WUR;

/* Sets the queue's dead-letter queue (NULL removes it): from then on a job of `queue` that fails for
 * good (its attempts spent, or failed permanently; not cancelled) leaves a copy in `dead_letter`, a new
 * queued job with its kind, payload, priority, attempts and tags, made in the failing transaction and
 * linked to it; pgjobq_retry_where() with PGJOBQ_REDRIVE sends them back (docs/queues.md, "Dead
 * letters").  A setting that would make a cycle (the queue itself, or a queue whose dead letters lead
 * back to this one) is PGJOBQ_EINVAL, with the reason in pgjobq_errmsg(). */
PGJOBQ_EXPORT int pgjobq_queue_set_dead_letter(pgjobq_client *c, const char *queue, const char *dead_letter) PGJOBQ_WUR;

/* Sets the expiry the jobs enqueued into the queue from then on get when they have none of their own
 * (pgjobq_job_spec.expire_after_ms, .expires_at): no attempt of such a job starts later than
 * expire_after_ms after its run_at (1 second to 365 days, in milliseconds); 0 removes the default.
 * Jobs already enqueued keep theirs (docs/queues.md, "Expiry"). */
PGJOBQ_EXPORT int pgjobq_queue_set_expire_after(pgjobq_client *c, const char *queue,
                                                int64_t expire_after_ms) PGJOBQ_WUR;

/*
 * Strict order per key (docs/queues.md, "Strict order per key"; on: 1, off: 0): the queue's jobs with
 * the same concurrency key (pgjobq_job_spec.concurrency_key) run one at a time, in the order of their
 * ids, the order they were enqueued in; a key's next job starts only when the one before it has
 * completed or was cancelled.  One that fails for good blocks its key until it is retried
 * (pgjobq_job_retry) or skipped (pgjobq_job_skip).  Keys run in parallel with one another; give
 * every job of such a queue a key (one without is looked for among the queue's oldest due jobs only).
 * Needs pgjobq_admin.
 */
PGJOBQ_EXPORT int pgjobq_queue_set_strict_order(pgjobq_client *c, const char *queue, int on) PGJOBQ_WUR;

/* Sets the queue's priority aging (docs/queues.md, "Priority aging"; Oban Pro's Reprioritizer): a
 * queued job that has been ready for priority_aging_ms at its priority is raised one step (its
 * priority number lowered by 1, never below -100), and again after each further priority_aging_ms,
 * so that jobs of low priority are not starved by a steady stream of higher ones.  The job's first
 * priority is kept (pgjobq_job_get's priority is the raised one; `pgjobq show` tells both).  Done
 * by the workers' maintenance pass each second (pgjobq_rescue_expired does it too); the claim is
 * the same, on or off.  priority_aging_ms: 1 second to 365 days, in milliseconds; 0 turns it off
 * (the jobs raised so far keep their priority).  Returns PGJOBQ_OK, or PGJOBQ_EINVAL for a value
 * out of range (nothing changed), or the error of the statement. */
PGJOBQ_EXPORT int pgjobq_queue_set_priority_aging(pgjobq_client *c, const char *queue,
                                                  int64_t priority_aging_ms) PGJOBQ_WUR;

/* A queue with jobs or settings, as pgjobq_queue_list() reports it. */
typedef struct pgjobq_queue_info {
    const char *name;
    int64_t paused_at;         /* microseconds since the epoch; PGJOBQ_TIME_NONE when not paused */
    const char *pause_reason;  /* NULL when none */
    int concurrency;           /* 0: no limit */
    int key_concurrency;       /* per concurrency key; 0: no limit */
    int rate_limit;            /* 0: no limit */
    int64_t rate_period_ms;    /* the rate limit's window, when there is one */
    int64_t queued;            /* queued and due */
    int64_t scheduled;         /* queued for later */
    int64_t running;           /* running under a valid lease */
    int64_t expired;           /* running, lease expired, not yet rescued */
    int64_t max_lease_ms;      /* the longest lease a claim may take: the queue's, or the default */
    const char *dead_letter;   /* where its jobs that fail for good go; NULL: nowhere */
    int64_t expire_after_ms;     /* the expiry its jobs get by default, from their run_at; 0: none
                                    (pgjobq_queue_set_expire_after; in place of a reserved field) */
    int32_t strict_order;        /* 1: its jobs of a key run one at a time, in order
                                    (pgjobq_queue_set_strict_order); 0: off */
    int32_t priority_aging_s;    /* how long a job waits at a priority before it is raised one step, in
                                    whole seconds; 0: off (pgjobq_queue_set_priority_aging).  These two
                                    take the last reserved field: pgjobq_queue_info has no room left */
} pgjobq_queue_info;

/* Lists every queue that has live jobs or settings, ordered by name.  On PGJOBQ_OK *queues_out holds
 * *n_out entries (NULL, 0 when there are none), to release with pgjobq_queue_list_free(). */
PGJOBQ_EXPORT int pgjobq_queue_list(pgjobq_client *c, pgjobq_queue_info **queues_out, size_t *n_out) PGJOBQ_WUR;

/* Releases what pgjobq_queue_list() returned (NULL is fine). */
PGJOBQ_EXPORT void pgjobq_queue_list_free(pgjobq_queue_info *queues);

/* What an autoscaler reads of a queue (pgjobq.queue_ready(); docs/deploy.md, "Autoscaling"). */
typedef struct pgjobq_queue_ready_info {
    const char *name;
    int64_t ready;               /* queued jobs a claim could take now (due, their parents done); a paused
                                    queue's too */
    int64_t oldest_ready_ms;     /* how long the oldest of them has been claimable; -1 when none is */
    int64_t running;             /* running under a lease that has not ended (what a concurrency limit counts) */
    int concurrency;             /* the queue's limit; 0: none */
    int paused;                  /* 1 when the queue is paused */
    int64_t worker_slots;        /* the slots of the live workers that serve the queue */
    uint64_t pgjobq_reserved[3]; /* zero: room for fields added before 1.0 without changing the size */
} pgjobq_queue_ready_info;

/* Lists, for every queue with jobs in the last hour or settings, ordered by name, what an autoscaler
 * needs: jobs ready now, the age of the oldest, running against the limit and the workers' slots.  Each
 * count reads only the index entries it counts (not the scheduled jobs, not the history), so it may be
 * asked every few seconds.  On PGJOBQ_OK *queues_out holds *n_out entries (NULL, 0 when there are
 * none), to release with pgjobq_queue_ready_free(). */
PGJOBQ_EXPORT int pgjobq_queue_ready(pgjobq_client *c, pgjobq_queue_ready_info **queues_out, size_t *n_out) PGJOBQ_WUR;

/* Releases what pgjobq_queue_ready() returned (NULL is fine). */
PGJOBQ_EXPORT void pgjobq_queue_ready_free(pgjobq_queue_ready_info *queues);

/*
 * Schedules: jobs enqueued by a cron calendar, in the database.  Every worker with maintenance on
 * ticks about once a second; each fire time enqueues its job exactly once however many workers run.
 * See docs/queues.md ("Schedules").
 */

/* What a schedule enqueues, and how it catches up; initialise with PGJOBQ_SCHEDULE_OPTS_INIT. */
typedef struct pgjobq_schedule_opts {
    const char *tz;       /* an IANA time zone name; NULL: "UTC" */
    const char *queue;    /* NULL: "default" */
    const char *kind;     /* NULL: "default" */
    const char *payload;  /* a JSON document; NULL: {} */
    int priority;         /* -100..100 */
    int max_attempts;     /* 1..1000; 0: 25 */
    const char *catch_up; /* fire times missed while no worker ticked: "latest" (NULL: one job for the
                             most recent), "all" (one each, at most 100) or "skip" (none over a minute late) */
    uint64_t pgjobq_reserved[4]; /* zero: room for fields added before 1.0 without changing the size */
} pgjobq_schedule_opts;
#ifdef __cplusplus
static inline pgjobq_schedule_opts pgjobq_schedule_opts_init_(void)
{
    pgjobq_schedule_opts o = {};
    return o;
}
#define PGJOBQ_SCHEDULE_OPTS_INIT pgjobq_schedule_opts_init_()
#else
#define PGJOBQ_SCHEDULE_OPTS_INIT {.tz = NULL}
#endif

/* Creates or replaces the schedule `name` (a queue-style name) firing on `cron`, a 5-field (minute
 * hour day-of-month month day-of-week) or 6-field (seconds first) cron expression, enabled.
 * *next_run_out (may be NULL) receives its next fire time (microseconds since the epoch).  A bad
 * expression, time zone or payload is PGJOBQ_EINVAL, with the reason in pgjobq_errmsg(). */
PGJOBQ_EXPORT int pgjobq_schedule_set(pgjobq_client *c, const char *name, const char *cron,
                                      const pgjobq_schedule_opts *opts, int64_t *next_run_out) PGJOBQ_WUR;

/* Disables (enabled = 0) or enables a schedule; enabling starts from the next fire time after now.
 * PGJOBQ_ENOTFOUND when there is no such schedule. */
PGJOBQ_EXPORT int pgjobq_schedule_enable(pgjobq_client *c, const char *name, int enabled) PGJOBQ_WUR;

/* Deletes a schedule (the jobs it enqueued stay).  PGJOBQ_ENOTFOUND when there is no such schedule. */
PGJOBQ_EXPORT int pgjobq_schedule_delete(pgjobq_client *c, const char *name) PGJOBQ_WUR;

/* Enqueues the schedule's job now, outside its calendar (its next run is unchanged); *id_out (may be
 * NULL) receives the job's id.  PGJOBQ_ENOTFOUND when there is no such schedule. */
PGJOBQ_EXPORT int pgjobq_schedule_trigger(pgjobq_client *c, const char *name, int64_t *id_out) PGJOBQ_WUR;

/* Makes the set of schedules exactly `json`, a JSON array of objects with "name" and "schedule" (the
 * cron expression) and optionally "tz", "queue", "kind", "payload", "priority", "max_attempts" and
 * "catch_up": schedules missing from it are deleted, changed ones replaced, unchanged ones left alone
 * (their next run too).  All or nothing.  *changed_out (may be NULL) receives how many schedules were
 * created, changed or deleted. */
PGJOBQ_EXPORT int pgjobq_schedule_sync(pgjobq_client *c, const char *json, int *changed_out) PGJOBQ_WUR;

/* A schedule, as pgjobq_schedule_list() reports it. */
typedef struct pgjobq_schedule_info {
    const char *name, *cron, *tz, *queue, *kind, *payload, *catch_up;
    int priority;
    int max_attempts;
    int enabled;
    int64_t next_run; /* microseconds since the epoch; PGJOBQ_TIME_NONE when it never fires again */
    int64_t last_run; /* the last fire time that enqueued a job; PGJOBQ_TIME_NONE before the first */
    uint64_t pgjobq_reserved[4]; /* zero: room for fields added before 1.0 without changing the size */
} pgjobq_schedule_info;

/* Lists the schedules by name.  On PGJOBQ_OK *schedules_out holds *n_out entries (NULL, 0 when there
 * are none), to release with pgjobq_schedule_list_free(). */
PGJOBQ_EXPORT int pgjobq_schedule_list(pgjobq_client *c, pgjobq_schedule_info **schedules_out,
                                       size_t *n_out) PGJOBQ_WUR;

/* Releases what pgjobq_schedule_list() returned (NULL is fine). */
PGJOBQ_EXPORT void pgjobq_schedule_list_free(pgjobq_schedule_info *schedules);

/*
 * Maintenance: moves jobs whose lease expired back to queued (or to failed when no attempts remain, or
 * to cancelled when that was requested), at most max_jobs (1..PGJOBQ_BATCH_MAX) per call; a job
 * completed meanwhile is never touched.  Each call also ends the jobs that expired while queued and
 * raises the priority of those that waited long in a queue with priority aging
 * (pgjobq_queue_set_priority_aging).  *rescued_out (may be NULL) receives the count of rescued jobs.
 */
PGJOBQ_EXPORT int pgjobq_rescue_expired(pgjobq_client *c, int max_jobs, int *rescued_out) PGJOBQ_WUR;

/*
 * Retention of finished jobs (pgjobq.history), by the database clock.  Completed and cancelled jobs
 * are removed an hour at a time: the partition holding the jobs that finished in one hour (UTC) is
 * dropped once the whole hour is older than completed_age_ms, so a job is kept at least that long
 * and at most an hour longer, and nothing is deleted row by row.  Failed jobs older than
 * failed_age_ms (and completed ones that landed in the default partition) are deleted, at most
 * max_jobs per call.  Also creates the partitions of the next 48 hours.  *deleted_out (may be NULL)
 * receives how many jobs were removed (a dropped partition counts its estimated rows); call again
 * while it is at least max_jobs.  Ages shorter than the retention the database keeps (pgjobq.retention,
 * set with pgjobq.retention_set) need a login role that is a member of pgjobq_admin or of the schema's
 * owner: PGJOBQ_EPERM, and nothing removed, otherwise.
 */
PGJOBQ_EXPORT int pgjobq_prune(pgjobq_client *c, int64_t completed_age_ms, int64_t failed_age_ms, int max_jobs,
                               int *deleted_out) PGJOBQ_WUR;

/* ------------------------------------------------------------------------------------------------ */
/* Worker                                                                                            */
/*
 * A worker runs jobs from one or more queues on a pool of threads, with at most three database
 * connections whatever its concurrency, all driven without blocking by the thread that called
 * pgjobq_worker_run: one claims and LISTENs for wakeups, one writes outcomes and renews leases, one
 * does maintenance (rescuing expired leases, retention).  Claims are sized to free slots (and, for
 * fast handlers, a batch ahead); completions are batched and fenced per job; one statement renews
 * every running lease of the process.  See docs/worker.md.
 */

typedef struct pgjobq_worker pgjobq_worker;

/* What a handler tells the worker about its job. */
typedef enum pgjobq_outcome {
    PGJOBQ_OUTCOME_COMPLETE = 0, /* done; the result set with pgjobq_ctx_set_result is stored */
    PGJOBQ_OUTCOME_RETRY = 1,    /* this attempt failed: retry after the delay (or the backoff) while
                                    attempts remain, else the job fails */
    PGJOBQ_OUTCOME_FAIL = 2,     /* failed for good: no further attempts */
    PGJOBQ_OUTCOME_CANCEL = 3,   /* stop: the job ends cancelled */
    PGJOBQ_OUTCOME_DONE = 4,     /* the handler already ended the job itself, typically with
                                    pgjobq_job_complete on its own connection, in the same transaction
                                    as its effect (exactly-once effects); the worker writes nothing */
    PGJOBQ_OUTCOME_PENDING = 5,  /* the job goes on after the handler returns: whoever the handler gave
                                    it to ends it with pgjobq_ctx_finish, from any thread, and the
                                    handler's thread is free for the next job meanwhile */
    PGJOBQ_OUTCOME_SNOOZE = 6,   /* hand the job back untouched: it is queued again, due after the
                                    delay set with pgjobq_ctx_set_retry_delay (none set: the backoff of
                                    its attempt, a few seconds), and this attempt does not count; the text set with
                                    pgjobq_ctx_set_error is kept as its last_error (why).  For a job
                                    this worker cannot run now rather than one that failed: a kind it
                                    does not know yet (a rolling deploy), a handler that could not
                                    start.  A job whose cancellation was requested ends cancelled */
    PGJOBQ_OUTCOME_PARKED = 7,   /* the handler parked the job (pgjobq_ctx_sleep or pgjobq_ctx_wait_event
                                    returned PGJOBQ_PARKED, or pgjobq_job_sleep on a connection of its
                                    own): it is queued again already, and the worker writes nothing.
                                    A job parked through its context is never written, whatever its
                                    handler returns; return PARKED only for a job parked (one that was
                                    not keeps its lease until it expires, and runs again after that) */
    PGJOBQ_OUTCOME_HAND_BACK = 8 /* as SNOOZE (the delay, the reason, no attempt used), for a job the
                                    worker did not run at all, not by the handler's choice: a kind it
                                    does not know yet (kept through a rolling deploy until a newer
                                    worker knows it), a handler process that could not start.  It
                                    counts no snooze: pgjobq.snooze_cap() never turns it into a failed
                                    attempt.  Give it a delay (or leave the backoff's), so that the job
                                    does not come straight back */
} pgjobq_outcome;

/* Why a handler should stop (pgjobq_ctx_stop_reason). */
typedef enum pgjobq_stop_reason {
    PGJOBQ_STOP_NONE = 0,
    PGJOBQ_STOP_TIMEOUT = 1,   /* the job ran past the worker's job timeout */
    PGJOBQ_STOP_CANCELLED = 2, /* someone cancelled the job */
    PGJOBQ_STOP_LEASE_LOST = 3,/* the lease could not be renewed; another worker may take the job */
    PGJOBQ_STOP_SHUTDOWN = 4   /* the worker is shutting down; the job will be handed back */
} pgjobq_stop_reason;

/* The handler's view of one job.  Valid during the handler call, on the handler's thread; when the
 * handler returns PGJOBQ_OUTCOME_PENDING, until pgjobq_ctx_finish, on whichever one thread holds it. */
typedef struct pgjobq_ctx pgjobq_ctx;

/* The job (id, queue, kind, payload, attempt, max_attempts, ...). */
PGJOBQ_EXPORT const pgjobq_job *pgjobq_ctx_job(const pgjobq_ctx *ctx);

/* Sets the result stored on completion (JSON text, copied).  Returns PGJOBQ_EINVAL for invalid JSON
 * (the previous result, if any, is kept). */
PGJOBQ_EXPORT int pgjobq_ctx_set_result(pgjobq_ctx *ctx, const char *json) PGJOBQ_WUR;

/* Sets the error text stored with RETRY or FAIL, or the reason stored with SNOOZE or HAND_BACK (any bytes;
 * sanitised and cut to PGJOBQ_ERROR_MAX). */
PGJOBQ_EXPORT void pgjobq_ctx_set_error(pgjobq_ctx *ctx, const char *text);

/* Sets the delay before the retry that RETRY asks for (milliseconds; the default is the backoff), or
 * before a SNOOZE'd or HAND_BACK'd job runs again (the default: the backoff; at most 100 years, more is taken
 * as 100). */
PGJOBQ_EXPORT void pgjobq_ctx_set_retry_delay(pgjobq_ctx *ctx, int64_t delay_ms);

/* Reports the job's progress (JSON text of at most PGJOBQ_PROGRESS_MAX bytes, copied): the worker
 * writes the latest value set to the job (pgjobq_job.progress, `pgjobq show`, the dashboard), fenced
 * by the lease like a completion, on its write connection with no statement of the handler's: within
 * about a second, and before the job's outcome when it is set before the handler ends the job.  Only
 * the latest of several values set in between is written; a value the database finds over 8 KiB as
 * jsonb text is logged and skipped.  Callable from any thread while the job is the handler's (until
 * it returns, or until pgjobq_ctx_finish).  Returns PGJOBQ_EINVAL for invalid or too long JSON (the
 * value set before stays), PGJOBQ_ENOMEM. */
PGJOBQ_EXPORT int pgjobq_ctx_set_progress(pgjobq_ctx *ctx, const char *json) PGJOBQ_WUR;

/* Nonzero once the handler should stop as soon as it can; pgjobq_ctx_stop_reason says why.  Handlers
 * that run long must poll it: the worker cannot interrupt a thread. */
PGJOBQ_EXPORT int pgjobq_ctx_should_stop(const pgjobq_ctx *ctx);
PGJOBQ_EXPORT pgjobq_stop_reason pgjobq_ctx_stop_reason(const pgjobq_ctx *ctx);

/* Milliseconds left before the job timeout (0 when it has passed). */
PGJOBQ_EXPORT int64_t pgjobq_ctx_time_left_ms(const pgjobq_ctx *ctx);

/* Ends a job whose handler returned PGJOBQ_OUTCOME_PENDING, with outcome (COMPLETE, RETRY, FAIL,
 * CANCEL or DONE; the result, error and retry delay set on ctx before go with it).  Call it exactly
 * once per such job, from any thread, also when the job must stop (pgjobq_ctx_should_stop: a timeout,
 * a cancel, a lost lease, a shutdown), which the holder of a pending job must watch for: the worker
 * waits for every pending job before pgjobq_worker_run returns.  ctx is invalid afterwards: a second
 * call is a use after free.  The thread the handler gave ctx to may call it before the handler has
 * returned PENDING; a handler that returns any other outcome must not call it (that call is ignored,
 * and so is PENDING as the outcome). */
PGJOBQ_EXPORT void pgjobq_ctx_finish(pgjobq_ctx *ctx, pgjobq_outcome outcome);

/* Ends n pending jobs at once, as pgjobq_ctx_finish(ctx[i], outcome[i]) for each (the same rules for
 * each one; a NULL entry is skipped), with one wakeup of the worker and one lock per queue rather
 * than one per job: for a thread that ends jobs in bursts (replies read together from another
 * process). */
PGJOBQ_EXPORT void pgjobq_ctx_finish_many(pgjobq_ctx *const *ctx, const pgjobq_outcome *outcome, size_t n);

/* As pgjobq_ctx_finish_many, then runs on the calling thread, one after another, up to max_run of the
 * jobs that were waiting for the slots it freed (their handlers are called here, exactly as on a
 * handler thread), instead of waking a handler thread for them; a thread is woken for what it
 * leaves.  Returns how many jobs it started.  For handlers that hand their job on and return
 * PGJOBQ_OUTCOME_PENDING at once (to another process, an event loop): the thread that ends a burst
 * starts the next, with no thread switch.  The caller must hold nothing those handlers wait for (a
 * lock they take, the thread that would answer them), and should not pass a handler that runs long. */
PGJOBQ_EXPORT size_t pgjobq_ctx_finish_many_and_run(pgjobq_ctx *const *ctx, const pgjobq_outcome *outcome,
                                                    size_t n, size_t max_run);

/* A handler: runs one job and says how it went.  Called on one of the worker's threads; many run at
 * once, so a handler must be thread-safe.  arg is what was given to pgjobq_worker_handle. */
typedef pgjobq_outcome (*pgjobq_handler_fn)(pgjobq_ctx *ctx, void *arg);

/* Worker options.  Zero-initialise (PGJOBQ_WORKER_OPTS_INIT) and set what you need. */
typedef struct pgjobq_worker_opts {
    const char *worker_id;       /* recorded on claimed jobs and in pgjobq.workers, where two live
                                    workers cannot share one; NULL: "hostname:pid" (the second and
                                    later workers of a process: "hostname:pid.N") */
    int64_t lease_ms;            /* lease per claim and per heartbeat; 0: 60000 */
    int64_t heartbeat_ms;        /* interval of lease renewal; 0: lease / 3; must be < lease */
    int64_t timeout_ms;          /* job timeout, from the moment a handler starts the job; 0: 80% of
                                    the lease; must be < lease, so that a job stopped at its timeout
                                    ends before its lease could expire */
    int64_t poll_ms;             /* claim at least this often even without a notification; 0: 1000 */
    int64_t shutdown_timeout_ms; /* how long a stop waits for running jobs; 0: 30000; < 0: none */
    int batch_max;               /* most jobs per claim; 0: 1000.  A claim asks for the free slots, and
                                    for fast handlers (under 20 ms a job) up to batch_max more, claimed
                                    ahead so that the next batch is there when a slot frees; those wait
                                    about 20 ms at most, and hold at most 8 MiB of payload */
    int poll_only;               /* nonzero: no LISTEN, no prepared statements (PgBouncer in
                                    transaction mode) */
    int no_maintenance;          /* nonzero: this process neither rescues leases nor prunes (and
                                    opens two connections, not three) */
    int64_t retain_completed_ms; /* prune completed and cancelled jobs older than this, an hour (a
                                    partition) at a time; 0: the database's retention (pgjobq.retention,
                                    24 h unless an admin changed it); < 0: never.  Shorter than the
                                    database's needs the pgjobq_admin role (else a warning a minute) */
    int64_t retain_failed_ms;    /* prune failed jobs older than this; 0: the database's (7 days
                                    unless changed); < 0: never */
    pgjobq_log_fn log_fn;        /* log callback (called from the worker's threads); NULL: none */
    void *log_arg;
    int32_t log_level;           /* the least pgjobq_log_level given to log_fn; 0 (PGJOBQ_LOG_DEBUG):
                                    every record; PGJOBQ_LOG_DEBUG to PGJOBQ_LOG_ERROR, else
                                    pgjobq_worker_new refuses it.  A record below it is not even
                                    formatted (the debug records come two a job) */
    int32_t burst;               /* nonzero: stop by itself once nothing it serves is due (a claim sent
                                    while it held no job found none), as after pgjobq_worker_stop;
                                    for tests and runs from cron.  0: run until stopped */
    uint64_t pgjobq_reserved[3]; /* zero: room for fields added before 1.0 without changing the size */
} pgjobq_worker_opts;

#ifdef __cplusplus
static inline pgjobq_worker_opts pgjobq_worker_opts_init_(void)
{
    pgjobq_worker_opts o = {};
    return o;
}
#define PGJOBQ_WORKER_OPTS_INIT pgjobq_worker_opts_init_()
#else
#define PGJOBQ_WORKER_OPTS_INIT {.worker_id = NULL}
#endif

/* The concurrency a queue is served with when none is given: by `pgjobq work --queue Q` and the
 * Python package's worker (which reads it from `pgjobq work --print-defaults`). */
#define PGJOBQ_DEFAULT_CONCURRENCY 10

/*
 * Fills every zero field of *o that has a default with the value pgjobq_worker_new gives it: lease
 * 60 s; heartbeat a third of the lease and job timeout 80% of it (of the lease given, or of the
 * default); poll 1 s; shutdown timeout 30 s; batch_max 1000.  The one statement of these defaults,
 * for programs that show them or build on them (the pgjobq command, and through it the Python
 * package).  Checks nothing (pgjobq_worker_new does).  Thread-safe.
 */
PGJOBQ_EXPORT void pgjobq_worker_opts_defaults(pgjobq_worker_opts *o);

/*
 * Creates a worker for the database at conninfo.  Checks the options (a job timeout not shorter than
 * the lease is refused, and pgjobq_worker_errmsg says why) and that libpq can parse conninfo (a
 * connection string it cannot parse is PGJOBQ_EINVAL, not retried forever), but does not connect yet.  On PGJOBQ_OK *out is a new worker; on PGJOBQ_EINVAL *out is still set so that
 * pgjobq_worker_errmsg() can say why, and must be freed.  PGJOBQ_ENOMEM leaves *out NULL.
 */
PGJOBQ_EXPORT int pgjobq_worker_new(pgjobq_worker **out, const char *conninfo,
                                    const pgjobq_worker_opts *opts) PGJOBQ_WUR;

/*
 * Serves queue with `concurrency` threads (1..1024), running fn(ctx, arg) for each job, or only for
 * jobs of the given kind when kind is not NULL (then add one handler per kind; a job of a kind with
 * no handler fails for good with an error saying so).  Call before pgjobq_worker_run.  Returns
 * PGJOBQ_OK or PGJOBQ_EINVAL (bad name, bad concurrency, a queue given two different concurrencies,
 * or a duplicate handler).
 */
PGJOBQ_EXPORT int pgjobq_worker_handle(pgjobq_worker *w, const char *queue, const char *kind, int concurrency,
                                       pgjobq_handler_fn fn, void *arg) PGJOBQ_WUR;

/*
 * Runs the worker on the calling thread until pgjobq_worker_stop (or, with opts.burst, until nothing
 * it serves is due: then it returns PGJOBQ_OK): connects (retrying with backoff
 * and jitter, forever), claims, dispatches, completes, heartbeats, rescues and prunes.  On stop it
 * claims nothing more, waits up to the shutdown timeout for running jobs, then asks the remaining
 * handlers to stop and hands their jobs back to the queue at once without using up an attempt.
 * Returns PGJOBQ_OK after a clean drain, PGJOBQ_ETIMEOUT when jobs had to be handed back,
 * PGJOBQ_ESTOPPED (having done nothing) when pgjobq_worker_stop was called before it, or
 * PGJOBQ_ESCHEMA / PGJOBQ_EINVAL / PGJOBQ_ENOMEM when it cannot run at all.  PGJOBQ_ECONFLICT when
 * its worker id is another live worker's (pgjobq_worker_errmsg: "worker id X is in use by a live
 * worker ..."): it claims nothing until its first beat has the id, waits up to 20 s for the row of a
 * worker that stopped without a word to go stale, and stops if the id is taken over later (after
 * this worker went unseen for 15 s).  Call it once.
 */
PGJOBQ_EXPORT int pgjobq_worker_run(pgjobq_worker *w) PGJOBQ_WUR;

/*
 * Asks a running worker to stop.  Safe from a signal handler and from any thread (it only sets a
 * flag and writes to a pipe).  A second call stops fast: running handlers are asked to stop now and
 * their jobs handed back, without waiting for the shutdown timeout.
 */
PGJOBQ_EXPORT void pgjobq_worker_stop(pgjobq_worker *w);

/*
 * Says that the worker cannot run jobs now, and why (reason: text, copied; sanitised and cut to 4000
 * bytes), or that it can again (reason NULL).  While a reason is set the worker claims no new job; the
 * jobs it holds go on (their leases renewed, their outcomes written), and its row of pgjobq.workers
 * carries the reason and since when (column unhealthy, written at once), where `pgjobq health`, the
 * dashboard and pgjobq.monitor_unhealthy_workers() show it.  For a handler that finds it cannot work:
 * a process it runs jobs in that cannot start (`pgjobq work --coproc` does this), a resource it needs
 * that is gone.  Safe from any thread while the worker runs (not from a signal handler), and before
 * pgjobq_worker_run.  Returns PGJOBQ_OK, or PGJOBQ_ENOMEM (nothing changed).
 */
PGJOBQ_EXPORT int pgjobq_worker_set_unhealthy(pgjobq_worker *w, const char *reason) PGJOBQ_WUR;

/* Counters since the worker started; safe to read from any thread while it runs. */
typedef struct pgjobq_worker_stats {
    int64_t claimed;     /* jobs claimed */
    int64_t completed;   /* completions accepted */
    int64_t retried;     /* failed attempts queued again */
    int64_t failed;      /* jobs that ended failed */
    int64_t cancelled;   /* jobs that ended cancelled */
    int64_t lost;        /* jobs whose lease was lost (results not written) */
    int64_t released;    /* jobs handed back at shutdown, or snoozed by their handler */
    int64_t running;     /* jobs running now */
    int64_t claims;      /* claim statements */
    int64_t rescued;     /* expired leases rescued by this process's maintenance */
    int64_t writes;      /* statements that wrote outcomes (completions, failures, hand-backs) */
    int64_t parked;      /* jobs their handlers parked: a durable sleep, a wait for an event (in place of
                            a reserved field) */
    uint64_t pgjobq_reserved[3]; /* zero: room for fields added before 1.0 without changing the size */
} pgjobq_worker_stats;

PGJOBQ_EXPORT void pgjobq_worker_get_stats(const pgjobq_worker *w, pgjobq_worker_stats *out);

/* How many of the worker's database connections (claim, write, maintenance) are connected and set up
 * now; safe to call from any thread while the worker runs.  0 for NULL. */
PGJOBQ_EXPORT int pgjobq_worker_connections(const pgjobq_worker *w);

/* The reason for the worker's last error; never NULL.  Not thread-safe against a running worker. */
PGJOBQ_EXPORT const char *pgjobq_worker_errmsg(const pgjobq_worker *w);

/* Frees a worker that is not running (run returned, or was never called).  Accepts NULL. */
PGJOBQ_EXPORT void pgjobq_worker_free(pgjobq_worker *w);

/* ------------------------------------------------------------------------------------------------ */
/* Durable execution: steps, sleeps and events (docs/durable.md)                                     */
/*
 * A handler whose work has parts that must not run again when the job does (a charge, an email, a
 * row written) runs each as a step: its result is stored on the job, fenced by the lease like a
 * completion, and a later attempt of the job (after a retry, a crash and the rescue, a sleep) gets
 * the stored result without running the step.  A step whose effects are in the job's database can
 * make them in the transaction that stores its result (pgjobq_ctx_step_tx): they commit once, or not
 * at all when the lease was lost.  A durable sleep or a wait for an event parks the job: its attempt
 * ends, its slot and lease are freed, and it runs again at the sleep's end, the event or the wait's
 * timeout, its steps replayed from storage.  The handler must come to the same steps, sleeps and
 * waits in the same order on every attempt, with the same names (they are the steps' keys).
 *
 * The step functions of a handler's context run their statements on a connection the worker lends
 * to the job (pgjobq_ctx_client): opened at its first use (one for each job that uses one at once),
 * kept for the next job, and closed with the worker.
 */

/* A stored step of a job, as pgjobq_job_steps() lists it. */
typedef struct pgjobq_step_info {
    const char *name;
    int attempt;          /* the attempt of the job that stored it */
    int64_t stored_at;    /* microseconds since the epoch */
    int64_t result_bytes; /* the size of its result, bytes of JSON text */
    uint64_t pgjobq_reserved[4]; /* zero: room for fields added before 1.0 without changing the size */
} pgjobq_step_info;

/* Why a job is parked (pgjobq_park_info.parked). */
typedef enum pgjobq_park {
    PGJOBQ_PARK_NONE = 0,  /* not parked */
    PGJOBQ_PARK_SLEEP = 1, /* a durable sleep (pgjobq_ctx_sleep) */
    PGJOBQ_PARK_EVENT = 2  /* waiting for an event (pgjobq_ctx_wait_event) */
} pgjobq_park;

/* A job's park, as pgjobq_job_park() reports it: the strings are the struct's own. */
typedef struct pgjobq_park_info {
    pgjobq_park parked;
    int64_t until;   /* when it runs again: the sleep's end, the wait's timeout (microseconds since the epoch) */
    int64_t since;   /* since when it is parked in this step */
    char step[1024]; /* the sleep's or the wait's step name (255 characters, UTF-8) */
    char event_name[1024], event_key[1024]; /* what it waits for ("" for a sleep) */
    uint64_t pgjobq_reserved[4];
} pgjobq_park_info;

/* The longest step, event and event key name, in characters. */
#define PGJOBQ_STEP_NAME_MAX 255

/* A step's work.  Returns PGJOBQ_OK with its result in *result_out (JSON text allocated with malloc,
 * which the library frees; NULL stores JSON null), or any other value: the step failed, nothing is
 * stored, and pgjobq_ctx_step returns that value.  tx is NULL for pgjobq_ctx_step; for
 * pgjobq_ctx_step_tx it is the worker's connection lent to the job, in the transaction that will
 * store the result: the step's effects go through it (pgjobq_client_conn(tx) for libpq). */
typedef int (*pgjobq_step_fn)(pgjobq_ctx *ctx, pgjobq_client *tx, void *arg, char **result_out);

/* The connection the worker lends to this job (connected to the worker's database, opened at the
 * first call of any job and kept for the next), for the handler's own statements: the same one the
 * step functions use.  It must be left outside a transaction between calls.  PGJOBQ_OK, or the error
 * of connecting (pgjobq_ctx_errmsg says why). */
PGJOBQ_EXPORT int pgjobq_ctx_client(pgjobq_ctx *ctx, pgjobq_client **out) PGJOBQ_WUR;

/* The message of the last error of a step function on ctx ("" when none). */
PGJOBQ_EXPORT const char *pgjobq_ctx_errmsg(const pgjobq_ctx *ctx);

/*
 * Runs the step `name` (1 to PGJOBQ_STEP_NAME_MAX characters) of the job once: when a result of that
 * step is stored on the job, returns it without calling fn; else calls fn(ctx, NULL, arg, &result)
 * outside any transaction and stores its result, fenced by the lease.  At least once: a worker that
 * dies after fn and before the store runs fn again in the next attempt (use pgjobq_ctx_step_tx for
 * effects in the database).  On PGJOBQ_OK, *result_out (may be NULL) is the step's result, JSON text
 * to release with pgjobq_free ("null" for a null result).  fn's own code when it fails (nothing
 * stored); PGJOBQ_ELEASE when the job is not held under its lease any more (nothing stored: stop);
 * PGJOBQ_EINVAL (a bad name, a result that is not JSON or over 1 MiB); a connection's error.
 */
PGJOBQ_EXPORT int pgjobq_ctx_step(pgjobq_ctx *ctx, const char *name, pgjobq_step_fn fn, void *arg,
                                  char **result_out) PGJOBQ_WUR;

/*
 * The same, exactly once: fn(ctx, tx, arg, &result) runs inside a transaction on the connection lent
 * to the job (tx), and its result is stored in that transaction, which commits only when the store
 * is accepted.  When the lease was lost meanwhile (the job expired and the rescue gave it to
 * another worker) the store is refused and the transaction rolled back, fn's effects with it:
 * PGJOBQ_ELEASE.  A step of that name stored meanwhile by another holder stands: its result is
 * returned, and fn's effects are rolled back.  fn must not commit or roll back tx.  The transaction
 * lasts as long as fn: keep the step short (it holds what its statements lock).
 */
PGJOBQ_EXPORT int pgjobq_ctx_step_tx(pgjobq_ctx *ctx, const char *name, pgjobq_step_fn fn, void *arg,
                                     char **result_out) PGJOBQ_WUR;

/*
 * A step in two halves, for a handler that runs the step's work elsewhere (the coprocess does, for
 * its handler's steps): pgjobq_ctx_step_get gives the stored result of the job's step `name`
 * (PGJOBQ_OK, *result_out JSON text to release with pgjobq_free), or PGJOBQ_ENOTFOUND when it was
 * never stored; pgjobq_ctx_step_put stores it, fenced by the lease, as pgjobq_ctx_step does (PGJOBQ_OK;
 * PGJOBQ_EDUPLICATE when it was stored first, that result in *stored_out, may be NULL: it stands).
 * Both read the job's stored steps once per attempt, at the first of them (one statement), and know
 * what the attempt stored since: a step not stored costs its store alone.  PGJOBQ_ELEASE when the job
 * is not held under its lease any more; PGJOBQ_EINVAL (a bad name, a result that is not JSON).
 */
PGJOBQ_EXPORT int pgjobq_ctx_step_get(pgjobq_ctx *ctx, const char *name, char **result_out) PGJOBQ_WUR;
PGJOBQ_EXPORT int pgjobq_ctx_step_put(pgjobq_ctx *ctx, const char *name, const char *result,
                                      char **stored_out) PGJOBQ_WUR;

/*
 * A durable sleep: the first time the job comes to it, stores its end (the database's now + delay_ms,
 * 0 to 100 years) as the step `name` (NULL: "sleep#N", N counting this attempt's unnamed sleeps) and
 * parks the job until then: PGJOBQ_PARKED, and the handler returns (PGJOBQ_OUTCOME_PARKED).  The
 * job's attempt is given back, its slot and lease freed, and no snooze is counted.  The attempt that
 * runs at the sleep's end (or later) gets PGJOBQ_OK from the same call and goes on.
 * PGJOBQ_ECANCELLED: the job's cancellation was requested, it ended cancelled (return; nothing is
 * written).  PGJOBQ_ELEASE; PGJOBQ_EINVAL; a connection's error.
 */
PGJOBQ_EXPORT int pgjobq_ctx_sleep(pgjobq_ctx *ctx, const char *name, int64_t delay_ms) PGJOBQ_WUR;

/*
 * Waits for the event (event_name, key: key NULL is "") as the step `name` (NULL: "wait#N", N
 * counting this attempt's unnamed waits).  PGJOBQ_OK with the event's payload in *payload_out (JSON
 * text to release with pgjobq_free; may be NULL): the first event of (event_name, key) still kept
 * (events are kept 7 days: one sent before the wait began counts), or the one that resumed the job.
 * PGJOBQ_PARKED: none yet; the job is parked until the event comes or timeout_ms passes (counted
 * from the first call of this wait; < 0: 100 years), and the handler returns (PGJOBQ_OUTCOME_PARKED).
 * PGJOBQ_ETIMEOUT: the timeout passed without the event.  The answer is stored: a later attempt
 * gets the same one.  PGJOBQ_ECANCELLED, PGJOBQ_ELEASE, PGJOBQ_EINVAL as pgjobq_ctx_sleep's.
 */
PGJOBQ_EXPORT int pgjobq_ctx_wait_event(pgjobq_ctx *ctx, const char *name, const char *event_name, const char *key,
                                        int64_t timeout_ms, char **payload_out) PGJOBQ_WUR;

/*
 * Sends the event (name, key: NULL is "") with its payload (JSON text; NULL: null), in the client's
 * transaction when it is in one (the event exists, and resumes jobs, only if that commits): every
 * job parked waiting for it is resumed at once with it, and waits that begin later (within 7 days)
 * find it.  *resumed_out (may be NULL) receives how many parked jobs it resumed.  PGJOBQ_EINVAL for
 * a bad name, key or payload.
 */
PGJOBQ_EXPORT int pgjobq_send_event(pgjobq_client *c, const char *name, const char *key, const char *payload,
                                    int *resumed_out) PGJOBQ_WUR;

/*
 * What the step functions of a handler's context do, for a program that holds a job's lease itself
 * (pgjobq_claim): each is fenced by (id, lease_token) and runs on c (in c's transaction when it is in
 * one: pgjobq_step_put in a transaction with the step's effects is pgjobq_ctx_step_tx).
 * pgjobq_step_get: PGJOBQ_OK with the stored result in *result_out (release with pgjobq_free),
 * PGJOBQ_ENOTFOUND when the job has no such step, PGJOBQ_ELEASE.  pgjobq_step_put: PGJOBQ_OK stored;
 * PGJOBQ_EDUPLICATE when the step was stored before (that result stands: in *stored_out, may be NULL);
 * PGJOBQ_ELEASE (nothing stored: roll back).  pgjobq_job_sleep and pgjobq_job_wait_event: as the
 * context's (PGJOBQ_OK, PGJOBQ_PARKED, PGJOBQ_ETIMEOUT, ...), the name required; *until_out (may be
 * NULL) receives the sleep's end.
 */
PGJOBQ_EXPORT int pgjobq_step_get(pgjobq_client *c, int64_t id, int64_t lease_token, const char *name,
                                  char **result_out) PGJOBQ_WUR;
PGJOBQ_EXPORT int pgjobq_step_put(pgjobq_client *c, int64_t id, int64_t lease_token, const char *name,
                                  const char *result, char **stored_out) PGJOBQ_WUR;
PGJOBQ_EXPORT int pgjobq_job_sleep(pgjobq_client *c, int64_t id, int64_t lease_token, const char *name,
                                   int64_t delay_ms, int64_t *until_out) PGJOBQ_WUR;
PGJOBQ_EXPORT int pgjobq_job_wait_event(pgjobq_client *c, int64_t id, int64_t lease_token, const char *name,
                                        const char *event_name, const char *key, int64_t timeout_ms,
                                        char **payload_out) PGJOBQ_WUR;

/* The job's stored steps, in the order they were stored: *steps_out holds *n_out entries (NULL, 0 when
 * none), to release with pgjobq_steps_free().  A job that is not there has none. */
PGJOBQ_EXPORT int pgjobq_job_steps(pgjobq_client *c, int64_t id, pgjobq_step_info **steps_out,
                                   size_t *n_out) PGJOBQ_WUR;
PGJOBQ_EXPORT void pgjobq_steps_free(pgjobq_step_info *steps);

/* The job's park now into *out (parked PGJOBQ_PARK_NONE when it is not parked). */
PGJOBQ_EXPORT int pgjobq_job_park(pgjobq_client *c, int64_t id, pgjobq_park_info *out) PGJOBQ_WUR;

/* Releases a string the library returned (a step's result, an event's payload).  Accepts NULL. */
PGJOBQ_EXPORT void pgjobq_free(void *p);

/* ------------------------------------------------------------------------------------------------ */
/* Clusters of shards (docs/shards.md)                                                              */

/*
 * A cluster: N pgjobq databases (shards) and the map that says which shard owns each job.  A handle
 * reads the map once, then routes each job without asking a database: a pinned queue (the default,
 * and any queue the map does not list) goes to the owner of its partition (the map's, else
 * route_hash(queue) & (P - 1)); a spread queue's job with a route_key (pgjobq_enqueue_opts.route_key)
 * to the owner of route_hash(route_key) & (P - 1), one without to the queue's own partition: exactly
 * pgjobq.route_partition's rule.  A job id names its shard (id % 1024 is the shard's number).
 *
 * A database without a map is a cluster of one shard, that database: its one client is the
 * connection the cluster was opened on, and a call costs what the same call on a pgjobq_client does
 * (no extra statement).  One handle, one thread, like a client; the shards' clients it hands out are
 * its own (never close them).
 */
typedef struct pgjobq_cluster pgjobq_cluster;

/* What pgjobq_cluster_route_job gives for an id at most the map's id_floor (a job from before the
 * cluster, which any shard may hold: ask every shard). */
#define PGJOBQ_SHARD_ANY ((size_t)-1)

/* The connect_timeout, in seconds, the cluster gives a shard's connection (and the one it is opened
 * on) whose conninfo sets none (nor $PGCONNECT_TIMEOUT): a shard that is down fails within it. */
#define PGJOBQ_CLUSTER_CONNECT_TIMEOUT_S 5

/*
 * Opens a cluster.  spec is either
 *   - a conninfo or postgresql:// URL of any shard or of the router database: the map is read there
 *     (pgjobq.cluster_map()); the connection stays open, to read the map again, and serves as that
 *     shard's client.  A database with no map (or a schema older than the map's) is a cluster of one
 *     shard: that database, named as the database is (PQdb);
 *   - a JSON map file, what pgjobq.cluster_map() returns (docs/shards.md, "The map"): a path that
 *     starts with '/' or "./", or "file:PATH".
 * Like pgjobq_client_open, *out is set whenever a handle could be allocated, even on error, so that
 * pgjobq_cluster_errmsg() explains it; close it in every case.  Returns PGJOBQ_OK; PGJOBQ_ECONN (the
 * database of spec is unreachable: within PGJOBQ_CLUSTER_CONNECT_TIMEOUT_S unless spec sets its own
 * connect_timeout); PGJOBQ_ESCHEMA (a database with neither a map nor a usable pgjobq schema);
 * PGJOBQ_EINVAL (a file that cannot be read, or a map that is not one: the reason); PGJOBQ_ENOMEM.
 */
PGJOBQ_EXPORT int pgjobq_cluster_open(pgjobq_cluster **out, const char *spec) PGJOBQ_WUR;

/* Closes the cluster and every connection it opened.  Accepts NULL. */
PGJOBQ_EXPORT void pgjobq_cluster_close(pgjobq_cluster *cl);

/* The last error on the cluster, one line, naming the shard it comes from ("shard b: ..."); "" after
 * a call that succeeded.  Valid until the next call on the cluster.  Passwords never appear in it. */
PGJOBQ_EXPORT const char *pgjobq_cluster_errmsg(const pgjobq_cluster *cl);

/* The SQLSTATE behind the last error ("PJQ01", ...), or "". */
PGJOBQ_EXPORT const char *pgjobq_cluster_sqlstate(const pgjobq_cluster *cl);

/*
 * Reads the map again: from the database the cluster was opened on (or the file), else from any
 * shard it is connected to.  A map of a lower epoch than the one held is not taken (PGJOBQ_OK, the
 * map unchanged).  Shard indexes may change (a shard added or removed); a shard whose name and
 * conninfo stay keeps its connection.  The clients of shards that left the map are closed.  Returns
 * PGJOBQ_OK or the error (the map held is kept).  The enqueue functions call it themselves when a shard
 * refuses a job with SQLSTATE PJQ01 (its map is newer): reading then from that shard.
 */
PGJOBQ_EXPORT int pgjobq_cluster_reload(pgjobq_cluster *cl) PGJOBQ_WUR;

/* The epoch of the map held; 0 for a database without a map. */
PGJOBQ_EXPORT int64_t pgjobq_cluster_epoch(const pgjobq_cluster *cl);

/* The number of shards (1 for a database without a map); 0 for NULL. */
PGJOBQ_EXPORT size_t pgjobq_cluster_shards(const pgjobq_cluster *cl);

/* Shard i's name, and its conninfo as the map gives it (never a password; for a database without a
 * map, spec as given to pgjobq_cluster_open).  NULL when i is out of range. */
PGJOBQ_EXPORT const char *pgjobq_cluster_shard_name(const pgjobq_cluster *cl, size_t i);
PGJOBQ_EXPORT const char *pgjobq_cluster_shard_conninfo(const pgjobq_cluster *cl, size_t i);

/* Shard i's number in the map (job ids end in it: id % 1024); 0 for a database without a map, -1 when
 * i is out of range. */
PGJOBQ_EXPORT int pgjobq_cluster_shard_number(const pgjobq_cluster *cl, size_t i);

/*
 * Shard i's client, connected at the first call (with PGJOBQ_CLUSTER_CONNECT_TIMEOUT_S as its
 * connect_timeout unless the conninfo sets one) and kept: use it for anything a client does on that
 * shard (claims, reads, cancel).  Owned by the cluster: do not close it; valid until
 * pgjobq_cluster_close, or a reload that drops the shard.  On failure *out is NULL, the error
 * (PGJOBQ_ECONN, PGJOBQ_ESCHEMA, PGJOBQ_EINVAL for i out of range) names the shard, and the next call
 * tries again.
 */
PGJOBQ_EXPORT int pgjobq_cluster_client(pgjobq_cluster *cl, size_t i, pgjobq_client **out) PGJOBQ_WUR;

/* The index of the shard that owns a job of queue (NULL: "default") with routing key route_key (may
 * be NULL), by the map held, into *shard_out: pgjobq.route_partition's rule (above).  PGJOBQ_OK, or
 * PGJOBQ_EINVAL for a bad queue name.  Asks no database. */
PGJOBQ_EXPORT int pgjobq_cluster_route(const pgjobq_cluster *cl, const char *queue, const char *route_key,
                                       size_t *shard_out) PGJOBQ_WUR;

/* The index of the shard that holds job id, into *shard_out: the shard whose number is id % 1024, or
 * PGJOBQ_SHARD_ANY for an id at most the map's id_floor (a job from before the cluster: look on every
 * shard).  Always 0 for a database without a map.  PGJOBQ_OK; PGJOBQ_EINVAL for an id below 1;
 * PGJOBQ_ENOTFOUND when no shard of the map has the id's number.  Asks no database. */
PGJOBQ_EXPORT int pgjobq_cluster_route_job(const pgjobq_cluster *cl, int64_t id, size_t *shard_out) PGJOBQ_WUR;

/*
 * pgjobq_enqueue on the shard that owns the job (pgjobq_cluster_route).  When that shard refuses it
 * with SQLSTATE PJQ01 (its map is newer than the one held: the partition moved), the map is read
 * again from that shard and the job routed again, once; it is never written to a shard that does not
 * own it.  The result codes and *id_out are pgjobq_enqueue's; an error names the shard.
 */
PGJOBQ_EXPORT int pgjobq_cluster_enqueue(pgjobq_cluster *cl, const char *payload, const pgjobq_enqueue_opts *opts,
                                         int64_t *id_out) PGJOBQ_WUR;

/*
 * pgjobq_enqueue_many over the cluster: the jobs are routed one by one, and each shard's part is
 * written with one pgjobq_enqueue_many on that shard, all of it or none of it (one transaction per
 * shard), the parts one shard after another.  What is promised across shards: nothing beyond each
 * part.  When a part fails (a bad job, named as pgjobq_enqueue_many names it, by its index in that shard's
 * part; a shard that is down; PJQ01 twice),
 * the other parts are still written (a shard that is down costs at most its connect timeout, and the
 * shards already connected go first), the first error is returned, and pgjobq_cluster_errmsg names
 * every shard whose part failed ("shard b: ...").  ids_out (may be NULL) then holds the ids of the
 * jobs written and 0 for the jobs of the failed parts (dup_out, may be NULL, 0 for them too): a caller
 * may send again exactly the jobs whose id is 0.  PJQ01 on a part: the map is read again from that
 * shard and that part's jobs routed again, once per call.  A batch that must be all or none goes to
 * one shard: one pinned queue, or one routing key.  Jobs with parents (after) must be on their
 * parents' shard.
 */
PGJOBQ_EXPORT int pgjobq_cluster_enqueue_many(pgjobq_cluster *cl, const pgjobq_job_spec *jobs, size_t n,
                                              int64_t *ids_out, unsigned char *dup_out) PGJOBQ_WUR;

/*
 * pgjobq_send_event on every shard of the cluster (a job waiting for an event may be on any of them),
 * each in a transaction of its own, one shard after another: an event is a fact (docs/durable.md,
 * "Events"), so sending it again changes nothing for the jobs that got it.  *resumed_out (may be NULL)
 * receives how many parked jobs it resumed over the shards that took it.  When shards fail (down, or
 * refusing), the others still take it, the first error is returned and pgjobq_cluster_errmsg names
 * every shard that failed ("shard b: ..."): send it again.  PGJOBQ_EINVAL for a bad name, key or
 * payload (then no shard took it).  Not in a caller's transaction: for an event that must
 * commit with the caller's data, send it with pgjobq_send_event on the shard of the jobs that wait.
 */
PGJOBQ_EXPORT int pgjobq_cluster_send_event(pgjobq_cluster *cl, const char *name, const char *key,
                                            const char *payload, int *resumed_out) PGJOBQ_WUR;

/* ------------------------------------------------------------------------------------------------ */
/* The outbox's forwarder (docs/shards.md, "The outbox")                                              */

/* The queue of the outbox jobs that pgjobq.forward() enqueues, in the producer's own database and
 * transaction: each is a job to be written to the shard that owns it. */
#define PGJOBQ_OUTBOX_QUEUE "pgjobq.outbox"

/* A forwarder: what moves outbox jobs to their shards.  Its handler's threads share it. */
typedef struct pgjobq_forwarder pgjobq_forwarder;

/*
 * Creates a forwarder to the cluster cluster_spec (what pgjobq_cluster_open takes).  The cluster is
 * opened at the first job, not here, so that a cluster that cannot be reached at start costs time,
 * not the worker.  PGJOBQ_OK; PGJOBQ_EINVAL (no spec); PGJOBQ_ENOMEM.  Free it after the workers that
 * use it.
 */
PGJOBQ_EXPORT int pgjobq_forwarder_new(pgjobq_forwarder **out, const char *cluster_spec) PGJOBQ_WUR;

/* Frees a forwarder and closes its cluster.  Accepts NULL. */
PGJOBQ_EXPORT void pgjobq_forwarder_free(pgjobq_forwarder *f);

/*
 * The forwarder's handler, for the outbox's queue of the database a worker serves:
 *
 *     pgjobq_worker_handle(w, PGJOBQ_OUTBOX_QUEUE, NULL, 4, pgjobq_forward_handler, forwarder);
 *
 * For each outbox job it writes the job to its shard with pgjobq.enqueue_forwarded (once per outbox
 * job, however often it is forwarded) and completes the outbox job with the result
 * {"shard": NAME, "id": ID, "duplicate": BOOL}.  A shard that cannot be reached, or a map that cannot
 * be read, snoozes the outbox job for 5 s (no attempt used); PJQ01 reads the map again and routes
 * again; a job its shard refuses uses an attempt, with the shard's message.
 */
PGJOBQ_EXPORT pgjobq_outcome pgjobq_forward_handler(pgjobq_ctx *ctx, void *forwarder);

/* ------------------------------------------------------------------------------------------------ */
/* Validation helpers (the same checks the library applies before writing)                           */

/* Returns PGJOBQ_OK if name is a valid queue or kind name, else PGJOBQ_EINVAL. */
PGJOBQ_EXPORT int pgjobq_name_check(const char *name) PGJOBQ_WUR;

/*
 * Checks that the len bytes at text are one JSON document PostgreSQL's jsonb accepts (RFC 8259, UTF-8,
 * no \u0000, no lone surrogates, nesting at most 1000 deep) and at most PGJOBQ_PAYLOAD_MAX bytes.
 * Like jsonb it accepts an object with a key twice; jsonb then keeps the last value only.
 * Returns PGJOBQ_OK or PGJOBQ_EINVAL; on error, if why is not NULL, writes a short reason (with the
 * byte offset) into why[0..why_size).
 */
PGJOBQ_EXPORT int pgjobq_json_check(const char *text, size_t len, char *why, size_t why_size) PGJOBQ_WUR;

/* pgjobq_json_check with max_len bytes as the limit instead of PGJOBQ_PAYLOAD_MAX: for a document that
 * holds a value to store and more (a line of a protocol), checked whole before it is taken apart. */
PGJOBQ_EXPORT int pgjobq_json_check_limit(const char *text, size_t len, size_t max_len, char *why,
                                          size_t why_size) PGJOBQ_WUR;

/*
 * Checks that libpq can parse conninfo (a postgresql:// URL or a key=value string; NULL is "").  Does
 * not connect.  Returns PGJOBQ_OK, PGJOBQ_EINVAL, or PGJOBQ_ENOMEM; on error, if why is not NULL,
 * writes libpq's reason into why[0..why_size) with its passwords redacted (pgjobq_conninfo_redact).
 * Thread-safe.
 */
PGJOBQ_EXPORT int pgjobq_conninfo_check(const char *conninfo, char *why, size_t why_size) PGJOBQ_WUR;

/*
 * Copies msg into buf[0..size) (NUL-terminated when size > 0, cut to fit) with passwords replaced by
 * "***": every password conninfo holds (may be NULL), as written or decoded, and the pieces libpq may
 * split a malformed one into; the value of $PGPASSWORD; and anything shaped like a password (between
 * ':' and '@' after "://", after "password=").  What the library's own messages get (pgjobq_errmsg,
 * pgjobq_worker_errmsg, the worker's log lines); use it on messages of your own that may quote a
 * connection string.  buf must not overlap msg.  Returns the length of the whole redacted text (as
 * snprintf does).  Should it run out of memory, buf says the message was withheld.  Thread-safe.
 */
PGJOBQ_EXPORT size_t pgjobq_conninfo_redact(char *buf, size_t size, const char *msg, const char *conninfo);

#ifdef __cplusplus
}
#endif

#endif /* PGJOBQ_H */
