/*
 * util.c - parsing option values and printing JSON and times.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

/* 100 years: long enough for any schedule, short enough that now() + it cannot overflow. */
#define DURATION_MAX_MS 3155760000000.0

int cli_parse_duration_ms(const char *s, int64_t *ms, char *why, size_t why_size)
{
    static const struct {
        const char *unit;
        double ms;
    } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"d", 86400000}, {"", 1000}};
    char num[64];
    size_t n;
    double v;

    if (s == NULL || s[0] == '\0') {
        snprintf(why, why_size, "empty duration");
        return -1;
    }
    if (s[0] == '-') {
        snprintf(why, why_size, "duration '%.40s' is negative", s);
        return -1;
    }
    /* Decimal digits with at most one '.', then a unit: no signs, exponents, hex, inf or nan. */
    n = strspn(s, "0123456789.");
    if (n == 0 || n >= sizeof num || strchr(s, '.') != strrchr(s, '.') || (n == 1 && s[0] == '.')) {
        snprintf(why, why_size, "'%.40s' is not a duration (use e.g. 30s, 500ms, 5m, 2h, 1d)", s);
        return -1;
    }
    memcpy(num, s, n);
    num[n] = '\0';
    v = strtod(num, NULL);
    const char *end = s + n;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].unit) == 0) {
            double total = v * units[i].ms;
            if (total > DURATION_MAX_MS) {
                snprintf(why, why_size, "duration '%.40s' is longer than 100 years", s);
                return -1;
            }
            *ms = (int64_t)llround(total);
            return 0;
        }
    }
    snprintf(why, why_size, "unknown unit in '%.40s' (use ms, s, m, h or d)", s);
    return -1;
}

int cli_parse_int(const char *s, long long min, long long max, long long *out, char *why, size_t why_size)
{
    char *end;
    long long v;

    if (s == NULL || s[0] == '\0' || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9'))) {
        snprintf(why, why_size, "'%.40s' is not a whole number", s ? s : "");
        return -1;
    }
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno == ERANGE || *end != '\0' || end == s) {
        snprintf(why, why_size, "'%.40s' is not a whole number in range %lld..%lld", s, min, max);
        return -1;
    }
    if (v < min || v > max) {
        snprintf(why, why_size, "%lld is out of range %lld..%lld", v, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

void json_str(FILE *f, const char *s)
{
    if (s == NULL) {
        fputs("null", f);
        return;
    }
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

static void iso_time(char *buf, size_t size, int64_t us, char sep)
{
    time_t secs;
    struct tm tm;
    int64_t frac;

    if (us == PGJOBQ_TIME_NONE) {
        snprintf(buf, size, "-");
        return;
    }
    secs = (time_t)(us / 1000000);
    frac = us % 1000000;
    if (frac < 0) {
        frac += 1000000;
        secs--;
    }
    gmtime_r(&secs, &tm);
    snprintf(buf, size, "%04d-%02d-%02d%c%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, sep,
             tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(frac / 1000));
}

void format_time(char *buf, size_t size, int64_t us)
{
    iso_time(buf, size, us, ' ');
}

void json_time(FILE *f, int64_t us)
{
    char buf[48];
    if (us == PGJOBQ_TIME_NONE) {
        fputs("null", f);
        return;
    }
    iso_time(buf, sizeof buf, us, 'T');
    fprintf(f, "\"%s\"", buf);
}
