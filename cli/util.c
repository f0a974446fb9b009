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
#include "sbuf.h"

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
    sbuf b;
    sb_init(&b);
    sb_json(&b, s);
    if (b.failed)
        fputs("null", f); /* out of memory: a valid document all the same */
    else
        fwrite(b.data, 1, b.len, f);
    sb_free(&b);
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

/* The shortest exact spelling in the units --rate and the other duration options take: 60000 is
 * "1m", 90000 is "90s", 1500 is "1500ms". */
const char *format_period(char *buf, size_t size, int64_t ms)
{
    static const struct {
        const char *unit;
        int64_t ms;
    } units[] = {{"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}};

    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (ms != 0 && ms % units[i].ms == 0) {
            snprintf(buf, size, "%lld%s", (long long)(ms / units[i].ms), units[i].unit);
            return buf;
        }
    }
    snprintf(buf, size, "%lldms", (long long)ms);
    return buf;
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

/* ------------------------------------------------------------------------------------------------ */
/* Text for a terminal                                                                               */

/* Whether a code point is shown as an escape: C1 controls (a terminal may take U+009B for CSI), and
 * the line separators and bidirectional overrides that make text look other than it is. */
static int hidden(uint32_t cp)
{
    return (cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 || (cp >= 0x202a && cp <= 0x202e) ||
           (cp >= 0x2066 && cp <= 0x2069);
}

/* One character of s as it is shown: writes it (NUL-terminated) into out and returns how many bytes
 * of s it covers.  Control characters (C0, DEL, C1), bytes that are not UTF-8 and the code points of
 * hidden() become \e \a \b \t \n \v \f \r, \xNN or \uNNNN; with keep_lines, newlines and tabs stay. */
static size_t shown(const unsigned char *s, char out[8], int keep_lines)
{
    static const char names[] = "\a\b\t\n\v\f\r\033";
    static const char letters[] = "abtnvfre";
    unsigned char b = s[0];
    uint32_t cp;
    size_t n;

    if (b < 0x20 || b == 0x7f) {
        const char *k = b ? strchr(names, b) : NULL;
        if (keep_lines && (b == '\n' || b == '\t'))
            snprintf(out, 8, "%c", b);
        else if (k)
            snprintf(out, 8, "\\%c", letters[k - names]);
        else
            snprintf(out, 8, "\\x%02x", b);
        return 1;
    }
    if (b < 0x80) {
        out[0] = (char)b;
        out[1] = '\0';
        return 1;
    }
    /* UTF-8: the sequence's length and first bits, then its continuation bytes; overlong forms,
     * surrogates and code points past U+10FFFF are not UTF-8. */
    if (b >= 0xc2 && b <= 0xdf)
        n = 2, cp = b & 0x1f;
    else if (b >= 0xe0 && b <= 0xef)
        n = 3, cp = b & 0x0f;
    else if (b >= 0xf0 && b <= 0xf4)
        n = 4, cp = b & 0x07;
    else
        n = 0, cp = 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            n = 0;
            break;
        }
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (n == 0 || (n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) {
        snprintf(out, 8, "\\x%02x", b);
        return 1;
    }
    if (hidden(cp)) {
        snprintf(out, 8, "\\u%04x", (unsigned)cp);
        return n;
    }
    memcpy(out, s, n);
    out[n] = '\0';
    return n;
}

void tty_put(FILE *f, const char *s, int keep_lines)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    char out[8];

    while (*p) {
        size_t n = 1;
        const unsigned char *q = p;
        /* Runs of plain printable ASCII go out as they are. */
        while (*q >= 0x20 && *q < 0x7f)
            q++;
        if (q > p) {
            fwrite(p, 1, (size_t)(q - p), f);
            p = q;
            continue;
        }
        n = shown(p, out, keep_lines);
        fputs(out, f);
        p += n;
    }
}

const char *tty_cell(char *buf, size_t size, const char *s, size_t width)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t len = 0, chars = 0;
    char out[8];

    while (*p && chars < width) {
        size_t n = shown(p, out, 0), k = strlen(out);
        /* An escape counts as wide as it is printed; a character of several bytes as one. */
        size_t w = out[0] == '\\' ? k : 1;
        if (len + k >= size || chars + w > width)
            break;
        memcpy(buf + len, out, k);
        len += k;
        chars += w;
        p += n;
    }
    if (size)
        buf[len < size ? len : size - 1] = '\0';
    return buf;
}

double cli_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int64_t cli_mono_ms(void)
{
    return (int64_t)(cli_mono_s() * 1000);
}
