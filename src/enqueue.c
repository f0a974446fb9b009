/*
 * enqueue.c - inserting jobs: one, or a batch in one statement through pgjobq.enqueue_many().
 *
 * Every job is checked here first, so that a bad one is reported by its index with a precise reason
 * and nothing is sent; the database's CHECK constraints then hold the same rules for anyone who
 * bypasses the library.
 */
#include <stdio.h>
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

/* Counts UTF-8 characters (the text is known to be valid UTF-8). */
static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* Checks one job; `label` is "job" or "job 17". */
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
    if (o->delay_ms < 0)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: delay must not be negative (%lld ms)", label,
                              (long long)o->delay_ms);
    if (o->delay_ms > INT64_C(3155760000000)) /* 100 years keeps now() + delay far from overflow */
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: delay of %lld ms is more than 100 years", label,
                              (long long)o->delay_ms);
    if (o->run_at && o->delay_ms != 0)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: give run_at or a delay, not both", label);
    if (o->run_at && (o->run_at[0] == '\0' || !pgjobq__utf8_valid(o->run_at, strlen(o->run_at))))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: run_at is empty or not valid text", label);
    if (o->unique_key) {
        size_t len = strlen(o->unique_key);
        if (!pgjobq__utf8_valid(o->unique_key, len))
            return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: unique key is not valid UTF-8", label);
        if (len == 0 || utf8_chars(o->unique_key) > PGJOBQ_UNIQUE_KEY_MAX)
            return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: unique key must have 1 to %d characters", label,
                                  PGJOBQ_UNIQUE_KEY_MAX);
    }
    return PGJOBQ_OK;
}

/* The eight parallel arrays pgjobq.enqueue_many() takes.  An array whose elements would all be NULL is
 * sent as a NULL parameter instead. */
enum { A_QUEUE, A_KIND, A_PAYLOAD, A_PRIORITY, A_RUN_AT, A_DELAY, A_MAX_ATTEMPTS, A_UNIQUE, A_COUNT };

static const Oid enqueue_types[A_COUNT] = {OID_TEXT_ARRAY, OID_TEXT_ARRAY,     OID_JSONB_ARRAY, OID_INT2_ARRAY,
                                           OID_TEXT_ARRAY, OID_INTERVAL_ARRAY, OID_INT4_ARRAY,  OID_TEXT_ARRAY};
static const Oid enqueue_elem[A_COUNT] = {OID_TEXT, OID_TEXT,     OID_JSONB, OID_INT2,
                                          OID_TEXT, OID_INTERVAL, OID_INT4,  OID_TEXT};

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
    }
}

static int insert_batch(pgjobq_client *c, const pgjobq_job_spec *jobs, size_t n, int64_t *ids, unsigned char *dups,
                        int *any_dup)
{
    static const char sql[] = "SELECT ord, id, duplicate FROM pgjobq.enqueue_many($1, $2, $3, $4, "
                              "$5::pg_catalog.timestamptz[], $6, $7, $8)";
    pgjobq__array arrays[A_COUNT];
    const char *values[A_COUNT];
    int lengths[A_COUNT], formats[A_COUNT];
    PGresult *r = NULL;
    int rc = PGJOBQ_OK;

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

    pgjobq__stmt st = {"enqueue", sql, A_COUNT, enqueue_types, values, lengths, formats, 1};
    rc = pgjobq__exec(c, &st, &r);
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
        int dup = pgjobq__get_bool(r, row, 2);
        if (ids)
            ids[ord - 1] = pgjobq__get_int8(r, row, 1);
        if (dups)
            dups[ord - 1] = (unsigned char)dup;
        *any_dup |= dup;
    }
out:
    PQclear(r);
    for (int f = 0; f < A_COUNT; f++)
        pgjobq__buf_free(&arrays[f].buf);
    return rc;
}

int pgjobq_enqueue_batch(pgjobq_client *c, const pgjobq_job_spec *jobs, size_t n, int64_t *ids_out,
                         unsigned char *dup_out)
{
    char label[32];
    int rc, any_dup = 0;

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
    return insert_batch(c, jobs, n, ids_out, dup_out, &any_dup);
}

int pgjobq_enqueue(pgjobq_client *c, const char *payload, const pgjobq_enqueue_opts *opts, int64_t *id_out)
{
    pgjobq_job_spec spec;
    int64_t id = 0;
    int rc, dup = 0;

    if (id_out)
        *id_out = 0;
    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    if ((rc = pgjobq__require_schema(c)) != PGJOBQ_OK)
        return rc;
    memset(&spec, 0, sizeof spec);
    spec.payload = payload;
    if (opts)
        spec.opts = *opts;
    if ((rc = check_spec(c, "job", &spec)) != PGJOBQ_OK)
        return rc;
    rc = insert_batch(c, &spec, 1, &id, NULL, &dup);
    if (rc != PGJOBQ_OK)
        return rc;
    if (id_out)
        *id_out = id;
    if (dup)
        return pgjobq__seterr(c, PGJOBQ_EDUPLICATE, "job %lld already holds unique key \"%.100s\"", (long long)id,
                              spec.opts.unique_key);
    return PGJOBQ_OK;
}
