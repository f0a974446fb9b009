/*
 * serve_dashboard.h - what the files of `pgjobq serve`'s dashboard share: the server's state, its page
 * connections (serve_pool.c), the HTML of every page (serve_html.c), the pages (serve_pages.c) and the
 * actions (serve_actions.c).  cmd_serve.c parses the options and routes each request to them.
 */
#ifndef PGJOBQ_CLI_SERVE_DASHBOARD_H
#define PGJOBQ_CLI_SERVE_DASHBOARD_H

#include <pthread.h>

#include "serve.h"

#define POOL 4 /* page connections: one per worker thread (http.c runs the pages on POOL workers) */

typedef struct serve {
    const char *conninfo;
    pgjobq_cluster *cluster;   /* --cluster (its map, read again every --map-reload); NULL: the one database */
    int clustered;             /* cluster is set: a request holds map_lock (read) while it runs */
    pthread_rwlock_t map_lock; /* written only to swap in a map of a new epoch (cmd_serve.c) */
    int allow_actions, hide_payloads;
    int64_t query_timeout_ms;
    char csrf[65];
    serve_metrics *metrics;
    pthread_mutex_t pool_mu;
    pthread_cond_t pool_cv;
    pgjobq_client *pool[POOL];
    int pool_busy[POOL];
    size_t pool_shard[POOL]; /* the shard (of cluster) each connection is on */
} serve;

/* A field of the query string or form: NULL when absent or empty. */
static inline const char *serve_param(const http_req *req, const char *key)
{
    const char *v = http_param(req, key);
    return v && v[0] ? v : NULL;
}

/* Page connections (serve_pool.c). */

/* Makes the pool's lock and condition (0, or -1 when they cannot be made: nothing to close then);
 * the connections are opened as pages need them. */
int serve_pool_init(serve *s);
/* Closes every connection and frees the lock and condition. */
void serve_pool_close(serve *s);
/* A connection for one request, in *slot; NULL after logging why (the page then says the database is
 * down).  Waits while every connection is taken.  Give it back with serve_pool_put. */
pgjobq_client *serve_pool_get(serve *s, int *slot);
/* The same, on shard i of s->cluster (serve_pool_get: shard 0, or the one database).  A free
 * connection already on that shard is taken first. */
pgjobq_client *serve_pool_get_shard(serve *s, size_t shard, int *slot);
/* With --cluster: the number of the shard named name, or -1 when the map has none. */
int serve_shard_of(const serve *s, const char *name);
void serve_pool_put(serve *s, int slot);
/* Runs a read query of a page; on error returns NULL, puts the database's message (escaped) on the
 * page and makes its status 503 (a timeout, a lock not granted in time, a lost connection: try
 * again) or 500.  After one failure, the page's other queries are not run: the page is an error. */
PGresult *serve_query(pgjobq_client *c, http_resp *out, const char *sql, int n, const char *const *values);

/* The HTML every page is made of (serve_html.c); every value is escaped. */

extern const char serve_css[]; /* /static/style.css */
void html_page_begin(serve *s, sbuf *b, const char *title, int refresh_s);
/* With --cluster, the shard the page in progress on this thread shows (set by the request's router
 * in cmd_serve.c; NULL: the overview of every shard): html_page_begin shows it with a selector. */
extern _Thread_local const char *serve_page_shard;
/* With --cluster: the overview of every shard, each queue with its shard, a shard that is down as a
 * row naming it. */
void serve_page_cluster_overview(serve *s, http_resp *out);
void html_page_end(sbuf *b);
void html_state_badge(sbuf *b, const char *state);
/* A table cell holding text (escaped); cls may be NULL. */
void html_td(sbuf *b, const char *cls, const char *text);
/* A table cell holding a link to prefix + value (URL-encoded), showing text. */
void html_td_link(sbuf *b, const char *cls, const char *prefix, const char *value, const char *text);
/* The opening of a table row carrying data-NAME="value" for the tests and for styling. */
void html_tr(sbuf *b, const char *name, const char *value);
/* An action button: a POST form with the CSRF token, the operation, its fields (name, value pairs,
 * NULL-terminated; an empty value is left out) and where to go back.  Nothing without --allow-actions. */
void html_action_form(serve *s, sbuf *b, const char *op, const char *label, const char *const *fields, const char *back,
                      int danger);

/* The pages (serve_pages.c): each reads through the monitor functions on c and writes out. */

void serve_page_overview(serve *s, pgjobq_client *c, http_resp *out);
void serve_page_jobs(serve *s, pgjobq_client *c, const http_req *req, http_resp *out);
void serve_page_job(serve *s, pgjobq_client *c, const char *id_s, http_resp *out);
void serve_page_queues(serve *s, pgjobq_client *c, http_resp *out);
/* /workers: a page of WORKER_ROWS at most (?after_state=&after=: the next page). */
void serve_page_workers(serve *s, pgjobq_client *c, const http_req *req, http_resp *out);

/* The actions (serve_actions.c). */

/* POST /actions: checks the flag, the CSRF token and the operation, runs it on a page connection, logs
 * it, and sends the browser back to one of this server's pages. */
void serve_action(serve *s, const http_req *req, http_resp *out);
/* A refusal page: status, a title and why. */
void serve_action_result(serve *s, http_resp *out, int status, const char *what, const char *detail);

#endif /* PGJOBQ_CLI_SERVE_DASHBOARD_H */
