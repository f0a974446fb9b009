/*
 * test_python.c - the Python package (python/) against this test's database: its pytest suite
 * (python/tests), run by Debian's python3 and python3-pytest.  The suite enqueues with each driver
 * inside the caller's transaction, and runs `python3 -m pgjobq worker`, which becomes `pgjobq work
 * --coproc` on the command under test (PGJOBQ_CLI): results, retries, Fail, exceptions, timeouts, a
 * cancel, a crash of the coprocess, 1,000 jobs over 8 async slots.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

static const char *srcdir(void)
{
    const char *s = getenv("PGJOBQ_SRCDIR");
    return s && s[0] ? s : ".";
}

TEST_FULL(python_package_pytest, 300, 0)
{
    char cmd[4096], log[600];
    const char *cli = getenv("PGJOBQ_CLI");

    CHECK_MSG(cli && cli[0], "PGJOBQ_CLI is not set (run through make check)");
    snprintf(log, sizeof log, "%s/pytest.log", t_tmpdir());
    /* No bytecode or cache files in the source tree; pytest's temporary files in this test's own. */
    snprintf(cmd, sizeof cmd,
             "cd '%s' && PGJOBQ_TEST_DATABASE_URL='%s' PYTHONDONTWRITEBYTECODE=1 "
             "/usr/bin/python3 -m pytest -q -x -p no:cacheprovider --basetemp='%s/pytest' python/tests > '%s' 2>&1",
             srcdir(), t_conninfo(), t_tmpdir(), log);
    int rc = system(cmd);
    /* The end of pytest's report (its summary; on failure, what failed). */
    static char out[16384];
    FILE *f = fopen(log, "r");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size > (long)sizeof out - 1 ? size - (long)sizeof out + 1 : 0, SEEK_SET);
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    fclose(f);
    CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "pytest exited with %d:\n%s", WIFEXITED(rc) ? WEXITSTATUS(rc) : -1,
              out);
    CHECK_MSG(strstr(out, " passed") != NULL && strstr(out, "skipped") == NULL, "pytest ran nothing, or skipped:\n%s",
              out);
}
