/*
 * client.c - the client handle: connecting, wrapping a caller's connection, running statements with
 * bounded retries of serialization failures and deadlocks, and routing libpq notices to the log.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

const char *pgjobq_version(void)
{
    return PGJOBQ_VERSION;
}

int pgjobq_version_num(void)
{
    return PGJOBQ_VERSION_NUM;
}

static pgjobq_client *client_new(void)
{
    pgjobq_client *c = calloc(1, sizeof *c);
    return c;
}

/* Copies libpq's message (which ends in a newline) without the newline, after prefix, with every
 * password redacted: libpq's errors about a connection string quote it, whole or in part.  conninfo is
 * the string the connection was opened with, when it is at hand (the connection's own options are
 * looked at too).  Redacted before it is cut to fit, so that no cut can leave part of a password. */
static void set_conn_error(pgjobq_client *c, const char *prefix, const char *conninfo)
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
    set_conn_error(c, prefix, NULL);
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
static int session_setup(pgjobq_client *c)
{
    static const pgjobq__stmt st = {.what = "connect: setting up the session",
                                    .sql = "SET default_transaction_isolation = 'read committed'"};
    PGresult *r = NULL;
    int rc = run(c, &st, 1, &r);

    PQclear(r);
    return rc;
}

int pgjobq_client_open(pgjobq_client **out, const char *conninfo)
{
    return pgjobq__client_open_timeout(out, conninfo, 0);
}

/* Like pgjobq_client_open; with tcp_timeout_ms > 0 the connection also gives up on an unanswered
 * network (a half-open partition) after that long (tcp_user_timeout), and on connecting after 10 s
 * unless the conninfo says otherwise, so that a blocked call cannot outlast a lease. */
int pgjobq__client_open_timeout(pgjobq_client **out, const char *conninfo, int64_t tcp_timeout_ms)
{
    /* The conninfo (a URL or key=value string) is expanded first; the keywords after it override it,
     * so the connection always speaks UTF-8, which is what the payload checks assume. */
    const char *keys[6] = {"dbname", "client_encoding", "fallback_application_name", NULL, NULL, NULL};
    const char *vals[6] = {conninfo ? conninfo : "", "UTF8", "pgjobq", NULL, NULL, NULL};
    char timeout_s[32];
    int k = 3;
    pgjobq_client *c;

    if (tcp_timeout_ms > 0) {
        snprintf(timeout_s, sizeof timeout_s, "%lld", (long long)tcp_timeout_ms);
        keys[k] = "tcp_user_timeout";
        vals[k++] = timeout_s;
        if (conninfo == NULL || strstr(conninfo, "connect_timeout") == NULL) {
            keys[k] = "connect_timeout";
            vals[k++] = "10";
        }
    }

    *out = NULL;
    c = client_new();
    if (c == NULL)
        return PGJOBQ_ENOMEM;
    *out = c;
    c->owned = 1;
    c->conn = PQconnectdbParams((const char *const *)keys, (const char *const *)vals, 1);
    if (c->conn == NULL)
        return pgjobq__seterr(c, PGJOBQ_ENOMEM, "connect: out of memory");
    if (PQstatus(c->conn) != CONNECTION_OK) {
        set_conn_error(c, "connect", conninfo);
        return PGJOBQ_ECONN;
    }
    int rc = session_setup(c);
    if (rc != PGJOBQ_OK)
        return rc;
    return pgjobq__check_schema(c);
}

int pgjobq_client_wrap(pgjobq_client **out, struct pg_conn *conn)
{
    pgjobq_client *c;

    *out = NULL;
    c = client_new();
    if (c == NULL)
        return PGJOBQ_ENOMEM;
    *out = c;
    if (conn == NULL)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "wrap: no connection given");
    c->conn = conn;
    c->owned = 0;
    if (PQstatus(conn) != CONNECTION_OK) {
        set_conn_error(c, "wrap", NULL);
        return PGJOBQ_ECONN;
    }
    return pgjobq__check_schema(c);
}

static void notice_to_log(void *arg, const char *message)
{
    pgjobq_client *c = arg;
    size_t n = strlen(message);

    while (n > 0 && message[n - 1] == '\n')
        n--;
    pgjobq__log(c, PGJOBQ_LOG_WARN, "server: %.*s", (int)n, message);
}

void pgjobq_client_close(pgjobq_client *c)
{
    if (c == NULL)
        return;
    if (c->conn && c->owned)
        PQfinish(c->conn);
    free(c);
}

struct pg_conn *pgjobq_client_conn(pgjobq_client *c)
{
    return c ? c->conn : NULL;
}

void pgjobq_client_set_log(pgjobq_client *c, pgjobq_log_fn fn, void *arg)
{
    if (c == NULL)
        return;
    c->log_fn = fn;
    c->log_arg = arg;
    /* A wrapped connection's notice processor belongs to the caller and is left alone. */
    if (c->conn && c->owned) {
        if (fn)
            PQsetNoticeProcessor(c->conn, notice_to_log, c);
        else
            PQsetNoticeProcessor(c->conn, NULL, NULL); /* libpq's default: stderr */
    }
}

/* Opens an owned connection again and sets its session up; PGJOBQ_OK or the error, set on c. */
static int reconnect(pgjobq_client *c, const char *what)
{
    PQreset(c->conn);
    if (PQstatus(c->conn) != CONNECTION_OK) {
        set_conn_error(c, what, NULL);
        return PGJOBQ_ECONN;
    }
    return session_setup(c);
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

/* Sets the error of a statement that failed (r may be NULL) on c and returns its code. */
static int stmt_error(pgjobq_client *c, const char *what, const PGresult *r)
{
    if (r == NULL || PQstatus(c->conn) != CONNECTION_OK) {
        set_conn_error(c, what, NULL);
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
static int exec(pgjobq_client *c, const pgjobq__stmt *st, int simple, PGresult **out)
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
            set_conn_error(c, st->what, NULL);
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
        PGresult *r = send_stmt(c, st, simple);
        const char *state;

        if (succeeded(r)) {
            *out = r;
            return PGJOBQ_OK;
        }
        if (r == NULL || PQstatus(c->conn) != CONNECTION_OK) {
            PQclear(r);
            set_conn_error(c, st->what, NULL);
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
    return exec(c, st, 0, out);
}

int pgjobq__exec_sql(pgjobq_client *c, const char *what, const char *sql, PGresult **out)
{
    const pgjobq__stmt st = {.what = what, .sql = sql};
    PGresult *r = NULL;
    int rc = exec(c, &st, 1, &r);

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

int pgjobq__require_schema(pgjobq_client *c)
{
    if (c->schema_state == 1)
        return PGJOBQ_OK;
    if (c->schema_state == -1)
        return pgjobq__seterr(c, PGJOBQ_ESCHEMA,
                              "the database's pgjobq schema is newer than this library (version %d): "
                              "upgrade pgjobq",
                              PGJOBQ_SCHEMA_VERSION);
    return pgjobq__seterr(c, PGJOBQ_ESCHEMA,
                          "the pgjobq schema is not installed or is out of date: "
                          "run `pgjobq migrate` (or pgjobq_migrate())");
}

/* Runs BEGIN, COMMIT or ROLLBACK; `want_idle` is whether the connection must be outside a transaction. */
static int tx_command(pgjobq_client *c, const char *sql, int want_idle)
{
    PGresult *r;
    int idle;

    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    if (!c->owned)
        return pgjobq__seterr(c, PGJOBQ_ESTATE, "%s: the connection is the caller's; use its own transactions", sql);
    if (c->conn == NULL || PQstatus(c->conn) != CONNECTION_OK)
        return pgjobq__seterr(c, PGJOBQ_ECONN, "%s: not connected", sql);
    idle = PQtransactionStatus(c->conn) == PQTRANS_IDLE;
    if (idle != want_idle)
        return pgjobq__seterr(c, PGJOBQ_ESTATE, "%s: %s", sql,
                              idle ? "no transaction is open" : "a transaction is already open");
    int rc = pgjobq__exec_sql(c, sql, sql, &r);
    if (rc != PGJOBQ_OK)
        return rc;
    /* COMMIT of a failed transaction succeeds as a command but reports ROLLBACK. */
    int rolled_back = strcmp(sql, "COMMIT") == 0 && strcmp(PQcmdStatus(r), "ROLLBACK") == 0;
    PQclear(r);
    if (rolled_back)
        return pgjobq__seterr(c, PGJOBQ_EDB, "COMMIT: the transaction had failed and was rolled back");
    return PGJOBQ_OK;
}

int pgjobq_begin(pgjobq_client *c)
{
    return tx_command(c, "BEGIN", 1);
}

int pgjobq_commit(pgjobq_client *c)
{
    return tx_command(c, "COMMIT", 0);
}

int pgjobq_rollback(pgjobq_client *c)
{
    return tx_command(c, "ROLLBACK", 0);
}
