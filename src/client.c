/*
 * client.c - the client handle: connecting, wrapping a caller's connection, its transactions, and
 * routing libpq notices to the log.  Statements run through exec.c; the schema check is schema.c's.
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
        pgjobq__conn_error(c, "connect", conninfo);
        return PGJOBQ_ECONN;
    }
    int rc = pgjobq__session_setup(c);
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
        pgjobq__conn_error(c, "wrap", NULL);
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
