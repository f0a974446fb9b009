/*
 * test_readme.c - a README whose examples rot is a bug: every ```sh and ```sql block of README.md runs
 * (against the embedded default, in a fresh PGJOBQ_HOME), and the ```c block compiles and runs.  The
 * ```console block (make demo, make check) is what .ci/run runs.  Also: the programs in examples/.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"


static const char *srcdir(void)
{
    const char *s = getenv("PGJOBQ_SRCDIR");
    return s && s[0] ? s : ".";
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    long size;
    char *s;

    CHECK_MSG(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    rewind(f);
    s = calloc(1, (size_t)size + 1);
    CHECK(s && fread(s, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    return s;
}

/* Runs a shell command line, failing the test with its output when it does not exit 0. */
static void sh(const char *what, const char *cmd)
{
    char full[8192], log[600];
    snprintf(log, sizeof log, "%s/readme.log", t_tmpdir());
    snprintf(full, sizeof full, "{ %s ; } > '%s' 2>&1", cmd, log);
    int status = system(full);
    if (status != 0) {
        char *out = slurp(log);
        t_fail(__FILE__, __LINE__, "%s failed (status %d):\n%s", what, status, out);
    }
}

/* Writes the n-th block fenced with ```lang (1-based) into path; returns 0 when there is none. */
static int extract(const char *readme, const char *lang, int n, const char *path)
{
    char fence[32];
    const char *p = readme;

    snprintf(fence, sizeof fence, "\n```%s\n", lang);
    for (int i = 0; i < n; i++) {
        p = strstr(p, fence);
        if (p == NULL)
            return 0;
        p += strlen(fence);
    }
    const char *end = strstr(p, "\n```\n");
    CHECK(end != NULL);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fwrite(p, 1, (size_t)(end - p) + 1, f);
    fclose(f);
    return 1;
}

TEST_FULL(readme_every_example_runs, 240, 0)
{
    char readme_path[600], script[600], cmd[4096], bindir[600], what[64];
    char *readme;
    int blocks = 0;

    snprintf(readme_path, sizeof readme_path, "%s/README.md", srcdir());
    readme = slurp(readme_path);
    t_use_embedded_home();
    /* The pgjobq under test comes first on PATH (the README puts $PWD/build in front of it). */
    snprintf(bindir, sizeof bindir, "%s", getenv("PGJOBQ_CLI"));
    *strrchr(bindir, '/') = '\0';
    snprintf(cmd, sizeof cmd, "%s:%s", bindir, getenv("PATH"));
    setenv("PATH", cmd, 1);

    /* The shell blocks, in order, in one shell each, from the source directory (as a reader would). */
    for (int n = 1;; n++) {
        snprintf(script, sizeof script, "%s/block%d.sh", t_tmpdir(), n);
        if (!extract(readme, "sh", n, script))
            break;
        snprintf(cmd, sizeof cmd, "cd '%s' && bash -e '%s'", srcdir(), script);
        snprintf(what, sizeof what, "README sh block %d", n);
        sh(what, cmd);
        blocks++;
    }
    CHECK_MSG(blocks >= 4, "only %d sh blocks found", blocks);

    /* The SQL block, through `pgjobq db psql`. */
    snprintf(script, sizeof script, "%s/block.sql", t_tmpdir());
    CHECK(extract(readme, "sql", 1, script));
    snprintf(cmd, sizeof cmd, "pgjobq db psql -X -q -v ON_ERROR_STOP=1 -f '%s'", script);
    sh("README sql block", cmd);

    /* The C block compiles against the public header and the library, and runs. */
    snprintf(script, sizeof script, "%s/hello.c", t_tmpdir());
    CHECK(extract(readme, "c", 1, script));
    /* The same code-generation flags as the library (the sanitizer build needs its runtime too). */
    const char *flags = getenv("PGJOBQ_TEST_CFLAGS") ? getenv("PGJOBQ_TEST_CFLAGS") : "";
    snprintf(cmd, sizeof cmd,
             "cc -std=c11 -Wall -Wextra -Werror %s -I'%s/include' $(pkg-config --cflags libpq 2>/dev/null) '%s' "
             "'%s/libpgjobq.a' $(pkg-config --libs libpq 2>/dev/null || echo -lpq) -lpthread -o '%s/hello' && "
             "'%s/hello' \"$(pgjobq db url)\" | grep -q completed",
             flags, srcdir(), script, bindir, t_tmpdir(), t_tmpdir());
    sh("README c block", cmd);
    free(readme);
}

TEST_FULL(examples_producer_and_worker_run, 120, 0)
{
    const char *dir = getenv("PGJOBQ_EXAMPLES");
    char path[600];
    PGconn *pg = t_pg();

    CHECK_MSG(dir != NULL, "PGJOBQ_EXAMPLES is not set (run through make check)");
    snprintf(path, sizeof path, "%s/producer '%s' 50", dir, t_conninfo());
    sh("examples/producer", path);
    CHECK_INT(t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'example'"), 52);

    snprintf(path, sizeof path, "%s/worker", dir);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        execl(path, path, t_conninfo(), (char *)NULL);
        _exit(127);
    }
    long long done = 0;
    for (int64_t deadline = t_now_ms() + 60000; t_now_ms() < deadline && done < 52;) {
        done = t_int(pg, "SELECT count(*) FROM pgjobq.all_jobs WHERE queue = 'example' AND state = 'completed'"
                         " AND result->>'ok' = 'true'");
        struct timespec pause = {0, 20 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    CHECK_INT(done, 52);
    kill(pid, SIGTERM);
    CHECK_INT(t_wait_exit(pid, 30000), 0);
    PQfinish(pg);
}

/* The README's first command needs only what pgjobq needs: `make demo` runs to its summary on a
 * machine where none of the test tools is on PATH, and asks for none of them (as root it would
 * install them, as anyone else it would stop with "missing packages"). */
TEST_FULL(readme_make_demo_needs_no_test_tools, 240, 0)
{
    char bin[512], log[600], cmd[4096];
    const char *cli = getenv("PGJOBQ_CLI");
    char *out;

    CHECK_MSG(cli != NULL && strrchr(cli, '/') != NULL, "PGJOBQ_CLI is not set (run through make check)");
    t_use_embedded_home();
    /* PATH: every program of the standard directories except the test tools. */
    snprintf(bin, sizeof bin, "%s/bin", t_tmpdir());
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s' && for d in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do "
             "for f in \"$d\"/*; do n=${f##*/}; case $n in chromium|chromium-browser|promtool|node|nodejs|npm|"
             "g++|c++|g++-*|x86_64-linux-gnu-g++*|pg_autoctl|pgbouncer) continue;; esac; "
             "[ -e '%s'/\"$n\" ] || ln -s \"$f\" '%s'/\"$n\"; done; done",
             bin, bin, bin);
    CHECK_INT(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "PATH='%s' command -v chromium promtool node g++ pg_autoctl", bin);
    CHECK_MSG(system(cmd) != 0, "a test tool is still on the filtered PATH");

    /* The build directory the tests were made from, so that nothing is rebuilt. */
    char b[512];
    snprintf(b, sizeof b, "%.*s", (int)(strrchr(cli, '/') - cli), cli);
    snprintf(log, sizeof log, "%s/make-demo.log", t_tmpdir());
    snprintf(cmd, sizeof cmd, "cd '%s' && PATH='%s' make --no-print-directory B='%s' demo DEMO_ARGS='--jobs 2000 --concurrency 16' > '%s' 2>&1",
             srcdir(), bin, b, log);
    int status = system(cmd);
    out = slurp(log);
    CHECK_MSG(status == 0, "make demo failed (status %d):\n%s", status, out);
    CHECK_MSG(strstr(out, "pgjobq demo: 2000 jobs") != NULL && strstr(out, "throughput") != NULL, "make demo:\n%s", out);
    CHECK_MSG(strstr(out, "missing packages") == NULL && strstr(out, "chromium") == NULL, "make demo:\n%s", out);
    free(out);

    /* As an ordinary user (as root the dependency check would install, not refuse): the check make
     * demo runs, then the demo itself, with the same PATH, a home of that user's own. */
    if (geteuid() != 0)
        return; /* this run is the ordinary user's already */
    snprintf(cmd, sizeof cmd, "runuser -u nobody -- test -r '%s/tools/ensure-deps.sh' -a -x '%s'", srcdir(), cli);
    if (system(cmd) != 0) {
        fprintf(stderr, "nobody cannot read %s or run %s: the ordinary-user half is skipped\n", srcdir(), cli);
        return;
    }
    char home[600];
    snprintf(home, sizeof home, "%s/nobody-home", t_tmpdir());
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && chown nobody '%s' && chmod 755 '%s'", home, home, t_tmpdir());
    CHECK_INT(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "cd '%s' && runuser -u nobody -- env -i PATH='%s' HOME='%s' PGJOBQ_HOME='%s/pg' sh -c "
             "'sh tools/ensure-deps.sh --server && %s demo --jobs 1000 --concurrency 8 && %s db stop' > '%s' 2>&1",
             srcdir(), bin, home, home, cli, cli, log);
    status = system(cmd);
    out = slurp(log);
    CHECK_MSG(status == 0, "make demo's steps as nobody failed (status %d):\n%s", status, out);
    CHECK_MSG(strstr(out, "pgjobq demo: 1000 jobs") != NULL && strstr(out, "missing packages") == NULL,
              "as nobody:\n%s", out);
    free(out);
}
