/*
 * internal.h - what the files of libpgjobq share.  Not installed, not API.
 */
#ifndef PGJOBQ_INTERNAL_H
#define PGJOBQ_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "pgjobq.h"

/* Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01 UTC): binary timestamps on
 * the wire count from the latter. */
#define PGJOBQ__PG_EPOCH_US INT64_C(946684800000000)

/* Built-in type OIDs (stable across PostgreSQL versions: they are in pg_type.dat). */
#define OID_BOOL              16
#define OID_INT8              20
#define OID_INT2              21
#define OID_INT4              23
#define OID_TEXT              25
#define OID_TIMESTAMPTZ       1184
#define OID_INTERVAL          1186
#define OID_JSONB             3802
#define OID_BOOL_ARRAY        1000
#define OID_INT2_ARRAY        1005
#define OID_INT4_ARRAY        1007
#define OID_TEXT_ARRAY        1009
#define OID_INT8_ARRAY        1016
#define OID_TIMESTAMPTZ_ARRAY 1185
#define OID_INTERVAL_ARRAY    1187
#define OID_JSONB_ARRAY       3807

/* How many times a statement that failed with 40001 or 40P01 is run again (outside a caller's
 * transaction) before PGJOBQ_ECONFLICT is returned. */
#define PGJOBQ__CONFLICT_RETRIES 10

/* What a job gets for a field it is enqueued without: the database's pgjobq.job_defaults(). */
typedef struct pgjobq__job_defaults {
    char queue[PGJOBQ_NAME_MAX + 1], kind[PGJOBQ_NAME_MAX + 1], payload[256];
    int priority, max_attempts;
} pgjobq__job_defaults;

struct pgjobq_client {
    PGconn *conn;
    int owned;        /* the client opened conn and closes it */
    int schema_state; /* 1 usable, 0 missing/older (migrate only), -1 newer (unusable) */
    pgjobq_log_fn log_fn;
    void *log_arg;
    char sqlstate[6];
    char errmsg[1024];
    unsigned conflict_retries; /* statements re-run after 40001/40P01, for tests and stats */
    int copy_state;            /* may this role COPY into pgjobq.jobs: 0 not asked yet, 1 yes, -1 no */
    /* What COPY writes for a field a job leaves out, read with copy_state (enqueue.c). */
    pgjobq__job_defaults copy_defaults;
};

/* One statement to run, with its parameters (all parameter arrays have nparams entries). */
typedef struct pgjobq__stmt {
    const char *what; /* for error messages: "claim", "enqueue", ... */
    const char *sql;
    int nparams;
    const Oid *types;
    const char *const *values;
    const int *lengths;
    const int *formats;
    int binary_result;
} pgjobq__stmt;

/* errors.c */
int pgjobq__seterr(pgjobq_client *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void pgjobq__clearerr(pgjobq_client *c);
void pgjobq__log(pgjobq_client *c, pgjobq_log_level level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int pgjobq__code_from_sqlstate(const char *sqlstate);

/* redact.c: msg (msg_len bytes) into buf[0..size), NUL-terminated, with every password of conninfo
 * (may be NULL), of conn's options (may be NULL) and of $PGPASSWORD, and anything shaped like one,
 * replaced by "***"; returns the length of the whole result.  buf must not overlap msg. */
size_t pgjobq__redact(char *buf, size_t size, const char *msg, size_t msg_len, const char *conninfo, PGconn *conn);

/* client.c */
int pgjobq__client_open_timeout(pgjobq_client **out, const char *conninfo, int64_t tcp_timeout_ms);

/* exec.c: running statements */
/* The one way the library runs a statement on a client: PGJOBQ_OK with the result in *out (the caller
 * clears it), or the error, set on c.  An owned connection that broke is made again first; outside a
 * transaction, a serialization failure or deadlock is run again (PGJOBQ__CONFLICT_RETRIES). */
int pgjobq__exec(pgjobq_client *c, const pgjobq__stmt *st, PGresult **out) __attribute__((warn_unused_result));
/* pgjobq__exec, and when st runs as its own transaction (the connection is idle), then after it as a
 * transaction of its own, in the same round trip (pipelined): then's result is dropped, so it must be
 * a statement whose failure does not matter (a notification).  In a transaction, st alone. */
int pgjobq__exec_then(pgjobq_client *c, const pgjobq__stmt *st, const pgjobq__stmt *then, PGresult **out)
    __attribute__((warn_unused_result));
/* The same for a text without parameters that may hold several statements (the simple protocol: BEGIN,
 * a migration); out may be NULL when the result is not wanted. */
int pgjobq__exec_sql(pgjobq_client *c, const char *what, const char *sql, PGresult **out)
    __attribute__((warn_unused_result));
/* Rolls back the transaction open on the client's connection, if any, keeping the client's error: what
 * a failed step of the library's own transaction ends with. */
void pgjobq__rollback_quietly(pgjobq_client *c);
/* The session settings of a connection the client owns, after every (re)connect. */
int pgjobq__session_setup(pgjobq_client *c);
/* Sets the client's message to prefix and libpq's connection error, with every password redacted
 * (conninfo: the string the connection was opened with, when at hand; may be NULL). */
void pgjobq__conn_error(pgjobq_client *c, const char *prefix, const char *conninfo);
/* pgjobq__conn_error without a conninfo, returning code. */
int pgjobq__seterr_conn(pgjobq_client *c, int code, const char *prefix);

/* schema.c: the database's schema version */
/* Reads it, and (needs, may be NULL) the oldest library schema version that can use the database. */
int pgjobq__read_version(pgjobq_client *c, int *version, int *needs);
/* Reads it and records on c whether this library can use the database (an error when not). */
int pgjobq__check_schema(pgjobq_client *c);
/* PGJOBQ_OK when the last check found a usable schema, else PGJOBQ_ESCHEMA with the reason. */
int pgjobq__require_schema(pgjobq_client *c);

/* Whether this library can use a database at schema `version` whose migrations need library schema
 * `needs` or later.  Newer compatible schemas are accepted, so that a
 * rolling deploy may migrate before every worker is upgraded. */
int pgjobq__schema_usable(int version, int needs);

/* wire.c: binary wire formats */
typedef struct pgjobq__buf {
    char *data;
    size_t len;
    size_t cap;
    int oom;
} pgjobq__buf;

void pgjobq__buf_free(pgjobq__buf *b);
void pgjobq__buf_put(pgjobq__buf *b, const void *p, size_t n);
void pgjobq__buf_u32(pgjobq__buf *b, uint32_t v);
void pgjobq__buf_u64(pgjobq__buf *b, uint64_t v);

/* A one-dimensional binary array under construction: begin, add n elements, end. */
typedef struct pgjobq__array {
    pgjobq__buf buf;
    size_t count_at; /* offset of the dimension length */
    uint32_t count;
    int has_null_at; /* offset of the has-null flag */
    int has_null;
} pgjobq__array;

void pgjobq__array_begin(pgjobq__array *a, Oid elem_type);
void pgjobq__array_null(pgjobq__array *a);
void pgjobq__array_int8(pgjobq__array *a, int64_t v);
void pgjobq__array_int4(pgjobq__array *a, int32_t v);
void pgjobq__array_int2(pgjobq__array *a, int16_t v);
void pgjobq__array_bool(pgjobq__array *a, int v);
void pgjobq__array_text(pgjobq__array *a, const char *s, size_t n);
void pgjobq__array_jsonb(pgjobq__array *a, const char *s, size_t n);
void pgjobq__array_interval_us(pgjobq__array *a, int64_t us);
int pgjobq__array_end(pgjobq__array *a); /* 0, or -1 on OOM */

/* Big-endian integers at p (the binary wire format). */
uint32_t pgjobq__get_be32(const char *p);
uint64_t pgjobq__get_be64(const char *p);
int64_t pgjobq__get_int8(const PGresult *r, int row, int col);
int32_t pgjobq__get_int4(const PGresult *r, int row, int col);
int16_t pgjobq__get_int2(const PGresult *r, int row, int col);
int pgjobq__get_bool(const PGresult *r, int row, int col);
int64_t pgjobq__get_time(const PGresult *r, int row, int col); /* PGJOBQ_TIME_NONE when NULL */
/* A text or jsonb column: points into r; *len excludes the jsonb version byte.  NULL when NULL. */
const char *pgjobq__get_text(const PGresult *r, int row, int col, size_t *len);

/* jobs.c */
pgjobq_job *pgjobq__job_dup(const pgjobq_job *j);

/* The columns every job-reading query selects from pgjobq.all_jobs (jobs.c reads them in this order,
 * pgjobq__jobs_from_result).  Not the lease token: it is the holder's secret, which only a claim
 * returns to its claimer (the admin and monitor roles may not read the column: sql/roles.sql); a job
 * read here has lease_token 0.  Nor concurrency_key, which pgjobq_job has no field for.  The test
 * schema_the_job_rows_columns_are_the_same_everywhere (tests/test_shape.c) holds the list to the
 * view's columns. */
#define PGJOBQ__JOB_COLUMNS                                                                              \
    "id, queue::pg_catalog.text, kind::pg_catalog.text, payload::pg_catalog.jsonb, priority, "           \
    "state::pg_catalog.text, attempt, max_attempts, NULL::pg_catalog.int8 AS lease_token, run_at, "      \
    "created_at, started_at, finished_at, lease_until, worker_id::pg_catalog.text, result, last_error, " \
    "unique_key::pg_catalog.text, cancel_requested, pg_catalog.to_jsonb(tags) AS tags, progress, "       \
    "NULL::pg_catalog.jsonb AS parents, cancel_requested_at, traceparent"

/* What a claim returns for each job (pgjobq.claim_next and pgjobq.claim_batch), the first columns of
 * its select list, in this order; pgjobq__claimed_read() reads them.  tests/test_shape.c holds it to
 * the claims' RETURNS TABLE. */
#define PGJOBQ__CLAIMED_COLUMNS                                                                        \
    "id, kind, payload, priority, attempt, max_attempts, lease_token, run_at, created_at, started_at," \
    " lease_until, unique_key, last_error, parents, traceparent"
enum {
    PGJOBQ__K_ID,
    PGJOBQ__K_KIND,
    PGJOBQ__K_PAYLOAD,
    PGJOBQ__K_PRIORITY,
    PGJOBQ__K_ATTEMPT,
    PGJOBQ__K_MAX_ATTEMPTS,
    PGJOBQ__K_TOKEN,
    PGJOBQ__K_RUN_AT,
    PGJOBQ__K_CREATED_AT,
    PGJOBQ__K_STARTED_AT,
    PGJOBQ__K_LEASE_UNTIL,
    PGJOBQ__K_UNIQUE_KEY,
    PGJOBQ__K_LAST_ERROR,
    PGJOBQ__K_PARENTS,
    PGJOBQ__K_TRACEPARENT,
    PGJOBQ__K_NCOLS
};
/* The bytes the strings of a claimed row take, each with its NUL. */
size_t pgjobq__claimed_size(const PGresult *r, int row);
/* Reads a claimed row into *j, a job running under the claim's lease, its strings copied to `strings`
 * (pgjobq__claimed_size bytes); j->queue and j->worker_id are left NULL, for the caller.  Returns the
 * end of what it copied. */
char *pgjobq__claimed_read(const PGresult *r, int row, pgjobq_job *j, char *strings);
int pgjobq__jobs_from_result(pgjobq_client *c, const PGresult *r, pgjobq_job **out, size_t *n);

/* The outcome a fenced write reports per job (complete_many, fail_many, extend_many, release_many,
 * cancel_many), parsed once (jobs.c). */
typedef enum pgjobq__outcome {
    PGJOBQ__O_UNKNOWN = 0,
    PGJOBQ__O_COMPLETED,
    PGJOBQ__O_QUEUED,
    PGJOBQ__O_FAILED,
    PGJOBQ__O_CANCELLED,
    PGJOBQ__O_LOST,
    PGJOBQ__O_EXTENDED
} pgjobq__outcome;
pgjobq__outcome pgjobq__outcome_parse(const char *s, size_t len);

/* json.c: the library's JSON, read (checked) and written */
int pgjobq__json_check(const char *s, size_t n, char *why, size_t why_size);
/* Appends s, valid UTF-8, to b as a JSON string (quotes, backslashes and control characters escaped). */
void pgjobq__json_string(pgjobq__buf *b, const char *s);
/* Appends the key of an object's member that follows another: ,"key": */
void pgjobq__json_key(pgjobq__buf *b, const char *key);
/* The string member key of the JSON object text[0..len) (its escapes decoded, malloc'd, into *out):
 * 1 found, 0 absent or not a string (*out NULL), -1 not an object, malformed, or out of memory. */
int pgjobq__json_get_string(const char *text, size_t len, const char *key, char **out);
/* Copies s[0..n) into a new string that is valid UTF-8 (bad sequences become U+FFFD), has no NUL
 * bytes, and is at most cap bytes (cut on a character boundary).  keep_tail keeps the end instead of
 * the start.  Returns NULL on OOM. */
char *pgjobq__sanitize_text(const char *s, size_t n, size_t cap, int keep_tail);
int pgjobq__utf8_valid(const char *s, size_t n);

/* Common argument checks, each setting the client error. */
int pgjobq__check_name(pgjobq_client *c, const char *what, const char *name);
int pgjobq__check_payload(pgjobq_client *c, const char *what, const char *json, size_t len);

/* Advisory lock keys: (PGJOBQ__LOCK_CLASS, n).  1 migrate, 2 rescue, 3 prune.  PGJOBQ__LOCK(n) is
 * the key as SQL text, for the statements that take it. */
#define PGJOBQ__LOCK_CLASS 1885825649
#define PGJOBQ__STR_(x) #x
#define PGJOBQ__STR(x) PGJOBQ__STR_(x)
#define PGJOBQ__LOCK(n) PGJOBQ__STR(PGJOBQ__LOCK_CLASS) ", " #n

/* The database's schema version and the oldest library version that can use it (the largest
 * "needs" of the applied migrations; needs is read through to_jsonb: the column does not exist
 * before version 7), as the first two columns of a select list, and where they come from. */
#define PGJOBQ__SCHEMA_VERSION_COLS                                                                  \
    "coalesce(max(version), 0), coalesce(max(coalesce((pg_catalog.to_jsonb(s) ->> 'needs')::integer, version)), 0)"
#define PGJOBQ__SCHEMA_VERSION_FROM " FROM pgjobq.schema_version s"

/* route.c: FNV-1a, 32 bits, of key[0..len) (its UTF-8 bytes): the SQL's pgjobq.route_hash(key), which
 * places a job in a cluster of shards (docs/shards.md).  A job's partition is the hash & (P - 1). */
uint32_t pgjobq__route_hash(const char *key, size_t len);

/* Formats a millisecond count as a PostgreSQL interval literal into buf ("1500 milliseconds"). */
void pgjobq__ms_interval(char *buf, size_t size, int64_t ms);

#endif /* PGJOBQ_INTERNAL_H */
