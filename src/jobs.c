/*
 * jobs.c - claiming and the transitions of held jobs (complete, fail, extend, progress),
 * administration (cancel, retry, one job or by filter), reading jobs, statistics, health and
 * maintenance (rescue, prune).  Every transition is one call of the SQL function that owns it (under
 * sql/functions: claim.sql, transitions.sql, admin.sql, maintenance.sql, monitor.sql); this file only
 * marshals arguments and outcomes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The columns every job-reading query selects (PGJOBQ__JOB_COLUMNS, internal.h), in the order
 * jobs_from_result() reads them. */
enum {
    C_ID,
    C_QUEUE,
    C_KIND,
    C_PAYLOAD,
    C_PRIORITY,
    C_STATE,
    C_ATTEMPT,
    C_MAX_ATTEMPTS,
    C_LEASE_TOKEN,
    C_RUN_AT,
    C_CREATED_AT,
    C_STARTED_AT,
    C_FINISHED_AT,
    C_LEASE_UNTIL,
    C_WORKER_ID,
    C_RESULT,
    C_LAST_ERROR,
    C_UNIQUE_KEY,
    C_CANCEL_REQUESTED,
    C_TAGS,
    C_PROGRESS,
    C_PARENTS,
    C_CANCEL_REQUESTED_AT,
    C_TRACEPARENT,
    C_NCOLS
};

static const char *const state_names[] = {"queued", "running", "completed", "failed", "cancelled", "waiting"};

const char *pgjobq_state_name(pgjobq_state state)
{
    if ((int)state < 0 || (size_t)state >= sizeof state_names / sizeof state_names[0])
        return "unknown";
    return state_names[state];
}

int pgjobq_state_parse(const char *name, pgjobq_state *out)
{
    for (size_t i = 0; name && i < sizeof state_names / sizeof state_names[0]; i++) {
        if (strcmp(name, state_names[i]) == 0) {
            *out = (pgjobq_state)i;
            return PGJOBQ_OK;
        }
    }
    return PGJOBQ_EINVAL;
}

void pgjobq_jobs_free(pgjobq_job *jobs)
{
    free(jobs);
}

/* A job the library returns keeps its traceparent (pgjobq_job_traceparent) right after its kind's NUL,
 * as a string of its own ("" for none): pgjobq_job has no room left for a field (its size is the
 * stride of the arrays the library returns).  The bytes that kind and traceparent take together. */
static size_t kind_span(const char *kind)
{
    size_t k = strlen(kind) + 1;
    return k + strlen(kind + k) + 1;
}

const char *pgjobq_job_traceparent(const pgjobq_job *job)
{
    const char *t;

    if (job == NULL || job->kind == NULL)
        return NULL;
    t = job->kind + strlen(job->kind) + 1;
    return *t ? t : NULL;
}

/* Copies kind's column and then traceparent's ("" when NULL) to `strings`, as pgjobq_job_traceparent
 * reads them; kind must not be NULL.  Returns the end of what it copied. */
static char *put_kind(const PGresult *r, int row, int kind_col, int traceparent_col, const char **kind, char *strings)
{
    size_t len;
    const char *s = pgjobq__get_text(r, row, kind_col, &len);

    *kind = strings;
    memcpy(strings, s ? s : "", s ? len : 0);
    strings += s ? len : 0;
    *strings++ = '\0';
    s = pgjobq__get_text(r, row, traceparent_col, &len);
    memcpy(strings, s ? s : "", s ? len : 0);
    strings += s ? len : 0;
    *strings++ = '\0';
    return strings;
}

/* The bytes put_kind copies. */
static size_t kind_size(const PGresult *r, int row, int kind_col, int traceparent_col)
{
    size_t len, bytes = 2;

    if (pgjobq__get_text(r, row, kind_col, &len) != NULL)
        bytes += len;
    if (pgjobq__get_text(r, row, traceparent_col, &len) != NULL)
        bytes += len;
    return bytes;
}

/* Copies one job into its own allocation (struct and strings), released with pgjobq_jobs_free. */
pgjobq_job *pgjobq__job_dup(const pgjobq_job *j)
{
    const char *const *fields[] = {&j->queue,      &j->kind,       &j->payload, &j->worker_id, &j->result,
                                   &j->last_error, &j->unique_key, &j->tags,    &j->progress, &j->parents};
    size_t bytes = sizeof *j;
    pgjobq_job *copy;
    char *p;

    for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++)
        if (*fields[k])
            bytes += k == 1 ? kind_span(j->kind) : strlen(*fields[k]) + 1;
    copy = malloc(bytes);
    if (copy == NULL)
        return NULL;
    *copy = *j;
    p = (char *)(copy + 1);
    const char **dst[] = {&copy->queue,      &copy->kind,       &copy->payload, &copy->worker_id, &copy->result,
                          &copy->last_error, &copy->unique_key, &copy->tags,    &copy->progress, &copy->parents};
    for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++) {
        if (*fields[k] == NULL)
            continue;
        size_t len = k == 1 ? kind_span(*fields[k]) : strlen(*fields[k]) + 1;
        memcpy(p, *fields[k], len);
        *dst[k] = p;
        p += len;
    }
    return copy;
}

/* (C_KIND is read with C_TRACEPARENT: put_kind.) */
static const int text_cols[] = {C_QUEUE,      C_KIND,       C_PAYLOAD, C_WORKER_ID, C_RESULT,
                                C_LAST_ERROR, C_UNIQUE_KEY, C_TAGS,    C_PROGRESS, C_PARENTS};

/* Copies a result of PGJOBQ__JOB_COLUMNS rows into one allocation: the job structs, then their strings. */
int pgjobq__jobs_from_result(pgjobq_client *c, const PGresult *r, pgjobq_job **out, size_t *n_out)
{
    size_t n = (size_t)PQntuples(r), bytes, len;
    pgjobq_job *jobs;
    char *strings;

    *out = NULL;
    *n_out = 0;
    if (n == 0)
        return PGJOBQ_OK;
    if (PQnfields(r) != C_NCOLS)
        return pgjobq__seterr(c, PGJOBQ_EDB, "unexpected result shape (%d columns)", PQnfields(r));
    bytes = n * sizeof *jobs;
    for (size_t i = 0; i < n; i++) {
        bytes += kind_size(r, (int)i, C_KIND, C_TRACEPARENT);
        for (size_t k = 0; k < sizeof text_cols / sizeof text_cols[0]; k++)
            if (text_cols[k] != C_KIND && pgjobq__get_text(r, (int)i, text_cols[k], &len) != NULL)
                bytes += len + 1;
    }
    jobs = malloc(bytes);
    if (jobs == NULL)
        return pgjobq__seterr(c, PGJOBQ_ENOMEM, "out of memory reading %zu jobs", n);
    strings = (char *)(jobs + n);
    for (size_t i = 0; i < n; i++) {
        pgjobq_job *j = &jobs[i];
        int row = (int)i;
        const char *field[sizeof text_cols / sizeof text_cols[0]];
        pgjobq_state st = PGJOBQ_QUEUED;

        for (size_t k = 0; k < sizeof text_cols / sizeof text_cols[0]; k++) {
            const char *s = pgjobq__get_text(r, row, text_cols[k], &len);
            field[k] = NULL;
            if (text_cols[k] == C_KIND) {
                strings = put_kind(r, row, C_KIND, C_TRACEPARENT, &field[k], strings);
            } else if (s) {
                memcpy(strings, s, len);
                strings[len] = '\0';
                field[k] = strings;
                strings += len + 1;
            }
        }
        j->id = pgjobq__get_int8(r, row, C_ID);
        j->queue = field[0];
        j->kind = field[1];
        j->payload = field[2];
        j->worker_id = field[3];
        j->result = field[4];
        j->last_error = field[5];
        j->unique_key = field[6];
        j->tags = field[7];
        j->progress = field[8];
        j->parents = field[9];
        j->priority = pgjobq__get_int2(r, row, C_PRIORITY);
        {
            size_t sl;
            const char *s = pgjobq__get_text(r, row, C_STATE, &sl);
            char name[16];
            snprintf(name, sizeof name, "%.*s", (int)(sl < 15 ? sl : 15), s ? s : "");
            if (pgjobq_state_parse(name, &st) != PGJOBQ_OK)
                st = PGJOBQ_QUEUED;
        }
        j->state = st;
        j->attempt = pgjobq__get_int4(r, row, C_ATTEMPT);
        j->max_attempts = pgjobq__get_int4(r, row, C_MAX_ATTEMPTS);
        j->lease_token = pgjobq__get_int8(r, row, C_LEASE_TOKEN);
        j->run_at = pgjobq__get_time(r, row, C_RUN_AT);
        j->created_at = pgjobq__get_time(r, row, C_CREATED_AT);
        j->started_at = pgjobq__get_time(r, row, C_STARTED_AT);
        j->finished_at = pgjobq__get_time(r, row, C_FINISHED_AT);
        j->lease_until = pgjobq__get_time(r, row, C_LEASE_UNTIL);
        j->cancel_requested = pgjobq__get_bool(r, row, C_CANCEL_REQUESTED);
        j->cancel_requested_at = pgjobq__get_time(r, row, C_CANCEL_REQUESTED_AT);
    }
    *out = jobs;
    *n_out = n;
    return PGJOBQ_OK;
}

/* (The kind is read with the traceparent: put_kind.) */
static const int claimed_text_cols[] = {PGJOBQ__K_PAYLOAD, PGJOBQ__K_UNIQUE_KEY, PGJOBQ__K_LAST_ERROR,
                                        PGJOBQ__K_PARENTS};
#define NCLAIMED_TEXT (sizeof claimed_text_cols / sizeof claimed_text_cols[0])

size_t pgjobq__claimed_size(const PGresult *r, int row)
{
    size_t bytes = kind_size(r, row, PGJOBQ__K_KIND, PGJOBQ__K_TRACEPARENT), len;

    for (size_t k = 0; k < NCLAIMED_TEXT; k++)
        if (pgjobq__get_text(r, row, claimed_text_cols[k], &len) != NULL)
            bytes += len + 1;
    return bytes;
}

char *pgjobq__claimed_read(const PGresult *r, int row, pgjobq_job *j, char *strings)
{
    const char **dst[NCLAIMED_TEXT] = {&j->payload, &j->unique_key, &j->last_error, &j->parents};

    memset(j, 0, sizeof *j);
    strings = put_kind(r, row, PGJOBQ__K_KIND, PGJOBQ__K_TRACEPARENT, &j->kind, strings);
    for (size_t k = 0; k < NCLAIMED_TEXT; k++) {
        size_t len;
        const char *s = pgjobq__get_text(r, row, claimed_text_cols[k], &len);
        if (s == NULL)
            continue;
        memcpy(strings, s, len);
        strings[len] = '\0';
        *dst[k] = strings;
        strings += len + 1;
    }
    j->id = pgjobq__get_int8(r, row, PGJOBQ__K_ID);
    j->priority = pgjobq__get_int2(r, row, PGJOBQ__K_PRIORITY);
    j->state = PGJOBQ_RUNNING;
    j->attempt = pgjobq__get_int4(r, row, PGJOBQ__K_ATTEMPT);
    j->max_attempts = pgjobq__get_int4(r, row, PGJOBQ__K_MAX_ATTEMPTS);
    j->lease_token = pgjobq__get_int8(r, row, PGJOBQ__K_TOKEN);
    j->run_at = pgjobq__get_time(r, row, PGJOBQ__K_RUN_AT);
    j->created_at = pgjobq__get_time(r, row, PGJOBQ__K_CREATED_AT);
    j->started_at = pgjobq__get_time(r, row, PGJOBQ__K_STARTED_AT);
    j->finished_at = PGJOBQ_TIME_NONE;
    j->lease_until = pgjobq__get_time(r, row, PGJOBQ__K_LEASE_UNTIL);
    j->cancel_requested_at = PGJOBQ_TIME_NONE;
    return strings;
}

/* The jobs of a claim's result, in one allocation with their strings and the queue's and worker's
 * names they share. */
static int claimed_jobs(pgjobq_client *c, const PGresult *r, const char *queue, const char *worker_id,
                        pgjobq_job **out, size_t *n_out)
{
    size_t n = (size_t)PQntuples(r), bytes, qlen = strlen(queue), wlen = worker_id ? strlen(worker_id) : 0;
    pgjobq_job *jobs;
    char *strings, *q, *wid = NULL;

    if (n == 0)
        return PGJOBQ_OK;
    if (PQnfields(r) != PGJOBQ__K_NCOLS)
        return pgjobq__seterr(c, PGJOBQ_EDB, "claim: unexpected result shape (%d columns)", PQnfields(r));
    bytes = n * sizeof *jobs + qlen + 1 + (worker_id ? wlen + 1 : 0);
    for (size_t i = 0; i < n; i++)
        bytes += pgjobq__claimed_size(r, (int)i);
    jobs = malloc(bytes);
    if (jobs == NULL)
        return pgjobq__seterr(c, PGJOBQ_ENOMEM, "out of memory reading %zu jobs", n);
    q = (char *)(jobs + n);
    memcpy(q, queue, qlen + 1);
    strings = q + qlen + 1;
    if (worker_id) {
        wid = strings;
        memcpy(wid, worker_id, wlen + 1);
        strings += wlen + 1;
    }
    for (size_t i = 0; i < n; i++) {
        strings = pgjobq__claimed_read(r, (int)i, &jobs[i], strings);
        jobs[i].queue = q;
        jobs[i].worker_id = wid;
    }
    *out = jobs;
    *n_out = n;
    return PGJOBQ_OK;
}

/* Common preamble of the calls below. */
static int enter(pgjobq_client *c)
{
    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    return pgjobq__require_schema(c);
}

static int check_lease_ms(pgjobq_client *c, const char *what, int64_t ms)
{
    if (ms <= 0 || ms > INT64_C(31536000000)) /* one year */
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: lease must be between 1 ms and one year, not %lld ms", what,
                              (long long)ms);
    return PGJOBQ_OK;
}

int pgjobq_claim(pgjobq_client *c, const char *queue, int max_jobs, int64_t lease_ms, const char *worker_id,
                 pgjobq_job **jobs_out, size_t *n_out)
{
    static const Oid types[] = {OID_TEXT, OID_INT4, OID_INTERVAL, OID_TEXT};
    char max_s[16], lease_s[48];
    const char *values[4];
    PGresult *r;
    int rc;

    if (jobs_out)
        *jobs_out = NULL;
    if (n_out)
        *n_out = 0;
    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if (jobs_out == NULL || n_out == NULL)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "claim: jobs_out and n_out are required");
    if ((rc = pgjobq__check_name(c, "claim: queue", queue)) != PGJOBQ_OK)
        return rc;
    if (max_jobs < 1 || max_jobs > PGJOBQ_BATCH_MAX)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "claim: max_jobs must be between 1 and %d, not %d", PGJOBQ_BATCH_MAX,
                              max_jobs);
    if ((rc = check_lease_ms(c, "claim", lease_ms)) != PGJOBQ_OK)
        return rc;
    if (worker_id &&
        (worker_id[0] == '\0' || strlen(worker_id) > 255 || !pgjobq__utf8_valid(worker_id, strlen(worker_id))))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "claim: worker id must be 1 to 255 bytes of UTF-8");
    snprintf(max_s, sizeof max_s, "%d", max_jobs);
    pgjobq__ms_interval(lease_s, sizeof lease_s, lease_ms);
    values[0] = queue;
    values[1] = max_s;
    values[2] = lease_s;
    values[3] = worker_id;
    /* claim_next from every level's low-water mark (no cursor: each call is on its own), its jobs
     * without its other rows, in the documented order; the rest of a claimed job's fields are known. */
    pgjobq__stmt st = {"claim",
                       "SELECT " PGJOBQ__CLAIMED_COLUMNS
                       " FROM pgjobq.claim_next($1, $2, $3, $4) WHERE meta IS NULL ORDER BY priority, run_at, id",
                       4,
                       types,
                       values,
                       NULL,
                       NULL,
                       1};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    rc = claimed_jobs(c, r, queue, worker_id, jobs_out, n_out);
    PQclear(r);
    return rc;
}

pgjobq__outcome pgjobq__outcome_parse(const char *s, size_t len)
{
    static const struct {
        const char *name;
        pgjobq__outcome o;
    } names[] = {{"completed", PGJOBQ__O_COMPLETED}, {"queued", PGJOBQ__O_QUEUED},     {"failed", PGJOBQ__O_FAILED},
                 {"cancelled", PGJOBQ__O_CANCELLED}, {"lost", PGJOBQ__O_LOST},         {"extended", PGJOBQ__O_EXTENDED}};

    if (s == NULL)
        return PGJOBQ__O_UNKNOWN;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i].name) == len && memcmp(names[i].name, s, len) == 0)
            return names[i].o;
    return PGJOBQ__O_UNKNOWN;
}

/* Maps a transition's outcome text to a result code. */
static int outcome_code(pgjobq_client *c, const char *what, int64_t id, const char *outcome)
{
    pgjobq__outcome o = pgjobq__outcome_parse(outcome, strlen(outcome));
    if (o == PGJOBQ__O_LOST)
        return pgjobq__seterr(c, PGJOBQ_ELEASE,
                              "%s job %lld: lease lost (the job is no longer running under this lease token, "
                              "or the lease expired)",
                              what, (long long)id);
    if (o == PGJOBQ__O_CANCELLED)
        return pgjobq__seterr(c, PGJOBQ_ECANCELLED, "%s job %lld: the job was cancelled", what, (long long)id);
    return PGJOBQ_OK;
}

/* Builds the one-element id and token arrays the *_many functions take. */
static int id_token_arrays(pgjobq__array *ids, pgjobq__array *tokens, int64_t id, int64_t token)
{
    pgjobq__array_begin(ids, OID_INT8);
    pgjobq__array_int8(ids, id);
    pgjobq__array_begin(tokens, OID_INT8);
    pgjobq__array_int8(tokens, token);
    return pgjobq__array_end(ids) | pgjobq__array_end(tokens);
}

int pgjobq_job_complete(pgjobq_client *c, int64_t id, int64_t lease_token, const char *result)
{
    static const Oid types[] = {OID_INT8_ARRAY, OID_INT8_ARRAY, OID_JSONB_ARRAY};
    static const int formats[] = {1, 1, 1};
    pgjobq__array a[3];
    const char *values[3];
    int lengths[3];
    PGresult *r = NULL;
    int rc;

    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if (result && (rc = pgjobq__check_payload(c, "complete: result", result, strlen(result))) != PGJOBQ_OK)
        return rc;
    memset(a, 0, sizeof a);
    pgjobq__array_begin(&a[2], OID_JSONB);
    if (result)
        pgjobq__array_jsonb(&a[2], result, strlen(result));
    else
        pgjobq__array_null(&a[2]);
    if (id_token_arrays(&a[0], &a[1], id, lease_token) != 0 || pgjobq__array_end(&a[2]) != 0) {
        rc = pgjobq__seterr(c, PGJOBQ_ENOMEM, "complete: out of memory");
        goto out;
    }
    for (int k = 0; k < 3; k++) {
        values[k] = a[k].buf.data;
        lengths[k] = (int)a[k].buf.len;
    }
    pgjobq__stmt st = {
        "complete", "SELECT outcome FROM pgjobq.complete_many($1, $2, $3)", 3, types, values, lengths, formats, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        goto out;
    rc = PQntuples(r) == 1 ? outcome_code(c, "complete", id, PQgetvalue(r, 0, 0))
                           : pgjobq__seterr(c, PGJOBQ_EDB, "complete: unexpected result");
out:
    PQclear(r);
    for (int k = 0; k < 3; k++)
        pgjobq__buf_free(&a[k].buf);
    return rc;
}

int pgjobq_job_fail(pgjobq_client *c, int64_t id, int64_t lease_token, const char *error, int64_t retry_delay_ms,
                    int flags, pgjobq_state *state_out)
{
    static const Oid types[] = {OID_INT8_ARRAY, OID_INT8_ARRAY, OID_TEXT_ARRAY, OID_INTERVAL_ARRAY, OID_BOOL_ARRAY};
    static const int formats[] = {1, 1, 1, 1, 1};
    pgjobq__array a[5];
    const char *values[5];
    int lengths[5];
    PGresult *r = NULL;
    char *clean = NULL;
    int rc;

    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if (retry_delay_ms < 0 && retry_delay_ms != PGJOBQ_BACKOFF)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "fail: retry delay must not be negative (%lld ms)",
                              (long long)retry_delay_ms);
    if (retry_delay_ms > INT64_C(3155760000000))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "fail: retry delay of %lld ms is more than 100 years",
                              (long long)retry_delay_ms);
    /* The failure path must not fail on its own text: make it valid UTF-8 and cap it first. */
    clean = pgjobq__sanitize_text(error ? error : "", error ? strlen(error) : 0, PGJOBQ_ERROR_MAX, 0);
    if (clean == NULL)
        return pgjobq__seterr(c, PGJOBQ_ENOMEM, "fail: out of memory");
    memset(a, 0, sizeof a);
    pgjobq__array_begin(&a[2], OID_TEXT);
    pgjobq__array_text(&a[2], clean, strlen(clean));
    pgjobq__array_begin(&a[3], OID_INTERVAL);
    if (retry_delay_ms == PGJOBQ_BACKOFF)
        pgjobq__array_null(&a[3]);
    else
        pgjobq__array_interval_us(&a[3], retry_delay_ms * 1000);
    pgjobq__array_begin(&a[4], OID_BOOL);
    pgjobq__array_bool(&a[4], (flags & PGJOBQ_FAIL_PERMANENT) != 0);
    if (id_token_arrays(&a[0], &a[1], id, lease_token) != 0 || pgjobq__array_end(&a[2]) != 0 ||
        pgjobq__array_end(&a[3]) != 0 || pgjobq__array_end(&a[4]) != 0) {
        rc = pgjobq__seterr(c, PGJOBQ_ENOMEM, "fail: out of memory");
        goto out;
    }
    for (int k = 0; k < 5; k++) {
        values[k] = a[k].buf.data;
        lengths[k] = (int)a[k].buf.len;
    }
    pgjobq__stmt st = {
        "fail", "SELECT outcome FROM pgjobq.fail_many($1, $2, $3, $4, $5)", 5, types, values, lengths, formats, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        goto out;
    if (PQntuples(r) != 1) {
        rc = pgjobq__seterr(c, PGJOBQ_EDB, "fail: unexpected result");
        goto out;
    }
    rc = outcome_code(c, "fail", id, PQgetvalue(r, 0, 0));
    if (rc == PGJOBQ_OK && state_out) {
        pgjobq_state st_new;
        *state_out = pgjobq_state_parse(PQgetvalue(r, 0, 0), &st_new) == PGJOBQ_OK ? st_new : PGJOBQ_FAILED;
    }
out:
    PQclear(r);
    free(clean);
    for (int k = 0; k < 5; k++)
        pgjobq__buf_free(&a[k].buf);
    return rc;
}

int pgjobq_job_extend(pgjobq_client *c, int64_t id, int64_t lease_token, int64_t lease_ms)
{
    static const Oid types[] = {OID_INT8_ARRAY, OID_INT8_ARRAY, OID_INTERVAL};
    static const int formats[] = {1, 1, 0};
    pgjobq__array a[2];
    const char *values[3];
    int lengths[3];
    char lease_s[48];
    PGresult *r = NULL;
    int rc;

    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if ((rc = check_lease_ms(c, "extend", lease_ms)) != PGJOBQ_OK)
        return rc;
    memset(a, 0, sizeof a);
    if (id_token_arrays(&a[0], &a[1], id, lease_token) != 0) {
        rc = pgjobq__seterr(c, PGJOBQ_ENOMEM, "extend: out of memory");
        goto out;
    }
    pgjobq__ms_interval(lease_s, sizeof lease_s, lease_ms);
    values[0] = a[0].buf.data;
    lengths[0] = (int)a[0].buf.len;
    values[1] = a[1].buf.data;
    lengths[1] = (int)a[1].buf.len;
    values[2] = lease_s;
    lengths[2] = 0;
    pgjobq__stmt st = {
        "extend", "SELECT outcome FROM pgjobq.extend_many($1, $2, $3)", 3, types, values, lengths, formats, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        goto out;
    rc = PQntuples(r) == 1 ? outcome_code(c, "extend", id, PQgetvalue(r, 0, 0))
                           : pgjobq__seterr(c, PGJOBQ_EDB, "extend: unexpected result");
out:
    PQclear(r);
    pgjobq__buf_free(&a[0].buf);
    pgjobq__buf_free(&a[1].buf);
    return rc;
}

/* Runs `SELECT f($1)` for an id and returns its text outcome in buf. */
static int id_call(pgjobq_client *c, const char *what, const char *sql, int64_t id, char *buf, size_t size)
{
    static const Oid types[] = {OID_INT8};
    char id_s[24];
    const char *values[1] = {id_s};
    PGresult *r;
    int rc;

    snprintf(id_s, sizeof id_s, "%lld", (long long)id);
    pgjobq__stmt st = {what, sql, 1, types, values, NULL, NULL, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    snprintf(buf, size, "%s", PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
    return PGJOBQ_OK;
}

int pgjobq_job_cancel(pgjobq_client *c, int64_t id, pgjobq_state *state_out)
{
    char outcome[32];
    pgjobq_state st;
    int rc;

    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if ((rc = id_call(c, "cancel", "SELECT pgjobq.cancel($1)", id, outcome, sizeof outcome)) != PGJOBQ_OK)
        return rc;
    if (strcmp(outcome, "not_found") == 0)
        return pgjobq__seterr(c, PGJOBQ_ENOTFOUND, "cancel: no job %lld", (long long)id);
    if (strcmp(outcome, "cancelled") == 0) {
        if (state_out)
            *state_out = PGJOBQ_CANCELLED;
        return PGJOBQ_OK;
    }
    if (strcmp(outcome, "cancel_requested") == 0) {
        if (state_out)
            *state_out = PGJOBQ_RUNNING;
        return PGJOBQ_OK;
    }
    /* 'already_completed', 'already_failed' or 'already_cancelled'. */
    const char *final = strncmp(outcome, "already_", 8) == 0 ? outcome + 8 : outcome;
    if (state_out && pgjobq_state_parse(final, &st) == PGJOBQ_OK)
        *state_out = st;
    return pgjobq__seterr(c, PGJOBQ_ESTATE, "cancel: job %lld has already finished (%s)", (long long)id, final);
}

int pgjobq_job_retry(pgjobq_client *c, int64_t id)
{
    char outcome[32];
    int rc;

    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if ((rc = id_call(c, "retry", "SELECT pgjobq.retry($1)", id, outcome, sizeof outcome)) != PGJOBQ_OK)
        return rc;
    if (strcmp(outcome, "not_found") == 0)
        return pgjobq__seterr(c, PGJOBQ_ENOTFOUND, "retry: no job %lld", (long long)id);
    if (strcmp(outcome, "queued") != 0)
        return pgjobq__seterr(c, PGJOBQ_ESTATE,
                              "retry: job %lld is %s; a running job is retried by its worker, a waiting one runs "
                              "when its parents have completed",
                              (long long)id, outcome);
    return PGJOBQ_OK;
}

int pgjobq_job_skip(pgjobq_client *c, int64_t id)
{
    char outcome[32];
    int rc;

    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if ((rc = id_call(c, "skip", "SELECT pgjobq.sequence_skip($1)", id, outcome, sizeof outcome)) != PGJOBQ_OK)
        return rc;
    if (strcmp(outcome, "not_found") == 0)
        return pgjobq__seterr(c, PGJOBQ_ENOTFOUND, "skip: no job %lld", (long long)id);
    if (strcmp(outcome, "skipped") != 0)
        return pgjobq__seterr(c, PGJOBQ_ESTATE,
                              "skip: job %lld blocks no key (it did not fail for good in a strict-order queue, "
                              "or was retried or skipped already)",
                              (long long)id);
    return PGJOBQ_OK;
}

int pgjobq_job_retry_running(pgjobq_client *c, int64_t id, pgjobq_state *state_out)
{
    char outcome[32];
    int rc;

    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if ((rc = id_call(c, "retry running", "SELECT pgjobq.retry_running($1)", id, outcome, sizeof outcome)) != PGJOBQ_OK)
        return rc;
    if (strcmp(outcome, "not_found") == 0)
        return pgjobq__seterr(c, PGJOBQ_ENOTFOUND, "retry running: no job %lld", (long long)id);
    if (strcmp(outcome, "queued") == 0 || strcmp(outcome, "cancelled") == 0) {
        if (state_out)
            *state_out = outcome[0] == 'q' ? PGJOBQ_QUEUED : PGJOBQ_CANCELLED;
        return PGJOBQ_OK;
    }
    return pgjobq__seterr(c, PGJOBQ_ESTATE,
                          "retry running: job %lld is not running (retry runs a finished or "
                          "scheduled job again)",
                          (long long)id);
}

/* Checks a bulk filter against the states the call accepts (a bit per pgjobq_state) and renders its
 * parameters: queue, state, kind, since (an interval, or NULL) and the dry-run flag. */
static int filter_params(pgjobq_client *c, const char *what, const pgjobq_filter *f, unsigned accepted, int flags,
                         int known_flags, char *since, size_t since_size, const char *values[5])
{
    if (f == NULL)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: no filter", what);
    if (pgjobq_name_check(f->queue) != PGJOBQ_OK)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: invalid queue name \"%.80s\" (a letter, then letters, digits "
                                                "and _ . : -, at most 64)",
                              what, f->queue ? f->queue : "");
    if (f->kind && pgjobq_name_check(f->kind) != PGJOBQ_OK)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: invalid kind \"%.80s\" (a letter, then letters, digits "
                                                "and _ . : -, at most 64)",
                              what, f->kind);
    if ((unsigned)f->state > PGJOBQ_CANCELLED || !(accepted & (1u << f->state)))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: jobs in state %s cannot be chosen here", what,
                              pgjobq_state_name(f->state));
    if (f->since_ms < 0)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: since must be positive (0: any age), not %lld ms", what,
                              (long long)f->since_ms);
    if (flags & ~known_flags)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: unknown flags 0x%x", what, (unsigned)flags);
    snprintf(since, since_size, "%lld milliseconds", (long long)f->since_ms);
    values[0] = f->queue;
    values[1] = pgjobq_state_name(f->state);
    values[2] = f->kind;
    values[3] = f->since_ms > 0 ? since : NULL;
    values[4] = (flags & PGJOBQ_DRY_RUN) ? "true" : "false";
    return PGJOBQ_OK;
}

static const Oid filter_types[] = {OID_TEXT, OID_TEXT, OID_TEXT, OID_TEXT, OID_TEXT};

int pgjobq_retry_where(pgjobq_client *c, const pgjobq_filter *filter, int flags, int64_t *retried_out,
                       int64_t *skipped_out)
{
    const unsigned accepted = 1u << PGJOBQ_QUEUED | 1u << PGJOBQ_COMPLETED | 1u << PGJOBQ_FAILED |
                              1u << PGJOBQ_CANCELLED;
    static const Oid types[] = {OID_TEXT, OID_TEXT, OID_TEXT, OID_TEXT, OID_TEXT, OID_TEXT};
    const char *values[6];
    char since[48];
    PGresult *r;
    int rc;

    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if ((rc = filter_params(c, "retry", filter, accepted, flags, PGJOBQ_DRY_RUN | PGJOBQ_REDRIVE, since, sizeof since,
                            values)) != PGJOBQ_OK)
        return rc;
    values[5] = (flags & PGJOBQ_REDRIVE) ? "true" : "false";
    pgjobq__stmt st = {"retry",
                       "SELECT retried, skipped FROM pgjobq.retry_where($1, $2, $3, $4::interval, $5::boolean,"
                       " $6::boolean)",
                       6,
                       types,
                       values,
                       NULL,
                       NULL,
                       0};
    /* A unique key taken meanwhile is PGJOBQ_EDUPLICATE: the message says what happened; the code says
     * what to do: call again. */
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    if (PQntuples(r) != 1 || PQnfields(r) != 2) {
        PQclear(r);
        return pgjobq__seterr(c, PGJOBQ_EDB, "retry: unexpected result");
    }
    if (retried_out)
        *retried_out = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    if (skipped_out)
        *skipped_out = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    PQclear(r);
    return PGJOBQ_OK;
}

int pgjobq_cancel_where(pgjobq_client *c, const pgjobq_filter *filter, int flags, int64_t *count_out)
{
    const char *values[5];
    char since[48];
    PGresult *r;
    int rc;

    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if ((rc = filter_params(c, "cancel", filter, 1u << PGJOBQ_QUEUED | 1u << PGJOBQ_RUNNING, flags, PGJOBQ_DRY_RUN,
                            since, sizeof since, values)) != PGJOBQ_OK)
        return rc;
    pgjobq__stmt st = {"cancel", "SELECT pgjobq.cancel_where($1, $2, $3, $4::interval, $5::boolean)", 5,
                       filter_types, values, NULL, NULL, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    if (PQntuples(r) != 1 || PQnfields(r) != 1) {
        PQclear(r);
        return pgjobq__seterr(c, PGJOBQ_EDB, "cancel: unexpected result");
    }
    if (count_out)
        *count_out = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return PGJOBQ_OK;
}

int pgjobq_job_get(pgjobq_client *c, int64_t id, pgjobq_job **job_out)
{
    static const Oid types[] = {OID_INT8};
    char id_s[24];
    const char *values[1] = {id_s};
    size_t n;
    PGresult *r;
    int rc;

    if (job_out)
        *job_out = NULL;
    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if (job_out == NULL)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "get: job_out is required");
    snprintf(id_s, sizeof id_s, "%lld", (long long)id);
    /* (pgjobq.job_get: planned once per session; a statement over all_jobs plans every partition.) */
    pgjobq__stmt st = {"get job", "SELECT " PGJOBQ__JOB_COLUMNS " FROM pgjobq.job_get($1)", 1, types, values, NULL, NULL,
                       1};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    rc = pgjobq__jobs_from_result(c, r, job_out, &n);
    PQclear(r);
    if (rc == PGJOBQ_OK && n == 0)
        return pgjobq__seterr(c, PGJOBQ_ENOTFOUND, "no job %lld", (long long)id);
    return rc;
}

int pgjobq_job_parents(pgjobq_client *c, int64_t id, pgjobq_job **parents_out, size_t *n_out)
{
    static const Oid types[] = {OID_INT8};
    char id_s[24];
    const char *values[1] = {id_s};
    PGresult *r;
    int rc;

    if (parents_out)
        *parents_out = NULL;
    if (n_out)
        *n_out = 0;
    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if (parents_out == NULL || n_out == NULL)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "parents: parents_out and n_out are required");
    snprintf(id_s, sizeof id_s, "%lld", (long long)id);
    pgjobq__stmt st = {"parents",
                       "SELECT " PGJOBQ__JOB_COLUMNS " FROM pgjobq.all_jobs"
                       " WHERE id = ANY (ARRAY(SELECT p.id FROM pgjobq.parents($1) AS p)) ORDER BY id",
                       1,
                       types,
                       values,
                       NULL,
                       NULL,
                       1};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    rc = pgjobq__jobs_from_result(c, r, parents_out, n_out);
    PQclear(r);
    return rc;
}

int pgjobq_job_progress(pgjobq_client *c, int64_t id, int64_t lease_token, const char *json)
{
    static const Oid types[] = {OID_INT8, OID_INT8, OID_TEXT};
    char id_s[24], token_s[24], why[128];
    const char *values[3] = {id_s, token_s, json};
    PGresult *r;
    int rc;

    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if (json == NULL || strlen(json) > 8192)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "progress: give JSON text of at most 8 KiB");
    if (pgjobq_json_check(json, strlen(json), why, sizeof why) != PGJOBQ_OK)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "progress: %s", why);
    snprintf(id_s, sizeof id_s, "%lld", (long long)id);
    snprintf(token_s, sizeof token_s, "%lld", (long long)lease_token);
    pgjobq__stmt st = {"progress", "SELECT pgjobq.set_progress($1, $2, $3::pg_catalog.jsonb)", 3, types, values, NULL,
                       NULL, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    int written = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    if (!written)
        return pgjobq__seterr(c, PGJOBQ_ELEASE, "progress: job %lld is not running under lease %lld",
                              (long long)id, (long long)lease_token);
    return PGJOBQ_OK;
}

int pgjobq_job_list(pgjobq_client *c, const pgjobq_list_opts *opts, pgjobq_job **jobs_out, size_t *n_out)
{
    static const Oid types[] = {OID_TEXT, OID_TEXT, OID_INT8, OID_INT4, OID_TEXT};
    pgjobq_list_opts o = PGJOBQ_LIST_OPTS_INIT;
    char before_s[24], limit_s[16];
    const char *values[5];
    PGresult *r;
    int rc;

    if (jobs_out)
        *jobs_out = NULL;
    if (n_out)
        *n_out = 0;
    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if (jobs_out == NULL || n_out == NULL)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "list: jobs_out and n_out are required");
    if (opts)
        o = *opts;
    if (o.limit == 0)
        o.limit = 100;
    if (o.limit < 1 || o.limit > 100000)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "list: limit must be between 1 and 100000, not %d", o.limit);
    if (o.queue && (rc = pgjobq__check_name(c, "list: queue", o.queue)) != PGJOBQ_OK)
        return rc;
    if (o.state != -1 && (o.state < PGJOBQ_QUEUED || o.state > PGJOBQ_WAITING))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "list: unknown state %d", o.state);
    if (o.before_id < 0)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "list: before_id must not be negative");
    if (o.tag && (o.tag[0] == '\0' || strlen(o.tag) > 256 || !pgjobq__utf8_valid(o.tag, strlen(o.tag))))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "list: a tag is 1 to 64 characters of UTF-8");
    snprintf(before_s, sizeof before_s, "%lld", (long long)o.before_id);
    snprintf(limit_s, sizeof limit_s, "%d", o.limit);
    values[0] = o.queue;
    values[1] = o.state == -1 ? NULL : pgjobq_state_name((pgjobq_state)o.state);
    values[2] = before_s;
    values[3] = limit_s;
    values[4] = o.tag;
    /* An unnamed statement is planned with its actual values, so the NULL tests fold away and a filter
     * on queue and state can use the claim index. */
    pgjobq__stmt st = {"list jobs",
                       "SELECT " PGJOBQ__JOB_COLUMNS " FROM pgjobq.all_jobs"
                       " WHERE ($1::pg_catalog.text IS NULL OR queue = $1)"
                       "   AND ($2::pg_catalog.text IS NULL OR state = $2::pgjobq.job_state)"
                       "   AND ($3 = 0 OR id < $3)"
                       "   AND ($5::pg_catalog.text IS NULL OR tags OPERATOR(pg_catalog.@>) ARRAY[$5])"
                       " ORDER BY id DESC LIMIT $4",
                       5,
                       types,
                       values,
                       NULL,
                       NULL,
                       1};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    rc = pgjobq__jobs_from_result(c, r, jobs_out, n_out);
    PQclear(r);
    return rc;
}

void pgjobq_stats_free(pgjobq_stat *stats)
{
    free(stats);
}

int pgjobq_stats(pgjobq_client *c, pgjobq_stat **stats_out, size_t *n_out)
{
    pgjobq_stat *rows;
    size_t n, bytes;
    char *strings;
    PGresult *r;
    int rc;

    if (stats_out)
        *stats_out = NULL;
    if (n_out)
        *n_out = 0;
    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if (stats_out == NULL || n_out == NULL)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "stats: stats_out and n_out are required");
    pgjobq__stmt st = {"stats", "SELECT queue, state, jobs FROM pgjobq.stats()", 0, NULL, NULL, NULL, NULL, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    n = (size_t)PQntuples(r);
    bytes = n * sizeof *rows;
    for (size_t i = 0; i < n; i++)
        bytes += (size_t)PQgetlength(r, (int)i, 0) + 1;
    rows = n ? malloc(bytes) : NULL;
    if (n && rows == NULL) {
        PQclear(r);
        return pgjobq__seterr(c, PGJOBQ_ENOMEM, "stats: out of memory");
    }
    strings = (char *)(rows + n);
    for (size_t i = 0; i < n; i++) {
        size_t len = (size_t)PQgetlength(r, (int)i, 0);
        memcpy(strings, PQgetvalue(r, (int)i, 0), len + 1);
        rows[i].queue = strings;
        strings += len + 1;
        if (pgjobq_state_parse(PQgetvalue(r, (int)i, 1), &rows[i].state) != PGJOBQ_OK)
            rows[i].state = PGJOBQ_QUEUED;
        rows[i].jobs = strtoll(PQgetvalue(r, (int)i, 2), NULL, 10);
    }
    PQclear(r);
    *stats_out = rows;
    *n_out = n;
    return PGJOBQ_OK;
}

static void copy_text(char *dst, size_t size, const PGresult *r, int col)
{
    size_t len;
    const char *p = pgjobq__get_text(r, 0, col, &len);
    if (p == NULL)
        len = 0;
    if (len >= size) { /* cut at a character boundary: never half a UTF-8 sequence */
        len = size - 1;
        while (len > 0 && ((unsigned char)p[len] & 0xC0) == 0x80)
            len--;
    }
    if (len)
        memcpy(dst, p, len);
    dst[len] = '\0';
}

int pgjobq_health_get(pgjobq_client *c, pgjobq_health *out)
{
    PGresult *r;
    int rc;

    if (out) {
        memset(out, 0, sizeof *out);
        out->last_vacuum = out->holder_since = out->autovacuum_paused_since = PGJOBQ_TIME_NONE;
        out->horizon_age_ms = -1;
    }
    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if (out == NULL)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "health: out is required");
    pgjobq__stmt st = {"health",
                       "SELECT jobs_bytes, jobs_live, jobs_dead, vacuums, last_vacuum,"
                       " round(horizon_age_s * 1000)::int8, horizon_xids::int8, holder_kind, holder_pid::int8,"
                       " holder_application, holder_state, holder_since, holder_query, autovacuum_paused_since,"
                       " holder_role FROM pgjobq.health()",
                       0, NULL, NULL, NULL, NULL, 1};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    if (PQntuples(r) != 1 || PQnfields(r) != 15) {
        int n = PQntuples(r);
        PQclear(r);
        return pgjobq__seterr(c, PGJOBQ_EDB, "health: pgjobq.health() returned %d rows, not 1", n);
    }
    out->jobs_bytes = pgjobq__get_int8(r, 0, 0);
    out->jobs_live = pgjobq__get_int8(r, 0, 1);
    out->jobs_dead = pgjobq__get_int8(r, 0, 2);
    out->vacuums = pgjobq__get_int8(r, 0, 3);
    out->last_vacuum = pgjobq__get_time(r, 0, 4);
    out->autovacuum_paused_since = pgjobq__get_time(r, 0, 13);
    if (!PQgetisnull(r, 0, 7)) {
        out->horizon_age_ms = PQgetisnull(r, 0, 5) ? 0 : pgjobq__get_int8(r, 0, 5);
        out->horizon_xids = pgjobq__get_int8(r, 0, 6);
        copy_text(out->holder_kind, sizeof out->holder_kind, r, 7);
        out->holder_pid = (int32_t)pgjobq__get_int8(r, 0, 8);
        copy_text(out->holder_application, sizeof out->holder_application, r, 9);
        copy_text(out->holder_state, sizeof out->holder_state, r, 10);
        out->holder_since = pgjobq__get_time(r, 0, 11);
        copy_text(out->holder_query, sizeof out->holder_query, r, 12);
        copy_text(out->holder_role, sizeof out->holder_role, r, 14);
    }
    PQclear(r);
    return PGJOBQ_OK;
}

int pgjobq_rescue_expired(pgjobq_client *c, int max_jobs, int *rescued_out)
{
    static const Oid types[] = {OID_INT4};
    char max_s[16];
    const char *values[1] = {max_s};
    PGresult *r;
    int rc;

    if (rescued_out)
        *rescued_out = 0;
    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if (max_jobs < 1 || max_jobs > PGJOBQ_BATCH_MAX)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "rescue: max_jobs must be between 1 and %d", PGJOBQ_BATCH_MAX);
    snprintf(max_s, sizeof max_s, "%d", max_jobs);
    pgjobq__stmt st = {"rescue expired leases", "SELECT pgjobq.rescue_expired($1)", 1, types, values, NULL, NULL, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    if (rescued_out)
        *rescued_out = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return PGJOBQ_OK;
}

int pgjobq_prune(pgjobq_client *c, int64_t completed_age_ms, int64_t failed_age_ms, int max_jobs, int *deleted_out)
{
    static const Oid types[] = {OID_INTERVAL, OID_INTERVAL, OID_INT4};
    char a_s[48], b_s[48], max_s[16];
    const char *values[3] = {a_s, b_s, max_s};
    PGresult *r;
    int rc;

    if (deleted_out)
        *deleted_out = 0;
    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    if (completed_age_ms < 0 || failed_age_ms < 0)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "prune: retention ages must not be negative");
    if (max_jobs < 1 || max_jobs > PGJOBQ_BATCH_MAX)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "prune: max_jobs must be between 1 and %d", PGJOBQ_BATCH_MAX);
    pgjobq__ms_interval(a_s, sizeof a_s, completed_age_ms);
    pgjobq__ms_interval(b_s, sizeof b_s, failed_age_ms);
    snprintf(max_s, sizeof max_s, "%d", max_jobs);
    pgjobq__stmt st = {"prune", "SELECT pgjobq.prune($1, $2, $3)", 3, types, values, NULL, NULL, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    if (deleted_out)
        *deleted_out = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return PGJOBQ_OK;
}
