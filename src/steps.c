/*
 * steps.c - durable execution (docs/durable.md): a job's steps, stored once (pgjobq.step_get,
 * pgjobq.step_put) and read by its later attempts; durable sleeps and waits for events, which park
 * the job (pgjobq.sleep, pgjobq.wait_event); events (pgjobq.send_event); and what `pgjobq show`
 * reads (pgjobq.steps, pgjobq.job_park_of).  Every transition is the SQL's (sql/functions/steps.sql),
 * fenced by the lease there; this file runs one statement per call.
 *
 * The handler's side (pgjobq_ctx_step and the rest) runs its statements on a connection the worker's
 * pool lends to the job (pool.c): opened when a job first needs one, kept for the next job.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "internal.h"

void pgjobq_free(void *p)
{
    free(p);
}

static int enter(pgjobq_client *c)
{
    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    return pgjobq__require_schema(c);
}

static int check_name(pgjobq_client *c, const char *what, const char *name, int may_be_empty)
{
    size_t len = name ? strlen(name) : 0;
    if (name == NULL || (!may_be_empty && len == 0) || len > 4 * PGJOBQ_STEP_NAME_MAX || !pgjobq__utf8_valid(name, len))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "%s must be 1 to %d characters of UTF-8", what, PGJOBQ_STEP_NAME_MAX);
    return PGJOBQ_OK; /* the database counts the characters (step_name_why) */
}

/* A copy of a text column (NULL when it is NULL); *oom set when out of memory. */
static char *dup_value(const PGresult *r, int row, int col, int *oom)
{
    if (PQgetisnull(r, row, col))
        return NULL;
    char *s = strdup(PQgetvalue(r, row, col));
    if (s == NULL)
        *oom = 1;
    return s;
}

static void id_token(char *id_s, char *token_s, int64_t id, int64_t token)
{
    snprintf(id_s, 24, "%lld", (long long)id);
    snprintf(token_s, 24, "%lld", (long long)token);
}

/* ------------------------------------------------------------------------------------------------ */
/* On a client: for a program that holds the lease itself                                            */

int pgjobq_step_get(pgjobq_client *c, int64_t id, int64_t lease_token, const char *name, char **result_out)
{
    static const Oid types[] = {OID_INT8, OID_INT8, OID_TEXT};
    char id_s[24], token_s[24];
    const char *values[3] = {id_s, token_s, name};
    PGresult *r = NULL;
    int rc, oom = 0;

    if (result_out)
        *result_out = NULL;
    if ((rc = enter(c)) != PGJOBQ_OK || (rc = check_name(c, "step_get: a step's name", name, 0)) != PGJOBQ_OK)
        return rc;
    id_token(id_s, token_s, id, lease_token);
    pgjobq__stmt st = {"step_get", "SELECT outcome, result::pg_catalog.text FROM pgjobq.step_get($1, $2, $3)",
                       3,          types,
                       values,     NULL,
                       NULL,       0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    const char *outcome = PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "";
    if (strcmp(outcome, "stored") == 0) {
        char *v = dup_value(r, 0, 1, &oom);
        if (oom)
            rc = pgjobq__seterr(c, PGJOBQ_ENOMEM, "step_get: out of memory");
        else if (result_out)
            *result_out = v;
        else
            free(v);
    } else if (strcmp(outcome, "none") == 0) {
        rc = pgjobq__seterr(c, PGJOBQ_ENOTFOUND, "step_get: job %lld has no step \"%s\" stored", (long long)id, name);
    } else if (strcmp(outcome, "lost") == 0) {
        rc = pgjobq__seterr(c, PGJOBQ_ELEASE, "step_get: job %lld is not running under lease %lld", (long long)id,
                            (long long)lease_token);
    } else {
        rc = pgjobq__seterr(c, PGJOBQ_EDB, "step_get: unexpected result");
    }
    PQclear(r);
    return rc;
}

int pgjobq_step_put(pgjobq_client *c, int64_t id, int64_t lease_token, const char *name, const char *result,
                    char **stored_out)
{
    static const Oid types[] = {OID_INT8, OID_INT8, OID_TEXT, OID_TEXT};
    char id_s[24], token_s[24];
    const char *values[4] = {id_s, token_s, name, result ? result : "null"};
    PGresult *r = NULL;
    int rc, oom = 0;

    if (stored_out)
        *stored_out = NULL;
    if ((rc = enter(c)) != PGJOBQ_OK || (rc = check_name(c, "step_put: a step's name", name, 0)) != PGJOBQ_OK)
        return rc;
    if (result && (rc = pgjobq__check_payload(c, "step_put: result", result, strlen(result))) != PGJOBQ_OK)
        return rc;
    id_token(id_s, token_s, id, lease_token);
    pgjobq__stmt st = {
        "step_put", "SELECT outcome, result::pg_catalog.text FROM pgjobq.step_put($1, $2, $3, $4::pg_catalog.jsonb)",
        4,          types,
        values,     NULL,
        NULL,       0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    const char *outcome = PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "";
    if (strcmp(outcome, "stored") == 0) {
        rc = PGJOBQ_OK;
    } else if (strcmp(outcome, "exists") == 0) {
        char *v = dup_value(r, 0, 1, &oom);
        if (oom) {
            rc = pgjobq__seterr(c, PGJOBQ_ENOMEM, "step_put: out of memory");
        } else {
            rc = pgjobq__seterr(c, PGJOBQ_EDUPLICATE, "step_put: job %lld has its step \"%s\" stored already",
                                (long long)id, name);
            if (stored_out) {
                *stored_out = v;
                v = NULL;
            }
        }
        free(v);
    } else if (strcmp(outcome, "lost") == 0) {
        rc = pgjobq__seterr(c, PGJOBQ_ELEASE,
                            "step_put: job %lld is not running under lease %lld: step \"%s\" not stored", (long long)id,
                            (long long)lease_token, name);
    } else {
        rc = pgjobq__seterr(c, PGJOBQ_EDB, "step_put: unexpected result");
    }
    PQclear(r);
    return rc;
}

/* The codes of sleep's and wait_event's outcomes. */
static int park_outcome(pgjobq_client *c, const char *what, int64_t id, int64_t token, const char *outcome)
{
    if (strcmp(outcome, "parked") == 0)
        return PGJOBQ_PARKED;
    if (strcmp(outcome, "cancelled") == 0)
        return pgjobq__seterr(c, PGJOBQ_ECANCELLED, "%s: job %lld was cancelled: it ended cancelled", what,
                              (long long)id);
    if (strcmp(outcome, "lost") == 0)
        return pgjobq__seterr(c, PGJOBQ_ELEASE, "%s: job %lld is not running under lease %lld", what, (long long)id,
                              (long long)token);
    return pgjobq__seterr(c, PGJOBQ_EDB, "%s: unexpected result '%s'", what, outcome);
}

int pgjobq_job_sleep(pgjobq_client *c, int64_t id, int64_t lease_token, const char *name, int64_t delay_ms,
                     int64_t *until_out)
{
    static const Oid types[] = {OID_INT8, OID_INT8, OID_TEXT, OID_INTERVAL};
    char id_s[24], token_s[24], delay_s[48];
    const char *values[4] = {id_s, token_s, name, delay_s};
    PGresult *r = NULL;
    int rc;

    if (until_out)
        *until_out = PGJOBQ_TIME_NONE;
    if ((rc = enter(c)) != PGJOBQ_OK || (rc = check_name(c, "sleep: a sleep's name", name, 0)) != PGJOBQ_OK)
        return rc;
    if (delay_ms < 0 || delay_ms > INT64_C(3155760000000))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "sleep: the delay must be from 0 to 100 years, not %lld ms",
                              (long long)delay_ms);
    id_token(id_s, token_s, id, lease_token);
    pgjobq__ms_interval(delay_s, sizeof delay_s, delay_ms);
    pgjobq__stmt st = {"sleep",
                       "SELECT outcome, (pg_catalog.date_part('epoch', until) * 1000000)::pg_catalog.int8"
                       " FROM pgjobq.sleep($1, $2, $3, $4)",
                       4,
                       types,
                       values,
                       NULL,
                       NULL,
                       0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    const char *outcome = PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "";
    if (until_out && PQntuples(r) == 1 && !PQgetisnull(r, 0, 1))
        *until_out = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    rc = strcmp(outcome, "over") == 0 ? PGJOBQ_OK : park_outcome(c, "sleep", id, lease_token, outcome);
    PQclear(r);
    return rc;
}

int pgjobq_job_wait_event(pgjobq_client *c, int64_t id, int64_t lease_token, const char *name, const char *event_name,
                          const char *key, int64_t timeout_ms, char **payload_out)
{
    static const Oid types[] = {OID_INT8, OID_INT8, OID_TEXT, OID_TEXT, OID_TEXT, OID_INTERVAL};
    char id_s[24], token_s[24], timeout_s[48];
    const char *values[6] = {id_s, token_s, name, event_name, key ? key : "", timeout_ms < 0 ? NULL : timeout_s};
    PGresult *r = NULL;
    int rc, oom = 0;

    if (payload_out)
        *payload_out = NULL;
    if ((rc = enter(c)) != PGJOBQ_OK || (rc = check_name(c, "wait_event: a wait's name", name, 0)) != PGJOBQ_OK ||
        (rc = check_name(c, "wait_event: an event's name", event_name, 0)) != PGJOBQ_OK ||
        (key && (rc = check_name(c, "wait_event: an event's key", key, 1)) != PGJOBQ_OK))
        return rc;
    if (timeout_ms > INT64_C(3155760000000))
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "wait_event: the timeout must be at most 100 years, not %lld ms",
                              (long long)timeout_ms);
    id_token(id_s, token_s, id, lease_token);
    pgjobq__ms_interval(timeout_s, sizeof timeout_s, timeout_ms < 0 ? 0 : timeout_ms);
    pgjobq__stmt st = {"wait_event",
                       "SELECT outcome, payload::pg_catalog.text FROM pgjobq.wait_event($1, $2, $3, $4, $5, $6)",
                       6,
                       types,
                       values,
                       NULL,
                       NULL,
                       0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    const char *outcome = PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "";
    if (strcmp(outcome, "event") == 0) {
        char *v = dup_value(r, 0, 1, &oom);
        if (oom)
            rc = pgjobq__seterr(c, PGJOBQ_ENOMEM, "wait_event: out of memory");
        else if (payload_out)
            *payload_out = v;
        else
            free(v);
    } else if (strcmp(outcome, "timeout") == 0) {
        rc = pgjobq__seterr(c, PGJOBQ_ETIMEOUT,
                            "wait_event: job %lld: no event \"%s\" (key \"%s\") came before the "
                            "timeout",
                            (long long)id, event_name, key ? key : "");
    } else {
        rc = park_outcome(c, "wait_event", id, lease_token, outcome);
    }
    PQclear(r);
    return rc;
}

int pgjobq_send_event(pgjobq_client *c, const char *name, const char *key, const char *payload, int *resumed_out)
{
    static const Oid types[] = {OID_TEXT, OID_TEXT, OID_TEXT};
    const char *values[3] = {name, key ? key : "", payload ? payload : "null"};
    PGresult *r = NULL;
    int rc;

    if (resumed_out)
        *resumed_out = 0;
    if ((rc = enter(c)) != PGJOBQ_OK || (rc = check_name(c, "send_event: an event's name", name, 0)) != PGJOBQ_OK ||
        (key && (rc = check_name(c, "send_event: an event's key", key, 1)) != PGJOBQ_OK))
        return rc;
    if (payload && (rc = pgjobq__check_payload(c, "send_event: payload", payload, strlen(payload))) != PGJOBQ_OK)
        return rc;
    pgjobq__stmt st = {"send_event",
                       "SELECT resumed FROM pgjobq.send_event($1, $2, $3::pg_catalog.jsonb)",
                       3,
                       types,
                       values,
                       NULL,
                       NULL,
                       0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    if (PQntuples(r) != 1)
        rc = pgjobq__seterr(c, PGJOBQ_EDB, "send_event: unexpected result");
    else if (resumed_out)
        *resumed_out = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return rc;
}

int pgjobq_job_steps(pgjobq_client *c, int64_t id, pgjobq_step_info **steps_out, size_t *n_out)
{
    static const Oid types[] = {OID_INT8};
    char id_s[24];
    const char *values[1] = {id_s};
    PGresult *r = NULL;
    int rc;

    *steps_out = NULL;
    *n_out = 0;
    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    snprintf(id_s, sizeof id_s, "%lld", (long long)id);
    pgjobq__stmt st = {"steps",
                       "SELECT name, attempt, (pg_catalog.date_part('epoch', stored_at) * 1000000)::pg_catalog.int8,"
                       " result_bytes FROM pgjobq.steps($1)",
                       1,
                       types,
                       values,
                       NULL,
                       NULL,
                       0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    int n = PQntuples(r);
    size_t strings = 0;
    for (int i = 0; i < n; i++)
        strings += (size_t)PQgetlength(r, i, 0) + 1;
    /* One allocation: the array, then its names (a terminating entry with no name marks the end). */
    pgjobq_step_info *steps = n > 0 ? calloc(1, (size_t)(n + 1) * sizeof *steps + strings) : NULL;
    if (n > 0 && steps == NULL) {
        PQclear(r);
        return pgjobq__seterr(c, PGJOBQ_ENOMEM, "steps: out of memory");
    }
    char *p = (char *)(steps + n + 1);
    for (int i = 0; i < n; i++) {
        size_t len = (size_t)PQgetlength(r, i, 0);
        memcpy(p, PQgetvalue(r, i, 0), len + 1);
        steps[i].name = p;
        p += len + 1;
        steps[i].attempt = atoi(PQgetvalue(r, i, 1));
        steps[i].stored_at = strtoll(PQgetvalue(r, i, 2), NULL, 10);
        steps[i].result_bytes = strtoll(PQgetvalue(r, i, 3), NULL, 10);
    }
    PQclear(r);
    *steps_out = steps;
    *n_out = (size_t)n;
    return PGJOBQ_OK;
}

void pgjobq_steps_free(pgjobq_step_info *steps)
{
    free(steps);
}

static void copy_field(char *dst, size_t size, const PGresult *r, int col)
{
    snprintf(dst, size, "%s", PQgetisnull(r, 0, col) ? "" : PQgetvalue(r, 0, col));
}

int pgjobq_job_park(pgjobq_client *c, int64_t id, pgjobq_park_info *out)
{
    static const Oid types[] = {OID_INT8};
    char id_s[24];
    const char *values[1] = {id_s};
    PGresult *r = NULL;
    int rc;

    memset(out, 0, sizeof *out);
    out->until = out->since = PGJOBQ_TIME_NONE;
    if ((rc = enter(c)) != PGJOBQ_OK)
        return rc;
    snprintf(id_s, sizeof id_s, "%lld", (long long)id);
    pgjobq__stmt st = {"park",
                       "SELECT parked, step, (pg_catalog.date_part('epoch', until) * 1000000)::pg_catalog.int8,"
                       " event_name, event_key, (pg_catalog.date_part('epoch', since) * 1000000)::pg_catalog.int8"
                       " FROM pgjobq.job_park_of($1)",
                       1,
                       types,
                       values,
                       NULL,
                       NULL,
                       0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    if (PQntuples(r) == 1) {
        out->parked = strcmp(PQgetvalue(r, 0, 0), "sleeping") == 0 ? PGJOBQ_PARK_SLEEP : PGJOBQ_PARK_EVENT;
        copy_field(out->step, sizeof out->step, r, 1);
        out->until = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
        copy_field(out->event_name, sizeof out->event_name, r, 3);
        copy_field(out->event_key, sizeof out->event_key, r, 4);
        out->since = strtoll(PQgetvalue(r, 0, 5), NULL, 10);
    }
    PQclear(r);
    return PGJOBQ_OK;
}

/* ------------------------------------------------------------------------------------------------ */
/* The handler's context                                                                             */

const char *pgjobq_ctx_errmsg(const pgjobq_ctx *ctx)
{
    return ctx ? ctx->errmsg : "no context";
}

/* Keeps the client's message on the context, and returns rc. */
static int ctx_err(pgjobq_ctx *ctx, int rc)
{
    if (rc != PGJOBQ_OK && rc != PGJOBQ_PARKED && ctx->lent)
        snprintf(ctx->errmsg, sizeof ctx->errmsg, "%s", pgjobq_errmsg(ctx->lent));
    return rc;
}

int pgjobq_ctx_client(pgjobq_ctx *ctx, pgjobq_client **out)
{
    int rc;

    *out = NULL;
    if (ctx == NULL)
        return PGJOBQ_EINVAL;
    if (ctx->lent == NULL &&
        (rc = pgjobq__pool_lend(ctx->q->pool, &ctx->lent, ctx->errmsg, sizeof ctx->errmsg)) != PGJOBQ_OK)
        return rc;
    *out = ctx->lent;
    return PGJOBQ_OK;
}

void pgjobq__ctx_steps_forget(pgjobq_ctx *ctx)
{
    for (size_t i = 0; i < ctx->steps.n; i++) {
        free(ctx->steps.names[i]);
        free(ctx->steps.results[i]);
    }
    free(ctx->steps.names);
    free(ctx->steps.results);
    memset(&ctx->steps, 0, sizeof ctx->steps);
}

/* Adds a stored step (copies of name and result) to what the context knows; PGJOBQ_ENOMEM. */
static int steps_add(pgjobq_ctx *ctx, const char *name, const char *result)
{
    if (ctx->steps.n == ctx->steps.cap) {
        size_t cap = ctx->steps.cap ? ctx->steps.cap * 2 : 16;
        char **names = realloc(ctx->steps.names, cap * sizeof *names);
        if (names == NULL)
            return PGJOBQ_ENOMEM;
        ctx->steps.names = names;
        char **results = realloc(ctx->steps.results, cap * sizeof *results);
        if (results == NULL)
            return PGJOBQ_ENOMEM;
        ctx->steps.results = results;
        ctx->steps.cap = cap;
    }
    char *n = strdup(name), *r = strdup(result);
    if (n == NULL || r == NULL) {
        free(n);
        free(r);
        return PGJOBQ_ENOMEM;
    }
    ctx->steps.names[ctx->steps.n] = n;
    ctx->steps.results[ctx->steps.n++] = r;
    return PGJOBQ_OK;
}

static const char *steps_find(const pgjobq_ctx *ctx, const char *name)
{
    for (size_t i = 0; i < ctx->steps.n; i++)
        if (strcmp(ctx->steps.names[i], name) == 0)
            return ctx->steps.results[i];
    return NULL;
}

/* Reads the job's stored steps once per attempt (pgjobq.steps_of): PGJOBQ_OK, PGJOBQ_ELEASE when the
 * job does not run under its token any more, or the client's error. */
static int steps_load(pgjobq_ctx *ctx, pgjobq_client *c)
{
    static const Oid types[] = {OID_INT8, OID_INT8};
    char id_s[24], token_s[24];
    const char *values[2] = {id_s, token_s};
    PGresult *r = NULL;
    int rc;

    if (ctx->steps.loaded)
        return PGJOBQ_OK;
    id_token(id_s, token_s, ctx->job.id, ctx->job.lease_token);
    pgjobq__stmt st = {"steps_of", "SELECT held::pg_catalog.int4, name, result::pg_catalog.text FROM pgjobq.steps_of($1, $2)",
                       2, types, values, NULL, NULL, 0};
    if ((rc = pgjobq__exec(c, &st, &r)) != PGJOBQ_OK)
        return rc;
    if (PQntuples(r) < 1)
        rc = pgjobq__seterr(c, PGJOBQ_EDB, "steps_of: unexpected result");
    else if (strcmp(PQgetvalue(r, 0, 0), "1") != 0)
        rc = pgjobq__seterr(c, PGJOBQ_ELEASE, "step: job %lld is not running under lease %lld", (long long)ctx->job.id,
                            (long long)ctx->job.lease_token);
    for (int i = 0; rc == PGJOBQ_OK && i < PQntuples(r); i++)
        if (!PQgetisnull(r, i, 1) && (rc = steps_add(ctx, PQgetvalue(r, i, 1), PQgetvalue(r, i, 2))) != PGJOBQ_OK)
            rc = pgjobq__seterr(c, rc, "step: out of memory");
    PQclear(r);
    if (rc == PGJOBQ_OK)
        ctx->steps.loaded = 1;
    else
        pgjobq__ctx_steps_forget(ctx);
    return rc;
}

/* The result fn gave, checked; its code. */
static int step_result(pgjobq_ctx *ctx, const char *name, const char *result)
{
    char why[160];
    if (result && pgjobq_json_check(result, strlen(result), why, sizeof why) != PGJOBQ_OK) {
        snprintf(ctx->errmsg, sizeof ctx->errmsg, "step \"%s\": its result is not JSON: %s", name, why);
        return PGJOBQ_EINVAL;
    }
    return PGJOBQ_OK;
}

static int run_step(pgjobq_ctx *ctx, const char *name, pgjobq_step_fn fn, void *arg, char **result_out, int tx)
{
    pgjobq_client *c;
    char *result = NULL, *stored = NULL;
    int rc;

    if (result_out)
        *result_out = NULL;
    ctx->errmsg[0] = '\0';
    if (fn == NULL || name == NULL) {
        snprintf(ctx->errmsg, sizeof ctx->errmsg, "a step needs a name and a function");
        return PGJOBQ_EINVAL;
    }
    if ((rc = pgjobq_ctx_client(ctx, &c)) != PGJOBQ_OK)
        return rc;
    if ((rc = check_name(c, "step: a step's name", name, 0)) != PGJOBQ_OK || (rc = steps_load(ctx, c)) != PGJOBQ_OK)
        return ctx_err(ctx, rc);
    /* Stored already (read at the attempt's first step, or stored by it since): its result, without
     * running it. */
    const char *known = steps_find(ctx, name);
    if (known) {
        if (result_out && (*result_out = strdup(known)) == NULL)
            return PGJOBQ_ENOMEM;
        return PGJOBQ_OK;
    }
    if (tx && (rc = pgjobq_begin(c)) != PGJOBQ_OK)
        return ctx_err(ctx, rc);
    rc = fn(ctx, tx ? c : NULL, arg, &result);
    if (rc == PGJOBQ_OK)
        rc = step_result(ctx, name, result);
    else if (ctx->errmsg[0] == '\0')
        snprintf(ctx->errmsg, sizeof ctx->errmsg, "step \"%s\" failed (%s): nothing stored", name, pgjobq_errname(rc));
    if (rc == PGJOBQ_OK) {
        rc = ctx_err(ctx, pgjobq_step_put(c, ctx->job.id, ctx->job.lease_token, name, result, &stored));
        if (rc == PGJOBQ_EDUPLICATE) {
            /* Stored meanwhile by another holder: that result stands (and this transaction's effects go). */
            free(result);
            result = stored;
            stored = NULL;
            if (!tx)
                rc = PGJOBQ_OK;
        }
    }
    if (tx) {
        if (rc == PGJOBQ_OK)
            rc = ctx_err(ctx, pgjobq_commit(c));
        else
            pgjobq__rollback_quietly(c);
        if (rc == PGJOBQ_EDUPLICATE)
            rc = PGJOBQ_OK;
    }
    if (rc == PGJOBQ_OK && result == NULL && (result = strdup("null")) == NULL)
        rc = PGJOBQ_ENOMEM;
    if (rc == PGJOBQ_OK && steps_add(ctx, name, result) != PGJOBQ_OK)
        rc = PGJOBQ_ENOMEM;
    if (rc == PGJOBQ_OK && result_out) {
        *result_out = result;
        result = NULL;
    }
    free(result);
    free(stored);
    return rc;
}

int pgjobq_ctx_step_get(pgjobq_ctx *ctx, const char *name, char **result_out)
{
    pgjobq_client *c;
    int rc;

    if (result_out)
        *result_out = NULL;
    if (ctx == NULL || result_out == NULL)
        return PGJOBQ_EINVAL;
    ctx->errmsg[0] = '\0';
    if ((rc = pgjobq_ctx_client(ctx, &c)) != PGJOBQ_OK)
        return rc;
    if ((rc = check_name(c, "step: a step's name", name, 0)) != PGJOBQ_OK || (rc = steps_load(ctx, c)) != PGJOBQ_OK)
        return ctx_err(ctx, rc);
    const char *known = steps_find(ctx, name);
    if (known == NULL) {
        snprintf(ctx->errmsg, sizeof ctx->errmsg, "job %lld has no step \"%s\" stored", (long long)ctx->job.id, name);
        return PGJOBQ_ENOTFOUND;
    }
    return (*result_out = strdup(known)) ? PGJOBQ_OK : PGJOBQ_ENOMEM;
}

int pgjobq_ctx_step_put(pgjobq_ctx *ctx, const char *name, const char *result, char **stored_out)
{
    pgjobq_client *c;
    char *stored = NULL;
    int rc;

    if (stored_out)
        *stored_out = NULL;
    if (ctx == NULL)
        return PGJOBQ_EINVAL;
    ctx->errmsg[0] = '\0';
    if ((rc = pgjobq_ctx_client(ctx, &c)) != PGJOBQ_OK)
        return rc;
    if ((rc = steps_load(ctx, c)) != PGJOBQ_OK)
        return ctx_err(ctx, rc);
    rc = pgjobq_step_put(c, ctx->job.id, ctx->job.lease_token, name, result, &stored);
    if (rc == PGJOBQ_OK || rc == PGJOBQ_EDUPLICATE) {
        const char *now = rc == PGJOBQ_OK ? (result ? result : "null") : stored;
        if (steps_find(ctx, name) == NULL && steps_add(ctx, name, now) != PGJOBQ_OK) {
            free(stored);
            return PGJOBQ_ENOMEM;
        }
        if (stored_out)
            *stored_out = stored;
        else
            free(stored);
        return rc;
    }
    free(stored);
    return ctx_err(ctx, rc);
}

int pgjobq_ctx_step(pgjobq_ctx *ctx, const char *name, pgjobq_step_fn fn, void *arg, char **result_out)
{
    return ctx ? run_step(ctx, name, fn, arg, result_out, 0) : PGJOBQ_EINVAL;
}

int pgjobq_ctx_step_tx(pgjobq_ctx *ctx, const char *name, pgjobq_step_fn fn, void *arg, char **result_out)
{
    return ctx ? run_step(ctx, name, fn, arg, result_out, 1) : PGJOBQ_EINVAL;
}

/* A parked job (or one that ended cancelled there) is the database's now: the engine writes nothing
 * for it, whatever its handler returns. */
static int parked(pgjobq_ctx *ctx, int rc)
{
    pgjobq__ctx_steps_forget(ctx); /* (the sleep or the wait stored a step of its own) */
    if (rc == PGJOBQ_PARKED || rc == PGJOBQ_ECANCELLED)
        atomic_store(&ctx->parked, 1);
    return ctx_err(ctx, rc);
}

int pgjobq_ctx_sleep(pgjobq_ctx *ctx, const char *name, int64_t delay_ms)
{
    pgjobq_client *c;
    char auto_name[32];
    int rc;

    if (ctx == NULL)
        return PGJOBQ_EINVAL;
    ctx->errmsg[0] = '\0';
    if (name == NULL) {
        snprintf(auto_name, sizeof auto_name, "sleep#%d", ++ctx->unnamed_sleeps);
        name = auto_name;
    }
    if ((rc = pgjobq_ctx_client(ctx, &c)) != PGJOBQ_OK)
        return rc;
    return parked(ctx, pgjobq_job_sleep(c, ctx->job.id, ctx->job.lease_token, name, delay_ms, NULL));
}

int pgjobq_ctx_wait_event(pgjobq_ctx *ctx, const char *name, const char *event_name, const char *key,
                          int64_t timeout_ms, char **payload_out)
{
    pgjobq_client *c;
    char auto_name[32];
    int rc;

    if (payload_out)
        *payload_out = NULL;
    if (ctx == NULL)
        return PGJOBQ_EINVAL;
    ctx->errmsg[0] = '\0';
    if (name == NULL) {
        snprintf(auto_name, sizeof auto_name, "wait#%d", ++ctx->unnamed_waits);
        name = auto_name;
    }
    if ((rc = pgjobq_ctx_client(ctx, &c)) != PGJOBQ_OK)
        return rc;
    return parked(ctx, pgjobq_job_wait_event(c, ctx->job.id, ctx->job.lease_token, name, event_name, key, timeout_ms,
                                             payload_out));
}
