/*
 * cluster.c - a client over a cluster of shards (docs/shards.md): the map, read from a database
 * (pgjobq.cluster_map()) or a JSON file, each job routed by it as pgjobq.route_partition routes
 * (sql/functions/cluster.sql), a client per shard opened when first needed, and the enqueues that
 * route, split a batch per shard, and read the map again when a shard refuses a job with PJQ01.
 *
 * A database without a map is a cluster of one shard: the connection the cluster was opened on, with
 * nothing computed or asked per call beyond what pgjobq_enqueue does.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAP_FILE_MAX (16 * 1024 * 1024) /* a map of 4096 partitions and many queues is far below it */

typedef struct cl_shard {
    char *name;
    int number;     /* 0 .. 1023: the shard's job ids end in it (id % 1024) */
    char *conninfo; /* as the map gives it */
    pgjobq_client *client;
} cl_shard;

typedef struct cl_queue {
    char *name;
    int spread;
    int partition; /* a pinned queue's partition by the map; -1: route_hash(queue) & (P - 1) */
} cl_queue;

typedef struct cl_map {
    int mapped; /* 0: a database without a map, one shard */
    int64_t epoch, id_floor;
    uint32_t partitions;
    char *self; /* the shard the map was read from (NULL: the router, a file, or no map) */
    size_t nshards, nqueues;
    cl_shard *shards;
    uint16_t *owners;        /* partition -> index in shards */
    cl_queue *queues;        /* sorted by name */
    int16_t by_number[1024]; /* shard number -> index in shards, -1: none */
} cl_map;

struct pgjobq_cluster {
    char *spec;          /* as given to pgjobq_cluster_open */
    char *file;          /* the map file's path, or NULL */
    pgjobq_client *home; /* the connection the cluster was opened on (NULL for a file) */
    int home_usable;     /* home has a pgjobq schema this library uses (else: a router) */
    cl_map map;
    char errmsg[1024];
    char sqlstate[6];
};

/* ---- errors ---------------------------------------------------------------------------------------- */

static int cl_err(pgjobq_cluster *cl, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int cl_err(pgjobq_cluster *cl, int code, const char *fmt, ...)
{
    char raw[sizeof cl->errmsg];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    pgjobq_conninfo_redact(cl->errmsg, sizeof cl->errmsg, raw, cl->spec);
    return code;
}

static void cl_clearerr(pgjobq_cluster *cl)
{
    cl->errmsg[0] = '\0';
    cl->sqlstate[0] = '\0';
}

/* The error of a shard's client as the cluster's: "shard NAME: message", its SQLSTATE kept. */
static int shard_err(pgjobq_cluster *cl, const char *name, pgjobq_client *c, int code)
{
    snprintf(cl->sqlstate, sizeof cl->sqlstate, "%s", c ? pgjobq_sqlstate(c) : "");
    return cl_err(cl, code, "shard %s: %s", name, c ? pgjobq_errmsg(c) : pgjobq_strerror(code));
}

/* ---- reading the map (JSON known to be valid: pgjobq__json_check first) ----------------------------- */

static const char *ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    return p;
}

static const char *skip_string(const char *p)
{
    for (p++; *p && *p != '"'; p += *p == '\\' && p[1] ? 2 : 1) {
    }
    return *p == '"' ? p + 1 : p;
}

/* Past the value at p (valid JSON). */
static const char *skip_value(const char *p)
{
    int depth = 0;
    do {
        if (*p == '"') {
            p = skip_string(p);
            continue;
        }
        if (*p == '{' || *p == '[')
            depth++;
        else if (*p == '}' || *p == ']')
            depth--;
        else if (depth == 0) { /* a scalar */
            while (*p && !strchr(",}] \t\r\n", *p))
                p++;
            return p;
        }
        p++;
    } while (*p && depth > 0);
    return p;
}

/* The members of an object, or the elements of an array, one by one: *it starts at the '{' or '['.
 * 1 with the next (key: NULL for an array's), 0 at the end. */
static int next_item(const char **it, const char **key, size_t *klen, const char **val)
{
    const char *p = ws(*it);
    if (*p == '{' || *p == '[' || *p == ',')
        p = ws(p + 1);
    if (*p == '}' || *p == ']' || *p == '\0')
        return 0;
    if (key) {
        *key = p + 1;
        const char *end = skip_string(p);
        *klen = (size_t)(end - 1 - *key);
        p = ws(ws(end) + 1); /* past ':' */
    }
    *val = p;
    *it = ws(skip_value(p));
    return 1;
}

static int is_type(const char *v, char c)
{
    return *ws(v) == c;
}

/* A JSON string's text (valid JSON), malloc'd; NULL when v is no string or out of memory. */
static char *unquote(const char *v)
{
    pgjobq__buf b = {0};
    const char *p = ws(v);

    if (*p++ != '"')
        return NULL;
    while (*p && *p != '"') {
        if (*p != '\\') {
            pgjobq__buf_put(&b, p++, 1);
            continue;
        }
        p++;
        char e = *p++;
        switch (e) {
        case 'n': pgjobq__buf_put(&b, "\n", 1); break;
        case 't': pgjobq__buf_put(&b, "\t", 1); break;
        case 'r': pgjobq__buf_put(&b, "\r", 1); break;
        case 'b': pgjobq__buf_put(&b, "\b", 1); break;
        case 'f': pgjobq__buf_put(&b, "\f", 1); break;
        case 'u': {
            unsigned cp = (unsigned)strtoul((char[5]){p[0], p[1], p[2], p[3], 0}, NULL, 16);
            p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p[0] == '\\' && p[1] == 'u') {
                unsigned lo = (unsigned)strtoul((char[5]){p[2], p[3], p[4], p[5], 0}, NULL, 16);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            }
            char u[4];
            size_t n;
            if (cp == 0)
                cp = ' '; /* a NUL would end the text */
            if (cp < 0x80) {
                u[0] = (char)cp;
                n = 1;
            } else if (cp < 0x800) {
                u[0] = (char)(0xC0 | (cp >> 6));
                u[1] = (char)(0x80 | (cp & 0x3F));
                n = 2;
            } else if (cp < 0x10000) {
                u[0] = (char)(0xE0 | (cp >> 12));
                u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
                u[2] = (char)(0x80 | (cp & 0x3F));
                n = 3;
            } else {
                u[0] = (char)(0xF0 | (cp >> 18));
                u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
                u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
                u[3] = (char)(0x80 | (cp & 0x3F));
                n = 4;
            }
            pgjobq__buf_put(&b, u, n);
            break;
        }
        default: pgjobq__buf_put(&b, &e, 1); break;
        }
    }
    pgjobq__buf_put(&b, "", 1);
    if (b.oom) {
        pgjobq__buf_free(&b);
        return NULL;
    }
    return b.data;
}

/* An integer value from lo to hi into *out; 0 when it is not one. */
static int integer(const char *v, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    const char *p = ws(v);
    errno = 0;
    long long x = strtoll(p, &end, 10);
    if (end == p || errno == ERANGE || (*end && !strchr(",}] \t\r\n", *end)) || x < lo || x > hi)
        return 0;
    *out = x;
    return 1;
}

static void map_free(cl_map *m)
{
    for (size_t i = 0; i < m->nshards; i++) {
        free(m->shards[i].name);
        free(m->shards[i].conninfo);
    }
    for (size_t i = 0; i < m->nqueues; i++)
        free(m->queues[i].name);
    free(m->shards);
    free(m->queues);
    free(m->owners);
    free(m->self);
    memset(m, 0, sizeof *m);
}

static int queue_cmp(const void *a, const void *b)
{
    return strcmp(((const cl_queue *)a)->name, ((const cl_queue *)b)->name);
}

static int key_is(const char *key, size_t klen, const char *want)
{
    return klen == strlen(want) && memcmp(key, want, klen) == 0;
}

/* Parses a map (pgjobq.cluster_map()'s JSON) into *m; on error, the reason into why. */
static int map_parse(const char *json, cl_map *m, char *why, size_t why_size)
{
    const char *it, *key, *v, *shards = NULL, *owners = NULL, *queues = NULL;
    size_t klen;
    int64_t x;

#define BAD(...)                              \
    do {                                      \
        snprintf(why, why_size, __VA_ARGS__); \
        map_free(m);                          \
        return PGJOBQ_EINVAL;                 \
    } while (0)

    memset(m, 0, sizeof *m);
    m->partitions = 64;
    if (pgjobq__json_check(json, strlen(json), why, why_size) != PGJOBQ_OK)
        return PGJOBQ_EINVAL;
    if (!is_type(json, '{'))
        BAD("the map is not a JSON object");
    int have_epoch = 0;
    for (it = ws(json); next_item(&it, &key, &klen, &v);) {
        if (key_is(key, klen, "epoch")) {
            if (!integer(v, 1, INT32_MAX, &m->epoch))
                BAD("\"epoch\" must be an integer from 1 to 2147483647");
            have_epoch = 1;
        } else if (key_is(key, klen, "partitions")) {
            if (!integer(v, 1, 4096, &x) || (x & (x - 1)) != 0)
                BAD("\"partitions\" must be a power of two from 1 to 4096");
            m->partitions = (uint32_t)x;
        } else if (key_is(key, klen, "id_floor")) {
            if (!integer(v, 0, INT64_MAX, &m->id_floor))
                BAD("\"id_floor\" must be an integer, 0 or more");
        } else if (key_is(key, klen, "self")) {
            if (is_type(v, '"') && (m->self = unquote(v)) == NULL)
                BAD("out of memory");
        } else if (key_is(key, klen, "shards"))
            shards = v;
        else if (key_is(key, klen, "owners"))
            owners = v;
        else if (key_is(key, klen, "queues"))
            queues = v;
    }
    if (!have_epoch)
        BAD("the map has no \"epoch\"");
    if (shards == NULL || !is_type(shards, '{'))
        BAD("\"shards\" must be an object of shards, each {\"number\": N, \"conninfo\": \"...\"}");
    for (it = ws(shards); next_item(&it, &key, &klen, &v);)
        m->nshards++;
    if (m->nshards == 0 || m->nshards > 1024)
        BAD("\"shards\" must name 1 to 1024 shards");
    if ((m->shards = calloc(m->nshards, sizeof *m->shards)) == NULL)
        BAD("out of memory");
    for (int i = 0; i < 1024; i++)
        m->by_number[i] = -1;
    size_t n = 0;
    for (it = ws(shards); next_item(&it, &key, &klen, &v); n++) {
        cl_shard *s = &m->shards[n];
        const char *sit, *skey, *sv, *number = NULL, *conninfo = NULL;
        size_t sklen;
        if ((s->name = malloc(klen + 1)) == NULL)
            BAD("out of memory");
        memcpy(s->name, key, klen);
        s->name[klen] = '\0';
        if (!is_type(v, '{'))
            BAD("shard \"%s\" must be {\"number\": N, \"conninfo\": \"...\"}", s->name);
        for (sit = ws(v); next_item(&sit, &skey, &sklen, &sv);) {
            if (key_is(skey, sklen, "number"))
                number = sv;
            else if (key_is(skey, sklen, "conninfo"))
                conninfo = sv;
        }
        if (number == NULL || !integer(number, 0, 1023, &x))
            BAD("shard \"%s\": \"number\" must be an integer from 0 to 1023", s->name);
        s->number = (int)x;
        if (m->by_number[s->number] >= 0)
            BAD("shards \"%s\" and \"%s\" have one number, %d", m->shards[m->by_number[s->number]].name, s->name,
                s->number);
        m->by_number[s->number] = (int16_t)n;
        if (conninfo == NULL || !is_type(conninfo, '"') || (s->conninfo = unquote(conninfo)) == NULL)
            BAD("shard \"%s\": \"conninfo\" must be a string", s->name);
    }
    if (owners == NULL || !is_type(owners, '['))
        BAD("\"owners\" must be an array of %u shard names, the owner of each partition", m->partitions);
    if ((m->owners = calloc(m->partitions, sizeof *m->owners)) == NULL)
        BAD("out of memory");
    n = 0;
    for (it = ws(owners); next_item(&it, NULL, NULL, &v); n++) {
        char *name = is_type(v, '"') ? unquote(v) : NULL;
        size_t k = 0;
        while (name && k < m->nshards && strcmp(m->shards[k].name, name) != 0)
            k++;
        free(name);
        if (n >= m->partitions || name == NULL || k == m->nshards)
            BAD("\"owners\" must be an array of %u shard names, the owner of each partition (owners[%zu] is not)",
                m->partitions, n);
        m->owners[n] = (uint16_t)k;
    }
    if (n != m->partitions)
        BAD("\"owners\" must be an array of %u shard names, the owner of each partition", m->partitions);
    if (queues && is_type(queues, '{')) {
        for (it = ws(queues); next_item(&it, &key, &klen, &v);)
            m->nqueues++;
        if (m->nqueues && (m->queues = calloc(m->nqueues, sizeof *m->queues)) == NULL)
            BAD("out of memory");
        n = 0;
        for (it = ws(queues); next_item(&it, &key, &klen, &v); n++) {
            cl_queue *q = &m->queues[n];
            const char *qit, *qkey, *qv;
            size_t qklen;
            char *place = NULL;
            if ((q->name = malloc(klen + 1)) == NULL)
                BAD("out of memory");
            memcpy(q->name, key, klen);
            q->name[klen] = '\0';
            q->partition = -1;
            if (!is_type(v, '{'))
                BAD("queue \"%s\": must be {\"placement\": \"pinned\" or \"spread\"}", q->name);
            for (qit = ws(v); next_item(&qit, &qkey, &qklen, &qv);) {
                if (key_is(qkey, qklen, "placement") && is_type(qv, '"')) {
                    free(place);
                    place = unquote(qv);
                } else if (key_is(qkey, qklen, "partition")) {
                    if (!integer(qv, 0, m->partitions - 1, &x)) {
                        free(place);
                        BAD("queue \"%s\": \"partition\" must be an integer from 0 to %u", q->name, m->partitions - 1);
                    }
                    q->partition = (int)x;
                }
            }
            q->spread = place && strcmp(place, "spread") == 0;
            int ok = place && (q->spread || strcmp(place, "pinned") == 0);
            free(place);
            if (!ok)
                BAD("queue \"%s\": \"placement\" must be \"pinned\" or \"spread\"", q->name);
        }
        if (m->nqueues > 1)
            qsort(m->queues, m->nqueues, sizeof *m->queues, queue_cmp);
    }
    m->mapped = 1;
    return PGJOBQ_OK;
#undef BAD
}

/* The one-shard map of a database without one: shard `name`, spec's database. */
static int map_single(cl_map *m, const char *name, const char *conninfo)
{
    memset(m, 0, sizeof *m);
    m->partitions = 1;
    m->nshards = 1;
    m->shards = calloc(1, sizeof *m->shards);
    m->owners = calloc(1, sizeof *m->owners);
    if (m->shards == NULL || m->owners == NULL || (m->shards[0].name = strdup(name)) == NULL ||
        (m->shards[0].conninfo = strdup(conninfo)) == NULL) {
        map_free(m);
        return PGJOBQ_ENOMEM;
    }
    for (int i = 0; i < 1024; i++)
        m->by_number[i] = -1;
    m->by_number[0] = 0;
    return PGJOBQ_OK;
}

/* The map as text from a client's database (malloc'd into *json; NULL when the database has none).
 * Errors are the client's. */
static int read_map(pgjobq_client *c, char **json)
{
    static const pgjobq__stmt st = {
        "read the cluster map", "SELECT pgjobq.cluster_map()::pg_catalog.text", 0, NULL, NULL, NULL, NULL, 0};
    PGresult *r = NULL;
    int rc = pgjobq__exec(c, &st, &r);

    *json = NULL;
    if (rc != PGJOBQ_OK) {
        /* A database without the map's function (no schema, or one older than the map): no map. */
        if (strcmp(pgjobq_sqlstate(c), "42883") == 0 || strcmp(pgjobq_sqlstate(c), "3F000") == 0) {
            pgjobq__clearerr(c);
            rc = PGJOBQ_OK;
        }
    } else if (PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) {
        if ((*json = strdup(PQgetvalue(r, 0, 0))) == NULL)
            rc = pgjobq__seterr(c, PGJOBQ_ENOMEM, "read the cluster map: out of memory");
    }
    PQclear(r);
    return rc;
}

static int read_file(pgjobq_cluster *cl, char **json)
{
    FILE *f = fopen(cl->file, "rb");
    pgjobq__buf b = {0};
    char chunk[8192];
    size_t got;

    *json = NULL;
    if (f == NULL)
        return cl_err(cl, PGJOBQ_EINVAL, "cluster map %s: %s", cl->file, strerror(errno));
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0 && b.len <= MAP_FILE_MAX)
        pgjobq__buf_put(&b, chunk, got);
    int failed = ferror(f);
    fclose(f);
    pgjobq__buf_put(&b, "", 1);
    if (failed || b.oom || b.len > MAP_FILE_MAX || strlen(b.data) != b.len - 1) {
        pgjobq__buf_free(&b);
        return cl_err(cl, b.oom ? PGJOBQ_ENOMEM : PGJOBQ_EINVAL, "cluster map %s: %s", cl->file,
                      failed  ? "cannot be read"
                      : b.oom ? "out of memory"
                              : "too large, or not text");
    }
    *json = b.data;
    return PGJOBQ_OK;
}

/* Takes the new map m: the shards that stay (same name and conninfo) keep their clients, the clients
 * of the others are closed, and the connection the cluster was opened on serves its own shard. */
static void map_install(pgjobq_cluster *cl, cl_map *m)
{
    cl_map *old = &cl->map;

    for (size_t i = 0; i < m->nshards; i++) {
        for (size_t k = 0; k < old->nshards; k++) {
            if (old->shards[k].client && strcmp(old->shards[k].name, m->shards[i].name) == 0 &&
                strcmp(old->shards[k].conninfo, m->shards[i].conninfo) == 0) {
                m->shards[i].client = old->shards[k].client;
                old->shards[k].client = NULL;
                break;
            }
        }
        if (m->shards[i].client == NULL && cl->home && cl->home_usable && m->self &&
            strcmp(m->self, m->shards[i].name) == 0)
            m->shards[i].client = cl->home;
    }
    for (size_t k = 0; k < old->nshards; k++)
        if (old->shards[k].client != cl->home)
            pgjobq_client_close(old->shards[k].client);
    map_free(old);
    *old = *m;
    memset(m, 0, sizeof *m);
}

/* Takes the map json (read from src_name) unless it is older than the one held. */
static int take_map(pgjobq_cluster *cl, const char *json, const char *src_name)
{
    char why[512];
    cl_map m;
    int rc = map_parse(json, &m, why, sizeof why);

    if (rc != PGJOBQ_OK)
        return cl_err(cl, rc, "cluster map from %s: %s", src_name, why);
    if (cl->map.mapped && m.epoch < cl->map.epoch) {
        map_free(&m);
        return PGJOBQ_OK;
    }
    map_install(cl, &m);
    return PGJOBQ_OK;
}

/* Reads the map again from src (a client of the cluster's; NULL: the file or the home connection)
 * and takes it unless it is older.  A database with no map keeps the map held. */
static int load_from(pgjobq_cluster *cl, pgjobq_client *src, const char *src_name)
{
    char *json = NULL;
    int rc;

    if (src == NULL && cl->file)
        rc = read_file(cl, &json);
    else if ((rc = read_map(src ? src : cl->home, &json)) != PGJOBQ_OK)
        return shard_err(cl, src_name, src ? src : cl->home, rc);
    if (rc != PGJOBQ_OK || json == NULL)
        return rc;
    rc = take_map(cl, json, src_name);
    free(json);
    return rc;
}

/* ---- connections ------------------------------------------------------------------------------------ */

/* conninfo with connect_timeout=PGJOBQ_CLUSTER_CONNECT_TIMEOUT_S added when it sets none (nor
 * $PGCONNECT_TIMEOUT), malloc'd; NULL when out of memory. */
static char *with_connect_timeout(const char *conninfo)
{
    PQconninfoOption *opts = PQconninfoParse(conninfo, NULL);
    int has = getenv("PGCONNECT_TIMEOUT") != NULL || opts == NULL; /* unparsable: the open says why */
    char *out;
    size_t size;

    for (PQconninfoOption *o = opts; o && o->keyword; o++)
        if (strcmp(o->keyword, "connect_timeout") == 0 && o->val && o->val[0])
            has = 1;
    PQconninfoFree(opts);
    if (has)
        return strdup(conninfo);
    int url = strncmp(conninfo, "postgresql://", 13) == 0 || strncmp(conninfo, "postgres://", 11) == 0;
    const char *sep = url ? (strchr(conninfo, '?') ? "&" : "?") : conninfo[0] ? " " : "";
    size = strlen(conninfo) + 40;
    if ((out = malloc(size)) != NULL)
        snprintf(out, size, "%s%sconnect_timeout=%d", conninfo, sep, PGJOBQ_CLUSTER_CONNECT_TIMEOUT_S);
    return out;
}

static int open_client(pgjobq_client **out, const char *conninfo)
{
    char *ci = with_connect_timeout(conninfo);
    int rc;

    *out = NULL;
    if (ci == NULL)
        return PGJOBQ_ENOMEM;
    rc = pgjobq_client_open(out, ci);
    free(ci);
    return rc;
}

/* ---- the API ------------------------------------------------------------------------------------------ */

int pgjobq_cluster_open(pgjobq_cluster **out, const char *spec)
{
    pgjobq_cluster *cl;
    char *json = NULL;
    int rc;

    if (out == NULL)
        return PGJOBQ_EINVAL;
    *out = NULL;
    if ((cl = calloc(1, sizeof *cl)) == NULL)
        return PGJOBQ_ENOMEM;
    *out = cl;
    if (spec == NULL)
        spec = "";
    if ((cl->spec = strdup(spec)) == NULL)
        return cl_err(cl, PGJOBQ_ENOMEM, "out of memory");
    if (spec[0] == '/' || strncmp(spec, "./", 2) == 0 || strncmp(spec, "file:", 5) == 0) {
        if ((cl->file = strdup(strncmp(spec, "file:", 5) == 0 ? spec + 5 : spec)) == NULL)
            return cl_err(cl, PGJOBQ_ENOMEM, "out of memory");
        return load_from(cl, NULL, cl->file);
    }

    rc = open_client(&cl->home, spec);
    if (rc == PGJOBQ_ENOMEM || cl->home == NULL)
        return cl_err(cl, PGJOBQ_ENOMEM, "out of memory");
    if (rc != PGJOBQ_OK && rc != PGJOBQ_ESCHEMA)
        return cl_err(cl, rc, "%s", pgjobq_errmsg(cl->home));
    cl->home_usable = rc == PGJOBQ_OK;
    char schema_msg[sizeof cl->errmsg];
    snprintf(schema_msg, sizeof schema_msg, "%s", pgjobq_errmsg(cl->home));
    int read_rc = read_map(cl->home, &json);
    if (read_rc != PGJOBQ_OK)
        return cl_err(cl, read_rc, "read the cluster map: %s", pgjobq_errmsg(cl->home));
    if (json == NULL) {
        /* No map: one shard, this database, on this connection. */
        if (!cl->home_usable)
            return cl_err(cl, rc, "%s", schema_msg);
        cl_map m;
        const char *db = PQdb(pgjobq_client_conn(cl->home));
        if (map_single(&m, db && db[0] ? db : "default", spec) != PGJOBQ_OK)
            return cl_err(cl, PGJOBQ_ENOMEM, "out of memory");
        m.shards[0].client = cl->home;
        cl->map = m;
        return PGJOBQ_OK;
    }
    rc = take_map(cl, json, "the database");
    free(json);
    return rc;
}

void pgjobq_cluster_close(pgjobq_cluster *cl)
{
    if (cl == NULL)
        return;
    for (size_t i = 0; i < cl->map.nshards; i++)
        if (cl->map.shards[i].client != cl->home)
            pgjobq_client_close(cl->map.shards[i].client);
    map_free(&cl->map);
    pgjobq_client_close(cl->home);
    free(cl->spec);
    free(cl->file);
    free(cl);
}

const char *pgjobq_cluster_errmsg(const pgjobq_cluster *cl)
{
    return cl ? cl->errmsg : "no cluster";
}

const char *pgjobq_cluster_sqlstate(const pgjobq_cluster *cl)
{
    return cl ? cl->sqlstate : "";
}

int pgjobq_cluster_reload(pgjobq_cluster *cl)
{
    int rc;

    if (cl == NULL)
        return PGJOBQ_EINVAL;
    cl_clearerr(cl);
    if (cl->file || cl->home) {
        rc = load_from(cl, NULL, cl->file ? cl->file : "the database");
        if (rc == PGJOBQ_OK || rc == PGJOBQ_ENOMEM || cl->file)
            return rc;
    } else
        rc = PGJOBQ_ECONN;
    /* The database the cluster was opened on is not there: any shard it is connected to. */
    for (size_t i = 0; i < cl->map.nshards; i++) {
        cl_shard *s = &cl->map.shards[i];
        if (s->client && s->client != cl->home && load_from(cl, s->client, s->name) == PGJOBQ_OK) {
            cl_clearerr(cl);
            return PGJOBQ_OK;
        }
    }
    return rc;
}

int64_t pgjobq_cluster_epoch(const pgjobq_cluster *cl)
{
    return cl && cl->map.mapped ? cl->map.epoch : 0;
}

size_t pgjobq_cluster_shards(const pgjobq_cluster *cl)
{
    return cl ? cl->map.nshards : 0;
}

const char *pgjobq_cluster_shard_name(const pgjobq_cluster *cl, size_t i)
{
    return cl && i < cl->map.nshards ? cl->map.shards[i].name : NULL;
}

const char *pgjobq_cluster_shard_conninfo(const pgjobq_cluster *cl, size_t i)
{
    return cl && i < cl->map.nshards ? cl->map.shards[i].conninfo : NULL;
}

int pgjobq_cluster_shard_number(const pgjobq_cluster *cl, size_t i)
{
    return cl && i < cl->map.nshards ? cl->map.shards[i].number : -1;
}

int pgjobq_cluster_client(pgjobq_cluster *cl, size_t i, pgjobq_client **out)
{
    cl_shard *s;
    int rc;

    if (out)
        *out = NULL;
    if (cl == NULL || out == NULL)
        return PGJOBQ_EINVAL;
    if (i >= cl->map.nshards)
        return cl_err(cl, PGJOBQ_EINVAL, "no shard %zu: the cluster has %zu", i, cl->map.nshards);
    s = &cl->map.shards[i];
    if (s->client == NULL) {
        rc = open_client(&s->client, s->conninfo);
        if (rc != PGJOBQ_OK) {
            shard_err(cl, s->name, s->client, rc);
            pgjobq_client_close(s->client);
            s->client = NULL;
            return rc;
        }
    }
    *out = s->client;
    return PGJOBQ_OK;
}

/* The index of the shard a job of queue (NULL: default) with route_key goes to: route_partition's rule. */
static size_t route(const cl_map *m, const char *queue, const char *route_key)
{
    const cl_queue *q = NULL;
    uint32_t mask, part;

    if (!m->mapped)
        return 0;
    if (queue == NULL)
        queue = "default";
    mask = m->partitions - 1;
    if (m->nqueues) {
        cl_queue key = {.name = (char *)queue};
        q = bsearch(&key, m->queues, m->nqueues, sizeof *m->queues, queue_cmp);
    }
    if (q && q->spread && route_key)
        part = pgjobq__route_hash(route_key, strlen(route_key)) & mask;
    else if (q && q->partition >= 0)
        part = (uint32_t)q->partition;
    else
        part = pgjobq__route_hash(queue, strlen(queue)) & mask;
    return m->owners[part];
}

/* Whether job i goes where job i - 1 does, by their queues and keys alone (a batch is mostly runs of
 * one queue and one key, or none: routed once per run). */
static int route_same(const pgjobq_job_spec *jobs, size_t i)
{
    const char *q0 = jobs[i - 1].opts.queue, *q1 = jobs[i].opts.queue;
    const char *k0 = jobs[i - 1].opts.route_key, *k1 = jobs[i].opts.route_key;

    if (q0 != q1 && (q0 == NULL || q1 == NULL || strcmp(q0, q1) != 0))
        return 0;
    return k0 == k1 || (k0 && k1 && strcmp(k0, k1) == 0);
}

int pgjobq_cluster_route(const pgjobq_cluster *cl, const char *queue, const char *route_key, size_t *shard_out)
{
    if (cl == NULL || shard_out == NULL || (queue && pgjobq_name_check(queue) != PGJOBQ_OK))
        return PGJOBQ_EINVAL;
    *shard_out = route(&cl->map, queue, route_key);
    return PGJOBQ_OK;
}

int pgjobq_cluster_route_job(const pgjobq_cluster *cl, int64_t id, size_t *shard_out)
{
    if (cl == NULL || shard_out == NULL || id < 1)
        return PGJOBQ_EINVAL;
    if (!cl->map.mapped) {
        *shard_out = 0;
        return PGJOBQ_OK;
    }
    if (id <= cl->map.id_floor) {
        *shard_out = PGJOBQ_SHARD_ANY;
        return PGJOBQ_OK;
    }
    int16_t i = cl->map.by_number[id % 1024];
    if (i < 0)
        return PGJOBQ_ENOTFOUND;
    *shard_out = (size_t)i;
    return PGJOBQ_OK;
}

static int is_stale(pgjobq_client *c, int rc)
{
    return rc == PGJOBQ_EDB && strcmp(pgjobq_sqlstate(c), "PJQ01") == 0;
}

int pgjobq_cluster_enqueue(pgjobq_cluster *cl, const char *payload, const pgjobq_enqueue_opts *opts, int64_t *id_out)
{
    const char *queue = opts ? opts->queue : NULL, *key = opts ? opts->route_key : NULL;
    pgjobq_client *c;
    int rc;

    if (id_out)
        *id_out = 0;
    if (cl == NULL)
        return PGJOBQ_EINVAL;
    cl_clearerr(cl);
    if (queue && pgjobq_name_check(queue) != PGJOBQ_OK)
        return cl_err(cl, PGJOBQ_EINVAL, "job: queue \"%.100s\" is not a valid name", queue);
    for (int reloaded = 0;; reloaded = 1) {
        size_t s = route(&cl->map, queue, key);
        const char *name = cl->map.shards[s].name;
        if ((rc = pgjobq_cluster_client(cl, s, &c)) != PGJOBQ_OK)
            return rc;
        rc = pgjobq_enqueue(c, payload, opts, id_out);
        if (rc == PGJOBQ_OK)
            return rc;
        if (reloaded || !is_stale(c, rc))
            return shard_err(cl, name, c, rc);
        /* The shard's map is newer: read it there and route again. */
        if (load_from(cl, c, name) != PGJOBQ_OK)
            return rc;
    }
}

/* The cluster's message after the earlier parts' (prev): "prev; message", cut to fit. */
static void join_errors(pgjobq_cluster *cl, const char *prev)
{
    char now[sizeof cl->errmsg];
    size_t size = sizeof cl->errmsg, len = strlen(prev);

    if (len == 0)
        return;
    memcpy(now, cl->errmsg, sizeof now);
    if (len > size - 1)
        len = size - 1;
    memcpy(cl->errmsg, prev, len);
    for (const char *p = "; "; *p && len < size - 1; p++)
        cl->errmsg[len++] = *p;
    for (const char *p = now; *p && len < size - 1; p++)
        cl->errmsg[len++] = *p;
    cl->errmsg[len] = '\0';
}

int pgjobq_cluster_send_event(pgjobq_cluster *cl, const char *name, const char *key, const char *payload,
                              int *resumed_out)
{
    char prev[sizeof cl->errmsg];
    int first = PGJOBQ_OK, total = 0;

    if (resumed_out)
        *resumed_out = 0;
    if (cl == NULL)
        return PGJOBQ_EINVAL;
    cl_clearerr(cl);
    prev[0] = '\0';
    for (size_t s = 0; s < cl->map.nshards; s++) {
        pgjobq_client *c;
        int resumed = 0, rc = pgjobq_cluster_client(cl, s, &c);
        if (rc == PGJOBQ_OK && (rc = pgjobq_send_event(c, name, key, payload, &resumed)) != PGJOBQ_OK)
            shard_err(cl, cl->map.shards[s].name, c, rc);
        if (rc == PGJOBQ_OK) {
            total += resumed;
            continue;
        }
        join_errors(cl, prev);
        memcpy(prev, cl->errmsg, sizeof prev);
        if (first == PGJOBQ_OK)
            first = rc;
        if (rc == PGJOBQ_EINVAL)
            break; /* judged before any statement: the same on every shard */
    }
    if (resumed_out)
        *resumed_out = total;
    return first;
}

int pgjobq_cluster_enqueue_many(pgjobq_cluster *cl, const pgjobq_job_spec *jobs, size_t n, int64_t *ids_out,
                                unsigned char *dup_out)
{
    enum { PENDING, DONE, FAILED };
    pgjobq_client *c;
    int rc, first_rc = PGJOBQ_OK, reloaded = 0;

    if (cl == NULL)
        return PGJOBQ_EINVAL;
    cl_clearerr(cl);
    if (ids_out && n)
        memset(ids_out, 0, n * sizeof *ids_out);
    if (dup_out && n)
        memset(dup_out, 0, n);
    if (n == 0)
        return PGJOBQ_OK;
    if (jobs == NULL)
        return cl_err(cl, PGJOBQ_EINVAL, "enqueue: no jobs given");
    for (size_t i = 0; i < n && cl->map.nshards > 1; i++) /* (one shard: its own check names the job as well) */
        if (jobs[i].opts.queue && pgjobq_name_check(jobs[i].opts.queue) != PGJOBQ_OK)
            return cl_err(cl, PGJOBQ_EINVAL, "job %zu: queue \"%.100s\" is not a valid name", i, jobs[i].opts.queue);

    /* One shard for the whole batch (a cluster of one shard, one pinned queue, one key): as is. */
    size_t s0 = route(&cl->map, jobs[0].opts.queue, jobs[0].opts.route_key), i = cl->map.nshards > 1 ? 1 : n;
    for (; i < n; i++)
        if (!route_same(jobs, i) && route(&cl->map, jobs[i].opts.queue, jobs[i].opts.route_key) != s0)
            break;
    if (i == n) {
        const char *name = cl->map.shards[s0].name;
        if ((rc = pgjobq_cluster_client(cl, s0, &c)) != PGJOBQ_OK)
            return rc;
        rc = pgjobq_enqueue_many(c, jobs, n, ids_out, dup_out);
        if (rc == PGJOBQ_OK)
            return rc;
        if (!is_stale(c, rc))
            return shard_err(cl, name, c, rc);
        /* Stale: the general path below reads the map again and routes the jobs again. */
    }

    size_t *shard = malloc(n * sizeof *shard), *idx = malloc(n * sizeof *idx);
    unsigned char *state = calloc(n, 1), *sub_dup = malloc(n);
    pgjobq_job_spec *sub = malloc(n * sizeof *sub);
    int64_t *sub_ids = malloc(n * sizeof *sub_ids);
    if (!shard || !idx || !state || !sub_dup || !sub || !sub_ids) {
        rc = cl_err(cl, PGJOBQ_ENOMEM, "enqueue: out of memory");
        goto out;
    }
    if (i == n) { /* the one shard refused with PJQ01 */
        if (load_from(cl, c, cl->map.shards[s0].name) != PGJOBQ_OK) {
            rc = PGJOBQ_EDB;
            goto out;
        }
        reloaded = 1;
    }
    for (i = 0; i < n; i++)
        shard[i] =
            i && route_same(jobs, i) ? shard[i - 1] : route(&cl->map, jobs[i].opts.queue, jobs[i].opts.route_key);

    for (;;) {
        /* The next shard with jobs to write: one connected already first, so that a shard that is down
         * (its connect timeout) comes after every other part. */
        size_t s = SIZE_MAX;
        for (i = 0; i < n; i++) {
            if (state[i] != PENDING)
                continue;
            if (s == SIZE_MAX || (cl->map.shards[shard[i]].client && !cl->map.shards[s].client))
                s = shard[i];
        }
        if (s == SIZE_MAX)
            break;
        size_t k = 0;
        for (i = 0; i < n; i++) {
            if (state[i] == PENDING && shard[i] == s) {
                idx[k] = i;
                sub[k++] = jobs[i];
            }
        }
        const char *name = cl->map.shards[s].name;
        char prev[sizeof cl->errmsg];
        snprintf(prev, sizeof prev, "%s", cl->errmsg);
        rc = pgjobq_cluster_client(cl, s, &c);
        if (rc == PGJOBQ_OK)
            rc = pgjobq_enqueue_many(c, sub, k, sub_ids, sub_dup);
        if (rc == PGJOBQ_OK) {
            for (size_t j = 0; j < k; j++) {
                state[idx[j]] = DONE;
                if (ids_out)
                    ids_out[idx[j]] = sub_ids[j];
                if (dup_out)
                    dup_out[idx[j]] = sub_dup[j];
            }
            continue;
        }
        if (c && !reloaded && is_stale(c, rc)) {
            reloaded = 1;
            if (load_from(cl, c, name) == PGJOBQ_OK) {
                snprintf(cl->errmsg, sizeof cl->errmsg, "%s", prev);
                for (i = 0; i < n; i++)
                    if (state[i] == PENDING)
                        shard[i] = route(&cl->map, jobs[i].opts.queue, jobs[i].opts.route_key);
                continue;
            }
        }
        if (c) /* (a failed connect has set the message already) */
            shard_err(cl, name, c, rc);
        join_errors(cl, prev);
        if (first_rc == PGJOBQ_OK)
            first_rc = rc;
        for (size_t j = 0; j < k; j++)
            state[idx[j]] = FAILED;
    }
    rc = first_rc;
out:
    free(shard);
    free(idx);
    free(state);
    free(sub_dup);
    free(sub);
    free(sub_ids);
    return rc;
}
