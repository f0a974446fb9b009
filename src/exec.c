/*
 * exec.c - running statements on a client's connection: the library's one statement helper
 * (pgjobq__exec, pgjobq__exec_sql), which makes an owned connection again when it broke, re-runs a
 * statement that lost a serialization conflict outside a transaction, and sets the client's error
 * from what failed; and the session settings of every connection a client opens.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* Copies libpq's message (which ends in a newline) without the newline, after prefix, with every
 * password redacted: libpq's errors about a connection string quote it, whole or in part.  conninfo is
 * the string the connection was opened with, when it is at hand (the connection's own options are
 * looked at too).  Redacted before it is cut to fit, so that no cut can leave part of a password. */
void pgjobq__conn_error(pgjobq_client *c, const char *prefix, const char *conninfo)
{
    const char *m = c->conn ? PQerrorMessage(c->conn) : "out of memory";
    size_t n = strlen(m);
    int k;

    while (n > 0 && (m[n - 1] == '\n' || m[n - 1] == ' '))
        n--;
    k = snprintf(c->errmsg, sizeof c->errmsg, "%s: ", prefix);
    if (k < 0 || (size_t)k >= sizeof c->errmsg)
        return;
    pgjobq__redact(c->errmsg + k, sizeof c->errmsg - (size_t)k, m, n, conninfo, c->conn);
}

int pgjobq__seterr_conn(pgjobq_client *c, int code, const char *prefix)
{
    pgjobq__conn_error(c, prefix, NULL);
    return code;
}

static int run(pgjobq_client *c, const pgjobq__stmt *st, int simple, PGresult **out);

/*
 * Session settings for a connection the client owns, after every (re)connect.  Queue transitions are
 * single statements whose correctness comes from row locks and SKIP LOCKED, designed for READ
 * COMMITTED; under a database-wide SERIALIZABLE default, SSI's predicate locks would make concurrent
 * claims fail with 40001 over and over.  SET rather than the `options` keyword, so that options in
 * the caller's conninfo are kept.
 */
int pgjobq__session_setup(pgjobq_client *c)
{
    static const pgjobq__stmt st = {.what = "connect: setting up the session",
                                    .sql = "SET default_transaction_isolation = 'read committed'"};
    PGresult *r = NULL;
    int rc = run(c, &st, 1, &r);

    PQclear(r);
    return rc;
}

/* Opens an owned connection again and sets its session up; PGJOBQ_OK or the error, set on c. */
static int reconnect(pgjobq_client *c, const char *what)
{
    PQreset(c->conn);
    if (PQstatus(c->conn) != CONNECTION_OK) {
        pgjobq__conn_error(c, what, NULL);
        return PGJOBQ_ECONN;
    }
    return pgjobq__session_setup(c);
}

/* A short random pause before re-running a statement that lost a serialization conflict, so that the
 * contenders do not collide again in lockstep: up to 1, 2, 4 ... 32 ms. */
static void conflict_pause(unsigned attempt)
{
    static _Thread_local unsigned seed;
    struct timespec ts;
    long max_us = 1000L << (attempt < 5 ? attempt : 5);

    if (seed == 0)
        seed = (unsigned)time(NULL) ^ (unsigned)(uintptr_t)&ts;
    seed = seed * 1103515245u + 12345u;
    long us = (long)((seed >> 8) % (unsigned long)max_us);
    ts.tv_sec = 0;
    ts.tv_nsec = us * 1000L;
    nanosleep(&ts, NULL);
}

static void set_result_error(pgjobq_client *c, const char *what, const PGresult *r)
{
    const char *primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    const char *hint = PQresultErrorField(r, PG_DIAG_MESSAGE_HINT);
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);

    if (primary == NULL)
        primary = PQresultErrorMessage(r);
    snprintf(c->errmsg, sizeof c->errmsg, "%s: %s%s%s (SQLSTATE %s)", what, primary, hint ? "; " : "", hint ? hint : "",
             state ? state : "?");
}

/* Sends a statement: one with bound parameters, or (simple) a text that may hold several statements,
 * with the simple protocol.  NULL when libpq could not even make a result. */
static PGresult *send_stmt(pgjobq_client *c, const pgjobq__stmt *st, int simple)
{
    if (simple)
        return PQexec(c->conn, st->sql);
    return PQexecParams(c->conn, st->sql, st->nparams, st->types, st->values, st->lengths, st->formats,
                        st->binary_result);
}

/* Whether a statement succeeded.  (A text of comments only is an empty query: a migration whose
 * functions all moved to the function files.) */
static int succeeded(const PGresult *r)
{
    ExecStatusType s = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    return s == PGRES_TUPLES_OK || s == PGRES_COMMAND_OK || s == PGRES_EMPTY_QUERY;
}

/* Runs st on the idle connection and then t, each as its own transaction, in one round trip (libpq's
 * pipeline mode; without it, in turn).  Returns st's result as send_stmt does; t's is dropped.  (If st
 * fails, t runs all the same: a spurious notification wakes a worker for nothing.) */
static PGresult *send_then(pgjobq_client *c, const pgjobq__stmt *st, const pgjobq__stmt *t)
{
    PGresult *r = NULL;

#ifdef LIBPQ_HAS_PIPELINING
    if (PQenterPipelineMode(c->conn) == 1) {
        PGresult *x;
        int syncs = 0, want = 0;
        if (PQsendQueryParams(c->conn, st->sql, st->nparams, st->types, st->values, st->lengths, st->formats,
                              st->binary_result) == 1 &&
            PQpipelineSync(c->conn) == 1) {
            want = 1;
            if (PQsendQueryParams(c->conn, t->sql, t->nparams, t->types, t->values, t->lengths, t->formats,
                                  t->binary_result) == 1 &&
                PQpipelineSync(c->conn) == 1)
                want = 2;
        }
        /* In order: st's result, then its sync (the server's ReadyForQuery: st's transaction has
         * committed, or failed, by then), t's and its sync; NULL ends each statement's results (six
         * calls in all; the bound only guards against a libpq that answers otherwise).  An error
         * before st's sync (its commit's) replaces st's result. */
        for (int calls = 0; syncs < want && calls < 64 && PQstatus(c->conn) == CONNECTION_OK; calls++) {
            if ((x = PQgetResult(c->conn)) == NULL)
                continue;
            if (PQresultStatus(x) == PGRES_PIPELINE_SYNC)
                syncs++;
            else if (syncs == 0 && (r == NULL || !succeeded(x))) {
                PQclear(r);
                r = x;
                x = NULL;
            }
            PQclear(x);
        }
        /* Without st's sync its commit is not known to have happened (the connection failed): not a
         * success. */
        if (syncs == 0 && succeeded(r)) {
            PQclear(r);
            r = NULL;
        }
        if (PQexitPipelineMode(c->conn) != 1 && PQstatus(c->conn) == CONNECTION_OK)
            PQreset(c->conn); /* results still pending on a live connection (cannot happen): start afresh */
        return r;
    }
#endif
    r = send_stmt(c, st, 0);
    if (succeeded(r))
        PQclear(send_stmt(c, t, 0));
    return r;
}

/* Sets the error of a statement that failed (r may be NULL) on c and returns its code. */
static int stmt_error(pgjobq_client *c, const char *what, const PGresult *r)
{
    if (r == NULL || PQstatus(c->conn) != CONNECTION_OK) {
        pgjobq__conn_error(c, what, NULL);
        return PGJOBQ_ECONN;
    }
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    set_result_error(c, what, r);
    if (state && strcmp(state, "25006") == 0) {
        size_t n = strlen(c->errmsg);
        snprintf(c->errmsg + n, sizeof c->errmsg - n,
                 "; the server is read-only (a standby?): use a URL that reaches the primary, e.g. with"
                 " target_session_attrs=read-write");
    }
    snprintf(c->sqlstate, sizeof c->sqlstate, "%s", state ? state : "");
    return pgjobq__code_from_sqlstate(state);
}

/* Runs one statement once, on the connection as it is: no reconnect, no retry.  PGJOBQ_OK with the
 * result in *out (the caller clears it), or the error, set on c. */
static int run(pgjobq_client *c, const pgjobq__stmt *st, int simple, PGresult **out)
{
    PGresult *r = send_stmt(c, st, simple);

    *out = NULL;
    if (succeeded(r)) {
        *out = r;
        return PGJOBQ_OK;
    }
    int code = stmt_error(c, st->what, r);
    PQclear(r);
    return code;
}

/* The statement helper of the library: pgjobq__exec and pgjobq__exec_sql. */
static int exec(pgjobq_client *c, const pgjobq__stmt *st, const pgjobq__stmt *then, int simple, PGresult **out)
{
    int in_tx;

    *out = NULL;
    pgjobq__clearerr(c);
    if (c->conn == NULL)
        return pgjobq__seterr(c, PGJOBQ_ECONN, "%s: no connection", st->what);
    if (PQstatus(c->conn) != CONNECTION_OK) {
        /* An owned connection that broke earlier is re-established once, here, so that a caller who
         * saw PGJOBQ_ECONN can simply try again.  A borrowed connection is the caller's to reset. */
        if (!c->owned) {
            pgjobq__conn_error(c, st->what, NULL);
            return PGJOBQ_ECONN;
        }
        int rc = reconnect(c, st->what);
        if (rc != PGJOBQ_OK)
            return rc;
        pgjobq__log(c, PGJOBQ_LOG_INFO, "reconnected to the database");
    }
    /* Inside the caller's transaction a failed statement has aborted the whole transaction, so only
     * the caller can retry; on our own (idle) connection the statement was its own transaction. */
    in_tx = PQtransactionStatus(c->conn) != PQTRANS_IDLE;

    int reset_read_only = 0;
    for (unsigned attempt = 0;; attempt++) {
        PGresult *r = then && !in_tx ? send_then(c, st, then) : send_stmt(c, st, simple);
        const char *state;

        if (succeeded(r)) {
            *out = r;
            return PGJOBQ_OK;
        }
        if (r == NULL || PQstatus(c->conn) != CONNECTION_OK) {
            PQclear(r);
            pgjobq__conn_error(c, st->what, NULL);
            return PGJOBQ_ECONN;
        }
        state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        /* A read-only server (a standby reached by mistake, or a primary demoted under a live session):
         * our own idle connection is dropped and made again once, which with a multi-host URL and
         * target_session_attrs=read-write reaches the primary. */
        if (state && strcmp(state, "25006") == 0 && c->owned && !in_tx && !reset_read_only) {
            const char *host = PQhost(c->conn), *port = PQport(c->conn);
            pgjobq__log(c, PGJOBQ_LOG_WARN, "%s: the server at %s:%s is read-only; connecting again", st->what,
                        host ? host : "?", port ? port : "?");
            PQclear(r);
            reset_read_only = 1;
            int rc = reconnect(c, st->what);
            if (rc != PGJOBQ_OK)
                return rc;
            continue;
        }
        if (pgjobq__code_from_sqlstate(state) == PGJOBQ_ECONFLICT && !in_tx && attempt < PGJOBQ__CONFLICT_RETRIES) {
            pgjobq__log(c, PGJOBQ_LOG_DEBUG, "%s: SQLSTATE %s, running it again (retry %u)", st->what, state,
                        attempt + 1);
            c->conflict_retries++;
            PQclear(r);
            conflict_pause(attempt);
            continue;
        }
        int code = stmt_error(c, st->what, r);
        PQclear(r);
        return code;
    }
}

int pgjobq__exec(pgjobq_client *c, const pgjobq__stmt *st, PGresult **out)
{
    return exec(c, st, NULL, 0, out);
}

int pgjobq__exec_then(pgjobq_client *c, const pgjobq__stmt *st, const pgjobq__stmt *then, PGresult **out)
{
    return exec(c, st, then, 0, out);
}

int pgjobq__exec_sql(pgjobq_client *c, const char *what, const char *sql, PGresult **out)
{
    const pgjobq__stmt st = {.what = what, .sql = sql};
    PGresult *r = NULL;
    int rc = exec(c, &st, NULL, 1, &r);

    if (out)
        *out = r;
    else
        PQclear(r);
    return rc;
}

void pgjobq__rollback_quietly(pgjobq_client *c)
{
    char errmsg[sizeof c->errmsg], sqlstate[sizeof c->sqlstate];

    if (c->conn == NULL || PQstatus(c->conn) != CONNECTION_OK || PQtransactionStatus(c->conn) == PQTRANS_IDLE)
        return;
    memcpy(errmsg, c->errmsg, sizeof errmsg);
    memcpy(sqlstate, c->sqlstate, sizeof sqlstate);
    if (pgjobq__exec_sql(c, "ROLLBACK", "ROLLBACK", NULL) != PGJOBQ_OK) {
        /* Nothing to do: the transaction ends with the connection, and the first error is the one to
         * report. */
    }
    memcpy(c->errmsg, errmsg, sizeof errmsg);
    memcpy(c->sqlstate, sqlstate, sizeof sqlstate);
}
