/*
 * msg.c - messages for a person: every one goes out with the database's password redacted and its
 * control characters escaped.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

/* Every message for a person goes through here: the database's password, and anything shaped like
 * one, redacted (libpq's errors quote the URL they could not parse, and arguments are echoed), and
 * control characters escaped (a database error can quote a job's data).  libpq's messages can span
 * lines: newlines and tabs are kept. */
void cli_vsay(const char *prefix, const char *fmt, va_list ap, const char *suffix)
{
    char *msg = NULL, *safe = NULL;

    if (vasprintf(&msg, fmt, ap) >= 0)
        safe = cli_redact(msg);
    fputs(prefix, stderr);
    tty_put(stderr, safe ? safe : "(message lost: out of memory)", 1);
    fputs(suffix, stderr);
    free(msg);
    free(safe);
}

void cli_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cli_vsay("pgjobq: ", fmt, ap, "\n");
    va_end(ap);
}

char *cli_redact(const char *msg)
{
    const char *url = cli_database_url();
    size_t n = pgjobq_conninfo_redact(NULL, 0, msg, url);
    char *safe = malloc(n + 1);

    if (safe)
        pgjobq_conninfo_redact(safe, n + 1, msg, url);
    return safe;
}
