"""Scaling figures: speedup and efficiency, sync time per step, epoch time against the
per-worker batch size, device utilisation (each a draw function of the figure registry,
``hvdscale.figures.registry``)."""

from __future__ import annotations

import numpy as np

from hvdscale.analysis.view import NoData, config_order, main_batch, main_rows, pref_lr
from hvdscale.figures.style import (
    LR_LS,
    WIDTH,
    backend_style,
    grid,
    layout,
    legend_below,
    log_y,
    partition_colors,
    workers_axis,
)


def fig_speedup_efficiency(runs, summary, epochs, cm, refs, headline=None):
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
            yerr = np.vstack(
                [g["speedup"] - g["speedup_min"], g["speedup_max"] - g["speedup"]]
            ).clip(min=0)
            h = ax_s.errorbar(
                g["workers"],
                g["speedup"],
                yerr=yerr,
                color=backend_style(be)["color"],
                marker=backend_style(be)["marker"],
                ls=LR_LS.get(lr, "-"),
            )
            ax_e.plot(
                g["workers"],
                g["efficiency"],
                color=backend_style(be)["color"],
                marker=backend_style(be)["marker"],
                ls=LR_LS.get(lr, "-"),
            )
            handles.setdefault((be, lr), h)
        ax_s.set_title(f"{part} (batch {b}/worker)")
        ax_s.set_ylabel("speedup S(n) = T(1)/T(n)")
        ax_e.set_ylabel("efficiency E(n) = S(n)/n")
        ax_e.set_ylim(0, max(1.15, float(np.nanmax(d["efficiency"])) * 1.05))
        for ax in (ax_s, ax_e):
            workers_axis(ax, ws)
        ax_s.set_xlabel("")
    keys = sorted(handles, key=lambda k: config_order(*k))
    labels = [f"{be}, LR {lr}" for be, lr in keys] + ["ideal"]
    hs = [handles[k] for k in keys] + [axes[0, 0].get_lines()[0]]
    rows = legend_below(fig, hs, labels, ncol=5)
    layout(fig, rows, hspace=0.3)
    return fig


def fig_sync_time(runs, summary, epochs, cm, refs, headline=None):
    positive = None if summary is None else summary[summary["sync_step_s"] > 0]
    s, b, _ = main_rows(
        positive, "sync_step_s", "no completed run with a measured sync time", one_lr=False
    )
    # sync time does not depend on the LR rule: median over LR rules
    d = s.groupby(["partition", "backend", "workers"], as_index=False)["sync_step_s"].median()
    parts = sorted(d["partition"].unique())
    fig, axes = grid(len(parts), height=2.5)
    handles = {}
    for ax, part in zip(axes, parts):
        g0 = d[d["partition"] == part]
        for be, g in g0.groupby("backend"):
            g = g.sort_values("workers")
            (h,) = ax.plot(
                g["workers"],
                g["sync_step_s"] * 1e3,
                color=backend_style(be)["color"],
                marker=backend_style(be)["marker"],
                ls=backend_style(be)["ls"],
            )
            handles.setdefault(be, h)
        workers_axis(ax, g0["workers"])
        log_y(ax)
        ax.set_ylabel("sync time per step (ms)")
        ax.set_title(f"{part} (batch {b}/worker)")
    rows = legend_below(fig, list(handles.values()), [f"backend {k}" for k in handles])
    layout(fig, rows)
    return fig


def fig_epoch_time_batch(runs, summary, epochs, cm, refs, headline=None):
    """Epoch time against the per-worker batch; the legend gives the epoch-time ratio
    between the batches of the config's references.batch_epoch_speedup where measured."""
    import matplotlib.pyplot as plt

    ref = refs.get("batch_epoch_speedup")
    if summary is None or summary.empty:
        raise NoData("no summary rows")
    s = summary[summary["epoch_time_s"].notna()]
    nb = s.groupby(["partition", "backend", "lr_rule", "workers"])["batch_per_worker"].transform(
        "nunique"
    )
    s = s[nb >= 2]
    if s.empty:
        raise NoData("no configuration measured with more than one per-worker batch size")
    lr = pref_lr(s["lr_rule"])
    s = s[s["lr_rule"] == lr]
    pcol = partition_colors(s["partition"].unique())
    wvals = sorted(s["workers"].unique())
    wls = {w: ls for w, ls in zip(wvals, ["-", "--", "-.", ":"] * 4)}
    fig, ax = plt.subplots(figsize=(WIDTH * 0.72, 3.3))
    for (part, be, w), g in s.groupby(["partition", "backend", "workers"]):
        g = g.sort_values("batch_per_worker")
        label = f"{part} {be}, {w} worker{'s' if w > 1 else ''}"
        bt = g.set_index("batch_per_worker")["epoch_time_s"]
        if ref and ref["batch_from"] in bt.index and ref["batch_to"] in bt.index:
            b0, b1 = ref["batch_from"], ref["batch_to"]
            label += f" (b{b0}->{b1}: {bt[b0] / bt[b1]:.1f}x)"
        yerr = np.vstack(
            [g["epoch_time_s"] - g["epoch_time_min_s"], g["epoch_time_max_s"] - g["epoch_time_s"]]
        )
        ax.errorbar(
            g["batch_per_worker"],
            g["epoch_time_s"],
            yerr=yerr.clip(min=0),
            color=pcol[part],
            marker=backend_style(be)["marker"],
            ls=wls[w],
            label=label,
        )
    bs = sorted(s["batch_per_worker"].unique())
    ax.set_xscale("log")
    log_y(ax)
    ax.set_xticks(bs)
    ax.set_xticklabels([str(x) for x in bs])
    ax.minorticks_off()
    ax.set_xlabel("per-worker batch size (samples)")
    ax.set_ylabel("epoch time (s, median of repeats)")
    ax.set_title(f"LR rule {lr}; bars: min-max over repeats")
    ax.legend(loc="upper right")
    layout(fig, 0, left=0.7)
    return fig


def fig_utilisation(runs, summary, epochs, cm, refs, headline=None):
    import matplotlib.pyplot as plt

    s, b, lr = main_rows(summary, "utilisation", "no utilisation samples in the run records")
    kinds = (
        sorted(set(runs["utilisation_kind"].dropna()))
        if runs is not None and not runs.empty
        else []
    )
    kind = {"gpu": "GPU (NVML)", "cpu": "CPU"}
    pcol = partition_colors(s["partition"].unique())
    fig, ax = plt.subplots(figsize=(WIDTH * 0.72, 3.0))
    for (part, be), g in s.groupby(["partition", "backend"]):
        g = g.sort_values("workers")
        ax.plot(
            g["workers"],
            g["utilisation"],
            color=pcol[part],
            marker=backend_style(be)["marker"],
            ls=backend_style(be)["ls"],
            label=f"{part}, {be}",
        )
    workers_axis(ax, s["workers"])
    ax.set_ylabel(f"utilisation (%; {', '.join(kind.get(k, k) for k in kinds) or 'device'})")
    ax.set_ylim(0, max(100, float(s["utilisation"].max()) * 1.05))
    ax.set_title(f"mean over timed epochs; batch {b}/worker, LR {lr}")
    ax.legend(loc="lower left", ncol=2)
    layout(fig, 0, left=0.7)
    return fig
