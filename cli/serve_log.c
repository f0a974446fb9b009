/*
 * serve_log.c - the log of `pgjobq serve`, shared by the dashboard (serve_dashboard.h) and the metrics
 * collector (serve_metrics.c), so that neither calls into the other.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "sbuf.h"
#include "serve_log.h"

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

/* Every line escaped as a whole (sb_escape_line): what a client sent (a form field, a queue name in
 * a database error) can neither end the line nor move the terminal's cursor. */
void serve_log(const char *fmt, ...)
{
    char text[2048];
    va_list ap;
    sbuf line;

    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    sb_init(&line);
    sb_escape_line(&line, text);
    pthread_mutex_lock(&log_mu);
    fprintf(stderr, "pgjobq serve: %s\n", line.failed ? "(a line that did not fit in memory)" : line.data);
    fflush(stderr);
    pthread_mutex_unlock(&log_mu);
    sb_free(&line);
}
