/*
 * enqueue.c - inserting jobs: one, or many in one statement through pgjobq.enqueue_many(), or a large
 * batch with COPY.
 *
 * The database judges every enqueue rule (sql/functions/enqueue.sql, "The enqueue rules"): when a job
 * may run, unique keys, and the rules of pgjobq.jobs, so that the SQL API, the library, the command
 * and the other languages give one answer.  This file checks only what cannot reach the database as
 * given (JSON that does not parse, invalid UTF-8, a C value its SQL type cannot hold), and the cheap
 * bounds of the public constants (names, priority, max_attempts), which it needs for COPY and which
 * tests/test_rules.c holds equal to the database's.
 *
 * COPY writes a batch faster than an INSERT from arrays (the server inserts its rows a page at a time;
 * docs/design.md, "Enqueue"; bench/README.md, B1), but it cannot skip rows whose unique key is held (ON CONFLICT),
 * compute now() + delay, or take the column default for some rows and a value for others; batches that
 * need any of these go through pgjobq.enqueue_many().  The ids come from the sequence all the same
 * (pgjobq.reserve_ids), the defaults from the database (pgjobq.job_defaults), and the batch is one
 * transaction.
 *
 * The workers are woken (NOTIFY) with the commit of the transaction the jobs are in, except for the
 * one statement the library runs as its own transaction (pgjobq.enqueue_many on its idle connection):
 * that one carries none, and the notification follows it, pipelined in the same round trip, as a
 * transaction of its own.  A commit that carries a NOTIFY holds the server's notification lock through
 * its WAL flush, so producers that notify in their transactions commit one at a time
 * (bench/README.md, "NOTIFY and concurrent producers").  The notification is a hint: a worker's poll
 * finds the job without it.
 */
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int pgjobq_name_check(const char *name)
{
    size_t n;

    if (name == NULL || !((name[0] >= 'A' && name[0] <= 'Z') || (name[0] >= 'a' && name[0] <= 'z')))
        return PGJOBQ_EINVAL;
    for (n = 1; name[n]; n++) {
        char ch = name[n];
        if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' ||
              ch == '.' || ch == ':' || ch == '-'))
            return PGJOBQ_EINVAL;
    }
    return n <= PGJOBQ_NAME_MAX ? PGJOBQ_OK : PGJOBQ_EINVAL;
}

int pgjobq__check_name(pgjobq_client *c, const char *what, const char *name)
{
    if (pgjobq_name_check(name) == PGJOBQ_OK)
        return PGJOBQ_OK;
    if (name == NULL || name[0] == '\0')
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s name is empty", what);
    if (strlen(name) > PGJOBQ_NAME_MAX)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s name is %zu bytes long; the limit is %d", what, strlen(name),
                              PGJOBQ_NAME_MAX);
    return pgjobq__seterr(c, PGJOBQ_EINVAL,
                          "invalid %s name \"%.80s\": use an ASCII letter followed by letters, digits, "
                          "'_', '.', ':' or '-'",
                          what, name);
}

int pgjobq__check_payload(pgjobq_client *c, const char *what, const char *json, size_t len)
{
    char why[160];

    if (pgjobq__json_check(json, len, why, sizeof why) == 0)
        return PGJOBQ_OK;
    return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s is not valid JSON: %s", what, why);
}

/* Checks one job for what the database cannot judge (see the top of this file); `label` is "job" or
 * "job 17". */
static int check_spec(pgjobq_client *c, const char *label, const pgjobq_job_spec *j)
{
    const pgjobq_enqueue_opts *o = &j->opts;
    char what[64];
    int rc;

    if (o->queue) {
        snprintf(what, sizeof what, "%s: queue", label);
        if ((rc = pgjobq__check_name(c, what, o->queue)) != PGJOBQ_OK)
            return rc;
    }
    if (o->kind) {
        snprintf(what, sizeof what, "%s: kind", label);
        if ((rc = pgjobq__check_name(c, what, o->kind)) != PGJOBQ_OK)
            return rc;
    }
    if (j->payload) {
        snprintf(what, sizeof what, "%s: payload", label);
        if ((rc = pgjobq__check_payload(c, what, j->payload, strlen(j->payload))) != PGJOBQ_OK)
            return rc;
    }
    if (o->priority < PGJOBQ_PRIORITY_MIN || o->priority > PGJOBQ_PRIORITY_MAX)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: priority %d is out of range %d..%d", label, o->priority,
                              PGJOBQ_PRIORITY_MIN, PGJOBQ_PRIORITY_MAX);
    if (o->max_attempts < 0 || o->max_attempts > PGJOBQ_MAX_ATTEMPTS_MAX)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: max_attempts %d is out of range 1..%d", label, o->max_attempts,
                              PGJOBQ_MAX_ATTEMPTS_MAX);
    /* An interval counts microseconds in 64 bits (the database bounds the delay itself). */
    if (o->delay_ms > INT64_MAX / 1000 || o->delay_ms < INT64_MIN / 1000)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: a delay of %lld ms does not fit an interval", label,
                              (long long)o->delay_ms);
    if (o->run_at && !pgjobq__utf8_valid(o->run_at, strlen(o->run_at)))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: run_at is not valid UTF-8", label);
    if (o->unique_key && !pgjobq__utf8_valid(o->unique_key, strlen(o->unique_key)))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: unique key is not valid UTF-8", label);
    if (o->concurrency_key && !pgjobq__utf8_valid(o->concurrency_key, strlen(o->concurrency_key)))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: concurrency key is not valid UTF-8", label);
    if (o->route_key && !pgjobq__utf8_valid(o->route_key, strlen(o->route_key)))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: route key is not valid UTF-8", label);
    /* The flag's two values are all the graph can be told (and it is told only with after). */
    if (o->on_parent_failure != PGJOBQ_PARENT_FAILURE_CANCEL &&
        (o->on_parent_failure != PGJOBQ_PARENT_FAILURE_RUN || o->after == NULL))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: on_parent_failure must be CANCEL or RUN, and only with after",
                              label);
    for (size_t n = 0; o->tags && o->tags[n] != NULL; n++)
        if (!pgjobq__utf8_valid(o->tags[n], strlen(o->tags[n])))
            return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: tag %zu is not valid UTF-8", label, n);
    /* What the SQL API's text and interval can say; the rules of the modes are the database's. */
    if (o->on_conflict < PGJOBQ_ON_CONFLICT_SKIP || o->on_conflict > PGJOBQ_ON_CONFLICT_KEEP)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: on_conflict must be SKIP, REPLACE or KEEP, not %d", label,
                              (int)o->on_conflict);
    if (j->unique_for_ms < 0 || j->unique_for_ms > INT64_MAX / 1000)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: unique_for_ms %lld is not a window", label,
                              (long long)j->unique_for_ms);
    /* (The expiry's range and its order with run_at are the database's rule: enqueue_expiry_why.) */
    if (j->expire_after_ms < 0 || j->expire_after_ms > INT64_MAX / 1000)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: expire_after_ms %lld is not a duration", label,
                              (long long)j->expire_after_ms);
    if (j->expires_at && !pgjobq__utf8_valid(j->expires_at, strlen(j->expires_at)))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: expires_at is not valid UTF-8", label);
    /* (Its format is the database's rule: the domain pgjobq.traceparent.) */
    if (j->traceparent && !pgjobq__utf8_valid(j->traceparent, strlen(j->traceparent)))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: traceparent is not valid UTF-8", label);
    /* A job with parents or tags goes through the graph, which has no unique key (the database says
     * so of the key itself): the same words for what only a keyed job can have. */
    if ((o->on_conflict != PGJOBQ_ON_CONFLICT_SKIP || j->unique_for_ms != 0) && (o->after || o->tags))
        return pgjobq__seterr(c, PGJOBQ_EINVAL,
                              "%s: on_conflict and unique_for go with a unique key, which a job with parents or tags "
                              "cannot have",
                              label);
    return PGJOBQ_OK;
}

/* The distinct run_at texts of jobs[0..n), each with the index of its first job (a batch shares its
 * run_at, as a rule: a run of equal texts counts once), into *texts and *which (malloc'd; *k of them).
 * -1 when out of memory. */
static int run_at_texts(const pgjobq_job_spec *jobs, size_t n, const char ***texts, size_t **which, size_t *k)
{
    *k = 0;
    *texts = malloc((n ? n : 1) * sizeof **texts);
    *which = malloc((n ? n : 1) * sizeof **which);
    if (*texts == NULL || *which == NULL) {
        free(*texts);
        free(*which);
        *texts = NULL;
        *which = NULL;
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const char *t = jobs[i].opts.run_at;
        if (t == NULL || (*k > 0 && strcmp((*texts)[*k - 1], t) == 0))
            continue;
        (*texts)[*k] = t;
        (*which)[(*k)++] = i;
    }
    return 0;
}

/* Puts "job N: run_at: " (or "job: run_at: ", label_batch 0) before the client's message, in place
 * of the statement's name ("enqueue: "). */
static int label_run_at_error(pgjobq_client *c, int rc, int label_batch, size_t job)
{
    char keep[sizeof c->errmsg], label[48];
    const char *m = keep, *colon;

    memcpy(keep, c->errmsg, sizeof keep);
    if ((colon = strstr(keep, ": ")) != NULL && (size_t)(colon - keep) < 24)
        m = colon + 2;
    if (label_batch)
        snprintf(label, sizeof label, "job %zu", job);
    else
        snprintf(label, sizeof label, "job");
    return pgjobq__seterr(c, rc, "%s: run_at: %s", label, m);
}

/*
 * A batch's statement failed with a data exception (SQLSTATE class 22): if a run_at text is what the
 * database could not read (a date, a time zone), names its job ("job 17: run_at: ..."; "job: ..."
 * for one job, label_batch 0).  The texts are asked one at a time, and only now, on the error path:
 * on the client's own idle connection, or not at all when the jobs share one text (a date, time or
 * time zone SQLSTATE is then that text's).  In a caller's transaction, which the failure has
 * aborted, a batch of several texts is left unnamed.  Returns rc.
 */
static int name_bad_run_at(pgjobq_client *c, const pgjobq_job_spec *jobs, size_t n, int label_batch, int rc)
{
    static const Oid types[] = {OID_TEXT};
    const char **texts = NULL, *state = c->sqlstate;
    char first[sizeof c->errmsg], first_state[sizeof c->sqlstate];
    size_t *which = NULL, k = 0;
    int read_error = strcmp(state, "22007") == 0 || strcmp(state, "22008") == 0 || strcmp(state, "22009") == 0;

    if (rc == PGJOBQ_OK || strncmp(state, "22", 2) != 0 || run_at_texts(jobs, n, &texts, &which, &k) != 0)
        return rc;
    if (k == 1 && read_error)
        rc = label_run_at_error(c, rc, label_batch, which[0]);
    else if (k > 0 && c->owned && PQtransactionStatus(c->conn) == PQTRANS_IDLE) {
        memcpy(first, c->errmsg, sizeof first);
        memcpy(first_state, c->sqlstate, sizeof first_state);
        size_t bad = 0;
        for (; bad < k; bad++) {
            const char *values[1] = {texts[bad]};
            pgjobq__stmt st = {"run_at", "SELECT $1::pg_catalog.timestamptz", 1, types, values, NULL, NULL, 0};
            PGresult *r = NULL;
            int one = pgjobq__exec(c, &st, &r);
            PQclear(r);
            if (one != PGJOBQ_OK) {
                if (one != PGJOBQ_ECONN)
                    rc = label_run_at_error(c, one, label_batch, which[bad]);
                break;
            }
        }
        if (bad == k) { /* every text reads: the error was another's */
            memcpy(c->errmsg, first, sizeof first);
            memcpy(c->sqlstate, first_state, sizeof first_state);
        }
    }
    free(texts);
    free(which);
    return rc;
}

/* The fields that took the place of pgjobq_reserved[4] left the size as it was. */
_Static_assert(sizeof(pgjobq_enqueue_opts) == offsetof(pgjobq_enqueue_opts, after) + 4 * sizeof(uint64_t),
               "pgjobq_enqueue_opts changed size");
_Static_assert(sizeof(pgjobq_job_spec) == offsetof(pgjobq_job_spec, unique_for_ms) + 4 * sizeof(uint64_t),
               "pgjobq_job_spec changed size");
_Static_assert(sizeof(pgjobq_job) == offsetof(pgjobq_job, tags) + 4 * sizeof(uint64_t), "pgjobq_job changed size");
_Static_assert(sizeof(pgjobq_list_opts) == offsetof(pgjobq_list_opts, tag) + 4 * sizeof(uint64_t),
               "pgjobq_list_opts changed size");
_Static_assert(sizeof(pgjobq_worker_opts) == offsetof(pgjobq_worker_opts, log_arg) + 5 * sizeof(uint64_t),
               "pgjobq_worker_opts changed size");

static int spec_needs_graph(const pgjobq_job_spec *j)
{
    return j->opts.after != NULL || j->opts.tags != NULL;
}

/* The jobs as the graph pgjobq.enqueue_graph takes, every field given, for the database to judge. */
static void specs_to_graph(pgjobq__buf *b, const pgjobq_job_spec *jobs, size_t n)
{
    char num[64];
    pgjobq__buf_put(b, "[", 1);
    for (size_t i = 0; i < n; i++) {
        const pgjobq_enqueue_opts *o = &jobs[i].opts;
        const char *payload = jobs[i].payload ? jobs[i].payload : "{}";
        pgjobq__buf_put(b, i ? ",{\"payload\":" : "{\"payload\":", i ? 12 : 11);
        pgjobq__buf_put(b, payload, strlen(payload));
        if (o->queue) {
            pgjobq__json_key(b, "queue");
            pgjobq__json_string(b, o->queue);
        }
        if (o->kind) {
            pgjobq__json_key(b, "kind");
            pgjobq__json_string(b, o->kind);
        }
        pgjobq__json_key(b, "priority");
        pgjobq__buf_put(b, num, (size_t)snprintf(num, sizeof num, "%d", o->priority));
        if (o->max_attempts) {
            pgjobq__json_key(b, "max_attempts");
            pgjobq__buf_put(b, num, (size_t)snprintf(num, sizeof num, "%d", o->max_attempts));
        }
        if (o->concurrency_key) {
            pgjobq__json_key(b, "concurrency_key");
            pgjobq__json_string(b, o->concurrency_key);
        }
        if (o->route_key) {
            pgjobq__json_key(b, "route_key");
            pgjobq__json_string(b, o->route_key);
        }
        if (o->unique_key) { /* which the graph refuses: its rule is the database's */
            pgjobq__json_key(b, "unique_key");
            pgjobq__json_string(b, o->unique_key);
        }
        if (o->run_at) {
            pgjobq__json_key(b, "run_at");
            pgjobq__json_string(b, o->run_at);
        }
        if (jobs[i].expires_at) {
            pgjobq__json_key(b, "expires_at");
            pgjobq__json_string(b, jobs[i].expires_at);
        }
        if (jobs[i].traceparent) {
            pgjobq__json_key(b, "traceparent");
            pgjobq__json_string(b, jobs[i].traceparent);
        }
        if (jobs[i].expire_after_ms) {
            pgjobq__json_key(b, "expire_after");
            pgjobq__buf_put(b, num,
                            (size_t)snprintf(num, sizeof num, "%lld.%03lld",
                                             (long long)(jobs[i].expire_after_ms / 1000),
                                             (long long)(jobs[i].expire_after_ms % 1000)));
        }
        if (o->delay_ms) {
            uint64_t ms = o->delay_ms < 0 ? 0 - (uint64_t)o->delay_ms : (uint64_t)o->delay_ms;
            pgjobq__json_key(b, "delay");
            pgjobq__buf_put(b, num,
                            (size_t)snprintf(num, sizeof num, "%s%llu.%03llu", o->delay_ms < 0 ? "-" : "",
                                             (unsigned long long)(ms / 1000), (unsigned long long)(ms % 1000)));
        }
        if (o->tags) {
            pgjobq__json_key(b, "tags");
            pgjobq__buf_put(b, "[", 1);
            for (size_t k = 0; o->tags[k]; k++) {
                if (k)
                    pgjobq__buf_put(b, ",", 1);
                pgjobq__json_string(b, o->tags[k]);
            }
            pgjobq__buf_put(b, "]", 1);
        }
        if (o->after) {
            pgjobq__json_key(b, "after");
            pgjobq__buf_put(b, "[", 1);
            for (size_t k = 0; o->after[k]; k++)
                pgjobq__buf_put(b, num,
                                (size_t)snprintf(num, sizeof num, "%s%lld", k ? "," : "", (long long)o->after[k]));
            pgjobq__buf_put(b, "]", 1);
            pgjobq__json_key(b, "on_parent_failure");
            pgjobq__json_string(b, o->on_parent_failure == PGJOBQ_PARENT_FAILURE_RUN ? "run" : "cancel");
        }
        pgjobq__buf_put(b, "}", 1);
    }
    pgjobq__buf_put(b, "]", 1);
}

/* Runs pgjobq.enqueue_graph(graph); the ids in input order into ids_out (at most max_ids). */
static int graph_call(pgjobq_client *c, const char *graph, size_t len, int64_t *ids_out, size_t max_ids,
                      size_t *n_out)
{
    static const Oid types[] = {OID_TEXT};
    const char *values[1] = {graph};
    int lengths[1] = {(int)len}, formats[1] = {0};
    PGresult *r;
    int rc;

    if (len > INT32_MAX)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "enqueue graph: the graph is larger than 2 GiB");
    pgjobq__stmt st = {"enqueue graph",
                       "SELECT g.id FROM pgjobq.enqueue_graph($1::pg_catalog.jsonb) AS g",
                       1,
                       types,
                       values,
                       lengths,
                       formats,
                       0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    size_t n = (size_t)PQntuples(r);
    for (size_t i = 0; ids_out && i < n && i < max_ids; i++)
        ids_out[i] = strtoll(PQgetvalue(r, (int)i, 0), NULL, 10);
    if (n_out)
        *n_out = n;
    PQclear(r);
    return PGJOBQ_OK;
}

int pgjobq_enqueue_graph(pgjobq_client *c, const char *graph_json, int64_t *ids_out, size_t max_ids, size_t *n_out)
{
    char why[128];
    int rc;

    if (n_out)
        *n_out = 0;
    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    if ((rc = pgjobq__require_schema(c)) != PGJOBQ_OK)
        return rc;
    if (graph_json == NULL)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "enqueue graph: no graph given");
    if (pgjobq_json_check(graph_json, strlen(graph_json), why, sizeof why) != PGJOBQ_OK)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "enqueue graph: %s", why);
    return graph_call(c, graph_json, strlen(graph_json), ids_out, max_ids, n_out);
}

/* Jobs with parents or tags go through pgjobq.enqueue_graph, as a graph without edges of its own. */
static int enqueue_as_graph(pgjobq_client *c, const pgjobq_job_spec *jobs, size_t n, int64_t *ids_out)
{
    pgjobq__buf b = {0};
    int rc;

    specs_to_graph(&b, jobs, n);
    pgjobq__buf_put(&b, "", 1); /* sent as text: NUL-terminated */
    if (b.oom)
        rc = pgjobq__seterr(c, PGJOBQ_ENOMEM, "enqueue: out of memory building the graph");
    else
        rc = graph_call(c, b.data, b.len - 1, ids_out, n, NULL);
    pgjobq__buf_free(&b);
    return rc;
}

/* The parallel arrays pgjobq.enqueue_many() takes, then the two more of pgjobq.enqueue_keyed() (the
 * unique keys' conflict modes and windows), then the expiries and trace contexts both take last, then notify.  An array
 * whose elements would all be NULL is sent as a NULL parameter instead.  enqueue_many's tenth parameter, notify, comes
 * before its last array, the routing keys (A_NOTIFY, A_ROUTE); see the statements in insert_batch. */
enum { A_QUEUE, A_KIND, A_PAYLOAD, A_PRIORITY, A_RUN_AT, A_DELAY, A_MAX_ATTEMPTS, A_UNIQUE, A_KEY, A_ROUTE,
       A_CONFLICT, A_UNIQUE_FOR, A_EXPIRES_AT, A_EXPIRE_AFTER, A_TRACEPARENT, A_COUNT };
enum { A_NOTIFY = A_COUNT };

static const Oid enqueue_types[A_COUNT + 1] = {OID_TEXT_ARRAY, OID_TEXT_ARRAY,     OID_JSONB_ARRAY, OID_INT2_ARRAY,
                                               OID_TEXT_ARRAY, OID_INTERVAL_ARRAY, OID_INT4_ARRAY,  OID_TEXT_ARRAY,
                                               OID_TEXT_ARRAY, OID_TEXT_ARRAY,     OID_TEXT_ARRAY,  OID_INTERVAL_ARRAY,
                                               OID_TEXT_ARRAY, OID_INTERVAL_ARRAY, OID_TEXT_ARRAY,  OID_BOOL};
static const Oid enqueue_elem[A_COUNT] = {OID_TEXT,     OID_TEXT,     OID_JSONB, OID_INT2,     OID_TEXT,
                                          OID_INTERVAL, OID_INT4,     OID_TEXT,  OID_TEXT,     OID_TEXT,
                                          OID_TEXT,     OID_INTERVAL, OID_TEXT,  OID_INTERVAL, OID_TEXT};

static const char *const conflict_names[] = {"skip", "replace", "keep"};

static int field_used(const pgjobq_job_spec *j, int f)
{
    switch (f) {
    case A_QUEUE: return j->opts.queue != NULL;
    case A_KIND: return j->opts.kind != NULL;
    case A_PAYLOAD: return j->payload != NULL;
    case A_PRIORITY: return j->opts.priority != 0;
    case A_RUN_AT: return j->opts.run_at != NULL;
    case A_DELAY: return j->opts.delay_ms != 0;
    case A_MAX_ATTEMPTS: return j->opts.max_attempts != 0;
    case A_UNIQUE: return j->opts.unique_key != NULL;
    case A_KEY: return j->opts.concurrency_key != NULL;
    case A_ROUTE: return j->opts.route_key != NULL;
    case A_CONFLICT: return j->opts.on_conflict != PGJOBQ_ON_CONFLICT_SKIP;
    case A_UNIQUE_FOR: return j->unique_for_ms != 0;
    case A_EXPIRES_AT: return j->expires_at != NULL;
    case A_EXPIRE_AFTER: return j->expire_after_ms != 0;
    case A_TRACEPARENT: return j->traceparent != NULL;
    }
    return 0;
}

static void field_add(pgjobq__array *a, const pgjobq_job_spec *j, int f)
{
    if (!field_used(j, f)) {
        pgjobq__array_null(a);
        return;
    }
    switch (f) {
    case A_QUEUE: pgjobq__array_text(a, j->opts.queue, strlen(j->opts.queue)); break;
    case A_KIND: pgjobq__array_text(a, j->opts.kind, strlen(j->opts.kind)); break;
    case A_PAYLOAD: pgjobq__array_jsonb(a, j->payload, strlen(j->payload)); break;
    case A_PRIORITY: pgjobq__array_int2(a, (int16_t)j->opts.priority); break;
    case A_RUN_AT: pgjobq__array_text(a, j->opts.run_at, strlen(j->opts.run_at)); break;
    case A_DELAY: pgjobq__array_interval_us(a, j->opts.delay_ms * 1000); break;
    case A_MAX_ATTEMPTS: pgjobq__array_int4(a, j->opts.max_attempts); break;
    case A_UNIQUE: pgjobq__array_text(a, j->opts.unique_key, strlen(j->opts.unique_key)); break;
    case A_KEY: pgjobq__array_text(a, j->opts.concurrency_key, strlen(j->opts.concurrency_key)); break;
    case A_ROUTE: pgjobq__array_text(a, j->opts.route_key, strlen(j->opts.route_key)); break;
    case A_CONFLICT: {
        const char *name = conflict_names[j->opts.on_conflict]; /* checked: check_spec */
        pgjobq__array_text(a, name, strlen(name));
        break;
    }
    case A_UNIQUE_FOR: pgjobq__array_interval_us(a, j->unique_for_ms * 1000); break;
    case A_EXPIRES_AT: pgjobq__array_text(a, j->expires_at, strlen(j->expires_at)); break;
    case A_EXPIRE_AFTER: pgjobq__array_interval_us(a, j->expire_after_ms * 1000); break;
    case A_TRACEPARENT: pgjobq__array_text(a, j->traceparent, strlen(j->traceparent)); break;
    }
}

/* The distinct queues of the jobs that may be due now (a delay is not; a run_at may be: the database
 * knows), as a text[] parameter in queues: how many, or -1 when out of memory.  A job without a queue
 * counts as default_queue; NULL: as a NULL element, which pgjobq.notify reads as the default queue. */
static int due_queues(const pgjobq_job_spec *jobs, size_t n, const char *default_queue, pgjobq__array *queues)
{
    const char **distinct = malloc((n ? n : 1) * sizeof *distinct);
    size_t ndistinct = 0;

    pgjobq__array_begin(queues, OID_TEXT);
    if (distinct == NULL)
        return -1;
    for (size_t i = 0; i < n; i++) {
        const char *queue = jobs[i].opts.queue ? jobs[i].opts.queue : default_queue;
        int seen = jobs[i].opts.delay_ms > 0;
        for (size_t k = ndistinct; k > 0 && !seen; k--) /* the latest first: batches come in runs */
            seen = distinct[k - 1] == queue || (queue && distinct[k - 1] && strcmp(distinct[k - 1], queue) == 0);
        if (seen)
            continue;
        distinct[ndistinct++] = queue;
        if (queue)
            pgjobq__array_text(queues, queue, strlen(queue));
        else
            pgjobq__array_null(queues);
    }
    free(distinct);
    return pgjobq__array_end(queues) != 0 || queues->buf.len > INT32_MAX ? -1 : (int)ndistinct;
}

/* Inserts a batch through pgjobq.enqueue_many(), or pgjobq.enqueue_keyed() when a job has a conflict mode
 * or a window; ids and dups (may be NULL) receive each job's id and PGJOBQ_ENQUEUED, PGJOBQ_HELD or
 * PGJOBQ_REPLACED, and *outcome the last job's (the only one's, for one job). */
static int insert_batch(pgjobq_client *c, const pgjobq_job_spec *jobs, size_t n, int64_t *ids, unsigned char *dups,
                        int *outcome)
{
    static const char plain_sql[] =
        "SELECT ord, id, duplicate::pg_catalog.int4 FROM pgjobq.enqueue_many($1, $2, $3, $4, "
        "$5::pg_catalog.timestamptz[], $6, $7, $8, $9, $16, $10, $13::pg_catalog.timestamptz[], $14, $15)";
    static const char keyed_sql[] =
        "SELECT ord, id, CASE outcome WHEN 'duplicate' THEN 1 WHEN 'replaced' THEN 2 ELSE 0 END::pg_catalog.int4"
        " FROM pgjobq.enqueue_keyed($1, $2, $3, $4, $5::pg_catalog.timestamptz[], $6, $7, $8, $11, $12, $9, $16, $10,"
        " $13::pg_catalog.timestamptz[], $14, $15)";
    int keyed = 0;
    pgjobq__array arrays[A_COUNT];
    const char *values[A_COUNT + 1];
    int lengths[A_COUNT + 1], formats[A_COUNT + 1];
    PGresult *r = NULL;
    int rc = PGJOBQ_OK;
    /* The library's own transaction (the statement's, on its idle connection) carries no
     * notification: it follows, pipelined; a caller's transaction notifies with its own commit. */
    int own_tx = c->owned && PQtransactionStatus(c->conn) == PQTRANS_IDLE;
    int ndue = 0;
    static const Oid notify_types[] = {OID_TEXT_ARRAY};
    pgjobq__array due;
    const char *notify_values[1];
    int notify_lengths[1], notify_formats[1] = {1};
    pgjobq__stmt notify = {"enqueue: notify", "SELECT pgjobq.notify($1)", 1, notify_types, notify_values,
                           notify_lengths, notify_formats, 0};

    memset(&due, 0, sizeof due);
    if (own_tx) {
        if ((ndue = due_queues(jobs, n, NULL, &due)) < 0) {
            pgjobq__buf_free(&due.buf);
            return pgjobq__seterr(c, PGJOBQ_ENOMEM, "enqueue: out of memory building the batch");
        }
        notify_values[0] = due.buf.data;
        notify_lengths[0] = (int)due.buf.len;
    }

    memset(arrays, 0, sizeof arrays);
    for (int f = 0; f < A_COUNT; f++) {
        /* The payload array is always sent: it carries the batch's size when every field is default. */
        int used = f == A_PAYLOAD;
        for (size_t i = 0; i < n && !used; i++)
            used = field_used(&jobs[i], f);
        values[f] = NULL;
        lengths[f] = 0;
        formats[f] = 1;
        if (!used)
            continue;
        keyed |= f == A_CONFLICT || f == A_UNIQUE_FOR;
        pgjobq__array_begin(&arrays[f], enqueue_elem[f]);
        for (size_t i = 0; i < n; i++)
            field_add(&arrays[f], &jobs[i], f);
        if (pgjobq__array_end(&arrays[f]) != 0 || arrays[f].buf.len > INT32_MAX) {
            rc = pgjobq__seterr(c, PGJOBQ_ENOMEM, "enqueue: out of memory building the batch");
            goto out;
        }
        values[f] = arrays[f].buf.data;
        lengths[f] = (int)arrays[f].buf.len;
    }

    values[A_NOTIFY] = own_tx ? "f" : "t";
    lengths[A_NOTIFY] = 0;
    formats[A_NOTIFY] = 0;
    pgjobq__stmt st = {"enqueue", keyed ? keyed_sql : plain_sql, A_COUNT + 1, enqueue_types, values, lengths, formats,
                       1};
    rc = pgjobq__exec_then(c, &st, ndue > 0 ? &notify : NULL, &r);
    if (rc != PGJOBQ_OK)
        goto out;
    if ((size_t)PQntuples(r) != n) {
        rc = pgjobq__seterr(c, PGJOBQ_EDB, "enqueue: the database returned %d rows for %zu jobs", PQntuples(r), n);
        goto out;
    }
    for (int row = 0; row < PQntuples(r); row++) {
        int32_t ord = pgjobq__get_int4(r, row, 0);
        if (ord < 1 || (size_t)ord > n) {
            rc = pgjobq__seterr(c, PGJOBQ_EDB, "enqueue: the database returned a bad row number %d", ord);
            goto out;
        }
        int32_t got = pgjobq__get_int4(r, row, 2);
        if (ids)
            ids[ord - 1] = pgjobq__get_int8(r, row, 1);
        if (dups)
            dups[ord - 1] = (unsigned char)got;
        *outcome = got;
    }
out:
    PQclear(r);
    pgjobq__buf_free(&due.buf);
    for (int f = 0; f < A_COUNT; f++)
        pgjobq__buf_free(&arrays[f].buf);
    return rc;
}

/* Batches of at least this many jobs go through COPY when they can: below it, the extra round trips
 * (ids, COPY, notify) cost more than the INSERT they save. */
#define COPY_MIN_JOBS 500

/* Whether this client's role may write jobs with COPY (INSERT on the columns COPY writes), and what
 * COPY writes for a field a job leaves out (the database's defaults, pgjobq.job_defaults); asked once
 * per client, so that a batch never fails on a privilege (which would abort a caller's transaction). */
static int copy_allowed(pgjobq_client *c)
{
    static const pgjobq__stmt st = {
        "check privileges",
        "SELECT (SELECT pg_catalog.bool_and(pg_catalog.has_column_privilege('pgjobq.jobs', a, 'INSERT'))"
        "          FROM pg_catalog.unnest(ARRAY['id', 'queue', 'kind', 'payload', 'priority', 'run_at',"
        "                                       'max_attempts']) a),"
        " d.queue, d.kind, d.payload::pg_catalog.text, d.priority, d.max_attempts FROM pgjobq.job_defaults() d",
        0, NULL, NULL, NULL, NULL, 0};
    PGresult *r;

    if (c->copy_state != 0)
        return c->copy_state == 1;
    c->copy_state = -1; /* also when the question fails: the batches then go through enqueue_many */
    if (pgjobq__exec(c, &st, &r) == PGJOBQ_OK) {
        const char *queue = PQgetvalue(r, 0, 1), *kind = PQgetvalue(r, 0, 2), *payload = PQgetvalue(r, 0, 3);
        /* Defaults COPY can write as they are (names need no escaping; the payload is escaped). */
        if (PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0 && pgjobq_name_check(queue) == PGJOBQ_OK &&
            pgjobq_name_check(kind) == PGJOBQ_OK && strlen(payload) < sizeof c->copy_defaults.payload) {
            strcpy(c->copy_defaults.queue, queue);
            strcpy(c->copy_defaults.kind, kind);
            strcpy(c->copy_defaults.payload, payload);
            c->copy_defaults.priority = atoi(PQgetvalue(r, 0, 4));
            c->copy_defaults.max_attempts = atoi(PQgetvalue(r, 0, 5));
            c->copy_state = 1;
        }
        PQclear(r);
    }
    pgjobq__clearerr(c);
    return c->copy_state == 1;
}

/* Whether a batch can be written with COPY: no unique key, no concurrency or route key, no delay, no
 * expiry or trace context, run_at on every job or none. */
static int copy_fits(const pgjobq_job_spec *jobs, size_t n)
{
    size_t with_run_at = 0;
    if (n < COPY_MIN_JOBS || n > 1000000) /* reserve_ids hands out at most 1,000,000 at once */
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (jobs[i].opts.unique_key || jobs[i].opts.concurrency_key || jobs[i].opts.route_key ||
            jobs[i].opts.delay_ms != 0 || jobs[i].opts.on_conflict != PGJOBQ_ON_CONFLICT_SKIP ||
            jobs[i].unique_for_ms != 0 || jobs[i].expires_at || jobs[i].expire_after_ms != 0 || jobs[i].traceparent)
            return 0;
        with_run_at += jobs[i].opts.run_at != NULL;
    }
    return with_run_at == 0 || with_run_at == n;
}

/* Appends s[0..len) to b in COPY's text format (backslash, tab, newline and carriage return escaped). */
static void copy_escaped(pgjobq__buf *b, const char *s, size_t len)
{
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        const char *esc = s[i] == '\\' ? "\\\\" : s[i] == '\t' ? "\\t" : s[i] == '\n' ? "\\n" : s[i] == '\r' ? "\\r" : NULL;
        if (esc == NULL)
            continue;
        pgjobq__buf_put(b, s + start, i - start);
        pgjobq__buf_put(b, esc, 2);
        start = i + 1;
    }
    pgjobq__buf_put(b, s + start, len - start);
}

/* Appends v in decimal (snprintf took a large share of the client's time in a COPY). */
static void copy_int(pgjobq__buf *b, int64_t v)
{
    char digits[24];
    int n = 0;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;

    do
        digits[sizeof digits - 1 - n++] = (char)('0' + u % 10);
    while ((u /= 10) != 0);
    if (v < 0)
        digits[sizeof digits - 1 - n++] = '-';
    pgjobq__buf_put(b, digits + sizeof digits - n, (size_t)n);
}

/* Sends what the buffer holds as COPY data and empties it; -1 when the connection fails. */
static int copy_flush(pgjobq_client *c, pgjobq__buf *b)
{
    int ok = b->len == 0 || PQputCopyData(c->conn, b->data, (int)b->len) == 1;
    b->len = 0;
    return ok ? 0 : -1;
}

/* Reserves n ids from the sequence into ids[0..n). */
static int reserve_ids(pgjobq_client *c, size_t n, int64_t *ids)
{
    static const Oid types[] = {OID_INT4};
    char n_s[24];
    const char *values[1] = {n_s};
    PGresult *r;
    int rc;

    snprintf(n_s, sizeof n_s, "%zu", n);
    pgjobq__stmt st = {"enqueue: reserve ids", "SELECT pgjobq.reserve_ids($1)", 1, types, values, NULL, NULL, 1};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    /* A one-dimensional int8 array: ndim, has-null, element type, dimension, lower bound, elements. */
    const char *p = PQgetvalue(r, 0, 0);
    size_t len = (size_t)PQgetlength(r, 0, 0);
    if (len < 20 || pgjobq__get_be32(p) != 1 || (size_t)pgjobq__get_be32(p + 12) != n || len != 20 + n * 12) {
        PQclear(r);
        return pgjobq__seterr(c, PGJOBQ_EDB, "enqueue: the database reserved an unexpected set of ids");
    }
    for (size_t i = 0; i < n; i++)
        ids[i] = (int64_t)pgjobq__get_be64(p + 20 + i * 12 + 4);
    PQclear(r);
    return PGJOBQ_OK;
}

/* COPY's error context says "line N": the job at index N - 1. */
static int copy_error(pgjobq_client *c, PGresult *r)
{
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    const char *primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    const char *context = PQresultErrorField(r, PG_DIAG_CONTEXT);
    const char *line = context ? strstr(context, "line ") : NULL;
    int code = pgjobq__code_from_sqlstate(state);

    snprintf(c->sqlstate, sizeof c->sqlstate, "%s", state ? state : "");
    if (line)
        return pgjobq__seterr(c, code, "enqueue: job %ld: %s (SQLSTATE %s); nothing was enqueued",
                              strtol(line + 5, NULL, 10) - 1, primary ? primary : "error", state ? state : "?");
    return pgjobq__seterr(c, code, "enqueue: %s (SQLSTATE %s); nothing was enqueued", primary ? primary : "error",
                          state ? state : "?");
}

/*
 * The statement a COPY starts with, inside its transaction: the transaction's id, before the rows'
 * ready_at is read (their claim key: sql/functions/claim.sql), and, when the jobs have a run_at, the
 * rule of when a job may run on the batch's distinct run_at texts (pgjobq.enqueue_when_check, each
 * named as enqueue_many would name its first job): before anything is written, in a statement that
 * is sent anyway.  It also asks whether a queue has a default expiry (pgjobq.expiry_defaults), which
 * COPY cannot give the rows: *defaults is then 1, and the batch goes through enqueue_many instead.
 */
static int copy_start(pgjobq_client *c, const pgjobq_job_spec *jobs, size_t n, int *defaults)
{
    static const Oid types[] = {OID_TEXT_ARRAY, OID_INT4_ARRAY};
    static const int formats[] = {1, 1};
    const char **texts = NULL;
    size_t *which = NULL, k = 0;
    pgjobq__array a[2];
    PGresult *r = NULL;
    int rc;

    *defaults = 0;
    if (jobs[0].opts.run_at == NULL) {
        rc = pgjobq__exec_sql(c, "enqueue", "SELECT pg_catalog.pg_current_xact_id(), pgjobq.expiry_defaults()", &r);
        if (rc == PGJOBQ_OK)
            *defaults = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 1), "t") == 0;
        PQclear(r);
        return rc;
    }
    if (run_at_texts(jobs, n, &texts, &which, &k) != 0)
        return pgjobq__seterr(c, PGJOBQ_ENOMEM, "enqueue: out of memory");
    memset(a, 0, sizeof a);
    pgjobq__array_begin(&a[0], OID_TEXT);
    pgjobq__array_begin(&a[1], OID_INT4);
    for (size_t i = 0; i < k; i++) {
        pgjobq__array_text(&a[0], texts[i], strlen(texts[i]));
        pgjobq__array_int4(&a[1], (int32_t)(which[i] + 1));
    }
    if (pgjobq__array_end(&a[0]) != 0 || pgjobq__array_end(&a[1]) != 0 || a[0].buf.len > INT32_MAX) {
        rc = pgjobq__seterr(c, PGJOBQ_ENOMEM, "enqueue: out of memory");
    } else {
        const char *values[2] = {a[0].buf.data, a[1].buf.data};
        int lengths[2] = {(int)a[0].buf.len, (int)a[1].buf.len};
        pgjobq__stmt st = {"enqueue",
                           "SELECT pg_catalog.pg_current_xact_id(),"
                           " pgjobq.enqueue_when_check($1::pg_catalog.timestamptz[], NULL, $2),"
                           " pgjobq.expiry_defaults()",
                           2,
                           types,
                           values,
                           lengths,
                           formats,
                           0};
        rc = pgjobq__exec(c, &st, &r);
        if (rc == PGJOBQ_OK)
            *defaults = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 2), "t") == 0;
        PQclear(r);
    }
    pgjobq__buf_free(&a[0].buf);
    pgjobq__buf_free(&a[1].buf);
    free(texts);
    free(which);
    return rc;
}

/* Writes the batch with COPY.  The jobs have been checked (check_spec, copy_fits, copy_allowed).  When
 * a queue has a default expiry (copy_start) it writes nothing and sets *not_copied: the caller inserts
 * the batch through enqueue_many, in the same transaction when it is the caller's. */
static int copy_batch(pgjobq_client *c, const pgjobq_job_spec *jobs, size_t n, int64_t *ids_out, int *not_copied)
{
    static const Oid after_types[] = {OID_TEXT_ARRAY, OID_TEXT_ARRAY, OID_INT2_ARRAY};
    int own_tx = c->owned && PQtransactionStatus(c->conn) == PQTRANS_IDLE;
    int with_run_at = jobs[0].opts.run_at != NULL, rc;
    /* Without ids_out the identity column numbers the rows itself. */
    int64_t *ids = ids_out;
    const pgjobq__job_defaults *dflt = &c->copy_defaults;
    pgjobq__buf data = {0};
    pgjobq__array queues, level_queues, level_priorities;
    const pgjobq_job_spec **levels = malloc(n * sizeof *levels); /* a job of each (queue, priority) */
    size_t nlevels = 0;
    PGresult *r = NULL;

    static const char *const copy_sql[2][2] = {
        {"COPY pgjobq.jobs (queue, kind, payload, priority, max_attempts) FROM STDIN",
         "COPY pgjobq.jobs (queue, kind, payload, priority, max_attempts, run_at) FROM STDIN"},
        {"COPY pgjobq.jobs (id, queue, kind, payload, priority, max_attempts) FROM STDIN",
         "COPY pgjobq.jobs (id, queue, kind, payload, priority, max_attempts, run_at) FROM STDIN"}};

    memset(&queues, 0, sizeof queues);
    memset(&level_queues, 0, sizeof level_queues);
    memset(&level_priorities, 0, sizeof level_priorities);
    if (levels == NULL)
        return pgjobq__seterr(c, PGJOBQ_ENOMEM, "enqueue: out of memory");
    if (own_tx && (rc = pgjobq__exec_sql(c, "enqueue: BEGIN", "BEGIN", NULL)) != PGJOBQ_OK)
        goto out;
    if (ids && (rc = reserve_ids(c, n, ids)) != PGJOBQ_OK)
        goto out;
    if ((rc = copy_start(c, jobs, n, not_copied)) != PGJOBQ_OK)
        goto out;
    if (*not_copied) {
        if (own_tx)
            rc = pgjobq__exec_sql(c, "enqueue: ROLLBACK", "ROLLBACK", NULL);
        goto out;
    }

    r = PQexec(c->conn, copy_sql[ids != NULL][with_run_at]);
    if (PQresultStatus(r) != PGRES_COPY_IN) {
        rc = PQstatus(c->conn) == CONNECTION_OK ? copy_error(c, r)
                                                : pgjobq__seterr_conn(c, PGJOBQ_ECONN, "enqueue");
        goto out;
    }
    PQclear(r);
    r = NULL;

    /* The rows, sent 64 KiB at a time while the next are built (the server parses as the client
     * writes), the distinct queues to notify and the distinct (queue, priority) levels to record. */
    pgjobq__array_begin(&level_queues, OID_TEXT);
    pgjobq__array_begin(&level_priorities, OID_INT2);
    for (size_t i = 0; i < n; i++) {
        const pgjobq_job_spec *j = &jobs[i];
        const char *queue = j->opts.queue ? j->opts.queue : dflt->queue,
                   *kind = j->opts.kind ? j->opts.kind : dflt->kind;
        const char *payload = j->payload ? j->payload : dflt->payload;
        int priority = j->opts.priority ? j->opts.priority : dflt->priority, seen = 0;
        for (size_t k = nlevels; k > 0 && !seen; k--) {
            const char *q = levels[k - 1]->opts.queue ? levels[k - 1]->opts.queue : dflt->queue;
            seen = levels[k - 1]->opts.priority == j->opts.priority && (q == queue || strcmp(q, queue) == 0);
        }
        if (!seen) {
            levels[nlevels++] = j;
            pgjobq__array_text(&level_queues, queue, strlen(queue));
            pgjobq__array_int2(&level_priorities, (int16_t)priority);
        }
        if (ids) {
            copy_int(&data, ids[i]);
            pgjobq__buf_put(&data, "\t", 1);
        }
        pgjobq__buf_put(&data, queue, strlen(queue)); /* names need no escaping (check_spec, copy_allowed) */
        pgjobq__buf_put(&data, "\t", 1);
        pgjobq__buf_put(&data, kind, strlen(kind));
        pgjobq__buf_put(&data, "\t", 1);
        copy_escaped(&data, payload, strlen(payload));
        pgjobq__buf_put(&data, "\t", 1);
        copy_int(&data, priority);
        pgjobq__buf_put(&data, "\t", 1);
        copy_int(&data, j->opts.max_attempts ? j->opts.max_attempts : dflt->max_attempts);
        if (with_run_at) {
            pgjobq__buf_put(&data, "\t", 1);
            copy_escaped(&data, j->opts.run_at, strlen(j->opts.run_at));
        }
        pgjobq__buf_put(&data, "\n", 1);
        if (data.oom)
            break;
        if (data.len >= 65536 && copy_flush(c, &data) != 0)
            break;
    }
    if (data.oom || due_queues(jobs, n, dflt->queue, &queues) < 0 || pgjobq__array_end(&level_queues) != 0 ||
        pgjobq__array_end(&level_priorities) != 0) {
        /* Abandon the COPY: nothing of it is written. */
        PQputCopyEnd(c->conn, "out of memory");
        while ((r = PQgetResult(c->conn)) != NULL)
            PQclear(r);
        rc = pgjobq__seterr(c, PGJOBQ_ENOMEM, "enqueue: out of memory building the batch");
        goto out;
    }
    if (copy_flush(c, &data) != 0 || PQputCopyEnd(c->conn, NULL) != 1) {
        rc = pgjobq__seterr_conn(c, PGJOBQ_ECONN, "enqueue");
        goto out;
    }
    r = PQgetResult(c->conn);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        rc = PQstatus(c->conn) == CONNECTION_OK ? copy_error(c, r)
                                                : pgjobq__seterr_conn(c, PGJOBQ_ECONN, "enqueue");
        goto out;
    }
    PQclear(r);
    while ((r = PQgetResult(c->conn)) != NULL) /* the end of the COPY command */
        PQclear(r);

    /* One notification per queue, delivered when the transaction commits (a batch of this size
     * commits seldom), and the levels the claims visit. */
    const char *values[3] = {queues.buf.data, level_queues.buf.data, level_priorities.buf.data};
    int lengths[3] = {(int)queues.buf.len, (int)level_queues.buf.len, (int)level_priorities.buf.len},
        formats[3] = {1, 1, 1};
    pgjobq__stmt st = {"enqueue: notify", "SELECT pgjobq.notify($1), pgjobq.levels_add($2, $3)", 3, after_types,
                       values, lengths, formats, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        goto out;
    PQclear(r);
    r = NULL;
    if (own_tx && (rc = pgjobq__exec_sql(c, "enqueue: COMMIT", "COMMIT", NULL)) != PGJOBQ_OK)
        goto out;
out:
    PQclear(r);
    if (rc != PGJOBQ_OK && own_tx)
        pgjobq__rollback_quietly(c);
    pgjobq__buf_free(&data);
    pgjobq__buf_free(&queues.buf);
    pgjobq__buf_free(&level_queues.buf);
    pgjobq__buf_free(&level_priorities.buf);
    free(levels);
    return rc;
}

int pgjobq_enqueue_many(pgjobq_client *c, const pgjobq_job_spec *jobs, size_t n, int64_t *ids_out,
                        unsigned char *dup_out)
{
    char label[32];
    int rc, outcome = PGJOBQ_ENQUEUED;

    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    if ((rc = pgjobq__require_schema(c)) != PGJOBQ_OK)
        return rc;
    if (n == 0)
        return PGJOBQ_OK;
    if (jobs == NULL)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "enqueue: no jobs given");
    if (n > INT32_MAX)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "enqueue: %zu jobs is too many for one batch", n);
    for (size_t i = 0; i < n; i++) {
        snprintf(label, sizeof label, "job %zu", i);
        if ((rc = check_spec(c, label, &jobs[i])) != PGJOBQ_OK)
            return rc;
    }
    for (size_t i = 0; i < n; i++) {
        if (spec_needs_graph(&jobs[i])) {
            if (dup_out)
                memset(dup_out, 0, n); /* no unique keys in a graph */
            return enqueue_as_graph(c, jobs, n, ids_out);
        }
    }
    int not_copied = 1;
    if (copy_fits(jobs, n) && copy_allowed(c)) {
        if (dup_out)
            memset(dup_out, 0, n); /* no unique keys: nothing can be a duplicate */
        rc = copy_batch(c, jobs, n, ids_out, &not_copied);
    }
    if (not_copied && rc == PGJOBQ_OK)
        rc = insert_batch(c, jobs, n, ids_out, dup_out, &outcome);
    return name_bad_run_at(c, jobs, n, 1, rc);
}

int pgjobq_enqueue_batch(pgjobq_client *c, const pgjobq_job_spec *jobs, size_t n, int64_t *ids_out,
                         unsigned char *dup_out)
{
    return pgjobq_enqueue_many(c, jobs, n, ids_out, dup_out);
}

/* One job: pgjobq_enqueue's and pgjobq_enqueue_spec's. */
static int enqueue_one(pgjobq_client *c, const pgjobq_job_spec *spec, int64_t *id_out, int *outcome_out)
{
    int64_t id = 0;
    int rc, outcome = PGJOBQ_ENQUEUED;

    if (id_out)
        *id_out = 0;
    if (outcome_out)
        *outcome_out = PGJOBQ_ENQUEUED;
    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    if ((rc = pgjobq__require_schema(c)) != PGJOBQ_OK)
        return rc;
    if ((rc = check_spec(c, "job", spec)) != PGJOBQ_OK)
        return rc;
    if (spec_needs_graph(spec))
        rc = enqueue_as_graph(c, spec, 1, &id);
    else
        rc = name_bad_run_at(c, spec, 1, 0, insert_batch(c, spec, 1, &id, NULL, &outcome));
    if (rc != PGJOBQ_OK)
        return rc;
    if (id_out)
        *id_out = id;
    if (outcome_out)
        *outcome_out = outcome;
    if (outcome == PGJOBQ_HELD)
        return pgjobq__seterr(c, PGJOBQ_EDUPLICATE, "job %lld already holds unique key \"%.100s\"", (long long)id,
                              spec->opts.unique_key);
    return PGJOBQ_OK;
}

int pgjobq_enqueue(pgjobq_client *c, const char *payload, const pgjobq_enqueue_opts *opts, int64_t *id_out)
{
    pgjobq_job_spec spec;

    memset(&spec, 0, sizeof spec);
    spec.payload = payload;
    if (opts)
        spec.opts = *opts;
    return enqueue_one(c, &spec, id_out, NULL);
}

int pgjobq_enqueue_spec(pgjobq_client *c, const pgjobq_job_spec *job, int64_t *id_out, int *outcome_out)
{
    if (job == NULL) {
        if (c)
            pgjobq__clearerr(c);
        return c ? pgjobq__seterr(c, PGJOBQ_EINVAL, "enqueue: no job given") : PGJOBQ_EINVAL;
    }
    return enqueue_one(c, job, id_out, outcome_out);
}
