/*
 * connect.c - from the configured database to an open client: the URL checked before anything
 * connects (else the embedded database), the connection, and the exit status a failure maps to.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cli_exit_status(int code)
{
    switch (code) {
    case PGJOBQ_OK: return EX_OK;
    case PGJOBQ_EINVAL:
    case PGJOBQ_ENOTFOUND:
    case PGJOBQ_ESTATE:
    case PGJOBQ_EDUPLICATE: return EX_DATAERR;
    case PGJOBQ_ECONN: return EX_UNAVAILABLE;
    case PGJOBQ_ESCHEMA: return EX_CONFIG;
    case PGJOBQ_EPERM: return EX_NOPERM;
    case PGJOBQ_ECONFLICT:
    case PGJOBQ_ETIMEOUT: return EX_TEMPFAIL;
    default: return EX_SOFTWARE;
    }
}

int cli_fail(pgjobq_client *c, int code)
{
    const char *msg = pgjobq_errmsg(c);
    cli_err("%s", msg && msg[0] ? msg : pgjobq_strerror(code));
    return cli_exit_status(code);
}

/* 0 when url reads as a PostgreSQL URL (postgresql:// or postgres://) or a conninfo (key=value
 * pairs); -1 with why set otherwise.  The value itself is never quoted: it may hold a password. */
static int db_url_check(const char *url, char *why, size_t why_size)
{
    const char *scheme_end = strstr(url, "://");
    size_t key = strspn(url, " \t");

    if (url[key] == '\0') {
        snprintf(why, why_size, "it is empty");
        return -1;
    }
    if (strncmp(url, "postgresql://", 13) == 0 || strncmp(url, "postgres://", 11) == 0)
        return 0;
    const char *eq = strchr(url, '=');
    if (scheme_end != NULL && (eq == NULL || eq > scheme_end)) {
        snprintf(why, why_size, "it is a %.*s:// URL, not postgresql://",
                 (int)(scheme_end - url < 20 ? scheme_end - url : 20), url);
        return -1;
    }
    /* conninfo: the first word is key=value with a known-looking key. */
    size_t klen = strspn(url + key, "abcdefghijklmnopqrstuvwxyz_");
    if (klen > 0 && url[key + klen + strspn(url + key + klen, " \t")] == '=')
        return 0;
    snprintf(why, why_size, "it is neither a postgresql:// URL nor a conninfo (host=... dbname=...)");
    return -1;
}

/* A URL that is not PostgreSQL's, or that libpq cannot parse, is a configuration error, said before
 * anything connects (a worker would retry it forever), naming where it came from but not its value
 * (it may hold a password). */
const char *cli_resolve_db(int *status)
{
    const char *url = cli_database_url();
    char why[512];
    int rc;

    *status = EX_OK;
    if (url == NULL)
        return cli_embedded_conninfo(status);
    if (db_url_check(url, why, sizeof why) != 0) {
        cli_err("the database URL (%s) is not usable: %s", cli_database_source(), why);
        *status = EX_CONFIG;
        return NULL;
    }
    if ((rc = pgjobq_conninfo_check(url, why, sizeof why)) != PGJOBQ_OK) {
        cli_err("the database URL (%s) is not valid: %s", cli_database_source(), why);
        *status = rc == PGJOBQ_ENOMEM ? EX_OSERR : EX_CONFIG;
        return NULL;
    }
    return url;
}

pgjobq_client *cli_connect(int allow_unmigrated, int *status)
{
    const char *url = cli_resolve_db(status);
    pgjobq_client *c = NULL;
    int rc;

    if (url == NULL)
        return NULL;
    rc = pgjobq_client_open(&c, url);
    if (rc == PGJOBQ_OK || (allow_unmigrated && rc == PGJOBQ_ESCHEMA && c != NULL)) {
        *status = EX_OK;
        return c;
    }
    *status = cli_fail(c, rc);
    if (rc == PGJOBQ_ECONN && cli_database_url() != NULL)
        cli_err("(the database URL came from %s)", cli_database_source());
    pgjobq_client_close(c);
    return NULL;
}

/* The cluster a shard's client handed out by cli_connect_for_id belongs to: closed with it. */
static pgjobq_cluster *owner_cluster;
static pgjobq_client *owner_client;
static size_t owner_shard;

void cli_shard_down(const char *name, const char *why)
{
    size_t len = strlen(name);
    if (strncmp(why, "shard ", 6) == 0 && strncmp(why + 6, name, len) == 0 && strncmp(why + 6 + len, ": ", 2) == 0)
        why += 6 + len + 2;
    cli_err("shard %s: down (%s)", name, why);
}

int cli_cluster_fail(pgjobq_cluster *cl, int code)
{
    const char *msg = pgjobq_cluster_errmsg(cl);
    cli_err("%s", msg && msg[0] ? msg : pgjobq_strerror(code));
    return cli_exit_status(code);
}

pgjobq_cluster *cli_cluster_open(int *status)
{
    const char *spec = cli_cluster_spec();
    pgjobq_cluster *cl = NULL;
    int rc = pgjobq_cluster_open(&cl, spec ? spec : "");

    if (rc == PGJOBQ_OK) {
        *status = EX_OK;
        return cl;
    }
    if (cl == NULL)
        cli_err("out of memory");
    else
        cli_err("the cluster (%s): %s", cli_cluster_arg ? "--cluster" : "$PGJOBQ_CLUSTER",
                pgjobq_cluster_errmsg(cl)[0] ? pgjobq_cluster_errmsg(cl) : pgjobq_strerror(rc));
    *status = rc == PGJOBQ_EINVAL ? EX_CONFIG : cli_exit_status(rc);
    pgjobq_cluster_close(cl);
    return NULL;
}

pgjobq_client *cli_connect_for_id(int64_t id, int *status)
{
    pgjobq_cluster *cl;
    pgjobq_client *c = NULL;
    size_t s;
    int rc;

    if (cli_cluster_spec() == NULL)
        return cli_connect(0, status);
    if ((cl = cli_cluster_open(status)) == NULL)
        return NULL;
    rc = pgjobq_cluster_route_job(cl, id, &s);
    if (rc == PGJOBQ_ENOTFOUND) {
        cli_err("no job %lld: its id names shard number %lld, which the cluster's map does not have", (long long)id,
                (long long)(id % 1024));
        *status = EX_DATAERR;
    } else if (rc != PGJOBQ_OK) {
        *status = cli_cluster_fail(cl, rc);
    } else if (s != PGJOBQ_SHARD_ANY) {
        if ((rc = pgjobq_cluster_client(cl, s, &c)) != PGJOBQ_OK)
            *status = cli_cluster_fail(cl, rc);
    } else {
        /* An id from before the cluster: any shard may hold it; the first that does. */
        size_t down = 0, n = pgjobq_cluster_shards(cl);
        pgjobq_client *any = NULL;
        for (size_t i = 0; i < n && c == NULL; i++) {
            pgjobq_client *sc;
            pgjobq_job *j = NULL;
            if (pgjobq_cluster_client(cl, i, &sc) != PGJOBQ_OK) {
                cli_shard_down(pgjobq_cluster_shard_name(cl, i), pgjobq_cluster_errmsg(cl));
                down++;
                continue;
            }
            if (any == NULL) {
                any = sc;
                s = i;
            }
            if (pgjobq_job_get(sc, id, &j) == PGJOBQ_OK) {
                c = sc;
                s = i;
            }
            pgjobq_jobs_free(j);
        }
        if (c == NULL && down == n) {
            cli_err("no shard of the cluster answered");
            *status = EX_UNAVAILABLE;
        } else if (c == NULL) {
            c = any; /* no shard has it: the command says so */
            if (down)
                cli_err("note: job %lld may be on a shard that is down", (long long)id);
        }
    }
    if (c == NULL) {
        pgjobq_cluster_close(cl);
        return NULL;
    }
    owner_cluster = cl;
    owner_client = c;
    owner_shard = s;
    *status = EX_OK;
    return c;
}

void cli_close(pgjobq_client *c)
{
    if (c != NULL && c == owner_client) {
        pgjobq_cluster_close(owner_cluster);
        owner_cluster = NULL;
        owner_client = NULL;
        return;
    }
    pgjobq_client_close(c);
}

const char *cli_shard_of(const pgjobq_client *c)
{
    return c != NULL && c == owner_client ? pgjobq_cluster_shard_name(owner_cluster, owner_shard) : NULL;
}
