/* test_smoke.c - the harness itself: a cluster, a migrated database, a client. */
#include <string.h>

#include "harness.h"

TEST(smoke_connect_and_version)
{
    pgjobq_client *c = t_client();
    int v = -1;

    CHECK_OK(c, pgjobq_schema_version(c, &v));
    CHECK_INT(v, PGJOBQ_SCHEMA_VERSION);
    CHECK_STR(pgjobq_version(), PGJOBQ_VERSION);
    CHECK_INT(pgjobq_version_num(), PGJOBQ_VERSION_NUM);
    pgjobq_client_close(c);
}
