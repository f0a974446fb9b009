/*
 * usage.c - the command line of every command, from its one table of options (cli_opt): parsing it,
 * --help, the overview of all commands, and usage errors.
 */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* Writes text to f, reflowed at 100 columns (its own line breaks count as spaces); lines after the
 * first start with indent spaces (the first is assumed to start there already). */
static void print_wrapped(FILE *f, const char *text, int indent)
{
    const int width = 100;
    int col = indent;

    while (*text == ' ' || *text == '\n')
        text++;
    while (*text) {
        size_t word = strcspn(text, " \n");
        if (col > indent && col + 1 + (int)word > width) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fwrite(text, 1, word, f);
        col += (int)word;
        text += word;
        while (*text == ' ' || *text == '\n')
            text++;
    }
    fputc('\n', f);
}

/* `man pgjobq` once installed; from a source tree, the page itself. */
static const char *man_hint(void)
{
    FILE *f = fopen("docs/pgjobq.1", "r");
    if (f) {
        fclose(f);
        return "`man -l docs/pgjobq.1` (`man pgjobq` once installed)";
    }
    return "`man pgjobq`";
}

void cli_main_usage(FILE *to, const cli_cmd *commands, size_t ncommands)
{
    fprintf(to,
            "usage: %s [--db URL] COMMAND [OPTIONS] [ARGS]\n"
            "       %s COMMAND --help | help [COMMAND] | --help | --version\n\n"
            "A job queue that lives in PostgreSQL.\n\nCommands:\n",
            cli_self, cli_self);
    for (size_t i = 0; i < ncommands; i++) {
        fprintf(to, "  %-10s ", commands[i].name);
        print_wrapped(to, commands[i].summary, 13);
    }
    fprintf(to,
            "\nThe database is --db URL, else $PGJOBQ_DATABASE_URL, else $DATABASE_URL, else an\n"
            "embedded PostgreSQL in $PGJOBQ_HOME, created and started on first use.\n"
            "Run `%s COMMAND --help` for a command's options;\n%s for everything.\n",
            cli_self, man_hint());
}

void cli_usage(const cli_cmd *cmd, FILE *to)
{
    fprintf(to, "usage: pgjobq %s [OPTIONS]%s%s\n\n%s\n\nOptions:\n", cmd->name, cmd->args[0] ? " " : "", cmd->args,
            cmd->summary);
    for (const cli_opt *o = cmd->opts; o->name; o++) {
        char left[64];
        if (o->key < 256 && o->key != OPT_HELP)
            snprintf(left, sizeof left, "-%c, --%s%s%s", o->key, o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        else
            snprintf(left, sizeof left, "    --%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        /* A long option name gets a line of its own; the help is wrapped under its column. */
        if (strlen(left) > 26)
            fprintf(to, "  %s\n%29s", left, "");
        else
            fprintf(to, "  %-26s ", left);
        print_wrapped(to, o->help, 29);
    }
}

int cli_usage_error(const cli_cmd *cmd, const char *fmt, ...)
{
    char prefix[64], suffix[96];
    va_list ap;

    snprintf(prefix, sizeof prefix, "pgjobq %s: ", cmd->name);
    snprintf(suffix, sizeof suffix, "\nTry 'pgjobq %s --help'.\n", cmd->name);
    va_start(ap, fmt);
    cli_vsay(prefix, fmt, ap, suffix);
    va_end(ap);
    return EX_USAGE;
}

int cli_parse(const cli_cmd *cmd, int argc, char **argv, int (*on_opt)(int key, const char *arg, void *ctx), void *ctx)
{
    struct option longopts[64];
    char shortopts[128];
    size_t n = 0, s = 0;
    int key;

    /* Options may follow operands (GNU style; `--` ends them); ':' reports a missing value as ':'. */
    shortopts[s++] = ':';
    for (const cli_opt *o = cmd->opts; o->name && n < 63; o++, n++) {
        longopts[n].name = o->name;
        longopts[n].has_arg = o->arg ? required_argument : no_argument;
        longopts[n].flag = NULL;
        longopts[n].val = o->key;
        if (o->key < 256 && s < sizeof shortopts - 3) {
            shortopts[s++] = (char)o->key;
            if (o->arg)
                shortopts[s++] = ':';
        }
    }
    memset(&longopts[n], 0, sizeof longopts[n]);
    shortopts[s] = '\0';

    opterr = 0;
    optind = 1;
    while ((key = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        if (key == '?') {
            if (optopt && optopt < 256)
                cli_usage_error(cmd, "unknown option '-%c'", optopt);
            else
                cli_usage_error(cmd, "unknown option '%s'", argv[optind - 1]);
            return -1;
        }
        if (key == ':') {
            cli_usage_error(cmd, "option '%s' needs a value", argv[optind - 1]);
            return -1;
        }
        if (key == OPT_HELP) {
            cli_usage(cmd, stdout);
            return -2;
        }
        if (key == OPT_DB) {
            cli_db_url = optarg;
            continue;
        }
        if (key == OPT_CLUSTER) {
            cli_cluster_arg = optarg;
            continue;
        }
        if (on_opt && on_opt(key, optarg, ctx) != 0)
            return -1;
    }
    return optind;
}
