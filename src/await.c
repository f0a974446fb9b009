/* Waiting for a job to finish (pgjobq_job_wait): LISTEN pgjobq_done, register the wait
 * (pgjobq.await_begin), read the job whenever a notification names it, and every
 * PGJOBQ__WAIT_POLL_MS in case one was missed (sql/functions/await.sql, docs/durable.md). */

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "internal.h"

/* The fallback: a job is read again this often even when no notification came (one can be missed
 * in a short window: a job that finished while its wait was being registered). */
#define PGJOBQ__WAIT_POLL_MS 10000

static int simple(pgjobq_client *c, const char *what, const char *sql, int64_t id, PGresult **out)
{
    static const Oid types[] = {OID_INT8};
    char id_s[24];
    const char *values[1] = {id_s};

    snprintf(id_s, sizeof id_s, "%lld", (long long)id);
    pgjobq__stmt st = {what, sql, id ? 1 : 0, id ? types : NULL, id ? values : NULL, NULL, NULL, 0};
    return pgjobq__exec(c, &st, out);
}

/* Whether a notification received names job id (or says to look again: an empty payload). */
static int notified(pgjobq_client *c, int64_t id)
{
    PGnotify *n;
    int hit = 0;
    char want[24];
    size_t wlen = (size_t)snprintf(want, sizeof want, "%lld", (long long)id);

    while ((n = PQnotifies(c->conn)) != NULL) {
        if (strcmp(n->relname, "pgjobq_done") == 0) {
            const char *p = n->extra;
            if (p == NULL || *p == '\0')
                hit = 1;
            while (p && *p && !hit) {
                size_t len = strcspn(p, ",");
                hit = len == wlen && memcmp(p, want, len) == 0;
                p += len + (p[len] == ',');
            }
        }
        PQfreemem(n);
    }
    return hit;
}

static int is_final(pgjobq_state s)
{
    return s == PGJOBQ_COMPLETED || s == PGJOBQ_FAILED || s == PGJOBQ_CANCELLED;
}

int pgjobq_job_wait(pgjobq_client *c, int64_t id, int64_t timeout_ms, pgjobq_job **job_out)
{
    PGresult *r = NULL;
    pgjobq_job *job = NULL;
    int rc, end_rc;

    if (job_out)
        *job_out = NULL;
    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    if ((rc = pgjobq__require_schema(c)) != PGJOBQ_OK)
        return rc;
    if (job_out == NULL || id < 1)
        return pgjobq__seterr(c, PGJOBQ_EINVAL, "wait: job_out is required, and an id is at least 1");
    if (PQtransactionStatus(c->conn) != PQTRANS_IDLE)
        return pgjobq__seterr(c, PGJOBQ_EINVAL,
                              "wait: the connection is in a transaction (a wait needs its "
                              "notifications, which a transaction holds back until it ends)");
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : pgjobq__mono_ms() + timeout_ms;

    if ((rc = simple(c, "wait", "LISTEN pgjobq_done", 0, &r)) != PGJOBQ_OK)
        return rc;
    PQclear(r);
    rc = simple(c, "wait", "SELECT state FROM pgjobq.await_begin($1)", id, &r);
    if (rc == PGJOBQ_OK && PQntuples(r) == 0)
        rc = pgjobq__seterr(c, PGJOBQ_ENOTFOUND, "no job %lld", (long long)id);
    PQclear(r);
    while (rc == PGJOBQ_OK) {
        rc = pgjobq_job_get(c, id, &job);
        if (rc != PGJOBQ_OK || is_final(job->state))
            break;
        int64_t now = pgjobq__mono_ms();
        if (now >= deadline) {
            rc = pgjobq__seterr(c, PGJOBQ_ETIMEOUT, "job %lld has not finished (it is %s)", (long long)id,
                                pgjobq_state_name(job->state));
            break;
        }
        pgjobq_jobs_free(job);
        job = NULL;
        /* A notification that came while the job was read (libpq keeps it: the socket says nothing
         * more) may be of a commit after the read's snapshot: read again. */
        if (notified(c, id))
            continue;
        /* Until a notification names the job, the fallback's time, or the deadline. */
        int64_t until = now + PGJOBQ__WAIT_POLL_MS < deadline ? now + PGJOBQ__WAIT_POLL_MS : deadline;
        while (rc == PGJOBQ_OK && (now = pgjobq__mono_ms()) < until) {
            struct pollfd p = {PQsocket(c->conn), POLLIN, 0};
            int64_t left = until - now;
            if (p.fd < 0) {
                rc = pgjobq__seterr(c, PGJOBQ_ECONN, "wait: the connection is lost");
                break;
            }
            if (poll(&p, 1, left > 60000 ? 60000 : (int)left) < 0 && errno != EINTR) {
                rc = pgjobq__seterr(c, PGJOBQ_ECONN, "wait: poll: %s", strerror(errno));
                break;
            }
            if (p.revents && !PQconsumeInput(c->conn)) {
                rc = pgjobq__seterr(c, PGJOBQ_ECONN, "wait: %s", PQerrorMessage(c->conn));
                break;
            }
            if (notified(c, id))
                break;
        }
    }
    /* Always: the wait ends (its row, its LISTEN), whatever ended it; the first error is the one said. */
    if (PQstatus(c->conn) == CONNECTION_OK) {
        char keep[sizeof c->errmsg], state[sizeof c->sqlstate];
        memcpy(keep, c->errmsg, sizeof keep);
        memcpy(state, c->sqlstate, sizeof state);
        end_rc = simple(c, "wait", "SELECT pgjobq.await_end($1)", id, &r);
        if (end_rc == PGJOBQ_OK)
            PQclear(r);
        if (end_rc == PGJOBQ_OK && (end_rc = simple(c, "wait", "UNLISTEN pgjobq_done", 0, &r)) == PGJOBQ_OK)
            PQclear(r);
        (void)notified(c, id);
        if (rc != PGJOBQ_OK || end_rc == PGJOBQ_OK) {
            memcpy(c->errmsg, keep, sizeof keep);
            memcpy(c->sqlstate, state, sizeof state);
        } else {
            rc = end_rc;
        }
    }
    if (rc == PGJOBQ_OK || rc == PGJOBQ_ETIMEOUT)
        *job_out = job;
    else
        pgjobq_jobs_free(job);
    return rc;
}
