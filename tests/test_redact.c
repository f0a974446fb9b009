/*
 * test_redact.c - no password in a message: libpq's errors quote a connection string they cannot
 * parse (whole, or the token they choke on), and the library passes them on.  Every form of password
 * (URL user information, percent-encoded, with an unencoded '@' or '/', a URL parameter, key=value
 * bare or quoted, split by an unquoted blank) through every way out of the library: pgjobq_errmsg
 * after pgjobq_client_open, pgjobq_worker_errmsg after pgjobq_worker_new, pgjobq_conninfo_check,
 * pgjobq_conninfo_redact.  The pgjobq command's side is in test_cli.c.
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* A connection string that fails before any network (no server is reached), and the marker that is
 * part of its password and must appear nowhere. */
typedef struct bad_url {
    const char *url;
    const char *secret;
} bad_url;

static const bad_url bad_urls[] = {
    {"postgresql://alice:Zq7Secret1@[::1/db", "Zq7Secret1"},            /* the whole URL is quoted */
    {"postgres://alice:Zq7Secret2@[::1]x/db", "Zq7Secret2"},            /* postgres://, whole URL */
    {"postgresql://alice:Zq7%zzSecret3@localhost/db", "Secret3"},       /* the bad token is quoted */
    {"postgresql://alice:Zq7%53ecret4%2F%40x@[::1/db", "ecret4"},      /* percent-encoded, whole URL */
    {"postgresql://[::1/db?user=alice&password=Zq7Secret5", "Zq7Secret5"}, /* a URL parameter */
    {"postgresql://[::1]/db?password=pw&Zq7Secret6", "Zq7Secret6"},     /* an unencoded '&' in it */
    {"postgresql://alice:Zq7Secret7/x@[::1]/db", "Zq7Secret7"},         /* an unencoded '/': a "port" */
    {"host=/nonexistent password=pw Zq7Secret8", "Zq7Secret8"},         /* an unquoted blank */
    {"host=/nonexistent password = 'pw Zq7Secret9' 'bogus", "Zq7Secret9"}, /* quoted */
};
#define NBAD (sizeof bad_urls / sizeof bad_urls[0])

static void no_secret(const char *where, const char *text, const bad_url *b)
{
    CHECK_MSG(strstr(text, b->secret) == NULL, "%s for %s shows the password: %s", where, b->url, text);
}

TEST(redact_library_messages_never_hold_the_password)
{
    for (size_t i = 0; i < NBAD; i++) {
        const bad_url *b = &bad_urls[i];
        pgjobq_client *c = NULL;
        pgjobq_worker *w = NULL;
        pgjobq_worker_opts o = PGJOBQ_WORKER_OPTS_INIT;
        char why[512];
        int rc;

        rc = pgjobq_client_open(&c, b->url);
        CHECK_MSG(rc != PGJOBQ_OK, "%s: connected?", b->url);
        CHECK(c != NULL && pgjobq_errmsg(c)[0] != '\0');
        no_secret("pgjobq_errmsg", pgjobq_errmsg(c), b);
        pgjobq_client_close(c);

        /* The worker refuses a string libpq cannot parse at once, rather than retrying it forever. */
        rc = pgjobq_worker_new(&w, b->url, &o);
        if (rc != PGJOBQ_OK) {
            CHECK_INT(rc, PGJOBQ_EINVAL);
            no_secret("pgjobq_worker_errmsg", pgjobq_worker_errmsg(w), b);
        }
        pgjobq_worker_free(w);

        if (pgjobq_conninfo_check(b->url, why, sizeof why) != PGJOBQ_OK)
            no_secret("pgjobq_conninfo_check", why, b);
    }
}

/* The CLI and the worker's log use pgjobq_conninfo_redact; what it does to messages of any shape. */
TEST(redact_conninfo_redact_masks_every_form)
{
    static const struct {
        const char *msg, *conninfo, *expect;
    } cases[] = {
        /* The URL's password, wherever it is quoted, as written or decoded. */
        {"bad: \"postgresql://u:p%40ss@[::1\"", "postgresql://u:p%40ss@[::1", "bad: \"postgresql://u:***@[::1\""},
        {"token \"p@ss\"", "postgresql://u:p%40ss@[::1", "token \"***\""},
        {"port \"tail\"", "postgresql://u:head/tail@h/db", "port \"***\""},
        {"host \"xyz@h\"", "postgresql://u:pw@xyz@h/db", "host \"***@h\""},
        /* key=value: bare, split by a blank, quoted with escapes. */
        {"missing \"=\" after \"half\"", "host=h password=first half", "missing \"=\" after \"***\""},
        {"it's o'brien", "password='o\\'brien'", "it's ***"},
        /* Shapes, without the conninfo: any URL's user information, any password=. */
        {"at postgres://bob:hunter2@db.example/x now", NULL, "at postgres://bob:***@db.example/x now"},
        {"PGPASSWORD=hunter2 and password = 'a b' sslpassword=k&x", NULL,
         "PGPASSWORD=*** and password = '***' sslpassword=***&x"},
        /* Nothing to hide: left as it is, and a short password does not blank out words. */
        {"password authentication failed for user \"bob\"", "postgresql://bob:pw@h/db",
         "password authentication failed for user \"bob\""},
        {"database \"apwb\" does not exist", "password=pw", "database \"apwb\" does not exist"},
        {"no URL here", "postgresql://h/db", "no URL here"},
    };
    char buf[256];

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = pgjobq_conninfo_redact(buf, sizeof buf, cases[i].msg, cases[i].conninfo);
        CHECK_MSG(strcmp(buf, cases[i].expect) == 0, "case %zu: \"%s\", expected \"%s\"", i, buf, cases[i].expect);
        CHECK_INT(n, strlen(cases[i].expect));
    }
    /* Cut to fit, after redacting (a cut password would not match). */
    CHECK_INT(pgjobq_conninfo_redact(buf, 12, "x postgresql://u:secretsecret@h", NULL), 22);
    CHECK_STR(buf, "x postgresq");
    CHECK_INT(pgjobq_conninfo_redact(NULL, 0, "password=x", NULL), 12);
    /* $PGPASSWORD is a password too. */
    setenv("PGPASSWORD", "from-the-env", 1);
    pgjobq_conninfo_redact(buf, sizeof buf, "who said from-the-env?", NULL);
    CHECK_STR(buf, "who said ***?");
    unsetenv("PGPASSWORD");
}
