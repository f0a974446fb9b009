/*
 * serve_log.h - the log of `pgjobq serve` (serve_log.c): what its pages, actions and metrics collector
 * (serve_pool.c, serve_actions.c, cmd_serve.c, serve_metrics.c) write on stderr, a line at a time.
 */
#ifndef PGJOBQ_CLI_SERVE_LOG_H
#define PGJOBQ_CLI_SERVE_LOG_H

/* Prints "pgjobq serve: message" on stderr (thread-safe, one line at a time). */
void serve_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* PGJOBQ_CLI_SERVE_LOG_H */
