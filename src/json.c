/*
 * json.c - the library's JSON: a strict checker (what PostgreSQL's jsonb accepts), the writer of the
 * JSON the library builds (strings and keys), and a text sanitiser.
 *
 * The checker lets the library reject a bad payload before it reaches the server, with a message that
 * says where the problem is and, in a batch, which job has it.  The server still parses every payload
 * and stays the authority.  It is iterative (an explicit stack), so hostile nesting cannot overflow
 * the C stack.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define JSON_MAX_DEPTH 1000

typedef struct jp {
    const unsigned char *s;
    size_t n;
    size_t i;
    char *why;
    size_t why_size;
} jp;

static int fail(jp *p, const char *what)
{
    if (p->why && p->why_size)
        snprintf(p->why, p->why_size, "%s at byte %zu", what, p->i);
    return -1;
}

static void skip_ws(jp *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if it is not one (overlong forms, surrogates
 * and code points past U+10FFFF are invalid). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return n >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
            return 0;
        if (c == 0xE0 && s[1] < 0xA0)
            return 0; /* overlong */
        if (c == 0xED && s[1] >= 0xA0)
            return 0; /* UTF-16 surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && s[1] < 0x90)
            return 0; /* overlong */
        if (c == 0xF4 && s[1] >= 0x90)
            return 0; /* past U+10FFFF */
        return 4;
    }
    return 0;
}

int pgjobq__utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;

    while (i < n) {
        size_t k = utf8_seq(u + i, n - i);
        if (k == 0)
            return 0;
        i += k;
    }
    return 1;
}

static int hex4(jp *p, unsigned *out)
{
    unsigned v = 0;

    if (p->n - p->i < 4)
        return fail(p, "truncated \\u escape");
    for (int k = 0; k < 4; k++) {
        unsigned char c = p->s[p->i + (size_t)k];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return fail(p, "bad hex digit in \\u escape");
    }
    p->i += 4;
    *out = v;
    return 0;
}

static int string(jp *p)
{
    p->i++; /* the opening quote */
    for (;;) {
        unsigned char c;

        if (p->i >= p->n)
            return fail(p, "unterminated string");
        c = p->s[p->i];
        if (c == '"') {
            p->i++;
            return 0;
        }
        if (c < 0x20)
            return fail(p, c == 0 ? "NUL byte in string" : "control character in string (escape it)");
        if (c == '\\') {
            unsigned cp;

            if (++p->i >= p->n)
                return fail(p, "unterminated escape");
            c = p->s[p->i++];
            if (strchr("\"\\/bfnrt", c) != NULL && c != 0)
                continue;
            if (c != 'u')
                return fail(p, "invalid escape sequence");
            if (hex4(p, &cp) != 0)
                return -1;
            if (cp == 0)
                return fail(p, "\\u0000 is not allowed (jsonb cannot store it)");
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return fail(p, "lone low surrogate in \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u')
                    return fail(p, "high surrogate not followed by a low surrogate");
                p->i += 2;
                if (hex4(p, &lo) != 0)
                    return -1;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return fail(p, "high surrogate not followed by a low surrogate");
            }
            continue;
        }
        if (c < 0x80) {
            p->i++;
        } else {
            size_t k = utf8_seq(p->s + p->i, p->n - p->i);
            if (k == 0)
                return fail(p, "invalid UTF-8");
            p->i += k;
        }
    }
}

static int digits(jp *p)
{
    size_t start = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
        p->i++;
    return p->i > start ? 0 : fail(p, "digit expected");
}

static int number(jp *p)
{
    if (p->s[p->i] == '-')
        p->i++;
    if (p->i < p->n && p->s[p->i] == '0')
        p->i++;
    else if (digits(p) != 0)
        return -1;
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (digits(p) != 0)
            return -1;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
            p->i++;
        if (digits(p) != 0)
            return -1;
    }
    return 0;
}

static int literal(jp *p, const char *word)
{
    size_t len = strlen(word);
    if (p->n - p->i < len || memcmp(p->s + p->i, word, len) != 0)
        return fail(p, "unexpected character");
    p->i += len;
    return 0;
}

static int json_check_upto(const char *text, size_t len, size_t max_len, char *why, size_t why_size);

int pgjobq__json_check(const char *text, size_t len, char *why, size_t why_size)
{
    return json_check_upto(text, len, PGJOBQ_PAYLOAD_MAX, why, why_size);
}

static int json_check_upto(const char *text, size_t len, size_t max_len, char *why, size_t why_size)
{
    enum { VALUE, KEY, AFTER } state = VALUE;
    char stack[JSON_MAX_DEPTH];
    int depth = 0;
    jp p = {(const unsigned char *)text, len, 0, why, why_size};

    if (why && why_size)
        why[0] = '\0';
    if (text == NULL)
        return fail(&p, "no JSON text");
    if (len > max_len) {
        if (why && why_size)
            snprintf(why, why_size, "%zu bytes, over the %zu-byte limit", len, max_len);
        return -1;
    }
    for (;;) {
        skip_ws(&p);
        if (state == AFTER && depth == 0)
            break;
        if (p.i >= p.n)
            return fail(&p, p.n == 0 ? "empty document" : "unexpected end of document");
        unsigned char c = p.s[p.i];
        switch (state) {
        case VALUE:
            if (c == '{' || c == '[') {
                if (depth == JSON_MAX_DEPTH)
                    return fail(&p, "nested too deeply");
                stack[depth++] = (char)c;
                p.i++;
                skip_ws(&p);
                if (p.i < p.n && p.s[p.i] == (c == '{' ? '}' : ']')) {
                    p.i++;
                    depth--;
                    state = AFTER;
                } else {
                    state = c == '{' ? KEY : VALUE;
                }
            } else if (c == '"') {
                if (string(&p) != 0)
                    return -1;
                state = AFTER;
            } else if (c == '-' || (c >= '0' && c <= '9')) {
                if (number(&p) != 0)
                    return -1;
                state = AFTER;
            } else if (c == 't' || c == 'f' || c == 'n') {
                if (literal(&p, c == 't' ? "true" : c == 'f' ? "false" : "null") != 0)
                    return -1;
                state = AFTER;
            } else {
                return fail(&p, "unexpected character");
            }
            break;
        case KEY:
            if (c != '"')
                return fail(&p, "object key (a string) expected");
            if (string(&p) != 0)
                return -1;
            skip_ws(&p);
            if (p.i >= p.n || p.s[p.i] != ':')
                return fail(&p, "':' expected after object key");
            p.i++;
            state = VALUE;
            break;
        case AFTER:
            if (c == ',') {
                p.i++;
                state = stack[depth - 1] == '{' ? KEY : VALUE;
            } else if (c == (stack[depth - 1] == '{' ? '}' : ']')) {
                p.i++;
                depth--;
            } else {
                return fail(&p, stack[depth - 1] == '{' ? "',' or '}' expected" : "',' or ']' expected");
            }
            break;
        }
    }
    if (p.i != p.n)
        return fail(&p, p.s[p.i] == 0 ? "NUL byte after the document" : "trailing data after the document");
    return 0;
}

int pgjobq_json_check(const char *text, size_t len, char *why, size_t why_size)
{
    return pgjobq__json_check(text, len, why, why_size) == 0 ? PGJOBQ_OK : PGJOBQ_EINVAL;
}

int pgjobq_json_check_limit(const char *text, size_t len, size_t max_len, char *why, size_t why_size)
{
    return json_check_upto(text, len, max_len, why, why_size) == 0 ? PGJOBQ_OK : PGJOBQ_EINVAL;
}

/* Appends the sanitised form of s[0..n) to out (which has room for 3 * n bytes). */
static size_t sanitize_into(char *out, const unsigned char *s, size_t n)
{
    size_t i = 0, o = 0;

    while (i < n) {
        size_t k = s[i] == 0 ? 0 : utf8_seq(s + i, n - i);
        if (k == 0) {
            memcpy(out + o, "\xEF\xBF\xBD", 3); /* U+FFFD REPLACEMENT CHARACTER */
            o += 3;
            i++;
        } else {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        }
    }
    return o;
}

char *pgjobq__sanitize_text(const char *text, size_t n, size_t cap, int keep_tail)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t start = 0, len, o;
    char *out;

    if (text == NULL)
        n = 0;
    /* Only the window that can survive the cut needs work. */
    if (n > cap) {
        if (keep_tail) {
            start = n - cap;
            while (start < n && (s[start] & 0xC0) == 0x80)
                start++; /* do not begin inside a character */
        } else {
            n = cap;
        }
    }
    len = n - start;
    out = malloc(3 * len + 1);
    if (out == NULL)
        return NULL;
    o = sanitize_into(out, s + start, len);
    if (o > cap) {
        /* Replacement characters grew the text: cut again, on a character boundary. */
        if (keep_tail) {
            size_t from = o - cap;
            while (from < o && ((unsigned char)out[from] & 0xC0) == 0x80)
                from++;
            memmove(out, out + from, o - from);
            o -= from;
        } else {
            size_t to = cap;
            while (to > 0 && ((unsigned char)out[to] & 0xC0) == 0x80)
                to--;
            o = to;
        }
    }
    out[o] = '\0';
    return out;
}

/* ------------------------------------------------------------------------------------------------ */
/* Writing                                                                                           */

void pgjobq__json_string(pgjobq__buf *b, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    pgjobq__buf_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            pgjobq__buf_put(b, esc, 2);
        } else if (*p < 0x20) {
            char esc[6] = {'\\', 'u', '0', '0', hex[*p >> 4], hex[*p & 15]};
            pgjobq__buf_put(b, esc, 6);
        } else {
            pgjobq__buf_put(b, p, 1);
        }
    }
    pgjobq__buf_put(b, "\"", 1);
}

void pgjobq__json_key(pgjobq__buf *b, const char *key)
{
    pgjobq__buf_put(b, ",", 1);
    pgjobq__json_string(b, key);
    pgjobq__buf_put(b, ":", 1);
}

/* Skips the value at p->i (checked as the checker would), at most depth levels deep. */
static int skip_value(jp *p, int depth)
{
    skip_ws(p);
    if (p->i >= p->n)
        return fail(p, "value expected");
    unsigned char c = p->s[p->i];
    if (c == '"')
        return string(p);
    if (c == '-' || (c >= '0' && c <= '9'))
        return number(p);
    if (c == 't' || c == 'f' || c == 'n')
        return literal(p, c == 't' ? "true" : c == 'f' ? "false" : "null");
    if (c != '{' && c != '[')
        return fail(p, "unexpected character");
    if (depth == 0)
        return fail(p, "nested too deeply");
    unsigned char close = c == '{' ? '}' : ']';
    p->i++;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        return 0;
    }
    for (;;) {
        if (c == '{') {
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"' || string(p) != 0)
                return fail(p, "object key (a string) expected");
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':')
                return fail(p, "':' expected after object key");
            p->i++;
        }
        if (skip_value(p, depth - 1) != 0)
            return -1;
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            return 0;
        }
        return fail(p, "',' or the end of the container expected");
    }
}

/* Appends code point cp as UTF-8. */
static void put_utf8(pgjobq__buf *b, unsigned cp)
{
    char u[4];
    size_t k;
    if (cp < 0x80) {
        u[0] = (char)cp;
        k = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | cp >> 6);
        u[1] = (char)(0x80 | (cp & 0x3F));
        k = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | cp >> 12);
        u[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        k = 3;
    } else {
        u[0] = (char)(0xF0 | cp >> 18);
        u[1] = (char)(0x80 | (cp >> 12 & 0x3F));
        u[2] = (char)(0x80 | (cp >> 6 & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        k = 4;
    }
    pgjobq__buf_put(b, u, k);
}

int pgjobq__json_get_string(const char *text, size_t len, const char *key, char **out)
{
    jp p = {(const unsigned char *)text, len, 0, NULL, 0};
    size_t klen = strlen(key);

    *out = NULL;
    skip_ws(&p);
    if (p.i >= p.n || p.s[p.i] != '{')
        return -1;
    p.i++;
    skip_ws(&p);
    if (p.i < p.n && p.s[p.i] == '}')
        return 0;
    for (;;) {
        skip_ws(&p);
        if (p.i >= p.n || p.s[p.i] != '"')
            return -1;
        size_t k0 = p.i + 1;
        if (string(&p) != 0)
            return -1;
        /* (A key with an escape never equals key: the keys looked up are plain names.) */
        int match = p.i - 1 - k0 == klen && memcmp(p.s + k0, key, klen) == 0;
        skip_ws(&p);
        if (p.i >= p.n || p.s[p.i] != ':')
            return -1;
        p.i++;
        skip_ws(&p);
        if (match && p.i < p.n && p.s[p.i] == '"') {
            size_t v0 = p.i + 1;
            if (string(&p) != 0)
                return -1;
            pgjobq__buf b = {NULL, 0, 0, 0};
            for (size_t i = v0; i < p.i - 1;) {
                unsigned char c = p.s[i];
                if (c != '\\') {
                    pgjobq__buf_put(&b, (const char *)p.s + i, 1);
                    i++;
                    continue;
                }
                c = p.s[i + 1];
                i += 2;
                if (c != 'u') {
                    char e = c == 'b' ? '\b' : c == 'f' ? '\f' : c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : (char)c;
                    pgjobq__buf_put(&b, &e, 1);
                    continue;
                }
                jp h = {p.s, p.n, i, NULL, 0};
                unsigned cp = 0, lo = 0;
                (void)hex4(&h, &cp); /* (string() checked every escape) */
                i += 4;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    h.i = i + 2;
                    (void)hex4(&h, &lo);
                    i += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                put_utf8(&b, cp);
            }
            pgjobq__buf_put(&b, "", 1);
            if (b.oom) {
                pgjobq__buf_free(&b);
                return -1;
            }
            *out = b.data;
            return 1;
        }
        if (skip_value(&p, JSON_MAX_DEPTH) != 0)
            return -1;
        if (match)
            return 0; /* present, not a string (null: none) */
        skip_ws(&p);
        if (p.i < p.n && p.s[p.i] == ',') {
            p.i++;
            continue;
        }
        return p.i < p.n && p.s[p.i] == '}' ? 0 : -1;
    }
}
