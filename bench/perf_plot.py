#!/usr/bin/env python3
"""perf_plot.py -- the prefill figure of docs/PERF.md, with no dependency
beyond Python's standard library (the SVG is written by hand).

    python3 bench/perf_plot.py            # docs/perf_prefill.csv -> docs/perf_prefill.svg
    python3 bench/perf_plot.py --extract  # first rebuild the CSV from the sweep's
                                          # table in docs/perf-history.md

The CSV holds the 16k-token sweep beside PyTorch SDPA exactly as the
history records it ("The wgmma family beside PyTorch SDPA (4913846)"):
one row per (head dim, mask, S), the figures copied as printed, each row
with the date, commit and command that produced it.  The figure plots
flashjit's and cuDNN's TFLOP/s against S (top) and cuDNN's time over
flashjit's (bottom; above 1: flashjit faster), without and with the causal
mask.
"""
import argparse
import csv
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSV = os.path.join(ROOT, "docs", "perf_prefill.csv")
SVG = os.path.join(ROOT, "docs", "perf_prefill.svg")
HISTORY = os.path.join(ROOT, "docs", "perf-history.md")

SECTION = "## The wgmma family beside PyTorch SDPA (4913846)"
DATE = "2026-11-23"
COMMIT = "4913846"
COMMAND = 'PARTS="bench" BENCH_ARGS="--tune --iters 30" bash bench/device_check.sh 4913846'
FIELDS = ["date", "commit", "command", "D", "mask", "B", "H", "S",
          "flashjit_us", "flashjit_tf", "cudnn_us", "cudnn_tf", "flash_us",
          "cudnn_over_flashjit", "variant"]


def extract():
    """The sweep's table, from the history's section, into the CSV."""
    with open(HISTORY, encoding="utf-8") as f:
        text = f.read()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    rows = []
    cell = re.compile(r"^([0-9.]+) \(([0-9.]+)\)$")
    for line in text[start:end].splitlines():
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if len(parts) != 9 or not parts[0].isdigit():
            continue
        d, mask, bh, s, fj, cu, fl, ratio, variant = parts
        b, h = bh.split("×")
        fj_m, cu_m = cell.match(fj), cell.match(cu)
        rows.append({"date": DATE, "commit": COMMIT, "command": COMMAND,
                     "D": d, "mask": mask, "B": b, "H": h, "S": s,
                     "flashjit_us": fj_m.group(1), "flashjit_tf": fj_m.group(2),
                     "cudnn_us": cu_m.group(1), "cudnn_tf": cu_m.group(2),
                     "flash_us": fl, "cudnn_over_flashjit": ratio,
                     "variant": variant})
    if len(rows) != 36:
        sys.exit("perf_plot: expected 36 rows in the sweep's table, found %d" % len(rows))
    with open(CSV, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    print("wrote %s (%d rows)" % (os.path.relpath(CSV, ROOT), len(rows)))


# --- the SVG ---------------------------------------------------------------

COLOURS = {"64": "#1f77b4", "128": "#d62728", "256": "#2ca02c"}
W, H = 960, 700
PANEL_W, PANEL_H = 380, 215
LEFT = [90, 540]          # x of each column's plot area
TOP = [78, 368]           # y of each row's plot area


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def nice_ticks(lo, hi, n=5):
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 2.5, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    t = math.ceil(lo / step) * step
    out = []
    while t <= hi + 1e-9:
        out.append(round(t, 6))
        t += step
    return out


def panel(out, x0, y0, series, xs_all, ylo, yhi, ylabel, title, ref=None):
    """One plot area: series = [(D, style, [(S, y)])]."""
    lx = [math.log2(s) for s in xs_all]
    xmin, xmax = min(lx) - 0.25, max(lx) + 0.25

    def px(s):
        return x0 + (math.log2(s) - xmin) / (xmax - xmin) * PANEL_W

    def py(v):
        return y0 + PANEL_H - (v - ylo) / (yhi - ylo) * PANEL_H

    out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>'
               % (x0, y0, PANEL_W, PANEL_H))
    out.append('<text x="%d" y="%d" class="t">%s</text>' % (x0 + PANEL_W / 2, y0 - 8, esc(title)))
    for t in nice_ticks(ylo, yhi):
        y = py(t)
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>' % (x0, x0 + PANEL_W, y, y))
        lab = "%d" % t if yhi - ylo >= 10 else "%.2f" % t
        out.append('<text x="%d" y="%.1f" class="yl">%s</text>' % (x0 - 6, y + 4, lab))
    for s in xs_all:
        x = px(s)
        out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#eee"/>' % (x, x, y0, y0 + PANEL_H))
        lab = "%dk" % (s // 1024) if s >= 1024 else str(s)
        out.append('<text x="%.1f" y="%d" class="xl">%s</text>' % (x, y0 + PANEL_H + 16, lab))
    out.append('<text x="%d" y="%d" class="xl">S (tokens a sequence; B·S = 16384)</text>'
               % (x0 + PANEL_W / 2, y0 + PANEL_H + 34))
    out.append('<text transform="translate(%d,%d) rotate(-90)" class="xl">%s</text>'
               % (x0 - 48, y0 + PANEL_H / 2, esc(ylabel)))
    if ref is not None:
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#000" stroke-width="1.2"/>'
                   % (x0, x0 + PANEL_W, py(ref), py(ref)))
    for d, dash, pts in series:
        col = COLOURS[d]
        path = " ".join("%s%.1f,%.1f" % ("M" if i == 0 else "L", px(s), py(v))
                        for i, (s, v) in enumerate(pts))
        out.append('<path d="%s" fill="none" stroke="%s" stroke-width="2"%s/>'
                   % (path, col, ' stroke-dasharray="6,4"' if dash else ""))
        for s, v in pts:
            out.append('<circle cx="%.1f" cy="%.1f" r="2.6" fill="%s"/>' % (px(s), py(v), col))


def plot():
    with open(CSV, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit("perf_plot: %s has no rows" % CSV)
    xs = sorted({int(r["S"]) for r in rows})
    dims = sorted({r["D"] for r in rows}, key=int)
    masks = ["none", "causal"]

    def pts(d, mask, key):
        return sorted((int(r["S"]), float(r[key])) for r in rows
                      if r["D"] == d and r["mask"] == mask)

    tf = [float(r[k]) for r in rows for k in ("flashjit_tf", "cudnn_tf")]
    ratio = [float(r["cudnn_over_flashjit"]) for r in rows]
    tf_lo, tf_hi = 0, math.ceil(max(tf) / 100) * 100
    r_lo, r_hi = math.floor(min(ratio) * 20) / 20, math.ceil(max(ratio) * 20) / 20

    dates = sorted({r["date"] for r in rows})
    commits = sorted({r["commit"] for r in rows})
    commands = sorted({r["command"] for r in rows})
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'viewBox="0 0 %d %d" font-family="DejaVu Sans, Arial, sans-serif">' % (W, H, W, H),
           '<style>text{font-size:12px;fill:#222}.t{text-anchor:middle;font-weight:bold}'
           '.xl{text-anchor:middle}.yl{text-anchor:end}.h{font-size:15px;font-weight:bold}'
           '.s{font-size:10.5px;fill:#555}</style>',
           '<rect width="100%" height="100%" fill="#fff"/>',
           '<text x="20" y="26" class="h">Prefill, f16: flashjit (the library\'s pick, wgmma family) '
           'beside cuDNN 9.19 via PyTorch SDPA, one H200</text>',
           '<text x="20" y="45" class="s">%s</text>' % esc(
               "16k-token sweep, same inputs, same process; FLOPs 4·B·H·S²·D, half for causal; "
               "solid: flashjit, dashed: cuDNN. Data: docs/perf_prefill.csv (%s, commit %s)."
               % (", ".join(dates), ", ".join(commits)))]
    for col, mask in enumerate(masks):
        name = "no mask" if mask == "none" else "causal"
        series = []
        for d in dims:
            series.append((d, False, pts(d, mask, "flashjit_tf")))
            series.append((d, True, pts(d, mask, "cudnn_tf")))
        panel(out, LEFT[col], TOP[0], series, xs, tf_lo, tf_hi, "TFLOP/s",
              "TFLOP/s, %s" % name)
        panel(out, LEFT[col], TOP[1], [(d, False, pts(d, mask, "cudnn_over_flashjit")) for d in dims],
              xs, r_lo, r_hi, "cuDNN time / flashjit time",
              "cuDNN / flashjit, %s (above 1: flashjit faster)" % name, ref=1.0)
    # legend
    lx, ly = 90, H - 52
    for i, d in enumerate(dims):
        x = lx + i * 120
        out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/>'
                   % (x, x + 24, ly, ly, COLOURS[d]))
        out.append('<text x="%d" y="%d">head dim %s</text>' % (x + 30, ly + 4, d))
    x = lx + len(dims) * 120 + 20
    out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#444" stroke-width="2"/>' % (x, x + 24, ly, ly))
    out.append('<text x="%d" y="%d">flashjit</text>' % (x + 30, ly + 4))
    out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#444" stroke-width="2" '
               'stroke-dasharray="6,4"/>' % (x + 110, x + 134, ly, ly))
    out.append('<text x="%d" y="%d">cuDNN</text>' % (x + 140, ly + 4))
    out.append('<text x="%d" y="%d" class="s">%s</text>' % (20, H - 22, esc(
        "Produced by: " + " ; ".join(commands))))
    out.append('<text x="%d" y="%d" class="s">%s</text>' % (20, H - 8, esc(
        "Regenerate: python3 bench/perf_plot.py [--extract]   (history: docs/perf-history.md)")))
    out.append("</svg>")
    with open(SVG, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    print("wrote %s (%d bytes)" % (os.path.relpath(SVG, ROOT), os.path.getsize(SVG)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--extract", action="store_true",
                    help="rebuild docs/perf_prefill.csv from docs/perf-history.md first")
    args = ap.parse_args()
    if args.extract:
        extract()
    plot()


if __name__ == "__main__":
    main()
