"""Draw the scaling figures, each as PDF and PNG, into --outdir.

Figures (fixed names, {outdir}/{name}.pdf and .png):
  speedup_efficiency  speedup and efficiency vs workers per partition, ideal line
  sync_time           gradient synchronisation time per step vs workers, per backend
  epoch_time_batch    epoch time vs per-worker batch size
  loss_vs_time        test loss vs training wall-clock time per configuration
  time_breakdown      data / compute / sync / update (/ other) time per step vs workers
  utilisation         device utilisation vs workers
  costmodel           allreduce fit, measured vs predicted sync time and speedup (to 64 workers)

Where the scaling sweep has several per-worker batch sizes, the worker-scaling figures
use the batch size with the most worker counts; where it has several LR rules and only
one can be shown, 'none' is preferred. With missing data a figure is still written,
with a centred "no data for this figure (reason)" note.

Example
  hvdscale plot --runs results/scaling/runs.csv --summary results/scaling/summary.csv \\
      --costmodel results/scaling/costmodel.json --outdir results/plots
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import numpy as np
import pandas as pd

from hvdscale.io import atomic_path

FIGURES = ["speedup_efficiency", "sync_time", "epoch_time_batch", "loss_vs_time", "time_breakdown",
           "utilisation", "costmodel"]
TITLES = {
    "speedup_efficiency": "Speedup and efficiency",
    "sync_time": "Gradient synchronisation time per step",
    "epoch_time_batch": "Epoch time vs per-worker batch size",
    "loss_vs_time": "Test loss vs training time",
    "time_breakdown": "Time per step by phase",
    "utilisation": "Device utilisation",
    "costmodel": "Ring-allreduce cost model: measured vs predicted",
}
STYLE = {
    "figure.dpi": 100, "savefig.dpi": 150, "font.size": 8.5, "axes.titlesize": 9, "axes.labelsize": 8.5,
    "xtick.labelsize": 7.5, "ytick.labelsize": 7.5, "legend.fontsize": 7, "legend.frameon": False,
    "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.5, "axes.spines.top": False,
    "axes.spines.right": False, "lines.linewidth": 1.3, "lines.markersize": 4, "errorbar.capsize": 2,
    "pdf.fonttype": 3, "figure.constrained_layout.use": False,
}
BACKEND_COLOR = {"nccl": "#1b9e77", "mpi": "#d95f02", "gloo": "#7570b3"}
BACKEND_MARKER = {"nccl": "o", "mpi": "s", "gloo": "^"}
BACKEND_LS = {"nccl": "-", "mpi": "--", "gloo": ":"}
LR_LS = {"none": "-", "linear": "--", "sqrt": "-."}
PHASE_COLOR = {"data": "#66c2a5", "compute": "#8da0cb", "sync": "#fc8d62", "update": "#e78ac3",
               "other": "#c8c8c8"}
WIDTH = 7.0  # inches: the text width of the A4 report


class NoData(Exception):
    """The figure cannot be drawn from the data at hand; the message says why."""


def _partition_colors(parts) -> dict:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {p: cmap(i % 10) for i, p in enumerate(sorted(parts))}


# ----------------------------------------------------------------------------- selection helpers


def main_batch(df: pd.DataFrame):
    """The per-worker batch size with the most worker counts (ties: the smallest)."""
    counts = df.groupby("batch_per_worker")["workers"].nunique()
    return int(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0])


def pref_lr(values) -> str:
    values = sorted(set(values))
    return "none" if "none" in values else values[0]


def pref_backend(df: pd.DataFrame) -> str:
    order = {"nccl": 0, "mpi": 1, "gloo": 2}
    n = df.groupby("backend")["n_completed"].sum() if "n_completed" in df else df["backend"].value_counts()
    return sorted(n.items(), key=lambda kv: (-kv[1], order.get(kv[0], 9)))[0][0]


def _workers_axis(ax, workers, max_w=None):
    ws = sorted({int(w) for w in workers})
    if max_w:
        ws = sorted(set(ws) | {max_w})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ws)
    ax.set_xticklabels([str(w) for w in ws])
    ax.minorticks_off()
    ax.set_xlabel("workers (ranks)")


def _suptitle(fig, text):
    h = fig.get_size_inches()[1]
    fig.suptitle(text, fontsize=9.5, y=1 - 0.08 / h, va="top")


def _log_y(ax):
    """Log y axis labelled 0.02, 0.05, 0.1 ... instead of powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _log_x(ax):
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _panel_note(ax, text):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=7.5, color="0.4", wrap=True)


def _grid(n, ncols_max=3, height=2.4):
    import matplotlib.pyplot as plt

    ncols = min(n, ncols_max)
    nrows = int(np.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(WIDTH, height * nrows + 0.5), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _legend_below(fig, handles, labels, ncol=4) -> int:
    """A legend centred below the axes; returns its number of rows (for ``_layout``)."""
    if not handles:
        return 0
    ncol = min(ncol, len(handles))
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.01), ncol=ncol,
               handlelength=2.6, columnspacing=1.4)
    return int(np.ceil(len(handles) / ncol))


def _layout(fig, legend_rows=0, *, left=0.62, right=0.15, top=0.5, bottom=0.45, wspace=0.32, hspace=0.5):
    """Fixed margins in inches (much faster than constrained layout, and the same for
    every figure): room for the figure title on top and the legend rows below."""
    w, h = fig.get_size_inches()
    bottom = bottom + (0.17 * legend_rows + 0.08 if legend_rows else 0)
    fig.subplots_adjust(left=left / w, right=1 - right / w, top=1 - top / h, bottom=bottom / h,
                        wspace=wspace, hspace=hspace)


# ----------------------------------------------------------------------------- figures


def fig_speedup_efficiency(runs, summary, epochs, cm):
    import matplotlib.pyplot as plt

    if summary is None or summary.empty or summary["n_completed"].sum() == 0:
        raise NoData("no completed runs")
    s = summary[summary["has_baseline"] & summary["speedup"].notna()]
    if s.empty:
        raise NoData("no group has a completed 1-worker baseline")
    b = main_batch(s)
    s = s[s["batch_per_worker"] == b]
    parts = sorted(s["partition"].unique())
    fig, axes = plt.subplots(2, len(parts), figsize=(WIDTH, 4.6 + 0.3), squeeze=False, sharex="col")
    handles = {}
    for j, part in enumerate(parts):
        d = s[s["partition"] == part]
        ax_s, ax_e = axes[0, j], axes[1, j]
        ws = sorted(d["workers"].unique())
        wmax = max(ws)
        ideal = np.array([1, wmax])
        ax_s.plot(ideal, ideal, color="k", lw=0.8, ls=(0, (4, 3)), label="ideal")
        ax_e.axhline(1.0, color="k", lw=0.8, ls=(0, (4, 3)))
        for (be, lr), g in d.groupby(["backend", "lr_rule"]):
            g = g.sort_values("workers")
            yerr = np.vstack([g["speedup"] - g["speedup_min"], g["speedup_max"] - g["speedup"]]).clip(min=0)
            h = ax_s.errorbar(g["workers"], g["speedup"], yerr=yerr, color=BACKEND_COLOR.get(be),
                              marker=BACKEND_MARKER.get(be, "o"), ls=LR_LS.get(lr, "-"))
            ax_e.plot(g["workers"], g["efficiency"], color=BACKEND_COLOR.get(be),
                      marker=BACKEND_MARKER.get(be, "o"), ls=LR_LS.get(lr, "-"))
            handles.setdefault(f"{be}, LR {lr}", h)
        ax_s.set_title(f"{part} (batch {b}/worker)")
        ax_s.set_ylabel("speedup S(n) = T(1)/T(n)")
        ax_e.set_ylabel("efficiency E(n) = S(n)/n")
        ax_e.set_ylim(0, max(1.15, float(np.nanmax(d["efficiency"])) * 1.05))
        for ax in (ax_s, ax_e):
            _workers_axis(ax, ws)
        ax_s.set_xlabel("")
    order = {"nccl": 0, "mpi": 1, "gloo": 2, "none": 0, "linear": 1, "sqrt": 2}
    keys = sorted(handles, key=lambda k: tuple(order.get(x.strip(), 9) for x in k.replace("LR", "").split(",")))
    keys.append("ideal")
    handles["ideal"] = axes[0, 0].get_lines()[0]
    rows = _legend_below(fig, [handles[k] for k in keys], keys, ncol=5)
    _layout(fig, rows, hspace=0.3)
    return fig


def fig_sync_time(runs, summary, epochs, cm):
    if summary is None or summary.empty:
        raise NoData("no summary rows")
    s = summary[summary["sync_step_s"].notna() & (summary["sync_step_s"] > 0)]
    if s.empty:
        raise NoData("no completed run with a measured sync time")
    b = main_batch(s)
    s = s[s["batch_per_worker"] == b]
    # sync time does not depend on the LR rule: median over LR rules
    d = s.groupby(["partition", "backend", "workers"], as_index=False)["sync_step_s"].median()
    parts = sorted(d["partition"].unique())
    fig, axes = _grid(len(parts), height=2.5)
    handles = {}
    for ax, part in zip(axes, parts):
        g0 = d[d["partition"] == part]
        for be, g in g0.groupby("backend"):
            g = g.sort_values("workers")
            (h,) = ax.plot(g["workers"], g["sync_step_s"] * 1e3, color=BACKEND_COLOR.get(be),
                           marker=BACKEND_MARKER.get(be, "o"), ls=BACKEND_LS.get(be, "-"))
            handles.setdefault(be, h)
        _workers_axis(ax, g0["workers"])
        _log_y(ax)
        ax.set_ylabel("sync time per step (ms)")
        ax.set_title(f"{part} (batch {b}/worker)")
    rows = _legend_below(fig, list(handles.values()), [f"backend {k}" for k in handles])
    _layout(fig, rows)
    return fig


def fig_epoch_time_batch(runs, summary, epochs, cm):
    import matplotlib.pyplot as plt

    if summary is None or summary.empty:
        raise NoData("no summary rows")
    s = summary[summary["epoch_time_s"].notna()]
    nb = s.groupby(["partition", "backend", "lr_rule", "workers"])["batch_per_worker"].transform("nunique")
    s = s[nb >= 2]
    if s.empty:
        raise NoData("no configuration measured with more than one per-worker batch size")
    lr = pref_lr(s["lr_rule"])
    s = s[s["lr_rule"] == lr]
    pcol = _partition_colors(s["partition"].unique())
    wvals = sorted(s["workers"].unique())
    wls = {w: ls for w, ls in zip(wvals, ["-", "--", "-.", ":"] * 4)}
    fig, ax = plt.subplots(figsize=(WIDTH * 0.72, 3.3))
    for (part, be, w), g in s.groupby(["partition", "backend", "workers"]):
        g = g.sort_values("batch_per_worker")
        label = f"{part} {be}, {w} worker{'s' if w > 1 else ''}"
        bt = g.set_index("batch_per_worker")["epoch_time_s"]
        if 75 in bt.index and 1000 in bt.index:
            label += f" (b75->1000: {bt[75] / bt[1000]:.1f}x)"
        yerr = np.vstack([g["epoch_time_s"] - g["epoch_time_min_s"], g["epoch_time_max_s"] - g["epoch_time_s"]])
        ax.errorbar(g["batch_per_worker"], g["epoch_time_s"], yerr=yerr.clip(min=0), color=pcol[part],
                    marker=BACKEND_MARKER.get(be, "o"), ls=wls[w], label=label)
    bs = sorted(s["batch_per_worker"].unique())
    ax.set_xscale("log")
    _log_y(ax)
    ax.set_xticks(bs)
    ax.set_xticklabels([str(x) for x in bs])
    ax.minorticks_off()
    ax.set_xlabel("per-worker batch size (samples)")
    ax.set_ylabel("epoch time (s, median of repeats)")
    ax.set_title(f"LR rule {lr}; bars: min-max over repeats")
    ax.legend(loc="upper right")
    _layout(fig, 0, left=0.7)
    return fig


def fig_loss_vs_time(runs, summary, epochs, cm):
    import matplotlib
    import matplotlib.pyplot as plt

    if runs is None or runs.empty or epochs is None or epochs.empty:
        raise NoData("no run records with epochs")
    r = runs[runs["status"].isin(["completed", "nan_loss"])]
    if r.empty:
        raise NoData("no completed run")
    b = main_batch(r)
    r = r[r["batch_per_worker"] == b]
    # one repeat per configuration: the lowest repeat index
    r = r.sort_values("repeat").drop_duplicates(["partition", "backend", "lr_rule", "workers"])
    parts = sorted(r["partition"].unique())
    keep = []
    for part in parts:
        rp = r[r["partition"] == part]
        keep.append(rp[rp["backend"] == pref_backend(rp)])
    r = pd.concat(keep)
    lrs = [x for x in ("none", "linear", "sqrt") if x in set(r["lr_rule"])]
    e = epochs.merge(r[["run_id", "partition", "backend", "lr_rule", "workers", "target_test_loss"]], on="run_id")
    e = e[e["test_loss"].notna() & (e["test_loss"] > 0)]
    if e.empty:
        raise NoData("no finite test loss in the run records")
    fig, axes = plt.subplots(len(lrs), len(parts), figsize=(WIDTH, 2.1 * len(lrs) + 0.7), squeeze=False,
                             sharey=True)
    wvals = sorted(r["workers"].unique())
    cmap = matplotlib.colormaps["viridis"]
    wcol = {w: cmap(i / max(1, len(wvals) - 1) * 0.9) for i, w in enumerate(wvals)}
    handles = {}
    for i, lr in enumerate(lrs):
        for j, part in enumerate(parts):
            ax = axes[i, j]
            g0 = e[(e["lr_rule"] == lr) & (e["partition"] == part)]
            be = r[r["partition"] == part]["backend"].iloc[0]
            for w, g in g0.groupby("workers"):
                g = g.sort_values("elapsed_s")
                (h,) = ax.plot(g["elapsed_s"], g["test_loss"], color=wcol[w], marker=".", ms=3)
                handles.setdefault(w, h)
            if g0.empty:
                _panel_note(ax, "no runs")
            else:
                t = g0["target_test_loss"].iloc[0]
                ax.axhline(t, color="k", lw=0.7, ls=":")
                _log_y(ax)
                _log_x(ax)
            ax.set_title(f"{part}, {be}, LR {lr}")
            ax.set_xlabel("training wall time (s, log)" if i == len(lrs) - 1 else "")
            if j == 0:
                ax.set_ylabel("test loss (MSE)")
    handles_l = [handles[w] for w in sorted(handles)]
    labels = [f"{w} worker{'s' if w > 1 else ''}" for w in sorted(handles)]
    handles_l.append(matplotlib.lines.Line2D([], [], color="k", lw=0.7, ls=":"))
    labels.append("target test loss")
    rows = _legend_below(fig, handles_l, labels, ncol=4)
    fig.suptitle(f"batch {b}/worker; first repeat of each configuration", fontsize=8.5)
    _layout(fig, rows, wspace=0.12, hspace=0.55)
    return fig


def fig_time_breakdown(runs, summary, epochs, cm):
    from matplotlib.patches import Patch

    if summary is None or summary.empty:
        raise NoData("no summary rows")
    s = summary[summary["step_time_s"].notna()]
    if s.empty:
        raise NoData("no completed run with per-phase timing")
    b = main_batch(s)
    s = s[s["batch_per_worker"] == b]
    lr = pref_lr(s["lr_rule"])
    s = s[s["lr_rule"] == lr]
    combos = sorted({(p, be) for p, be in zip(s["partition"], s["backend"])})
    fig, axes = _grid(len(combos), height=2.3)
    phases = ["data", "compute", "sync", "update", "other"]
    for ax, (part, be) in zip(axes, combos):
        g = s[(s["partition"] == part) & (s["backend"] == be)].sort_values("workers")
        x = np.arange(len(g))
        bottom = np.zeros(len(g))
        for ph in phases:
            v = g[f"{ph}_step_s"].fillna(0).clip(lower=0).to_numpy() * 1e3
            ax.bar(x, v, bottom=bottom, color=PHASE_COLOR[ph], width=0.7, edgecolor="white", linewidth=0.3)
            bottom += v
        ax.set_xticks(x)
        ax.set_xticklabels([str(w) for w in g["workers"]])
        ax.set_xlabel("workers (ranks)")
        ax.set_ylabel("time per step (ms)")
        ax.set_title(f"{part}, {be}")
        ax.grid(axis="x", visible=False)
    rows = _legend_below(fig, [Patch(color=PHASE_COLOR[p]) for p in phases],
                         ["data loading", "compute (fwd+bwd)", "gradient sync", "optimizer update", "other"], ncol=5)
    fig.suptitle(f"median over repeats; batch {b}/worker, LR {lr}", fontsize=8.5)
    _layout(fig, rows)
    return fig


def fig_utilisation(runs, summary, epochs, cm):
    import matplotlib.pyplot as plt

    if summary is None or summary.empty:
        raise NoData("no summary rows")
    s = summary[summary["utilisation"].notna()]
    if s.empty:
        raise NoData("no utilisation samples in the run records")
    b = main_batch(s)
    s = s[s["batch_per_worker"] == b]
    lr = pref_lr(s["lr_rule"])
    s = s[s["lr_rule"] == lr]
    kinds = sorted(set(runs["utilisation_kind"].dropna())) if runs is not None and not runs.empty else []
    kind = {"gpu": "GPU (NVML)", "cpu": "CPU"}
    pcol = _partition_colors(s["partition"].unique())
    fig, ax = plt.subplots(figsize=(WIDTH * 0.72, 3.0))
    for (part, be), g in s.groupby(["partition", "backend"]):
        g = g.sort_values("workers")
        ax.plot(g["workers"], g["utilisation"], color=pcol[part], marker=BACKEND_MARKER.get(be, "o"),
                ls=BACKEND_LS.get(be, "-"), label=f"{part}, {be}")
    _workers_axis(ax, s["workers"])
    ax.set_ylabel(f"utilisation (%; {', '.join(kind.get(k, k) for k in kinds) or 'device'})")
    ax.set_ylim(0, max(100, float(s["utilisation"].max()) * 1.05))
    ax.set_title(f"mean over timed epochs; batch {b}/worker, LR {lr}")
    ax.legend(loc="lower left", ncol=2)
    _layout(fig, 0, left=0.7)
    return fig


def fig_costmodel(runs, summary, epochs, cm):
    import matplotlib.pyplot as plt

    if cm is None:
        raise NoData("no cost-model file")
    fits = [f for f in cm.get("fits", []) if f.get("alpha_s") is not None and f.get("beta_Bps")]
    if not fits:
        raise NoData("no allreduce measurements to fit")
    model_bytes = cm["model_bytes"]
    max_w = cm.get("max_workers", 64)
    fig, axes = plt.subplots(1, 3, figsize=(WIDTH, 3.0))
    fkeys = [(f["partition"], f["backend"]) for f in fits]
    pcol = _partition_colors({p for p, _ in fkeys})
    from hvdscale.analysis.costmodel import ring_time, worker_grid

    # (a) fit check: allreduce time vs message size at the largest worker count
    ax = axes[0]
    for f in fits:
        pts = pd.DataFrame(f["points"])
        pmax = pts["workers"].max()
        q = pts[pts["workers"] == pmax].sort_values("bytes")
        c, m = pcol[f["partition"]], BACKEND_MARKER.get(f["backend"], "o")
        ax.plot(q["bytes"], q["time_s"] * 1e3, ls="none", marker=m, color=c, ms=3, mfc="none")
        xs = np.geomspace(q["bytes"].min(), q["bytes"].max(), 50)
        ax.plot(xs, ring_time(pmax, xs, f["alpha_s"], f["beta_Bps"]) * 1e3, color=c, ls=BACKEND_LS.get(f["backend"]),
                lw=1)
    ax.axvline(model_bytes, color="0.5", lw=0.7, ls=":")
    ax.set_xscale("log")
    _log_y(ax)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("allreduce time (ms)")
    ax.set_title("(a) sweep (markers) and fit, largest p", fontsize=8)

    # (b) sync time per step: predicted (lines) vs measured (markers)
    ax = axes[1]
    meas = {}
    for pr in cm.get("predictions", []):
        for pt in pr.get("points", []):
            if pt.get("sync_step_s_meas") is not None and pt["workers"] > 1:
                meas.setdefault((pr["partition"], pr["backend"]), {}).setdefault(pt["workers"], []).append(
                    pt["sync_step_s_meas"])
    if summary is not None and not summary.empty:
        for (p, be, w), v in summary[summary["workers"] > 1].groupby(["partition", "backend", "workers"])[
                "sync_step_s"]:
            v = v.dropna()
            if len(v):
                meas.setdefault((p, be), {}).setdefault(int(w), []).extend(v.tolist())
    all_w = [w for d in meas.values() for w in d]
    grid = [w for w in worker_grid(all_w, max_w) if w > 1]
    for f in fits:
        key = (f["partition"], f["backend"])
        c = pcol[f["partition"]]
        ax.plot(grid, ring_time(grid, model_bytes, f["alpha_s"], f["beta_Bps"]) * 1e3, color=c,
                ls=BACKEND_LS.get(f["backend"], "-"), lw=1)
        if key in meas:
            ws = sorted(meas[key])
            ax.plot(ws, [np.median(meas[key][w]) * 1e3 for w in ws], ls="none", color=c,
                    marker=BACKEND_MARKER.get(f["backend"], "o"))
    _workers_axis(ax, grid)
    _log_y(ax)
    ax.set_ylabel("sync time per step (ms)")
    ax.set_title(f"(b) sync, {model_bytes / 1e6:.2f} MB gradients", fontsize=8)

    # (c) speedup: predicted vs measured, main batch and LR rule
    ax = axes[2]
    preds = [p for p in cm.get("predictions", []) if p.get("points")]
    if preds:
        from collections import Counter

        bs = Counter(p["batch_per_worker"] for p in preds)
        b = bs.most_common(1)[0][0]
        if summary is not None and summary["speedup"].notna().any():
            b_main = main_batch(summary[summary["speedup"].notna()])
            b = b_main if b_main in bs else b
        pdf = pd.DataFrame([{k: p[k] for k in ("batch_per_worker", "lr_rule")} for p in preds])
        lr = pref_lr(pdf[pdf["batch_per_worker"] == b]["lr_rule"])
        ws_all = []
        for p in preds:
            if p["batch_per_worker"] != b or p["lr_rule"] != lr:
                continue
            pts = pd.DataFrame(p["points"])
            c = pcol.get(p["partition"], "k")
            ax.plot(pts["workers"], pts["speedup_pred"], color=c, ls=BACKEND_LS.get(p["backend"], "-"), lw=1)
            m = pts[pts["speedup_meas"].notna()]
            ax.plot(m["workers"], m["speedup_meas"], ls="none", color=c, marker=BACKEND_MARKER.get(p["backend"], "o"))
            ws_all += pts["workers"].tolist()
        wmax = max(ws_all) if ws_all else max_w
        ax.plot([1, wmax], [1, wmax], color="k", lw=0.8, ls=(0, (4, 3)))
        _workers_axis(ax, ws_all or [1, max_w])
        ax.set_title(f"(c) speedup, batch {b}, LR {lr}", fontsize=8)
    else:
        _panel_note(ax, "no prediction:\nno 1-worker baseline")
        ax.set_title("(c) speedup", fontsize=8)
        ax.set_xlabel("workers (ranks)")
    ax.set_ylabel("speedup S(n)")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=pcol[p], ls=BACKEND_LS.get(be, "-"), marker=BACKEND_MARKER.get(be, "o"),
                      label=f"{p}, {be}") for p, be in fkeys]
    handles += [Line2D([], [], color="0.3", ls="-", label="line: model"),
                Line2D([], [], color="0.3", ls="none", marker="o", label="marker: measured")]
    rows = _legend_below(fig, handles, [h.get_label() for h in handles], ncol=5)
    _layout(fig, rows, wspace=0.5)
    return fig


FIGURE_FUNCS = {
    "speedup_efficiency": fig_speedup_efficiency,
    "sync_time": fig_sync_time,
    "epoch_time_batch": fig_epoch_time_batch,
    "loss_vs_time": fig_loss_vs_time,
    "time_breakdown": fig_time_breakdown,
    "utilisation": fig_utilisation,
    "costmodel": fig_costmodel,
}


# ----------------------------------------------------------------------------- output


def note_figure(name: str, reason: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(WIDTH * 0.72, 2.6))
    ax.set_axis_off()
    ax.text(0.5, 0.5, f"no data for this figure ({reason})", ha="center", va="center", transform=ax.transAxes,
            fontsize=10, color="0.3", wrap=True)
    _layout(fig)
    return fig


def save_figure(fig, outdir: Path, name: str) -> list[Path]:
    import matplotlib.pyplot as plt

    paths = []
    for ext in ("pdf", "png"):
        path = outdir / f"{name}.{ext}"
        with atomic_path(path, f".{ext}") as tmp:
            fig.savefig(tmp, format=ext, metadata={"Creator": "hvdscale"} if ext == "pdf" else None)
        paths.append(path)
    plt.close(fig)
    return paths


def plot_all(runs, summary, epochs, cm, outdir: str | Path, names=None, warn=None) -> dict[str, str]:
    """Write every figure; returns {name: 'ok' | 'no data: reason' | 'error: ...'}."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    warn = warn or (lambda msg: None)
    result = {}
    with plt.rc_context(STYLE):
        for name in names or FIGURES:
            try:
                fig = FIGURE_FUNCS[name](runs, summary, epochs, cm)
                sub = fig.get_suptitle()
                _suptitle(fig, f"{TITLES[name]}: {sub}" if sub else TITLES[name])
                result[name] = "ok"
            except NoData as exc:
                plt.close("all")
                fig = note_figure(name, str(exc))
                _suptitle(fig, TITLES[name])
                result[name] = f"no data: {exc}"
            except Exception as exc:  # a figure must not stop the others
                plt.close("all")
                warn(f"figure {name} failed: {exc!r}\n{traceback.format_exc()}")
                fig = note_figure(name, f"figure failed: {type(exc).__name__}")
                _suptitle(fig, TITLES[name])
                result[name] = f"error: {exc!r}"
            save_figure(fig, outdir, name)
    return result


def load_costmodel(path) -> dict | None:
    if not path:
        return None
    path = Path(path)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        from hvdscale.errors import UserError

        raise UserError(f"cost model {path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None


def add_arguments(p):
    p.add_argument("--runs", default="results/scaling/runs.csv", help="(default: %(default)s)")
    p.add_argument("--summary", default="results/scaling/summary.csv", help="(default: %(default)s)")
    p.add_argument("--epochs", help="per-epoch table (default: epochs.csv next to --runs; optional)")
    p.add_argument("--costmodel", help="costmodel.json from 'hvdscale fit-costmodel' (optional)")
    p.add_argument("--outdir", default="results/plots", help="(default: %(default)s)")
    p.add_argument("--only", nargs="*", choices=FIGURES, help="draw only these figures")


def run(args) -> int:
    from hvdscale.analysis.aggregate import default_epochs_path, read_epochs, read_runs, read_summary

    runs = read_runs(args.runs)
    summary = read_summary(args.summary)
    epath = Path(args.epochs) if args.epochs else default_epochs_path(args.runs)
    epochs = read_epochs(epath) if epath.exists() else None
    cm = load_costmodel(args.costmodel)

    def warn(msg):
        print(f"hvdscale plot: warning: {msg}", file=sys.stderr)

    result = plot_all(runs, summary, epochs, cm, args.outdir, names=args.only, warn=warn)
    for name, st in result.items():
        if st != "ok":
            warn(f"{name}: {st}")
    print(f"plot: wrote {len(result)} figures (PDF and PNG) to {args.outdir}; "
          f"{sum(v == 'ok' for v in result.values())} with data")
    return 0
