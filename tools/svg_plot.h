/* SPDX-License-Identifier: Apache-2.0 */
/* A small SVG writer for the CLI's pictures: line charts (a bench sweep's
 * GB/s over block size) and horizontal bar charts (bench/compare's ratios).
 * Axes labelled, ticks at round values, a legend; no dependencies. */
#ifndef FERRY_TOOLS_SVG_PLOT_H
#define FERRY_TOOLS_SVG_PLOT_H

#include <stddef.h>

struct svg_series {
    const char *name;
    const double *x, *y;
    int n;
};

struct svg_lines {
    const char *title, *x_label, *y_label;
    int x_log2_sizes; /* x is a size in bytes: log2 scale, ticks "4 KiB", "1 MiB" */
    const struct svg_series *series;
    int nseries;
};

struct svg_bars {
    const char *title, *x_label;
    const char *const *labels;
    const double *values;
    int n;
    double reference; /* a dashed line at this value (1.0 for ratios), or <= 0 for none */
    const int *lower_better; /* per bar (or NULL: higher is better): a bar on the wrong side of
                              * the reference is red */
};

/* Write the chart to path; 0, or -1 with errno set. */
int svg_write_lines(const char *path, const struct svg_lines *chart);
int svg_write_bars(const char *path, const struct svg_bars *chart);

#endif
