/*
 * cmd_serve.c - pgjobq serve: Prometheus metrics (serve_metrics.c) and a web dashboard on one HTTP
 * server (http.c, libmicrohttpd).  Pages are rendered here from read-only queries, with every value
 * HTML-escaped; no page runs a script (the Content-Security-Policy forbids it as a second line).
 * With --allow-actions, forms POST retries, cancels, pauses and resumes, each carrying this
 * process's CSRF token and logged on stderr.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "serve.h"
#include "serve_log.h"

#define OPT_LISTEN   'l'
#define OPT_AUTH     1001
#define OPT_ACTIONS  1002
#define OPT_HIDE     1003
#define OPT_INTERVAL 1004
#define OPT_HOST     1005
#define OPT_QTIMEOUT 1006

const cli_opt serve_opts[] = {
    {"listen", OPT_LISTEN, "ADDR", "address and port to serve on (default 127.0.0.1:9464; port 0: any free one)"},
    {"auth-file", OPT_AUTH, "FILE",
     "require this token (first line of FILE, 16+ characters) as a bearer token or basic-auth password "
     "(else $PGJOBQ_SERVE_TOKEN); required on a non-loopback address"},
    {"allow-actions", OPT_ACTIONS, NULL, "allow retry, cancel, pause and resume from the dashboard"},
    {"hide-payloads", OPT_HIDE, NULL, "never show payloads or results"},
    {"interval", OPT_INTERVAL, "DURATION", "how often the metrics are collected (default 5s)"},
    {"allow-host", OPT_HOST, "NAME",
     "also answer to this host name (repeatable), e.g. a proxy's public name; pages on it may POST actions"},
    {"query-timeout", OPT_QTIMEOUT, "DURATION",
     "a page's query, lock waits included, gives up after this and the page answers 503 (default 5s)"},
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};

#define POOL      4    /* page connections: one per worker thread (http.c runs the pages on POOL workers) */
#define MAX_HOSTS 16   /* --allow-host names */
#define PAGE_ROWS 50   /* jobs per page */
#define TS(x) "coalesce(to_char(" x " AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'), '')"

typedef struct serve {
    const char *conninfo;
    int allow_actions, hide_payloads;
    int64_t query_timeout_ms;
    char csrf[65];
    serve_metrics *metrics;
    pthread_mutex_t pool_mu;
    pthread_cond_t pool_cv;
    pgjobq_client *pool[POOL];
    int pool_busy[POOL];
} serve;

/* ------------------------------------------------------------------------------------------------ */
/* Page connections                                                                                  */

/* A connection for one request; NULL after logging why (the page then says the database is down). */
static pgjobq_client *pool_get(serve *s, int *slot)
{
    pgjobq_client *c = NULL;

    pthread_mutex_lock(&s->pool_mu);
    for (;;) {
        for (int i = 0; i < POOL; i++) {
            if (!s->pool_busy[i]) {
                *slot = i;
                s->pool_busy[i] = 1;
                goto got;
            }
        }
        pthread_cond_wait(&s->pool_cv, &s->pool_mu);
    }
got:
    c = s->pool[*slot];
    pthread_mutex_unlock(&s->pool_mu);
    if (c && PQstatus(pgjobq_client_conn(c)) != CONNECTION_OK) {
        pgjobq_client_close(c);
        c = NULL;
    }
    if (c == NULL) {
        int rc = pgjobq_client_open(&c, s->conninfo);
        if (rc != PGJOBQ_OK) {
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

static void pool_put(serve *s, int slot)
{
    pthread_mutex_lock(&s->pool_mu);
    s->pool_busy[slot] = 0;
    pthread_cond_signal(&s->pool_cv);
    pthread_mutex_unlock(&s->pool_mu);
}

/* Runs a read query of a page; on error returns NULL, puts the database's message (escaped) on the
 * page and makes its status 503 (a timeout, a lock not granted in time, a lost connection: try
 * again) or 500.  After one failure, the page's other queries are not run: the page is an error. */
static PGresult *query(pgjobq_client *c, http_resp *out, const char *sql, int n, const char *const *values)
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

#define V(r, i, k) PQgetvalue((r), (i), (k))

/* ------------------------------------------------------------------------------------------------ */
/* Page frame                                                                                        */

static const char css[] =
    ":root{--fg:#1d2330;--mut:#5b6577;--bg:#f6f7f9;--card:#fff;--line:#e3e6eb;--acc:#2f6fde;--ok:#2e8b57;"
    "--bad:#c8392e;--warn:#b7791f}\n"
    "*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;"
    "color:var(--fg);background:var(--bg)}\n"
    "header{display:flex;gap:24px;align-items:center;padding:10px 24px;background:#1d2330;color:#fff}\n"
    "header a{color:#cfd6e4;text-decoration:none}header a:hover{color:#fff}\n"
    ".brand{font-weight:700;color:#fff!important;font-size:16px}nav{display:flex;gap:18px}\n"
    ".mode{margin-left:auto;font-size:12px;color:#9aa4b5}\n"
    "main{padding:20px 24px;max-width:1280px}h1{font-size:20px;margin:0 0 14px}h2{font-size:16px;margin:22px 0 8px}\n"
    "table{border-collapse:collapse;width:100%;background:var(--card);border:1px solid var(--line)}\n"
    "th,td{text-align:left;padding:6px 10px;border-bottom:1px solid var(--line);vertical-align:top}\n"
    "th{font-weight:600;color:var(--mut);font-size:12px;text-transform:uppercase;letter-spacing:.03em}\n"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}a{color:var(--acc)}\n"
    ".state{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;background:#e8ecf3}\n"
    ".s-completed{background:#dff3e7;color:#1f6b43}.s-failed{background:#fbe3e1;color:#9b2c23}\n"
    ".s-running{background:#e1ebfd;color:#234f9e}.s-cancelled{background:#eee;color:#555}\n"
    ".s-waiting{background:#fdf3d8;color:#7a5a00}\n"
    ".s-paused{background:#fdf0d9;color:#8a5a12}.s-scheduled{background:#ece6fb;color:#4b3a8f}\n"
    "td.run-at,td.st,td.t{white-space:nowrap}td.run-at.scheduled{color:#4b3a8f}\n"
    ".error{color:var(--bad)}pre{background:#f0f2f5;padding:10px;overflow:auto;max-height:360px;margin:0;"
    "white-space:pre-wrap;word-break:break-word}\n"
    "dl{display:grid;grid-template-columns:160px 1fr;gap:4px 16px;background:var(--card);padding:14px;"
    "border:1px solid var(--line)}dt{color:var(--mut)}dd{margin:0}\n"
    "form.inline{display:inline}button{font:inherit;padding:3px 10px;border:1px solid var(--line);"
    "background:#fff;border-radius:4px;cursor:pointer}button.danger{color:var(--bad)}\n"
    "form.filters{display:flex;gap:8px;flex-wrap:wrap;margin-bottom:12px}form.filters input,form.filters "
    "select{font:inherit;padding:3px 6px}\n"
    ".card{background:var(--card);border:1px solid var(--line);padding:12px;margin-bottom:12px}\n"
    "svg text{font-size:11px;fill:var(--mut)}.muted{color:var(--mut)}\n"
    "#throughput{display:block;width:100%;height:auto}#throughput text{font-size:12px}\n"
    "#throughput .legend text{fill:var(--fg)}#throughput text.scale,#throughput text.end{text-anchor:end}"
    "#throughput text.mid{text-anchor:middle}\n"
    "#throughput line.axis{stroke:#ccd}#throughput line.grid{stroke:var(--line);stroke-dasharray:4 4}\n"
    ".bar-completed{fill:var(--ok)}.bar-failed{fill:var(--bad)}\n";

static void page_begin(serve *s, sbuf *b, const char *title, int refresh_s)
{
    sb_puts(b, "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>pgjobq - ");
    sb_html(b, title);
    sb_puts(b, "</title><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">");
    if (refresh_s > 0)
        sb_printf(b, "<meta http-equiv=\"refresh\" content=\"%d\">", refresh_s);
    sb_puts(b, "<link rel=\"stylesheet\" href=\"/static/style.css\"></head><body><header>"
               "<a class=\"brand\" href=\"/\">pgjobq</a><nav><a href=\"/\">Overview</a><a href=\"/jobs\">Jobs</a>"
               "<a href=\"/queues\">Queues</a><a href=\"/workers\">Workers</a><a href=\"/metrics\">Metrics</a></nav>");
    sb_printf(b, "<span class=\"mode\">%s%s</span></header><main>",
              s->allow_actions ? "actions enabled" : "read-only", s->hide_payloads ? ", payloads hidden" : "");
}

static void page_end(sbuf *b)
{
    sb_puts(b, "</main></body></html>\n");
}

static void state_badge(sbuf *b, const char *state)
{
    sb_puts(b, "<span class=\"state s-");
    sb_html(b, state);
    sb_puts(b, "\">");
    sb_html(b, state);
    sb_puts(b, "</span>");
}

/* A table cell holding text (escaped); cls may be NULL. */
static void td(sbuf *b, const char *cls, const char *text)
{
    if (cls)
        sb_printf(b, "<td class=\"%s\">", cls);
    else
        sb_puts(b, "<td>");
    sb_html(b, text);
    sb_puts(b, "</td>");
}

/* A table cell holding a link to prefix + value (URL-encoded), showing text. */
static void td_link(sbuf *b, const char *cls, const char *prefix, const char *value, const char *text)
{
    if (cls)
        sb_printf(b, "<td class=\"%s\">", cls);
    else
        sb_puts(b, "<td>");
    sb_puts(b, "<a href=\"");
    sb_puts(b, prefix);
    sb_url(b, value);
    sb_puts(b, "\">");
    sb_html(b, text);
    sb_puts(b, "</a></td>");
}

/* The opening of a table row carrying data-NAME="value" for the tests and for styling. */
static void tr(sbuf *b, const char *name, const char *value)
{
    sb_printf(b, "<tr data-%s=\"", name);
    sb_html(b, value);
    sb_puts(b, "\">");
}

/* An action button: a POST form with the CSRF token, the operation, its fields and where to go back. */
static void action_form(serve *s, sbuf *b, const char *op, const char *label, const char *const *fields,
                        const char *back, int danger)
{
    if (!s->allow_actions)
        return;
    sb_puts(b, "<form class=\"inline\" method=\"post\" action=\"/actions\"><input type=\"hidden\" name=\"csrf\" value=\"");
    sb_html(b, s->csrf);
    sb_puts(b, "\"><input type=\"hidden\" name=\"op\" value=\"");
    sb_html(b, op);
    sb_puts(b, "\"><input type=\"hidden\" name=\"back\" value=\"");
    sb_html(b, back);
    sb_puts(b, "\">");
    for (int i = 0; fields && fields[i]; i += 2) {
        if (fields[i + 1] == NULL || fields[i + 1][0] == '\0')
            continue;
        sb_puts(b, "<input type=\"hidden\" name=\"");
        sb_html(b, fields[i]);
        sb_puts(b, "\" value=\"");
        sb_html(b, fields[i + 1]);
        sb_puts(b, "\">");
    }
    sb_printf(b, "<button type=\"submit\"%s data-op=\"%s\">", danger ? " class=\"danger\"" : "", op);
    sb_html(b, label);
    sb_puts(b, "</button></form> ");
}

/* ------------------------------------------------------------------------------------------------ */
/* Overview                                                                                          */

/* The throughput chart's drawing, in its own units: the SVG scales to the width of its panel
 * (width 100%, the height following the viewBox's proportions), so these are proportions, not
 * pixels.  A row on top holds the legend, a column on the left the scale, a row below the time. */
enum { CH_W = 1000, CH_H = 200, CH_LEFT = 44, CH_RIGHT = 8, CH_TOP = 30, CH_BOTTOM = 22 };

/* One series of the legend: a swatch of the series' class and its name. */
static void chart_legend_item(sbuf *b, int x, const char *series, const char *label)
{
    sb_printf(b,
              "<g class=\"legend-item\" data-series=\"%s\"><rect class=\"bar-%s\" x=\"%d\" y=\"6\" width=\"12\" "
              "height=\"12\" rx=\"2\"/><text x=\"%d\" y=\"16\">%s</text></g>",
              series, series, x, x + 17, label);
}

static void chart(sbuf *b, PGresult *r)
{
    int64_t done[60] = {0}, failed[60] = {0}, max = 1;
    const int plot_w = CH_W - CH_LEFT - CH_RIGHT, plot_h = CH_H - CH_TOP - CH_BOTTOM, base = CH_H - CH_BOTTOM;
    const double bar = plot_w / 60.0;

    for (int i = 0; i < PQntuples(r); i++) {
        int m = atoi(V(r, i, 0));
        if (m < 0 || m >= 60)
            continue;
        done[59 - m] = atoll(V(r, i, 1));
        failed[59 - m] = atoll(V(r, i, 2));
        if (done[59 - m] + failed[59 - m] > max)
            max = done[59 - m] + failed[59 - m];
    }
    sb_printf(b,
              "<svg id=\"throughput\" role=\"img\" aria-label=\"jobs finished per minute, last hour: completed and "
              "failed\" width=\"100%%\" viewBox=\"0 0 %d %d\" preserveAspectRatio=\"xMinYMin meet\">",
              CH_W, CH_H);
    sb_puts(b, "<g id=\"throughput-legend\" class=\"legend\">");
    chart_legend_item(b, CH_W - CH_RIGHT - 190, "completed", "completed");
    chart_legend_item(b, CH_W - CH_RIGHT - 80, "failed", "failed");
    sb_puts(b, "</g>");
    sb_printf(b, "<line class=\"grid\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>", CH_LEFT, CH_TOP, CH_W - CH_RIGHT,
              CH_TOP);
    sb_printf(b, "<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>", CH_LEFT, base, CH_W - CH_RIGHT,
              base);
    for (int i = 0; i < 60; i++) {
        double x = CH_LEFT + i * bar;
        double hd = (double)done[i] * plot_h / (double)max, hf = (double)failed[i] * plot_h / (double)max;
        if (done[i])
            sb_printf(b,
                      "<rect class=\"bar-completed\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\">"
                      "<title>%lld completed, %d min ago</title></rect>",
                      x + 1, base - hd, bar - 2, hd, (long long)done[i], 59 - i);
        if (failed[i])
            sb_printf(b,
                      "<rect class=\"bar-failed\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\">"
                      "<title>%lld failed, %d min ago</title></rect>",
                      x + 1, base - hd - hf, bar - 2, hf, (long long)failed[i], 59 - i);
    }
    sb_printf(b, "<text class=\"scale\" x=\"%d\" y=\"%d\">%lld</text><text class=\"scale\" x=\"%d\" y=\"%d\">0</text>",
              CH_LEFT - 6, CH_TOP + 4, (long long)max, CH_LEFT - 6, base + 4);
    sb_printf(b,
              "<text x=\"%d\" y=\"%d\">60 min ago</text><text class=\"mid\" x=\"%.1f\" y=\"%d\">30 min ago</text>"
              "<text class=\"end\" x=\"%d\" y=\"%d\">now</text></svg>",
              CH_LEFT, CH_H - 4, CH_LEFT + 30 * bar, CH_H - 4, CH_W - CH_RIGHT, CH_H - 4);
}

static void page_overview(serve *s, pgjobq_client *c, http_resp *out)
{
    sbuf *b = &out->body;
    PGresult *r;

    page_begin(s, b, "overview", 10);
    sb_puts(b, "<h1>Overview</h1><table id=\"queues\"><thead><tr><th>Queue</th><th>State</th><th>Due</th>"
               "<th>Scheduled</th><th>Running</th><th>Lag</th><th>Completed (1 h)</th><th>Failed (1 h)</th>"
               "</tr></thead><tbody>");
    r = query(c, out,
              "SELECT queue, paused::int, due, scheduled, running, coalesce(round(lag_s, 1)::text, ''),"
              " completed_1h, failed_1h FROM pgjobq.monitor_overview()",
              0, NULL);
    if (r) {
        for (int i = 0; i < PQntuples(r); i++) {
            tr(b, "queue", V(r, i, 0));
            td_link(b, NULL, "/jobs?queue=", V(r, i, 0), V(r, i, 0));
            sb_puts(b, "<td>");
            state_badge(b, atoi(V(r, i, 1)) ? "paused" : "active");
            sb_puts(b, "</td>");
            for (int k = 2; k < 8; k++) {
                sb_printf(b, "<td class=\"n\" data-col=\"%d\">", k);
                sb_html(b, V(r, i, k));
                sb_puts(b, k == 5 && V(r, i, k)[0] ? " s</td>" : "</td>");
            }
            sb_puts(b, "</tr>");
        }
        if (PQntuples(r) == 0)
            sb_puts(b, "<tr><td colspan=\"8\" class=\"muted\">No jobs yet.</td></tr>");
        PQclear(r);
    }
    sb_puts(b, "</tbody></table>");
    /* The table and what holds vacuum back (pgjobq.health(); docs/deploy.md, "Snapshots held open"). */
    r = query(c, out,
              "SELECT pg_size_pretty(jobs_bytes), jobs_dead, coalesce(round(horizon_age_s)::text, ''),"
              " coalesce(holder_kind, ''), coalesce(holder_pid::text, ''), coalesce(holder_application, ''),"
              " coalesce(holder_state, ''), coalesce(left(holder_query, 120), ''),"
              " (coalesce(horizon_age_s, 0) >= 300)::int FROM pgjobq.health()",
              0, NULL);
    if (r && PQntuples(r) == 1) {
        int warn = atoi(V(r, 0, 8));
        sb_printf(b, "<p id=\"health\" class=\"%s\">pgjobq.jobs: ", warn ? "error" : "muted");
        sb_html(b, V(r, 0, 0));
        sb_puts(b, ", ");
        sb_html(b, V(r, 0, 1));
        sb_puts(b, " dead rows. ");
        if (V(r, 0, 3)[0]) {
            sb_puts(b, "Vacuum held back for ");
            sb_html(b, V(r, 0, 2));
            sb_puts(b, " s by ");
            sb_html(b, V(r, 0, 3));
            if (V(r, 0, 4)[0]) {
                sb_puts(b, " pid ");
                sb_html(b, V(r, 0, 4));
            }
            if (V(r, 0, 5)[0]) {
                sb_puts(b, " &ldquo;");
                sb_html(b, V(r, 0, 5));
                sb_puts(b, "&rdquo;");
            }
            if (V(r, 0, 6)[0]) {
                sb_puts(b, " (");
                sb_html(b, V(r, 0, 6));
                sb_puts(b, ")");
            }
            if (V(r, 0, 7)[0]) {
                sb_puts(b, ": <code>");
                sb_html(b, V(r, 0, 7));
                sb_puts(b, "</code>");
            }
            sb_puts(b, warn ? ". Finished jobs leave dead rows until it ends (docs/deploy.md)." : ".");
        } else {
            sb_puts(b, "Nothing holds vacuum back.");
        }
        sb_puts(b, "</p>");
    }
    PQclear(r);
    sb_puts(b, "<h2>Jobs finished per minute, last hour</h2><div class=\"card\">");
    r = query(c, out,
              "SELECT minutes_ago, completed, failed FROM pgjobq.monitor_finished_per_minute()",
              0, NULL);
    if (r) {
        chart(b, r);
        PQclear(r);
    }
    sb_puts(b, "</div><h2>Failures, last hour</h2><table id=\"failures\"><thead><tr><th>Job</th><th>Queue</th>"
               "<th>Kind</th><th>Finished (UTC)</th><th>Error</th></tr></thead><tbody>");
    r = query(c, out,
              "SELECT id, queue, kind, " TS("finished_at") ", left(coalesce(last_error, ''), 200)"
              " FROM pgjobq.monitor_failures(10)",
              0, NULL);
    if (r) {
        for (int i = 0; i < PQntuples(r); i++) {
            sb_puts(b, "<tr>");
            td_link(b, NULL, "/jobs/", V(r, i, 0), V(r, i, 0));
            for (int k = 1; k < 5; k++)
                td(b, NULL, V(r, i, k));
            sb_puts(b, "</tr>");
        }
        if (PQntuples(r) == 0)
            sb_puts(b, "<tr><td colspan=\"5\" class=\"muted\">None.</td></tr>");
        PQclear(r);
    }
    sb_puts(b, "</tbody></table><p class=\"muted\">This page refreshes every 10 seconds.</p>");
    page_end(b);
}

/* ------------------------------------------------------------------------------------------------ */
/* Jobs                                                                                              */

/* A filter value from the query string: NULL when absent or empty. */
static const char *param(const http_req *req, const char *key)
{
    const char *v = http_param(req, key);
    return v && v[0] ? v : NULL;
}

static void filter_input(sbuf *b, const char *name, const char *label, const char *value)
{
    sb_printf(b, "<label>%s <input name=\"%s\" value=\"", label, name);
    sb_html(b, value);
    sb_puts(b, "\"></label>");
}

/* How far a time is from now, as a person says it: "in 10 min", "1 h 5 min ago", "in 2 d 3 h", "now".
 * Rounded to the nearest minute (hour, beyond a day), so that a job delayed by ten minutes reads "in
 * 10 min" a few seconds later too. */
static const char *relative_time(char *buf, size_t size, long long secs)
{
    long long a = secs < 0 ? -secs : secs, min = (a + 30) / 60, hours = (a + 1800) / 3600;
    char amount[48];

    if (a == 0)
        return "now";
    if (a < 60)
        snprintf(amount, sizeof amount, "%lld s", a);
    else if (min < 60)
        snprintf(amount, sizeof amount, "%lld min", min);
    else if (min < 24 * 60 && min % 60)
        snprintf(amount, sizeof amount, "%lld h %lld min", min / 60, min % 60);
    else if (min < 24 * 60)
        snprintf(amount, sizeof amount, "%lld h", min / 60);
    else if (hours % 24)
        snprintf(amount, sizeof amount, "%lld d %lld h", hours / 24, hours % 24);
    else
        snprintf(amount, sizeof amount, "%lld d", hours / 24);
    snprintf(buf, size, secs > 0 ? "in %s" : "%s ago", amount);
    return buf;
}

/* A job's run-at cell: when it is (or was) due relative to now on the database's clock, with the
 * absolute time (UTC) as its title and machine-readable datetime. */
static void td_run_at(sbuf *b, const char *text, const char *iso, long long secs, int scheduled)
{
    char rel[48];

    if (text[0] == '\0') {
        sb_puts(b, "<td class=\"run-at\">-</td>");
        return;
    }
    sb_printf(b, "<td class=\"run-at%s\" title=\"", scheduled ? " scheduled" : "");
    sb_html(b, text);
    sb_puts(b, " UTC\"><time datetime=\"");
    sb_html(b, iso);
    sb_puts(b, "\">");
    sb_html(b, relative_time(rel, sizeof rel, secs));
    sb_puts(b, "</time></td>");
}

static void page_jobs(serve *s, pgjobq_client *c, const http_req *req, http_resp *out)
{
    static const char *const states[] = {"waiting", "queued", "running", "completed", "failed", "cancelled"};
    sbuf *b = &out->body;
    const char *state = param(req, "state"), *queue = param(req, "queue"), *kind = param(req, "kind"),
               *text = param(req, "q"), *worker = param(req, "worker"), *before = param(req, "before");
    char before_s[24] = "";

    if (before) {
        char *end;
        long long v = strtoll(before, &end, 10);
        if (*end || v <= 0)
            before = NULL;
        else
            snprintf(before_s, sizeof before_s, "%lld", v);
    }
    page_begin(s, b, "jobs", 0);
    sb_puts(b, "<h1>Jobs</h1><form class=\"filters\" method=\"get\" action=\"/jobs\"><label>State <select name=\"state\">"
               "<option value=\"\">any</option>");
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
        sb_printf(b, "<option%s>%s</option>", state && strcmp(state, states[i]) == 0 ? " selected" : "", states[i]);
    sb_puts(b, "</select></label>");
    filter_input(b, "queue", "Queue", queue);
    filter_input(b, "kind", "Kind", kind);
    filter_input(b, "q", "Error contains", text);
    filter_input(b, "worker", "Worker", worker);
    sb_puts(b, "<button type=\"submit\">Filter</button></form>");

    /* Bulk actions act on what the bulk functions can choose by: queue, state and kind. */
    if (s->allow_actions && queue && state && !text && !worker) {
        const char *fields[] = {"queue", queue, "state", state, "kind", kind, NULL};
        sbuf back;
        sb_init(&back);
        sb_puts(&back, "/jobs?queue=");
        sb_url(&back, queue);
        sb_puts(&back, "&state=");
        sb_url(&back, state);
        if (kind) {
            sb_puts(&back, "&kind=");
            sb_url(&back, kind);
        }
        sb_puts(b, "<div class=\"card\" id=\"bulk\">All ");
        sb_html(b, state);
        sb_puts(b, " jobs of this filter: ");
        if (strcmp(state, "running") != 0)
            action_form(s, b, "retry_where", "Retry all", fields, back.failed ? "/jobs" : back.data, 0);
        if (strcmp(state, "queued") == 0 || strcmp(state, "running") == 0)
            action_form(s, b, "cancel_where", "Cancel all", fields, back.failed ? "/jobs" : back.data, 1);
        sb_puts(b, "</div>");
        sb_free(&back);
    }

    const char *values[7] = {state, queue, kind, text, before ? before_s : NULL, worker, NULL};
    char limit[16];
    snprintf(limit, sizeof limit, "%d", PAGE_ROWS + 1);
    values[6] = limit;
    PGresult *r = query(
        c, out,
        "SELECT a.id, a.queue, a.kind, a.state::text, a.attempt, a.max_attempts, " TS("a.created_at") ", " TS(
            "a.finished_at") ", left(coalesce(a.last_error, ''), 140), coalesce(a.worker_id, ''), " TS("a.run_at") ","
                             " coalesce(to_char(a.run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), ''),"
                             " coalesce(round(extract(epoch FROM a.run_at - now()))::bigint, 0),"
                             " (a.state = 'queued' AND a.run_at > now())::int"
                             " FROM pgjobq.monitor_jobs($1, $2, $3, $4, $5::bigint, $6, $7::int) a",
        7, values);
    if (r) {
        int n = PQntuples(r);
        sb_puts(b, "<table id=\"jobs\"><thead><tr><th>Job</th><th>Queue</th><th>Kind</th><th>State</th>"
                   "<th>Attempt</th><th>Run at</th><th>Created (UTC)</th><th>Finished (UTC)</th><th>Last error</th>"
                   "</tr></thead><tbody>");
        for (int i = 0; i < n && i < PAGE_ROWS; i++) {
            tr(b, "id", V(r, i, 0));
            td_link(b, NULL, "/jobs/", V(r, i, 0), V(r, i, 0));
            td(b, NULL, V(r, i, 1));
            td(b, NULL, V(r, i, 2));
            int scheduled = atoi(V(r, i, 13));
            sb_puts(b, "<td class=\"st\">");
            state_badge(b, V(r, i, 3));
            if (scheduled)
                sb_puts(b, " <span class=\"state s-scheduled\" title=\"queued, not due yet\">scheduled</span>");
            sb_puts(b, "</td><td class=\"n\">");
            sb_html(b, V(r, i, 4));
            sb_puts(b, "/");
            sb_html(b, V(r, i, 5));
            sb_puts(b, "</td>");
            td_run_at(b, V(r, i, 10), V(r, i, 11), atoll(V(r, i, 12)), scheduled);
            td(b, "t", V(r, i, 6));
            td(b, "t", V(r, i, 7));
            td(b, "err", V(r, i, 8));
            sb_puts(b, "</tr>");
        }
        if (n == 0)
            sb_puts(b, "<tr><td colspan=\"9\" class=\"muted\">No jobs match.</td></tr>");
        sb_puts(b, "</tbody></table>");
        if (n > PAGE_ROWS) {
            /* Keyset pagination: the next page starts below the last id shown. */
            sb_puts(b, "<p><a id=\"older\" href=\"/jobs?before=");
            sb_url(b, V(r, PAGE_ROWS - 1, 0));
            const char *keys[] = {"state", "queue", "kind", "q", "worker"};
            const char *vals[] = {state, queue, kind, text, worker};
            for (int k = 0; k < 5; k++) {
                if (!vals[k])
                    continue;
                sb_printf(b, "&amp;%s=", keys[k]);
                sb_url(b, vals[k]);
            }
            sb_puts(b, "\">Older jobs &rarr;</a></p>");
        }
        PQclear(r);
    }
    page_end(b);
}

static void field(sbuf *b, const char *name, const char *value)
{
    sb_puts(b, "<dt>");
    sb_html(b, name);
    sb_puts(b, "</dt><dd>");
    sb_html(b, value && value[0] ? value : "-");
    sb_puts(b, "</dd>");
}

/* A JSON document from jsonb_pretty, HTML-escaped, with every empty object and array on one line:
 * jsonb_pretty writes {} as "{" newline "}" (nested, "{" newline spaces "}").  A newline in its text
 * is always layout, never inside a string (JSON writes that as \n), so a bracket followed by a
 * newline, spaces and the matching closing bracket is an empty one. */
static void pre_json(sbuf *b, const char *pretty)
{
    sbuf t;

    sb_init(&t);
    for (const char *p = pretty; *p; p++) {
        sb_putn(&t, p, 1);
        if ((*p == '{' || *p == '[') && p[1] == '\n') {
            const char *q = p + 2 + strspn(p + 2, " ");
            if (*q == (*p == '{' ? '}' : ']')) {
                sb_putn(&t, q, 1);
                p = q;
            }
        }
    }
    sb_html(b, t.failed ? pretty : t.data);
    sb_free(&t);
}

static void page_job(serve *s, pgjobq_client *c, const char *id_s, http_resp *out)
{
    sbuf *b = &out->body;
    char *end;
    long long id = strtoll(id_s, &end, 10);
    char idbuf[24];

    if (*id_s == '\0' || *end || id <= 0) {
        out->status = 404;
        page_begin(s, b, "not found", 0);
        sb_puts(b, "<h1>Not found</h1><p>A job's address is /jobs/ and its id.</p>");
        page_end(b);
        return;
    }
    snprintf(idbuf, sizeof idbuf, "%lld", id);
    const char *values[2] = {idbuf, s->hide_payloads ? "1" : "0"};
    page_begin(s, b, idbuf, 0);
    PGresult *r = query(c, out,
                        "SELECT a.id, a.queue, a.kind, a.state::text, a.priority, a.attempt, a.max_attempts,"
                        " " TS("a.run_at") ", " TS("a.created_at") ", " TS("a.started_at") ", " TS("a.finished_at") ","
                        " " TS("a.lease_until") ", coalesce(a.worker_id, ''),"
                        " coalesce(a.unique_key, ''), a.cancel_requested::text,"
                        " CASE WHEN $2 = '1' THEN NULL ELSE jsonb_pretty(a.payload) END,"
                        " CASE WHEN $2 = '1' THEN NULL ELSE jsonb_pretty(a.result) END, a.last_error,"
                        " coalesce(array_to_string(a.tags, ', '), ''),"
                        " CASE WHEN $2 = '1' THEN NULL ELSE jsonb_pretty(a.progress) END"
                        " FROM pgjobq.monitor_job($1::bigint) a",
                        2, values);
    if (r && PQntuples(r) == 0) {
        out->status = 404;
        sb_printf(b, "<h1>Job %lld</h1><p>No such job (it may have been pruned).</p>", id);
    } else if (r) {
        const char *state = V(r, 0, 3);
        sb_printf(b, "<h1>Job %lld ", id);
        state_badge(b, state);
        sb_puts(b, "</h1><dl id=\"job\">");
        static const char *const names[] = {NULL,         "queue",      "kind",       NULL,        "priority",
                                            NULL,         NULL,         "run at (UTC)", "created (UTC)", "started (UTC)",
                                            "finished (UTC)", "lease until (UTC)", "worker", "unique key",
                                            "cancel requested"};
        for (int k = 1; k < 15; k++) {
            if (names[k] == NULL)
                continue;
            field(b, names[k], V(r, 0, k));
        }
        if (*V(r, 0, 18))
            field(b, "tags", V(r, 0, 18));
        sb_puts(b, "<dt>attempt</dt><dd>");
        sb_html(b, V(r, 0, 5));
        sb_puts(b, " of ");
        sb_html(b, V(r, 0, 6));
        sb_puts(b, "</dd></dl>");
        if (s->allow_actions) {
            const char *fields[] = {"id", idbuf, NULL};
            char back[48];
            snprintf(back, sizeof back, "/jobs/%lld", id);
            sb_puts(b, "<div id=\"actions\">");
            if (strcmp(state, "running") != 0)
                action_form(s, b, "retry", "Retry now", fields, back, 0);
            if (strcmp(state, "queued") == 0 || strcmp(state, "running") == 0)
                action_form(s, b, "cancel", "Cancel", fields, back, 1);
            sb_puts(b, "</div>");
        }
        sb_puts(b, "<h2>Payload</h2><pre id=\"payload\">");
        if (s->hide_payloads)
            sb_puts(b, "(hidden)");
        else
            pre_json(b, V(r, 0, 15));
        sb_puts(b, "</pre><h2>Result</h2><pre id=\"result\">");
        if (s->hide_payloads || PQgetisnull(r, 0, 16))
            sb_puts(b, s->hide_payloads ? "(hidden)" : "-");
        else
            pre_json(b, V(r, 0, 16));
        sb_puts(b, "</pre><h2>Last error</h2><pre id=\"last-error\">");
        sb_html(b, PQgetisnull(r, 0, 17) ? "-" : V(r, 0, 17));
        sb_puts(b, "</pre>");
        if (!PQgetisnull(r, 0, 19) || s->hide_payloads) {
            sb_puts(b, "<h2>Progress</h2><pre id=\"progress\">");
            if (s->hide_payloads)
                sb_puts(b, "(hidden)");
            else
                pre_json(b, V(r, 0, 19));
            sb_puts(b, "</pre>");
        }
        /* Its place in a workflow: parents and children, linked. */
        PGresult *rel = query(c, out,
                              "SELECT 'parent', p.id::text, p.state FROM pgjobq.parents($1::bigint) p UNION ALL"
                              " SELECT 'child', k.id::text, k.state FROM pgjobq.children($1::bigint) k",
                              1, values);
        if (rel && PQntuples(rel) > 0) {
            sb_puts(b, "<h2>Workflow</h2><table id=\"relatives\"><thead><tr><th></th><th>Job</th><th>State</th>"
                       "</tr></thead><tbody>");
            for (int i = 0; i < PQntuples(rel); i++) {
                sb_puts(b, "<tr>");
                td(b, NULL, V(rel, i, 0));
                td_link(b, NULL, "/jobs/", V(rel, i, 1), V(rel, i, 1));
                sb_puts(b, "<td>");
                state_badge(b, V(rel, i, 2));
                sb_puts(b, "</td></tr>");
            }
            sb_puts(b, "</tbody></table>");
        }
        PQclear(rel);
    }
    PQclear(r);
    page_end(b);
}

/* ------------------------------------------------------------------------------------------------ */
/* Queues and workers                                                                                */

/* A queue's rate limit as `pgjobq queue ls` prints it ("100/1m"), from its limit and its window in
 * milliseconds; "-" without one. */
static const char *rate_text(char *buf, size_t size, const char *limit, const char *period_ms)
{
    char period[24];
    long long n = atoll(limit), ms = atoll(period_ms);

    if (n <= 0 || ms <= 0)
        return "-";
    snprintf(buf, size, "%lld/%s", n, format_period(period, sizeof period, ms));
    return buf;
}

static void page_queues(serve *s, pgjobq_client *c, http_resp *out)
{
    sbuf *b = &out->body;
    PGresult *r;

    page_begin(s, b, "queues", 0);
    sb_puts(b, "<h1>Queues</h1><table id=\"queue-settings\"><thead><tr><th>Queue</th><th>State</th>"
               "<th>Concurrency</th><th>Per key</th><th>Rate</th><th>Due</th><th>Scheduled</th><th>Running</th>"
               "<th>Expired</th><th></th></tr></thead><tbody>");
    r = query(c, out,
              "SELECT queue, (paused_at IS NOT NULL)::int, coalesce(pause_reason, ''), coalesce(concurrency::text, ''),"
              " coalesce(key_concurrency::text, ''), coalesce(rate_limit, 0),"
              " coalesce((extract(epoch FROM rate_period) * 1000)::bigint, 0), queued, scheduled, running, expired"
              " FROM pgjobq.queue_list()",
              0, NULL);
    if (r) {
        for (int i = 0; i < PQntuples(r); i++) {
            int paused = atoi(V(r, i, 1));
            char rate[48];
            tr(b, "queue", V(r, i, 0));
            td_link(b, NULL, "/jobs?queue=", V(r, i, 0), V(r, i, 0));
            sb_puts(b, "<td>");
            state_badge(b, paused ? "paused" : "active");
            if (paused && V(r, i, 2)[0]) {
                sb_puts(b, " <span class=\"muted\">");
                sb_html(b, V(r, i, 2));
                sb_puts(b, "</span>");
            }
            sb_puts(b, "</td>");
            td(b, "n", V(r, i, 3)[0] ? V(r, i, 3) : "-");
            td(b, "n", V(r, i, 4)[0] ? V(r, i, 4) : "-");
            td(b, "n rate", rate_text(rate, sizeof rate, V(r, i, 5), V(r, i, 6)));
            for (int k = 7; k < 11; k++)
                td(b, "n", V(r, i, k));
            sb_puts(b, "<td>");
            const char *fields[] = {"queue", V(r, i, 0), NULL};
            action_form(s, b, paused ? "resume" : "pause", paused ? "Resume" : "Pause", fields, "/queues", !paused);
            sb_puts(b, "</td></tr>");
        }
        if (PQntuples(r) == 0)
            sb_puts(b, "<tr><td colspan=\"10\" class=\"muted\">No queues yet.</td></tr>");
        PQclear(r);
    }
    sb_puts(b, "</tbody></table><h2>Schedules</h2><table id=\"schedules\"><thead><tr><th>Name</th><th>Cron</th>"
               "<th>Time zone</th><th>Queue</th><th>Kind</th><th>Enabled</th><th>Next run (UTC)</th>"
               "<th>Last run (UTC)</th><th></th></tr></thead><tbody>");
    r = query(c, out,
              "SELECT name::text, cron, tz, queue::text, kind::text, enabled::int, " TS("next_run") ", " TS(
                  "last_run") " FROM pgjobq.schedule_list()",
              0, NULL);
    if (r) {
        for (int i = 0; i < PQntuples(r); i++) {
            int enabled = atoi(V(r, i, 5));
            sb_puts(b, "<tr>");
            for (int k = 0; k < 8; k++)
                td(b, NULL, k == 5 ? (enabled ? "yes" : "no") : V(r, i, k));
            sb_puts(b, "<td>");
            const char *fields[] = {"name", V(r, i, 0), NULL};
            action_form(s, b, enabled ? "disable" : "enable", enabled ? "Disable" : "Enable", fields, "/queues", 0);
            sb_puts(b, "</td></tr>");
        }
        if (PQntuples(r) == 0)
            sb_puts(b, "<tr><td colspan=\"9\" class=\"muted\">No schedules.</td></tr>");
        PQclear(r);
    }
    sb_puts(b, "</tbody></table>");
    page_end(b);
}

static void page_workers(serve *s, pgjobq_client *c, http_resp *out)
{
    sbuf *b = &out->body;

    page_begin(s, b, "workers", 10);
    sb_puts(b, "<h1>Workers</h1><table id=\"workers\"><thead><tr><th>Worker</th><th>State</th><th>Host</th>"
               "<th>Pid</th><th>Queues (concurrency)</th><th>Jobs held</th><th>Started (UTC)</th>"
               "<th>Last seen</th><th>Version</th></tr></thead><tbody>");
    PGresult *r = query(c, out,
                        "SELECT w.id, w.alive::int, w.host, w.pid, w.queues, w.jobs, " TS("w.started_at") ","
                        " round(extract(epoch FROM now() - w.last_seen))::bigint, w.version"
                        " FROM pgjobq.monitor_workers() w ORDER BY 2 DESC, 1",
                        0, NULL);
    if (r) {
        for (int i = 0; i < PQntuples(r); i++) {
            int alive = atoi(V(r, i, 1));
            tr(b, "worker", V(r, i, 0));
            td(b, NULL, V(r, i, 0));
            sb_puts(b, "<td>");
            state_badge(b, alive ? "running" : "gone");
            sb_puts(b, "</td>");
            td(b, NULL, V(r, i, 2));
            td(b, "n", V(r, i, 3));
            td(b, NULL, V(r, i, 4));
            td_link(b, "n", "/jobs?state=running&amp;worker=", V(r, i, 0), V(r, i, 5));
            td(b, NULL, V(r, i, 6));
            sb_puts(b, "<td>");
            sb_html(b, V(r, i, 7));
            sb_puts(b, " s ago</td>");
            td(b, NULL, V(r, i, 8));
            sb_puts(b, "</tr>");
        }
        if (PQntuples(r) == 0)
            sb_puts(b, "<tr><td colspan=\"9\" class=\"muted\">No worker seen in the last hour.</td></tr>");
        PQclear(r);
    }
    sb_puts(b, "</tbody></table><p class=\"muted\">A worker records itself every 5 seconds; one not seen for 15 "
               "seconds is shown as gone.</p>");
    page_end(b);
}

/* ------------------------------------------------------------------------------------------------ */
/* Actions                                                                                           */

static void action_result(serve *s, http_resp *out, int status, const char *what, const char *detail)
{
    sbuf *b = &out->body;
    out->status = status;
    page_begin(s, b, what, 0);
    sb_puts(b, "<h1>");
    sb_html(b, what);
    sb_puts(b, "</h1><p class=\"error\" id=\"refused\">");
    sb_html(b, detail);
    sb_puts(b, "</p>");
    page_end(b);
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
    OP_DISABLE
} op_kind;
static const char *const op_names[] = {
    "an unknown operation", "retry", "cancel", "retry_where", "cancel_where", "pause", "resume", "enable", "disable"};

static op_kind op_parse(const char *s)
{
    for (int i = OP_RETRY; s && i <= OP_DISABLE; i++)
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
static void do_action(serve *s, const http_req *req, http_resp *out)
{
    op_kind op = op_parse(http_param(req, "op"));
    const char *what = op_names[op], *token = http_param(req, "csrf");
    const char *queue = param(req, "queue"), *state = param(req, "state"), *kind = param(req, "kind");
    const char *id_s = param(req, "id"), *name = param(req, "name");
    const char *bad = NULL;
    pgjobq_filter f = PGJOBQ_FILTER_INIT;
    long long id = 0;
    char msg[512];
    int rc, slot;
    int64_t n = 0, skipped = 0;

    if (!s->allow_actions) {
        serve_log("refused %s from %s: actions are not enabled (--allow-actions)", what, req->peer);
        action_result(s, out, 403, "Refused", "Actions are not enabled on this server (pgjobq serve --allow-actions).");
        return;
    }
    if (token == NULL || !http_secret_equal(token, s->csrf)) {
        serve_log("refused %s from %s: missing or wrong CSRF token", what, req->peer);
        action_result(s, out, 403, "Refused", "The form's token is missing or stale: reload the page and try again.");
        return;
    }
    switch (op) {
    case OP_UNKNOWN: bad = "No such operation."; break;
    case OP_RETRY:
    case OP_CANCEL: {
        char *end = NULL;
        id = id_s ? strtoll(id_s, &end, 10) : 0;
        if (id_s == NULL || *end || id <= 0 || !isdigit((unsigned char)id_s[0]))
            bad = "A job id is needed.";
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
        action_result(s, out, 400, "Bad request", bad);
        return;
    }
    pgjobq_client *c = pool_get(s, &slot);
    if (c == NULL) {
        action_result(s, out, 503, "Database unavailable", "The database cannot be reached.");
        return;
    }
    switch (op) {
    case OP_RETRY:
    case OP_CANCEL:
        rc = op == OP_RETRY ? pgjobq_job_retry(c, id) : pgjobq_job_cancel(c, id, NULL);
        snprintf(msg, sizeof msg, "%s job %lld", what, id);
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
        pool_put(s, slot);
        serve_log("action from %s failed: %s", req->peer, why);
        action_result(s, out, action_status(rc), "Not done", why);
        return;
    }
    pool_put(s, slot);
    serve_log("action from %s: %s", req->peer, msg);
    out->status = 303;
    out->location = local_page(http_param(req, "back"));
    sb_puts(&out->body, "done\n");
    out->content_type = "text/plain; charset=utf-8";
}

/* ------------------------------------------------------------------------------------------------ */
/* Routing                                                                                           */

/* Called first on a thread that reads connections (req->may_block 0): /healthz, /metrics (from the
 * collector's last text), the stylesheet and refusals are answered there at once, so that pages
 * waiting for the database never delay them.  Everything that queries the database is deferred to
 * a worker (may_block 1), which takes a page connection from the pool. */
static void handle(void *arg, const http_req *req, http_resp *out)
{
    serve *s = arg;
    int slot;

    if (strcmp(req->path, "/healthz") == 0) {
        out->content_type = "text/plain; charset=utf-8";
        sb_puts(&out->body, "ok\n");
        return;
    }
    if (strcmp(req->path, "/metrics") == 0) {
        /* Before the first collection, a worker waits for it (a few seconds at most). */
        char *text = serve_metrics_text(s->metrics, req->may_block ? 3000 : 0);
        if (text == NULL && !req->may_block) {
            out->defer = 1;
            return;
        }
        out->content_type = "text/plain; version=0.0.4; charset=utf-8";
        if (text == NULL) {
            out->status = 503;
            sb_puts(&out->body, "# no collection yet\n");
            return;
        }
        sb_puts(&out->body, text);
        free(text);
        return;
    }
    if (strcmp(req->path, "/static/style.css") == 0) {
        out->content_type = "text/css; charset=utf-8";
        sb_puts(&out->body, css);
        return;
    }
    if (strcmp(req->method, "POST") == 0) {
        if (strcmp(req->path, "/actions") == 0 && !req->may_block)
            out->defer = 1;
        else if (strcmp(req->path, "/actions") == 0)
            do_action(s, req, out);
        else
            action_result(s, out, 405, "Not allowed", "Only /actions accepts a POST.");
        return;
    }
    int known = strcmp(req->path, "/") == 0 || strcmp(req->path, "/jobs") == 0 || strncmp(req->path, "/jobs/", 6) == 0 ||
                strcmp(req->path, "/queues") == 0 || strcmp(req->path, "/workers") == 0;
    if (!known) {
        out->status = 404;
        page_begin(s, &out->body, "not found", 0);
        sb_puts(&out->body, "<h1>Not found</h1><p><a href=\"/\">Overview</a></p>");
        page_end(&out->body);
        return;
    }
    if (!req->may_block) {
        out->defer = 1;
        return;
    }
    pgjobq_client *c = pool_get(s, &slot);
    if (c == NULL) {
        out->status = 503;
        page_begin(s, &out->body, "database unavailable", 10);
        sb_puts(&out->body, "<h1>Database unavailable</h1><p class=\"error\">The database cannot be reached; this "
                            "page retries every 10 seconds.</p>");
        page_end(&out->body);
        return;
    }
    if (strcmp(req->path, "/") == 0)
        page_overview(s, c, out);
    else if (strcmp(req->path, "/jobs") == 0)
        page_jobs(s, c, req, out);
    else if (strncmp(req->path, "/jobs/", 6) == 0)
        page_job(s, c, req->path + 6, out);
    else if (strcmp(req->path, "/queues") == 0)
        page_queues(s, c, out);
    else
        page_workers(s, c, out);
    pool_put(s, slot);
}

/* ------------------------------------------------------------------------------------------------ */
/* The command                                                                                       */

typedef struct serve_args {
    const cli_cmd *cmd;
    const char *listen, *auth_file;
    int allow_actions, hide_payloads;
    int64_t interval_ms, query_timeout_ms;
    const char *hosts[MAX_HOSTS + 1]; /* --allow-host, NULL-terminated */
    int nhosts;
} serve_args;

static int serve_opt(int key, const char *arg, void *ctx)
{
    serve_args *a = ctx;
    char why[128];

    switch (key) {
    case OPT_LISTEN: a->listen = arg; return 0;
    case OPT_AUTH: a->auth_file = arg; return 0;
    case OPT_ACTIONS: a->allow_actions = 1; return 0;
    case OPT_HIDE: a->hide_payloads = 1; return 0;
    case OPT_INTERVAL:
        if (cli_parse_duration_ms(arg, &a->interval_ms, why, sizeof why) != 0 || a->interval_ms < 100 ||
            a->interval_ms > 3600000) {
            cli_usage_error(a->cmd, "--interval: %s", a->interval_ms ? "must be between 100ms and 1h" : why);
            return -1;
        }
        return 0;
    case OPT_QTIMEOUT:
        if (cli_parse_duration_ms(arg, &a->query_timeout_ms, why, sizeof why) != 0 || a->query_timeout_ms < 100 ||
            a->query_timeout_ms > 600000) {
            cli_usage_error(a->cmd, "--query-timeout: %s",
                            a->query_timeout_ms ? "must be between 100ms and 10min" : why);
            return -1;
        }
        return 0;
    case OPT_HOST: {
        char host[256];
        if (http_host_parse(arg, host, sizeof host) != 0) {
            cli_usage_error(a->cmd, "--allow-host: '%s' is not a host name or an IP address", arg);
            return -1;
        }
        if (a->nhosts == MAX_HOSTS) {
            cli_usage_error(a->cmd, "--allow-host: at most %d names", MAX_HOSTS);
            return -1;
        }
        a->hosts[a->nhosts++] = arg;
        return 0;
    }
    }
    return -1;
}

int cmd_serve(const cli_cmd *cmd, int argc, char **argv)
{
    serve_args a = {cmd, "127.0.0.1:9464", NULL, 0, 0, 5000, 5000, {NULL}, 0};
    http_addr addr;
    char why[256];
    char *token = NULL;
    unsigned char rnd[32];
    int first, status = EX_OK;
    serve s;

    first = cli_parse(cmd, argc, argv, serve_opt, &a);
    if (first == -2)
        return EX_OK;
    if (first < 0)
        return EX_USAGE;
    if (first < argc)
        return cli_usage_error(cmd, "unexpected argument '%s'", argv[first]);
    if (http_addr_parse(a.listen, &addr, why, sizeof why) != 0)
        return cli_usage_error(cmd, "--listen: %s", why);
    if (a.auth_file) {
        if ((token = http_token_from_file(a.auth_file, why, sizeof why)) == NULL) {
            cli_err("serve: %s", why);
            return EX_USAGE;
        }
    } else if (getenv("PGJOBQ_SERVE_TOKEN") && getenv("PGJOBQ_SERVE_TOKEN")[0]) {
        if (strlen(getenv("PGJOBQ_SERVE_TOKEN")) < 16) {
            cli_err("serve: $PGJOBQ_SERVE_TOKEN must be at least 16 characters");
            return EX_USAGE;
        }
        if ((token = strdup(getenv("PGJOBQ_SERVE_TOKEN"))) == NULL)
            return EX_OSERR;
    }
    if (!addr.loopback && token == NULL) {
        cli_err("serve: %s is not a loopback address: require credentials with --auth-file FILE (or "
                "$PGJOBQ_SERVE_TOKEN), or listen on 127.0.0.1",
                a.listen);
        return EX_USAGE;
    }

    memset(&s, 0, sizeof s);
    s.allow_actions = a.allow_actions;
    s.hide_payloads = a.hide_payloads;
    s.query_timeout_ms = a.query_timeout_ms;
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        cli_err("serve: no randomness for the CSRF token: %s", strerror(errno));
        free(token);
        return EX_OSERR;
    }
    for (size_t i = 0; i < sizeof rnd; i++)
        snprintf(s.csrf + 2 * i, 3, "%02x", rnd[i]);
    if ((s.conninfo = cli_resolve_db(&status)) == NULL) {
        free(token);
        return status;
    }
    /* Check the database once before serving: a wrong URL is an error now, not a page later. */
    pgjobq_client *probe = cli_connect(0, &status);
    if (probe == NULL) {
        free(token);
        return status;
    }
    pgjobq_client_close(probe);
    pthread_mutex_init(&s.pool_mu, NULL);
    pthread_cond_init(&s.pool_cv, NULL);

    /* Signals are taken by sigwait below; every thread started from here on has them blocked. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    if ((s.metrics = serve_metrics_start(s.conninfo, a.interval_ms)) == NULL) {
        cli_err("serve: cannot start the metrics collector");
        status = EX_OSERR;
        goto out;
    }
    /* The names this server answers to (against DNS rebinding): its address, localhost's names when
     * it listens on loopback or on every interface (then any IP address too), and --allow-host. */
    const char *names[5] = {addr.host, NULL, NULL, NULL, NULL};
    int wildcard = strcmp(addr.host, "0.0.0.0") == 0 || strcmp(addr.host, "::") == 0;
    if (addr.loopback || wildcard) {
        names[1] = "localhost";
        names[2] = "127.0.0.1";
        names[3] = "::1";
    }
    http_opts ho;
    memset(&ho, 0, sizeof ho);
    ho.token = token;
    ho.hosts = names;
    ho.allow_hosts = a.hosts;
    ho.any_ip = wildcard;
    ho.workers = POOL;
    ho.log = serve_log;
    http_server *srv = http_start_opts(&addr, &ho, handle, &s, why, sizeof why);
    if (srv == NULL) {
        cli_err("serve: %s", why);
        status = EX_UNAVAILABLE;
        goto out;
    }
    serve_log("listening on http://%s%s%s:%d/ (%s%s%s)", strchr(addr.host, ':') ? "[" : "", addr.host,
              strchr(addr.host, ':') ? "]" : "", http_port(srv), s.allow_actions ? "actions enabled" : "read-only",
              token ? ", credentials required" : "", s.hide_payloads ? ", payloads hidden" : "");
    int sig = 0;
    sigwait(&sigs, &sig);
    serve_log("stopping (signal %d)", sig);
    http_stop(srv);
out:
    serve_metrics_stop(s.metrics);
    for (int i = 0; i < POOL; i++)
        pgjobq_client_close(s.pool[i]);
    pthread_mutex_destroy(&s.pool_mu);
    pthread_cond_destroy(&s.pool_cv);
    free(token);
    return status;
}
