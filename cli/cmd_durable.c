/*
 * cmd_durable.c - durable execution from the command line (docs/durable.md): `pgjobq step`, which an
 * --exec handler runs for a step, a durable sleep or a wait for an event of its own job (named by
 * PGJOBQ_JOB_ID and PGJOBQ_LEASE_TOKEN, the job's variables), and `pgjobq send-event`.
 */
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "sbuf.h"
#include "work.h"

extern char **environ;

#define OPT_SLEEP      1201
#define OPT_WAIT_EVENT 1202
#define OPT_KEY        1203
#define OPT_TIMEOUT    1204
#define OPT_PAYLOAD    1205

const cli_opt step_opts[] = {
    {"sleep", OPT_SLEEP, "DURATION",
     "a durable sleep named NAME instead of a command: exit 0 once it is over; 98 when it parked the job "
     "(the handler exits 98 then)"},
    {"wait-event", OPT_WAIT_EVENT, "EVENT",
     "wait for the event EVENT instead of running a command: print its payload; exit 98 when it parked the "
     "job, 2 when --timeout passed"},
    {"key", OPT_KEY, "KEY", "with --wait-event: the event's key (default: none, \"\")"},
    {"timeout", OPT_TIMEOUT, "DURATION",
     "with --wait-event: stop waiting DURATION after the wait's first call (default: 100 years)"},
    CLI_COMMON_OPTS,
    {NULL, 0, NULL, NULL}};

const cli_opt send_event_opts[] = {{"payload", OPT_PAYLOAD, "JSON", "the event's payload (default: null)"},
                                   CLI_CLUSTER_OPT,
                                   CLI_COMMON_OPTS,
                                   {NULL, 0, NULL, NULL}};

typedef struct step_args {
    const cli_cmd *cmd;
    const char *sleep, *event, *key, *timeout, *payload;
} step_args;

static int step_opt(int key, const char *arg, void *ctx)
{
    step_args *a = ctx;
    switch (key) {
    case OPT_SLEEP: a->sleep = arg; break;
    case OPT_WAIT_EVENT: a->event = arg; break;
    case OPT_KEY: a->key = arg; break;
    case OPT_TIMEOUT: a->timeout = arg; break;
    case OPT_PAYLOAD: a->payload = arg; break;
    default: break;
    }
    return 0;
}

/* The job of the --exec handler this runs under: its id and lease token, from its variables. */
static int job_of_handler(const cli_cmd *cmd, int64_t *id, int64_t *token)
{
    const char *id_s = getenv("PGJOBQ_JOB_ID"), *token_s = getenv("PGJOBQ_LEASE_TOKEN");
    long long v;
    char why[128];

    if (id_s == NULL || token_s == NULL)
        return cli_usage_error(cmd, "PGJOBQ_JOB_ID and PGJOBQ_LEASE_TOKEN are not set: run it from an --exec "
                                    "handler of `pgjobq work`, whose job they name");
    if (cli_parse_int(id_s, 1, INT64_MAX, &v, why, sizeof why) != 0)
        return cli_usage_error(cmd, "PGJOBQ_JOB_ID: %s", why);
    *id = v;
    if (cli_parse_int(token_s, INT64_MIN + 1, INT64_MAX, &v, why, sizeof why) != 0)
        return cli_usage_error(cmd, "PGJOBQ_LEASE_TOKEN: %s", why);
    *token = v;
    return EX_OK;
}

/* Runs argv with our stdin and stderr and its stdout into out (at most PGJOBQ_PAYLOAD_MAX + 1
 * bytes kept): its exit status (128 + a signal), or -1 when it could not be run (said). */
static int run_command(char **argv, sbuf *out)
{
    posix_spawn_file_actions_t fa;
    int fds[2], status = 0;
    pid_t pid;
    char buf[65536];

    if (pipe(fds) != 0) {
        cli_err("pipe: %s", strerror(errno));
        return -1;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        cli_err("cannot run %s: %s", argv[0], strerror(rc));
        return -1;
    }
    for (;;) {
        ssize_t n = read(fds[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        if (out->len <= PGJOBQ_PAYLOAD_MAX)
            sb_putn(out, buf, (size_t)n);
    }
    close(fds[0]);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The step's result from a command's standard output: the JSON document it printed, else its text
 * as a JSON string (malloc'd; NULL with the reason said). */
static char *result_of_output(sbuf *out)
{
    char why[160];
    size_t len = out->len;

    if (out->failed || len > PGJOBQ_PAYLOAD_MAX) {
        cli_err("the step's command printed more than %d bytes: a step's result is at most that", PGJOBQ_PAYLOAD_MAX);
        return NULL;
    }
    while (len > 0 && (out->data[len - 1] == '\n' || out->data[len - 1] == '\r'))
        len--;
    if (len > 0 && pgjobq_json_check(out->data, len, NULL, 0) == PGJOBQ_OK)
        return strndup(out->data, len);
    if (out->data && memchr(out->data, '\0', len) != NULL) {
        cli_err("the step's command printed a NUL byte: its output is no result");
        return NULL;
    }
    char *text = strndup(out->data ? out->data : "", len), *json = NULL;
    sbuf enc;
    sb_init(&enc);
    sb_json(&enc, text ? text : "");
    free(text);
    if (text == NULL || enc.failed) {
        sb_free(&enc);
        cli_err("out of memory");
        return NULL;
    }
    json = enc.data;
    if (pgjobq_json_check(json, strlen(json), why, sizeof why) != PGJOBQ_OK) {
        cli_err("the step's command printed what is neither JSON nor UTF-8 text: %s", why);
        free(json);
        return NULL;
    }
    return json;
}

static int step_command(pgjobq_client *c, int64_t id, int64_t token, const char *name, char **argv)
{
    char *stored = NULL, *result;
    sbuf out;
    int rc = pgjobq_step_get(c, id, token, name, &stored);

    if (rc == PGJOBQ_OK) {
        printf("%s\n", stored);
        pgjobq_free(stored);
        return EX_OK;
    }
    if (rc != PGJOBQ_ENOTFOUND)
        return cli_fail(c, rc);
    sb_init(&out);
    int status = run_command(argv, &out);
    if (status != 0) {
        sb_free(&out);
        if (status > 0)
            cli_err("step %s: %s exited with status %d: nothing stored", name, argv[0], status);
        return status > 0 ? status : EX_UNAVAILABLE;
    }
    result = result_of_output(&out);
    sb_free(&out);
    if (result == NULL)
        return EX_DATAERR;
    rc = pgjobq_step_put(c, id, token, name, result, &stored);
    if (rc == PGJOBQ_OK || rc == PGJOBQ_EDUPLICATE) {
        printf("%s\n", rc == PGJOBQ_OK ? result : stored);
        rc = PGJOBQ_OK;
    }
    free(result);
    pgjobq_free(stored);
    return rc == PGJOBQ_OK ? EX_OK : cli_fail(c, rc);
}

/* A sleep's or a wait's answer that ends the attempt: parked (or ended cancelled there). */
static int parked(pgjobq_client *c, int rc)
{
    if (rc == PGJOBQ_ECANCELLED)
        cli_err("%s", pgjobq_errmsg(c));
    return WORK_EXIT_PARKED;
}

int cmd_step(const cli_cmd *cmd, int argc, char **argv)
{
    step_args a = {cmd, NULL, NULL, NULL, NULL, NULL};
    int64_t id = 0, token = 0, ms = -1;
    char why[160];
    int status, rc;

    int first = cli_parse(cmd, argc, argv, step_opt, &a);
    if (first == -2)
        return EX_OK;
    if (first < 0)
        return EX_USAGE;
    if (first >= argc)
        return cli_usage_error(cmd, "expected NAME: the step's name");
    int has_command = argc - first > 1;
    if (has_command + (a.sleep != NULL) + (a.event != NULL) != 1)
        return cli_usage_error(cmd, "give one of: a command (after --), --sleep DURATION, --wait-event EVENT");
    if ((a.key || a.timeout) && a.event == NULL)
        return cli_usage_error(cmd, "--key and --timeout go with --wait-event");
    if (a.sleep && cli_parse_duration_ms(a.sleep, &ms, why, sizeof why) != 0)
        return cli_usage_error(cmd, "--sleep: %s", why);
    if (a.timeout && cli_parse_duration_ms(a.timeout, &ms, why, sizeof why) != 0)
        return cli_usage_error(cmd, "--timeout: %s", why);
    if ((status = job_of_handler(cmd, &id, &token)) != EX_OK)
        return status;
    pgjobq_client *c = cli_connect(0, &status);
    if (c == NULL)
        return status;
    const char *name = argv[first];
    if (has_command) {
        status = step_command(c, id, token, name, argv + first + 1);
    } else if (a.sleep) {
        rc = pgjobq_job_sleep(c, id, token, name, ms, NULL);
        status = rc == PGJOBQ_OK ? EX_OK : rc == PGJOBQ_PARKED || rc == PGJOBQ_ECANCELLED ? parked(c, rc) : cli_fail(c, rc);
    } else {
        char *payload = NULL;
        rc = pgjobq_job_wait_event(c, id, token, name, a.event, a.key, a.timeout ? ms : -1, &payload);
        if (rc == PGJOBQ_OK)
            printf("%s\n", payload);
        else if (rc == PGJOBQ_ETIMEOUT)
            cli_err("%s", pgjobq_errmsg(c));
        status = rc == PGJOBQ_OK ? EX_OK : rc == PGJOBQ_ETIMEOUT ? 2
               : rc == PGJOBQ_PARKED || rc == PGJOBQ_ECANCELLED ? parked(c, rc) : cli_fail(c, rc);
        pgjobq_free(payload);
    }
    cli_close(c);
    return status;
}

int cmd_send_event(const cli_cmd *cmd, int argc, char **argv)
{
    step_args a = {cmd, NULL, NULL, NULL, NULL, NULL};
    char why[160];
    int status, resumed = 0;

    int first = cli_parse(cmd, argc, argv, step_opt, &a);
    if (first == -2)
        return EX_OK;
    if (first < 0)
        return EX_USAGE;
    if (argc - first < 1 || argc - first > 2)
        return cli_usage_error(cmd, "expected NAME [KEY]");
    if (a.payload && pgjobq_json_check(a.payload, strlen(a.payload), why, sizeof why) != PGJOBQ_OK)
        return cli_usage_error(cmd, "--payload: %s", why);
    if (cli_cluster_spec() != NULL) {
        /* Every shard: a job waiting for it may be on any (pgjobq_cluster_send_event). */
        pgjobq_cluster *cl = cli_cluster_open(&status);
        if (cl == NULL)
            return status;
        int rc = pgjobq_cluster_send_event(cl, argv[first], argc - first > 1 ? argv[first + 1] : NULL, a.payload,
                                           &resumed);
        if (rc == PGJOBQ_OK) {
            printf("%d\n", resumed);
            status = EX_OK;
        } else {
            status = cli_cluster_fail(cl, rc);
            if (rc != PGJOBQ_EINVAL)
                cli_err("the shards not named took the event (it resumed %d jobs there): send it again", resumed);
        }
        pgjobq_cluster_close(cl);
        return status;
    }
    pgjobq_client *c = cli_connect(0, &status);
    if (c == NULL)
        return status;
    int rc = pgjobq_send_event(c, argv[first], argc - first > 1 ? argv[first + 1] : NULL, a.payload, &resumed);
    if (rc != PGJOBQ_OK) {
        status = cli_fail(c, rc);
    } else {
        printf("%d\n", resumed);
        status = EX_OK;
    }
    cli_close(c);
    return status;
}
