/*
 * json.c - the command's one JSON reader: a member of an object, a string's text, an integer.  It
 * reads documents already known to be valid (pgjobq_json_check, or jsonb's output), so it looks for
 * what it needs without judging the rest.  (The one JSON string writer is sb_json, in http.c.)
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sbuf.h"

/* Past the string whose opening quote p is at, or NULL when it does not end. */
static const char *skip_string(const char *p)
{
    for (p++; *p && *p != '"'; p += *p == '\\' && p[1] ? 2 : 1) {
    }
    return *p == '"' ? p + 1 : NULL;
}

static int blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* Past the value that starts at p: a string, an object or array with all it holds, or a scalar up to
 * the next ',', '}', ']' or blank.  NULL when the text ends inside it. */
static const char *skip_value(const char *p)
{
    int depth = 0;

    while (*p) {
        if (*p == '"') {
            if ((p = skip_string(p)) == NULL)
                return NULL;
            if (depth == 0)
                return p;
            continue;
        }
        if (*p == '{' || *p == '[') {
            depth++;
        } else if (*p == '}' || *p == ']') {
            if (depth == 0)
                return p;
            if (--depth == 0)
                return p + 1;
        } else if (depth == 0 && (*p == ',' || blank(*p))) {
            return p;
        }
        p++;
    }
    return depth == 0 ? p : NULL;
}

const char *json_member(const char *obj, const char *key, size_t *len)
{
    const char *p = obj;
    size_t klen = strlen(key);

    while (blank(*p))
        p++;
    if (*p++ != '{')
        return NULL;
    for (;;) {
        while (blank(*p) || *p == ',')
            p++;
        if (*p != '"')
            return NULL;
        const char *k = p + 1;
        if ((p = skip_string(p)) == NULL)
            return NULL;
        int match = (size_t)(p - 1 - k) == klen && memcmp(k, key, klen) == 0;
        while (blank(*p) || *p == ':')
            p++;
        const char *v = p;
        if ((p = skip_value(p)) == NULL)
            return NULL;
        if (match) {
            *len = (size_t)(p - v);
            return v;
        }
        while (blank(*p))
            p++;
        if (*p == '}' || *p == '\0')
            return NULL;
    }
}

/* Appends the code point as UTF-8. */
static void put_utf8(sbuf *b, unsigned cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    sb_putn(b, u, n);
}

/* The four hex digits at s as a number. */
static unsigned hex4(const char *s)
{
    return (unsigned)strtoul((char[5]){s[0], s[1], s[2], s[3], 0}, NULL, 16);
}

char *json_unquote(const char *v, size_t len)
{
    sbuf b;
    if (len < 2 || v[0] != '"')
        return NULL;
    sb_init(&b);
    sb_putn(&b, "", 0);
    for (size_t i = 1; i + 1 < len; i++) {
        if (v[i] != '\\') {
            sb_putn(&b, v + i, 1);
            continue;
        }
        char e = v[++i];
        switch (e) {
        case 'n': sb_putn(&b, "\n", 1); break;
        case 't': sb_putn(&b, "\t", 1); break;
        case 'r': sb_putn(&b, "\r", 1); break;
        case 'b': sb_putn(&b, "\b", 1); break;
        case 'f': sb_putn(&b, "\f", 1); break;
        case 'u': {
            if (i + 4 >= len)
                break; /* not valid JSON: the text stops here */
            unsigned cp = hex4(v + i + 1);
            i += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && i + 6 < len && v[i + 1] == '\\' && v[i + 2] == 'u') {
                unsigned lo = hex4(v + i + 3);
                if (lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                }
            }
            put_utf8(&b, cp == 0 ? ' ' : cp); /* a NUL would end the text: a blank instead */
            break;
        }
        default: sb_putn(&b, &e, 1); break; /* \" \\ \/ */
        }
    }
    if (b.failed) {
        sb_free(&b);
        return NULL;
    }
    return b.data;
}

int64_t json_integer(const char *v, size_t len, int *ok)
{
    char buf[32], *end;
    *ok = 0;
    if (v == NULL || len == 0 || len >= sizeof buf)
        return 0;
    memcpy(buf, v, len);
    buf[len] = '\0';
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    /* Out of range is not a number of ours: never clamped to INT64_MAX (another job's id). */
    *ok = end != buf && *end == '\0' && errno != ERANGE;
    return *ok ? x : 0;
}
