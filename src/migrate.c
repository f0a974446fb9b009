/*
 * migrate.c - applies the numbered migrations and the function files embedded from sql/ (the schema
 * version they lead to is read by schema.c).
 *
 * Migration N runs in its own transaction, under a transaction-scoped advisory lock, and only when
 * pgjobq.schema_version does not list N yet.  Hosts that migrate at once queue on the lock; the later
 * ones find the work done.  A transaction-scoped lock (not a session lock) keeps this working through
 * PgBouncer in transaction mode.
 *
 * The functions are not in the numbered migrations: each is defined once, as it is now, in a file of
 * sql/functions (CREATE OR REPLACE).  Those files are applied, all of them, whenever the SHA-256 of
 * their text differs from the one recorded in pgjobq.function_files: in the transaction of the last
 * migration when one is applied (so that the schema and its functions change together), else in a
 * transaction of their own.  Only a database at this library's schema version gets them: a newer one
 * (a rolling deploy) keeps the functions of the library that migrated it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

extern const char *const pgjobq__migrations[];
extern const char *const pgjobq__migration_names[];
extern const int pgjobq__migration_count;
extern const int pgjobq__migration_needs[];
extern const char *const pgjobq__function_files[];
extern const char *const pgjobq__function_file_names[];
extern const int pgjobq__function_file_count;
extern const char *const pgjobq__router_migrations[];
extern const char *const pgjobq__router_migration_names[];
extern const int pgjobq__router_migration_count;
extern const char *const pgjobq__router_function_files[];
extern const char *const pgjobq__router_function_file_names[];
extern const int pgjobq__router_function_file_count;
extern const char *const pgjobq__router_roles_sql;

/* The function files of a shard, or of a router, and what grants their functions once applied. */
typedef struct function_set {
    const char *const *files;
    const char *const *names;
    const int *count;
    int (*grant)(pgjobq_client *c);
} function_set;

/* The first migration whose schema_version row says which libraries can use the database. */
#define FIRST_WITH_NEEDS 7
extern const char *const pgjobq__roles_sql;

/* Advisory lock key of the migration runner: ('pgjq', 1). */
#define MIGRATE_LOCK_SQL "SELECT pg_catalog.pg_advisory_xact_lock(" PGJOBQ__LOCK(1) ")"

/* A migration's error is the database's: PGJOBQ_ESCHEMA would tell the caller to run the migrations
 * that just failed. */
static int migration_code(int rc)
{
    return rc == PGJOBQ_ESCHEMA ? PGJOBQ_EDB : rc;
}

/* Runs sql, which may hold several statements, with the simple protocol; the result, when out is not
 * NULL, is the caller's to clear. */
static int run(pgjobq_client *c, const char *what, const char *sql, PGresult **out)
{
    return migration_code(pgjobq__exec_sql(c, what, sql, out));
}

/* Runs one statement with text parameters; the result is the caller's to clear. */
static int run_params(pgjobq_client *c, const char *what, const char *sql, int nparams, const char *const *values,
                      PGresult **out)
{
    const pgjobq__stmt st = {.what = what, .sql = sql, .nparams = nparams, .values = values};
    return migration_code(pgjobq__exec(c, &st, out));
}

static int simple(pgjobq_client *c, const char *what, const char *sql)
{
    return run(c, what, sql, NULL);
}

/* Begins a transaction that holds the migration lock.  Its notices are not shown: they would only say
 * that an object dropped IF EXISTS is not there (a new database) or a grant that is there already. */
static int begin_locked(pgjobq_client *c, const char *what)
{
    int rc = simple(c, what, "BEGIN");
    if (rc == PGJOBQ_OK)
        rc = simple(c, what, "SET LOCAL client_min_messages = warning");
    if (rc == PGJOBQ_OK)
        rc = simple(c, what, MIGRATE_LOCK_SQL);
    return rc;
}

/* Commits when rc is PGJOBQ_OK, else rolls back; returns rc, or the commit's error. */
static int end_locked(pgjobq_client *c, const char *what, int rc)
{
    if (rc == PGJOBQ_OK)
        return simple(c, what, "COMMIT");
    pgjobq__rollback_quietly(c); /* keeps the first error */
    return rc;
}

/* Runs a query whose one row holds booleans, into flags[0 .. n). */
static int ask(pgjobq_client *c, const char *what, const char *sql, int *flags, int n)
{
    PGresult *r = NULL;
    int rc = run(c, what, sql, &r);

    if (rc != PGJOBQ_OK)
        return rc;
    for (int i = 0; i < n; i++)
        flags[i] = strcmp(PQgetvalue(r, 0, i), "t") == 0;
    PQclear(r);
    return PGJOBQ_OK;
}

/* Creates pgjobq.function_files, where the checksum of the function files is recorded, unless it
 * exists: here, not in a migration, because recording the checksum is no change of the schema version.
 * Anyone may read it, as pgjobq.schema_version, so that `pgjobq migrate` on an up-to-date database
 * needs no privilege. */
static int checksum_table(pgjobq_client *c)
{
    static const char *const exists =
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname = 'pgjobq' AND c.relname = 'function_files')";
    static const char *const create = "CREATE TABLE pgjobq.function_files ("
                                      " checksum   text        NOT NULL,"
                                      " library    text        NOT NULL,"
                                      " applied_at timestamptz NOT NULL DEFAULT now());"
                                      "GRANT SELECT ON pgjobq.function_files TO PUBLIC";
    int present = 0, rc = ask(c, "function files", exists, &present, 1);

    if (rc != PGJOBQ_OK || present)
        return rc;
    return simple(c, "function files", create);
}

/* The checksum of the function files as the library embeds them, computed by the database (the SHA-256
 * of their text, in order, in hex; not md5(), which a server in FIPS mode refuses), into sum (65
 * bytes), and whether it is the one recorded (*same). */
static int functions_checksum(pgjobq_client *c, const function_set *set, char *sum, int *same)
{
    pgjobq__buf text = {0};
    PGresult *r = NULL;
    int rc;

    for (int i = 0; i < *set->count; i++)
        pgjobq__buf_put(&text, set->files[i], strlen(set->files[i]));
    pgjobq__buf_put(&text, "", 1);
    if (text.oom) {
        pgjobq__buf_free(&text);
        return pgjobq__seterr(c, PGJOBQ_ENOMEM, "migrate: out of memory");
    }
    const char *values[1] = {text.data};
    rc = run_params(c, "function files",
                    "SELECT s.sum, s.sum IN (SELECT f.checksum FROM pgjobq.function_files f) FROM (SELECT"
                    " pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to($1, 'UTF8')), 'hex') AS sum) s",
                    1, values, &r);
    pgjobq__buf_free(&text);
    if (rc != PGJOBQ_OK)
        return rc;
    snprintf(sum, 65, "%s", PQgetvalue(r, 0, 0));
    *same = strcmp(PQgetvalue(r, 0, 1), "t") == 0;
    PQclear(r);
    return PGJOBQ_OK;
}

/* Applies sql/roles.sql again where it was applied before (the roles have a grant on the schema) and all
 * its roles exist: a function that a migration dropped and the files created again has lost its grants.
 * (The names are those of the roles sql/roles.sql creates.)  Creating a missing role would need
 * CREATEROLE, which the schema's owner may not have: that stays with `pgjobq migrate --roles`. */
static int regrant_roles(pgjobq_client *c)
{
    static const char *const sql =
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n CROSS JOIN LATERAL pg_catalog.aclexplode(n.nspacl) a"
        "                JOIN pg_catalog.pg_roles r ON r.oid = a.grantee"
        "               WHERE n.nspname = 'pgjobq' AND r.rolname = 'pgjobq_worker'),"
        " (SELECT count(*) FROM pg_catalog.pg_roles"
        "   WHERE rolname IN ('pgjobq_producer', 'pgjobq_worker', 'pgjobq_admin', 'pgjobq_monitor')) = 4";
    int flags[2] = {0, 0}, rc = ask(c, "roles", sql, flags, 2); /* granted here before, all exist */

    if (rc != PGJOBQ_OK)
        return rc;
    if (flags[0] && flags[1])
        return simple(c, "roles", pgjobq__roles_sql);
    if (flags[0])
        pgjobq__log(c, PGJOBQ_LOG_WARN,
                    "the pgjobq roles have grants in this database but not all of them exist: run "
                    "`pgjobq migrate --roles` to create them and grant the functions");
    return PGJOBQ_OK;
}

/* The grants of a router's functions (sql/router/roles.sql: to the roles that exist). */
static int router_grants(pgjobq_client *c)
{
    return simple(c, "router roles", pgjobq__router_roles_sql);
}

static const function_set shard_functions = {pgjobq__function_files, pgjobq__function_file_names,
                                             &pgjobq__function_file_count, regrant_roles};
static const function_set router_functions = {pgjobq__router_function_files, pgjobq__router_function_file_names,
                                              &pgjobq__router_function_file_count, router_grants};

/* Inside a transaction that holds the lock, on a database at this library's schema version: applies
 * the function files of the set unless their checksum is the one recorded, then what every migration
 * used to end with, and the roles' grants.  Functions are executable by PUBLIC by default; pgjobq's are
 * granted explicitly instead (the owner of the schema always has them). */
static int apply_functions(pgjobq_client *c, const function_set *set)
{
    char sum[65], what[160];
    int same = 0, rc;

    rc = checksum_table(c);
    if (rc == PGJOBQ_OK)
        rc = functions_checksum(c, set, sum, &same);
    if (rc != PGJOBQ_OK || same)
        return rc;
    for (int i = 0; i < *set->count && rc == PGJOBQ_OK; i++) {
        snprintf(what, sizeof what, "function file %s", set->names[i]);
        rc = simple(c, what, set->files[i]);
    }
    if (rc == PGJOBQ_OK)
        rc = simple(c, "function files", "REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgjobq FROM PUBLIC");
    if (rc == PGJOBQ_OK)
        rc = set->grant(c);
    if (rc == PGJOBQ_OK)
        rc = simple(c, "function files", "DELETE FROM pgjobq.function_files");
    if (rc == PGJOBQ_OK) {
        const char *values[2] = {sum, PGJOBQ_VERSION};
        PGresult *r = NULL;
        rc = run_params(c, "function files", "INSERT INTO pgjobq.function_files (checksum, library) VALUES ($1, $2)", 2,
                        values, &r);
        PQclear(r);
    }
    if (rc == PGJOBQ_OK)
        pgjobq__log(c, PGJOBQ_LOG_INFO, "applied the function files (sha256 %.12s...)", sum);
    return rc;
}

/* The function files in a transaction of their own, when no migration was applied: a database that is
 * up to date, or that a library with other function files (or one from before the files) migrated. */
static int apply_functions_alone(pgjobq_client *c)
{
    int version, rc;

    rc = begin_locked(c, "function files");
    if (rc == PGJOBQ_OK)
        rc = pgjobq__read_version(c, &version, NULL);
    if (rc == PGJOBQ_OK && version == pgjobq__migration_count)
        rc = apply_functions(c, &shard_functions);
    return end_locked(c, "function files", rc);
}

/* Applies migration n unless the database has it; the last one is applied with the function files. */
static int apply_one(pgjobq_client *c, int n, int *applied, int *functions_done)
{
    char what[160], record[128];
    int version, needs, rc;

    snprintf(what, sizeof what, "migration %s", pgjobq__migration_names[n - 1]);
    rc = begin_locked(c, what);
    if (rc == PGJOBQ_OK)
        rc = pgjobq__read_version(c, &version, &needs);
    if (rc == PGJOBQ_OK && version > pgjobq__migration_count && !pgjobq__schema_usable(version, needs)) {
        c->schema_state = -1;
        rc = pgjobq__seterr(c, PGJOBQ_ESCHEMA,
                            "the database has pgjobq schema version %d, newer than this pgjobq understands "
                            "(version %d): upgrade pgjobq",
                            version, pgjobq__migration_count);
    }
    if (rc == PGJOBQ_OK && version < n) {
        rc = simple(c, what, pgjobq__migrations[n - 1]);
        if (n >= FIRST_WITH_NEEDS)
            snprintf(record, sizeof record, "INSERT INTO pgjobq.schema_version (version, needs) VALUES (%d, %d)", n,
                     pgjobq__migration_needs[n - 1]);
        else
            snprintf(record, sizeof record, "INSERT INTO pgjobq.schema_version (version) VALUES (%d)", n);
        if (rc == PGJOBQ_OK)
            rc = simple(c, what, record);
        if (rc == PGJOBQ_OK && n == pgjobq__migration_count) {
            rc = apply_functions(c, &shard_functions);
            *functions_done = 1;
        }
        if (rc == PGJOBQ_OK) {
            (*applied)++;
            pgjobq__log(c, PGJOBQ_LOG_INFO, "applied %s", what);
        }
    }
    return end_locked(c, what, rc);
}

/* A shard's migrations must not run in a router database, nor a router's in a shard: each has tables
 * and functions of the same names as the other's (pgjobq.enqueue is PL/Proxy's in a router).  router:
 * whether the caller migrates a router. */
static int refuse_other_kind(pgjobq_client *c, int router)
{
    int kinds[2] = {0, 0}; /* a shard's schema, a router's */
    int rc = ask(c, "migrate",
                 "SELECT pg_catalog.to_regclass('pgjobq.schema_version') IS NOT NULL,"
                 " pg_catalog.to_regclass('pgjobq.router_version') IS NOT NULL",
                 kinds, 2);

    if (rc != PGJOBQ_OK)
        return rc;
    if (!router && kinds[1])
        return pgjobq__seterr(c, PGJOBQ_ESCHEMA,
                              "migrate: this database is a pgjobq router (PL/Proxy), not a shard: migrate it "
                              "with `pgjobq migrate --router` (pgjobq_migrate_router)");
    if (router && kinds[0])
        return pgjobq__seterr(c, PGJOBQ_ESCHEMA,
                              "migrate: this database holds a pgjobq schema (a shard, which holds jobs); a router "
                              "is a database of its own");
    return PGJOBQ_OK;
}

int pgjobq_migrate(pgjobq_client *c, int *applied_out)
{
    int applied = 0, functions_done = 0, rc = PGJOBQ_OK;

    if (applied_out)
        *applied_out = 0;
    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    if (c->conn == NULL || PQstatus(c->conn) != CONNECTION_OK)
        return pgjobq__seterr(c, PGJOBQ_ECONN, "migrate: not connected");
    if (PQtransactionStatus(c->conn) != PQTRANS_IDLE)
        return pgjobq__seterr(c, PGJOBQ_ESTATE,
                              "migrate: the connection is inside a transaction; migrations run their own");
    if (pgjobq__migration_count != PGJOBQ_SCHEMA_VERSION)
        return pgjobq__seterr(c, PGJOBQ_ESCHEMA,
                              "migrate: this build embeds %d migrations but declares "
                              "schema version %d",
                              pgjobq__migration_count, PGJOBQ_SCHEMA_VERSION);
    if ((rc = refuse_other_kind(c, 0)) != PGJOBQ_OK)
        return rc;
    for (int n = 1; n <= pgjobq__migration_count && rc == PGJOBQ_OK; n++)
        rc = apply_one(c, n, &applied, &functions_done);
    if (rc == PGJOBQ_OK && !functions_done)
        rc = apply_functions_alone(c);
    if (applied_out)
        *applied_out = applied;
    if (rc != PGJOBQ_OK)
        return rc;
    return pgjobq__check_schema(c);
}

int pgjobq_migrate_roles(pgjobq_client *c)
{
    int rc;

    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    if ((rc = pgjobq__require_schema(c)) != PGJOBQ_OK)
        return rc;
    if (PQtransactionStatus(c->conn) != PQTRANS_IDLE)
        return pgjobq__seterr(c, PGJOBQ_ESTATE, "migrate roles: the connection is inside a transaction");
    rc = begin_locked(c, "roles");
    if (rc == PGJOBQ_OK)
        rc = simple(c, "roles", pgjobq__roles_sql);
    return end_locked(c, "roles", rc);
}

/* The router's version: the highest of pgjobq.router_version, 0 when there is none yet. */
static int router_version(pgjobq_client *c, int *version)
{
    int exists = 0;
    PGresult *r = NULL;
    int rc = ask(c, "router version", "SELECT pg_catalog.to_regclass('pgjobq.router_version') IS NOT NULL", &exists, 1);

    *version = 0;
    if (rc != PGJOBQ_OK || !exists)
        return rc;
    rc = run(c, "router version", "SELECT coalesce(max(version), 0) FROM pgjobq.router_version", &r);
    if (rc == PGJOBQ_OK)
        *version = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return rc;
}

/* Applies router migration n unless the database has it, the last one with the function files; as
 * apply_one for a shard. */
static int apply_router_one(pgjobq_client *c, int n, int *applied, int *functions_done)
{
    char what[160], record[128];
    int version, rc;

    snprintf(what, sizeof what, "router migration %s", pgjobq__router_migration_names[n - 1]);
    rc = begin_locked(c, what);
    if (rc == PGJOBQ_OK)
        rc = refuse_other_kind(c, 1);
    if (rc == PGJOBQ_OK)
        rc = router_version(c, &version);
    if (rc == PGJOBQ_OK && version > pgjobq__router_migration_count)
        rc = pgjobq__seterr(c, PGJOBQ_ESCHEMA,
                            "the router has pgjobq router version %d, newer than this pgjobq understands "
                            "(version %d): upgrade pgjobq",
                            version, pgjobq__router_migration_count);
    if (rc == PGJOBQ_OK && version < n) {
        rc = simple(c, what, pgjobq__router_migrations[n - 1]);
        snprintf(record, sizeof record, "INSERT INTO pgjobq.router_version (version) VALUES (%d)", n);
        if (rc == PGJOBQ_OK)
            rc = simple(c, what, record);
        if (rc == PGJOBQ_OK && n == pgjobq__router_migration_count) {
            rc = apply_functions(c, &router_functions);
            *functions_done = 1;
        }
        if (rc == PGJOBQ_OK) {
            (*applied)++;
            pgjobq__log(c, PGJOBQ_LOG_INFO, "applied %s", what);
        }
    }
    return end_locked(c, what, rc);
}

int pgjobq_migrate_router(pgjobq_client *c, int *applied_out)
{
    int applied = 0, functions_done = 0, version = 0, rc = PGJOBQ_OK;

    if (applied_out)
        *applied_out = 0;
    if (c == NULL)
        return PGJOBQ_EINVAL;
    pgjobq__clearerr(c);
    if (c->conn == NULL || PQstatus(c->conn) != CONNECTION_OK)
        return pgjobq__seterr(c, PGJOBQ_ECONN, "migrate router: not connected");
    if (PQtransactionStatus(c->conn) != PQTRANS_IDLE)
        return pgjobq__seterr(c, PGJOBQ_ESTATE,
                              "migrate router: the connection is inside a transaction; migrations run their own");
    for (int n = 1; n <= pgjobq__router_migration_count && rc == PGJOBQ_OK; n++)
        rc = apply_router_one(c, n, &applied, &functions_done);
    if (rc == PGJOBQ_OK && !functions_done) {
        rc = begin_locked(c, "router function files");
        if (rc == PGJOBQ_OK)
            rc = router_version(c, &version);
        if (rc == PGJOBQ_OK && version == pgjobq__router_migration_count)
            rc = apply_functions(c, &router_functions);
        rc = end_locked(c, "router function files", rc);
    }
    if (applied_out)
        *applied_out = applied;
    return rc;
}
