"""Figures of the speedup at equal accuracy: time-to-target speedup untuned and tuned
against the number of workers, and the tuning heat map (best validation loss over LR
multiplier x global batch). Draw functions of the figure registry."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hvdscale.analysis.tuning import candidates
from hvdscale.analysis.view import (
    PARTITION_NAME,
    NoData,
    framework_panels,
    panel_backend,
    pref_lr,
)
from hvdscale.figures.style import WIDTH, layout, legend_below, workers_axis

_COLORS = ["#1b6ca8", "#d1495b", "#3a7d44", "#edae49", "#66a182", "#8d6a9f"]


def _yerr(mid, lo, hi):
    lo = np.where(np.isfinite(lo), mid - lo, 0.0)
    hi = np.where(np.isfinite(hi), hi - mid, 0.0)
    return np.vstack([lo, hi]).clip(min=0)


def fig_speedup_ttt(runs, summary, epochs, cm, refs, headline=None):
    import matplotlib.pyplot as plt

    s = summary[summary["speedup_ttt"].notna()] if summary is not None else None
    # select on the partitions' own names (framework_panels labels them per framework)
    tuned = framework_panels(tuned_points(headline))
    t = tuned[tuned["speedup_ttt"].notna()] if tuned is not None and len(tuned) else None
    if (s is None or s.empty) and (t is None or t.empty):
        raise NoData(
            "no time-to-target speedup: no multi-worker configuration reached the target "
            "with a 1-worker baseline that did (or the target is too loose)"
        )
    src = s if s is not None and not s.empty else t
    # the first partition; one panel per framework where the study has more than one
    own = src[PARTITION_NAME] if PARTITION_NAME in src else src["partition"]
    parts = sorted(src.loc[own == sorted(own.unique())[0], "partition"].unique())
    width = WIDTH * 0.62 if len(parts) == 1 else WIDTH
    fig, axes = plt.subplots(1, len(parts), figsize=(width, 3.3), squeeze=False, sharey=True)
    handles, labels = {}, {}
    for ax, part in zip(axes[0], parts):
        be = panel_backend(src, part)  # the frameworks' panels: a backend both have
        _ttt_panel(ax, part, be, s, t, handles, labels)
        if len(parts) > 1:  # the figure's title says what it shows
            ax.set_title(f"{part}, {be}")
    keys = list(handles)
    rows = legend_below(fig, [handles[k] for k in keys], [labels[k] for k in keys], ncol=2)
    layout(fig, rows)
    return fig


def tuned_points(headline):
    """The tuned time-to-target speedups of headline.csv (the winners' re-runs against
    the baseline the headline table uses: the tuned 1-worker re-runs, or the untuned
    1-worker runs where the sweep tunes n workers only) as points over workers, each
    series starting at 1 worker with speedup 1."""
    if headline is None or headline.empty:
        return None
    pts = headline[headline["tuned"].astype(bool) & headline["speedup_ttt"].notna()]
    if pts.empty:
        return None
    keys = ["partition", "framework", "backend", "batch_per_worker"]
    one = (
        pts[keys]
        .drop_duplicates()
        .assign(workers=1, speedup_ttt=1.0, speedup_ttt_lo=1.0, speedup_ttt_hi=1.0)
    )
    return pd.concat([one, pts], ignore_index=True)


def _ttt_panel(ax, part, be, s, t, handles, labels):
    """One partition's (and framework's) untuned and tuned TTT speedups over workers."""
    wmax = 1
    batches = sorted(
        set(s["batch_per_worker"] if s is not None else [])
        | set(t["batch_per_worker"] if t is not None else [])
    )
    for i, b in enumerate(batches):
        color = _COLORS[i % len(_COLORS)]
        if s is not None and not s.empty:
            g = s[(s["partition"] == part) & (s["backend"] == be) & (s["batch_per_worker"] == b)]
            if len(g):
                lr = pref_lr(g["lr_rule"])
                g = g[g["lr_rule"] == lr].sort_values("workers")
                h = _ttt_errorbar(ax, g, color=color, marker="o", ls="-")
                handles.setdefault(("u", b, lr), h)
                labels[("u", b, lr)] = f"batch {b}, untuned (LR {lr})"
                wmax = max(wmax, int(g["workers"].max()))
        if t is not None and not t.empty:
            g = t[(t["partition"] == part) & (t["backend"] == be) & (t["batch_per_worker"] == b)]
            if len(g):
                g = g.sort_values("workers")
                h = _ttt_errorbar(ax, g, color=color, marker="s", ls="--", mfc="white")
                handles.setdefault(("t", b), h)
                labels[("t", b)] = f"batch {b}, tuned"
                wmax = max(wmax, int(g["workers"].max()))
    ideal = np.array([1, max(wmax, 2)])
    (hi,) = ax.plot(ideal, ideal, color="k", lw=0.8, ls=(0, (4, 3)))
    handles.setdefault(("ideal",), hi)
    labels[("ideal",)] = "ideal"
    workers_axis(ax, list(range(1, max(wmax, 2) + 1)))
    if ax.get_subplotspec().is_first_col():
        ax.set_ylabel("time-to-target speedup")
    ax.set_title(f"{part}, {be}: speedup at equal accuracy")


def _ttt_errorbar(ax, g, **style):
    """Time-to-target speedup of a group over workers, with its interval as error bars."""
    y = g["speedup_ttt"].to_numpy(float)
    return ax.errorbar(
        g["workers"],
        y,
        yerr=_yerr(y, g["speedup_ttt_lo"].to_numpy(float), g["speedup_ttt_hi"]),
        capsize=3,
        **style,
    )


def fig_tune_heatmap(runs, summary, epochs, cm, refs, headline=None):
    import matplotlib.pyplot as plt

    c = candidates(runs) if runs is not None else None
    if c is None or c.empty:
        raise NoData("no completed tuning candidates (config scaling.tune)")
    c = c.assign(n_completed=c["n_repeats"])
    first = sorted(c["partition"].unique())[0]
    parts = [first]
    if PARTITION_NAME in runs:  # one panel per framework of the first partition
        own = runs.drop_duplicates("partition").set_index("partition")[PARTITION_NAME]
        c = c.assign(**{PARTITION_NAME: c["partition"].map(own)})
        parts = sorted(c.loc[c[PARTITION_NAME] == own[first], "partition"].unique())
    cells = [_heat_cells(c, part) for part in parts]
    rows = max(len(x[0].index) for x in cells)
    width = WIDTH * 0.62 if len(parts) == 1 else WIDTH
    fig, axes = plt.subplots(1, len(parts), figsize=(width, 0.9 + 0.45 * rows), squeeze=False)
    for ax, (cell, title) in zip(axes[0], cells):
        if len(parts) > 1:  # the frameworks' panels: the common part of the title above
            title = title.split(":")[0]
        _heat_panel(fig, ax, cell, title)
    if len(parts) == 1:
        layout(fig, 0)
    else:
        fig.suptitle("best warm-up per cell")
        layout(fig, 0, right=0.3, wspace=0.5)
    return fig


def _heat_cells(c, part):
    """(best validation loss over LR multiplier x global batch, title) of a panel: its
    preferred backend, first LR rule, per cell the best warm-up setting."""
    be = panel_backend(c, part)
    c = c[(c["partition"] == part) & (c["backend"] == be)]
    lr = sorted(c["lr_rule"].unique())[0]
    c = c[c["lr_rule"] == lr]
    cell = c.groupby(["lr_multiplier", "global_batch"])["best_val_loss"].min().unstack()
    return cell, f"{part}, {be}, LR {lr}: best validation loss (best warm-up)"


def _heat_panel(fig, ax, cell, title):
    mults, gbs = list(cell.index), list(cell.columns)
    z = cell.to_numpy(float)
    im = ax.imshow(np.log10(z), cmap="viridis", aspect="auto", origin="lower")
    for i in range(len(mults)):
        for j in range(len(gbs)):
            if np.isfinite(z[i, j]):
                ax.text(j, i, f"{z[i, j]:.2e}", ha="center", va="center", fontsize=7, color="w")
    ax.set_xticks(range(len(gbs)), [str(int(g)) for g in gbs])
    ax.set_yticks(range(len(mults)), [f"{m:g}x" for m in mults])
    ax.set_xlabel("global batch (workers x per-worker batch)")
    ax.set_ylabel("LR multiplier")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="log10 best validation loss")
