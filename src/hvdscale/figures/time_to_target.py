"""Figures of the speedup at equal accuracy: time-to-target speedup untuned and tuned
against the number of workers, the tuning heat map (best value of the target's metric,
the validation loss or a classifier's validation accuracy, over LR multiplier x global
batch), and the calibration runs' validation loss per epoch (has the budget that sets
the target flattened them?), beside it their validation accuracy where the target is
one. Draw functions of the figure registry."""

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
    runs_metric,
)
from hvdscale.figures.style import WIDTH, layout, legend_below, log_y, workers_axis
from hvdscale.matrix.runid import run_kind
from hvdscale.target import FLAT_GAIN, last_quarter_gain
from hvdscale.workload.base import VAL_LOSS

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
    metric = runs_metric(runs)  # the target's: best validation loss or accuracy
    cells = [_heat_cells(c, part, metric) for part in parts]
    rows = max(len(x[0].index) for x in cells)
    width = WIDTH * 0.62 if len(parts) == 1 else WIDTH
    fig, axes = plt.subplots(1, len(parts), figsize=(width, 0.9 + 0.45 * rows), squeeze=False)
    for ax, (cell, title) in zip(axes[0], cells):
        if len(parts) > 1:  # the frameworks' panels: the common part of the title above
            title = title.split(":")[0]
        _heat_panel(fig, ax, cell, title, metric)
    if len(parts) == 1:
        layout(fig, 0, right=0.55)  # the colour bar's label right of its ticks
    else:
        fig.suptitle("best warm-up per cell")
        layout(fig, 0, right=0.55, wspace=0.5)
    return fig


def _heat_cells(c, part, metric=VAL_LOSS):
    """(best value of the target's metric over LR multiplier x global batch, title) of a
    panel: its preferred backend, first LR rule, per cell the best warm-up setting."""
    be = panel_backend(c, part)
    c = c[(c["partition"] == part) & (c["backend"] == be)]
    lr = sorted(c["lr_rule"].unique())[0]
    c = c[c["lr_rule"] == lr]
    col = "best_val_loss" if metric is VAL_LOSS else "best_target_value"
    best = c.groupby(["lr_multiplier", "global_batch"])[col]
    cell = (best.min() if metric.goal == "min" else best.max()).unstack()
    return cell, f"{part}, {be}, LR {lr}: best {metric.name} (best warm-up)"


def _heat_panel(fig, ax, cell, title, metric=VAL_LOSS):
    """One heat map; darker is better: a loss on a log scale, an accuracy as it is."""
    mults, gbs = list(cell.index), list(cell.columns)
    z = cell.to_numpy(float)
    loss = metric is VAL_LOSS
    shown = np.log10(z) if loss else z
    im = ax.imshow(shown, cmap="viridis" if loss else "viridis_r", aspect="auto", origin="lower")
    for i in range(len(mults)):
        for j in range(len(gbs)):
            if np.isfinite(z[i, j]):
                text = f"{z[i, j]:.2e}" if loss else f"{z[i, j]:.3f}"
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="w")
    ax.set_xticks(range(len(gbs)), [str(int(g)) for g in gbs])
    ax.set_yticks(range(len(mults)), [f"{m:g}x" for m in mults])
    ax.set_xlabel("global batch (workers x per-worker batch)")
    ax.set_ylabel("LR multiplier")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="log10 best validation loss" if loss else f"best {metric.name}")


def fig_calibration(runs, summary, epochs, cm, refs, headline=None):
    """The calibration runs' validation loss per epoch (issue 30: the calibration budget
    is long enough when the 1-worker runs have flattened): per run the loss of each
    epoch (thin), the best so far (steps, thick over the last quarter of its epochs, the
    part ``hvdscale.target.last_quarter_gain`` judges), its last-quarter gain against
    ``FLAT_GAIN`` in the legend, and the target the other runs trained against. Where
    the target is on another metric (a validation accuracy), a second panel shows it per
    epoch with the best so far and the target line; the runs still stop, and are judged
    flat, on their validation loss."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    cal = _calibration_rows(runs)
    if cal.empty:
        raise NoData(
            "no calibration runs (training.target.mode absolute: the configured value is the "
            "target)"
        )
    e = epochs[epochs["run_id"].isin(cal["run_id"])] if epochs is not None else None
    if e is not None and not e.empty:
        v = pd.to_numeric(e["val_loss"], errors="coerce")
        e = e.assign(val_loss=v)[np.isfinite(v) & (v > 0)]
    if e is None or e.empty:
        raise NoData("no finite validation loss in the calibration runs' records")
    metric = runs_metric(runs)
    if metric is VAL_LOSS:
        fig, ax = plt.subplots(figsize=(WIDTH, 3.3))
        mx = None
    else:  # the target's metric beside the loss the flat rule judges
        m = _metric_epochs(epochs, cal, metric)
        fig, (ax, mx) = plt.subplots(1, 2, figsize=(WIDTH, 3.3))
    handles, labels, n_flat, n_judged = [], [], 0, 0
    for i, (rid, g) in enumerate(e.sort_values("epoch").groupby("run_id", sort=True)):
        color = _COLORS[i % len(_COLORS)]
        h, gain, n = _calibration_run(ax, g, color)
        n_judged += gain is not None
        n_flat += gain is not None and gain < FLAT_GAIN
        handles.append(h)
        labels.append(f"{_cal_name(rid)}: {_gain_text(gain, n)}")
        if mx is not None:  # the same run's target metric, its best so far
            g = m[m["run_id"] == rid].sort_values("epoch")
            xm, ym = g["epoch"].to_numpy(float), g[metric.key].to_numpy(float)
            mx.plot(xm, ym, color=color, lw=0.6, alpha=0.45, gid=metric.key)
            run_best = np.minimum if metric.goal == "min" else np.maximum
            mx.step(xm, run_best.accumulate(ym), where="post", color=color, lw=1.2, gid="best")
    for a in (ax,) if mx is None else (ax, mx):
        a.set_xlim(left=0)
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    log_y(ax)
    target = _trained_target(runs)
    if isinstance(target, float):
        (ax if mx is None else mx).axhline(target, color="k", lw=0.9, ls=(0, (5, 3)), gid="target")
        handles.append(Line2D([], [], color="k", lw=0.9, ls=(0, (5, 3))))
        labels.append(f"target {target:.4g} (the runs trained against it)")
    handles += [
        Line2D([], [], color="0.45", lw=0.6, alpha=0.6),
        Line2D([], [], color="0.45", lw=1.2, drawstyle="steps-post"),
        Line2D([], [], color="0.45", lw=4, alpha=0.35),
    ]
    labels += [
        "validation loss per epoch" if mx is None else f"value per epoch (loss, {metric.name})",
        "best so far",
        "best so far, last quarter of the epochs",
    ]
    first = cal.iloc[0]
    where = (
        f"{first['partition']}, {first['backend']}, batch {int(first['batch_per_worker'])}, "
        f"LR {first['lr_rule']}, 1 worker" + ("" if isinstance(target, float) else f" ({target})")
    )
    ax.set_xlabel("epoch")
    n = e["run_id"].nunique()
    flat = f"{n_flat} of {n} flattened" + (
        f", {n - n_judged} too short to tell" if n_judged < n else ""
    )
    _calibration_titles(fig, ax, mx, metric, where, flat)
    rows = legend_below(fig, handles, labels, ncol=2)
    layout(fig, rows)
    return fig


def _calibration_titles(fig, ax, mx, metric, where: str, flat: str) -> None:
    """Titles and axis labels of the calibration figure: one panel of the validation loss,
    or (``mx``) the loss the runs stop on beside the target's metric."""
    if mx is None:
        ax.set_title(where)
        ax.set_ylabel("validation loss (MSE, log)")
        fig.suptitle(flat)
        return
    ax.set_title("validation loss: flat?")
    ax.set_ylabel("validation loss (log)")
    mx.set_title(f"{metric.name}: the target")
    mx.set_xlabel("epoch")
    mx.set_ylabel(metric.name)
    fig.suptitle(f"{where}; {flat}")


def _calibration_run(ax, g, color):
    """One calibration run's validation loss per epoch (thin), its best so far (steps) and,
    where ``last_quarter_gain`` can judge it, that last quarter drawn thick. Returns the
    best-so-far line, the last-quarter gain (None: too short) and the number of epochs."""
    x, y = g["epoch"].to_numpy(float), g["val_loss"].to_numpy(float)
    ax.plot(x, y, color=color, lw=0.6, alpha=0.45, gid="val_loss")
    best = np.minimum.accumulate(y)
    (h,) = ax.step(x, best, where="post", color=color, lw=1.2, gid="best")
    gain = last_quarter_gain({"epochs": [{"val_loss": float(v)} for v in y]})
    if gain is not None:  # the last quarter of the epochs, as last_quarter_gain cuts it
        cut = len(y) - len(y) // 4
        ax.step(
            x[cut - 1 :],
            best[cut - 1 :],
            where="post",
            color=color,
            lw=4,
            alpha=0.35,
            solid_capstyle="butt",
            gid="last_quarter",
        )
    return h, gain, len(y)


def _metric_epochs(epochs, cal, metric) -> pd.DataFrame:
    """The calibration runs' epochs with a finite value of ``metric`` (NoData without)."""
    if epochs is None or metric.key not in epochs:
        raise NoData(f"no {metric.name} in the epochs table")
    e = epochs[epochs["run_id"].isin(cal["run_id"])]
    v = pd.to_numeric(e[metric.key], errors="coerce")
    e = e.assign(**{metric.key: v})[np.isfinite(v)]
    if e.empty:
        raise NoData(f"no finite {metric.name} in the calibration runs' records")
    return e


def _calibration_rows(runs) -> pd.DataFrame:
    """The calibration runs of runs.csv (kind cal; from the run id where there is no kind)."""
    if runs is None or runs.empty:
        return pd.DataFrame(columns=["run_id"])
    kind = runs["kind"].fillna("").astype(str) if "kind" in runs else ""
    kind = np.where(kind != "", kind, runs["run_id"].map(run_kind))
    return runs[kind == "cal"].sort_values("run_id")


def _cal_name(run_id) -> str:
    """'cal r0' for a calibration run id ``..._cal_r0``."""
    return "cal " + str(run_id).rsplit("_cal_", 1)[-1]


def _gain_text(gain, n_epochs: int) -> str:
    if gain is None:
        return f"{n_epochs} epochs, too few to judge (4 needed)"
    verdict = "flat" if gain < FLAT_GAIN else "NOT flat"
    sign = "<" if gain < FLAT_GAIN else ">="
    return (
        f"{n_epochs} epochs, last quarter improved best by {100 * gain:.1f} % "
        f"({sign} {100 * FLAT_GAIN:g} %: {verdict})"
    )


def _trained_target(runs) -> float | str:
    """The target validation loss the runs other than the calibration runs trained
    against (one value), else why there is none to draw."""
    other = runs[~runs["run_id"].isin(_calibration_rows(runs)["run_id"])]
    for col in ("target_val_loss", "target_test_loss"):
        if col in other:
            v = pd.to_numeric(other[col], errors="coerce")
            v = v[np.isfinite(v) & (v > 0)]
            if len(v):
                break
    else:
        return "no run trained against a target yet"
    lo, hi = float(v.min()), float(v.max())
    if hi - lo > 1e-9 * hi:
        return f"runs trained against {v.nunique()} different targets: none drawn"
    return lo
