/*
 * http.h - what `pgjobq serve` and `pgjobq work --metrics-listen` share: an HTTP server on
 * libmicrohttpd (no HTTP parsing of our own), the listen address and its rules, credentials, a
 * growable text buffer, and the escapes HTML, URLs and Prometheus labels need.
 */
#ifndef PGJOBQ_CLI_HTTP_H
#define PGJOBQ_CLI_HTTP_H

#include <stddef.h>
#include <stdint.h>

/* A growable, always NUL-terminated text buffer.  On allocation failure it sets `failed` and keeps
 * what it had; callers check once, at the end. */
typedef struct sbuf {
    char *data;
    size_t len, cap;
    int failed;
} sbuf;

void sb_init(sbuf *b);
void sb_free(sbuf *b);
void sb_putn(sbuf *b, const char *s, size_t n);
void sb_puts(sbuf *b, const char *s);
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as HTML text or attribute value: & < > " ' escaped.  NULL appends nothing. */
void sb_html(sbuf *b, const char *s);
/* s percent-encoded for a URL query value (unreserved characters kept). */
void sb_url(sbuf *b, const char *s);
/* s as a Prometheus label value: \ " and newline escaped. */
void sb_label(sbuf *b, const char *s);

/* A parsed --listen / --metrics-listen address: IPv4 or [IPv6] and a port. */
typedef struct http_addr {
    char host[64];
    int port;
    int loopback; /* 127.0.0.0/8 or ::1 */
} http_addr;

/* Parses "HOST:PORT", "[V6]:PORT" or ":PORT" (all interfaces).  Returns 0, or -1 with why set. */
int http_addr_parse(const char *s, http_addr *a, char *why, size_t why_size);

/* Reads a token from a file (its first line, surrounding white space removed).  Returns a malloc'd
 * string, or NULL with why set (unreadable, empty, or shorter than 16 characters). */
char *http_token_from_file(const char *path, char *why, size_t why_size);

/* The request a handler sees. */
typedef struct http_req {
    void *conn;         /* struct MHD_Connection * */
    const char *method; /* "GET", "POST", ... */
    const char *path;
    const char *peer;   /* the client's address, for logs */
    /* POST bodies (application/x-www-form-urlencoded), decoded: at most HTTP_FORM_MAX fields. */
    int nform;
    char *form_key[16], *form_val[16];
} http_req;
#define HTTP_FORM_MAX 16

/* A query parameter (GET) or form field (POST); NULL when absent. */
const char *http_param(const http_req *r, const char *key);

/* The response a handler fills in. */
typedef struct http_resp {
    int status;
    const char *content_type;
    const char *location; /* for redirects */
    sbuf body;
} http_resp;

typedef void (*http_handler)(void *arg, const http_req *req, http_resp *resp);

typedef struct http_server http_server;

/* Starts serving on a, calling handler (from several threads at once) for every request that passes
 * the credentials check: when token is not NULL, every request but GET (or HEAD) /healthz must carry
 * "Authorization: Bearer TOKEN" or basic credentials whose password is TOKEN, the scheme in any
 * case.  A HEAD is handled as a GET whose answer goes without its body.  Returns NULL with why
 * set when the address cannot be bound. */
http_server *http_start(const http_addr *a, const char *token, http_handler handler, void *arg, char *why,
                        size_t why_size);

/* The port the server listens on (the one the system chose when the address asked for port 0). */
int http_port(http_server *s);

/* Stops the server and waits for the requests in progress. */
void http_stop(http_server *s);

/* Compares two strings in time that depends only on their lengths. */
int http_secret_equal(const char *a, const char *b);

#endif /* PGJOBQ_CLI_HTTP_H */
