# SPDX-License-Identifier: MIT
"""Log-log latency plots for the A/B drivers (mscx-ab, mscx-tune): any number of
series against message size, vertical dashed markers with labels; gnuplot when
present, else python3 matplotlib (python3 stdlib otherwise).

  plot(png, [(name, {size: us}), ...], [(x, label), ...], title, plotter="auto")

A series leaves out the sizes it has no time for; a series given as
(name, {size: us}, True) is drawn wide and pale beneath the others (a route
that follows them). Labels of several markers are staggered in height. gnuplot draws from a data
file beside the PNG (its name with .dat): one row per size, "NaN" where a
series has no time.
"""
import math
import os
import shutil
import subprocess
import sys

PLOT_W, PLOT_H = 1000, 650


class PlotError(Exception):
    pass


def fmt_size(b):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div and b % div == 0:
            return "%d%s" % (b // div, unit)
    return str(b)


def have_gnuplot():
    return shutil.which("gnuplot")


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except Exception:
        return False


def _bounds(series):
    sizes = sorted({s for _, v, _ in series for s in v})
    vals = [t for _, v, _ in series for t in v.values()]
    return sizes, min(vals), max(vals)


def _label_y(lo, hi, i):
    """The height of marker @p i's label: the middle of the plot first, then lower."""
    return math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * (0.5 - 0.12 * (i % 4)))


def plot_gnuplot(gnuplot, png, series, marks, title):
    sizes, lo, hi = _bounds(series)
    dat = os.path.splitext(png)[0] + ".dat"
    with open(dat, "w") as fh:
        fh.write("# size_bytes %s\n" % " ".join("%s_us" % n.replace(" ", "_") for n, _, _ in series))
        for s in sizes:
            fh.write("%d %s\n" % (s, " ".join("%.6g" % v[s] if s in v else "NaN" for _, v, _ in series)))
    term = "pngcairo size %d,%d font ',11'" % (PLOT_W, PLOT_H)
    probe = subprocess.run([gnuplot, "-e", "set terminal pngcairo"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    if probe.returncode != 0 or b"unknown" in probe.stdout.lower():
        term = "png size %d,%d" % (PLOT_W, PLOT_H)
    script = ["set terminal %s" % term, "set output '%s'" % png,
              "set title '%s' noenhanced" % title.replace("'", ""),
              "set logscale xy 2", "set format x '%.0b%BB'", "set xlabel 'message size'",
              "set ylabel 'latency (us)'", "set logscale y 10", "set format y '%g'", "set grid",
              "set key top left noenhanced", "set datafile missing 'NaN'"]
    for i, (x, label) in enumerate(marks):
        side = "right offset -1,0" if x > math.sqrt(sizes[0] * sizes[-1]) else "left offset 0.5,0"
        script.append("set arrow %d from %g,%g to %g,%g nohead dt 2 lw 2 lc rgb '#cc0000'"
                      % (i + 1, x, lo, x, hi))
        script.append("set label %d '%s' at %g,%g %s noenhanced tc rgb '#cc0000'"
                      % (i + 1, label.replace("'", ""), x, _label_y(lo, hi, i), side))
    plots = []
    for k, (n, _, wide) in enumerate(series):
        pt = (7, 5, 9, 11, 13, 4, 6)[k % 7]
        style = "lines lw 10 lc rgb '#b0b0b0'" if wide else "linespoints lw 2 pt %d" % pt
        plots.append("'%s' using 1:%d with %s title '%s'"
                     % (dat if k == 0 else "", k + 2, style, n.replace("'", "")))
    script.append("plot " + ", ".join(plots))
    p = subprocess.run([gnuplot], input="\n".join(script) + "\n", universal_newlines=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if p.returncode != 0 or not os.path.exists(png) or os.path.getsize(png) == 0:
        raise PlotError("gnuplot failed:\n%s" % p.stdout)


def plot_matplotlib(png, series, marks, title):
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display on the GPU machine
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except Exception as e:
        raise PlotError("matplotlib cannot be used: %s" % e)
    sizes, lo, hi = _bounds(series)
    fig, ax = plt.subplots(figsize=(PLOT_W / 100.0, PLOT_H / 100.0), dpi=100)
    try:
        for k, (name, v, wide) in enumerate(series):
            xs = sorted(v)
            if wide:
                ax.plot(xs, [v[s] for s in xs], lw=10, color="#b0b0b0", label=name, zorder=1)
            else:
                ax.plot(xs, [v[s] for s in xs], marker="osD^v<>"[k % 7], lw=2, label=name, zorder=2)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=10)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: fmt_size(int(round(x))) + "B"))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: "%g" % y))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: "%g" % y))
        ax.grid(True, which="major", alpha=0.4)
        for i, (x, label) in enumerate(marks):
            ax.axvline(x, ls="--", lw=2, color="#cc0000")
            right = x > math.sqrt(sizes[0] * sizes[-1])
            ax.annotate(label, (x, _label_y(lo, hi, i)), xytext=(-6 if right else 6, 0),
                        textcoords="offset points",
                        ha="right" if right else "left", color="#cc0000")
        ax.set_xlabel("message size")
        ax.set_ylabel("latency (us)")
        ax.set_title(title)
        ax.legend(loc="upper left")
        fig.tight_layout()
        fig.savefig(png)
    finally:
        plt.close(fig)
    if not os.path.exists(png) or os.path.getsize(png) == 0:
        raise PlotError("matplotlib wrote no %s" % png)


def plot(png, series, marks, title, plotter="auto", prog="mscx-ab"):
    """Draw @p series (name, {size: us}) with @p marks (x, label) into @p png; PlotError when nothing can."""
    series = [(e[0], {s: t for s, t in e[1].items() if t is not None}, len(e) > 2 and e[2]) for e in series]
    series = [e for e in series if e[1]]
    if not series:
        raise PlotError("nothing to plot: no series has a time")
    if os.path.exists(png):
        os.unlink(png)
    gnuplot = have_gnuplot() if plotter in ("auto", "gnuplot") else None
    if gnuplot:
        try:
            plot_gnuplot(gnuplot, png, series, marks, title)
        except PlotError as e:
            if plotter == "gnuplot" or not have_matplotlib():
                raise
            sys.stderr.write("%s: %s\n%s: drawing with matplotlib instead\n" % (prog, e, prog))
            plot_matplotlib(png, series, marks, title)
    elif plotter == "gnuplot":
        raise PlotError("gnuplot not found (apt-get install gnuplot-nox)")
    elif plotter == "matplotlib" or have_matplotlib():
        plot_matplotlib(png, series, marks, title)
    else:
        raise PlotError("no plotter: neither gnuplot (apt-get install gnuplot-nox) nor python3 matplotlib "
                        "(apt-get install python3-matplotlib, or pip install matplotlib) is available to %s"
                        % sys.executable)
    return png
