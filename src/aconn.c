/*
 * aconn.c - one asynchronous connection of the worker.  It connects without blocking (PQconnectPoll,
 * with a deadline of its own: libpq's connect_timeout only applies to blocking connects), runs its
 * setup (session settings and the schema check in one simple query, then one PREPARE per
 * statement), and then carries one statement at a time.  A broken connection schedules its own
 * retry with backoff and jitter.  Nothing here blocks, except libpq's resolution of a host name.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#define RETRY_MIN_MS 100
#define RETRY_MAX_MS 30000
#define CONNECT_TIMEOUT_MS 10000

/* Keeps why (often libpq's message, which can quote the conninfo) without its last newline and with
 * every password redacted: it goes to the worker's log and error. */
static void set_err(pgjobq__aconn *ac, const char *why)
{
    size_t n = strlen(why);
    while (n > 0 && (why[n - 1] == '\n' || why[n - 1] == ' '))
        n--;
    pgjobq__redact(ac->err, sizeof ac->err, why, n, ac->conninfo, ac->pg);
}

void pgjobq__aconn_fail(pgjobq__aconn *ac, const char *why, int64_t now_ms)
{
    set_err(ac, why);
    pgjobq__aconn_close(ac);
    ac->retry_delay_ms = pgjobq__backoff_next(ac->retry_delay_ms, RETRY_MIN_MS, RETRY_MAX_MS);
    ac->retry_at_ms = now_ms + pgjobq__jitter(ac->retry_delay_ms, &ac->seed);
}

void pgjobq__aconn_close(pgjobq__aconn *ac)
{
    if (ac->pg)
        PQfinish(ac->pg);
    PQclear(ac->result);
    ac->pg = NULL;
    ac->result = NULL;
    ac->state = PGJOBQ__AC_DOWN;
    ac->busy = ac->flushing = ac->poll_write = 0;
}

/* The connect timeout: the conninfo's connect_timeout when it has one, else 10 s. */
static int64_t connect_timeout(const char *conninfo)
{
    char *why = NULL;
    PQconninfoOption *opts = PQconninfoParse(conninfo, &why);
    int64_t ms = CONNECT_TIMEOUT_MS;

    PQfreemem(why);
    for (PQconninfoOption *o = opts; o && o->keyword; o++)
        if (strcmp(o->keyword, "connect_timeout") == 0 && o->val && atoi(o->val) > 0)
            ms = (int64_t)atoi(o->val) * 1000;
    PQconninfoFree(opts);
    return ms;
}

void pgjobq__aconn_start(pgjobq__aconn *ac, int64_t now_ms)
{
    char timeout_s[32], appname[64];

    if (ac->state != PGJOBQ__AC_DOWN || now_ms < ac->retry_at_ms)
        return;
    snprintf(timeout_s, sizeof timeout_s, "%lld", (long long)ac->tcp_timeout_ms);
    snprintf(appname, sizeof appname, "pgjobq-%s", ac->name);
    /* The conninfo (a URL or key=value string) is expanded first; the keywords after it override it,
     * so the connection always speaks UTF-8, which is what the payload checks assume. */
    const char *const keys[] = {"dbname", "client_encoding", "fallback_application_name", "tcp_user_timeout", NULL};
    const char *const vals[] = {ac->conninfo, "UTF8", appname, timeout_s, NULL};
    if (ac->connect_timeout_ms == 0)
        ac->connect_timeout_ms = connect_timeout(ac->conninfo);
    ac->pg = PQconnectStartParams(keys, vals, 1);
    if (ac->pg == NULL || PQstatus(ac->pg) == CONNECTION_BAD) {
        pgjobq__aconn_fail(ac, ac->pg ? PQerrorMessage(ac->pg) : "connect: out of memory", now_ms);
        ac->lost_pending = 1;
        return;
    }
    if (ac->notice)
        PQsetNoticeProcessor(ac->pg, ac->notice, ac->notice_arg);
    ac->state = PGJOBQ__AC_CONNECTING;
    ac->poll_write = 1; /* libpq: "consider the status to be PGRES_POLLING_WRITING" at first */
    ac->deadline_ms = now_ms + ac->connect_timeout_ms;
}

/* "host:port" of the server the connection reached (for log lines). */
const char *pgjobq__aconn_where(const pgjobq__aconn *ac, char *buf, size_t size)
{
    const char *host = ac->pg ? PQhost(ac->pg) : NULL, *port = ac->pg ? PQport(ac->pg) : NULL;

    if (host == NULL || *host == '\0')
        snprintf(buf, size, "(unknown)");
    else if (host[0] == '/')
        snprintf(buf, size, "%s/.s.PGSQL.%s", host, port && *port ? port : "5432");
    else
        snprintf(buf, size, "%s:%s", host, port && *port ? port : "5432");
    return buf;
}

/* The session reached a server that cannot write (a standby, or default_transaction_read_only): it is
 * dropped and connected again later, which with target_session_attrs=read-write (or once the server
 * is promoted) reaches the primary. */
static void read_only(pgjobq__aconn *ac, int64_t now_ms)
{
    char where[300], why[400];

    snprintf(why, sizeof why,
             "the server at %s is read-only (a standby, or default_transaction_read_only is on): dropped;"
             " add target_session_attrs=read-write to a multi-host URL",
             pgjobq__aconn_where(ac, where, sizeof where));
    pgjobq__aconn_fail(ac, why, now_ms);
}

/* Flushes what libpq still holds; -1 when the connection broke. */
static int flush(pgjobq__aconn *ac, int64_t now_ms)
{
    int r = PQflush(ac->pg);
    if (r < 0) {
        pgjobq__aconn_fail(ac, PQerrorMessage(ac->pg), now_ms);
        return -1;
    }
    ac->flushing = r == 1;
    return 0;
}

/* Sends the next setup step: the session query, then one PREPARE per statement. */
static int setup_send(pgjobq__aconn *ac, int64_t now_ms)
{
    int ok;

    if (ac->step == 0)
        ok = PQsendQuery(ac->pg, ac->setup_sql);
    else {
        const pgjobq__stmtdef *s = &ac->stmts[ac->step - 1];
        ok = PQsendPrepare(ac->pg, s->name, s->sql, s->nparams, s->types);
    }
    if (!ok) {
        pgjobq__aconn_fail(ac, PQerrorMessage(ac->pg), now_ms);
        return -1;
    }
    ac->busy = 1;
    return flush(ac, now_ms);
}

/* Checks the result of the setup step that just ended; returns an event, or NONE to go on. */
static int setup_result(pgjobq__aconn *ac, PGresult *r, int64_t now_ms)
{
    ExecStatusType st = PQresultStatus(r);

    if (st == PGRES_FATAL_ERROR || (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)) {
        const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        char why[400];
        if (state && strcmp(state, "25006") == 0) { /* LISTEN on a standby */
            read_only(ac, now_ms);
            return PGJOBQ__AC_EV_LOST;
        }
        snprintf(why, sizeof why, "setting up the %s connection: %s", ac->name, PQresultErrorMessage(r));
        if (ac->step == 0 && state && strcmp(state, "42P01") == 0) {
            set_err(ac, "the pgjobq schema is not installed in this database: run `pgjobq migrate`");
            pgjobq__aconn_close(ac);
            return PGJOBQ__AC_EV_SCHEMA;
        }
        pgjobq__aconn_fail(ac, why, now_ms);
        return PGJOBQ__AC_EV_LOST;
    }
    if (ac->step == 0) {
        int version = st == PGRES_TUPLES_OK && PQntuples(r) == 1 ? atoi(PQgetvalue(r, 0, 0)) : -1;
        /* The setup's last statement (version, needs, read-only: worker.c) also says whether this
         * session can write. */
        if (st == PGRES_TUPLES_OK && PQntuples(r) == 1 && PQnfields(r) > 2 && strcmp(PQgetvalue(r, 0, 2), "t") == 0) {
            read_only(ac, now_ms);
            return PGJOBQ__AC_EV_LOST;
        }
        int needs = st == PGRES_TUPLES_OK && PQntuples(r) == 1 && PQnfields(r) > 1 ? atoi(PQgetvalue(r, 0, 1)) : 0;
        if (!pgjobq__schema_usable(version, needs)) {
            char why[300];
            snprintf(why, sizeof why,
                     "the database has pgjobq schema version %d; this pgjobq %s needs version %d: %s", version,
                     PGJOBQ_VERSION, PGJOBQ_SCHEMA_VERSION,
                     version < PGJOBQ_SCHEMA_VERSION ? "run `pgjobq migrate`" : "upgrade pgjobq");
            set_err(ac, why);
            pgjobq__aconn_close(ac);
            return PGJOBQ__AC_EV_SCHEMA;
        }
    }
    ac->step++;
    if (ac->prepare && ac->step <= ac->nstmts)
        return setup_send(ac, now_ms) == 0 ? PGJOBQ__AC_EV_NONE : PGJOBQ__AC_EV_LOST;
    ac->state = PGJOBQ__AC_READY;
    ac->retry_delay_ms = 0;
    return PGJOBQ__AC_EV_READY;
}

/* Reads the results that have arrived; returns 1 when the statement in flight has ended (its first
 * error, or else its last result, is in ac->result), 0 when more input is needed. */
static int gather(pgjobq__aconn *ac)
{
    while (!PQisBusy(ac->pg)) {
        PGresult *r = PQgetResult(ac->pg);
        if (r == NULL) {
            ac->busy = 0;
            return 1;
        }
        /* Keep the first error; otherwise the latest result (a simple query with several statements
         * yields one per statement, and the setup's schema check is the last). */
        if (ac->result && PQresultStatus(ac->result) == PGRES_FATAL_ERROR)
            PQclear(r);
        else {
            PQclear(ac->result);
            ac->result = r;
        }
    }
    return 0;
}

int pgjobq__aconn_io(pgjobq__aconn *ac, short revents, int64_t now_ms)
{
    if (ac->lost_pending) {
        ac->lost_pending = 0;
        return PGJOBQ__AC_EV_LOST;
    }
    if (ac->state == PGJOBQ__AC_DOWN)
        return PGJOBQ__AC_EV_NONE;
    if (ac->state == PGJOBQ__AC_CONNECTING) {
        if (now_ms >= ac->deadline_ms) {
            pgjobq__aconn_fail(ac, "timed out connecting", now_ms);
            return PGJOBQ__AC_EV_LOST;
        }
        if (!(revents & (POLLIN | POLLOUT | POLLERR | POLLHUP)))
            return PGJOBQ__AC_EV_NONE;
        switch (PQconnectPoll(ac->pg)) {
        case PGRES_POLLING_READING: ac->poll_write = 0; return PGJOBQ__AC_EV_NONE;
        case PGRES_POLLING_WRITING: ac->poll_write = 1; return PGJOBQ__AC_EV_NONE;
        case PGRES_POLLING_OK:
            if (PQsetnonblocking(ac->pg, 1) != 0) {
                pgjobq__aconn_fail(ac, PQerrorMessage(ac->pg), now_ms);
                return PGJOBQ__AC_EV_LOST;
            }
            ac->state = PGJOBQ__AC_SETUP;
            ac->step = 0;
            return setup_send(ac, now_ms) == 0 ? PGJOBQ__AC_EV_NONE : PGJOBQ__AC_EV_LOST;
        default:
            pgjobq__aconn_fail(ac, PQerrorMessage(ac->pg), now_ms);
            return PGJOBQ__AC_EV_LOST;
        }
    }
    /* Setting up or ready. */
    if (ac->flushing && (revents & (POLLOUT | POLLERR | POLLHUP)) && flush(ac, now_ms) != 0)
        return PGJOBQ__AC_EV_LOST;
    if ((revents & (POLLIN | POLLERR | POLLHUP)) && !PQconsumeInput(ac->pg)) {
        pgjobq__aconn_fail(ac, PQerrorMessage(ac->pg), now_ms);
        return PGJOBQ__AC_EV_LOST;
    }
    if (ac->state == PGJOBQ__AC_SETUP && now_ms >= ac->deadline_ms) {
        pgjobq__aconn_fail(ac, "timed out setting up the connection", now_ms);
        return PGJOBQ__AC_EV_LOST;
    }
    if (!ac->busy || ac->flushing || !gather(ac)) {
        if (PQstatus(ac->pg) == CONNECTION_BAD) {
            pgjobq__aconn_fail(ac, PQerrorMessage(ac->pg), now_ms);
            return PGJOBQ__AC_EV_LOST;
        }
        return PGJOBQ__AC_EV_NONE;
    }
    /* The statement in flight has ended. */
    if (PQstatus(ac->pg) == CONNECTION_BAD) {
        pgjobq__aconn_fail(ac, PQerrorMessage(ac->pg), now_ms);
        return PGJOBQ__AC_EV_LOST;
    }
    /* A server that became read-only under a live session (demoted by an HA manager without a restart,
     * or default_transaction_read_only set): nothing more can be written here. */
    if (ac->state == PGJOBQ__AC_READY && ac->result && PQresultStatus(ac->result) == PGRES_FATAL_ERROR) {
        const char *state = PQresultErrorField(ac->result, PG_DIAG_SQLSTATE);
        if (state && strcmp(state, "25006") == 0) {
            read_only(ac, now_ms);
            return PGJOBQ__AC_EV_LOST;
        }
    }
    if (ac->state == PGJOBQ__AC_SETUP) {
        PGresult *r = ac->result;
        int ev;
        ac->result = NULL;
        ev = r ? setup_result(ac, r, now_ms) : PGJOBQ__AC_EV_NONE;
        PQclear(r);
        return ev;
    }
    return PGJOBQ__AC_EV_RESULT;
}

/* After PQsend*: the statement is in flight (0), or the connection broke (-1; reported as lost by the
 * next pgjobq__aconn_io). */
static int sent(pgjobq__aconn *ac, int ok, int64_t now_ms)
{
    if (!ok) {
        pgjobq__aconn_fail(ac, PQerrorMessage(ac->pg), now_ms);
        ac->lost_pending = 1;
        return -1;
    }
    ac->busy = 1;
    if (flush(ac, now_ms) != 0) {
        ac->lost_pending = 1;
        return -1;
    }
    return 0;
}

int pgjobq__aconn_send(pgjobq__aconn *ac, int stmt, const char *const *values, const int *lengths,
                       const int *formats, int binary_result, int64_t now_ms)
{
    const pgjobq__stmtdef *s = &ac->stmts[stmt];
    int ok = ac->prepare
                 ? PQsendQueryPrepared(ac->pg, s->name, s->nparams, values, lengths, formats, binary_result)
                 : PQsendQueryParams(ac->pg, s->sql, s->nparams, s->types, values, lengths, formats, binary_result);

    return sent(ac, ok, now_ms);
}

int pgjobq__aconn_send_simple(pgjobq__aconn *ac, const char *sql, int64_t now_ms)
{
    return sent(ac, PQsendQuery(ac->pg, sql), now_ms);
}

PGresult *pgjobq__aconn_take(pgjobq__aconn *ac)
{
    PGresult *r = ac->result;
    ac->result = NULL;
    return r;
}

int pgjobq__aconn_idle(const pgjobq__aconn *ac)
{
    return ac->state == PGJOBQ__AC_READY && !ac->busy;
}

void pgjobq__aconn_pollfd(const pgjobq__aconn *ac, int *fd, short *events)
{
    *fd = -1;
    *events = 0;
    if (ac->pg == NULL || ac->state == PGJOBQ__AC_DOWN)
        return;
    *fd = PQsocket(ac->pg);
    if (ac->state == PGJOBQ__AC_CONNECTING)
        *events = ac->poll_write ? POLLOUT : POLLIN;
    else
        *events = (short)(POLLIN | (ac->flushing ? POLLOUT : 0));
}

int64_t pgjobq__aconn_next_ms(const pgjobq__aconn *ac)
{
    switch (ac->state) {
    case PGJOBQ__AC_DOWN: return ac->retry_at_ms;
    case PGJOBQ__AC_CONNECTING:
    case PGJOBQ__AC_SETUP: return ac->deadline_ms;
    default: return INT64_MAX;
    }
}
