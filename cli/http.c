/*
 * http.c - the HTTP side of `pgjobq serve` and `pgjobq work --metrics-listen`, on libmicrohttpd.
 * libmicrohttpd parses requests and runs a small pool of threads; this file checks credentials,
 * collects form fields, and turns a handler's http_resp into a response with safe headers.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "http.h"

#define BODY_MAX (64 * 1024) /* a form is a handful of short fields */
#define THREADS 4

/* ------------------------------------------------------------------------------------------------ */
/* Text buffer and escapes                                                                           */

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

void sb_label(sbuf *b, const char *s)
{
    if (s == NULL)
        return;
    for (const char *p = s; *p; p++) {
        if (*p == '\\')
            sb_puts(b, "\\\\");
        else if (*p == '"')
            sb_puts(b, "\\\"");
        else if (*p == '\n')
            sb_puts(b, "\\n");
        else
            sb_putn(b, p, 1);
    }
}

int http_secret_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = la != lb;
    for (size_t i = 0; i < la; i++)
        diff |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
    return diff == 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Configuration                                                                                     */

int http_addr_parse(const char *s, http_addr *a, char *why, size_t why_size)
{
    const char *colon;
    char host[64];
    size_t hlen;
    long port;
    char *end;

    memset(a, 0, sizeof *a);
    if (s == NULL || *s == '\0') {
        snprintf(why, why_size, "empty address");
        return -1;
    }
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (close == NULL || close[1] != ':') {
            snprintf(why, why_size, "'%s': expected [IPV6]:PORT", s);
            return -1;
        }
        hlen = (size_t)(close - s - 1);
        if (hlen == 0 || hlen >= sizeof host) {
            snprintf(why, why_size, "'%s': bad IPv6 address", s);
            return -1;
        }
        memcpy(host, s + 1, hlen);
        host[hlen] = '\0';
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (colon == NULL) {
            snprintf(why, why_size, "'%s': expected HOST:PORT (e.g. 127.0.0.1:9464)", s);
            return -1;
        }
        hlen = (size_t)(colon - s);
        if (hlen >= sizeof host) {
            snprintf(why, why_size, "'%s': host too long", s);
            return -1;
        }
        memcpy(host, s, hlen);
        host[hlen] = '\0';
        if (hlen == 0)
            snprintf(host, sizeof host, "0.0.0.0");
        else if (strcmp(host, "localhost") == 0)
            snprintf(host, sizeof host, "127.0.0.1");
    }
    errno = 0;
    port = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end || port < 0 || port > 65535) {
        snprintf(why, why_size, "'%s': the port must be 0..65535", s);
        return -1;
    }
    struct in_addr v4;
    struct in6_addr v6;
    if (inet_pton(AF_INET, host, &v4) == 1) {
        a->loopback = (ntohl(v4.s_addr) >> 24) == 127;
    } else if (inet_pton(AF_INET6, host, &v6) == 1) {
        a->loopback = IN6_IS_ADDR_LOOPBACK(&v6);
    } else {
        snprintf(why, why_size, "'%s': '%s' is not an IP address (use 127.0.0.1, ::1, 0.0.0.0, ...)", s, host);
        return -1;
    }
    snprintf(a->host, sizeof a->host, "%s", host);
    a->port = (int)port;
    return 0;
}

char *http_token_from_file(const char *path, char *why, size_t why_size)
{
    char line[1024];
    FILE *f = fopen(path, "r");

    if (f == NULL) {
        snprintf(why, why_size, "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    if (fgets(line, sizeof line, f) == NULL)
        line[0] = '\0';
    fclose(f);
    char *s = line, *e = line + strlen(line);
    while (*s && isspace((unsigned char)*s))
        s++;
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    if (strlen(s) < 16) {
        snprintf(why, why_size, "%s: the token must be at least 16 characters on the first line", path);
        return NULL;
    }
    char *t = strdup(s);
    if (t == NULL)
        snprintf(why, why_size, "out of memory");
    return t;
}

/* ------------------------------------------------------------------------------------------------ */
/* Server                                                                                            */

struct http_server {
    struct MHD_Daemon *d;
    char *token;
    http_handler handler;
    void *arg;
};

/* What one request accumulates between libmicrohttpd's calls. */
typedef struct req_state {
    struct MHD_PostProcessor *pp;
    http_req req;
    size_t body_bytes;
    int too_big, bad_field;
} req_state;

static void req_state_free(req_state *st)
{
    if (st == NULL)
        return;
    if (st->pp)
        MHD_destroy_post_processor(st->pp);
    for (int i = 0; i < st->req.nform; i++) {
        free(st->req.form_key[i]);
        free(st->req.form_val[i]);
    }
    free(st);
}

static void on_completed(void *cls, struct MHD_Connection *connection, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)connection;
    (void)toe;
    req_state_free(*con_cls);
    *con_cls = NULL;
}

static enum MHD_Result on_field(void *cls, enum MHD_ValueKind kind, const char *key, const char *filename,
                                const char *content_type, const char *transfer_encoding, const char *data,
                                uint64_t off, size_t size)
{
    req_state *st = cls;
    http_req *r = &st->req;
    int i;

    (void)kind;
    (void)filename;
    (void)content_type;
    (void)transfer_encoding;
    for (i = 0; i < r->nform; i++)
        if (strcmp(r->form_key[i], key) == 0)
            break;
    if (i == r->nform) {
        if (r->nform == HTTP_FORM_MAX || off != 0) {
            st->bad_field = 1;
            return MHD_NO;
        }
        r->form_key[i] = strdup(key);
        r->form_val[i] = calloc(1, 1);
        if (r->form_key[i] == NULL || r->form_val[i] == NULL) {
            free(r->form_key[i]);
            free(r->form_val[i]);
            st->bad_field = 1;
            return MHD_NO;
        }
        r->nform++;
    }
    size_t have = strlen(r->form_val[i]);
    if (off != have) { /* a repeated key: keep the first value */
        return MHD_YES;
    }
    char *v = realloc(r->form_val[i], have + size + 1);
    if (v == NULL) {
        st->bad_field = 1;
        return MHD_NO;
    }
    memcpy(v + have, data, size);
    v[have + size] = '\0';
    r->form_val[i] = v;
    return MHD_YES;
}

const char *http_param(const http_req *r, const char *key)
{
    if (strcmp(r->method, "POST") == 0) {
        for (int i = 0; i < r->nform; i++)
            if (strcmp(r->form_key[i], key) == 0)
                return r->form_val[i];
        return NULL;
    }
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
}

/* Decodes base64 (padding optional) into out, NUL-terminated; returns its length, or -1. */
static int base64_decode(const char *in, char *out, size_t size)
{
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = 0, len = strcspn(in, "=");
    unsigned acc = 0;
    int bits = 0;

    if (strspn(in + len, "=") != strlen(in + len))
        return -1;
    for (size_t i = 0; i < len; i++) {
        const char *d = strchr(digits, in[i]);
        if (d == NULL)
            return -1;
        acc = (acc << 6) | (unsigned)(d - digits);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n + 1 >= size)
                return -1;
            out[n++] = (char)((acc >> bits) & 0xff);
        }
    }
    out[n] = '\0';
    return (int)n;
}

/* The credentials of an Authorization header: "Bearer TOKEN", or "Basic base64(USER:TOKEN)", the
 * scheme in any case (RFC 9110, 11.1). */
static int authorized(const http_server *s, const char *h)
{
    char cred[1024], dec[1024];

    if (s->token == NULL)
        return 1;
    if (h == NULL)
        return 0;
    size_t scheme = strcspn(h, " \t");
    const char *v = h + scheme;
    while (*v == ' ' || *v == '\t')
        v++;
    size_t n = strlen(v);
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    if (n >= sizeof cred)
        return 0;
    memcpy(cred, v, n);
    cred[n] = '\0';
    if (scheme == 6 && strncasecmp(h, "bearer", 6) == 0)
        return http_secret_equal(cred, s->token);
    if (scheme == 5 && strncasecmp(h, "basic", 5) == 0) {
        char *colon;
        if (base64_decode(cred, dec, sizeof dec) < 0 || (colon = strchr(dec, ':')) == NULL)
            return 0;
        return http_secret_equal(colon + 1, s->token);
    }
    return 0;
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *text)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), (void *)(uintptr_t)text, MHD_RESPMEM_MUST_COPY);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static void peer_of(struct MHD_Connection *c, char *buf, size_t size)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    snprintf(buf, size, "?");
    if (ci == NULL || ci->client_addr == NULL)
        return;
    if (ci->client_addr->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)ci->client_addr)->sin_addr, buf,
                  (socklen_t)size);
    else if (ci->client_addr->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)ci->client_addr)->sin6_addr, buf,
                  (socklen_t)size);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    http_server *s = cls;
    req_state *st = *con_cls;
    char peer[64];

    (void)version;
    if (st == NULL) {
        if ((st = calloc(1, sizeof *st)) == NULL)
            return MHD_NO;
        *con_cls = st;
        if (strcmp(method, "POST") == 0) {
            st->pp = MHD_create_post_processor(connection, 4096, on_field, st);
            /* Not a form (no or another content type): the handler sees no fields. */
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        st->body_bytes += *upload_data_size;
        if (st->body_bytes > BODY_MAX)
            st->too_big = 1;
        else if (st->pp && !st->bad_field && MHD_post_process(st->pp, upload_data, *upload_data_size) != MHD_YES)
            st->bad_field = 1;
        *upload_data_size = 0;
        return MHD_YES;
    }

    /* The whole request is here.  HEAD is GET without the body (libmicrohttpd leaves it out), for
     * every path and every check. */
    int healthz = (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0) && strcmp(url, "/healthz") == 0;
    if (!healthz && !authorized(s, MHD_lookup_connection_value(connection, MHD_HEADER_KIND,
                                                                MHD_HTTP_HEADER_AUTHORIZATION))) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(
            strlen("credentials required\n"), (void *)(uintptr_t) "credentials required\n", MHD_RESPMEM_PERSISTENT);
        if (resp == NULL)
            return MHD_NO;
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
        enum MHD_Result ret = MHD_queue_basic_auth_fail_response(connection, "pgjobq", resp);
        MHD_destroy_response(resp);
        return ret;
    }
    if (st->too_big)
        return send_text(connection, MHD_HTTP_CONTENT_TOO_LARGE, "request body too large\n");
    if (st->bad_field)
        return send_text(connection, MHD_HTTP_BAD_REQUEST, "bad form\n");
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0 && strcmp(method, "POST") != 0)
        return send_text(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n");

    peer_of(connection, peer, sizeof peer);
    st->req.conn = connection;
    st->req.method = strcmp(method, "HEAD") == 0 ? "GET" : method;
    st->req.path = url;
    st->req.peer = peer;

    http_resp out;
    memset(&out, 0, sizeof out);
    out.status = 200;
    out.content_type = "text/html; charset=utf-8";
    sb_init(&out.body);
    s->handler(s->arg, &st->req, &out);
    if (out.body.failed) {
        sb_free(&out.body);
        return send_text(connection, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    }
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(out.body.len, out.body.data ? out.body.data : (void *)(uintptr_t) "",
                                        MHD_RESPMEM_MUST_COPY);
    sb_free(&out.body);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, out.content_type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "X-Frame-Options", "DENY");
    MHD_add_response_header(resp, "Referrer-Policy", "same-origin");
    /* No script runs on these pages, whatever a job's payload or error holds. */
    MHD_add_response_header(resp, "Content-Security-Policy",
                            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                            "frame-ancestors 'none'; base-uri 'none'");
    if (out.location)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_LOCATION, out.location);
    enum MHD_Result ret = MHD_queue_response(connection, (unsigned)out.status, resp);
    MHD_destroy_response(resp);
    return ret;
}

http_server *http_start(const http_addr *a, const char *token, http_handler handler, void *arg, char *why,
                        size_t why_size)
{
    struct sockaddr_storage ss;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
    http_server *s;

    memset(&ss, 0, sizeof ss);
    if (strchr(a->host, ':')) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)a->port);
        if (inet_pton(AF_INET6, a->host, &in6->sin6_addr) != 1) {
            snprintf(why, why_size, "bad address %s", a->host);
            return NULL;
        }
        flags |= MHD_USE_IPv6;
    } else {
        struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)a->port);
        if (inet_pton(AF_INET, a->host, &in4->sin_addr) != 1) {
            snprintf(why, why_size, "bad address %s", a->host);
            return NULL;
        }
    }
    if ((s = calloc(1, sizeof *s)) == NULL) {
        snprintf(why, why_size, "out of memory");
        return NULL;
    }
    s->handler = handler;
    s->arg = arg;
    if (token && (s->token = strdup(token)) == NULL) {
        free(s);
        snprintf(why, why_size, "out of memory");
        return NULL;
    }
    s->d = MHD_start_daemon(flags, (uint16_t)a->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&ss, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)THREADS,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_END);
    if (s->d == NULL) {
        snprintf(why, why_size, "cannot listen on %s:%d (in use, or not an address of this host)", a->host, a->port);
        free(s->token);
        free(s);
        return NULL;
    }
    return s;
}

int http_port(http_server *s)
{
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    return di ? (int)di->port : -1;
}

void http_stop(http_server *s)
{
    if (s == NULL)
        return;
    MHD_stop_daemon(s->d);
    free(s->token);
    free(s);
}
