/*
 * serve_html.c - the HTML of the dashboard's pages: the stylesheet, the frame of every page, and the
 * cells, rows, badges and action buttons the pages are made of.  Every value is HTML-escaped; no page
 * runs a script (the Content-Security-Policy forbids it as a second line).
 */
#include <string.h>

#include "serve_dashboard.h"

const char serve_css[] =
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

void html_page_begin(serve *s, sbuf *b, const char *title, int refresh_s)
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
    if (s->cluster) {
        /* The shard selector: this page on each shard (?shard=NAME), or the overview of them all. */
        sb_puts(b, "<nav id=\"shards\" class=\"card\">Shard: <a href=\"/\"");
        sb_puts(b, serve_page_shard ? ">all</a>" : " class=\"current\">all</a>");
        for (size_t i = 0; i < pgjobq_cluster_shards(s->cluster); i++) {
            const char *name = pgjobq_cluster_shard_name(s->cluster, i);
            int current = serve_page_shard && strcmp(serve_page_shard, name) == 0;
            sb_puts(b, " <a href=\"?shard=");
            sb_url(b, name);
            sb_printf(b, "\"%s data-shard=\"", current ? " class=\"current\"" : "");
            sb_html(b, name);
            sb_puts(b, "\">");
            sb_html(b, name);
            sb_puts(b, "</a>");
        }
        sb_puts(b, "</nav>");
    }
}

_Thread_local const char *serve_page_shard;

void html_page_end(sbuf *b)
{
    sb_puts(b, "</main></body></html>\n");
}

void html_state_badge(sbuf *b, const char *state)
{
    sb_puts(b, "<span class=\"state s-");
    sb_html(b, state);
    sb_puts(b, "\">");
    sb_html(b, state);
    sb_puts(b, "</span>");
}

/* A table cell holding text (escaped); cls may be NULL. */
void html_td(sbuf *b, const char *cls, const char *text)
{
    if (cls)
        sb_printf(b, "<td class=\"%s\">", cls);
    else
        sb_puts(b, "<td>");
    sb_html(b, text);
    sb_puts(b, "</td>");
}

/* A table cell holding a link to prefix + value (URL-encoded), showing text. */
void html_td_link(sbuf *b, const char *cls, const char *prefix, const char *value, const char *text)
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
void html_tr(sbuf *b, const char *name, const char *value)
{
    sb_printf(b, "<tr data-%s=\"", name);
    sb_html(b, value);
    sb_puts(b, "\">");
}

/* An action button: a POST form with the CSRF token, the operation, its fields and where to go back. */
void html_action_form(serve *s, sbuf *b, const char *op, const char *label, const char *const *fields,
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
