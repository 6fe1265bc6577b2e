/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * `--report FILE.html`: one self-contained page (inline CSS and SVG, no
 * script, nothing fetched) with the results table and, for each mode, a
 * timeline per instance: the job, the lock held and its fence, the pauses,
 * every transfer (red when the order was paid more than once), the stale
 * writes the store refused, and the moments the lease was found gone.
 */
#include "demo_int.h"

#include <dlock/dlock.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SVG_W 1320
#define LABEL_W 92
#define RIGHT_M 16
#define TOP_H 26
#define ROW_H 34
#define AXIS_H 28
#define PLOT_W (SVG_W - LABEL_W - RIGHT_M)

typedef struct {
    FILE *f;
    const demo_result *r;
    int64_t t0, t1;
} canvas;

static void put_esc(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static double xpos(const canvas *c, int64_t t)
{
    if (t < c->t0)
        t = c->t0;
    if (t > c->t1)
        t = c->t1;
    return LABEL_W + (double)(t - c->t0) * PLOT_W / (double)(c->t1 - c->t0);
}

static double ms(const canvas *c, int64_t t)
{
    return (double)(t - c->t0) / 1000.0;
}

static int row_y(int instance)
{
    return TOP_H + instance * ROW_H;
}

static int is_double(const demo_result *r, int64_t order)
{
    size_t lo = 0, hi = r->ndoubles;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r->doubles[mid] == order)
            return 1;
        if (r->doubles[mid] < order)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* The pauses, over the bars. */
static void draw_pauses(canvas *c, int n)
{
    const demo_result *r = c->r;
    for (int i = 0; i < n; i++) {
        int64_t frozen = -1;
        int y = row_y(i);
        for (size_t k = 0; k < r->nevents; k++) {
            const demo_event *ev = &r->events[k];
            if (ev->instance != i)
                continue;
            if (ev->type == EV_FROZEN) {
                frozen = ev->at_us;
            } else if (ev->type == EV_RESUMED && frozen >= 0) {
                double x0 = xpos(c, frozen), x1 = xpos(c, ev->at_us);
                fprintf(c->f,
                        "<rect class=\"pause\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" "
                        "height=\"%d\"><title>instance %d frozen (SIGSTOP) from %.1f ms to "
                        "%.1f ms: %.0f ms</title></rect>\n",
                        x0, y + 3, x1 - x0, ROW_H - 6, i, ms(c, frozen), ms(c, ev->at_us),
                        (ev->at_us - frozen) / 1000.0);
                if (x1 - x0 > 60)
                    fprintf(c->f, "<text class=\"plabel\" x=\"%.1f\" y=\"%d\">SIGSTOP</text>\n",
                            (x0 + x1) / 2, y + ROW_H / 2 + 4);
                frozen = -1;
            }
        }
    }
}

/* Jobs and lock tenures, per instance in arrival order (an instance's own
 * events arrive in the order it sent them). */
static void draw_bars(canvas *c, int n)
{
    const demo_result *r = c->r;
    for (int i = 0; i < n; i++) {
        int64_t fire = -1, acq = -1;
        uint64_t fence = 0;
        int y = row_y(i);
        for (size_t k = 0; k < r->nevents; k++) {
            const demo_event *ev = &r->events[k];
            if (ev->instance != i)
                continue;
            switch (ev->type) {
            case EV_FIRE:
                fire = ev->at_us;
                acq = -1;
                break;
            case EV_ACQUIRED:
                acq = ev->at_us;
                fence = ev->fence;
                break;
            case EV_DONE:
                if (fire >= 0) {
                    double x0 = xpos(c, fire), x1 = xpos(c, ev->at_us);
                    fprintf(c->f,
                            "<rect class=\"job\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\">"
                            "<title>instance %d, round %d: job from %.1f ms to %.1f ms</title>"
                            "</rect>\n",
                            x0, y + 8, x1 - x0 < 1 ? 1 : x1 - x0, ROW_H - 16, i, ev->round + 1,
                            ms(c, fire), ms(c, ev->at_us));
                }
                if (acq >= 0) {
                    double x0 = xpos(c, acq), x1 = xpos(c, ev->at_us);
                    fprintf(c->f,
                            "<rect class=\"held\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\">"
                            "<title>instance %d, round %d: took the lock with fence %" PRIu64
                            " at %.1f ms, released at %.1f ms (%s)</title></rect>\n",
                            x0, y + 6, x1 - x0 < 1 ? 1 : x1 - x0, ROW_H - 12, i, ev->round + 1,
                            fence, ms(c, acq), ms(c, ev->at_us), dlock_strerror(ev->code));
                    if (x1 - x0 > 26)
                        fprintf(c->f,
                                "<text class=\"flabel\" x=\"%.1f\" y=\"%d\">f%" PRIu64 "</text>\n",
                                x0 + 3, y + 14, fence);
                }
                fire = acq = -1;
                break;
            default:
                break;
            }
        }
    }
}

static void draw_marks(canvas *c)
{
    const demo_result *r = c->r;
    /* Payments first, doubles last so they stay on top. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t k = 0; k < r->nevents; k++) {
            const demo_event *ev = &r->events[k];
            if (ev->type != EV_PAID)
                continue;
            int dbl = is_double(r, ev->order);
            if (dbl != pass)
                continue;
            double x = xpos(c, ev->at_us);
            int y = row_y(ev->instance);
            fprintf(c->f,
                    "<line class=\"%s\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"><title>order "
                    "%" PRId64 " paid by instance %d (fence %" PRIu64 ") at %.1f ms%s</title>"
                    "</line>\n",
                    dbl ? "dbl" : "paid", x, x, dbl ? y + 2 : y + 10, dbl ? y + ROW_H - 2
                                                                         : y + ROW_H - 10,
                    ev->order, ev->instance, ev->fence, ms(c, ev->at_us),
                    dbl ? ": PAID MORE THAN ONCE" : "");
            /* A few doubles are easy to miss as thin lines: ring them. */
            if (dbl && r->ndoubles <= 40)
                fprintf(c->f, "<circle class=\"dblmark\" cx=\"%.1f\" cy=\"%d\" r=\"4\"/>\n", x,
                        y + ROW_H - 3);
        }
    }
    for (size_t k = 0; k < r->nevents; k++) {
        const demo_event *ev = &r->events[k];
        double x = xpos(c, ev->at_us);
        int y = row_y(ev->instance);
        int cy = y + ROW_H / 2;
        switch (ev->type) {
        case EV_REFUSED:
        case EV_REG_REFUSED:
            fprintf(c->f,
                    "<path class=\"refused\" d=\"M%.1f %d l8 8 m0 -8 l-8 8\"><title>stale write "
                    "refused by the store: instance %d, fence %" PRIu64 ", %s%" PRId64
                    " at %.1f ms</title></path>\n",
                    x - 4, cy - 4, ev->instance, ev->fence,
                    ev->type == EV_REFUSED ? "order " : "registration", ev->order,
                    ms(c, ev->at_us));
            break;
        case EV_LOST:
            fprintf(c->f,
                    "<path class=\"lost\" d=\"M%.1f %d l5 -7 l-10 0 z\"><title>on_lost: instance "
                    "%d's watchdog found the lock (fence %" PRIu64 ") gone at %.1f ms (%s)"
                    "</title></path>\n",
                    x, y + 8, ev->instance, ev->fence, ms(c, ev->at_us),
                    dlock_strerror(ev->code));
            break;
        case EV_EXPIRED:
            fprintf(c->f,
                    "<line class=\"expired\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"><title>"
                    "the lock server no longer holds instance %d's lock: %.1f ms</title></line>\n",
                    x, x, y + 1, y + ROW_H - 1, ev->instance, ms(c, ev->at_us));
            break;
        case EV_BUSY:
            fprintf(c->f,
                    "<circle class=\"busy\" cx=\"%.1f\" cy=\"%d\" r=\"2.5\"><title>instance %d "
                    "tried the lock: busy (%.2f ms)</title></circle>\n",
                    x, cy, ev->instance, ev->latency_us / 1000.0);
            break;
        case EV_ERROR:
            fprintf(c->f, "<circle class=\"err\" cx=\"%.1f\" cy=\"%d\" r=\"4\"><title>", x, cy);
            put_esc(c->f, ev->text);
            fprintf(c->f, "</title></circle>\n");
            break;
        default:
            break;
        }
    }
}

static void draw_axes(canvas *c, int n)
{
    const demo_result *r = c->r;
    int bottom = TOP_H + n * ROW_H;
    for (int i = 0; i < n; i++) {
        int y = row_y(i);
        fprintf(c->f, "<rect class=\"%s\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>\n",
                i % 2 ? "row1" : "row0", LABEL_W, y, PLOT_W, ROW_H);
        fprintf(c->f, "<text class=\"rlabel\" x=\"%d\" y=\"%d\">instance %d</text>\n", LABEL_W - 8,
                y + ROW_H / 2 + 4, i);
    }
    /* Rounds: where the job was first fired. */
    int last_round = -1;
    double last_label = -1e9;
    for (size_t k = 0; k < r->nevents; k++) {
        const demo_event *ev = &r->events[k];
        if (ev->type != EV_FIRE || ev->round == last_round)
            continue;
        last_round = ev->round;
        double x = xpos(c, ev->at_us);
        fprintf(c->f, "<line class=\"round\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"/>\n", x, x,
                TOP_H - 6, bottom);
        if (x - last_label > 22) {
            fprintf(c->f, "<text class=\"tlabel\" x=\"%.1f\" y=\"%d\">r%d</text>\n", x + 2,
                    TOP_H - 9, ev->round + 1);
            last_label = x;
        }
    }
    /* Time ticks: a step that gives about ten of them. */
    double span_ms = (double)(c->t1 - c->t0) / 1000.0;
    static const double steps[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000,
                                   20000, 50000, 100000};
    double step = steps[sizeof steps / sizeof steps[0] - 1];
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++)
        if (span_ms / steps[k] <= 12) {
            step = steps[k];
            break;
        }
    fprintf(c->f, "<line class=\"axis\" x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\"/>\n", LABEL_W,
            LABEL_W + PLOT_W, bottom, bottom);
    for (double t = 0; t <= span_ms + 1e-9; t += step) {
        double x = LABEL_W + t * PLOT_W / span_ms;
        fprintf(c->f, "<line class=\"axis\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"/>\n", x, x,
                bottom, bottom + 5);
        if (step >= 1000)
            fprintf(c->f, "<text class=\"tick\" x=\"%.1f\" y=\"%d\">%.0f s</text>\n", x,
                    bottom + 18, t / 1000);
        else
            fprintf(c->f, "<text class=\"tick\" x=\"%.1f\" y=\"%d\">%.0f ms</text>\n", x,
                    bottom + 18, t);
    }
}

static void draw_mode(FILE *f, const demo_options *o, const demo_result *r)
{
    canvas c = {f, r, r->t0_us, r->t1_us};
    for (size_t k = 0; k < r->nevents; k++)
        if (r->events[k].at_us > c.t1)
            c.t1 = r->events[k].at_us;
    if (c.t1 <= c.t0)
        c.t1 = c.t0 + 1000;
    int n = o->instances;
    int h = TOP_H + n * ROW_H + AXIS_H;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"timeline of mode %s\">\n",
            SVG_W, h, SVG_W, h, demo_mode_name(r->mode));
    draw_axes(&c, n);
    draw_bars(&c, n);
    draw_pauses(&c, n);
    draw_marks(&c);
    fprintf(f, "</svg>\n");
}

static const char *mode_story(demo_mode m)
{
    switch (m) {
    case DEMO_NOLOCK:
        return "No lock: every instance reads the pending orders and pays them all.";
    case DEMO_TTL:
        return "The lock with a lease and a watchdog, checked (dlock_lock_lost) before every "
               "transfer, no fencing. A frozen holder's watchdog is frozen too: the lease runs "
               "out, the next round's holder pays the pending orders, and the thawed holder "
               "commits the transfer it had prepared before the pause.";
    case DEMO_FENCE_ROW:
        return "The seed's SQL, UPDATE payout SET status='PAID', fence=$f WHERE order_id=$o AND "
               "fence &lt; $f: the check covers one row. The thawed holder writes its old fence "
               "on an order the new holder has not reached yet (the row is still at 0), then the "
               "new holder's higher fence passes the check on the same row: paid twice.";
    case DEMO_FENCE:
        return "The store keeps the highest fence seen for the job; each holder registers its "
               "fence before it reads, and each transfer commits only if that fence is still "
               "the highest, in the same transaction. The thawed holder's transfer is refused.";
    default:
        return "";
    }
}

static const char style[] =
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px 32px;"
    "color:#1d2430;background:#fff}"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 4px}"
    ".sub{color:#5a6577;margin:0 0 16px}.story{max-width:1100px;margin:2px 0 8px;color:#333}"
    "table{border-collapse:collapse;margin:8px 0 12px}"
    "th,td{padding:4px 10px;border-bottom:1px solid #dde3ea;text-align:right}"
    "th:first-child,td:first-child{text-align:left}th{background:#f3f6f9;font-weight:600}"
    "td.bad{color:#c01818;font-weight:700}td.good{color:#18794e;font-weight:700}"
    ".verdict{font-weight:700;margin:8px 0}.ok{color:#18794e}.fail{color:#c01818}"
    ".legend{display:flex;gap:18px;flex-wrap:wrap;align-items:center;margin:6px 0}"
    ".legend span{display:inline-flex;align-items:center;gap:6px}"
    "svg{display:block;margin:4px 0 6px;font:11px system-ui,sans-serif}"
    ".row0{fill:#fafbfc}.row1{fill:#f2f4f7}.rlabel{text-anchor:end;fill:#333}"
    ".job{fill:#dfe3e8}.held{fill:#a8c8f0;stroke:#3f74b5;stroke-width:1}"
    ".flabel{fill:#17365d;font-size:10px}"
    ".pause{fill:url(#hatch);stroke:#444;stroke-width:1}"
    ".plabel{fill:#fff;font-weight:700;text-anchor:middle;paint-order:stroke;stroke:#444;"
    "stroke-width:3px}"
    ".paid{stroke:#2f8f5b;stroke-width:1.2}.dbl{stroke:#d21f1f;stroke-width:2.4}"
    ".dblmark{fill:#d21f1f;stroke:#fff;stroke-width:1}"
    ".refused{stroke:#e07b00;stroke-width:2.4;fill:none}.lost{fill:#111}"
    ".expired{stroke:#7a3db8;stroke-width:2;stroke-dasharray:3 2}.busy{fill:#9aa3ad}"
    ".err{fill:#fff;stroke:#c01818;stroke-width:2}"
    ".round{stroke:#b8c0ca;stroke-width:1;stroke-dasharray:2 3}.tlabel{fill:#6b7684}"
    ".axis{stroke:#6b7684}.tick{fill:#6b7684;text-anchor:middle}";

static void legend(FILE *f)
{
    fputs("<div class=\"legend\">"
          "<span><svg width=\"30\" height=\"16\"><rect class=\"job\" x=\"0\" y=\"4\" width=\"30\" "
          "height=\"8\"/></svg>job running</span>"
          "<span><svg width=\"30\" height=\"16\"><rect class=\"held\" x=\"0\" y=\"2\" width=\"30\" "
          "height=\"12\"/></svg>lock held (f = fence)</span>"
          "<span><svg width=\"30\" height=\"16\"><defs><pattern id=\"hatchL\" width=\"6\" "
          "height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\"><rect "
          "width=\"6\" height=\"6\" fill=\"#8a8f96\"/><rect width=\"3\" height=\"6\" "
          "fill=\"#5c6168\"/></pattern></defs><rect x=\"0\" y=\"1\" width=\"30\" height=\"14\" "
          "fill=\"url(#hatchL)\" stroke=\"#444\"/></svg>frozen (SIGSTOP)</span>"
          "<span><svg width=\"10\" height=\"16\"><line class=\"paid\" x1=\"5\" x2=\"5\" y1=\"3\" "
          "y2=\"13\"/></svg>transfer</span>"
          "<span><svg width=\"10\" height=\"20\"><line class=\"dbl\" x1=\"5\" x2=\"5\" y1=\"0\" "
          "y2=\"16\"/><circle class=\"dblmark\" cx=\"5\" cy=\"15\" r=\"4\"/></svg>transfer of "
          "an order paid twice</span>"
          "<span><svg width=\"12\" height=\"16\"><path class=\"refused\" d=\"M2 4 l8 8 m0 -8 l-8 "
          "8\"/></svg>stale write refused by the store</span>"
          "<span><svg width=\"12\" height=\"16\"><line class=\"expired\" x1=\"6\" x2=\"6\" "
          "y1=\"0\" y2=\"16\"/></svg>frozen holder's lease gone</span>"
          "<span><svg width=\"12\" height=\"16\"><path class=\"lost\" d=\"M6 12 l5 -7 l-10 0 "
          "z\"/></svg>on_lost fired</span>"
          "<span><svg width=\"10\" height=\"16\"><circle class=\"busy\" cx=\"5\" cy=\"8\" "
          "r=\"2.5\"/></svg>tried, lock busy</span>"
          "</div>\n",
          f);
}

int demo_report_write(const char *path, const demo_options *o, const char *url_shown,
                      const char *store_shown, const demo_result *res, size_t n)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        demo_err("--report %s: %s", path, strerror(errno));
        return -1;
    }
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
               "<title>dlock demo: payout</title><style>%s</style></head><body>\n",
            style);
    /* The hatch pattern used by every timeline. */
    fputs("<svg width=\"0\" height=\"0\" style=\"position:absolute\"><defs><pattern id=\"hatch\" "
          "width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
          "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#8a8f96\"/>"
          "<rect width=\"3\" height=\"6\" fill=\"#5c6168\"/></pattern></defs></svg>\n",
          f);
    fprintf(f, "<h1>dlock demo: payout</h1>\n<p class=\"sub\">%d instances &middot; %d orders a "
               "round &middot; %d rounds &middot; lease %lld ms &middot; transfer %lld ms "
               "&middot; pauses %s &middot; seed %" PRIu64 " &middot; lock server: ",
            o->instances, o->orders, o->rounds, (long long)o->ttl_ms, (long long)o->pay_ms,
            o->pause ? "on" : "off", o->seed);
    put_esc(f, url_shown);
    fputs(" &middot; store: ", f);
    put_esc(f, store_shown);
    fputs("</p>\n<table><tr><th>mode</th><th>rounds</th><th>pauses</th><th>orders</th>"
          "<th>payouts</th><th>double payouts</th><th>stale writes refused</th>"
          "<th>acquire p50 ms</th><th>acquire p99 ms</th><th>highest fence</th></tr>\n",
          f);
    const demo_result *fence = NULL;
    for (size_t k = 0; k < n; k++) {
        const demo_result *r = &res[k];
        if (!r->ran)
            continue;
        if (r->mode == DEMO_FENCE)
            fence = r;
        fprintf(f, "<tr><td>%s</td><td>%d</td><td>%d</td><td>%" PRId64 "</td><td>%" PRId64
                   "</td><td class=\"%s\">%" PRId64 "</td><td>%" PRId64 "</td>",
                demo_mode_name(r->mode), r->rounds, r->pauses, r->orders, r->payouts,
                r->double_paid ? "bad" : "good", r->double_paid, r->refused);
        if (r->mode == DEMO_NOLOCK)
            fputs("<td>-</td><td>-</td><td>-</td></tr>\n", f);
        else
            fprintf(f, "<td>%.2f</td><td>%.2f</td><td>%" PRIu64 "</td></tr>\n", r->p50_ms,
                    r->p99_ms, r->highest_fence);
    }
    fputs("</table>\n", f);
    if (fence != NULL) {
        if (fence->double_paid == 0)
            fprintf(f, "<p class=\"verdict ok\">fence: no order paid twice over %d pauses.</p>\n",
                    fence->pauses);
        else
            fprintf(f, "<p class=\"verdict fail\">fence: %" PRId64 " orders paid twice.</p>\n",
                    fence->double_paid);
    }
    legend(f);
    for (size_t k = 0; k < n; k++) {
        const demo_result *r = &res[k];
        if (!r->ran)
            continue;
        fprintf(f, "<h2>%s: %" PRId64 " double payouts, %" PRId64 " stale writes refused</h2>\n"
                   "<p class=\"story\">%s</p>\n",
                demo_mode_name(r->mode), r->double_paid, r->refused, mode_story(r->mode));
        draw_mode(f, o, r);
    }
    fputs("<p class=\"sub\">Hover over a mark for its details. Generated by <code>dlock demo "
          "payout</code>.</p>\n</body></html>\n",
          f);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        demo_err("--report %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}
