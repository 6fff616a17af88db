"""Training figures: the target's validation metric (the validation loss, or a classifier's
validation accuracy) against wall time, and the time per step split by phase (draw
functions of the figure registry, ``hvdscale.figures.registry``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hvdscale.analysis.view import NoData, main_batch, main_rows, panel_backend, runs_metric
from hvdscale.figures.style import (
    PHASE_COLOR,
    WIDTH,
    grid,
    layout,
    legend_below,
    log_x,
    log_y,
    panel_note,
)
from hvdscale.workload.base import VAL_LOSS


def fig_loss_vs_time(runs, summary, epochs, cm, refs, headline=None):
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
        keep.append(rp[rp["backend"] == panel_backend(r, part)])
    r = pd.concat(keep)
    lrs = [x for x in ("none", "linear", "sqrt") if x in set(r["lr_rule"])]
    e = epochs.merge(
        r[["run_id", "partition", "backend", "lr_rule", "workers", "target_test_loss"]], on="run_id"
    )
    metric = runs_metric(runs)  # the target's: the validation loss, or an accuracy
    if metric is VAL_LOSS:
        loss = "val_loss" if "val_loss" in e and e["val_loss"].notna().any() else "test_loss"
        e = e[e[loss].notna() & (e[loss] > 0)]
    else:
        loss = metric.key
        v = pd.to_numeric(e[loss], errors="coerce") if loss in e else pd.Series(dtype=float)
        e = e.assign(**{loss: v})[np.isfinite(v)] if loss in e else e.iloc[0:0]
    if e.empty:
        raise NoData(f"no finite {metric.name} in the run records")
    fig, axes = plt.subplots(
        len(lrs), len(parts), figsize=(WIDTH, 2.1 * len(lrs) + 0.7), squeeze=False, sharey=True
    )
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
                (h,) = ax.plot(g["elapsed_s"], g[loss], color=wcol[w], marker=".", ms=3)
                handles.setdefault(w, h)
            if g0.empty:
                panel_note(ax, "no runs")
            else:
                t = g0["target_test_loss"].iloc[0]
                ax.axhline(t, color="k", lw=0.7, ls=":")
                if metric is VAL_LOSS:
                    log_y(ax)
                log_x(ax)
            ax.set_title(f"{part}, {be}, LR {lr}")
            ax.set_xlabel("training wall time (s, log)" if i == len(lrs) - 1 else "")
            if j == 0 and metric is not VAL_LOSS:
                ax.set_ylabel(metric.name)
            elif j == 0:
                ax.set_ylabel(f"{'validation' if loss == 'val_loss' else 'test'} loss (MSE)")
    handles_l = [handles[w] for w in sorted(handles)]
    labels = [f"{w} worker{'s' if w > 1 else ''}" for w in sorted(handles)]
    handles_l.append(matplotlib.lines.Line2D([], [], color="k", lw=0.7, ls=":"))
    labels.append(f"target {metric.name}")
    rows = legend_below(fig, handles_l, labels, ncol=4)
    fig.suptitle(f"batch {b}/worker; first repeat of each configuration", fontsize=8.5)
    layout(fig, rows, wspace=0.12, hspace=0.55)
    return fig


def fig_time_breakdown(runs, summary, epochs, cm, refs, headline=None):
    from matplotlib.patches import Patch

    s, b, lr = main_rows(summary, "step_time_s", "no completed run with per-phase timing")
    combos = sorted({(p, be) for p, be in zip(s["partition"], s["backend"])})
    fig, axes = grid(len(combos), height=2.3)
    phases = ["data", "compute", "sync", "update", "other"]
    for ax, (part, be) in zip(axes, combos):
        g = s[(s["partition"] == part) & (s["backend"] == be)].sort_values("workers")
        x = np.arange(len(g))
        bottom = np.zeros(len(g))
        for ph in phases:
            v = g[f"{ph}_step_s"].fillna(0).clip(lower=0).to_numpy() * 1e3
            ax.bar(
                x,
                v,
                bottom=bottom,
                color=PHASE_COLOR[ph],
                width=0.7,
                edgecolor="white",
                linewidth=0.3,
            )
            bottom += v
        ax.set_xticks(x)
        ax.set_xticklabels([str(w) for w in g["workers"]])
        ax.set_xlabel("workers (ranks)")
        ax.set_ylabel("time per step (ms)")
        ax.set_title(f"{part}, {be}")
        ax.grid(axis="x", visible=False)
    rows = legend_below(
        fig,
        [Patch(color=PHASE_COLOR[p]) for p in phases],
        ["data loading", "compute (fwd+bwd)", "gradient sync", "optimizer update", "other"],
        ncol=5,
    )
    fig.suptitle(f"median over repeats; batch {b}/worker, LR {lr}", fontsize=8.5)
    layout(fig, rows)
    return fig
