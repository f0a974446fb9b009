/*
 * progress.c - progress bars and status lines on stderr: redrawn in place when stderr is a terminal,
 * plain periodic lines otherwise (or nothing, with quiet).
 */
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"


void progress_init(progress *p, const char *label, int64_t total, int quiet)
{
    memset(p, 0, sizeof *p);
    p->label = label;
    p->total = total;
    p->quiet = quiet;
    p->tty = isatty(2);
    p->started_ms = cli_mono_ms();
}

static void draw(progress *p, int64_t done, const char *extra, int final)
{
    double secs = (double)(cli_mono_ms() - p->started_ms) / 1000.0;
    double rate = secs > 0 ? (double)done / secs : 0;

    if (p->tty) {
        char bar[41];
        int filled = p->total > 0 ? (int)(40 * done / (p->total ? p->total : 1)) : 0;
        if (filled > 40)
            filled = 40;
        memset(bar, '#', (size_t)filled);
        memset(bar + filled, '.', (size_t)(40 - filled));
        bar[40] = '\0';
        fprintf(stderr, "\r\033[K%-8s [%s] %lld/%lld  %.0f/s%s%s", p->label, bar, (long long)done,
                (long long)p->total, rate, extra && extra[0] ? "  " : "", extra ? extra : "");
        if (final)
            fputc('\n', stderr);
    } else {
        fprintf(stderr, "%s: %lld/%lld (%.0f/s)%s%s\n", p->label, (long long)done, (long long)p->total, rate,
                extra && extra[0] ? ", " : "", extra ? extra : "");
    }
    fflush(stderr);
}

void progress_update(progress *p, int64_t done, const char *extra)
{
    int64_t now = cli_mono_ms();
    /* A terminal is redrawn five times a second; a log gets a line every five seconds. */
    int64_t every = p->tty ? 200 : 5000;
    if (p->quiet || now - p->last_ms < every)
        return;
    p->last_ms = now;
    draw(p, done, extra, 0);
}

void progress_done(progress *p, int64_t done, const char *extra)
{
    if (p->quiet)
        return;
    draw(p, done, extra, 1);
}
