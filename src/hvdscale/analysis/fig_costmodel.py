"""The cost-model figure: (a) the allreduce fit, (b) measured against predicted sync
time per step, (c) measured against predicted speedup (a draw function of the figure
registry, ``hvdscale.analysis.figures``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hvdscale.analysis.plotstyle import (
    BACKEND_LS,
    BACKEND_MARKER,
    WIDTH,
    layout,
    legend_below,
    log_y,
    panel_note,
    partition_colors,
    workers_axis,
)
from hvdscale.analysis.select import NoData, prediction_choice


def _model_and_measured(ax, line, points, color, backend):
    """The model as a line, the measurements as markers, in the backend's style."""
    ax.plot(*line, color=color, ls=BACKEND_LS.get(backend, "-"), lw=1)
    ax.plot(*points, ls="none", color=color, marker=BACKEND_MARKER.get(backend, "o"))


def _panel_fit(ax, fits, pcol, model_bytes):
    """(a) fit check: allreduce time vs message size at the largest worker count."""
    from hvdscale.analysis.costmodel import ring_time

    for f in fits:
        pts = pd.DataFrame(f["points"])
        pmax = pts["workers"].max()
        q = pts[pts["workers"] == pmax].sort_values("bytes")
        c, m = pcol[f["partition"]], BACKEND_MARKER.get(f["backend"], "o")
        ax.plot(q["bytes"], q["time_s"] * 1e3, ls="none", marker=m, color=c, ms=3, mfc="none")
        xs = np.geomspace(q["bytes"].min(), q["bytes"].max(), 50)
        y = ring_time(pmax, xs, f["alpha_s"], f["beta_Bps"]) * 1e3
        ax.plot(xs, y, color=c, ls=BACKEND_LS.get(f["backend"]), lw=1)
    ax.axvline(model_bytes, color="0.5", lw=0.7, ls=":")
    ax.set_xscale("log")
    log_y(ax)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("allreduce time (ms)")
    ax.set_title("(a) sweep (markers) and fit, largest p", fontsize=8)


def _measured_sync(cm, summary) -> dict:
    """{(partition, backend): {workers: [sync time per step, ...]}} of multi-worker runs."""
    meas: dict = {}
    for pr in cm.get("predictions", []):
        for pt in pr.get("points", []):
            if pt.get("sync_step_s_meas") is not None and pt["workers"] > 1:
                meas.setdefault((pr["partition"], pr["backend"]), {}).setdefault(
                    pt["workers"], []
                ).append(pt["sync_step_s_meas"])
    if summary is not None and not summary.empty:
        multi = summary[summary["workers"] > 1]
        for (p, be, w), v in multi.groupby(["partition", "backend", "workers"])["sync_step_s"]:
            v = v.dropna()
            if len(v):
                meas.setdefault((p, be), {}).setdefault(int(w), []).extend(v.tolist())
    return meas


def _panel_sync(ax, fits, pcol, cm, summary):
    """(b) sync time per step: predicted (lines) vs measured (markers)."""
    from hvdscale.analysis.costmodel import ring_time, worker_grid

    model_bytes = cm["model_bytes"]
    meas = _measured_sync(cm, summary)
    all_w = [w for d in meas.values() for w in d]
    wgrid = [w for w in worker_grid(all_w, cm.get("max_workers", 64)) if w > 1]
    for f in fits:
        m = meas.get((f["partition"], f["backend"]), {})
        ws = sorted(m)
        line = (wgrid, ring_time(wgrid, model_bytes, f["alpha_s"], f["beta_Bps"]) * 1e3)
        points = (ws, [np.median(m[w]) * 1e3 for w in ws])
        _model_and_measured(ax, line, points, pcol[f["partition"]], f["backend"])
    workers_axis(ax, wgrid)
    log_y(ax)
    ax.set_ylabel("sync time per step (ms)")
    ax.set_title(f"(b) sync, {model_bytes / 1e6:.2f} MB gradients", fontsize=8)


def _panel_speedup(ax, pcol, cm, summary):
    """(c) speedup: predicted vs measured, main batch and LR rule."""
    max_w = cm.get("max_workers", 64)
    preds = [p for p in cm.get("predictions", []) if p.get("points")]
    ax.set_ylabel("speedup S(n)")
    if not preds:
        panel_note(ax, "no prediction:\nno 1-worker baseline")
        ax.set_title("(c) speedup", fontsize=8)
        ax.set_xlabel("workers (ranks)")
        return
    b, lr = prediction_choice(preds, summary)
    ws_all = []
    for p in preds:
        if p["batch_per_worker"] != b or p["lr_rule"] != lr:
            continue
        pts = pd.DataFrame(p["points"])
        m = pts[pts["speedup_meas"].notna()]
        line = (pts["workers"], pts["speedup_pred"])
        points = (m["workers"], m["speedup_meas"])
        _model_and_measured(ax, line, points, pcol.get(p["partition"], "k"), p["backend"])
        ws_all += pts["workers"].tolist()
    wmax = max(ws_all) if ws_all else max_w
    ax.plot([1, wmax], [1, wmax], color="k", lw=0.8, ls=(0, (4, 3)))
    workers_axis(ax, ws_all or [1, max_w])
    ax.set_title(f"(c) speedup, batch {b}, LR {lr}", fontsize=8)


def fig_costmodel(runs, summary, epochs, cm):
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    if cm is None:
        raise NoData("no cost-model file")
    fits = [f for f in cm.get("fits", []) if f.get("alpha_s") is not None and f.get("beta_Bps")]
    if not fits:
        raise NoData("no allreduce measurements to fit")
    fig, axes = plt.subplots(1, 3, figsize=(WIDTH, 3.0))
    fkeys = [(f["partition"], f["backend"]) for f in fits]
    pcol = partition_colors({p for p, _ in fkeys})
    _panel_fit(axes[0], fits, pcol, cm["model_bytes"])
    _panel_sync(axes[1], fits, pcol, cm, summary)
    _panel_speedup(axes[2], pcol, cm, summary)
    handles = [
        Line2D(
            [],
            [],
            color=pcol[p],
            ls=BACKEND_LS.get(be, "-"),
            marker=BACKEND_MARKER.get(be, "o"),
            label=f"{p}, {be}",
        )
        for p, be in fkeys
    ]
    handles += [
        Line2D([], [], color="0.3", ls="-", label="line: model"),
        Line2D([], [], color="0.3", ls="none", marker="o", label="marker: measured"),
    ]
    rows = legend_below(fig, handles, [h.get_label() for h in handles], ncol=5)
    layout(fig, rows, wspace=0.5)
    return fig
