/* SPDX-License-Identifier: Apache-2.0 */
/* ferry plot: draws a chart as SVG from lines on stdin, with the writer
 * `ferry bench --sweep --plot` uses (svg_plot.c). bench/compare --plot
 * draws its ratios with it.
 *
 *   ferry plot bars --out F.svg [--title T] [--x-label L] [--reference R]
 *       stdin: LABEL<TAB>VALUE[<TAB>lower|higher] a line, one bar each */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "svg_plot.h"

enum { MAX_BARS = 512 };

static int usage(FILE *f, int rc)
{
    fprintf(f, "usage: ferry plot bars --out FILE.svg [--title T] [--x-label L] [--reference R] < LINES\n"
               "Draws a horizontal bar chart as SVG. Each stdin line: LABEL<TAB>VALUE, optionally\n"
               "<TAB>lower (lower is better) or <TAB>higher (the default). With --reference (1 for\n"
               "ratios) a dashed line marks it and bars on its wrong side are red.\n"
               "`ferry bench --sweep --plot FILE.svg` draws sweeps; bench/compare --plot uses this.\n");
    return rc;
}

/* Reads the bars; their count, or -1 after saying which line is wrong. */
static int read_bars(FILE *in, char **labels, double *values, int *lower)
{
    char line[1024];
    int n = 0, lineno = 0;
    while (fgets(line, sizeof line, in)) {
        lineno++;
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0]) continue;
        char *tab = strchr(line, '\t'), *end;
        if (!tab || n == MAX_BARS) {
            fprintf(stderr, "ferry plot: line %d: %s\n", lineno, tab ? "too many bars" : "no TAB before the value");
            return -1;
        }
        *tab = '\0';
        double v = strtod(tab + 1, &end);
        if (end == tab + 1 || (*end && *end != '\t')) {
            fprintf(stderr, "ferry plot: line %d: '%s' is not a number\n", lineno, tab + 1);
            return -1;
        }
        labels[n] = strdup(line);
        values[n] = v;
        lower[n] = *end == '\t' && strcmp(end + 1, "lower") == 0;
        n++;
    }
    return n;
}

static int cmd_plot(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)
        return usage(argc < 2 ? stderr : stdout, argc < 2 ? 2 : 0);
    if (strcmp(argv[1], "bars") != 0) {
        fprintf(stderr, "ferry plot: unknown chart '%s' (bars)\n", argv[1]);
        return usage(stderr, 2);
    }
    static const struct option options[] = {
        {"out", required_argument, NULL, 'o'},     {"title", required_argument, NULL, 't'},
        {"x-label", required_argument, NULL, 'x'}, {"reference", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    const char *out = NULL, *title = "", *x_label = "";
    double reference = 0;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc - 1, argv + 1, "h", options, NULL)) != -1) {
        switch (opt) {
        case 'o': out = optarg; break;
        case 't': title = optarg; break;
        case 'x': x_label = optarg; break;
        case 'r': if (opt_double("plot", "reference", optarg, 0, 1e12, &reference)) return 2; break;
        case 'h': return usage(stdout, 0);
        default: return usage(stderr, 2);
        }
    }
    if (opt_none_left("plot", argc - 1, argv + 1) != 0 || !out) return usage(stderr, 2);
    static char *labels[MAX_BARS];
    static double values[MAX_BARS];
    static int lower[MAX_BARS];
    int n = read_bars(stdin, labels, values, lower);
    if (n < 0) return 1;
    struct svg_bars chart = {.title = title, .x_label = x_label, .labels = (const char *const *)labels,
                             .values = values, .n = n, .reference = reference, .lower_better = lower};
    int rc = svg_write_bars(out, &chart);
    if (rc != 0) perror(out);
    for (int i = 0; i < n; i++) free(labels[i]);
    return rc ? 1 : 0;
}

FERRY_COMMAND("plot", cmd_plot, "draw a bar chart as SVG from LABEL<TAB>VALUE lines (bench/compare --plot)")
