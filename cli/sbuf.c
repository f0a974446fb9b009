/*
 * sbuf.c - the command's growable text buffer and its escapes (sbuf.h).
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sbuf.h"

void sb_init(sbuf *b)
{
    memset(b, 0, sizeof *b);
}

void sb_free(sbuf *b)
{
    free(b->data);
    sb_init(b);
}

void sb_putn(sbuf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (p == NULL) {
            b->failed = 1;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void sb_puts(sbuf *b, const char *s)
{
    if (s)
        sb_putn(b, s, strlen(s));
}

void sb_int(sbuf *b, int64_t v)
{
    char digits[24];
    size_t i = sizeof digits;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        digits[--i] = (char)('0' + u % 10);
        u /= 10;
    } while (u > 0);
    if (v < 0)
        digits[--i] = '-';
    sb_putn(b, digits + i, sizeof digits - i);
}

void sb_printf(sbuf *b, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return;
    }
    if ((size_t)n < sizeof small) {
        sb_putn(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (big == NULL) {
        b->failed = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_putn(b, big, (size_t)n);
    free(big);
}

void sb_html(sbuf *b, const char *s)
{
    if (s == NULL)
        return;
    for (const char *p = s; *p; p++) {
        const char *rep = NULL;
        switch (*p) {
        case '&': rep = "&amp;"; break;
        case '<': rep = "&lt;"; break;
        case '>': rep = "&gt;"; break;
        case '"': rep = "&quot;"; break;
        case '\'': rep = "&#39;"; break;
        default: break;
        }
        if (rep)
            sb_puts(b, rep);
        else
            sb_putn(b, p, 1);
    }
}

void sb_json(sbuf *b, const char *s)
{
    const unsigned char *p = (const unsigned char *)s, *run;

    if (s == NULL) {
        sb_puts(b, "null");
        return;
    }
    sb_putn(b, "\"", 1);
    for (run = p; *p; p++) {
        unsigned c = *p;
        int c1 = c == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f;
        if (c >= 0x20 && c != '"' && c != '\\' && c != 0x7f && !c1)
            continue; /* part of the run written as is */
        sb_putn(b, (const char *)run, (size_t)(p - run));
        switch (c) {
        case '"': sb_puts(b, "\\\""); break;
        case '\\': sb_puts(b, "\\\\"); break;
        case '\n': sb_puts(b, "\\n"); break;
        case '\r': sb_puts(b, "\\r"); break;
        case '\t': sb_puts(b, "\\t"); break;
        default:
            if (c1)
                c = *++p;
            sb_printf(b, "\\u%04x", c);
        }
        run = p + 1;
    }
    sb_putn(b, (const char *)run, (size_t)(p - run));
    sb_putn(b, "\"", 1);
}

void sb_url(sbuf *b, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    if (s == NULL)
        return;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (isalnum(*p) || *p == '-' || *p == '_' || *p == '.' || *p == '~') {
            sb_putn(b, (const char *)p, 1);
        } else {
            char e[3] = {'%', hex[*p >> 4], hex[*p & 15]};
            sb_putn(b, e, 3);
        }
    }
}

/* The length of the UTF-8 character at p (1 to 4), or 0 when the bytes there are not one. */
static int utf8_len(const unsigned char *p)
{
    unsigned char c = *p;
    int len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (len == 0 || (len == 2 && c < 0xc2) || (len == 4 && c > 0xf4))
        return 0;
    for (int k = 1; k < len; k++)
        if ((p[k] & 0xc0) != 0x80)
            return 0;
    return len;
}

void sb_label(sbuf *b, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    if (s == NULL)
        return;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned char c = *p;
        int len = utf8_len(p), ok = len > 0;
        if (c == '\\' || c == '"' || c == '\n') {
            sb_puts(b, c == '\\' ? "\\\\" : c == '"' ? "\\\"" : "\\n");
            p++;
        } else if (!ok || c < 0x20 || c == 0x7f) {
            /* The format has no escape for them: the label reads \xNN (its backslash escaped). */
            char e[6] = {'\\', '\\', 'x', hex[c >> 4], hex[c & 15], '\0'};
            sb_puts(b, e);
            p++;
        } else if (c == 0xc2 && p[1] < 0xa0) { /* U+0080..U+009F: C1 controls (0x9b is a CSI) */
            sb_printf(b, "\\\\u00%02x", p[1]);
            p += 2;
        } else {
            sb_putn(b, (const char *)p, (size_t)len);
            p += len;
        }
    }
}

void sb_escape_line(sbuf *b, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    if (s == NULL)
        return;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned char c = *p;
        int len = utf8_len(p), ok = len > 0;
        if (!ok) { /* not UTF-8: the byte, escaped */
            char e[4] = {'\\', 'x', hex[c >> 4], hex[c & 15]};
            sb_putn(b, e, 4);
            p++;
        } else if (c == '\\') {
            sb_puts(b, "\\\\");
            p++;
        } else if (c == '\n' || c == '\r' || c == '\t') {
            sb_puts(b, c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t");
            p++;
        } else if (c < 0x20 || c == 0x7f) {
            char e[4] = {'\\', 'x', hex[c >> 4], hex[c & 15]};
            sb_putn(b, e, 4);
            p++;
        } else if (c == 0xc2 && p[1] < 0xa0) { /* U+0080..U+009F: C1 controls (0x9b is a CSI) */
            sb_printf(b, "\\u00%02x", p[1]);
            p += 2;
        } else {
            sb_putn(b, (const char *)p, (size_t)len);
            p += len;
        }
    }
}

