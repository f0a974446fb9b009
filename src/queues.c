/*
 * queues.c - flow control: queue settings (pause and resume, concurrency and rate limits, the list of
 * queues) and schedules.
 * Each call is one statement of the SQL API (pgjobq.queue_pause, queue_resume, queue_set, queue_list:
 * sql/functions/queues.sql; schedule_set, schedule_enable, schedule_delete, schedule_list,
 * schedule_trigger: sql/functions/schedules.sql); the claim enforces what they set.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define REASON_MAX 1024

/* Checks the client and the queue name, and clears the last error. */
static int enter(pgjobq_client *c, const char *what, const char *queue)
{
    int rc;

    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    if ((rc = pgjobq__require_schema(c)) != PGJOBQ_OK)
        return rc;
    if (pgjobq_name_check(queue) != PGJOBQ_OK)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: invalid queue name \"%.80s\" (a letter, then letters, digits "
                                                "and _ . : -, at most 64)",
                              what, queue ? queue : "");
    return PGJOBQ_OK;
}

/* Runs `SELECT f($1, $2)` with text arguments, discarding the result. */
static int call2(pgjobq_client *c, const char *what, const char *sql, const char *a, const char *b)
{
    static const Oid types[] = {OID_TEXT, OID_TEXT};
    const char *values[2] = {a, b};
    PGresult *r;
    int rc;

    pgjobq__stmt st = {what, sql, 2, types, values, NULL, NULL, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) == PGJOBQ_OK)
        PQclear(r);
    return rc;
}

int pgjobq_queue_pause(pgjobq_client *c, const char *queue, const char *reason)
{
    char *clean = NULL;
    int rc;

    if ((rc = enter(c, "pause", queue)) != PGJOBQ_OK)
        return rc;
    if (reason) {
        clean = pgjobq__sanitize_text(reason, strlen(reason), REASON_MAX, 0);
        if (clean == NULL)
            return pgjobq__seterr(c, PGJOBQ_ENOMEM, "pause: out of memory");
    }
    rc = call2(c, "pause", "SELECT pgjobq.queue_pause($1, $2)", queue, clean);
    free(clean);
    return rc;
}

int pgjobq_queue_resume(pgjobq_client *c, const char *queue)
{
    static const Oid types[] = {OID_TEXT};
    const char *values[1] = {queue};
    PGresult *r;
    int rc;

    if ((rc = enter(c, "resume", queue)) != PGJOBQ_OK)
        return rc;
    pgjobq__stmt st = {"resume", "SELECT pgjobq.queue_resume($1)", 1, types, values, NULL, NULL, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) == PGJOBQ_OK)
        PQclear(r);
    return rc;
}

/* Sets one integer limit (key "concurrency" or "key_concurrency"); 0 removes it. */
static int set_limit(pgjobq_client *c, const char *what, const char *key, const char *queue, int limit)
{
    char settings[64];
    int rc;

    if ((rc = enter(c, what, queue)) != PGJOBQ_OK)
        return rc;
    if (limit < 0 || limit > 1000000)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: the limit must be between 1 and 1000000 (0: none), not %d", what,
                              limit);
    if (limit == 0)
        snprintf(settings, sizeof settings, "{\"%s\": null}", key);
    else
        snprintf(settings, sizeof settings, "{\"%s\": %d}", key, limit);
    return call2(c, what, "SELECT pgjobq.queue_set($1, $2::jsonb)", queue, settings);
}

int pgjobq_queue_set_concurrency(pgjobq_client *c, const char *queue, int limit)
{
    return set_limit(c, "set concurrency", "concurrency", queue, limit);
}

int pgjobq_queue_set_key_concurrency(pgjobq_client *c, const char *queue, int limit)
{
    return set_limit(c, "set key concurrency", "key_concurrency", queue, limit);
}

int pgjobq_queue_set_rate(pgjobq_client *c, const char *queue, int limit, int64_t period_ms)
{
    char settings[128];
    int rc;

    if ((rc = enter(c, "set rate", queue)) != PGJOBQ_OK)
        return rc;
    if (limit < 0 || limit > 10000)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "set rate: the limit must be between 1 and 10000 jobs (0: none), not %d",
                              limit);
    if (limit > 0 && (period_ms < 1 || period_ms > INT64_C(86400000)))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "set rate: the period must be between 1 ms and one day, not %lld ms",
                              (long long)period_ms);
    if (limit == 0)
        snprintf(settings, sizeof settings, "{\"rate_limit\": null, \"rate_period\": null}");
    else
        snprintf(settings, sizeof settings, "{\"rate_limit\": %d, \"rate_period\": \"%lld milliseconds\"}", limit,
                 (long long)period_ms);
    return call2(c, "set rate", "SELECT pgjobq.queue_set($1, $2::jsonb)", queue, settings);
}

int pgjobq_queue_set_max_lease(pgjobq_client *c, const char *queue, int64_t max_lease_ms)
{
    char settings[96];
    int rc;

    if ((rc = enter(c, "set max lease", queue)) != PGJOBQ_OK)
        return rc;
    if (max_lease_ms != 0 && (max_lease_ms < 1000 || max_lease_ms > INT64_C(31536000000)))
        return pgjobq__seterr(c, PGJOBQ_EINVAL,
                              "set max lease: it must be between 1 second and 365 days (0: the default), not %lld ms",
                              (long long)max_lease_ms);
    if (max_lease_ms == 0)
        snprintf(settings, sizeof settings, "{\"max_lease\": null}");
    else
        snprintf(settings, sizeof settings, "{\"max_lease\": \"%lld milliseconds\"}", (long long)max_lease_ms);
    return call2(c, "set max lease", "SELECT pgjobq.queue_set($1, $2::jsonb)", queue, settings);
}

int pgjobq_queue_set_dead_letter(pgjobq_client *c, const char *queue, const char *dead_letter)
{
    char settings[128];
    int rc;

    if ((rc = enter(c, "set dead letter", queue)) != PGJOBQ_OK)
        return rc;
    if (dead_letter && pgjobq_name_check(dead_letter) != PGJOBQ_OK)
        return pgjobq__seterr(c, PGJOBQ_EINVAL,
                              "set dead letter: invalid queue name \"%.80s\" (a letter, then letters,"
                              " digits and _ . : -, at most 64)",
                              dead_letter);
    /* A checked name needs no JSON escape. */
    if (dead_letter)
        snprintf(settings, sizeof settings, "{\"dead_letter\": \"%s\"}", dead_letter);
    else
        snprintf(settings, sizeof settings, "{\"dead_letter\": null}");
    return call2(c, "set dead letter", "SELECT pgjobq.queue_set($1, $2::jsonb)", queue, settings);
}

int pgjobq_queue_set_expire_after(pgjobq_client *c, const char *queue, int64_t expire_after_ms)
{
    char settings[96];
    int rc;

    if ((rc = enter(c, "set expire after", queue)) != PGJOBQ_OK)
        return rc;
    if (expire_after_ms != 0 && (expire_after_ms < 1000 || expire_after_ms > INT64_C(31536000000)))
        return pgjobq__seterr(c, PGJOBQ_EINVAL,
                              "set expire after: it must be between 1 second and 365 days (0: none), not %lld ms",
                              (long long)expire_after_ms);
    if (expire_after_ms == 0)
        snprintf(settings, sizeof settings, "{\"expire_after\": null}");
    else
        snprintf(settings, sizeof settings, "{\"expire_after\": \"%lld milliseconds\"}", (long long)expire_after_ms);
    return call2(c, "set expire after", "SELECT pgjobq.queue_set($1, $2::jsonb)", queue, settings);
}

int pgjobq_queue_set_strict_order(pgjobq_client *c, const char *queue, int on)
{
    int rc;

    if ((rc = enter(c, "set strict order", queue)) != PGJOBQ_OK)
        return rc;
    return call2(c, "set strict order", "SELECT pgjobq.queue_set($1, $2::jsonb)", queue,
                 on ? "{\"strict_order\": true}" : "{\"strict_order\": false}");
}

int pgjobq_queue_set_priority_aging(pgjobq_client *c, const char *queue, int64_t priority_aging_ms)
{
    char settings[96];
    int rc;

    if ((rc = enter(c, "set priority aging", queue)) != PGJOBQ_OK)
        return rc;
    if (priority_aging_ms != 0 && (priority_aging_ms < 1000 || priority_aging_ms > INT64_C(31536000000)))
        return pgjobq__seterr(c, PGJOBQ_EINVAL,
                              "set priority aging: it must be between 1 second and 365 days (0: off), not %lld ms",
                              (long long)priority_aging_ms);
    if (priority_aging_ms == 0)
        snprintf(settings, sizeof settings, "{\"priority_aging\": null}");
    else
        snprintf(settings, sizeof settings, "{\"priority_aging\": \"%lld milliseconds\"}",
                 (long long)priority_aging_ms);
    return call2(c, "set priority aging", "SELECT pgjobq.queue_set($1, $2::jsonb)", queue, settings);
}

/* The common part of a list call.  Checks the client and its outputs, runs `sql` (binary results),
 * checks the shape, and allocates one zeroed block: n rows of row_size bytes, then room for the text of
 * columns text_first..text_last of every row (see take_text).  On PGJOBQ_OK the caller owns *r and
 * *rows_out (NULL when there are no rows); *n_out is the row count. */
static int list_fetch(pgjobq_client *c, const char *what, const char *sql, int ncols, int outputs_given,
                      size_t row_size, int text_first, int text_last, PGresult **r, void **rows_out, char **strings,
                      size_t *n_out)
{
    size_t n, bytes;
    int rc;

    *rows_out = NULL;
    *n_out = 0;
    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    if ((rc = pgjobq__require_schema(c)) != PGJOBQ_OK)
        return rc;
    if (!outputs_given)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s: both outputs are required", what);
    pgjobq__stmt st = {what, sql, 0, NULL, NULL, NULL, NULL, 1};
    if ((rc = pgjobq__exec(c, &st, r)) != PGJOBQ_OK)
        return rc;
    if (PQnfields(*r) != ncols) {
        PQclear(*r);
        return pgjobq__seterr(c, PGJOBQ_EDB, "%s: unexpected result", what);
    }
    n = (size_t)PQntuples(*r);
    bytes = n * row_size;
    for (size_t i = 0; i < n; i++)
        for (int k = text_first; k <= text_last; k++)
            bytes += (size_t)PQgetlength(*r, (int)i, k) + 1;
    if (n && (*rows_out = calloc(1, bytes)) == NULL) {
        PQclear(*r);
        return pgjobq__seterr(c, PGJOBQ_ENOMEM, "%s: out of memory", what);
    }
    *strings = n ? (char *)*rows_out + n * row_size : NULL;
    *n_out = n;
    return PGJOBQ_OK;
}

/* Copies a text value into the room list_fetch made; NULL for SQL NULL. */
static const char *take_text(char **strings, const PGresult *r, int row, int col)
{
    size_t len;
    const char *s = pgjobq__get_text(r, row, col, &len);
    char *out = *strings;

    if (s == NULL)
        return NULL;
    memcpy(out, s, len);
    out[len] = '\0';
    *strings += len + 1;
    return out;
}

enum { Q_NAME, Q_PAUSED_AT, Q_REASON, Q_CONCURRENCY, Q_KEY_CONCURRENCY, Q_RATE, Q_PERIOD_MS, Q_QUEUED, Q_SCHEDULED, Q_RUNNING, Q_EXPIRED,
       Q_MAX_LEASE_MS, Q_DEAD_LETTER, Q_EXPIRE_AFTER_MS, Q_STRICT_ORDER, Q_PRIORITY_AGING_S, Q_NCOLS };

int pgjobq_queue_list(pgjobq_client *c, pgjobq_queue_info **queues_out, size_t *n_out)
{
    pgjobq_queue_info *rows = NULL;
    char *strings = NULL;
    size_t n = 0;
    PGresult *r;
    int rc;

    if (queues_out)
        *queues_out = NULL;
    if (n_out)
        *n_out = 0;
    rc =
        list_fetch(c, "list queues",
                   "SELECT queue, paused_at, pause_reason, concurrency, key_concurrency, rate_limit,"
                   " (extract(epoch FROM rate_period) * 1000)::bigint, queued, scheduled, running, expired,"
                   " (extract(epoch FROM max_lease) * 1000)::bigint, dead_letter,"
                   " (extract(epoch FROM expire_after) * 1000)::bigint, strict_order::int4,"
                   " least(floor(extract(epoch FROM priority_aging)), 2147483647)::int4 FROM pgjobq.queue_list()",
                   Q_NCOLS, queues_out && n_out, sizeof *rows, Q_NAME, Q_DEAD_LETTER, &r, (void **)&rows, &strings, &n);
    if (rc != PGJOBQ_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        int row = (int)i;
        rows[i].name = take_text(&strings, r, row, Q_NAME);
        rows[i].pause_reason = take_text(&strings, r, row, Q_REASON);
        rows[i].paused_at = pgjobq__get_time(r, row, Q_PAUSED_AT);
        rows[i].concurrency = PQgetisnull(r, row, Q_CONCURRENCY) ? 0 : pgjobq__get_int4(r, row, Q_CONCURRENCY);
        rows[i].key_concurrency =
            PQgetisnull(r, row, Q_KEY_CONCURRENCY) ? 0 : pgjobq__get_int4(r, row, Q_KEY_CONCURRENCY);
        rows[i].rate_limit = PQgetisnull(r, row, Q_RATE) ? 0 : pgjobq__get_int4(r, row, Q_RATE);
        rows[i].rate_period_ms = PQgetisnull(r, row, Q_PERIOD_MS) ? 0 : pgjobq__get_int8(r, row, Q_PERIOD_MS);
        rows[i].queued = pgjobq__get_int8(r, row, Q_QUEUED);
        rows[i].scheduled = pgjobq__get_int8(r, row, Q_SCHEDULED);
        rows[i].running = pgjobq__get_int8(r, row, Q_RUNNING);
        rows[i].expired = pgjobq__get_int8(r, row, Q_EXPIRED);
        rows[i].max_lease_ms = pgjobq__get_int8(r, row, Q_MAX_LEASE_MS);
        rows[i].dead_letter = take_text(&strings, r, row, Q_DEAD_LETTER);
        rows[i].expire_after_ms =
            PQgetisnull(r, row, Q_EXPIRE_AFTER_MS) ? 0 : pgjobq__get_int8(r, row, Q_EXPIRE_AFTER_MS);
        rows[i].strict_order = pgjobq__get_int4(r, row, Q_STRICT_ORDER);
        rows[i].priority_aging_s =
            PQgetisnull(r, row, Q_PRIORITY_AGING_S) ? 0 : pgjobq__get_int4(r, row, Q_PRIORITY_AGING_S);
    }
    PQclear(r);
    *queues_out = rows;
    *n_out = n;
    return PGJOBQ_OK;
}

void pgjobq_queue_list_free(pgjobq_queue_info *queues)
{
    free(queues);
}

enum { R_NAME, R_READY, R_OLDEST_MS, R_RUNNING, R_CONCURRENCY, R_SLOTS, R_PAUSED, R_NCOLS };

int pgjobq_queue_ready(pgjobq_client *c, pgjobq_queue_ready_info **queues_out, size_t *n_out)
{
    pgjobq_queue_ready_info *rows = NULL;
    char *strings = NULL;
    size_t n = 0;
    PGresult *r;
    int rc;

    if (queues_out)
        *queues_out = NULL;
    if (n_out)
        *n_out = 0;
    rc = list_fetch(c, "queue ready",
                    "SELECT queue, ready, (oldest_ready_s * 1000)::bigint, running, concurrency, worker_slots,"
                    " paused::int FROM pgjobq.queue_ready()",
                    R_NCOLS, queues_out && n_out, sizeof *rows, R_NAME, R_NAME, &r, (void **)&rows, &strings, &n);
    if (rc != PGJOBQ_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        int row = (int)i;
        rows[i].name = take_text(&strings, r, row, R_NAME);
        rows[i].ready = pgjobq__get_int8(r, row, R_READY);
        rows[i].oldest_ready_ms = PQgetisnull(r, row, R_OLDEST_MS) ? -1 : pgjobq__get_int8(r, row, R_OLDEST_MS);
        rows[i].running = pgjobq__get_int8(r, row, R_RUNNING);
        rows[i].concurrency = PQgetisnull(r, row, R_CONCURRENCY) ? 0 : pgjobq__get_int4(r, row, R_CONCURRENCY);
        rows[i].worker_slots = pgjobq__get_int8(r, row, R_SLOTS);
        rows[i].paused = pgjobq__get_int4(r, row, R_PAUSED);
    }
    PQclear(r);
    *queues_out = rows;
    *n_out = n;
    return PGJOBQ_OK;
}

void pgjobq_queue_ready_free(pgjobq_queue_ready_info *queues)
{
    free(queues);
}

/* ------------------------------------------------------------------------------------------------ */
/* Schedules                                                                                         */

int pgjobq_schedule_set(pgjobq_client *c, const char *name, const char *cron, const pgjobq_schedule_opts *opts,
                        int64_t *next_run_out)
{
    static const Oid types[] = {OID_TEXT, OID_TEXT, OID_TEXT, OID_TEXT, OID_TEXT, OID_JSONB, OID_INT2, OID_INT4, OID_TEXT};
    pgjobq_schedule_opts o = PGJOBQ_SCHEDULE_OPTS_INIT;
    char prio_s[16], attempts_s[16], why[200];
    PGresult *r;
    int rc;

    if (next_run_out)
        *next_run_out = PGJOBQ_TIME_NONE;
    if ((rc = enter(c, "schedule", name)) != PGJOBQ_OK)
        return rc;
    if (opts)
        o = *opts;
    if (cron == NULL || cron[0] == '\0' || strlen(cron) > 256)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "schedule %s: a cron expression of 1 to 256 bytes is required", name);
    if (o.queue && pgjobq_name_check(o.queue) != PGJOBQ_OK)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "schedule %s: invalid queue name \"%.80s\"", name, o.queue);
    if (o.kind && pgjobq_name_check(o.kind) != PGJOBQ_OK)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "schedule %s: invalid kind name \"%.80s\"", name, o.kind);
    if (o.payload && pgjobq__json_check(o.payload, strlen(o.payload), why, sizeof why) != 0)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "schedule %s: the payload is not valid JSON: %s", name, why);
    if (o.priority < -100 || o.priority > 100)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "schedule %s: priority must be between -100 and 100, not %d", name,
                              o.priority);
    if (o.max_attempts < 0 || o.max_attempts > 1000)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "schedule %s: max_attempts must be between 1 and 1000, not %d", name,
                              o.max_attempts);
    if (o.catch_up && strcmp(o.catch_up, "latest") != 0 && strcmp(o.catch_up, "all") != 0 &&
        strcmp(o.catch_up, "skip") != 0)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "schedule %s: catch-up must be latest, all or skip, not \"%.40s\"", name,
                              o.catch_up);
    snprintf(prio_s, sizeof prio_s, "%d", o.priority);
    snprintf(attempts_s, sizeof attempts_s, "%d", o.max_attempts ? o.max_attempts : 25);
    const char *values[9] = {name,         cron,   o.tz ? o.tz : "UTC", o.queue ? o.queue : "default",
                             o.kind ? o.kind : "default", o.payload ? o.payload : "{}", prio_s, attempts_s,
                             o.catch_up ? o.catch_up : "latest"};
    pgjobq__stmt st = {"schedule", "SELECT pgjobq.schedule_set($1, $2, $3, $4, $5, $6, $7, $8, $9)", 9, types, values,
                       NULL, NULL, 1};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    if (next_run_out && PQntuples(r) == 1)
        *next_run_out = pgjobq__get_time(r, 0, 0);
    PQclear(r);
    return PGJOBQ_OK;
}

/* Runs `SELECT f($1[, $2])` for a schedule and maps false to PGJOBQ_ENOTFOUND. */
static int schedule_call(pgjobq_client *c, const char *what, const char *sql, const char *name, const char *arg)
{
    static const Oid types[] = {OID_TEXT, OID_TEXT};
    const char *values[2] = {name, arg};
    PGresult *r;
    int rc;

    if ((rc = enter(c, what, name)) != PGJOBQ_OK)
        return rc;
    pgjobq__stmt st = {what, sql, arg ? 2 : 1, types, values, NULL, NULL, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    int found = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    return found ? PGJOBQ_OK : pgjobq__seterr(c, PGJOBQ_ENOTFOUND, "%s: no schedule %s", what, name);
}

int pgjobq_schedule_enable(pgjobq_client *c, const char *name, int enabled)
{
    return schedule_call(c, enabled ? "enable schedule" : "disable schedule",
                         "SELECT pgjobq.schedule_enable($1, $2::boolean)", name, enabled ? "true" : "false");
}

int pgjobq_schedule_delete(pgjobq_client *c, const char *name)
{
    return schedule_call(c, "delete schedule", "SELECT pgjobq.schedule_delete($1)", name, NULL);
}

enum { S_NAME, S_CRON, S_TZ, S_QUEUE, S_KIND, S_PAYLOAD, S_CATCH_UP, S_PRIORITY, S_MAX_ATTEMPTS, S_ENABLED,
       S_NEXT_RUN, S_LAST_RUN, S_NCOLS };

int pgjobq_schedule_list(pgjobq_client *c, pgjobq_schedule_info **schedules_out, size_t *n_out)
{
    pgjobq_schedule_info *rows = NULL;
    char *strings = NULL;
    size_t n = 0;
    PGresult *r;
    int rc;

    if (schedules_out)
        *schedules_out = NULL;
    if (n_out)
        *n_out = 0;
    rc = list_fetch(c, "list schedules",
                    "SELECT name::text, cron, tz, queue::text, kind::text, payload::text, catch_up, priority::int4,"
                    " max_attempts, enabled, next_run, last_run FROM pgjobq.schedule_list()",
                    S_NCOLS, schedules_out && n_out, sizeof *rows, S_NAME, S_CATCH_UP, &r, (void **)&rows, &strings,
                    &n);
    if (rc != PGJOBQ_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        int row = (int)i;
        rows[i].name = take_text(&strings, r, row, S_NAME);
        rows[i].cron = take_text(&strings, r, row, S_CRON);
        rows[i].tz = take_text(&strings, r, row, S_TZ);
        rows[i].queue = take_text(&strings, r, row, S_QUEUE);
        rows[i].kind = take_text(&strings, r, row, S_KIND);
        rows[i].payload = take_text(&strings, r, row, S_PAYLOAD);
        rows[i].catch_up = take_text(&strings, r, row, S_CATCH_UP);
        rows[i].priority = pgjobq__get_int4(r, row, S_PRIORITY);
        rows[i].max_attempts = pgjobq__get_int4(r, row, S_MAX_ATTEMPTS);
        rows[i].enabled = pgjobq__get_bool(r, row, S_ENABLED);
        rows[i].next_run = pgjobq__get_time(r, row, S_NEXT_RUN);
        rows[i].last_run = pgjobq__get_time(r, row, S_LAST_RUN);
    }
    PQclear(r);
    *schedules_out = rows;
    *n_out = n;
    return PGJOBQ_OK;
}

void pgjobq_schedule_list_free(pgjobq_schedule_info *schedules)
{
    free(schedules);
}

int pgjobq_schedule_trigger(pgjobq_client *c, const char *name, int64_t *id_out)
{
    static const Oid types[] = {OID_TEXT};
    const char *values[1] = {name};
    PGresult *r;
    int rc;

    if (id_out)
        *id_out = 0;
    if ((rc = enter(c, "trigger schedule", name)) != PGJOBQ_OK)
        return rc;
    pgjobq__stmt st = {"trigger schedule", "SELECT pgjobq.schedule_trigger($1)", 1, types, values, NULL, NULL, 1};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    if (PQntuples(r) != 1 || PQgetisnull(r, 0, 0)) {
        PQclear(r);
        return pgjobq__seterr(c, PGJOBQ_ENOTFOUND, "trigger schedule: no schedule %s", name);
    }
    if (id_out)
        *id_out = pgjobq__get_int8(r, 0, 0);
    PQclear(r);
    return PGJOBQ_OK;
}

int pgjobq_schedule_sync(pgjobq_client *c, const char *json, int *changed_out)
{
    static const Oid types[] = {OID_JSONB};
    const char *values[1] = {json};
    char why[200];
    PGresult *r;
    int rc;

    if (changed_out)
        *changed_out = 0;
    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    if ((rc = pgjobq__require_schema(c)) != PGJOBQ_OK)
        return rc;
    if (json == NULL || pgjobq__json_check(json, strlen(json), why, sizeof why) != 0)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "sync schedules: not valid JSON: %s", json ? why : "none given");
    pgjobq__stmt st = {"sync schedules", "SELECT pgjobq.schedule_sync($1)", 1, types, values, NULL, NULL, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    if (changed_out && PQntuples(r) == 1)
        *changed_out = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return PGJOBQ_OK;
}
