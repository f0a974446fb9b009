/*
 * errors.c - the result code table, per-client error messages, and logging.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

static const struct {
    int code;
    const char *name;
    const char *message;
} codes[] = {
    {PGJOBQ_OK, "PGJOBQ_OK", "success"},
    {PGJOBQ_EINVAL, "PGJOBQ_EINVAL", "invalid argument"},
    {PGJOBQ_ENOMEM, "PGJOBQ_ENOMEM", "out of memory"},
    {PGJOBQ_ECONN, "PGJOBQ_ECONN", "connection to the database failed or was lost"},
    {PGJOBQ_EDB, "PGJOBQ_EDB", "database error"},
    {PGJOBQ_ESCHEMA, "PGJOBQ_ESCHEMA", "pgjobq schema missing or incompatible"},
    {PGJOBQ_ENOTFOUND, "PGJOBQ_ENOTFOUND", "no such job"},
    {PGJOBQ_ESTATE, "PGJOBQ_ESTATE", "the job's state does not allow this operation"},
    {PGJOBQ_ELEASE, "PGJOBQ_ELEASE", "lease lost: the job is no longer held under this lease"},
    {PGJOBQ_ECANCELLED, "PGJOBQ_ECANCELLED", "the job was cancelled"},
    {PGJOBQ_EDUPLICATE, "PGJOBQ_EDUPLICATE", "a queued or running job already holds this unique key"},
    {PGJOBQ_ECONFLICT, "PGJOBQ_ECONFLICT", "serialization failure or deadlock; retry the transaction"},
    {PGJOBQ_EPERM, "PGJOBQ_EPERM", "permission denied"},
    {PGJOBQ_ETIMEOUT, "PGJOBQ_ETIMEOUT", "statement or lock timeout"},
    {PGJOBQ_ESTOPPED, "PGJOBQ_ESTOPPED", "the worker was asked to stop"},
    {PGJOBQ_PARKED, "PGJOBQ_PARKED", "the job was parked (a durable sleep or a wait for an event)"},
};

const char *pgjobq_strerror(int code)
{
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (codes[i].code == code)
            return codes[i].message;
    return "unknown error code";
}

const char *pgjobq_errname(int code)
{
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (codes[i].code == code)
            return codes[i].name;
    return "PGJOBQ_UNKNOWN";
}

const char *pgjobq_errmsg(const pgjobq_client *c)
{
    return c ? c->errmsg : "no client";
}

const char *pgjobq_sqlstate(const pgjobq_client *c)
{
    return c ? c->sqlstate : "";
}

void pgjobq__clearerr(pgjobq_client *c)
{
    c->errmsg[0] = '\0';
    c->sqlstate[0] = '\0';
}

/* Sets the client's message and returns code, so that callers can write `return pgjobq__seterr(...)`. */
int pgjobq__seterr(pgjobq_client *c, int code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    va_end(ap);
    return code;
}

const char *pgjobq_log_level_name(pgjobq_log_level level)
{
    switch (level) {
    case PGJOBQ_LOG_DEBUG: return "debug";
    case PGJOBQ_LOG_INFO: return "info";
    case PGJOBQ_LOG_WARN: return "warn";
    case PGJOBQ_LOG_ERROR: return "error";
    }
    return "unknown";
}

void pgjobq__log(pgjobq_client *c, pgjobq_log_level level, const char *fmt, ...)
{
    char line[1024];
    va_list ap;

    if (c == NULL || c->log_fn == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    c->log_fn(c->log_arg, level, line);
}

/* Maps a SQLSTATE to the result code a caller can act on.  The Python package maps them to its
 * exceptions alike (python/pgjobq/errors.py, translate): the test errors_c_and_python_map_sqlstates_alike
 * (tests/test_rules.c) holds the two equal. */
int pgjobq__code_from_sqlstate(const char *s)
{
    if (s == NULL || strlen(s) != 5)
        return PGJOBQ_EDB;
    if (strcmp(s, "40001") == 0 || strcmp(s, "40P01") == 0)
        return PGJOBQ_ECONFLICT;
    if (strncmp(s, "08", 2) == 0 || strcmp(s, "57P01") == 0 || strcmp(s, "57P02") == 0 || strcmp(s, "57P03") == 0)
        return PGJOBQ_ECONN;
    if (strcmp(s, "57014") == 0 || strcmp(s, "55P03") == 0)
        return PGJOBQ_ETIMEOUT;
    if (strcmp(s, "42501") == 0)
        return PGJOBQ_EPERM;
    /* A unique violation on pgjobq's tables is a unique key held by a queued or running job (a retry
     * of a job whose key was taken meanwhile). */
    if (strcmp(s, "23505") == 0)
        return PGJOBQ_EDUPLICATE;
    /* Class 22 (data exception) and 23 (integrity constraint violation): the input was bad. */
    if (strncmp(s, "22", 2) == 0 || strncmp(s, "23", 2) == 0)
        return PGJOBQ_EINVAL;
    if (strcmp(s, "42883") == 0 || strcmp(s, "42P01") == 0 || strcmp(s, "3F000") == 0)
        return PGJOBQ_ESCHEMA;
    return PGJOBQ_EDB;
}
