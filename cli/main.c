/*
 * main.c - the pgjobq command: the table of commands, the global options, and the dispatch to a
 * command.  What the commands share lives in config.c, msg.c, usage.c and connect.c.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const cli_cmd commands[] = {
    {"migrate", "", "Create or upgrade the pgjobq schema (safe to run again, and from many hosts at once).",
     migrate_opts, cmd_migrate},
    {"enqueue", "[PAYLOAD]",
     "Add a job whose payload is the JSON document PAYLOAD ({} when omitted) and print its id;\n"
     "with --file, add one job per line of a JSON-lines file, all or none; with --graph, the jobs of a\n"
     "JSON graph (jobs that wait for others), all or none.",
     enqueue_opts, cmd_enqueue},
    {"list", "", "List jobs, newest first.", list_opts, cmd_list},
    {"show", "ID", "Show every field of one job, its parents (with their results) and its children.", show_opts,
     cmd_show},
    {"wait", "ID",
     "Wait until a job has finished (woken when it does), print its result; the exit status says how it\n"
     "ended: 0 completed, 1 failed, 2 cancelled, 65 no such job, 75 --timeout passed.",
     wait_opts, cmd_wait},
    {"step", "NAME [--sleep DURATION | --wait-event EVENT | -- COMMAND [ARGS]]",
     "In an --exec handler: run its job's step NAME once (print the stored result, or run COMMAND and\n"
     "store what it prints), a durable sleep or a wait for an event (exit status 98: the job was parked,\n"
     "and the handler exits 98 too).",
     step_opts, cmd_step},
    {"send-event", "NAME [KEY]",
     "Send the event NAME (with KEY): resume the jobs waiting for it (print how many); kept 7 days for\n"
     "the waits that begin later.",
     send_event_opts, cmd_send_event},
    {"graph", "ID", "Print the workflow a job belongs to: every job connected to it, by depth, with its parents.",
     graph_opts, cmd_graph},
    {"stats", "", "Count jobs per queue and state.", stats_opts, cmd_stats},
    {"health", "",
     "Show pgjobq.jobs' size and dead rows, and what holds vacuum back (the oldest open snapshot: a\n"
     "pg_dump, a report, a session idle in a transaction, a replication slot), with its age.",
     health_opts, cmd_health},
    {"cancel", "ID | --queue QUEUE --state STATE",
     "Cancel a job, or every job a filter matches: queued jobs at once, running ones at their worker's next "
     "heartbeat.",
     cancel_opts, cmd_cancel},
    {"retry", "ID | --running ID | --queue QUEUE --state STATE",
     "Run a finished or scheduled job, or every job a filter matches, again now; with --running, end a\n"
     "running job's lease now and run it again.",
     retry_opts, cmd_retry},
    {"skip", "ID",
     "Let the key that a failed job blocks in a strict-order queue move on without it (the job stays\n"
     "failed); `pgjobq retry ID` runs it again first instead.",
     skip_opts, cmd_skip},
    {"queue", "ls|pause|resume|drain|set [QUEUE]",
     "Show queues and their settings, pause and resume a queue on every worker, wait until a paused\n"
     "queue has nothing running (drain), set a queue's concurrency and rate limits and its longest lease.",
     queue_opts, cmd_queue},
    {"cron", "add|ls|rm|enable|disable|trigger|sync [NAME|FILE]",
     "Cron schedules in the database: every worker ticks them, and each fire time enqueues its job once.\n"
     "sync FILE makes the schedules exactly those of FILE (one JSON object per line).",
     schedule_opts, cmd_schedule},
    {"work", "", "Run jobs: claim them, run --exec CMD once per job, record the outcome; stop cleanly on SIGTERM.",
     work_opts, cmd_work},
    {"serve", "",
     "Serve Prometheus metrics (/metrics) and a web dashboard (/) over HTTP; read-only unless\n"
     "--allow-actions.",
     serve_opts, cmd_serve},
    {"demo", "", "Enqueue many jobs and run them with an in-process worker pool, live, then summarise.", demo_opts,
     cmd_demo},
    {"bench", "SCENARIO",
     "Measure: enqueue, drain, drain-exec, drain-coproc, latency, mixed, steady or soak (see bench/README.md).",
     bench_opts, cmd_bench},
    {"cluster", "init|show|move-queue|move-partitions|add-shard [ARG]",
     "A cluster of shards (docs/shards.md): init installs a new map in every shard and router, show prints\n"
     "it, move-queue, move-partitions and add-shard install the next map everywhere, in an order that\n"
     "keeps every job going to a shard that accepts it.",
     cluster_opts, cmd_cluster},
    {"db", "start|stop|status|url|psql [PSQL ARGS]",
     "Manage the embedded PostgreSQL that pgjobq uses when no database is configured.", db_opts, cmd_db},
};

#define NCOMMANDS (sizeof commands / sizeof commands[0])

int main(int argc, char **argv)
{
    int i = 1;

    /* How to name this program in hints: as it was run when that was a path (build/pgjobq), so that
     * the hints work from where the user stands. */
    if (argc > 0 && argv[0] && strchr(argv[0], '/') != NULL)
        cli_self = argv[0];
    /* Global options before the command. */
    while (i < argc && argv[i][0] == '-') {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            cli_main_usage(stdout, commands, NCOMMANDS);
            return EX_OK;
        }
        if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0) {
            printf("pgjobq %s (library %s, schema version %d)\n", PGJOBQ_VERSION, pgjobq_version(),
                   PGJOBQ_SCHEMA_VERSION);
            return EX_OK;
        }
        if (strcmp(argv[i], "--db") == 0 && i + 1 < argc) {
            cli_db_url = argv[i + 1];
            i += 2;
            continue;
        }
        if (strncmp(argv[i], "--db=", 5) == 0) {
            cli_db_url = argv[i] + 5;
            i++;
            continue;
        }
        cli_err("unknown option '%s'\nTry 'pgjobq --help'.", argv[i]);
        return EX_USAGE;
    }
    if (i >= argc) {
        cli_main_usage(stderr, commands, NCOMMANDS);
        return EX_USAGE;
    }
    /* `pgjobq help` and `pgjobq help COMMAND`, as --help. */
    if (strcmp(argv[i], "help") == 0) {
        if (i + 1 >= argc) {
            cli_main_usage(stdout, commands, NCOMMANDS);
            return EX_OK;
        }
        for (size_t k = 0; k < NCOMMANDS; k++)
            if (strcmp(argv[i + 1], commands[k].name) == 0) {
                cli_usage(&commands[k], stdout);
                return EX_OK;
            }
        fprintf(stderr, "pgjobq: unknown command '%s'\nTry '%s --help'.\n", argv[i + 1], cli_self);
        return EX_USAGE;
    }
    for (size_t k = 0; k < NCOMMANDS; k++)
        if (strcmp(argv[i], commands[k].name) == 0)
            return commands[k].run(&commands[k], argc - i, argv + i);
    cli_err("unknown command '%s'\nTry 'pgjobq --help'.", argv[i]);
    return EX_USAGE;
}
