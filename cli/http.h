/*
 * http.h - what `pgjobq serve` and `pgjobq work --metrics-listen` share: an HTTP server on
 * libmicrohttpd (no HTTP parsing of our own), the listen address and its rules, credentials.  The
 * text buffer its pages are written into is sbuf.h's.
 */
#ifndef PGJOBQ_CLI_HTTP_H
#define PGJOBQ_CLI_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "sbuf.h"

/* A parsed --listen / --metrics-listen address: IPv4 or [IPv6] and a port. */
typedef struct http_addr {
    char host[64];
    int port;
    int loopback; /* 127.0.0.0/8 or ::1 */
} http_addr;

/* Parses "HOST:PORT", "[V6]:PORT" or ":PORT" (all interfaces).  Returns 0, or -1 with why set. */
int http_addr_parse(const char *s, http_addr *a, char *why, size_t why_size);

/* Parses a host name (letters, digits, - . _), an IPv4 address, or an IPv6 address with or without
 * brackets, into the form the Host check compares: a name in lower case, an address in its
 * canonical form (IPv6 without brackets).  Returns 0, or -1 when it is none of them (or has a port). */
int http_host_parse(const char *s, char *out, size_t size);

/* 0 when token may guard a server: 16 characters or more, not a pattern repeated, and at least 24
 * bits by the entropy of its characters and of the steps between them (which a run such as
 * "0123456789abcdef" lacks).  A random token always passes (16 random hex digits: 31 bits at the
 * least in 100,000 draws); "aaaaaaaaaaaaaaaa", "abababababababab" and "changemechangeme" do not.  -1
 * with why set otherwise. */
int http_token_check(const char *token, char *why, size_t why_size);

/* Reads a token from a file (its first line, surrounding white space removed) and checks it
 * (http_token_check).  Returns a malloc'd string, or NULL with why set (unreadable, or a token that
 * is refused).  warn is set to a warning when other users may read the file, else to "". */
char *http_token_from_file(const char *path, char *why, size_t why_size, char *warn, size_t warn_size);

/* The request a handler sees. */
#define HTTP_PARAM_MAX 16
typedef struct http_req {
    const char *method; /* "GET" (a HEAD is a GET whose answer goes without its body) or "POST" */
    const char *path;
    const char *peer;   /* the client's address, for logs */
    /* 0: called on a thread that reads many connections, which must not wait (answer, or set
     * resp->defer); 1: called again on a worker thread, which may wait for the database. */
    int may_block;
    /* The query parameters (GET) or form fields (POST, application/x-www-form-urlencoded), decoded:
     * the first HTTP_PARAM_MAX names, each with its first value. */
    int nparam;
    char *param_key[HTTP_PARAM_MAX], *param_val[HTTP_PARAM_MAX];
} http_req;

/* A query parameter (GET) or form field (POST); NULL when absent. */
const char *http_param(const http_req *r, const char *key);

/* The response a handler fills in. */
typedef struct http_resp {
    int status;
    const char *content_type;
    const char *location; /* for redirects; must stay valid until the handler's request ends */
    sbuf body;
    int defer; /* set by a handler called with may_block 0: call it again, on a worker thread */
} http_resp;

typedef void (*http_handler)(void *arg, const http_req *req, http_resp *resp);

typedef struct http_server http_server;

/* How a server checks its requests. */
typedef struct http_opts {
    /* When not NULL, every request but GET /healthz must carry "Authorization: Bearer TOKEN" or basic
     * credentials whose password is TOKEN (the scheme in any case).  Wrong credentials are logged
     * (the address and the request, never what was sent), and from the 5th in a row from one address
     * that address waits, 1 s doubling up to 60 s: its requests are answered 429 with Retry-After,
     * right credentials too. */
    const char *token;
    /* Against DNS rebinding: when hosts is not NULL, a request's Host header (if it has one) must
     * name, port aside, one of hosts or allow_hosts, or be an IP address when any_ip is set, else the
     * answer is 421 (GET /healthz excepted); and a POST's Origin, or without one its Referer, must be
     * this server (the Host header's host and port) or a page on one of allow_hosts (any port),
     * else the answer is 403.  Both lists are NULL-terminated; names are compared without case. */
    const char *const *hosts;       /* what the listen address is called: the address, localhost names */
    const char *const *allow_hosts; /* names the operator gave (a proxy's public name); may be NULL */
    int any_ip;                     /* listening on every interface: any IP address is this server */
    int workers;                    /* threads for handlers that defer (0: none may) */
    /* Where refusals worth an audit line go (a POST from another site, slow clients closed); may be NULL. */
    void (*log)(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
} http_opts;

/* Starts serving on a, calling handler for every request that passes the checks of o: first on one
 * of the threads that read every connection (req->may_block 0), where it must answer at once or
 * set resp->defer, and then, when it deferred, on one of o->workers worker threads (may_block 1).
 * Slow and stalled clients cost no thread: a connection has 10 s to send each whole request (head
 * and body), an address at most 32 connections open, the server at most 1,000.  Returns NULL with
 * why set when the address cannot be bound. */
http_server *http_start_opts(const http_addr *a, const http_opts *o, http_handler handler, void *arg, char *why,
                             size_t why_size);

/* The names a server listening on a answers to, for http_opts.hosts (against DNS rebinding): its
 * address, and localhost's names when it listens on loopback or on every interface; *any_ip set when
 * it listens on every interface (then any IP address is this server).  names (NULL-terminated) points
 * into a, which must outlive it. */
#define HTTP_NAMES_MAX 5
void http_listen_names(const http_addr *a, const char *names[HTTP_NAMES_MAX], int *any_ip);

/* http_start_opts with a token, the Host check of http_listen_names and no worker threads: every
 * handler answers at once. */
http_server *http_start(const http_addr *a, const char *token, http_handler handler, void *arg, char *why,
                        size_t why_size);

/* The port the server listens on (the one the system chose when the address asked for port 0). */
int http_port(http_server *s);

/* Stops the server: requests queued for a worker are answered 503, those in progress are waited
 * for. */
void http_stop(http_server *s);

/* Compares two strings in time that depends only on their lengths. */
int http_secret_equal(const char *a, const char *b);

#endif /* PGJOBQ_CLI_HTTP_H */
