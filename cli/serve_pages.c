/*
 * serve_pages.c - the dashboard's pages: the overview (queues, the table's health, the throughput
 * chart, recent failures), the jobs (filtered, by pages), one job, the queues and schedules, and the
 * workers.  Each reads through the pgjobq.monitor_* and listing functions (docs/sql.md), never the
 * tables, and writes its HTML with serve_html.c's helpers.
 */
#include <stdlib.h>
#include <string.h>

#include "serve_dashboard.h"

#define PAGE_ROWS 50 /* jobs per page */
#define WORKER_ROWS 100 /* workers per page (20,000 rows of workers made one page of 102 MB) */
#define TS(x) "coalesce(to_char(" x " AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'), '')"
#define V(r, i, k) PQgetvalue((r), (i), (k))

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

/* The scale's top as few characters as fit the chart's left column: 9999, then 12.3k, 123k, 1.2M,
 * 123M, 1.2G (a six-digit count was clipped to "00000" at the column's left edge). */
static const char *scale_text(char *buf, size_t size, int64_t v)
{
    static const char units[] = "kMGTPE";
    double x = (double)v;
    int u = -1;

    if (v < 10000) {
        snprintf(buf, size, "%lld", (long long)v);
        return buf;
    }
    while (x >= 999.95 && u < 5) {
        x /= 1000;
        u++;
    }
    snprintf(buf, size, x < 99.95 ? "%.1f%c" : "%.0f%c", x, units[u]);
    return buf;
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
    char top[32];
    sb_printf(b, "<text class=\"scale\" x=\"%d\" y=\"%d\">%s</text><text class=\"scale\" x=\"%d\" y=\"%d\">0</text>",
              CH_LEFT - 6, CH_TOP + 4, scale_text(top, sizeof top, max), CH_LEFT - 6, base + 4);
    sb_printf(b,
              "<text x=\"%d\" y=\"%d\">60 min ago</text><text class=\"mid\" x=\"%.1f\" y=\"%d\">30 min ago</text>"
              "<text class=\"end\" x=\"%d\" y=\"%d\">now</text></svg>",
              CH_LEFT, CH_H - 4, CH_LEFT + 30 * bar, CH_H - 4, CH_W - CH_RIGHT, CH_H - 4);
}

/* The live workers that claim nothing because they cannot run jobs (a coprocess that cannot start):
 * a card above the page's table, with each one's reason (whole on /workers, its first line on the
 * overview).  Nothing when there are none. */
static void unhealthy_workers(sbuf *b, pgjobq_client *c, http_resp *out, int whole)
{
    PGresult *r = serve_query(c, out,
                              "SELECT id, host, pid, reason, round(extract(epoch FROM now() - since))::bigint"
                              " FROM pgjobq.monitor_unhealthy_workers()",
                              0, NULL);
    if (r && PQntuples(r) > 0) {
        sb_printf(b,
                  "<div class=\"card\" id=\"unhealthy\"><p class=\"error\"><strong>%d unhealthy worker%s</strong>: "
                  "claiming nothing until it can run jobs again.</p>",
                  PQntuples(r), PQntuples(r) == 1 ? "" : "s");
        for (int i = 0; i < PQntuples(r); i++) {
            const char *reason = V(r, i, 3);
            sb_puts(b, "<p class=\"worker-problem\"><strong>");
            sb_html(b, V(r, i, 0));
            sb_puts(b, "</strong> (pid ");
            sb_html(b, V(r, i, 2));
            sb_puts(b, " on ");
            sb_html(b, V(r, i, 1));
            sb_puts(b, "), for ");
            sb_html(b, V(r, i, 4));
            sb_puts(b, " s</p>");
            if (whole) {
                sb_puts(b, "<pre>");
                sb_html(b, reason);
                sb_puts(b, "</pre>");
            } else {
                char *first = strndup(reason, strcspn(reason, "\n"));
                sb_puts(b, "<p class=\"muted\">");
                sb_html(b, first ? first : "");
                sb_puts(b, " (<a href=\"/workers\">more</a>)</p>");
                free(first);
            }
        }
        sb_puts(b, "</div>");
    }
    PQclear(r);
}

void serve_page_overview(serve *s, pgjobq_client *c, http_resp *out)
{
    sbuf *b = &out->body;
    PGresult *r;

    html_page_begin(s, b, "overview", 10);
    unhealthy_workers(b, c, out, 0);
    sb_puts(b, "<h1>Overview</h1><table id=\"queues\"><thead><tr><th>Queue</th><th>State</th><th>Due</th>"
               "<th>Scheduled</th><th>Running</th><th>Lag</th><th>Completed (1 h)</th><th>Failed (1 h)</th>"
               "</tr></thead><tbody>");
    r = serve_query(c, out,
              "SELECT queue, paused::int, due, scheduled, running, coalesce(round(lag_s, 1)::text, ''),"
              " completed_1h, failed_1h FROM pgjobq.monitor_overview()",
              0, NULL);
    if (r) {
        for (int i = 0; i < PQntuples(r); i++) {
            html_tr(b, "queue", V(r, i, 0));
            html_td_link(b, NULL, "/jobs?queue=", V(r, i, 0), V(r, i, 0));
            sb_puts(b, "<td>");
            html_state_badge(b, atoi(V(r, i, 1)) ? "paused" : "active");
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
    /* The table and what holds vacuum back (pgjobq.health(); docs/deploy.md, "Snapshots held open").
     * The holder's query is there only when this server's role may see it in pg_stat_activity, and is
     * left out with --hide-payloads: it is another session's text, as a payload is a producer's. */
    const char *hide[1] = {s->hide_payloads ? "true" : "false"};
    r = serve_query(c, out,
              "SELECT pg_size_pretty(jobs_bytes), jobs_dead, coalesce(round(horizon_age_s)::text, ''),"
              " coalesce(holder_kind, ''), coalesce(holder_pid::text, ''), coalesce(holder_application, ''),"
              " coalesce(holder_state, ''), CASE WHEN $1 THEN '' ELSE coalesce(left(holder_query, 120), '') END,"
              " (coalesce(horizon_age_s, 0) >= 300)::int,"
              " coalesce(to_char(autovacuum_paused_since AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'), ''),"
              " coalesce(holder_role, '')"
              " FROM pgjobq.health()",
              1, hide);
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
            if (V(r, 0, 10)[0]) {
                sb_puts(b, " of role ");
                sb_html(b, V(r, 0, 10));
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
            if (V(r, 0, 9)[0]) {
                sb_puts(b, " Autovacuum of the table paused by pgjobq since ");
                sb_html(b, V(r, 0, 9));
                sb_puts(b, " UTC: a pass could remove nothing until it ends.");
            }
        } else {
            sb_puts(b, "Nothing holds vacuum back.");
        }
        sb_puts(b, "</p>");
    }
    PQclear(r);
    sb_puts(b, "<h2>Jobs finished per minute, last hour</h2><div class=\"card\">");
    r = serve_query(c, out,
              "SELECT minutes_ago, completed, failed FROM pgjobq.monitor_finished_per_minute()",
              0, NULL);
    if (r) {
        chart(b, r);
        PQclear(r);
    }
    sb_puts(b, "</div><h2>Failures, last hour</h2><table id=\"failures\"><thead><tr><th>Job</th><th>Queue</th>"
               "<th>Kind</th><th>Finished (UTC)</th><th>Error</th></tr></thead><tbody>");
    r = serve_query(c, out,
              "SELECT id, queue, kind, " TS("finished_at") ", left(coalesce(last_error, ''), 200)"
              " FROM pgjobq.monitor_failures(10)",
              0, NULL);
    if (r) {
        for (int i = 0; i < PQntuples(r); i++) {
            sb_puts(b, "<tr>");
            html_td_link(b, NULL, "/jobs/", V(r, i, 0), V(r, i, 0));
            for (int k = 1; k < 5; k++)
                html_td(b, NULL, V(r, i, k));
            sb_puts(b, "</tr>");
        }
        if (PQntuples(r) == 0)
            sb_puts(b, "<tr><td colspan=\"5\" class=\"muted\">None.</td></tr>");
        PQclear(r);
    }
    sb_puts(b, "</tbody></table><p class=\"muted\">This page refreshes every 10 seconds.</p>");
    html_page_end(b);
}

/* With --cluster: every shard's queues in one table, each with its shard; a shard that cannot be
 * reached, or whose query fails, is a row (and a line above the table) naming it, and the page is
 * still the overview. */
void serve_page_cluster_overview(serve *s, http_resp *out)
{
    sbuf *b = &out->body, rows, down;
    size_t n = pgjobq_cluster_shards(s->cluster), ndown = 0;

    sb_init(&rows);
    sb_init(&down);
    for (size_t i = 0; i < n; i++) {
        const char *name = pgjobq_cluster_shard_name(s->cluster, i);
        int slot;
        pgjobq_client *c = serve_pool_get_shard(s, i, &slot);
        PGresult *r = NULL;
        http_resp one;
        memset(&one, 0, sizeof one);
        sb_init(&one.body);
        if (c) {
            r = serve_query(c, &one,
                            "SELECT queue, paused::int, due, scheduled, running, coalesce(round(lag_s, 1)::text, ''),"
                            " completed_1h, failed_1h FROM pgjobq.monitor_overview()",
                            0, NULL);
            serve_pool_put(s, slot);
        }
        if (r == NULL) {
            ndown++;
            sb_puts(&rows, "<tr class=\"down\" data-shard-down=\"");
            sb_html(&rows, name);
            sb_puts(&rows, "\"><td>");
            sb_html(&rows, name);
            sb_puts(&rows, "</td><td colspan=\"8\" class=\"error\">down: ");
            sb_puts(&rows, c ? "its query failed" : "it cannot be reached");
            sb_puts(&rows, "</td></tr>");
            sb_puts(&down, ndown > 1 ? ", " : "");
            sb_html(&down, name);
            sb_free(&one.body);
            continue;
        }
        sb_free(&one.body);
        for (int k = 0; k < PQntuples(r); k++) {
            sb_puts(&rows, "<tr data-shard=\"");
            sb_html(&rows, name);
            sb_puts(&rows, "\" data-queue=\"");
            sb_html(&rows, V(r, k, 0));
            sb_puts(&rows, "\"><td><a href=\"/?shard=");
            sb_url(&rows, name);
            sb_puts(&rows, "\">");
            sb_html(&rows, name);
            sb_puts(&rows, "</a></td><td><a href=\"/jobs?shard=");
            sb_url(&rows, name);
            sb_puts(&rows, "&amp;queue=");
            sb_url(&rows, V(r, k, 0));
            sb_puts(&rows, "\">");
            sb_html(&rows, V(r, k, 0));
            sb_puts(&rows, "</a></td><td>");
            html_state_badge(&rows, atoi(V(r, k, 1)) ? "paused" : "active");
            sb_puts(&rows, "</td>");
            for (int col = 2; col < 8; col++) {
                sb_printf(&rows, "<td class=\"n\" data-col=\"%d\">", col);
                sb_html(&rows, V(r, k, col));
                sb_puts(&rows, col == 5 && V(r, k, col)[0] ? " s</td>" : "</td>");
            }
            sb_puts(&rows, "</tr>");
        }
        if (PQntuples(r) == 0) {
            sb_puts(&rows, "<tr data-shard=\"");
            sb_html(&rows, name);
            sb_puts(&rows, "\"><td>");
            sb_html(&rows, name);
            sb_puts(&rows, "</td><td colspan=\"8\" class=\"muted\">No jobs yet.</td></tr>");
        }
        PQclear(r);
    }
    html_page_begin(s, b, "overview", 10);
    if (ndown) {
        sb_printf(b, "<p class=\"error\" id=\"shards-down\">Shard%s down: ", ndown == 1 ? "" : "s");
        sb_putn(b, down.data ? down.data : "", down.len);
        sb_puts(b, ". The other shards are shown.</p>");
    }
    sb_puts(b, "<h1>Overview</h1><table id=\"queues\"><thead><tr><th>Shard</th><th>Queue</th><th>State</th>"
               "<th>Due</th><th>Scheduled</th><th>Running</th><th>Lag</th><th>Completed (1 h)</th>"
               "<th>Failed (1 h)</th></tr></thead><tbody>");
    sb_putn(b, rows.data ? rows.data : "", rows.len);
    sb_puts(b, "</tbody></table><p class=\"muted\">A shard's own overview (its chart, failures and table "
               "health): choose it above. This page refreshes every 10 seconds.</p>");
    html_page_end(b);
    sb_free(&rows);
    sb_free(&down);
}

/* ------------------------------------------------------------------------------------------------ */
/* Jobs                                                                                              */

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

void serve_page_jobs(serve *s, pgjobq_client *c, const http_req *req, http_resp *out)
{
    static const char *const states[] = {"waiting", "queued", "running", "completed", "failed", "cancelled"};
    sbuf *b = &out->body;
    const char *state = serve_param(req, "state"), *queue = serve_param(req, "queue"), *kind = serve_param(req, "kind"),
               *text = serve_param(req, "q"), *worker = serve_param(req, "worker"), *before = serve_param(req, "before");
    char before_s[24] = "";

    if (before) {
        long long v;
        char why[128];
        /* A cursor past 2^63-1 is dropped (the first page), never clamped to another place. */
        if (cli_parse_int(before, 1, INT64_MAX, &v, why, sizeof why) != 0)
            before = NULL;
        else
            snprintf(before_s, sizeof before_s, "%lld", v);
    }
    html_page_begin(s, b, "jobs", 0);
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
            html_action_form(s, b, "retry_where", "Retry all", fields, back.failed ? "/jobs" : back.data, 0);
        if (strcmp(state, "queued") == 0 || strcmp(state, "running") == 0)
            html_action_form(s, b, "cancel_where", "Cancel all", fields, back.failed ? "/jobs" : back.data, 1);
        sb_puts(b, "</div>");
        sb_free(&back);
    }

    const char *values[7] = {state, queue, kind, text, before ? before_s : NULL, worker, NULL};
    char limit[16];
    snprintf(limit, sizeof limit, "%d", PAGE_ROWS + 1);
    values[6] = limit;
    PGresult *r = serve_query(
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
            html_tr(b, "id", V(r, i, 0));
            html_td_link(b, NULL, "/jobs/", V(r, i, 0), V(r, i, 0));
            html_td(b, NULL, V(r, i, 1));
            html_td(b, NULL, V(r, i, 2));
            int scheduled = atoi(V(r, i, 13));
            sb_puts(b, "<td class=\"st\">");
            html_state_badge(b, V(r, i, 3));
            if (scheduled)
                sb_puts(b, " <span class=\"state s-scheduled\" title=\"queued, not due yet\">scheduled</span>");
            sb_puts(b, "</td><td class=\"n\">");
            sb_html(b, V(r, i, 4));
            sb_puts(b, "/");
            sb_html(b, V(r, i, 5));
            sb_puts(b, "</td>");
            td_run_at(b, V(r, i, 10), V(r, i, 11), atoll(V(r, i, 12)), scheduled);
            html_td(b, "t", V(r, i, 6));
            html_td(b, "t", V(r, i, 7));
            html_td(b, "err", V(r, i, 8));
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
    html_page_end(b);
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

void serve_page_job(serve *s, pgjobq_client *c, const char *id_s, http_resp *out)
{
    sbuf *b = &out->body;
    long long id = 0;
    char idbuf[24], why[128];

    /* Digits only, 1..2^63-1: a longer number is no job's, and is never clamped to one that is. */
    if (!(id_s[0] >= '0' && id_s[0] <= '9') || cli_parse_int(id_s, 1, INT64_MAX, &id, why, sizeof why) != 0) {
        out->status = 404;
        html_page_begin(s, b, "not found", 0);
        sb_puts(b, "<h1>Not found</h1><p>A job's address is /jobs/ and its id, a whole number from 1 to "
                   "9223372036854775807.</p>");
        html_page_end(b);
        return;
    }
    snprintf(idbuf, sizeof idbuf, "%lld", id);
    const char *values[2] = {idbuf, s->hide_payloads ? "1" : "0"};
    html_page_begin(s, b, idbuf, 0);
    PGresult *r = serve_query(c, out,
                        "SELECT a.id, a.queue, a.kind, a.state::text, a.priority, a.attempt, a.max_attempts,"
                        " " TS("a.run_at") ", " TS("a.created_at") ", " TS("a.started_at") ", " TS("a.finished_at") ","
                        " " TS("a.lease_until") ", coalesce(a.worker_id, ''),"
                        " coalesce(a.unique_key, ''), a.cancel_requested::text,"
                        " CASE WHEN $2 = '1' THEN NULL ELSE jsonb_pretty(a.payload) END,"
                        " CASE WHEN $2 = '1' THEN NULL ELSE jsonb_pretty(a.result) END, a.last_error,"
                        " coalesce(array_to_string(a.tags, ', '), ''),"
                        " CASE WHEN $2 = '1' THEN NULL ELSE jsonb_pretty(a.progress) END,"
                        " " TS("a.expires_at") ", coalesce(a.base_priority::text, ''), coalesce(a.traceparent, '')"
                        " FROM pgjobq.monitor_job($1::bigint) a",
                        2, values);
    if (r && PQntuples(r) == 0) {
        out->status = 404;
        sb_printf(b, "<h1>Job %lld</h1><p>No such job (it may have been pruned).</p>", id);
    } else if (r) {
        const char *state = V(r, 0, 3);
        sb_printf(b, "<h1>Job %lld ", id);
        html_state_badge(b, state);
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
        if (*V(r, 0, 20)) /* docs/queues.md, "Expiry": no attempt starts after it */
            field(b, "expires (UTC)", V(r, 0, 20));
        if (*V(r, 0, 21)) /* docs/queues.md, "Priority aging": the priority it was enqueued with */
            field(b, "enqueued at priority", V(r, 0, 21));
        if (*V(r, 0, 22)) /* docs/queues.md, "Trace context": the W3C traceparent it was enqueued with */
            field(b, "traceparent", V(r, 0, 22));
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
                html_action_form(s, b, "retry", "Retry now", fields, back, 0);
            else /* its worker may hold it for as long as the queue's max lease, or stall while renewing it */
                html_action_form(s, b, "retry_running", "End lease, run again", fields, back, 1);
            if (strcmp(state, "queued") == 0 || strcmp(state, "running") == 0)
                html_action_form(s, b, "cancel", "Cancel", fields, back, 1);
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
        /* Durable execution (docs/durable.md): its park, and its stored steps (name, attempt, when,
         * size: their results are the handler's, not shown). */
        PGresult *dur = serve_query(c, out,
                              "SELECT 'park', parked || ' in ' || step || coalesce(' for the event ' || event_name ||"
                              " ' key ' || quote_literal(event_key), ''), " TS("until") ", " TS("since")
                              " FROM pgjobq.job_park_of($1::bigint) UNION ALL"
                              " SELECT 'step', name, attempt::text, " TS("stored_at") " || ', ' || result_bytes ||"
                              " ' bytes' FROM pgjobq.steps($1::bigint)",
                              1, values);
        if (dur && PQntuples(dur) > 0) {
            int steps = 0;
            for (int i = 0; i < PQntuples(dur); i++) {
                if (strcmp(V(dur, i, 0), "park") == 0) {
                    sb_puts(b, "<h2>Parked</h2><p id=\"parked\">");
                    sb_html(b, V(dur, i, 1));
                    sb_puts(b, ", until ");
                    sb_html(b, V(dur, i, 2));
                    sb_puts(b, " UTC (since ");
                    sb_html(b, V(dur, i, 3));
                    sb_puts(b, ")</p>");
                    continue;
                }
                if (steps++ == 0)
                    sb_puts(b, "<h2>Steps</h2><table id=\"steps\"><thead><tr><th>Step</th><th>Attempt</th>"
                               "<th>Stored (UTC), result</th></tr></thead><tbody>");
                sb_puts(b, "<tr>");
                html_td(b, NULL, V(dur, i, 1));
                html_td(b, NULL, V(dur, i, 2));
                html_td(b, NULL, V(dur, i, 3));
                sb_puts(b, "</tr>");
            }
            if (steps)
                sb_puts(b, "</tbody></table>");
        }
        PQclear(dur);
        /* Its place in a workflow: parents and children, linked. */
        PGresult *rel = serve_query(c, out,
                              "SELECT 'parent', p.id::text, p.state FROM pgjobq.parents($1::bigint) p UNION ALL"
                              " SELECT 'child', k.id::text, k.state FROM pgjobq.children($1::bigint) k",
                              1, values);
        if (rel && PQntuples(rel) > 0) {
            sb_puts(b, "<h2>Workflow</h2><table id=\"relatives\"><thead><tr><th></th><th>Job</th><th>State</th>"
                       "</tr></thead><tbody>");
            for (int i = 0; i < PQntuples(rel); i++) {
                sb_puts(b, "<tr>");
                html_td(b, NULL, V(rel, i, 0));
                html_td_link(b, NULL, "/jobs/", V(rel, i, 1), V(rel, i, 1));
                sb_puts(b, "<td>");
                html_state_badge(b, V(rel, i, 2));
                sb_puts(b, "</td></tr>");
            }
            sb_puts(b, "</tbody></table>");
        }
        PQclear(rel);
        /* Its dead letters: the job it is the dead letter of, or the one it left when it failed for good. */
        PGresult *dl = serve_query(c, out,
                                   "SELECT relation, id::text, queue, " TS("at") ", coalesce(" TS("redriven_at") ", '')"
                                   " FROM pgjobq.monitor_dead_letters($1::bigint) ORDER BY relation, id",
                                   1, values);
        if (dl && PQntuples(dl) > 0) {
            sb_puts(b, "<h2>Dead letter</h2><table id=\"dead-letters\"><thead><tr><th></th><th>Job</th>"
                       "<th>Queue</th><th>At (UTC)</th><th>Redriven (UTC)</th></tr></thead><tbody>");
            for (int i = 0; i < PQntuples(dl); i++) {
                int of = strcmp(V(dl, i, 0), "of") == 0;
                html_tr(b, "link", of ? "dead letter of" : "left dead letter");
                html_td(b, NULL, of ? "dead letter of" : "left dead letter");
                html_td_link(b, NULL, "/jobs/", V(dl, i, 1), V(dl, i, 1));
                html_td_link(b, NULL, "/jobs?queue=", V(dl, i, 2), V(dl, i, 2));
                html_td(b, NULL, V(dl, i, 3));
                html_td(b, NULL, V(dl, i, 4)[0] ? V(dl, i, 4) : "-");
                sb_puts(b, "</tr>");
            }
            sb_puts(b, "</tbody></table>");
        }
        PQclear(dl);
        /* The key it blocks in its strict-order queue (docs/queues.md, "Strict order per key"), and the
         * way out: run it again (the retry above) or skip it. */
        PGresult *blk = serve_query(c, out, "SELECT key FROM pgjobq.sequence_blocks WHERE job_id = $1::bigint", 1,
                                    values);
        if (blk && PQntuples(blk) > 0) {
            sb_puts(b, "<h2>Strict order</h2><p id=\"blocks-key\">It failed for good and blocks the key <code>");
            sb_html(b, V(blk, 0, 0));
            sb_puts(b, "</code>: nothing more of that key starts until it is retried or skipped.</p>");
            if (s->allow_actions) {
                const char *fields[] = {"id", idbuf, NULL};
                char back[48];
                snprintf(back, sizeof back, "/jobs/%lld", id);
                sb_puts(b, "<div class=\"actions\">");
                html_action_form(s, b, "skip", "Skip: let the key move on", fields, back, 1);
                sb_puts(b, "</div>");
            }
        }
        PQclear(blk);
    }
    PQclear(r);
    html_page_end(b);
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

void serve_page_queues(serve *s, pgjobq_client *c, http_resp *out)
{
    sbuf *b = &out->body;
    PGresult *r;

    html_page_begin(s, b, "queues", 0);
    sb_puts(b, "<h1>Queues</h1><table id=\"queue-settings\"><thead><tr><th>Queue</th><th>State</th>"
               "<th>Concurrency</th><th>Per key</th><th>Order</th><th>Rate</th><th>Max lease</th>"
               "<th>Priority aging</th><th>Due</th><th>Scheduled</th><th>Running</th><th>Expired</th>"
               "<th>Dead letters to</th><th></th></tr></thead><tbody>");
    r = serve_query(
        c, out,
        "SELECT queue, (paused_at IS NOT NULL)::int, coalesce(pause_reason, ''), coalesce(concurrency::text, ''),"
        " coalesce(key_concurrency::text, ''), coalesce(rate_limit, 0),"
        " coalesce((extract(epoch FROM rate_period) * 1000)::bigint, 0), queued, scheduled, running, expired,"
        " (extract(epoch FROM max_lease) * 1000)::bigint, coalesce(dead_letter, ''),"
        " coalesce((extract(epoch FROM priority_aging) * 1000)::bigint, 0),"
        " CASE WHEN strict_order THEN 'strict' || CASE WHEN blocked_keys > 0 THEN ', ' || blocked_keys || ' blocked'"
        " ELSE '' END ELSE '-' END FROM pgjobq.queue_list()",
        0, NULL);
    if (r) {
        for (int i = 0; i < PQntuples(r); i++) {
            int paused = atoi(V(r, i, 1));
            char rate[48], max_lease[24], aging[24] = "-";
            html_tr(b, "queue", V(r, i, 0));
            html_td_link(b, NULL, "/jobs?queue=", V(r, i, 0), V(r, i, 0));
            sb_puts(b, "<td>");
            html_state_badge(b, paused ? "paused" : "active");
            if (paused && V(r, i, 2)[0]) {
                sb_puts(b, " <span class=\"muted\">");
                sb_html(b, V(r, i, 2));
                sb_puts(b, "</span>");
            }
            sb_puts(b, "</td>");
            html_td(b, "n", V(r, i, 3)[0] ? V(r, i, 3) : "-");
            html_td(b, "n", V(r, i, 4)[0] ? V(r, i, 4) : "-");
            html_td(b, "order", V(r, i, 14));
            html_td(b, "n rate", rate_text(rate, sizeof rate, V(r, i, 5), V(r, i, 6)));
            html_td(b, "n max-lease", format_period(max_lease, sizeof max_lease, atoll(V(r, i, 11))));
            if (atoll(V(r, i, 13)) > 0)
                format_period(aging, sizeof aging, atoll(V(r, i, 13)));
            html_td(b, "n priority-aging", aging);
            for (int k = 7; k < 11; k++)
                html_td(b, "n", V(r, i, k));
            if (V(r, i, 12)[0])
                html_td_link(b, "dead-letter", "/jobs?queue=", V(r, i, 12), V(r, i, 12));
            else
                html_td(b, "dead-letter", "-");
            sb_puts(b, "<td>");
            const char *fields[] = {"queue", V(r, i, 0), NULL};
            html_action_form(s, b, paused ? "resume" : "pause", paused ? "Resume" : "Pause", fields, "/queues", !paused);
            sb_puts(b, "</td></tr>");
        }
        if (PQntuples(r) == 0)
            sb_puts(b, "<tr><td colspan=\"13\" class=\"muted\">No queues yet.</td></tr>");
        PQclear(r);
    }
    sb_puts(b, "</tbody></table><h2>Schedules</h2><table id=\"schedules\"><thead><tr><th>Name</th><th>Cron</th>"
               "<th>Time zone</th><th>Queue</th><th>Kind</th><th>Enabled</th><th>Next run (UTC)</th>"
               "<th>Last run (UTC)</th><th></th></tr></thead><tbody>");
    r = serve_query(c, out,
              "SELECT name::text, cron, tz, queue::text, kind::text, enabled::int, " TS("next_run") ", " TS(
                  "last_run") " FROM pgjobq.schedule_list()",
              0, NULL);
    if (r) {
        for (int i = 0; i < PQntuples(r); i++) {
            int enabled = atoi(V(r, i, 5));
            sb_puts(b, "<tr>");
            for (int k = 0; k < 8; k++)
                html_td(b, NULL, k == 5 ? (enabled ? "yes" : "no") : V(r, i, k));
            sb_puts(b, "<td>");
            const char *fields[] = {"name", V(r, i, 0), NULL};
            html_action_form(s, b, enabled ? "disable" : "enable", enabled ? "Disable" : "Enable", fields, "/queues", 0);
            sb_puts(b, "</td></tr>");
        }
        if (PQntuples(r) == 0)
            sb_puts(b, "<tr><td colspan=\"9\" class=\"muted\">No schedules.</td></tr>");
        PQclear(r);
    }
    sb_puts(b, "</tbody></table>");
    html_page_end(b);
}

void serve_page_workers(serve *s, pgjobq_client *c, const http_req *req, http_resp *out)
{
    sbuf *b = &out->body;
    const char *after = serve_param(req, "after"), *after_state = serve_param(req, "after_state");
    char limit[16];

    if (after == NULL || after_state == NULL)
        after = after_state = NULL; /* a cursor is both, or the first page */
    snprintf(limit, sizeof limit, "%d", WORKER_ROWS + 1);
    html_page_begin(s, b, "workers", after ? 0 : 10);
    unhealthy_workers(b, c, out, 1);
    sb_puts(b, "<h1>Workers</h1><table id=\"workers\"><thead><tr><th>Worker</th><th>State</th><th>Host</th>"
               "<th>Pid</th><th>Queues (concurrency)</th><th>Jobs held</th><th>Started (UTC)</th>"
               "<th>Last seen</th><th>Version</th></tr></thead><tbody>");
    const char *values[3] = {after_state, after, limit};
    PGresult *r = serve_query(
        c, out,
        "SELECT w.id, w.state, w.host, w.pid, w.queues, w.jobs, " TS(
            "w.started_at") ","
                            " round(extract(epoch FROM now() - coalesce(w.stopped_at, w.last_seen)))::bigint,"
                            " w.version FROM pgjobq.monitor_workers($1, $2, $3::int) w",
        3, values);
    if (r) {
        int n = PQntuples(r);
        for (int i = 0; i < n && i < WORKER_ROWS; i++) {
            const char *state = V(r, i, 1);
            html_tr(b, "worker", V(r, i, 0));
            html_td(b, NULL, V(r, i, 0));
            sb_puts(b, "<td>");
            html_state_badge(b, state);
            sb_puts(b, "</td>");
            html_td(b, NULL, V(r, i, 2));
            html_td(b, "n", V(r, i, 3));
            html_td(b, NULL, V(r, i, 4));
            html_td_link(b, "n", "/jobs?state=running&amp;worker=", V(r, i, 0), V(r, i, 5));
            html_td(b, NULL, V(r, i, 6));
            sb_puts(b, "<td>");
            if (strcmp(state, "stopped") == 0)
                sb_puts(b, "stopped ");
            sb_html(b, V(r, i, 7));
            sb_puts(b, " s ago</td>");
            html_td(b, NULL, V(r, i, 8));
            sb_puts(b, "</tr>");
        }
        if (n == 0)
            sb_puts(b, "<tr><td colspan=\"9\" class=\"muted\">No worker seen in the last hour.</td></tr>");
        sb_puts(b, "</tbody></table>");
        if (n > WORKER_ROWS) {
            /* Keyset pagination, as /jobs: the next page starts after the last worker shown. */
            sb_puts(b, "<p><a id=\"next\" href=\"/workers?after_state=");
            sb_url(b, V(r, WORKER_ROWS - 1, 1));
            sb_puts(b, "&amp;after=");
            sb_url(b, V(r, WORKER_ROWS - 1, 0));
            sb_puts(b, "\">More workers &rarr;</a></p>");
        }
        PQclear(r);
    } else {
        sb_puts(b, "</tbody></table>");
    }
    sb_puts(b, "<p class=\"muted\">A worker records itself every 5 seconds; one not seen for 15 seconds is shown "
               "as gone, one that stopped cleanly as stopped (for an hour).</p>");
    html_page_end(b);
}
