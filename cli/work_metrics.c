/*
 * work_metrics.c - `pgjobq work --metrics-listen`: this worker's own counters in the Prometheus text
 * format (the queue's are `pgjobq serve`'s).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "work.h"

static void counter(sbuf *b, const char *name, const char *help, int64_t v)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %lld\n", name, help, name, name, (long long)v);
}

/* This process's own counters, in the Prometheus text format (the queue's are `pgjobq serve`'s). */
static void worker_metrics(void *arg, const http_req *req, http_resp *out)
{
    const work_metrics *m = arg;
    pgjobq_worker_stats st;
    sbuf *b = &out->body;

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
    pgjobq_worker_get_stats(m->w, &st);
    sb_printf(b,
              "# HELP pgjobq_worker_running Jobs this worker holds now.\n# TYPE pgjobq_worker_running gauge\n"
              "pgjobq_worker_running %lld\n",
              (long long)st.running);
    sb_puts(b, "# HELP pgjobq_worker_slots Jobs this worker runs at once, per queue.\n"
               "# TYPE pgjobq_worker_slots gauge\n");
    for (int i = 0; i < m->nqueues; i++) {
        sb_puts(b, "pgjobq_worker_slots{queue=\"");
        sb_label(b, m->queues[i].name);
        sb_printf(b, "\"} %d\n", m->queues[i].concurrency);
    }
    sb_printf(b,
              "# HELP pgjobq_worker_connections Database connections connected and set up (of 3).\n"
              "# TYPE pgjobq_worker_connections gauge\npgjobq_worker_connections %d\n",
              pgjobq_worker_connections(m->w));
    counter(b, "pgjobq_worker_claimed_total", "Jobs claimed.", st.claimed);
    counter(b, "pgjobq_worker_claims_total", "Claim statements (claimed_total / claims_total is the mean batch).",
            st.claims);
    counter(b, "pgjobq_worker_completed_total", "Completions written.", st.completed);
    counter(b, "pgjobq_worker_retried_total", "Failed attempts queued again.", st.retried);
    counter(b, "pgjobq_worker_failed_total", "Jobs that ended failed.", st.failed);
    counter(b, "pgjobq_worker_cancelled_total", "Jobs that ended cancelled.", st.cancelled);
    counter(b, "pgjobq_worker_lost_total", "Jobs whose lease this worker lost (their outcome was not written).",
            st.lost);
    counter(b, "pgjobq_worker_released_total", "Jobs handed back unstarted at shutdown.", st.released);
    counter(b, "pgjobq_worker_rescued_total", "Expired leases of other workers rescued by this one.", st.rescued);
    counter(b, "pgjobq_worker_writes_total", "Statements that wrote outcomes.", st.writes);
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
