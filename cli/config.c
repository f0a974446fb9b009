/*
 * config.c - what one run of the command is told before any command runs: the database (--db, else
 * the environment) and the name it was run by.  Everything else reads them from here.
 */
#include <stdlib.h>

#include "cli.h"

const char *cli_db_url;
const char *cli_cluster_arg;
const char *cli_self = "pgjobq";

/* Which database: --db, then $PGJOBQ_DATABASE_URL, then $DATABASE_URL. */
const char *cli_database_url(void)
{
    const char *v;
    if (cli_db_url)
        return cli_db_url;
    if ((v = getenv("PGJOBQ_DATABASE_URL")) != NULL && v[0])
        return v;
    if ((v = getenv("DATABASE_URL")) != NULL && v[0])
        return v;
    return NULL;
}

/* Where cli_database_url() found its value, for messages. */
const char *cli_database_source(void)
{
    const char *v;
    if (cli_db_url)
        return "--db";
    if ((v = getenv("PGJOBQ_DATABASE_URL")) != NULL && v[0])
        return "$PGJOBQ_DATABASE_URL";
    return "$DATABASE_URL";
}

const char *cli_cluster_spec(void)
{
    const char *v;
    if (cli_cluster_arg)
        return cli_cluster_arg;
    if ((v = getenv("PGJOBQ_CLUSTER")) != NULL && v[0])
        return v;
    return NULL;
}
