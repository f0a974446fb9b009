/*
 * serve_pool.c - the dashboard's page connections: one per HTTP worker thread, opened when a page
 * first needs it and again after it broke, each under the page query timeout; and the runner of a
 * page's read query.
 */
#include <stdlib.h>
#include <string.h>

#include "serve_dashboard.h"
#include "serve_log.h"

int serve_pool_init(serve *s)
{
    if (pthread_mutex_init(&s->pool_mu, NULL) != 0)
        return -1;
    if (pthread_cond_init(&s->pool_cv, NULL) != 0) {
        pthread_mutex_destroy(&s->pool_mu);
        return -1;
    }
    return 0;
}

void serve_pool_close(serve *s)
{
    for (int i = 0; i < POOL; i++)
        pgjobq_client_close(s->pool[i]);
    pthread_mutex_destroy(&s->pool_mu);
    pthread_cond_destroy(&s->pool_cv);
}

/* A connection for one request; NULL after logging why (the page then says the database is down). */
pgjobq_client *serve_pool_get(serve *s, int *slot)
{
    return serve_pool_get_shard(s, 0, slot);
}

int serve_shard_of(const serve *s, const char *name)
{
    for (size_t i = 0; s->cluster && name && i < pgjobq_cluster_shards(s->cluster); i++)
        if (strcmp(pgjobq_cluster_shard_name(s->cluster, i), name) == 0)
            return (int)i;
    return -1;
}

pgjobq_client *serve_pool_get_shard(serve *s, size_t shard, int *slot)
{
    pgjobq_client *c = NULL;

    pthread_mutex_lock(&s->pool_mu);
    for (;;) {
        int any = -1;
        for (int i = 0; i < POOL; i++) {
            if (!s->pool_busy[i] && s->pool[i] && s->pool_shard[i] == shard) {
                any = i;
                break;
            }
            if (!s->pool_busy[i] && (any < 0 || s->pool[any] != NULL))
                any = i;
        }
        if (any >= 0) {
            *slot = any;
            s->pool_busy[any] = 1;
            break;
        }
        pthread_cond_wait(&s->pool_cv, &s->pool_mu);
    }
    c = s->pool[*slot];
    s->pool[*slot] = NULL;
    pthread_mutex_unlock(&s->pool_mu);
    if (c && (s->pool_shard[*slot] != shard || PQstatus(pgjobq_client_conn(c)) != CONNECTION_OK)) {
        pgjobq_client_close(c);
        c = NULL;
    }
    s->pool_shard[*slot] = shard;
    if (c == NULL) {
        const char *conninfo = s->cluster ? pgjobq_cluster_shard_conninfo(s->cluster, shard) : s->conninfo;
        int rc = pgjobq_client_open(&c, conninfo);
        if (rc != PGJOBQ_OK) {
            if (s->cluster)
                serve_log("shard %s: cannot connect: %s", pgjobq_cluster_shard_name(s->cluster, shard),
                          c ? pgjobq_errmsg(c) : pgjobq_strerror(rc));
            else
                serve_log("cannot connect: %s", c ? pgjobq_errmsg(c) : pgjobq_strerror(rc));
            pgjobq_client_close(c);
            c = NULL;
        } else {
            /* A page's query gives up after the timeout, waiting for a lock or not: its page then
             * answers 503 instead of holding a worker. */
            char set[200];
            snprintf(set, sizeof set,
                     "SET statement_timeout = %lld; SET lock_timeout = %lld; SET application_name = 'pgjobq serve'",
                     (long long)s->query_timeout_ms, (long long)s->query_timeout_ms);
            PGresult *r = PQexec(pgjobq_client_conn(c), set);
            if (PQresultStatus(r) != PGRES_COMMAND_OK) {
                serve_log("cannot set up a page connection: %s", PQresultErrorMessage(r));
                pgjobq_client_close(c);
                c = NULL;
            }
            PQclear(r);
        }
    }
    pthread_mutex_lock(&s->pool_mu);
    s->pool[*slot] = c;
    if (c == NULL) {
        s->pool_busy[*slot] = 0;
        pthread_cond_signal(&s->pool_cv);
    }
    pthread_mutex_unlock(&s->pool_mu);
    return c;
}

void serve_pool_put(serve *s, int slot)
{
    pthread_mutex_lock(&s->pool_mu);
    s->pool_busy[slot] = 0;
    pthread_cond_signal(&s->pool_cv);
    pthread_mutex_unlock(&s->pool_mu);
}

/* Runs a read query of a page; on error returns NULL, puts the database's message (escaped) on the
 * page and makes its status 503 (a timeout, a lock not granted in time, a lost connection: try
 * again) or 500.  After one failure, the page's other queries are not run: the page is an error. */
PGresult *serve_query(pgjobq_client *c, http_resp *out, const char *sql, int n, const char *const *values)
{
    if (out->status >= 500)
        return NULL;
    PGresult *r = PQexecParams(pgjobq_client_conn(c), sql, n, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        int transient = PQstatus(pgjobq_client_conn(c)) != CONNECTION_OK || state == NULL ||
                        strcmp(state, "57014") == 0 || strcmp(state, "55P03") == 0 || strncmp(state, "08", 2) == 0;
        out->status = transient ? 503 : 500;
        sb_puts(&out->body, "<p class=\"error\" id=\"db-error\">The database said: ");
        sb_html(&out->body, PQresultErrorMessage(r));
        sb_puts(&out->body, "</p>");
        PQclear(r);
        return NULL;
    }
    return r;
}
