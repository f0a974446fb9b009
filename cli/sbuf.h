/*
 * sbuf.h - the command's text: a growable buffer, and the escapes that HTML, JSON, URLs, Prometheus
 * labels and log lines need.  The HTTP server writes its pages into it, the coprocess protocol its
 * lines, the benchmarks and the progress bar their output (sbuf.c).
 */
#ifndef PGJOBQ_CLI_SBUF_H
#define PGJOBQ_CLI_SBUF_H

#include <stddef.h>
#include <stdint.h>

/* A growable, always NUL-terminated text buffer.  On allocation failure it sets `failed` and keeps
 * what it had; callers check once, at the end. */
typedef struct sbuf {
    char *data;
    size_t len, cap;
    int failed;
} sbuf;

void sb_init(sbuf *b);
void sb_free(sbuf *b);
void sb_putn(sbuf *b, const char *s, size_t n);
void sb_puts(sbuf *b, const char *s);
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* v in decimal, as sb_printf's "%lld" would write it, without the cost of a format (a line per job). */
void sb_int(sbuf *b, int64_t v);
/* s as HTML text or attribute value: & < > " ' escaped.  NULL appends nothing. */
void sb_html(sbuf *b, const char *s);
/* s as a JSON string, quotes included (NULL: null): " and \ escaped, \n \r \t, and every other
 * control character (C0, DEL, and C1 as U+0080..U+009F, which a terminal may act on) as \u00XX.
 * The one JSON string writer of the command. */
void sb_json(sbuf *b, const char *s);
/* s percent-encoded for a URL query value (unreserved characters kept). */
void sb_url(sbuf *b, const char *s);
/* s as a Prometheus label value: \ " and newline escaped as the text format says; every other
 * control character (C0, DEL, C1) and every byte that is not UTF-8, which the format cannot escape,
 * written as the text \xNN (\u00NN for C1), its backslash escaped: no control character reaches
 * the exposition, and promtool accepts it. */
void sb_label(sbuf *b, const char *s);
/* Appends s to b with every control character (C0, DEL, C1) and every byte that is not UTF-8
 * written as an escape (\n, \t, \xNN, \u0085), and a backslash doubled: a line of a log
 * stays one line whatever a client sent. */
void sb_escape_line(sbuf *b, const char *s);

#endif /* PGJOBQ_CLI_SBUF_H */
