/*
 * test_tls.c - TLS on loopback: a cluster of its own with a self-signed CA and a certificate for
 * "localhost"; sslmode=verify-full succeeds with the right CA, and fails with a wrong CA or a host
 * name the certificate does not name.  Passwords never appear in errors.
 */
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static char dir[600], data[700];

static void stop_cluster(void)
{
    char pg_ctl[700];
    snprintf(pg_ctl, sizeof pg_ctl, "%s/pg_ctl", t_bindir());
    const char *argv[] = {pg_ctl, "-D", data, "-m", "immediate", "-w", "stop", NULL};
    harness_run_as_owner(argv, NULL);
}

static int free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static void sh(const char *cmd)
{
    char full[4096];
    snprintf(full, sizeof full, "cd '%s' && { %s ; } >> openssl.log 2>&1", dir, cmd);
    CHECK_MSG(system(full) == 0, "failed: %s", cmd);
}

static int open_status(const char *conninfo, char *msg, size_t size)
{
    pgjobq_client *c = NULL;
    int rc = pgjobq_client_open(&c, conninfo);
    snprintf(msg, size, "%s", pgjobq_errmsg(c));
    pgjobq_client_close(c);
    return rc;
}

TEST_FULL(tls_verify_full_accepts_the_right_server_only, 120, 0)
{
    char ci[1400], msg[1024], initdb[700], pg_ctl[700], conf[800];
    const char *uid = getenv("PGJOBQ_TEST_OWNER_UID"), *gid = getenv("PGJOBQ_TEST_OWNER_GID");
    int port = free_port();

    snprintf(dir, sizeof dir, "%s/tls", t_tmpdir());
    snprintf(data, sizeof data, "%s/data", dir);
    CHECK(mkdir(dir, 0755) == 0);
    /* A CA, a certificate for DNS:localhost only (no IP address), and an unrelated second CA. */
    sh("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj '/CN=pgjobq test CA' -keyout ca.key -out ca.crt");
    sh("openssl req -newkey rsa:2048 -nodes -subj '/CN=localhost' -keyout server.key -out server.csr");
    sh("printf 'subjectAltName=DNS:localhost\\n' > san.ext && "
       "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out server.crt");
    sh("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj '/CN=someone else' -keyout other.key -out other.crt");
    sh("chmod 600 server.key");
    if (geteuid() == 0 && uid && gid) {
        char cmd[200];
        snprintf(cmd, sizeof cmd, "chown %s:%s . server.key server.crt", uid, gid);
        sh(cmd);
    }
    snprintf(initdb, sizeof initdb, "%s/initdb", t_bindir());
    const char *init_argv[] = {initdb, "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", NULL};
    CHECK_INT(harness_run_as_owner(init_argv, NULL), 0);
    t_defer(stop_cluster);
    snprintf(conf, sizeof conf, "%s/postgresql.conf", data);
    FILE *f = fopen(conf, "a");
    CHECK(f != NULL);
    fprintf(f, "listen_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\nssl = on\n"
               "ssl_cert_file = '%s/server.crt'\nssl_key_file = '%s/server.key'\nfsync = off\n",
            port, dir, dir, dir);
    fclose(f);
    /* Only TLS connections over TCP. */
    snprintf(conf, sizeof conf, "%s/pg_hba.conf", data);
    f = fopen(conf, "w");
    CHECK(f != NULL);
    fprintf(f, "local all all trust\nhostssl all all 127.0.0.1/32 trust\n");
    fclose(f);
    snprintf(pg_ctl, sizeof pg_ctl, "%s/pg_ctl", t_bindir());
    char log[700];
    snprintf(log, sizeof log, "%s/server.log", dir);
    const char *start_argv[] = {pg_ctl, "-D", data, "-l", log, "-w", "-t", "60", "start", NULL};
    CHECK_INT(harness_run_as_owner(start_argv, NULL), 0);

    /* Right CA, right name: connected (the database has no pgjobq schema, which is the next check). */
    snprintf(ci, sizeof ci, "host=localhost port=%d user=postgres dbname=postgres sslmode=verify-full sslrootcert=%s/ca.crt",
             port, dir);
    CHECK_MSG(open_status(ci, msg, sizeof msg) == PGJOBQ_ESCHEMA, "verify-full with the right CA: %s", msg);

    /* A wrong CA: refused. */
    snprintf(ci, sizeof ci, "host=localhost port=%d user=postgres dbname=postgres sslmode=verify-full sslrootcert=%s/other.crt",
             port, dir);
    CHECK_INT(open_status(ci, msg, sizeof msg), PGJOBQ_ECONN);
    CHECK_MSG(strstr(msg, "certificate") != NULL, "wrong CA: %s", msg);

    /* The right CA, but a host name the certificate does not name: refused. */
    snprintf(ci, sizeof ci, "host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=verify-full sslrootcert=%s/ca.crt",
             port, dir);
    CHECK_INT(open_status(ci, msg, sizeof msg), PGJOBQ_ECONN);
    CHECK_MSG(strstr(msg, "does not match host name") != NULL, "wrong host: %s", msg);

    /* Without TLS the server refuses (hostssl only); and a password in the URL never shows. */
    snprintf(ci, sizeof ci, "postgresql://postgres:pa55-s3cret@localhost:%d/postgres?sslmode=disable", port);
    CHECK_INT(open_status(ci, msg, sizeof msg), PGJOBQ_ECONN);
    CHECK_MSG(strstr(msg, "pa55-s3cret") == NULL, "the password leaked: %s", msg);

    /* And the command agrees: verify-full works end to end, migrate included. */
    char *out, *err;
    snprintf(ci, sizeof ci, "postgresql://postgres@localhost:%d/postgres?sslmode=verify-full&sslrootcert=%s/ca.crt",
             port, dir);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "--db", ci, "migrate", NULL), 0);
    free(out);
    free(err);
    CHECK_INT(t_cli(&out, &err, NULL, 0, "--db", ci, "enqueue", "{\"over\": \"tls\"}", NULL), 0);
    free(out);
    free(err);
}
