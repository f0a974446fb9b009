/*
 * redact.c - keeping passwords out of messages.  libpq's errors about a connection string quote it (a
 * URL it cannot parse, whole; a token it cannot decode, alone), and the library passes libpq's
 * connection errors on; so every message that can carry a conninfo goes through here first.
 *
 * Two passes.  The first replaces every password the conninfo holds wherever it appears in the
 * message: found the way libpq finds it and the way whoever wrote it may have meant it (an unencoded
 * '@' or '/' in a URL's password, an unquoted blank in a key=value one), as written and as decoded
 * (percent-encoding, quotes and backslashes), and the pieces libpq may have split it into.  The second
 * replaces anything shaped like a password, whatever conninfo it came from: what lies between ':' and
 * the last '@' of a URL's user information, and the value after "password=" (which covers sslpassword
 * and PGPASSWORD too).  Over-redacting a host name now and then is the price of never printing a
 * password.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

#define MAX_SECRETS 64
#define MIN_PIECE   3 /* shorter pieces of a split password are left alone: they would blank out words */
#define MASK        "***"
#define WITHHELD    "(message withheld: it may hold a password, and redacting it failed)"

typedef struct secrets {
    struct {
        const char *s;
        size_t n;
    } v[MAX_SECRETS];
    int n;
    int overflow;  /* a secret could not be recorded: the message must not be shown */
    char *scratch; /* decoded copies */
    size_t used, cap;
} secrets;

static void add(secrets *S, const char *s, size_t n)
{
    if (n == 0)
        return;
    for (int i = 0; i < S->n; i++)
        if (S->v[i].n == n && memcmp(S->v[i].s, s, n) == 0)
            return;
    if (S->n == MAX_SECRETS) {
        S->overflow = 1;
        return;
    }
    S->v[S->n].s = s;
    S->v[S->n].n = n;
    S->n++;
}

/* Room for n more bytes of decoded text, or NULL (then the message is withheld). */
static char *room(secrets *S, size_t n)
{
    if (S->scratch == NULL || S->cap - S->used < n) {
        S->overflow = 1;
        return NULL;
    }
    return S->scratch + S->used;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Adds s as written and percent-decoded (libpq decodes a URL's parts before it uses them). */
static void add_decoded(secrets *S, const char *s, size_t n)
{
    char *d;
    size_t k = 0;

    add(S, s, n);
    if (memchr(s, '%', n) == NULL || (d = room(S, n)) == NULL)
        return;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%' && i + 2 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
            d[k++] = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
            i += 2;
        } else {
            d[k++] = s[i];
        }
    }
    S->used += k;
    add(S, d, k);
}

/* The pieces of s between the characters at which libpq may cut a URL (a misplaced '@' or '/' in a
 * password makes its tail a host, a port or a database name), each as written and decoded. */
static void add_pieces(secrets *S, const char *s, size_t n)
{
    static const char cuts[] = "@/:?#&,=[] \t";
    size_t i = 0;

    while (i < n) {
        size_t start = i;
        while (i < n && strchr(cuts, s[i]) == NULL)
            i++;
        if (i - start >= MIN_PIECE && i - start < n)
            add_decoded(S, s + start, i - start);
        i++;
    }
}

/* Whether key (n bytes) names a password: password, sslpassword, ...  Case does not matter here,
 * though it does to libpq: a near miss is still somebody's password. */
static int password_key(const char *key, size_t n)
{
    return n >= 8 && strncasecmp(key + n - 8, "password", 8) == 0;
}

/* The parameters of a URL, from after its '?' to end: password=..., sslpassword=...; parameters
 * without '=' right after one of those were probably part of its value (an unencoded '&'). */
static void scan_params(secrets *S, const char *p, const char *end)
{
    int after_password = 0;

    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p)), *eq;
        if (amp == NULL)
            amp = end;
        eq = memchr(p, '=', (size_t)(amp - p));
        if (eq && password_key(p, (size_t)(eq - p))) {
            add_decoded(S, eq + 1, (size_t)(amp - eq - 1));
            after_password = 1;
        } else if (eq == NULL && after_password) {
            add_decoded(S, p, (size_t)(amp - p));
        } else {
            after_password = 0;
        }
        p = amp + 1;
    }
}

/* Every URL in the conninfo: at its start, or as the value of dbname in a key=value string. */
static void scan_urls(secrets *S, const char *ci)
{
    for (const char *p = strstr(ci, "://"); p; p = strstr(p + 3, "://")) {
        const char *auth = p + 3, *q = auth, *at = NULL, *rest = auth, *colon;
        const char *end = auth + strcspn(auth, " \t\n\r\f\v'\"");

        /* As libpq reads it: the user information ends at the first '@' before any '/'. */
        while (*q && *q != '@' && *q != '/')
            q++;
        if (*q == '@' && (colon = memchr(auth, ':', (size_t)(q - auth))) != NULL)
            add_decoded(S, colon + 1, (size_t)(q - colon - 1));
        /* As it was probably meant: up to the last '@' of the URL. */
        for (const char *r = auth; r < end; r++)
            if (*r == '@')
                at = r;
        if (at) {
            if ((colon = memchr(auth, ':', (size_t)(at - auth))) != NULL) {
                add_decoded(S, colon + 1, (size_t)(at - colon - 1));
                add_pieces(S, colon + 1, (size_t)(at - colon - 1));
            }
            rest = at + 1;
        }
        if ((q = memchr(rest, '?', (size_t)(end - rest))) != NULL)
            scan_params(S, q + 1, end);
    }
}

/* One value of a key=value string from p (after the '=' and blanks): quoted with '...' or bare, with
 * backslash escapes.  Records it when it is a password (as written and unescaped); returns its end. */
static const char *scan_value(secrets *S, const char *p, int secret)
{
    const char *start, *q;
    char *d = NULL;
    size_t k = 0;
    int quoted = *p == '\'';

    start = q = p + quoted;
    if (secret)
        d = room(S, strlen(start));
    while (*q && (quoted ? *q != '\'' : !isspace((unsigned char)*q))) {
        if (*q == '\\' && q[1])
            q++;
        if (d)
            d[k++] = *q;
        q++;
    }
    if (secret) {
        add(S, start, (size_t)(q - start));
        if (d) {
            S->used += k;
            add(S, d, k);
        }
    }
    return quoted && *q ? q + 1 : q;
}

/* The words after a bare password value that are not keyword=value: libpq takes the first of them
 * for a keyword and quotes it ("missing "=" after ..."), though they were the rest of the password. */
static void scan_tail(secrets *S, const char *value, const char *p)
{
    const char *last = p;

    for (;;) {
        const char *w, *after;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == '\0')
            break;
        w = p;
        while (*p && *p != '=' && !isspace((unsigned char)*p))
            p++;
        after = p;
        while (isspace((unsigned char)*after))
            after++;
        if (*p == '=' || *after == '=')
            break;
        add(S, w, (size_t)(p - w));
        last = p;
    }
    add(S, value, (size_t)(last - value));
}

/* A key=value string (also run over a URL, where it finds nothing that the URL scan does not). */
static void scan_keywords(secrets *S, const char *p)
{
    while (*p) {
        const char *key, *q;
        int secret;

        while (isspace((unsigned char)*p))
            p++;
        if (*p == '\0')
            break;
        key = p;
        while (*p && *p != '=' && !isspace((unsigned char)*p))
            p++;
        secret = password_key(key, (size_t)(p - key));
        q = p;
        while (isspace((unsigned char)*q))
            q++;
        if (*q != '=') {
            p = q; /* a bare word */
            continue;
        }
        q++;
        while (isspace((unsigned char)*q))
            q++;
        int quoted = *q == '\'';
        p = scan_value(S, q, secret);
        if (secret && !quoted)
            scan_tail(S, q, p);
    }
}

typedef struct out {
    char *buf;
    size_t size, len;
} out;

static void put(out *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++, o->len++)
        if (o->len + 1 < o->size)
            o->buf[o->len] = s[i];
}

/* Whether the n bytes at msg + i are not part of a longer word. */
static int whole_word(const char *msg, size_t len, size_t i, size_t n)
{
    return (i == 0 || !isalnum((unsigned char)msg[i - 1])) && (i + n == len || !isalnum((unsigned char)msg[i + n]));
}

/* Pass 1: every occurrence of a known secret, the longest first where they overlap.  A secret of
 * fewer than SHORT bytes is masked only where it stands as a word of its own: masking every "a" of a
 * message would leave nothing to read, and a password that short hides nothing anyway. */
#define SHORT 4
static void mask_secrets(out *o, const secrets *S, const char *msg, size_t len)
{
    for (size_t i = 0; i < len;) {
        size_t best = 0;
        for (int k = 0; k < S->n; k++)
            if (S->v[k].n > best && S->v[k].n <= len - i && memcmp(msg + i, S->v[k].s, S->v[k].n) == 0 &&
                (S->v[k].n >= SHORT || whole_word(msg, len, i, S->v[k].n)))
                best = S->v[k].n;
        if (best) {
            put(o, MASK, sizeof MASK - 1);
            i += best;
        } else {
            put(o, msg + i, 1);
            i++;
        }
    }
}

/* Pass 2: anything shaped like a password. */
static void mask_shapes(out *o, const char *t, size_t len)
{
    for (size_t i = 0; i < len;) {
        if (len - i >= 3 && memcmp(t + i, "://", 3) == 0) {
            size_t j = i + 3, end = j, at = 0, colon = 0;
            while (end < len && !isspace((unsigned char)t[end]) && t[end] != '"' && t[end] != '\'')
                end++;
            for (size_t r = j; r < end; r++)
                if (t[r] == '@')
                    at = r;
            for (size_t r = j; at && r < at && !colon; r++)
                if (t[r] == ':')
                    colon = r;
            put(o, t + i, 3);
            if (colon) {
                put(o, t + j, colon + 1 - j);
                put(o, MASK, sizeof MASK - 1);
                i = at;
            } else {
                i = j;
            }
            continue;
        }
        if (len - i >= 8 && strncasecmp(t + i, "password", 8) == 0) {
            size_t j = i + 8;
            while (j < len && (t[j] == ' ' || t[j] == '\t'))
                j++;
            if (j < len && t[j] == '=') {
                j++;
                while (j < len && (t[j] == ' ' || t[j] == '\t'))
                    j++;
                put(o, t + i, j - i);
                if (j < len && t[j] == '\'') {
                    for (j++; j < len && t[j] != '\''; j++)
                        if (t[j] == '\\' && j + 1 < len)
                            j++;
                    j += j < len;
                    put(o, "'" MASK "'", sizeof MASK + 1);
                } else {
                    size_t v = j;
                    while (j < len && !isspace((unsigned char)t[j]) && strchr("\"&,;)", t[j]) == NULL)
                        j++;
                    if (j > v)
                        put(o, MASK, sizeof MASK - 1);
                }
                i = j;
                continue;
            }
            put(o, t + i, 8);
            i += 8;
            continue;
        }
        put(o, t + i, 1);
        i++;
    }
}

static size_t withheld(char *buf, size_t size)
{
    out o = {buf, size, 0};
    put(&o, WITHHELD, sizeof WITHHELD - 1);
    if (size)
        buf[o.len < size ? o.len : size - 1] = '\0';
    return o.len;
}

size_t pgjobq__redact(char *buf, size_t size, const char *msg, size_t msg_len, const char *conninfo, PGconn *conn)
{
    secrets S;
    PQconninfoOption *opts = NULL;
    const char *env = getenv("PGPASSWORD");
    size_t ci_len = conninfo ? strlen(conninfo) : 0;
    char *mid;

    memset(&S, 0, sizeof S);
    S.cap = 4 * ci_len + 64;
    S.scratch = malloc(S.cap);
    if (conninfo) {
        scan_urls(&S, conninfo);
        scan_keywords(&S, conninfo);
    }
    if (conn && (opts = PQconninfo(conn)) != NULL)
        for (PQconninfoOption *o = opts; o->keyword; o++)
            if (o->val && password_key(o->keyword, strlen(o->keyword)))
                add(&S, o->val, strlen(o->val));
    if (env)
        add(&S, env, strlen(env));

    /* Pass 1 into a buffer of its own (a one-byte secret becomes three), then pass 2 into buf. */
    mid = S.overflow || S.scratch == NULL ? NULL : malloc(3 * msg_len + 1);
    if (mid == NULL) {
        free(S.scratch);
        PQconninfoFree(opts);
        return withheld(buf, size);
    }
    out o1 = {mid, 3 * msg_len + 1, 0};
    mask_secrets(&o1, &S, msg, msg_len);
    out o2 = {buf, size, 0};
    mask_shapes(&o2, mid, o1.len);
    if (size)
        buf[o2.len < size ? o2.len : size - 1] = '\0';
    free(mid);
    free(S.scratch);
    PQconninfoFree(opts);
    return o2.len;
}

size_t pgjobq_conninfo_redact(char *buf, size_t size, const char *msg, const char *conninfo)
{
    if (msg == NULL)
        msg = "";
    return pgjobq__redact(buf, size, msg, strlen(msg), conninfo, NULL);
}

int pgjobq_conninfo_check(const char *conninfo, char *why, size_t why_size)
{
    char *err = NULL;
    PQconninfoOption *opts = PQconninfoParse(conninfo ? conninfo : "", &err);

    if (opts) {
        PQconninfoFree(opts);
        return PGJOBQ_OK;
    }
    if (err == NULL) {
        if (why && why_size)
            snprintf(why, why_size, "out of memory");
        return PGJOBQ_ENOMEM;
    }
    if (why && why_size) {
        size_t n = strlen(err);
        while (n > 0 && (err[n - 1] == '\n' || err[n - 1] == ' '))
            n--;
        pgjobq__redact(why, why_size, err, n, conninfo, NULL);
    }
    PQfreemem(err);
    return PGJOBQ_EINVAL;
}
