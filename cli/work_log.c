/*
 * work_log.c - the log of `pgjobq work`: the library's records and the coprocesses' lines, one line
 * each on stderr, as text or JSON.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "work.h"

void work_log(void *arg, pgjobq_log_level level, const char *msg)
{
    const work_log_cfg *cfg = arg;
    char ts[96], *safe;
    struct timespec now;
    struct tm tm;

    if ((int)level < cfg->level)
        return;
    /* The library redacts what it logs; this covers the lines of the coprocesses too. */
    if ((safe = cli_redact(msg)) == NULL)
        return;
    msg = safe;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, now.tv_nsec / 1000000);
    flockfile(stderr);
    if (cfg->json) {
        fprintf(stderr, "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":", ts, pgjobq_log_level_name(level));
        json_str(stderr, msg);
        fputs("}\n", stderr);
    } else {
        /* One line per record, whatever a handler or the database put in it. */
        fprintf(stderr, "%s %-5s ", ts, pgjobq_log_level_name(level));
        tty_put(stderr, msg, 0);
        fputc('\n', stderr);
    }
    funlockfile(stderr);
    free(safe);
}
