/* SPDX-License-Identifier: Apache-2.0 */
/* The SVG writer behind `ferry bench --sweep --plot` and `ferry plot`
 * (bench/compare --plot): see svg_plot.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "svg_plot.h"
#include "util.h"

enum { WIDTH = 880, ML = 90, MR = 190, MT = 50, MB = 70 };

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
                                      "#e377c2"};

/* Text in an SVG element: the XML specials escaped. */
static void put_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static void text_at(FILE *f, double x, double y, const char *anchor, const char *extra, const char *s)
{
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" %s>", x, y, anchor, extra ? extra : "");
    put_text(f, s);
    fputs("</text>\n", f);
}

/* A round step for about `want` ticks over [0, hi]. */
static double nice_step(double hi, int want)
{
    double raw = hi / want, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

static void header(FILE *f, int width, int height, const char *title)
{
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"13\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            width, height, width, height);
    text_at(f, width / 2.0, 28, "middle", "font-size=\"16\" font-weight=\"bold\"", title);
}

/* The y axis (linear from 0), its grid and label; returns the top value. */
static double y_axis(FILE *f, double ymax, int height, const char *label)
{
    double plot_h = height - MT - MB, step = nice_step(ymax > 0 ? ymax : 1, 6);
    double top = ceil((ymax > 0 ? ymax : 1) / step) * step;
    for (double v = 0; v <= top + step / 2; v += step) {
        double y = MT + plot_h * (1 - v / top);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", ML, y, WIDTH - MR, y);
        char t[32];
        snprintf(t, sizeof t, "%g", v);
        text_at(f, ML - 8, y + 4, "end", NULL, t);
    }
    char rot[96];
    snprintf(rot, sizeof rot, "transform=\"rotate(-90 %d %.1f)\"", 24, MT + plot_h / 2);
    text_at(f, 24, MT + plot_h / 2, "middle", rot, label);
    return top;
}

int svg_write_lines(const char *path, const struct svg_lines *c)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    const int height = 520;
    double xmin = INFINITY, xmax = -INFINITY, ymax = 0;
    for (int s = 0; s < c->nseries; s++)
        for (int i = 0; i < c->series[s].n; i++) {
            double x = c->series[s].x[i], y = c->series[s].y[i];
            if (x < xmin) xmin = x;
            if (x > xmax) xmax = x;
            if (y > ymax) ymax = y;
        }
    if (!(xmin <= xmax)) xmin = xmax = 1;
    double lx0 = c->x_log2_sizes ? floor(log2(xmin)) : xmin, lx1 = c->x_log2_sizes ? ceil(log2(xmax)) : xmax;
    if (lx1 <= lx0) lx1 = lx0 + 1;
    double plot_w = WIDTH - ML - MR, plot_h = height - MT - MB;
#define XPOS(x) (ML + plot_w * (((c->x_log2_sizes ? log2(x) : (x)) - lx0) / (lx1 - lx0)))
    header(f, WIDTH, height, c->title);
    double top = y_axis(f, ymax, height, c->y_label);
    /* x ticks: every power of two on a log scale (every other one when many). */
    int every = c->x_log2_sizes && lx1 - lx0 > 12 ? 2 : 1;
    for (double t = lx0; c->x_log2_sizes && t <= lx1; t += every) {
        double x = ML + plot_w * ((t - lx0) / (lx1 - lx0));
        char lab[32];
        fmt_size((size_t)exp2(t), lab, sizeof lab);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#eee\"/>\n", x, MT, x, height - MB);
        text_at(f, x, height - MB + 18, "middle", NULL, lab);
    }
    if (!c->x_log2_sizes) {
        char lo[32], hi[32];
        snprintf(lo, sizeof lo, "%g", lx0);
        snprintf(hi, sizeof hi, "%g", lx1);
        text_at(f, ML, height - MB + 18, "middle", NULL, lo);
        text_at(f, WIDTH - MR, height - MB + 18, "middle", NULL, hi);
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"black\"/>\n", ML, MT,
            plot_w, plot_h);
    text_at(f, ML + plot_w / 2, height - 22, "middle", NULL, c->x_label);
    for (int s = 0; s < c->nseries; s++) {
        const struct svg_series *se = &c->series[s];
        const char *col = palette[s % 8];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        for (int i = 0; i < se->n; i++) fprintf(f, "%.1f,%.1f ", XPOS(se->x[i]), MT + plot_h * (1 - se->y[i] / top));
        fputs("\"/>\n", f);
        for (int i = 0; i < se->n; i++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", XPOS(se->x[i]),
                    MT + plot_h * (1 - se->y[i] / top), col);
        double ly = MT + 14 + 22.0 * s;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>\n",
                WIDTH - MR + 14, ly - 4, WIDTH - MR + 40, ly - 4, col);
        text_at(f, WIDTH - MR + 46, ly, "start", NULL, se->name);
    }
#undef XPOS
    fputs("</svg>\n", f);
    return fclose(f) == 0 ? 0 : -1;
}

int svg_write_bars(const char *path, const struct svg_bars *c)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    /* Room for the longest label (about 6.3 px a character at 11 px). */
    size_t longest = 0;
    for (int i = 0; i < c->n; i++)
        if (strlen(c->labels[i]) > longest) longest = strlen(c->labels[i]);
    const int bar_h = 22, label_w = 20 + (int)(6.3 * (double)longest), width = label_w + 460;
    int height = MT + MB + (c->n ? c->n : 1) * bar_h + 10;
    double vmax = c->reference > 0 ? c->reference : 0;
    for (int i = 0; i < c->n; i++)
        if (c->values[i] > vmax) vmax = c->values[i];
    double x0 = label_w, plot_w = width - label_w - 60, step = nice_step(vmax > 0 ? vmax : 1, 5);
    double top = ceil((vmax > 0 ? vmax : 1) / step) * step;
    header(f, width, height, c->title);
    double y_end = height - MB;
    for (double v = 0; v <= top + step / 2; v += step) {
        double x = x0 + plot_w * v / top;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x, MT, x, y_end);
        char t[32];
        snprintf(t, sizeof t, "%g", v);
        text_at(f, x, y_end + 18, "middle", NULL, t);
    }
    for (int i = 0; i < c->n; i++) {
        double y = MT + 5 + i * bar_h, w = plot_w * (c->values[i] > 0 ? c->values[i] : 0) / top;
        int lower = c->lower_better && c->lower_better[i];
        int worse = c->reference > 0 && (lower ? c->values[i] > c->reference : c->values[i] < c->reference);
        const char *col = worse ? "#d62728" : "#1f77b4";
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"%s\"/>\n", x0, y, w, bar_h - 6, col);
        text_at(f, x0 - 8, y + bar_h - 10, "end", "font-size=\"11\"", c->labels[i]);
        char v[32];
        snprintf(v, sizeof v, "%.2f", c->values[i]);
        text_at(f, x0 + w + 4, y + bar_h - 10, "start", "font-size=\"11\"", v);
    }
    if (c->reference > 0) {
        double x = x0 + plot_w * c->reference / top;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\" stroke-dasharray=\"5,4\"/>\n",
                x, MT, x, y_end);
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", x0, y_end, x0 + plot_w,
            y_end);
    text_at(f, x0 + plot_w / 2, height - 22, "middle", NULL, c->x_label);
    fputs("</svg>\n", f);
    return fclose(f) == 0 ? 0 : -1;
}
