/*
 * http.c - the HTTP side of `pgjobq serve` and `pgjobq work --metrics-listen`, on libmicrohttpd.
 * libmicrohttpd parses requests and runs a small pool of threads; this file checks credentials,
 * collects form fields, and turns a handler's http_resp into a response with safe headers.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h" /* cli_mono_ms */
#include "http.h"

#define BODY_MAX (64 * 1024) /* a form is a handful of short fields */
#define THREADS 4              /* threads that read connections (epoll): none of them ever waits */
#define CONN_MAX 1000          /* connections at once, slow ones included (an idle one costs a descriptor) */
#define DESCRIPTORS_KEPT 64    /* descriptors left for the rest of the process (database, logs) */
#define PER_ADDRESS_MAX 32     /* connections from one address: a browser opens 6, a proxy a few dozen */
#define REQUEST_DEADLINE_MS 10000 /* to send a whole request (head and body), from connecting or the last answer */
#define IDLE_TIMEOUT_S 10      /* libmicrohttpd's own: no byte either way for this long */
#define QUEUE_MAX 64           /* requests waiting for a worker; more are answered 503 at once */
#define ARGS_MAX 64            /* query arguments a request may carry (no page has more than a few) */
#define LOGIN_FREE_FAILS 5     /* failed logins in a row from one address before it must wait */
#define LOGIN_WAIT_MAX_S 60    /* the longest wait: 1 s after the 5th failure, doubling */
#define LOGIN_FORGET_MS 600000 /* an address quiet this long starts again from nothing */
#define LOGIN_ADDRESSES 256    /* addresses remembered; the one heard from least recently is forgotten */

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

/* The entropy of n symbols (bytes) in bits a symbol, from their frequencies. */
static double entropy(const unsigned char *v, size_t n)
{
    unsigned count[256] = {0};
    double h = 0;
    for (size_t i = 0; i < n; i++)
        count[v[i]]++;
    for (int c = 0; c < 256; c++)
        if (count[c])
            h -= (double)count[c] / (double)n * log2((double)count[c] / (double)n);
    return h;
}

int http_token_check(const char *token, char *why, size_t why_size)
{
    const unsigned char *t = (const unsigned char *)token;
    size_t n = strlen(token);
    unsigned char steps[1024];

    if (n < 16) {
        snprintf(why, why_size, "the token must be at least 16 characters");
        return -1;
    }
    /* A pattern repeated ("changemechangeme", "abababab..."). */
    for (size_t p = 1; p <= n / 2; p++) {
        size_t i = p;
        while (i < n && t[i] == t[i - p])
            i++;
        if (i == n)
            goto weak;
    }
    /* Few distinct characters, or a run ("0123456789abcdef": each step the same). */
    size_t k = n - 1 < sizeof steps ? n - 1 : sizeof steps;
    for (size_t i = 0; i < k; i++)
        steps[i] = (unsigned char)(t[i + 1] - t[i]);
    if (entropy(t, n) * (double)n < 24 || entropy(steps, k) * (double)k < 24)
        goto weak;
    return 0;
weak:
    snprintf(why, why_size,
             "the token is too weak to guard anything (repeated characters, a run such as 1234 or abcd, or a "
             "repeated pattern): make a random one, e.g. openssl rand -hex 32");
    return -1;
}

char *http_token_from_file(const char *path, char *why, size_t why_size, char *warn, size_t warn_size)
{
    char line[1024];
    struct stat st;
    FILE *f = fopen(path, "r");

    warn[0] = '\0';
    if (f == NULL) {
        snprintf(why, why_size, "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077) != 0)
        snprintf(warn, warn_size,
                 "%s is readable by other users (mode %04o): anyone who can read it can use the dashboard; "
                 "chmod 600 it (a secret that Kubernetes or Docker mounts into a container may stay as it is)",
                 path, (unsigned)(st.st_mode & 07777));
    if (fgets(line, sizeof line, f) == NULL)
        line[0] = '\0';
    fclose(f);
    char *s = line, *e = line + strlen(line);
    while (*s && isspace((unsigned char)*s))
        s++;
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    if (http_token_check(s, why, why_size) != 0) {
        char reason[300];
        snprintf(reason, sizeof reason, "%s", why);
        snprintf(why, why_size, "%s (its first line): %s", path, reason);
        return NULL;
    }
    char *t = strdup(s);
    if (t == NULL)
        snprintf(why, why_size, "out of memory");
    return t;
}

/* ------------------------------------------------------------------------------------------------ */
/* Server                                                                                            */

/* A connection as the request deadline sees it (one per connection, under conn_mu). */
typedef struct tracked {
    struct tracked *prev, *next;
    int fd;
    int64_t since_ms; /* when it began to owe a request */
    int owing;        /* 1 until the whole request (head and body) is here */
} tracked;

/* What one request accumulates between libmicrohttpd's calls. */
typedef struct req_state {
    struct req_state *next; /* in the workers' queue */
    struct MHD_Connection *conn;
    struct MHD_PostProcessor *pp;
    http_req req;
    char method[8], peer[64];
    char *path;
    size_t body_bytes;
    int too_big, bad_field;
    int answered; /* a worker has filled resp */
    http_resp resp;
} req_state;

/* The failed logins of one client address. */
typedef struct login_fails {
    char peer[64];    /* "" when the slot is free */
    int fails;        /* in a row */
    int64_t last_ms;  /* the last failure */
    int64_t until_ms; /* its requests are refused until then */
} login_fails;

struct http_server {
    struct MHD_Daemon *d;
    char *token;
    char **hosts, **allow_hosts; /* NULL-terminated copies, lower case; hosts NULL: no Host check */
    int any_ip;
    void (*log)(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
    http_handler handler;
    void *arg;
    /* The request deadline: every connection, and a thread that closes those that owe a request
     * for too long. */
    pthread_mutex_t conn_mu;
    pthread_cond_t conn_cv;
    tracked *conns;
    int reaper_stop, reaper_started;
    pthread_t reaper;
    /* Handlers that wait: a queue and the threads that run them. */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    req_state *q_head, *q_tail;
    int q_len, q_stop;
    pthread_t *workers;
    int nworkers;
    /* Failed logins, per client address (login_*). */
    pthread_mutex_t login_mu;
    struct login_fails *logins;
};

static void resp_init(http_resp *r)
{
    memset(r, 0, sizeof *r);
    r->status = 200;
    r->content_type = "text/html; charset=utf-8";
    sb_init(&r->body);
}

static void req_state_free(req_state *st)
{
    if (st == NULL)
        return;
    if (st->pp)
        MHD_destroy_post_processor(st->pp);
    for (int i = 0; i < st->req.nparam; i++) {
        free(st->req.param_key[i]);
        free(st->req.param_val[i]);
    }
    free(st->path);
    sb_free(&st->resp.body);
    free(st);
}

/* ---- The request deadline ---- */

static tracked *tracked_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* The connection owes a request from now on (owing 1), or has sent it whole (owing 0). */
static void track_owing(http_server *s, struct MHD_Connection *c, int owing)
{
    tracked *t = tracked_of(c);
    if (t == NULL)
        return;
    pthread_mutex_lock(&s->conn_mu);
    t->owing = owing;
    t->since_ms = cli_mono_ms();
    pthread_mutex_unlock(&s->conn_mu);
}

/* libmicrohttpd tells of every connection when it starts and before it closes its socket, so that
 * while a connection is on the list, its descriptor is its own. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    http_server *s = cls;
    tracked *t = *socket_context;

    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci == NULL || (t = calloc(1, sizeof *t)) == NULL)
            return; /* not tracked: only libmicrohttpd's idle timeout applies */
        t->fd = ci->connect_fd;
        t->owing = 1;
        t->since_ms = cli_mono_ms();
        pthread_mutex_lock(&s->conn_mu);
        t->next = s->conns;
        if (s->conns)
            s->conns->prev = t;
        s->conns = t;
        pthread_mutex_unlock(&s->conn_mu);
        *socket_context = t;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && t) {
        pthread_mutex_lock(&s->conn_mu);
        if (t->prev)
            t->prev->next = t->next;
        else
            s->conns = t->next;
        if (t->next)
            t->next->prev = t->prev;
        pthread_mutex_unlock(&s->conn_mu);
        free(t);
        *socket_context = NULL;
    }
}

/* Once a second, shuts down the connections that have owed a request for REQUEST_DEADLINE_MS: a
 * client that sends a header line every few seconds resets libmicrohttpd's idle timeout forever,
 * but not this.  Shutting the socket down (not closing it) makes libmicrohttpd's own thread see
 * the end of the stream and close it; the socket is still the connection's, as above. */
static void *reaper(void *arg)
{
    http_server *s = arg;
    int64_t closed = 0, logged_ms = 0;

    pthread_mutex_lock(&s->conn_mu);
    while (!s->reaper_stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&s->conn_cv, &s->conn_mu, &until);
        int64_t now = cli_mono_ms();
        for (tracked *t = s->conns; t; t = t->next) {
            if (t->owing && t->fd >= 0 && now - t->since_ms > REQUEST_DEADLINE_MS) {
                shutdown(t->fd, SHUT_RDWR);
                t->owing = 0;
                closed++;
            }
        }
        if (closed && s->log && now - logged_ms >= 60000) {
            pthread_mutex_unlock(&s->conn_mu);
            s->log("closed %lld connection%s that sent no whole request within %d s (slow or stalled clients)",
                   (long long)closed, closed == 1 ? "" : "s", REQUEST_DEADLINE_MS / 1000);
            pthread_mutex_lock(&s->conn_mu);
            closed = 0;
            logged_ms = now;
        }
    }
    pthread_mutex_unlock(&s->conn_mu);
    return NULL;
}

/* ---- Checks of the request head ---- */

/* Splits an authority ("name", "name:port", "[v6]" or "[v6]:port", n bytes) into its host (an IP
 * address in its canonical form, a name in lower case) and its port ("" when none).  -1 when it
 * is not one. */
static int authority_split(const char *s, size_t n, char *host, size_t hsize, char *port, size_t psize)
{
    const char *end = s + n, *h = s, *hend, *p;
    char raw[256];

    if (n == 0)
        return -1;
    if (s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (close == NULL)
            return -1;
        h = s + 1;
        hend = close;
        p = close + 1;
        if (p < end && *p != ':')
            return -1;
    } else {
        hend = memchr(s, ':', n);
        if (hend == NULL)
            hend = end;
        p = hend;
    }
    if (p < end)
        p++; /* the colon */
    if ((size_t)(end - p) >= psize || (size_t)(hend - h) >= sizeof raw || hend == h)
        return -1;
    for (const char *q = p; q < end; q++)
        if (!isdigit((unsigned char)*q))
            return -1;
    memcpy(port, p, (size_t)(end - p));
    port[end - p] = '\0';
    memcpy(raw, h, (size_t)(hend - h));
    raw[hend - h] = '\0';
    struct in_addr v4;
    struct in6_addr v6;
    if (s[0] != '[' && inet_pton(AF_INET, raw, &v4) == 1)
        return inet_ntop(AF_INET, &v4, host, (socklen_t)hsize) ? 0 : -1;
    if (s[0] == '[')
        return inet_pton(AF_INET6, raw, &v6) == 1 && inet_ntop(AF_INET6, &v6, host, (socklen_t)hsize) ? 0 : -1;
    if (strlen(raw) >= hsize)
        return -1;
    for (size_t i = 0; raw[i]; i++) {
        unsigned char c = (unsigned char)raw[i];
        if (!isalnum(c) && c != '-' && c != '.' && c != '_')
            return -1;
        host[i] = (char)tolower(c);
    }
    host[strlen(raw)] = '\0';
    return 0;
}

static int listed(char *const *list, const char *host)
{
    for (int i = 0; list && list[i]; i++)
        if (strcmp(list[i], host) == 0)
            return 1;
    return 0;
}

static int is_ip(const char *host)
{
    struct in_addr v4;
    struct in6_addr v6;
    return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1;
}

/* The Host header names this server (or there is none: not a browser). */
static int host_allowed(const http_server *s, const char *h)
{
    char host[256], port[8];
    if (s->hosts == NULL || h == NULL)
        return 1;
    if (authority_split(h, strlen(h), host, sizeof host, port, sizeof port) != 0)
        return 0;
    return listed(s->hosts, host) || listed(s->allow_hosts, host) || (s->any_ip && is_ip(host));
}

/* A POST comes from a page of this server: its Origin, or without one its Referer, when either is
 * there.  A browser sends one of them with every form; without both, only the CSRF token speaks for
 * the request.  *which names the header that failed. */
static int same_origin(const http_server *s, struct MHD_Connection *c, const char **which, const char **value)
{
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    const char *referer = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_REFERER);
    const char *src = origin ? origin : referer, *auth, *dflt;
    char oh[256], op[8], hh[256], hp[8];

    if (s->hosts == NULL || src == NULL)
        return 1;
    *which = origin ? "Origin" : "Referer";
    *value = src;
    if (strncasecmp(src, "http://", 7) == 0) {
        auth = src + 7;
        dflt = "80";
    } else if (strncasecmp(src, "https://", 8) == 0) {
        auth = src + 8;
        dflt = "443";
    } else {
        return 0; /* "null" (a sandboxed or local page), or another scheme */
    }
    size_t n = strcspn(auth, "/?#");
    if (memchr(auth, '@', n) || authority_split(auth, n, oh, sizeof oh, op, sizeof op) != 0)
        return 0;
    if (listed(s->allow_hosts, oh))
        return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    if (h == NULL || authority_split(h, strlen(h), hh, sizeof hh, hp, sizeof hp) != 0)
        return 0;
    return strcmp(oh, hh) == 0 && strcmp(op[0] ? op : dflt, hp[0] ? hp : dflt) == 0;
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

/* ---- Failed logins ---- */

/* The slot of peer, when it has one (with login_mu held); with make, a new one when it has none,
 * in place of the address heard from least recently when every slot is taken. */
static login_fails *login_slot(http_server *s, const char *peer, int make)
{
    login_fails *oldest = NULL;
    for (int i = 0; i < LOGIN_ADDRESSES; i++) {
        login_fails *f = &s->logins[i];
        if (f->peer[0] && strcmp(f->peer, peer) == 0)
            return f;
        if (oldest == NULL || !f->peer[0] || (oldest->peer[0] && f->last_ms < oldest->last_ms))
            oldest = f;
    }
    if (!make)
        return NULL;
    memset(oldest, 0, sizeof *oldest);
    snprintf(oldest->peer, sizeof oldest->peer, "%s", peer);
    return oldest;
}

/* Seconds peer must still wait after its failed logins (0: none); its requests are refused
 * meanwhile, right credentials too, so that guessing goes no faster than the waits allow. */
static int64_t login_wait_s(http_server *s, const char *peer)
{
    int64_t now = cli_mono_ms(), wait = 0;
    pthread_mutex_lock(&s->login_mu);
    login_fails *f = login_slot(s, peer, 0);
    if (f && f->until_ms > now)
        wait = (f->until_ms - now + 999) / 1000;
    pthread_mutex_unlock(&s->login_mu);
    return wait;
}

/* Right credentials from peer: its failures are forgotten. */
static void login_succeeded(http_server *s, const char *peer)
{
    pthread_mutex_lock(&s->login_mu);
    login_fails *f = login_slot(s, peer, 0);
    if (f)
        memset(f, 0, sizeof *f);
    pthread_mutex_unlock(&s->login_mu);
}

/* Wrong credentials from peer: counted, logged (the address, the request, how many in a row; never
 * what was sent), and from the LOGIN_FREE_FAILS-th in a row on, a wait of 1 s that doubles up to
 * LOGIN_WAIT_MAX_S.  Once waiting, an address sends at most one wrong guess a wait, so the log gets
 * at most that many lines of it. */
static void login_failed(http_server *s, const char *peer, const char *method, const char *url)
{
    int64_t now = cli_mono_ms(), wait = 0;
    int fails;

    pthread_mutex_lock(&s->login_mu);
    login_fails *f = login_slot(s, peer, 1);
    if (now - f->last_ms > LOGIN_FORGET_MS)
        f->fails = 0;
    f->fails++;
    f->last_ms = now;
    if (f->fails >= LOGIN_FREE_FAILS) {
        int doublings = f->fails - LOGIN_FREE_FAILS;
        wait = doublings >= 6 ? LOGIN_WAIT_MAX_S : (int64_t)1 << doublings;
        if (wait > LOGIN_WAIT_MAX_S)
            wait = LOGIN_WAIT_MAX_S;
        f->until_ms = now + wait * 1000;
    }
    fails = f->fails;
    pthread_mutex_unlock(&s->login_mu);
    if (s->log == NULL)
        return;
    if (wait)
        s->log("refused the credentials of %s %.100s from %s (%d wrong in a row): its requests are refused for %lld s",
               method, url, peer, fails, (long long)wait);
    else
        s->log("refused the credentials of %s %.100s from %s (%d wrong in a row)", method, url, peer, fails);
}

/* ---- Answers ---- */

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *text)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), (void *)(uintptr_t)text, MHD_RESPMEM_MUST_COPY);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_auth_required(struct MHD_Connection *c)
{
    static const char text[] = "credentials required\n";
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(sizeof text - 1, (void *)(uintptr_t)text, MHD_RESPMEM_PERSISTENT);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    enum MHD_Result ret = MHD_queue_basic_auth_fail_response(c, "pgjobq", resp);
    MHD_destroy_response(resp);
    return ret;
}

/* 429 with Retry-After: an address that must wait after failed logins. */
static enum MHD_Result send_wait(struct MHD_Connection *c, int64_t seconds)
{
    char text[128], after[24];
    snprintf(text, sizeof text, "too many wrong credentials from this address: try again in %lld s\n",
             (long long)seconds);
    snprintf(after, sizeof after, "%lld", (long long)seconds);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), (void *)(uintptr_t)text, MHD_RESPMEM_MUST_COPY);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, after);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_TOO_MANY_REQUESTS, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* A handler's answer, with the headers every page carries. */
static enum MHD_Result send_resp(struct MHD_Connection *c, http_resp *out)
{
    if (out->body.failed)
        return send_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(out->body.len, out->body.data ? out->body.data : (void *)(uintptr_t) "",
                                        MHD_RESPMEM_MUST_COPY);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, out->content_type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "X-Frame-Options", "DENY");
    MHD_add_response_header(resp, "Referrer-Policy", "same-origin");
    /* No script runs on these pages, whatever a job's payload or error holds. */
    MHD_add_response_header(resp, "Content-Security-Policy",
                            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                            "frame-ancestors 'none'; base-uri 'none'");
    if (out->location)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_LOCATION, out->location);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)out->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static void resp_text(http_resp *r, int status, const char *text)
{
    sb_free(&r->body);
    resp_init(r);
    r->status = status;
    r->content_type = "text/plain; charset=utf-8";
    sb_puts(&r->body, text);
}

/* ---- Parameters ---- */

/* Adds a parameter (a first chunk of it when off is 0, a further chunk otherwise); a repeated name
 * keeps its first value. */
static int param_add(http_req *r, const char *key, const char *data, size_t size, uint64_t off)
{
    int i;
    for (i = 0; i < r->nparam; i++)
        if (strcmp(r->param_key[i], key) == 0)
            break;
    if (i == r->nparam) {
        if (r->nparam == HTTP_PARAM_MAX || off != 0)
            return -1;
        r->param_key[i] = strdup(key);
        r->param_val[i] = calloc(1, 1);
        if (r->param_key[i] == NULL || r->param_val[i] == NULL) {
            free(r->param_key[i]);
            free(r->param_val[i]);
            return -1;
        }
        r->nparam++;
    } else if (off == 0) {
        return 0; /* a repeated name */
    }
    size_t have = strlen(r->param_val[i]);
    if (off != have)
        return 0;
    char *v = realloc(r->param_val[i], have + size + 1);
    if (v == NULL)
        return -1;
    memcpy(v + have, data, size);
    v[have + size] = '\0';
    r->param_val[i] = v;
    return 0;
}

static enum MHD_Result on_field(void *cls, enum MHD_ValueKind kind, const char *key, const char *filename,
                                const char *content_type, const char *transfer_encoding, const char *data,
                                uint64_t off, size_t size)
{
    req_state *st = cls;

    (void)kind;
    (void)filename;
    (void)content_type;
    (void)transfer_encoding;
    if (param_add(&st->req, key, data, size, off) != 0) {
        st->bad_field = 1;
        return MHD_NO;
    }
    return MHD_YES;
}

static enum MHD_Result on_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    req_state *st = cls;
    (void)kind;
    /* Past HTTP_PARAM_MAX names, the rest are not read: no page has that many filters. */
    (void)param_add(&st->req, key, value ? value : "", value ? strlen(value) : 0, 0);
    return MHD_YES;
}

const char *http_param(const http_req *r, const char *key)
{
    for (int i = 0; i < r->nparam; i++)
        if (strcmp(r->param_key[i], key) == 0)
            return r->param_val[i];
    return NULL;
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

/* ---- Workers ---- */

static void *worker(void *arg)
{
    http_server *s = arg;

    pthread_mutex_lock(&s->q_mu);
    for (;;) {
        while (s->q_head == NULL && !s->q_stop)
            pthread_cond_wait(&s->q_cv, &s->q_mu);
        req_state *st = s->q_head;
        if (st == NULL)
            break;
        s->q_head = st->next;
        if (s->q_head == NULL)
            s->q_tail = NULL;
        s->q_len--;
        int stopping = s->q_stop;
        pthread_mutex_unlock(&s->q_mu);

        if (stopping) {
            resp_text(&st->resp, MHD_HTTP_SERVICE_UNAVAILABLE, "the server is stopping\n");
        } else {
            st->req.may_block = 1;
            s->handler(s->arg, &st->req, &st->resp);
            if (st->resp.defer)
                resp_text(&st->resp, MHD_HTTP_INTERNAL_SERVER_ERROR, "the handler deferred twice\n");
        }
        st->answered = 1;
        MHD_resume_connection(st->conn); /* libmicrohttpd calls on_request again: it sends st->resp */
        pthread_mutex_lock(&s->q_mu);
    }
    pthread_mutex_unlock(&s->q_mu);
    return NULL;
}

/* Hands a request to the workers: the connection is suspended (its thread goes on with the
 * others) until a worker has answered and resumed it.  A full queue answers 503 at once. */
static enum MHD_Result defer(http_server *s, req_state *st)
{
    MHD_suspend_connection(st->conn);
    pthread_mutex_lock(&s->q_mu);
    if (s->nworkers == 0 || s->q_stop || s->q_len >= QUEUE_MAX) {
        int stopping = s->q_stop;
        pthread_mutex_unlock(&s->q_mu);
        resp_text(&st->resp, s->nworkers == 0 ? MHD_HTTP_INTERNAL_SERVER_ERROR : MHD_HTTP_SERVICE_UNAVAILABLE,
                  s->nworkers == 0 ? "no worker for this request\n"
                  : stopping      ? "the server is stopping\n"
                                  : "busy: too many requests wait for the database; try again\n");
        st->answered = 1;
        MHD_resume_connection(st->conn);
        return MHD_YES;
    }
    st->next = NULL;
    if (s->q_tail)
        s->q_tail->next = st;
    else
        s->q_head = st;
    s->q_tail = st;
    s->q_len++;
    pthread_cond_signal(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
    return MHD_YES;
}

/* ---- Requests ---- */

/* What a request refused for its query arguments carries as its context, in place of a req_state. */
static char too_many_args;

/* Called by libmicrohttpd with the request's whole URI, before it parses the query arguments: each
 * takes room in the connection's memory pool, and with 463 or more (about 3 KB of URI) the pool runs
 * out and libmicrohttpd 0.9.75 never answers.  A URI with more than ARGS_MAX arguments has them cut
 * off here (the URI is libmicrohttpd's own buffer, which it parses the arguments from after this
 * call: they are gone before it makes room for them), and on_request answers 414. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
    const char *q = strchr(uri, '?');
    size_t n = 1;

    (void)cls;
    (void)c;
    if (q == NULL)
        return NULL;
    for (const char *p = q + 1; *p; p++)
        n += *p == '&';
    if (n <= ARGS_MAX)
        return NULL;
    ((char *)(uintptr_t)q)[1] = '\0';
    return &too_many_args;
}

static void on_completed(void *cls, struct MHD_Connection *connection, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    if (*con_cls != &too_many_args)
        req_state_free(*con_cls);
    *con_cls = NULL;
    track_owing(cls, connection, 1); /* the next request on this connection is due from now */
}

/* The head is here: the checks that need no body, before any of it is read. */
static enum MHD_Result on_head(http_server *s, struct MHD_Connection *c, const char *url, const char *method,
                               void **con_cls)
{
    /* HEAD is GET without the body (libmicrohttpd leaves it out), for every path and every check. */
    const char *m = strcmp(method, "HEAD") == 0 ? "GET" : method;
    int healthz = strcmp(m, "GET") == 0 && strcmp(url, "/healthz") == 0;
    const char *which = NULL, *value = NULL;
    char peer[64];
    req_state *st;

    if (strcmp(m, "GET") != 0 && strcmp(m, "POST") != 0)
        return send_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n");
    if (!healthz && !host_allowed(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST)))
        return send_text(c, MHD_HTTP_MISDIRECTED_REQUEST,
                         "misdirected request: this server does not answer to the host name in the address bar; "
                         "use its address, or start pgjobq serve with --allow-host NAME\n");
    peer_of(c, peer, sizeof peer);
    if (!healthz && s->token) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        int64_t wait = login_wait_s(s, peer);
        if (wait > 0)
            return send_wait(c, wait);
        if (!authorized(s, auth)) {
            if (auth != NULL) /* none: a browser's first request, before it asks for them */
                login_failed(s, peer, m, url);
            return send_auth_required(c);
        }
        login_succeeded(s, peer);
    }
    if ((st = calloc(1, sizeof *st)) == NULL)
        return MHD_NO;
    st->conn = c;
    snprintf(st->method, sizeof st->method, "%s", m);
    snprintf(st->peer, sizeof st->peer, "%s", peer);
    if ((st->path = strdup(url)) == NULL) {
        free(st);
        return MHD_NO;
    }
    resp_init(&st->resp);
    *con_cls = st; /* freed by on_completed, whatever happens next */
    if (strcmp(m, "POST") == 0) {
        if (!same_origin(s, c, &which, &value)) {
            if (s->log)
                s->log("refused POST %.100s from %s: its %s (%.200s) is not this server", url, st->peer, which,
                       value);
            return send_text(c, MHD_HTTP_FORBIDDEN,
                             "refused: this form was sent from a page of another site (its Origin or Referer is "
                             "not this server)\n");
        }
        st->pp = MHD_create_post_processor(c, 4096, on_field, st);
        /* Not a form (no or another content type): the handler sees no fields. */
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    http_server *s = cls;
    req_state *st = *con_cls;

    (void)version;
    if (*con_cls == &too_many_args) {
        *upload_data_size = 0;
        return send_text(connection, MHD_HTTP_URI_TOO_LONG, "too many query arguments\n");
    }
    if (st == NULL)
        return on_head(s, connection, url, method, con_cls);
    if (*upload_data_size) {
        st->body_bytes += *upload_data_size;
        if (st->body_bytes > BODY_MAX)
            st->too_big = 1;
        else if (st->pp && !st->bad_field && MHD_post_process(st->pp, upload_data, *upload_data_size) != MHD_YES)
            st->bad_field = 1;
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (st->answered) /* resumed by a worker */
        return send_resp(connection, &st->resp);

    /* The whole request is here. */
    track_owing(s, connection, 0);
    if (st->too_big)
        return send_text(connection, MHD_HTTP_CONTENT_TOO_LARGE, "request body too large\n");
    if (st->bad_field)
        return send_text(connection, MHD_HTTP_BAD_REQUEST, "bad form\n");
    if (strcmp(st->method, "GET") == 0)
        MHD_get_connection_values(connection, MHD_GET_ARGUMENT_KIND, on_arg, st);
    st->req.method = st->method;
    st->req.path = st->path;
    st->req.peer = st->peer;
    st->req.may_block = 0;
    s->handler(s->arg, &st->req, &st->resp);
    if (!st->resp.defer)
        return send_resp(connection, &st->resp);
    sb_free(&st->resp.body);
    resp_init(&st->resp);
    return defer(s, st);
}

/* ---- Start and stop ---- */

static void strv_free(char **v)
{
    for (int i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

int http_host_parse(const char *s, char *out, size_t size)
{
    char bracketed[260], port[8];
    /* An IPv6 address without brackets is bracketed, so that its colons are not taken for a port. */
    snprintf(bracketed, sizeof bracketed, strchr(s, ':') && s[0] != '[' ? "[%s]" : "%s", s);
    if (strlen(s) > 253 || authority_split(bracketed, strlen(bracketed), out, size, port, sizeof port) != 0 || port[0])
        return -1;
    return 0;
}

/* A copy of a NULL-terminated list of hosts, each in the form host_allowed compares. */
static int hosts_copy(const char *const *in, char ***out)
{
    size_t n = 0;
    char host[256];

    *out = NULL;
    if (in == NULL)
        return 0;
    while (in[n])
        n++;
    if ((*out = calloc(n + 1, sizeof **out)) == NULL)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (http_host_parse(in[i], host, sizeof host) != 0 || ((*out)[i] = strdup(host)) == NULL)
            return -1;
    return 0;
}

/* The server's locks and conditions, or none of them (server_free destroys all five): 0 or -1. */
static int make_locks(http_server *s)
{
    if (pthread_mutex_init(&s->conn_mu, NULL) != 0)
        return -1;
    if (pthread_cond_init(&s->conn_cv, NULL) != 0) {
        pthread_mutex_destroy(&s->conn_mu);
        return -1;
    }
    if (pthread_mutex_init(&s->q_mu, NULL) != 0) {
        pthread_cond_destroy(&s->conn_cv);
        pthread_mutex_destroy(&s->conn_mu);
        return -1;
    }
    if (pthread_cond_init(&s->q_cv, NULL) != 0) {
        pthread_mutex_destroy(&s->q_mu);
        pthread_cond_destroy(&s->conn_cv);
        pthread_mutex_destroy(&s->conn_mu);
        return -1;
    }
    if (pthread_mutex_init(&s->login_mu, NULL) != 0) {
        pthread_cond_destroy(&s->q_cv);
        pthread_mutex_destroy(&s->q_mu);
        pthread_cond_destroy(&s->conn_cv);
        pthread_mutex_destroy(&s->conn_mu);
        return -1;
    }
    return 0;
}

static void server_free(http_server *s)
{
    free(s->token);
    strv_free(s->hosts);
    strv_free(s->allow_hosts);
    free(s->workers);
    free(s->logins);
    pthread_mutex_destroy(&s->conn_mu);
    pthread_cond_destroy(&s->conn_cv);
    pthread_mutex_destroy(&s->q_mu);
    pthread_cond_destroy(&s->q_cv);
    pthread_mutex_destroy(&s->login_mu);
    free(s);
}

/* Stops and joins the worker and reaper threads that started. */
static void threads_stop(http_server *s)
{
    pthread_mutex_lock(&s->q_mu);
    s->q_stop = 1;
    pthread_cond_broadcast(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
    for (int i = 0; i < s->nworkers; i++)
        pthread_join(s->workers[i], NULL);
    s->nworkers = 0;
    pthread_mutex_lock(&s->conn_mu);
    s->reaper_stop = 1;
    pthread_cond_broadcast(&s->conn_cv);
    pthread_mutex_unlock(&s->conn_mu);
    if (s->reaper_started)
        pthread_join(s->reaper, NULL);
    s->reaper_started = 0;
}

/* The connection limit: CONN_MAX, or fewer when the descriptors this process may open are fewer
 * (each connection holds one; DESCRIPTORS_KEPT are left for the rest of the process). */
static unsigned connection_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
        rl.rlim_cur >= CONN_MAX + DESCRIPTORS_KEPT)
        return CONN_MAX;
    return rl.rlim_cur > DESCRIPTORS_KEPT + 16 ? (unsigned)(rl.rlim_cur - DESCRIPTORS_KEPT) : 16;
}

http_server *http_start_opts(const http_addr *a, const http_opts *o, http_handler handler, void *arg, char *why,
                             size_t why_size)
{
    struct sockaddr_storage ss;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME;
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
    if (make_locks(s) != 0) {
        snprintf(why, why_size, "cannot make the server's locks");
        free(s);
        return NULL;
    }
    s->handler = handler;
    s->arg = arg;
    s->any_ip = o->any_ip;
    s->log = o->log;
    if ((o->token && (s->token = strdup(o->token)) == NULL) || hosts_copy(o->hosts, &s->hosts) != 0 ||
        hosts_copy(o->allow_hosts, &s->allow_hosts) != 0 ||
        (o->token && (s->logins = calloc(LOGIN_ADDRESSES, sizeof *s->logins)) == NULL) ||
        (o->workers > 0 && (s->workers = calloc((size_t)o->workers, sizeof *s->workers)) == NULL)) {
        snprintf(why, why_size, "out of memory, or a host that is not a name or an address");
        server_free(s);
        return NULL;
    }
    for (int i = 0; i < o->workers; i++) {
        if (pthread_create(&s->workers[i], NULL, worker, s) != 0)
            break;
        s->nworkers++;
    }
    if (pthread_create(&s->reaper, NULL, reaper, s) == 0)
        s->reaper_started = 1;
    if (s->nworkers < o->workers || !s->reaper_started) {
        snprintf(why, why_size, "cannot start the server's threads");
        threads_stop(s);
        server_free(s);
        return NULL;
    }
    s->d = MHD_start_daemon(flags, (uint16_t)a->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&ss, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)THREADS,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S, MHD_OPTION_CONNECTION_LIMIT,
                            connection_limit(), MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)PER_ADDRESS_MAX,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
                            s, MHD_OPTION_URI_LOG_CALLBACK, on_uri, s, MHD_OPTION_END);
    if (s->d == NULL) {
        snprintf(why, why_size, "cannot listen on %s:%d (in use, or not an address of this host)", a->host, a->port);
        threads_stop(s);
        server_free(s);
        return NULL;
    }
    return s;
}

void http_listen_names(const http_addr *a, const char *names[HTTP_NAMES_MAX], int *any_ip)
{
    int wildcard = strcmp(a->host, "0.0.0.0") == 0 || strcmp(a->host, "::") == 0;
    names[0] = a->host;
    names[1] = names[2] = names[3] = names[4] = NULL;
    if (a->loopback || wildcard) {
        names[1] = "localhost";
        names[2] = "127.0.0.1";
        names[3] = "::1";
    }
    *any_ip = wildcard;
}

http_server *http_start(const http_addr *a, const char *token, http_handler handler, void *arg, char *why,
                        size_t why_size)
{
    const char *names[HTTP_NAMES_MAX];
    http_opts o;
    memset(&o, 0, sizeof o);
    o.token = token;
    http_listen_names(a, names, &o.any_ip);
    o.hosts = names;
    return http_start_opts(a, &o, handler, arg, why, why_size);
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
    /* The workers first: each suspended connection is resumed (answered) before libmicrohttpd,
     * which must not stop with one suspended, closes them all. */
    threads_stop(s);
    MHD_stop_daemon(s->d);
    server_free(s);
}
