/* SPDX-License-Identifier: Apache-2.0 */
/* The ferry command line: dispatches to self-registered subcommands. */
#include <stdio.h>
#include <string.h>

#include <ferry/ferry.h>

#include "cli.h"

static struct ferry_cmd *commands;

void ferry_cli_register(struct ferry_cmd *cmd)
{
    /* Keep the list sorted by name for the usage text. */
    struct ferry_cmd **pp = &commands;
    while (*pp && strcmp((*pp)->name, cmd->name) < 0) pp = &(*pp)->next;
    cmd->next = *pp;
    *pp = cmd;
}

static void usage(FILE *out)
{
    fprintf(out, "ferry %s: a data transfer engine for disaggregated LLM inference\n\nusage: ferry COMMAND [ARGS]\n\n",
            FERRY_VERSION_STRING);
    for (struct ferry_cmd *c = commands; c; c = c->next) fprintf(out, "  %-16s %s\n", c->name, c->help);
    fprintf(out, "\n`ferry help COMMAND` (or `ferry COMMAND --help`) describes a command's options.\n");
}

static struct ferry_cmd *find_command(const char *name)
{
    for (struct ferry_cmd *c = commands; c; c = c->next)
        if (strcmp(c->name, name) == 0) return c;
    return NULL;
}

/* ferry help [COMMAND]: the list, or the command's own --help text. */
static int help(int argc, char **argv)
{
    if (argc < 3) {
        usage(stdout);
        return 0;
    }
    struct ferry_cmd *c = find_command(argv[2]);
    if (!c) {
        fprintf(stderr, "ferry help: unknown command '%s'\n\n", argv[2]);
        usage(stderr);
        return 2;
    }
    char *args[] = {(char *)c->name, "--help", NULL};
    return c->fn(2, args);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "help") == 0) return help(argc, argv);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("ferry %s (library %s, protocol %d)\n", FERRY_VERSION_STRING, ferry_version(), FERRY_PROTOCOL_VERSION);
        return 0;
    }
    struct ferry_cmd *c = find_command(argv[1]);
    if (c) return c->fn(argc - 1, argv + 1);
    fprintf(stderr, "ferry: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
