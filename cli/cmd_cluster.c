/*
 * cmd_cluster.c - pgjobq cluster: a cluster of shards from the command line (docs/shards.md,
 * "Operations"): init (a new map, installed in every shard and router), show, move-queue,
 * move-partitions and add-shard (the next map, installed everywhere in an order that keeps every
 * producer's job somewhere that accepts it).
 *
 * Every change goes the same way (cluster_change):
 *   1. connect to every database the change touches (the shards of the newest map, the new shards, the
 *      routers) and read each one's map: one that cannot be reached, is not a migrated pgjobq database,
 *      or may not run pgjobq.cluster_set stops the change before anything is written;
 *   2. the newest map found is the current one; the change applied to it is the target (the epoch
 *      grows by one), or the current map itself when it already holds the change (a command run again
 *      after it stopped half-way: it finishes the install, and is a no-op once every database has it);
 *   3. install the target with pgjobq.cluster_set(map, self) where it is missing, in this order: new
 *      shards, the shards that gain work, the shards that neither gain nor lose, the routers, and last
 *      the shards that lose work.  Until the last step the old owner still accepts a moved queue's
 *      jobs (a producer with the old map is not refused), and once it refuses them (PJQ01) every other
 *      database already hands out the new map, so the producer that reloads finds the new owner.
 *      Jobs already on the old owner stay there and are worked there (it drains).
 * A failure during 3 is reported exactly: where the map is installed, where not, and why; running the
 * same command again finishes it.  Every value reaches the databases as a bound parameter; the map's
 * arithmetic is jsonb's, on one of the connections.
 */
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "cli.h"
#include "sbuf.h"

#define OPT_NAME       1110
#define OPT_SHARD      1111
#define OPT_PARTITIONS 1112
#define OPT_ROUTER     1113
#define OPT_ID_FLOOR   1114
#define OPT_TO         1115
#define OPT_MAP_FROM   1116
#define OPT_SPREAD     1117
#define OPT_NUMBER     1118
#define OPT_CHECK      1119
#define OPT_JSON       'j'

const cli_opt cluster_opts[] = {
    {"cluster", OPT_MAP_FROM, "CONNINFO",
     "a shard or router to read the map from (else $PGJOBQ_CLUSTER, else the database: --db ...)"},
    {"name", OPT_NAME, "NAME", "init: the cluster's name"},
    {"shard", OPT_SHARD, "NAME=CONNINFO",
     "init: a shard, in order (numbers 0, 1, ...; partitions spread evenly over them); a conninfo never holds a "
     "password (use ~/.pgpass, a service file or a certificate)"},
    {"partitions", OPT_PARTITIONS, "P", "init: the number of partitions, a power of two from 1 to 4096 (64)"},
    {"id-floor", OPT_ID_FLOOR, "auto|N",
     "init: the highest job id from before the cluster (auto: the highest any shard has handed out)"},
    {"spread", OPT_SPREAD, "QUEUE", "init: a queue spread over the shards by its jobs' routing keys (repeatable)"},
    {"router", OPT_ROUTER, "CONNINFO",
     "a router database to install the map in too (repeatable; routers are not in the map)"},
    {"to", OPT_TO, "SHARD", "move-queue, move-partitions: the shard that gets the work"},
    {"number", OPT_NUMBER, "N", "add-shard: the new shard's number, 0 to 1023 (the next unused)"},
    {"check", OPT_CHECK, NULL, "show: also read every shard's own map and say whether it is the same"},
    {"json", OPT_JSON, NULL, "show: print the map as JSON"},
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};

#define MAX_LIST 1024

/* What the command line said. */
typedef struct cluster_args {
    const cli_cmd *cmd;
    const char *spec, *name, *to, *id_floor;
    const char *shards[MAX_LIST], *routers[MAX_LIST], *spread[MAX_LIST];
    size_t nshards, nrouters, nspread;
    long long partitions, number;
    long long from, upto; /* move-partitions FROM-TO */
    int json, check;
    unsigned given; /* the options given: bit (key - OPT_NAME), and OPT_JSON's as GIVEN_JSON */
} cluster_args;

#define GIVEN_JSON (1u << 31)

/* One database the change touches. */
typedef struct cl_db {
    char *name;     /* the shard's name (malloc'd); NULL for a router */
    char *conninfo; /* malloc'd */
    PGconn *pg;
    char *map; /* its pgjobq.cluster_map() (malloc'd), NULL when it has none */
    int epoch;
    int step;   /* when it is installed (STEP_*) */
    int state;  /* DB_* */
    int opened; /* db_open was run on it */
} cl_db;

enum { STEP_NEW, STEP_GAINS, STEP_SAME, STEP_ROUTER, STEP_LOSES };
enum { DB_BEHIND, DB_DONE, DB_GONE };

typedef struct cl_set {
    cl_db db[2 * MAX_LIST + 16];
    size_t n;
} cl_set;

static int cluster_opt(int key, const char *arg, void *ctx)
{
    cluster_args *a = ctx;
    char why[128];

    a->given |= key == OPT_JSON ? GIVEN_JSON : 1u << (key - OPT_NAME);
    switch (key) {
    case OPT_MAP_FROM: a->spec = arg; return 0;
    case OPT_NAME: a->name = arg; return 0;
    case OPT_TO: a->to = arg; return 0;
    case OPT_ID_FLOOR: a->id_floor = arg; return 0;
    case OPT_JSON: a->json = 1; return 0;
    case OPT_CHECK: a->check = 1; return 0;
    case OPT_PARTITIONS:
        if (cli_parse_int(arg, 1, 4096, &a->partitions, why, sizeof why) != 0 ||
            (a->partitions & (a->partitions - 1)) != 0)
            return cli_usage_error(a->cmd, "--partitions: a power of two from 1 to 4096, not '%s'", arg), -1;
        return 0;
    case OPT_NUMBER:
        if (cli_parse_int(arg, 0, 1023, &a->number, why, sizeof why) != 0)
            return cli_usage_error(a->cmd, "--number: %s", why), -1;
        return 0;
    case OPT_SHARD:
    case OPT_ROUTER:
    case OPT_SPREAD: {
        const char **list = key == OPT_SHARD ? a->shards : key == OPT_ROUTER ? a->routers : a->spread;
        size_t *n = key == OPT_SHARD ? &a->nshards : key == OPT_ROUTER ? &a->nrouters : &a->nspread;
        if (*n >= MAX_LIST)
            return cli_usage_error(a->cmd, "at most %d of each of --shard, --router, --spread", MAX_LIST), -1;
        list[(*n)++] = arg;
        return 0;
    }
    default: return -1;
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Names, conninfos, the databases                                                                  */

/* A name of the map (a cluster, a shard, a queue): pgjobq.identifier's rule, as cluster_set checks it. */
static int is_name(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 64 || !((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z')))
        return 0;
    return strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-") == n;
}

/* 0 when conninfo is one libpq reads and holds no password; else a usage error naming what. */
static int conninfo_ok(const cli_cmd *cmd, const char *what, const char *conninfo)
{
    char *err = NULL;
    PQconninfoOption *opts = PQconninfoParse(conninfo, &err);

    if (opts == NULL) {
        cli_usage_error(cmd, "%s: not a conninfo libpq reads: %s", what, err ? err : "out of memory");
        PQfreemem(err);
        return -1;
    }
    int pw = 0;
    for (PQconninfoOption *o = opts; o->keyword; o++)
        pw |= strcmp(o->keyword, "password") == 0 && o->val != NULL;
    PQconninfoFree(opts);
    if (pw) {
        cli_usage_error(cmd,
                        "%s: a conninfo in the map must not carry a password: every role reads the map. Use "
                        "~/.pgpass, a service file or a client certificate",
                        what);
        return -1;
    }
    return 0;
}

/* "shard \"a\"" or "the router (conninfo)", for messages: a static buffer of two. */
static const char *label(const cl_db *d)
{
    static char buf[2][600];
    static int k;
    char ci[500];
    k ^= 1;
    if (d->name)
        return snprintf(buf[k], sizeof buf[k], "shard \"%s\"", d->name), buf[k];
    /* A router's conninfo is not in the map: it may hold a password (never shown). */
    pgjobq_conninfo_redact(ci, sizeof ci, d->conninfo, d->conninfo);
    snprintf(buf[k], sizeof buf[k], "the router (%s)", ci);
    return buf[k];
}

static cl_db *set_find(cl_set *s, const char *name, const char *conninfo)
{
    for (size_t i = 0; i < s->n; i++)
        if (name ? s->db[i].name && strcmp(s->db[i].name, name) == 0
                 : !s->db[i].name && strcmp(s->db[i].conninfo, conninfo) == 0)
            return &s->db[i];
    return NULL;
}

/* Adds a database (a shard when name is not NULL) unless it is there; NULL when the set is full. */
static cl_db *set_add(cl_set *s, const char *name, const char *conninfo)
{
    cl_db *d = set_find(s, name, conninfo);
    if (d)
        return d;
    if (s->n >= sizeof s->db / sizeof s->db[0])
        return NULL;
    d = &s->db[s->n];
    memset(d, 0, sizeof *d);
    d->name = name ? strdup(name) : NULL;
    d->conninfo = strdup(conninfo);
    if ((name && !d->name) || !d->conninfo) {
        free(d->name);
        free(d->conninfo);
        return NULL;
    }
    s->n++;
    return d;
}

static void set_free(cl_set *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->db[i].name);
        free(s->db[i].conninfo);
        free(s->db[i].map);
        PQfinish(s->db[i].pg);
    }
    s->n = 0;
}

/* libpq's last message on pg without its final newline (a static buffer). */
static const char *pqerr(PGconn *pg)
{
    static char buf[2048];
    snprintf(buf, sizeof buf, "%s", PQerrorMessage(pg));
    for (size_t n = strlen(buf); n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '); n--)
        buf[n - 1] = '\0';
    return buf;
}

/* One statement with bound text parameters; its result (NULL after printing why when it fails). */
static PGresult *run(PGconn *pg, const char *what, const char *sql, int n, const char *const *values)
{
    PGresult *r = PQexecParams(pg, sql, n, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(r) == PGRES_TUPLES_OK || PQresultStatus(r) == PGRES_COMMAND_OK)
        return r;
    cli_err("%s: %s", what, pqerr(pg));
    PQclear(r);
    return NULL;
}

/* The first value of a one-row statement, malloc'd (NULL for SQL NULL); *failed set when it fails. */
static char *value(PGconn *pg, const char *what, const char *sql, int n, const char *const *values, int *failed)
{
    PGresult *r = run(pg, what, sql, n, values);
    char *v = NULL;
    if (r == NULL) {
        *failed = 1;
        return NULL;
    }
    if (PQntuples(r) > 0 && !PQgetisnull(r, 0, 0))
        v = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

/* The exit status for a failed statement on pg (its SQLSTATE), for the change's report. */
static int sql_status(const PGresult *r, PGconn *pg)
{
    const char *st = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    if (PQstatus(pg) != CONNECTION_OK)
        return EX_UNAVAILABLE;
    if (st && strcmp(st, "42501") == 0)
        return EX_NOPERM;
    if (st && (strcmp(st, "55P03") == 0 || strcmp(st, "40001") == 0 || strcmp(st, "40P01") == 0))
        return EX_TEMPFAIL;
    return EX_DATAERR;
}

/* Connects to d and reads its map.  A shard must be a migrated pgjobq database of this version, a
 * router a router (pgjobq migrate --router); either way with pgjobq.cluster_set the user may run when
 * may_set.  0, or an exit status after printing why. */
static int db_open(cl_db *d, int may_set)
{
    /* connect_timeout first: the conninfo's own wins (expand_dbname reads it after). */
    const char *keys[] = {"connect_timeout", "dbname", NULL}, *vals[] = {"10", d->conninfo, NULL};
    PGresult *r;

    d->opened = 1;
    if (d->pg == NULL)
        d->pg = PQconnectdbParams(keys, vals, 1);
    if (PQstatus(d->pg) != CONNECTION_OK) {
        cli_err("%s cannot be reached: %s", label(d), pqerr(d->pg));
        return EX_UNAVAILABLE;
    }
    r = run(d->pg, label(d),
            "SELECT to_regclass('pgjobq.jobs') IS NOT NULL, to_regclass('pgjobq.router_version') IS NOT NULL,"
            "       to_regprocedure('pgjobq.cluster_set(jsonb, text)') IS NOT NULL"
            "       AND has_function_privilege('pgjobq.cluster_set(jsonb, text)', 'EXECUTE')",
            0, NULL);
    if (r == NULL)
        return EX_UNAVAILABLE;
    int jobs = PQgetvalue(r, 0, 0)[0] == 't', router = PQgetvalue(r, 0, 1)[0] == 't',
        can_set = PQgetvalue(r, 0, 2)[0] == 't';
    PQclear(r);
    if (d->name == NULL && (!router || jobs)) {
        cli_err("%s is not a pgjobq router (%s)", label(d),
                jobs ? "it is a shard: it has jobs" : "make one with `pgjobq migrate --router`");
        return EX_CONFIG;
    }
    if (d->name) {
        pgjobq_client *c = NULL;
        int rc = pgjobq_client_wrap(&c, d->pg);
        if (rc != PGJOBQ_OK) {
            cli_err("%s is not a pgjobq database this pgjobq can use: %s%s", label(d),
                    c ? pgjobq_errmsg(c) : pgjobq_strerror(rc),
                    router ? " (it is a router)" : "; run `pgjobq migrate` on it first");
            pgjobq_client_close(c);
            return rc == PGJOBQ_ESCHEMA ? EX_CONFIG : cli_exit_status(rc);
        }
        pgjobq_client_close(c);
    }
    if (may_set && !can_set) {
        cli_err("%s: this user may not run pgjobq.cluster_set: connect as the schema's owner or a member of "
                "pgjobq_admin (PGUSER, or user= in the conninfo)",
                label(d));
        return EX_NOPERM;
    }
    r = run(d->pg, label(d), "SELECT m::text, m ->> 'epoch', m ->> 'self' FROM pgjobq.cluster_map() m", 0, NULL);
    if (r == NULL)
        return EX_UNAVAILABLE;
    /* A conninfo that leads to another shard's database would be refused by cluster_set half-way. */
    if (!PQgetisnull(r, 0, 0) && d->name && !PQgetisnull(r, 0, 2) && strcmp(PQgetvalue(r, 0, 2), d->name) != 0) {
        cli_err("%s's conninfo leads to the database of shard \"%s\": correct the conninfo", label(d),
                PQgetvalue(r, 0, 2));
        PQclear(r);
        return EX_CONFIG;
    }
    if (!PQgetisnull(r, 0, 0) && (d->map = strdup(PQgetvalue(r, 0, 0))) == NULL) {
        PQclear(r);
        return EX_OSERR;
    }
    d->epoch = d->map ? atoi(PQgetvalue(r, 0, 1)) : 0;
    PQclear(r);
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* The maps                                                                                          */

/* The set's newest map (NULL when none has one); -1 with a message when two databases are in
 * different clusters, or hold different maps of one epoch. */
static int newest_map(cl_set *s, const char **out)
{
    cl_db *best = NULL;

    for (size_t i = 0; i < s->n; i++) {
        cl_db *d = &s->db[i];
        if (d->map == NULL)
            continue;
        if (best == NULL) {
            best = d;
            continue;
        }
        const char *v[2] = {best->map, d->map};
        PGresult *r = run(best->pg, "comparing the maps",
                          "SELECT ($1::jsonb ->> 'name') = ($2::jsonb ->> 'name'),"
                          "       ($1::jsonb - 'self') = ($2::jsonb - 'self')"
                          "       OR ($1::jsonb ->> 'epoch')::int <> ($2::jsonb ->> 'epoch')::int",
                          2, v);
        if (r == NULL)
            return -1;
        int same_name = PQgetvalue(r, 0, 0)[0] == 't', consistent = PQgetvalue(r, 0, 1)[0] == 't';
        PQclear(r);
        if (!same_name) {
            cli_err("%s and %s are in different clusters: nothing was changed", label(best), label(d));
            return -1;
        }
        if (!consistent) {
            cli_err("%s and %s hold different maps of the same epoch %d: someone else is changing the map; "
                    "nothing was changed (look with `pgjobq cluster show --check`)",
                    label(best), label(d), d->epoch);
            return -1;
        }
        if (d->epoch > best->epoch)
            best = d;
    }
    *out = best ? best->map : NULL;
    return 0;
}

/* Adds the shards of map to the set (those it has not); 0, or -1 when it is full. */
static int add_shards_of(cl_set *s, PGconn *pg, const char *map)
{
    const char *v[1] = {map};
    PGresult *r = run(pg, "reading the map",
                      "SELECT k, e ->> 'conninfo' FROM jsonb_each($1::jsonb -> 'shards') s(k, e)"
                      " ORDER BY (e ->> 'number')::int",
                      1, v);
    if (r == NULL)
        return -1;
    for (int i = 0; i < PQntuples(r); i++)
        if (set_add(s, PQgetvalue(r, i, 0), PQgetvalue(r, i, 1)) == NULL) {
            PQclear(r);
            cli_err("too many databases");
            return -1;
        }
    PQclear(r);
    return 0;
}

/* Connects every database of the set not connected yet; every one that fails is said; 0 or the exit
 * status of the first failure. */
static int open_all(cl_set *s, int may_set)
{
    int status = 0;
    for (size_t i = 0; i < s->n; i++)
        if (!s->db[i].opened) {
            int st = db_open(&s->db[i], may_set);
            if (st != 0 && status == 0)
                status = st;
        }
    return status;
}

/* The change a command makes to the current map: a new map (malloc'd JSON, its epoch left as the
 * current one's: cluster_change sets it), or NULL after printing why. */
typedef char *(*change_fn)(const cluster_args *a, cl_set *s, PGconn *pg, const char *cur);

/* When each shard is installed: a shard without a map is new; one with a map gains work or loses it
 * from its own map to target (it loses work when a partition it owned, or the partition of a queue
 * pinned on it, goes to another; one that would both gain and lose counts as losing), or neither. */
static int sort_steps(cl_set *s, PGconn *pg, const char *target)
{
    for (size_t i = 0; i < s->n; i++) {
        cl_db *d = &s->db[i];
        if (!d->name || !d->map) {
            d->step = d->name ? STEP_NEW : STEP_ROUTER;
            continue;
        }
        const char *v[3] = {d->map, target, d->name};
        PGresult *r = run(pg, "comparing the maps",
                          "WITH m AS (SELECT $1::jsonb AS c, $2::jsonb AS t),"
                          " p AS (SELECT (t ->> 'partitions')::int AS n FROM m),"
                          " moves AS ("
                          "  SELECT c -> 'owners' ->> i AS was, t -> 'owners' ->> i AS now"
                          "    FROM m, p, generate_series(0, p.n - 1) i"
                          "  UNION ALL"
                          "  SELECT c -> 'owners' ->> coalesce((c -> 'queues' -> q ->> 'partition')::int,"
                          "                                    (pgjobq.route_hash(q) & (p.n - 1))::int),"
                          "         t -> 'owners' ->> coalesce((t -> 'queues' -> q ->> 'partition')::int,"
                          "                                    (pgjobq.route_hash(q) & (p.n - 1))::int)"
                          "    FROM m, p, (SELECT jsonb_object_keys(c -> 'queues') AS q FROM m"
                          "                UNION SELECT jsonb_object_keys(t -> 'queues') FROM m) qs)"
                          " SELECT coalesce(bool_or(now = $3), false), coalesce(bool_or(was = $3), false)"
                          "   FROM moves WHERE was IS DISTINCT FROM now",
                          3, v);
        if (r == NULL)
            return -1;
        d->step = PQgetvalue(r, 0, 1)[0] == 't' ? STEP_LOSES : PQgetvalue(r, 0, 0)[0] == 't' ? STEP_GAINS : STEP_SAME;
        PQclear(r);
    }
    return 0;
}

static const char *const step_names[] = {"a new shard", "gains work", "unchanged", "a router", "loses work"};

/* Installs target in d; 0, or an exit status with why (malloc'd) set. */
static int install(cl_db *d, const char *target, char **why)
{
    const char *v[2] = {target, d->name};
    PGresult *r = PQexecParams(d->pg, "SELECT pgjobq.cluster_set($1::jsonb - 'self', $2)", 2, NULL, v, NULL, NULL, 0);
    if (PQresultStatus(r) == PGRES_TUPLES_OK) {
        PQclear(r);
        return 0;
    }
    int status = sql_status(r, d->pg);
    *why = strdup(pqerr(d->pg));
    PQclear(r);
    return status;
}

/* Says, after a failed install, where the target is and where it is not, and how to finish. */
static void report_partial(cl_set *s, cl_db *order[], size_t n, size_t failed_at, int epoch, const char *why)
{
    sbuf b;
    sb_init(&b);
    sb_printf(&b, "the change stopped half-way: the map of epoch %d could not be installed in %s: %s\n", epoch,
              label(order[failed_at]), why ? why : "out of memory");
    sb_printf(&b, "  installed in:");
    int any = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->db[i].state == DB_DONE) {
            sb_printf(&b, "%s %s", any ? "," : "", label(&s->db[i]));
            any = 1;
        }
    sb_printf(&b, "%s\n  not installed in:", any ? "" : " none");
    for (size_t i = failed_at; i < n; i++)
        sb_printf(&b, "%s %s (%s)", i > failed_at ? "," : "", label(order[i]), step_names[order[i]->step]);
    if (order[failed_at]->step != STEP_LOSES)
        sb_puts(&b, "\nNo shard that loses work has the new map yet: every job still goes to a shard that accepts it.");
    else
        sb_puts(&b, "\nThe shards that lose work and have the new map refuse the moved jobs (PJQ01); a producer that "
                    "reads the map again (from any database that has it) finds the new owner.");
    sb_printf(&b,
              " Once the cause is fixed, run the same command again: it installs the map of epoch %d where it is "
              "missing and changes nothing where it is.",
              epoch);
    cli_err("%s", b.failed ? "the change stopped half-way (out of memory)" : b.data);
    sb_free(&b);
}

/* A queue's schedules do not move with it: says which schedules each shard has of queues it no longer
 * owns (their ticks are refused there, PJQ01). */
static void warn_schedules(cl_set *s)
{
    for (size_t i = 0; i < s->n; i++) {
        cl_db *d = &s->db[i];
        if (!d->name || d->state != DB_DONE)
            continue;
        const char *v[1] = {d->name};
        PGresult *r = PQexecParams(d->pg,
                                   "SELECT string_agg(s.name || ' (queue ' || s.queue || ')', ', ' ORDER BY s.name)"
                                   "  FROM pgjobq.schedule_list() s"
                                   "  JOIN pgjobq.cluster_owners o ON o.partition = pgjobq.route_partition(s.queue)"
                                   " WHERE o.shard <> $1",
                                   1, NULL, v, NULL, NULL, 0);
        if (PQresultStatus(r) == PGRES_TUPLES_OK && !PQgetisnull(r, 0, 0))
            cli_err("%s has schedules of queues it no longer owns: %s. Their ticks are refused there (PJQ01): add "
                    "them on the queue's shard (pgjobq cron add), then remove them here (pgjobq cron rm)",
                    label(d), PQgetvalue(r, 0, 0));
        PQclear(r);
    }
}

/* The databases behind, in the order they are installed (new shards, gainers, the unchanged, routers,
 * losers; in each, the set's order). */
static size_t install_order(cl_set *s, cl_db *order[])
{
    size_t n = 0;
    for (int step = STEP_NEW; step <= STEP_LOSES; step++)
        for (size_t i = 0; i < s->n; i++)
            if (s->db[i].state == DB_BEHIND && s->db[i].step == step)
                order[n++] = &s->db[i];
    return n;
}

static char *init_map(const cluster_args *a, cl_set *s, PGconn *pg, const char *cur);

/* The change: steps 1 to 3 of the comment at the top.  s holds the databases known from the command
 * line (the spec, routers, new shards); what: a sentence for the report ("queue mail moved to b"). */
static int cluster_change(const cluster_args *a, cl_set *s, change_fn change, const char *what)
{
    const char *cur = NULL;
    char *target = NULL, *why = NULL;
    int status, failed = 0;
    cl_db *order[sizeof s->db / sizeof s->db[0]];

    /* 1. Every database of the newest map, until no map names a shard not yet read. */
    for (size_t known = 0; known != s->n;) {
        known = s->n;
        if ((status = open_all(s, 1)) != 0) {
            cli_err("nothing was changed");
            return status;
        }
        if (newest_map(s, &cur) != 0)
            return EX_DATAERR;
        if (cur && add_shards_of(s, s->db[0].pg, cur) != 0)
            return EX_SOFTWARE;
    }
    /* 2. The target. */
    PGconn *pg = s->db[0].pg;
    if (cur == NULL && change != init_map) {
        cli_err("%s has no cluster map, nor has any database named: `pgjobq cluster init` makes one", label(&s->db[0]));
        return EX_DATAERR;
    }
    char *next = change(a, s, pg, cur);
    if (next == NULL)
        return EX_DATAERR;
    if (cur) {
        const char *v[2] = {cur, next};
        target = value(pg, "the next map",
                       "SELECT CASE WHEN ($1::jsonb - 'self' - 'epoch') = ($2::jsonb - 'self' - 'epoch') THEN $1::jsonb"
                       "       ELSE jsonb_set($2::jsonb, '{epoch}', to_jsonb(($1::jsonb ->> 'epoch')::int + 1)) END"
                       "       - 'self'",
                       2, v, &failed);
        free(next);
    } else {
        target = next;
    }
    if (failed || target == NULL)
        return EX_SOFTWARE;
    const char *tv[1] = {target};
    why = value(pg, "checking the map", "SELECT pgjobq.cluster_map_why($1::jsonb)", 1, tv, &failed);
    char *epoch_s = value(pg, "the map", "SELECT $1::jsonb ->> 'epoch'", 1, tv, &failed);
    int epoch = epoch_s ? atoi(epoch_s) : 0;
    free(epoch_s);
    if (failed || why) {
        if (why)
            cli_err("the new map is refused: %s; nothing was changed", why);
        free(why);
        free(target);
        return EX_DATAERR;
    }
    /* Where it is missing, and in which order it goes there. */
    if (sort_steps(s, pg, target) != 0) {
        free(target);
        return EX_SOFTWARE;
    }
    for (size_t i = 0; i < s->n; i++) {
        cl_db *d = &s->db[i];
        const char *v[2] = {target, d->map};
        char *in = d->name ? value(pg, "the map", "SELECT ($1::jsonb -> 'shards') ? $2", 2,
                                   (const char *const[]){target, d->name}, &failed)
                           : strdup("t");
        char *same = d->map ? value(pg, "comparing the maps", "SELECT ($1::jsonb - 'self') = ($2::jsonb - 'self')", 2,
                                    v, &failed)
                            : NULL;
        d->state = in && in[0] != 't' ? DB_GONE : same && same[0] == 't' ? DB_DONE : DB_BEHIND;
        free(in);
        free(same);
        if (!failed && d->state == DB_BEHIND && d->map && d->epoch >= epoch) {
            cli_err("%s has the map of epoch %d, not older than the new one (%d): someone else changed the map "
                    "meanwhile; nothing was changed",
                    label(d), d->epoch, epoch);
            free(target);
            return EX_TEMPFAIL;
        }
    }
    if (failed) {
        free(target);
        return EX_SOFTWARE;
    }
    size_t n = install_order(s, order);
    if (n == 0) {
        int routers = 0;
        for (size_t i = 0; i < s->n; i++)
            routers |= s->db[i].name == NULL;
        printf("nothing to do: every shard%s has the map of epoch %d, in which %s\n", routers ? " and router" : "",
               epoch, what);
        free(target);
        return EX_OK;
    }
    /* 3. Install, in order. */
    for (size_t i = 0; i < n; i++) {
        if ((status = install(order[i], target, &why)) != 0) {
            report_partial(s, order, n, i, epoch, why);
            free(why);
            free(target);
            return status;
        }
        order[i]->state = DB_DONE;
        printf("%s (%s): the map of epoch %d installed\n", label(order[i]), step_names[order[i]->step], epoch);
    }
    printf("cluster at epoch %d: %s\n", epoch, what);
    warn_schedules(s);
    free(target);
    return EX_OK;
}

/* ------------------------------------------------------------------------------------------------ */
/* The changes                                                                                       */

/* The highest job id shard d has handed out (its jobs, its history, its sequence); -1 after printing
 * why. */
static long long highest_id(cl_db *d)
{
    int failed = 0;
    char *v = value(
        d->pg, label(d),
        "SELECT greatest(coalesce((SELECT max(id) FROM pgjobq.jobs), 0),"
        "                coalesce((SELECT max(id) FROM pgjobq.history), 0),"
        "                coalesce(pg_sequence_last_value(pg_get_serial_sequence('pgjobq.jobs', 'id')::regclass), 0))",
        0, NULL, &failed);
    long long id = failed || v == NULL ? -1 : atoll(v);
    free(v);
    if (failed)
        cli_err("the highest job id of %s cannot be read: give --id-floor N (at least its highest id)", label(d));
    return id;
}

/* init: the map of the command line, epoch 1, partitions spread over the shards in order.  The id
 * floor is --id-floor N, or (auto) the highest id a shard without a map has handed out, or the floor
 * a shard's map of this cluster has (init run again after it stopped half-way).  A database already
 * in a cluster is refused unless its map is this one. */
static char *init_map(const cluster_args *a, cl_set *s, PGconn *pg, const char *cur)
{
    long long floor = 0;
    int failed = 0;
    size_t n = a->nshards, p = (size_t)a->partitions;
    sbuf b;

    if (a->id_floor && strcmp(a->id_floor, "auto") != 0) {
        char why[128];
        if (cli_parse_int(a->id_floor, 0, 4611686018427387904LL, &floor, why, sizeof why) != 0) {
            cli_err("--id-floor: %s (or auto)", why);
            return NULL;
        }
    } else {
        for (size_t i = 0; i < s->n; i++) {
            cl_db *d = &s->db[i];
            long long id = 0;
            if (!d->name)
                continue;
            if (d->map) {
                const char *v[1] = {d->map};
                char *f = value(pg, "the map", "SELECT $1::jsonb ->> 'id_floor'", 1, v, &failed);
                id = f ? atoll(f) : 0;
                free(f);
            } else if ((id = highest_id(d)) < 0) {
                return NULL;
            }
            floor = id > floor ? id : floor;
        }
    }
    sb_init(&b);
    sb_puts(&b, "{\"name\": ");
    sb_json(&b, a->name);
    sb_printf(&b, ", \"epoch\": 1, \"partitions\": %zu, \"id_floor\": %lld, \"shards\": {", p, floor);
    for (size_t i = 0; i < n; i++) {
        const char *eq = strchr(a->shards[i], '=');
        sb_printf(&b, "%s", i ? ", " : "");
        char *name = strndup(a->shards[i], (size_t)(eq - a->shards[i]));
        sb_json(&b, name);
        free(name);
        sb_printf(&b, ": {\"number\": %zu, \"conninfo\": ", i);
        sb_json(&b, eq + 1);
        sb_puts(&b, "}");
    }
    sb_puts(&b, "}, \"owners\": [");
    for (size_t i = 0; i < p; i++) {
        const char *o = a->shards[i * n / p], *eq = strchr(o, '=');
        sb_printf(&b, "%s", i ? ", " : "");
        char *name = strndup(o, (size_t)(eq - o));
        sb_json(&b, name);
        free(name);
    }
    sb_puts(&b, "], \"queues\": {");
    for (size_t i = 0; i < a->nspread; i++) {
        sb_printf(&b, "%s", i ? ", " : "");
        sb_json(&b, a->spread[i]);
        sb_puts(&b, ": {\"placement\": \"spread\"}");
    }
    sb_puts(&b, "}}");
    if (b.failed || failed) {
        sb_free(&b);
        return NULL;
    }
    if (cur) {
        const char *v[2] = {cur, b.data};
        char *same =
            value(pg, "comparing the maps", "SELECT ($1::jsonb - 'self') = ($2::jsonb - 'self')", 2, v, &failed);
        int differs = same == NULL || same[0] != 't';
        free(same);
        if (differs && !failed) {
            for (size_t i = 0; i < s->n; i++)
                if (s->db[i].map) {
                    cli_err("%s is in a cluster already (its map is of epoch %d, and not this one): init makes a "
                            "new cluster; change one with move-queue, move-partitions or add-shard (nothing was "
                            "changed)",
                            label(&s->db[i]), s->db[i].epoch);
                    break;
                }
            failed = 1;
        }
    }
    if (failed) {
        sb_free(&b);
        return NULL;
    }
    return b.data;
}

/* move-queue QUEUE --to SHARD: the queue pinned to a partition SHARD owns (the one of SHARD's
 * partitions its hash picks, so that moved queues spread over them), unless its partition is SHARD's
 * already. */
static char *move_queue_map(const cluster_args *a, cl_set *s, PGconn *pg, const char *cur)
{
    const char *v[3] = {cur, a->name, a->to};
    int failed = 0;
    (void)s;
    char *why = value(pg, "the queue",
                      "SELECT CASE WHEN NOT ($1::jsonb -> 'shards') ? $3 THEN format('the map has no shard \"%s\"', $3)"
                      "  WHEN $1::jsonb -> 'queues' -> $2 ->> 'placement' = 'spread'"
                      "    THEN format('queue \"%s\" is spread over the shards by its routing keys: ' ||"
                      "                'move partitions instead (move-partitions)', $2)"
                      "  WHEN NOT $1::jsonb -> 'owners' @> jsonb_build_array($3::text)"
                      "    THEN format('shard \"%s\" owns no partition: give it some first (move-partitions)', $3) END",
                      3, v, &failed);
    if (why || failed) {
        if (why)
            cli_err("%s; nothing was changed", why);
        free(why);
        return NULL;
    }
    char *next =
        value(pg, "the next map",
              "WITH m AS (SELECT $1::jsonb AS m, ($1::jsonb ->> 'partitions')::int AS p),"
              " part AS (SELECT coalesce((m -> 'queues' -> $2 ->> 'partition')::int,"
              "                          (pgjobq.route_hash($2) & (p - 1))::int) AS i FROM m),"
              " mine AS (SELECT i, row_number() OVER (ORDER BY i) - 1 AS k, count(*) OVER () AS n"
              "            FROM m, generate_series(0, m.p - 1) i WHERE m -> 'owners' ->> i = $3)"
              " SELECT CASE WHEN m -> 'owners' ->> part.i = $3 THEN m"
              "        ELSE jsonb_set(m, '{queues}', coalesce(m -> 'queues', '{}') || jsonb_build_object($2::text,"
              "               jsonb_build_object('placement', 'pinned', 'partition',"
              "                 (SELECT i FROM mine WHERE k = pgjobq.route_hash($2) % n)))) END"
              "   FROM m, part",
              3, v, &failed);
    if (failed) {
        free(next);
        return NULL;
    }
    return next;
}

/* move-partitions FROM[-TO] --to SHARD: those partitions' owner is SHARD. */
static char *move_partitions_map(const cluster_args *a, cl_set *s, PGconn *pg, const char *cur)
{
    char from[24], to[24];
    int failed = 0;
    (void)s;
    snprintf(from, sizeof from, "%lld", a->from);
    snprintf(to, sizeof to, "%lld", a->upto);
    const char *v[4] = {cur, from, to, a->to};
    char *why = value(pg, "the partitions",
                      "SELECT CASE WHEN NOT ($1::jsonb -> 'shards') ? $4 THEN format('the map has no shard \"%s\"', $4)"
                      "  WHEN $3::int >= ($1::jsonb ->> 'partitions')::int AND $2::int >= 0"
                      "    THEN format('the map has partitions 0 to %s', ($1::jsonb ->> 'partitions')::int - 1) END",
                      4, v, &failed);
    if (why || failed) {
        if (why)
            cli_err("%s; nothing was changed", why);
        free(why);
        return NULL;
    }
    char *next =
        value(pg, "the next map",
              "SELECT jsonb_set($1::jsonb, '{owners}',"
              "         (SELECT jsonb_agg(CASE WHEN e.i - 1 BETWEEN $2::int AND $3::int THEN to_jsonb($4::text)"
              "                                ELSE e.o END ORDER BY e.i)"
              "            FROM jsonb_array_elements($1::jsonb -> 'owners') WITH ORDINALITY e(o, i)))",
              4, v, &failed);
    if (failed) {
        free(next);
        return NULL;
    }
    return next;
}

/* add-shard NAME=CONNINFO [--number N]: a shard that owns nothing yet (move partitions to it next),
 * numbered N or one above the highest number (else the lowest free). */
static char *add_shard_map(const cluster_args *a, cl_set *s, PGconn *pg, const char *cur)
{
    const char *eq = strchr(a->shards[0], '=');
    char *name = strndup(a->shards[0], (size_t)(eq - a->shards[0]));
    char number[24] = "";
    int failed = 0;
    (void)s;
    if (a->number >= 0)
        snprintf(number, sizeof number, "%lld", a->number);
    const char *v[4] = {cur, name, eq + 1, number[0] ? number : NULL};
    char *why = value(
        pg, "the shard",
        "SELECT CASE WHEN ($1::jsonb -> 'shards') ? $2 AND ($1::jsonb -> 'shards' -> $2 ->> 'conninfo' <> $3"
        "                 OR ($1::jsonb -> 'shards' -> $2 ->> 'number')::int <> coalesce($4::int,"
        "                    ($1::jsonb -> 'shards' -> $2 ->> 'number')::int))"
        "    THEN format('the map has a shard \"%s\" already, with another conninfo or number', $2)"
        "  WHEN NOT ($1::jsonb -> 'shards') ? $2 AND EXISTS (SELECT FROM jsonb_each($1::jsonb -> 'shards') e(k, v)"
        "                                             WHERE (v ->> 'number')::int = $4::int)"
        "    THEN format('number %s is another shard''s', $4) END",
        4, v, &failed);
    if (why || failed) {
        if (why)
            cli_err("%s; nothing was changed", why);
        free(why);
        free(name);
        return NULL;
    }
    char *next = value(
        pg, "the next map",
        "WITH n AS (SELECT array_agg((v ->> 'number')::int) AS used FROM jsonb_each($1::jsonb -> 'shards') e(k, v))"
        " SELECT CASE WHEN ($1::jsonb -> 'shards') ? $2 THEN $1::jsonb"
        "   ELSE jsonb_set($1::jsonb, ARRAY['shards', $2], jsonb_build_object('number',"
        "          coalesce($4::int, (SELECT min(x) FROM generate_series(0, 1023) x"
        "                              WHERE x > (SELECT max(u) FROM unnest(used) u)),"
        "                   (SELECT min(x) FROM generate_series(0, 1023) x WHERE x <> ALL (used))),"
        "          'conninfo', $3::text)) END FROM n",
        4, v, &failed);
    free(name);
    if (failed) {
        free(next);
        return NULL;
    }
    return next;
}

/* ------------------------------------------------------------------------------------------------ */
/* The command                                                                                       */

/* The database the map is read from: --cluster, $PGJOBQ_CLUSTER, else the database (--db ...), as
 * the set's first; its name is its map's self (a router's is NULL).  0, or an exit status. */
static int open_spec(const cluster_args *a, cl_set *s, const char *spec)
{
    int status;
    const char *env = getenv("PGJOBQ_CLUSTER");

    if (spec == NULL)
        spec = a->spec ? a->spec : env && env[0] ? env : NULL;
    if (spec == NULL && (spec = cli_resolve_db(&status)) == NULL)
        return status;
    if (spec[0] == '/' || strncmp(spec, "./", 2) == 0 || strncmp(spec, "file:", 5) == 0) {
        cli_err("pgjobq cluster reads the map from a shard or a router: give its conninfo, not a file");
        return EX_USAGE;
    }
    const char *keys[] = {"connect_timeout", "dbname", NULL}, *vals[] = {"10", spec, NULL};
    PGconn *pg = PQconnectdbParams(keys, vals, 1);
    if (PQstatus(pg) != CONNECTION_OK) {
        cli_err("the cluster's database cannot be reached: %s", pqerr(pg));
        PQfinish(pg);
        return EX_UNAVAILABLE;
    }
    PGresult *r = PQexec(pg, "SELECT to_regclass('pgjobq.jobs') IS NOT NULL, pgjobq.cluster_map() ->> 'self'");
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        cli_err("the cluster's database is no pgjobq shard or router: %s", pqerr(pg));
        PQclear(r);
        PQfinish(pg);
        return EX_CONFIG;
    }
    int shard = PQgetvalue(r, 0, 0)[0] == 't';
    if (shard && PQgetisnull(r, 0, 1)) {
        cli_err("this database has no cluster map: it is a cluster of one (`pgjobq cluster init` makes a cluster)");
        PQclear(r);
        PQfinish(pg);
        return EX_DATAERR;
    }
    cl_db *d = set_add(s, shard ? PQgetvalue(r, 0, 1) : NULL, spec);
    PQclear(r);
    d->pg = pg;
    return 0;
}

/* move-partitions' operand, FROM-TO or one partition, into a->from and a->upto. */
static int parse_range(cluster_args *a, const char *s)
{
    char buf[64], why[128];
    long long lo, hi;
    const char *dash = strchr(s, '-');
    snprintf(buf, sizeof buf, "%.*s", dash ? (int)(dash - s) : (int)strlen(s), s);
    if (cli_parse_int(buf, 0, 4095, &lo, why, sizeof why) != 0 ||
        cli_parse_int(dash ? dash + 1 : buf, 0, 4095, &hi, why, sizeof why) != 0 || hi < lo)
        return cli_usage_error(a->cmd, "partitions: FROM-TO (0-15) or one partition (7), not '%s'", s);
    a->from = lo;
    a->upto = hi;
    return 0;
}

/* The owners as ranges: "0-31 (32)". */
static void print_ranges(sbuf *b, PGresult *owners, const char *shard)
{
    int n = PQntuples(owners), count = 0, first = 1;
    for (int i = 0; i < n; i++) {
        if (strcmp(PQgetvalue(owners, i, 0), shard) != 0)
            continue;
        int j = i;
        while (j + 1 < n && strcmp(PQgetvalue(owners, j + 1, 0), shard) == 0)
            j++;
        sb_printf(b, "%s%d", first ? "" : ",", i);
        if (j > i)
            sb_printf(b, "-%d", j);
        count += j - i + 1;
        first = 0;
        i = j;
    }
    sb_printf(b, "%s (%d)", first ? "none" : "", count);
}

static int cluster_show(const cluster_args *a, cl_set *s)
{
    cl_db *d = &s->db[0];
    int status;

    if ((status = db_open(d, 0)) != 0)
        return status;
    if (d->map == NULL) {
        cli_err("%s has no cluster map", label(d));
        return EX_DATAERR;
    }
    if (a->json && !a->check) {
        printf("%s\n", d->map);
        return EX_OK;
    }
    const char *v[1] = {d->map};
    PGresult *head = run(d->pg, "the map",
                         "SELECT m ->> 'name', m ->> 'epoch', m ->> 'partitions', m ->> 'id_floor', m ->> 'self'"
                         "  FROM (SELECT $1::jsonb AS m) x",
                         1, v);
    PGresult *shards = run(d->pg, "the map",
                           "SELECT k, e ->> 'number', e ->> 'conninfo' FROM jsonb_each($1::jsonb -> 'shards') s(k, e)"
                           " ORDER BY (e ->> 'number')::int",
                           1, v);
    PGresult *owners = run(d->pg, "the map",
                           "SELECT o #>> '{}' FROM jsonb_array_elements($1::jsonb -> 'owners') WITH ORDINALITY e(o, i)"
                           " ORDER BY i",
                           1, v);
    PGresult *queues = run(d->pg, "the map",
                           "SELECT k, e ->> 'placement', e ->> 'partition',"
                           "       $1::jsonb -> 'owners' ->> coalesce((e ->> 'partition')::int,"
                           "                                          (pgjobq.route_hash(k) & (($1::jsonb ->> "
                           "'partitions')::int - 1))::int)"
                           "  FROM jsonb_each($1::jsonb -> 'queues') q(k, e) ORDER BY k",
                           1, v);
    if (!head || !shards || !owners || !queues) {
        PQclear(head);
        PQclear(shards);
        PQclear(owners);
        PQclear(queues);
        return EX_SOFTWARE;
    }
    /* --check: every shard's own map, against this one. */
    for (int i = 0; i < PQntuples(shards); i++)
        if (a->check && set_add(s, PQgetvalue(shards, i, 0), PQgetvalue(shards, i, 2)) == NULL)
            return EX_SOFTWARE;
    int behind = 0;
    if (a->check)
        for (size_t i = 1; i < s->n; i++) {
            cl_db *x = &s->db[i];
            if (db_open(x, 0) != 0)
                x->state = DB_GONE;
            else if (x->epoch == d->epoch)
                x->state = DB_DONE;
            behind |= x->state != DB_DONE || x->epoch != d->epoch;
        }
    sbuf b;
    sb_init(&b);
    sb_printf(&b, "cluster %s, epoch %s, %s partitions, id floor %s (read from %s)\n", PQgetvalue(head, 0, 0),
              PQgetvalue(head, 0, 1), PQgetvalue(head, 0, 2), PQgetvalue(head, 0, 3), label(d));
    for (int i = 0; i < PQntuples(shards); i++) {
        const char *name = PQgetvalue(shards, i, 0);
        sb_printf(&b, "shard %s (number %s): partitions ", name, PQgetvalue(shards, i, 1));
        print_ranges(&b, owners, name);
        sb_printf(&b, ", %s", PQgetvalue(shards, i, 2));
        cl_db *x = a->check ? set_find(s, name, NULL) : NULL;
        if (x && x->state == DB_GONE)
            sb_printf(&b, " [cannot be read]");
        else if (x && x->epoch != d->epoch)
            sb_printf(&b, " [has the map of epoch %d]", x->epoch);
        else if (x)
            sb_printf(&b, " [same map]");
        sb_puts(&b, "\n");
    }
    for (int i = 0; i < PQntuples(queues); i++) {
        sb_printf(&b, "queue %s: %s", PQgetvalue(queues, i, 0), PQgetvalue(queues, i, 1));
        if (strcmp(PQgetvalue(queues, i, 1), "spread") == 0)
            sb_puts(&b, " over the shards by routing key\n");
        else
            sb_printf(&b, " to partition %s (shard %s)\n",
                      PQgetisnull(queues, i, 2) ? "of its hash" : PQgetvalue(queues, i, 2), PQgetvalue(queues, i, 3));
    }
    PQclear(head);
    PQclear(shards);
    PQclear(owners);
    PQclear(queues);
    if (b.failed) {
        sb_free(&b);
        return EX_OSERR;
    }
    if (!a->json)
        fputs(b.data, stdout);
    else
        printf("{\"map\": %s, \"same_everywhere\": %s}\n", d->map, behind ? "false" : "true");
    sb_free(&b);
    if (behind)
        cli_err("not every shard has this map: run the change that made it again to finish it");
    return behind ? EX_TEMPFAIL : EX_OK;
}

#define GIVEN(opt) (1u << ((opt)-OPT_NAME))

/* An option given to an action it means nothing to is a usage error (not silently ignored). */
static int options_fit(const cluster_args *a, const char *action)
{
    static const struct {
        const char *action;
        unsigned allowed;
    } fits[] = {
        {"init", GIVEN(OPT_NAME) | GIVEN(OPT_SHARD) | GIVEN(OPT_PARTITIONS) | GIVEN(OPT_ROUTER) | GIVEN(OPT_ID_FLOOR) |
                     GIVEN(OPT_SPREAD)},
        {"show", GIVEN(OPT_MAP_FROM) | GIVEN(OPT_CHECK) | GIVEN_JSON},
        {"move-queue", GIVEN(OPT_MAP_FROM) | GIVEN(OPT_ROUTER) | GIVEN(OPT_TO)},
        {"move-partitions", GIVEN(OPT_MAP_FROM) | GIVEN(OPT_ROUTER) | GIVEN(OPT_TO)},
        {"add-shard", GIVEN(OPT_MAP_FROM) | GIVEN(OPT_ROUTER) | GIVEN(OPT_NUMBER)},
    };
    for (size_t i = 0; i < sizeof fits / sizeof fits[0]; i++) {
        if (strcmp(action, fits[i].action) != 0)
            continue;
        for (const cli_opt *o = cluster_opts; o->name; o++) {
            unsigned bit = o->key == OPT_JSON                          ? GIVEN_JSON
                           : o->key >= OPT_NAME && o->key <= OPT_CHECK ? GIVEN(o->key)
                                                                       : 0;
            if (bit && (a->given & bit) && !(fits[i].allowed & bit))
                return cli_usage_error(a->cmd, "--%s is not an option of %s", o->name, action), -1;
        }
    }
    return 0;
}

int cmd_cluster(const cli_cmd *cmd, int argc, char **argv)
{
    static cl_set s; /* large: not on the stack */
    cluster_args a = {.cmd = cmd, .partitions = -1, .number = -1};
    int first = cli_parse(cmd, argc, argv, cluster_opt, &a), status;
    char what[600];

    if (first == -2)
        return EX_OK;
    if (first < 0)
        return EX_USAGE;
    if (first >= argc)
        return cli_usage_error(cmd, "expected init, show, move-queue, move-partitions or add-shard");
    const char *action = argv[first];
    int operands = argc - first - 1;
    const char *operand = operands > 0 ? argv[first + 1] : NULL;

    set_free(&s);
    if (options_fit(&a, action) != 0)
        return EX_USAGE;
    if (strcmp(action, "init") == 0) {
        if (operands != 0)
            return cli_usage_error(cmd, "init: unexpected argument '%s'", operand);
        if (a.name == NULL || !is_name(a.name))
            return cli_usage_error(cmd, "init: --name NAME (a letter, then letters, digits, _ . : or -) is needed");
        if (a.nshards == 0)
            return cli_usage_error(cmd, "init: at least one --shard NAME=CONNINFO is needed");
        if (a.partitions < 0)
            a.partitions = 64;
        if ((size_t)a.partitions < a.nshards)
            return cli_usage_error(cmd, "init: %zu shards need at least as many partitions (--partitions)", a.nshards);
        if (a.id_floor && strcmp(a.id_floor, "auto") != 0) {
            char why[128];
            long long floor;
            if (cli_parse_int(a.id_floor, 0, 4611686018427387904LL, &floor, why, sizeof why) != 0)
                return cli_usage_error(cmd, "--id-floor: auto or a number: %s", why);
        }
        for (size_t i = 0; i < a.nspread; i++)
            if (!is_name(a.spread[i]))
                return cli_usage_error(cmd, "--spread: '%s' is not a queue name", a.spread[i]);
        for (size_t i = 0; i < a.nshards; i++) {
            const char *eq = strchr(a.shards[i], '=');
            char name[80];
            snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - a.shards[i]) : 0, a.shards[i]);
            if (eq == NULL || !is_name(name))
                return cli_usage_error(cmd,
                                       "--shard NAME=CONNINFO, NAME a letter, then letters, digits, _ . : or -, "
                                       "not '%.40s'",
                                       a.shards[i]);
            if (conninfo_ok(cmd, a.shards[i], eq + 1) != 0)
                return EX_USAGE;
            if (set_find(&s, name, NULL))
                return cli_usage_error(cmd, "--shard %s is given twice", name);
            for (size_t k = 0; k < s.n; k++)
                if (strcmp(s.db[k].conninfo, eq + 1) == 0)
                    return cli_usage_error(cmd,
                                           "--shard %s and %s have the same conninfo: a shard is a database of its own",
                                           s.db[k].name, name);
            set_add(&s, name, eq + 1);
        }
        for (size_t i = 0; i < a.nrouters; i++)
            set_add(&s, NULL, a.routers[i]);
        snprintf(what, sizeof what, "cluster \"%s\" of %zu shard%s and %lld partitions", a.name, a.nshards,
                 a.nshards == 1 ? "" : "s", a.partitions);
        status = cluster_change(&a, &s, init_map, what);
        set_free(&s);
        return status;
    }
    if (strcmp(action, "show") == 0) {
        if (operands > 1)
            return cli_usage_error(cmd, "show: unexpected argument '%s'", argv[first + 2]);
        if ((status = open_spec(&a, &s, operand)) == 0)
            status = cluster_show(&a, &s);
        set_free(&s);
        return status;
    }
    change_fn change = NULL;
    if (strcmp(action, "move-queue") == 0 || strcmp(action, "move-partitions") == 0) {
        int queue = action[5] == 'q';
        if (operands != 1)
            return cli_usage_error(cmd, "%s: expected %s --to SHARD", action, queue ? "QUEUE" : "FROM-TO");
        if (a.to == NULL)
            return cli_usage_error(cmd, "%s: --to SHARD is needed", action);
        if (queue && !is_name(operand))
            return cli_usage_error(cmd, "move-queue: '%s' is not a queue name", operand);
        if (!queue && parse_range(&a, operand) != 0)
            return EX_USAGE;
        a.name = operand;
        change = queue ? move_queue_map : move_partitions_map;
        int one = queue || strchr(operand, '-') == NULL;
        snprintf(what, sizeof what, "%s %s %s on shard \"%s\"",
                 queue ? "queue"
                 : one ? "partition"
                       : "partitions",
                 operand, one ? "is" : "are", a.to);
    } else if (strcmp(action, "add-shard") == 0) {
        const char *eq = operand ? strchr(operand, '=') : NULL;
        char name[80];
        if (operands != 1 || eq == NULL)
            return cli_usage_error(cmd, "add-shard: expected NAME=CONNINFO");
        snprintf(name, sizeof name, "%.*s", (int)(eq - operand), operand);
        if (!is_name(name))
            return cli_usage_error(cmd, "add-shard: '%s' is not a shard name", name);
        if (conninfo_ok(cmd, name, eq + 1) != 0)
            return EX_USAGE;
        a.shards[0] = operand;
        a.nshards = 1;
        change = add_shard_map;
        snprintf(what, sizeof what,
                 "shard \"%s\" is in the map (it owns no partition until move-partitions gives it some)", name);
    } else {
        return cli_usage_error(cmd, "unknown action '%s' (init, show, move-queue, move-partitions, add-shard)", action);
    }
    if ((status = open_spec(&a, &s, NULL)) == 0) {
        for (size_t i = 0; i < a.nrouters; i++)
            set_add(&s, NULL, a.routers[i]);
        if (change == add_shard_map) {
            const char *eq = strchr(a.shards[0], '=');
            char name[80];
            snprintf(name, sizeof name, "%.*s", (int)(eq - a.shards[0]), a.shards[0]);
            set_add(&s, name, eq + 1);
        }
        status = cluster_change(&a, &s, change, what);
    }
    set_free(&s);
    return status;
}
