/*
 * work_metrics.c - `pgjobq work --metrics-listen`: this worker's own counters in the Prometheus text
 * format (the queue's are `pgjobq serve`'s).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "work.h"

/* One engine's figures, read at once. */
typedef struct snap {
    const char *shard; /* NULL: no label */
    pgjobq_worker_stats st;
    int connections;
} snap;

/* `name{shard="S"` (with lbl: `,` after it) or `name{` or `name`, as the labels need. */
static void series(sbuf *b, const snap *x, const char *name, int more)
{
    sb_puts(b, name);
    if (x->shard) {
        sb_puts(b, "{shard=\"");
        sb_label(b, x->shard);
        sb_puts(b, more ? "\"," : "\"}");
    } else if (more) {
        sb_puts(b, "{");
    }
}

static void counter(sbuf *b, const snap *xs, size_t n, const char *name, const char *help, size_t off)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        memcpy(&v, (const char *)&xs[i].st + off, sizeof v);
        series(b, &xs[i], name, 0);
        sb_printf(b, " %lld\n", (long long)v);
    }
}

#define COUNTER(name, help, field) counter(b, xs, n, name, help, offsetof(pgjobq_worker_stats, field))

/* This process's own counters, in the Prometheus text format (the queue's are `pgjobq serve`'s). */
static void worker_metrics(void *arg, const http_req *req, http_resp *out)
{
    const work_metrics *m = arg;
    sbuf *b = &out->body;
    snap one, *xs = &one;
    size_t n = 0;

    out->content_type = "text/plain; charset=utf-8";
    if (strcmp(req->path, "/healthz") == 0) {
        sb_puts(b, "ok\n");
        return;
    }
    if (strcmp(req->path, "/metrics") != 0) {
        out->status = 404;
        sb_puts(b, "not found: this worker serves /metrics and /healthz\n");
        return;
    }
    out->content_type = "text/plain; version=0.0.4; charset=utf-8";
    if (m->engines == NULL) {
        one.shard = NULL;
        pgjobq_worker_get_stats(m->w, &one.st);
        one.connections = pgjobq_worker_connections(m->w);
        n = 1;
    } else {
        /* Every engine's figures under the lock that keeps them from being freed meanwhile. */
        if ((xs = calloc(m->nengines ? m->nengines : 1, sizeof *xs)) == NULL) {
            out->status = 503;
            sb_puts(b, "out of memory\n");
            return;
        }
        pthread_mutex_lock(m->mu);
        for (size_t i = 0; i < m->nengines; i++) {
            const work_engine *e = m->engines[i];
            if (e == NULL || e->w == NULL)
                continue;
            pgjobq_worker_get_stats(e->w, &xs[n].st);
            xs[n].connections = pgjobq_worker_connections(e->w);
            xs[n].shard = strdup(e->shard ? e->shard : ""); /* (freed with the engine) */
            if (xs[n].shard == NULL)
                continue;
            n++;
        }
        pthread_mutex_unlock(m->mu);
    }
    sb_puts(b, "# HELP pgjobq_worker_running Jobs this worker holds now.\n# TYPE pgjobq_worker_running gauge\n");
    for (size_t i = 0; i < n; i++) {
        series(b, &xs[i], "pgjobq_worker_running", 0);
        sb_printf(b, " %lld\n", (long long)xs[i].st.running);
    }
    sb_puts(b, "# HELP pgjobq_worker_slots Jobs this worker runs at once, per queue.\n"
               "# TYPE pgjobq_worker_slots gauge\n");
    for (size_t i = 0; i < n; i++) {
        for (int q = 0; q < m->nqueues; q++) {
            series(b, &xs[i], "pgjobq_worker_slots", 1);
            sb_puts(b, "queue=\"");
            sb_label(b, m->queues[q].name);
            sb_printf(b, "\"} %d\n", m->queues[q].concurrency);
        }
    }
    sb_puts(b, "# HELP pgjobq_worker_connections Database connections connected and set up (of 3).\n"
               "# TYPE pgjobq_worker_connections gauge\n");
    for (size_t i = 0; i < n; i++) {
        series(b, &xs[i], "pgjobq_worker_connections", 0);
        sb_printf(b, " %d\n", xs[i].connections);
    }
    COUNTER("pgjobq_worker_claimed_total", "Jobs claimed.", claimed);
    COUNTER("pgjobq_worker_claims_total", "Claim statements (claimed_total / claims_total is the mean batch).", claims);
    COUNTER("pgjobq_worker_completed_total", "Completions written.", completed);
    COUNTER("pgjobq_worker_retried_total", "Failed attempts queued again.", retried);
    COUNTER("pgjobq_worker_failed_total", "Jobs that ended failed.", failed);
    COUNTER("pgjobq_worker_cancelled_total", "Jobs that ended cancelled.", cancelled);
    COUNTER("pgjobq_worker_lost_total", "Jobs whose lease this worker lost (their outcome was not written).", lost);
    COUNTER("pgjobq_worker_released_total", "Jobs handed back unstarted at shutdown.", released);
    COUNTER("pgjobq_worker_parked_total", "Jobs their handlers parked: a durable sleep, a wait for an event.", parked);
    COUNTER("pgjobq_worker_rescued_total", "Expired leases of other workers rescued by this one.", rescued);
    COUNTER("pgjobq_worker_writes_total", "Statements that wrote outcomes.", writes);
    if (xs != &one) {
        for (size_t i = 0; i < n; i++)
            free((char *)xs[i].shard);
        free(xs);
    }
}

int work_metrics_start(work_metrics *m, const cli_cmd *cmd, const char *listen, work_log_cfg *log)
{
    char why[256], line[300];
    http_addr addr;
    const char *token = getenv("PGJOBQ_SERVE_TOKEN");

    if (token && !token[0])
        token = NULL;
    if (http_addr_parse(listen, &addr, why, sizeof why) != 0)
        return cli_usage_error(cmd, "--metrics-listen: %s", why);
    if (!addr.loopback && token == NULL) {
        cli_err("--metrics-listen %s is not a loopback address: set $PGJOBQ_SERVE_TOKEN (16+ characters) to "
                "require it as credentials, or listen on 127.0.0.1",
                listen);
        return EX_USAGE;
    }
    if (token && http_token_check(token, why, sizeof why) != 0) {
        cli_err("--metrics-listen: $PGJOBQ_SERVE_TOKEN: %s", why);
        return EX_USAGE;
    }
    if ((m->http = http_start(&addr, token, worker_metrics, m, why, sizeof why)) == NULL) {
        cli_err("--metrics-listen: %s", why);
        return EX_UNAVAILABLE;
    }
    snprintf(line, sizeof line, "metrics at http://%s%s%s:%d/metrics", strchr(addr.host, ':') ? "[" : "", addr.host,
             strchr(addr.host, ':') ? "]" : "", http_port(m->http));
    work_log(log, PGJOBQ_LOG_INFO, line);
    return EX_OK;
}

void work_metrics_stop(work_metrics *m)
{
    http_stop(m->http);
    m->http = NULL;
}
