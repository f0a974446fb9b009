/*
 * serve_actions.c - the dashboard's actions (with --allow-actions): POST /actions retries, cancels,
 * ends a running job's lease, pauses and resumes, each carrying this process's CSRF token, checked
 * against a list of operations before anything is done or logged, and logged on stderr.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "serve_dashboard.h"
#include "serve_log.h"

void serve_action_result(serve *s, http_resp *out, int status, const char *what, const char *detail)
{
    sbuf *b = &out->body;
    out->status = status;
    html_page_begin(s, b, what, 0);
    sb_puts(b, "<h1>");
    sb_html(b, what);
    sb_puts(b, "</h1><p class=\"error\" id=\"refused\">");
    sb_html(b, detail);
    sb_puts(b, "</p>");
    html_page_end(b);
}

/* The operations of POST /actions.  The op field is checked against this list before anything is
 * done or logged, and only these names reach the log. */
typedef enum {
    OP_UNKNOWN,
    OP_RETRY,
    OP_CANCEL,
    OP_RETRY_WHERE,
    OP_CANCEL_WHERE,
    OP_PAUSE,
    OP_RESUME,
    OP_ENABLE,
    OP_DISABLE,
    OP_RETRY_RUNNING,
    OP_SKIP
} op_kind;
static const char *const op_names[] = {
    "an unknown operation", "retry", "cancel", "retry_where", "cancel_where", "pause", "resume", "enable", "disable",
    "retry_running", "skip"};

static op_kind op_parse(const char *s)
{
    for (int i = OP_RETRY; s && i <= OP_SKIP; i++)
        if (strcmp(s, op_names[i]) == 0)
            return (op_kind)i;
    return OP_UNKNOWN;
}

/* Where to go after an action: one of this server's pages ("/", "/jobs", "/jobs/ID", "/queues",
 * "/workers"), optionally with a query string of URL-safe characters and %XX escapes; anything else
 * goes to "/".  A prefix check is not enough: a browser strips tabs and newlines from a URL, so
 * "/<TAB>/host" would become "//host", another site. */
static const char *local_page(const char *back)
{
    static const char *const pages[] = {"/", "/jobs", "/queues", "/workers"};
    size_t n;
    int ok = 0;

    if (back == NULL || strlen(back) > 512)
        return "/";
    n = strcspn(back, "?");
    for (size_t i = 0; i < sizeof pages / sizeof pages[0]; i++)
        ok |= strlen(pages[i]) == n && strncmp(back, pages[i], n) == 0;
    if (!ok && n > 6 && n <= 6 + 19 && strncmp(back, "/jobs/", 6) == 0) {
        ok = 1;
        for (size_t i = 6; i < n; i++)
            ok &= isdigit((unsigned char)back[i]) != 0;
    }
    if (!ok)
        return "/";
    for (const char *p = back + n + (back[n] == '?'); *p; p++) {
        if (*p == '%' && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2]))
            p += 2;
        else if (!isalnum((unsigned char)*p) && !strchr("-._~=&+", *p))
            return "/";
    }
    return back;
}

/* The status of an action the library refused. */
static int action_status(int rc)
{
    switch (rc) {
    case PGJOBQ_EINVAL: return 400;
    case PGJOBQ_EPERM: return 403;
    case PGJOBQ_ENOTFOUND: return 404;
    case PGJOBQ_ESTATE:
    case PGJOBQ_ECONFLICT: return 409;
    default: return 503; /* the connection, a timeout, the database */
    }
}

/* POST /actions.  Every message, on the page and in the log, comes from this request: what it
 * asked, and the library's message of the call it made (each call clears the last one first); a
 * request that made no call says so itself. */
void serve_action(serve *s, const http_req *req, http_resp *out)
{
    op_kind op = op_parse(http_param(req, "op"));
    const char *what = op_names[op], *token = http_param(req, "csrf");
    const char *queue = serve_param(req, "queue"), *state = serve_param(req, "state"), *kind = serve_param(req, "kind");
    const char *id_s = serve_param(req, "id"), *name = serve_param(req, "name");
    const char *bad = NULL;
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    long long id = 0;
    char msg[512];
    int rc, slot;
    int64_t n = 0, skipped = 0;

    if (!s->allow_actions) {
        serve_log("refused %s from %s: actions are not enabled (--allow-actions)", what, req->peer);
        serve_action_result(s, out, 403, "Refused", "Actions are not enabled on this server (pgjobq serve --allow-actions).");
        return;
    }
    if (token == NULL || !http_secret_equal(token, s->csrf)) {
        serve_log("refused %s from %s: missing or wrong CSRF token", what, req->peer);
        serve_action_result(s, out, 403, "Refused", "The form's token is missing or stale: reload the page and try again.");
        return;
    }
    switch (op) {
    case OP_UNKNOWN: bad = "No such operation."; break;
    case OP_RETRY:
    case OP_CANCEL:
    case OP_RETRY_RUNNING:
    case OP_SKIP: {
        char why[128];
        /* Digits only, 1..2^63-1: an id past that is refused, never clamped to another job's. */
        if (id_s == NULL || !isdigit((unsigned char)id_s[0]) ||
            cli_parse_int(id_s, 1, INT64_MAX, &id, why, sizeof why) != 0)
            bad = "A job id is needed (a whole number from 1 to 9223372036854775807).";
        break;
    }
    case OP_RETRY_WHERE:
    case OP_CANCEL_WHERE:
        f.queue = queue;
        f.kind = kind;
        if (queue == NULL || state == NULL || pgjobq_state_parse(state, &f.state) != PGJOBQ_OK)
            bad = "A queue and a state are needed.";
        break;
    case OP_PAUSE:
    case OP_RESUME:
        if (queue == NULL)
            bad = "A queue is needed.";
        break;
    case OP_ENABLE:
    case OP_DISABLE:
        if (name == NULL)
            bad = "A schedule name is needed.";
        break;
    }
    if (bad) {
        serve_log("refused %s from %s: %s", what, req->peer, bad);
        serve_action_result(s, out, 400, "Bad request", bad);
        return;
    }
    /* With --cluster: a job's action goes to the shard its id names; the others (and a job from before
     * the cluster) to the page's shard, the form's field shard. */
    size_t shard = 0;
    if (s->cluster) {
        const char *shard_name = serve_param(req, "shard");
        int named = serve_shard_of(s, shard_name);
        size_t at;
        if (shard_name && named < 0) {
            serve_log("refused %s from %s: no shard %s in the map", what, req->peer, shard_name);
            serve_action_result(s, out, 400, "Bad request", "The cluster's map has no such shard.");
            return;
        }
        if (named >= 0)
            shard = (size_t)named;
        if (id > 0 && pgjobq_cluster_route_job(s->cluster, id, &at) == PGJOBQ_OK && at != PGJOBQ_SHARD_ANY)
            shard = at;
    }
    pgjobq_client *c = serve_pool_get_shard(s, shard, &slot);
    if (c == NULL) {
        serve_action_result(s, out, 503, s->cluster ? "Shard unavailable" : "Database unavailable",
                            s->cluster ? "The shard cannot be reached." : "The database cannot be reached.");
        return;
    }
    switch (op) {
    case OP_RETRY:
    case OP_CANCEL:
        rc = op == OP_RETRY ? pgjobq_job_retry(c, id) : pgjobq_job_cancel(c, id, NULL);
        snprintf(msg, sizeof msg, "%s job %lld", what, id);
        break;
    case OP_RETRY_RUNNING:
        rc = pgjobq_job_retry_running(c, id, NULL);
        snprintf(msg, sizeof msg, "%s job %lld: its lease ended", what, id);
        break;
    case OP_SKIP:
        rc = pgjobq_job_skip(c, id);
        snprintf(msg, sizeof msg, "%s job %lld: its key moves on", what, id);
        break;
    case OP_RETRY_WHERE:
    case OP_CANCEL_WHERE:
        rc = op == OP_RETRY_WHERE ? pgjobq_retry_where(c, &f, 0, &n, &skipped) : pgjobq_cancel_where(c, &f, 0, &n);
        snprintf(msg, sizeof msg, "%s queue %s state %s%s%s: %lld jobs", what, queue, state, kind ? " kind " : "",
                 kind ? kind : "", (long long)n);
        break;
    case OP_PAUSE:
    case OP_RESUME:
        rc = op == OP_PAUSE ? pgjobq_queue_pause(c, queue, "paused from pgjobq serve") : pgjobq_queue_resume(c, queue);
        snprintf(msg, sizeof msg, "%s queue %s", what, queue);
        break;
    default:
        rc = pgjobq_schedule_enable(c, name, op == OP_ENABLE);
        snprintf(msg, sizeof msg, "%s schedule %s", what, name);
        break;
    }
    if (rc != PGJOBQ_OK) {
        char why[1100];
        snprintf(why, sizeof why, "%s: %s", msg, pgjobq_errmsg(c));
        serve_pool_put(s, slot);
        serve_log("action from %s failed: %s", req->peer, why);
        serve_action_result(s, out, action_status(rc), "Not done", why);
        return;
    }
    serve_pool_put(s, slot);
    serve_log("action from %s: %s", req->peer, msg);
    out->status = 303;
    out->location = local_page(http_param(req, "back"));
    sb_puts(&out->body, "done\n");
    out->content_type = "text/plain; charset=utf-8";
}
