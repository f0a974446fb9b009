/*
 * cmd_serve.c - pgjobq serve: Prometheus metrics (serve_metrics.c) and a web dashboard on one HTTP
 * server (http.c, libmicrohttpd).  This file parses the options, starts the server and the collector,
 * and routes each request: the pages (serve_pages.c, with serve_html.c and the page connections of
 * serve_pool.c) and, with --allow-actions, the actions (serve_actions.c).
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "serve_dashboard.h"
#include "serve_log.h"

#define OPT_LISTEN    'l'
#define OPT_AUTH      1001
#define OPT_ACTIONS   1002
#define OPT_HIDE      1003
#define OPT_INTERVAL  1004
#define OPT_HOST      1005
#define OPT_QTIMEOUT  1006
#define OPT_MAPRELOAD 1007

const cli_opt serve_opts[] = {
    {"listen", OPT_LISTEN, "ADDR", "address and port to serve on (default 127.0.0.1:9464; port 0: any free one)"},
    {"auth-file", OPT_AUTH, "FILE",
     "require this token (first line of FILE, 16+ characters) as a bearer token or basic-auth password "
     "(else $PGJOBQ_SERVE_TOKEN); required on a non-loopback address"},
    {"allow-actions", OPT_ACTIONS, NULL, "allow retry, cancel, pause and resume from the dashboard"},
    {"hide-payloads", OPT_HIDE, NULL, "never show payloads or results"},
    {"interval", OPT_INTERVAL, "DURATION", "how often the metrics are collected (default 5s)"},
    {"allow-host", OPT_HOST, "NAME",
     "also answer to this host name (repeatable), e.g. a proxy's public name; pages on it may POST actions"},
    {"query-timeout", OPT_QTIMEOUT, "DURATION",
     "a page's query, lock waits included, gives up after this and the page answers 503 (default 5s)"},
    CLI_CLUSTER_OPT,
    {"map-reload", OPT_MAPRELOAD, "DURATION",
     "with --cluster: read the map again this often (default 30s); a shard that joins is served, one that "
     "leaves is not"},
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};

#define MAX_HOSTS 16 /* --allow-host names */

/* ------------------------------------------------------------------------------------------------ */
/* Routing                                                                                           */

/* With --cluster, a page shows one shard: its links and forms keep it (?shard=NAME, a hidden field). */
static void links_on_shard(sbuf *body, const char *shard)
{
    static const char *const from[] = {"href=\"/jobs?",      "href=\"/jobs\"",    "href=\"/queues\"",
                                       "href=\"/workers?",   "href=\"/workers\"", "value=\"/jobs?",
                                       "value=\"/jobs\"",    "value=\"/queues\"", "value=\"/workers?",
                                       "value=\"/workers\"", "action=\"/jobs\">", "action=\"/actions\">"};
    sbuf b;
    if (body->data == NULL)
        return;
    sb_init(&b);
    for (const char *p = body->data; *p;) {
        size_t k, n = sizeof from / sizeof from[0];
        for (k = 0; k < n; k++)
            if (strncmp(p, from[k], strlen(from[k])) == 0)
                break;
        if (k == n) {
            sb_putn(&b, p, 1);
            p++;
            continue;
        }
        const char *f = from[k];
        size_t len = strlen(f);
        if (f[len - 1] == '>') {
            sb_puts(&b, f);
            sb_puts(&b, "<input type=\"hidden\" name=\"shard\" value=\"");
            sb_html(&b, shard);
            sb_puts(&b, "\">");
        } else {
            sb_putn(&b, f, len - 1);
            sb_puts(&b, "?shard=");
            sb_url(&b, shard);
            sb_puts(&b, f[len - 1] == '?' ? "&amp;" : "\"");
        }
        p += len;
    }
    if (!b.failed) {
        sb_free(body);
        *body = b;
    } else {
        sb_free(&b);
    }
}

/* With --cluster: the shard a page shows, in *shard: a job's page on the shard its id names (an id
 * from before the cluster: the first shard that has it), else ?shard=NAME, else the first.  0 after
 * answering (an unknown shard). */
static int cluster_shard_of(serve *s, const http_req *req, http_resp *out, size_t *shard)
{
    const char *name = serve_param(req, "shard");
    long long id = 0;
    char why[128];

    *shard = 0;
    if (strncmp(req->path, "/jobs/", 6) == 0 && req->path[6] >= '0' && req->path[6] <= '9' &&
        cli_parse_int(req->path + 6, 1, INT64_MAX, &id, why, sizeof why) == 0) {
        size_t at;
        int rc = pgjobq_cluster_route_job(s->cluster, id, &at);
        if (rc == PGJOBQ_OK && at != PGJOBQ_SHARD_ANY) {
            *shard = at;
            return 1;
        }
        if (rc == PGJOBQ_OK) {
            for (size_t i = 0; i < pgjobq_cluster_shards(s->cluster); i++) {
                int slot;
                pgjobq_client *c = serve_pool_get_shard(s, i, &slot);
                if (c == NULL)
                    continue;
                char ids[24];
                snprintf(ids, sizeof ids, "%lld", id);
                const char *v[1] = {ids};
                PGresult *r = PQexecParams(pgjobq_client_conn(c), "SELECT 1 FROM pgjobq.monitor_job($1::bigint)", 1,
                                           NULL, v, NULL, NULL, 0);
                int found = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0;
                PQclear(r);
                serve_pool_put(s, slot);
                if (found) {
                    *shard = i;
                    return 1;
                }
            }
        }
        /* No shard has it (or its number is no shard's): the first shard's page says so. */
        return 1;
    }
    if (name == NULL)
        return 1;
    int i = serve_shard_of(s, name);
    if (i < 0) {
        out->status = 404;
        serve_page_shard = NULL;
        html_page_begin(s, &out->body, "not found", 0);
        sb_puts(&out->body, "<h1>Not found</h1><p>The cluster's map has no shard ");
        sb_html(&out->body, name);
        sb_puts(&out->body, ".</p>");
        html_page_end(&out->body);
        return 0;
    }
    *shard = (size_t)i;
    return 1;
}

/* Called first on a thread that reads connections (req->may_block 0): /healthz, /metrics (from the
 * collector's last text), the stylesheet and refusals are answered there at once, so that pages
 * waiting for the database never delay them.  Everything that queries the database is deferred to
 * a worker (may_block 1), which takes a page connection from the pool. */
static void handle_request(serve *s, const http_req *req, http_resp *out)
{
    int slot;

    serve_page_shard = NULL;

    if (strcmp(req->path, "/healthz") == 0) {
        out->content_type = "text/plain; charset=utf-8";
        sb_puts(&out->body, "ok\n");
        return;
    }
    if (strcmp(req->path, "/metrics") == 0) {
        /* Before the first collection, a worker waits for it (a few seconds at most). */
        char *text = serve_metrics_text(s->metrics, req->may_block ? 3000 : 0);
        if (text == NULL && !req->may_block) {
            out->defer = 1;
            return;
        }
        out->content_type = "text/plain; version=0.0.4; charset=utf-8";
        if (text == NULL) {
            out->status = 503;
            sb_puts(&out->body, "# no collection yet\n");
            return;
        }
        sb_puts(&out->body, text);
        free(text);
        return;
    }
    if (strcmp(req->path, "/static/style.css") == 0) {
        out->content_type = "text/css; charset=utf-8";
        sb_puts(&out->body, serve_css);
        return;
    }
    if (strcmp(req->method, "POST") == 0) {
        if (strcmp(req->path, "/actions") == 0 && !req->may_block)
            out->defer = 1;
        else if (strcmp(req->path, "/actions") == 0)
            serve_action(s, req, out);
        else
            serve_action_result(s, out, 405, "Not allowed", "Only /actions accepts a POST.");
        return;
    }
    int known = strcmp(req->path, "/") == 0 || strcmp(req->path, "/jobs") == 0 ||
                strncmp(req->path, "/jobs/", 6) == 0 || strcmp(req->path, "/queues") == 0 ||
                strcmp(req->path, "/workers") == 0;
    if (!known) {
        out->status = 404;
        html_page_begin(s, &out->body, "not found", 0);
        sb_puts(&out->body, "<h1>Not found</h1><p><a href=\"/\">Overview</a></p>");
        html_page_end(&out->body);
        return;
    }
    if (!req->may_block) {
        out->defer = 1;
        return;
    }
    size_t shard = 0;
    if (s->cluster && strcmp(req->path, "/") == 0 && serve_param(req, "shard") == NULL) {
        serve_page_shard = NULL;
        serve_page_cluster_overview(s, out);
        return;
    }
    if (s->cluster && !cluster_shard_of(s, req, out, &shard))
        return;
    pgjobq_client *c = serve_pool_get_shard(s, shard, &slot);
    if (c == NULL && s->cluster) {
        const char *name = pgjobq_cluster_shard_name(s->cluster, shard);
        out->status = 503;
        serve_page_shard = name;
        html_page_begin(s, &out->body, "shard down", 10);
        sb_puts(&out->body, "<h1>Shard down</h1><p class=\"error\" id=\"shard-down\" data-shard=\"");
        sb_html(&out->body, name);
        sb_puts(&out->body, "\">Shard <strong>");
        sb_html(&out->body, name);
        sb_puts(&out->body, "</strong> is down: it cannot be reached. This page retries every 10 seconds; the other "
                            "shards are shown as usual.</p>");
        html_page_end(&out->body);
        return;
    }
    if (c == NULL) {
        out->status = 503;
        html_page_begin(s, &out->body, "database unavailable", 10);
        sb_puts(&out->body, "<h1>Database unavailable</h1><p class=\"error\">The database cannot be reached; this "
                            "page retries every 10 seconds.</p>");
        html_page_end(&out->body);
        return;
    }
    serve_page_shard = s->cluster ? pgjobq_cluster_shard_name(s->cluster, shard) : NULL;
    if (strcmp(req->path, "/") == 0)
        serve_page_overview(s, c, out);
    else if (strcmp(req->path, "/jobs") == 0)
        serve_page_jobs(s, c, req, out);
    else if (strncmp(req->path, "/jobs/", 6) == 0)
        serve_page_job(s, c, req->path + 6, out);
    else if (strcmp(req->path, "/queues") == 0)
        serve_page_queues(s, c, out);
    else
        serve_page_workers(s, c, req, out);
    serve_pool_put(s, slot);
    if (s->cluster)
        links_on_shard(&out->body, serve_page_shard);
}

/* With --cluster a request reads one map from its start to its end: the reload swaps maps between
 * requests, never during one. */
static void handle(void *arg, const http_req *req, http_resp *out)
{
    serve *s = arg;
    if (!s->clustered) {
        handle_request(s, req, out);
        return;
    }
    pthread_rwlock_rdlock(&s->map_lock);
    handle_request(s, req, out);
    pthread_rwlock_unlock(&s->map_lock);
}

/* ------------------------------------------------------------------------------------------------ */
/* The map, read again while serving (--cluster)                                                     */

/* The shards the metrics collector and the pages work on: copies of the map's names and conninfos,
 * owned here, so that a map read again elsewhere never frees what the collector still reads. */
typedef struct shard_set {
    char **conninfos, **names;
    size_t n;
} shard_set;

static void shard_set_free(shard_set *set)
{
    for (size_t i = 0; i < set->n; i++) {
        free(set->conninfos[i]);
        free(set->names[i]);
    }
    free(set->conninfos);
    free(set->names);
    memset(set, 0, sizeof *set);
}

/* The shards of cl's map into *set (0), or -1 when out of memory (set empty). */
static int shard_set_of(const pgjobq_cluster *cl, shard_set *set)
{
    size_t n = pgjobq_cluster_shards(cl);
    memset(set, 0, sizeof *set);
    set->conninfos = calloc(n ? n : 1, sizeof *set->conninfos);
    set->names = calloc(n ? n : 1, sizeof *set->names);
    if (set->conninfos == NULL || set->names == NULL) {
        free(set->conninfos);
        free(set->names);
        set->conninfos = set->names = NULL;
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        set->conninfos[i] = strdup(pgjobq_cluster_shard_conninfo(cl, i));
        set->names[i] = strdup(pgjobq_cluster_shard_name(cl, i));
        set->n = i + 1;
        if (set->conninfos[i] == NULL || set->names[i] == NULL) {
            shard_set_free(set);
            return -1;
        }
    }
    return 0;
}

static int shard_set_equal(const shard_set *a, const shard_set *b)
{
    if (a->n != b->n)
        return 0;
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->names[i], b->names[i]) != 0 || strcmp(a->conninfos[i], b->conninfos[i]) != 0)
            return 0;
    return 1;
}

static serve_metrics *metrics_on(const shard_set *set, int64_t interval_ms)
{
    return serve_metrics_start((const char *const *)set->conninfos, (const char *const *)set->names, set->n,
                               interval_ms);
}

/*
 * Reads the map again on *probe (the reloader's own handle of the cluster: the pages' is never read
 * while they use it) and, when its epoch is newer than the one served, swaps it in under the map
 * lock: *probe then holds the old map, to be read again next time.  When the shards changed (one
 * joined or left, a conninfo changed), the metrics collector starts anew on the new shards and the
 * page connections are closed (they are opened again as pages need them).  A map that cannot be
 * read keeps the one served, said once in the log until it can be read again.
 */
static void map_reload(serve *s, pgjobq_cluster **probe, shard_set *cur, int64_t interval_ms, int *failing)
{
    int rc;
    if (*probe == NULL) {
        rc = pgjobq_cluster_open(probe, cli_cluster_spec());
        if (rc != PGJOBQ_OK) {
            if (!*failing)
                serve_log("the cluster's map cannot be read again (%s); serving epoch %lld",
                          *probe ? pgjobq_cluster_errmsg(*probe) : pgjobq_strerror(rc),
                          (long long)pgjobq_cluster_epoch(s->cluster));
            *failing = 1;
            pgjobq_cluster_close(*probe);
            *probe = NULL;
            return;
        }
    } else if ((rc = pgjobq_cluster_reload(*probe)) != PGJOBQ_OK) {
        if (!*failing)
            serve_log("the cluster's map cannot be read again (%s); serving epoch %lld",
                      pgjobq_cluster_errmsg(*probe)[0] ? pgjobq_cluster_errmsg(*probe) : pgjobq_strerror(rc),
                      (long long)pgjobq_cluster_epoch(s->cluster));
        *failing = 1;
        return;
    }
    if (*failing)
        serve_log("the cluster's map can be read again");
    *failing = 0;
    int64_t was = pgjobq_cluster_epoch(s->cluster), now = pgjobq_cluster_epoch(*probe);
    if (now <= was)
        return;

    shard_set next;
    serve_metrics *m = NULL;
    if (shard_set_of(*probe, &next) != 0) {
        serve_log("the cluster's map of epoch %lld: out of memory; serving epoch %lld", (long long)now, (long long)was);
        return;
    }
    int same = shard_set_equal(&next, cur);
    if (!same && (m = metrics_on(&next, interval_ms)) == NULL) {
        serve_log("the cluster's map of epoch %lld: cannot start its metrics collector; serving epoch %lld",
                  (long long)now, (long long)was);
        shard_set_free(&next);
        return;
    }

    pthread_rwlock_wrlock(&s->map_lock);
    pgjobq_cluster *old = s->cluster;
    s->cluster = *probe;
    *probe = old;
    serve_metrics *old_m = NULL;
    shard_set gone = next;
    if (!same) {
        old_m = s->metrics;
        s->metrics = m;
        gone = *cur;
        *cur = next;
        s->conninfo = cur->conninfos[0];
        for (int i = 0; i < POOL; i++) { /* no request runs: every connection is free */
            pgjobq_client_close(s->pool[i]);
            s->pool[i] = NULL;
        }
    }
    pthread_rwlock_unlock(&s->map_lock);

    serve_metrics_stop(old_m);
    shard_set_free(&gone);
    serve_log("the cluster's map: epoch %lld (was %lld), %zu shards%s", (long long)now, (long long)was, cur->n,
              same ? "" : ", the shards changed");
}

/* ------------------------------------------------------------------------------------------------ */
/* The command                                                                                       */

typedef struct serve_args {
    const cli_cmd *cmd;
    const char *listen, *auth_file;
    int allow_actions, hide_payloads;
    int64_t interval_ms, query_timeout_ms, map_reload_ms;
    const char *hosts[MAX_HOSTS + 1]; /* --allow-host, NULL-terminated */
    int nhosts;
} serve_args;

static int serve_opt(int key, const char *arg, void *ctx)
{
    serve_args *a = ctx;
    char why[128];

    switch (key) {
    case OPT_LISTEN: a->listen = arg; return 0;
    case OPT_AUTH: a->auth_file = arg; return 0;
    case OPT_ACTIONS: a->allow_actions = 1; return 0;
    case OPT_HIDE: a->hide_payloads = 1; return 0;
    case OPT_INTERVAL:
        if (cli_parse_duration_ms(arg, &a->interval_ms, why, sizeof why) != 0 || a->interval_ms < 100 ||
            a->interval_ms > 3600000) {
            cli_usage_error(a->cmd, "--interval: %s", a->interval_ms ? "must be between 100ms and 1h" : why);
            return -1;
        }
        return 0;
    case OPT_QTIMEOUT:
        if (cli_parse_duration_ms(arg, &a->query_timeout_ms, why, sizeof why) != 0 || a->query_timeout_ms < 100 ||
            a->query_timeout_ms > 600000) {
            cli_usage_error(a->cmd, "--query-timeout: %s",
                            a->query_timeout_ms ? "must be between 100ms and 10min" : why);
            return -1;
        }
        return 0;
    case OPT_MAPRELOAD:
        if (cli_parse_duration_ms(arg, &a->map_reload_ms, why, sizeof why) != 0 || a->map_reload_ms < 100 ||
            a->map_reload_ms > 86400000) {
            cli_usage_error(a->cmd, "--map-reload: %s", a->map_reload_ms ? "must be between 100ms and 1d" : why);
            return -1;
        }
        return 0;
    case OPT_HOST: {
        char host[256];
        if (http_host_parse(arg, host, sizeof host) != 0) {
            cli_usage_error(a->cmd, "--allow-host: '%s' is not a host name or an IP address", arg);
            return -1;
        }
        if (a->nhosts == MAX_HOSTS) {
            cli_usage_error(a->cmd, "--allow-host: at most %d names", MAX_HOSTS);
            return -1;
        }
        a->hosts[a->nhosts++] = arg;
        return 0;
    }
    }
    return -1;
}

int cmd_serve(const cli_cmd *cmd, int argc, char **argv)
{
    serve_args a = {cmd, "127.0.0.1:9464", NULL, 0, 0, 5000, 5000, 30000, {NULL}, 0};
    http_addr addr;
    char why[256];
    char *token = NULL;
    unsigned char rnd[32];
    int first, status = EX_OK;
    serve s;
    shard_set shards = {NULL, NULL, 0};
    pgjobq_cluster *map_probe = NULL; /* --cluster: the map's handle that the reload reads */
    int map_failing = 0;

    first = cli_parse(cmd, argc, argv, serve_opt, &a);
    if (first == -2)
        return EX_OK;
    if (first < 0)
        return EX_USAGE;
    if (first < argc)
        return cli_usage_error(cmd, "unexpected argument '%s'", argv[first]);
    if (http_addr_parse(a.listen, &addr, why, sizeof why) != 0)
        return cli_usage_error(cmd, "--listen: %s", why);
    if (a.auth_file) {
        char warn[512];
        if ((token = http_token_from_file(a.auth_file, why, sizeof why, warn, sizeof warn)) == NULL) {
            cli_err("serve: %s", why);
            return EX_USAGE;
        }
        if (warn[0])
            serve_log("warning: %s", warn);
    } else if (getenv("PGJOBQ_SERVE_TOKEN") && getenv("PGJOBQ_SERVE_TOKEN")[0]) {
        if (http_token_check(getenv("PGJOBQ_SERVE_TOKEN"), why, sizeof why) != 0) {
            cli_err("serve: $PGJOBQ_SERVE_TOKEN: %s", why);
            return EX_USAGE;
        }
        if ((token = strdup(getenv("PGJOBQ_SERVE_TOKEN"))) == NULL)
            return EX_OSERR;
    }
    if (!addr.loopback && token == NULL) {
        cli_err("serve: %s is not a loopback address: require credentials with --auth-file FILE (or "
                "$PGJOBQ_SERVE_TOKEN), or listen on 127.0.0.1",
                a.listen);
        return EX_USAGE;
    }

    memset(&s, 0, sizeof s);
    s.allow_actions = a.allow_actions;
    s.hide_payloads = a.hide_payloads;
    s.query_timeout_ms = a.query_timeout_ms;
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        cli_err("serve: no randomness for the CSRF token: %s", strerror(errno));
        free(token);
        return EX_OSERR;
    }
    for (size_t i = 0; i < sizeof rnd; i++)
        snprintf(s.csrf + 2 * i, 3, "%02x", rnd[i]);
    if (cli_cluster_spec() != NULL) {
        /* Every shard of the map: one that is down now is shown down, not refused. */
        if ((s.cluster = cli_cluster_open(&status)) == NULL) {
            free(token);
            return status;
        }
        if (shard_set_of(s.cluster, &shards) != 0) {
            cli_err("out of memory");
            pgjobq_cluster_close(s.cluster);
            free(token);
            return EX_OSERR;
        }
        s.conninfo = shards.conninfos[0];
        s.clustered = 1;
    } else {
        if ((s.conninfo = cli_resolve_db(&status)) == NULL) {
            free(token);
            return status;
        }
        /* Check the database once before serving: a wrong URL is an error now, not a page later. */
        pgjobq_client *probe = cli_connect(0, &status);
        if (probe == NULL) {
            free(token);
            return status;
        }
        pgjobq_client_close(probe);
    }
    if (serve_pool_init(&s) != 0 || pthread_rwlock_init(&s.map_lock, NULL) != 0) {
        cli_err("serve: cannot make the page connections' lock");
        pgjobq_cluster_close(s.cluster);
        shard_set_free(&shards);
        free(token);
        return EX_OSERR;
    }

    /* Signals are taken by sigwait below; every thread started from here on has them blocked. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    if ((s.metrics = s.cluster ? metrics_on(&shards, a.interval_ms)
                               : serve_metrics_start(&s.conninfo, NULL, 1, a.interval_ms)) == NULL) {
        cli_err("serve: cannot start the metrics collector");
        status = EX_OSERR;
        goto out;
    }
    /* The names this server answers to (against DNS rebinding): those of its address, and --allow-host. */
    const char *names[HTTP_NAMES_MAX];
    http_opts ho;
    memset(&ho, 0, sizeof ho);
    http_listen_names(&addr, names, &ho.any_ip);
    ho.token = token;
    ho.hosts = names;
    ho.allow_hosts = a.hosts;
    ho.workers = POOL;
    ho.log = serve_log;
    http_server *srv = http_start_opts(&addr, &ho, handle, &s, why, sizeof why);
    if (srv == NULL) {
        cli_err("serve: %s", why);
        status = EX_UNAVAILABLE;
        goto out;
    }
    serve_log("listening on http://%s%s%s:%d/ (%s%s%s)", strchr(addr.host, ':') ? "[" : "", addr.host,
              strchr(addr.host, ':') ? "]" : "", http_port(srv), s.allow_actions ? "actions enabled" : "read-only",
              token ? ", credentials required" : "", s.hide_payloads ? ", payloads hidden" : "");
    int sig = 0;
    if (s.clustered) {
        /* Between signals, the map is read again every --map-reload. */
        struct timespec every = {(time_t)(a.map_reload_ms / 1000), (long)(a.map_reload_ms % 1000) * 1000000L};
        while ((sig = sigtimedwait(&sigs, NULL, &every)) < 0)
            map_reload(&s, &map_probe, &shards, a.interval_ms, &map_failing);
    } else {
        sigwait(&sigs, &sig);
    }
    serve_log("stopping (signal %d)", sig);
    http_stop(srv);
out:
    serve_metrics_stop(s.metrics);
    serve_pool_close(&s);
    pthread_rwlock_destroy(&s.map_lock);
    pgjobq_cluster_close(s.cluster);
    pgjobq_cluster_close(map_probe);
    shard_set_free(&shards);
    free(token);
    return status;
}
