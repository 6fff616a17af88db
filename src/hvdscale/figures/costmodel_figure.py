"""The cost-model figure: (a) the allreduce fit, (b) measured against predicted sync
time per step, (c) measured against predicted speedup (a draw function of the figure
registry, ``hvdscale.figures.registry``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hvdscale.analysis.costmodel import worker_grid
from hvdscale.analysis.costmodel_links import nodes_for_workers, sync_time
from hvdscale.analysis.view import NoData, prediction_choice
from hvdscale.figures.style import (
    WIDTH,
    backend_style,
    layout,
    legend_below,
    log_y,
    panel_note,
    partition_colors,
    workers_axis,
)


def _model_and_measured(ax, line, points, color, backend):
    """The model as a line, the measurements as markers, in the backend's style."""
    ax.plot(*line, color=color, ls=backend_style(backend)["ls"], lw=1)
    ax.plot(*points, ls="none", color=color, marker=backend_style(backend)["marker"])


def _model_of(f: dict, cm: dict) -> tuple[dict, str]:
    """The fit that predicts panel (a): the one from the small rank counts where the
    config held the larger ones out (error table), else the fit of every sweep."""
    et = cm.get("error_table") or {}
    if et.get("fit_max_workers"):
        for g in et.get("fits", []):
            if (g["partition"], g["backend"]) == (f["partition"], f["backend"]):
                links = {k: g.get(k) for k in ("inside_node", "between_node")}
                known = {f"{k}_known": bool(v and v.get("beta_Bps")) for k, v in links.items()}
                return {"links": links, **known}, f"fitted from <= {et['fit_max_workers']} ranks"
    return f, "fitted from every sweep"


def _panel_fit(ax, fits, pcol, cm):
    """(a) per node count: allreduce time vs message size at the largest rank count on
    that many nodes, measured (markers; filled: one node) and predicted (lines; solid:
    one node, dashed: several)."""
    how = ""
    for f in fits:
        pts = pd.DataFrame(f["points"])
        pts = pts[pts["workers"] > 1]
        if "nodes" not in pts:
            pts["nodes"] = 1
        model, how = _model_of(f, cm)
        c, mk = pcol[f["partition"]], backend_style(f["backend"])["marker"]
        for m, g in pts.groupby("nodes"):
            q = g[g["workers"] == g["workers"].max()].sort_values("bytes")
            p = int(q["workers"].iloc[0])
            fill = c if m == 1 else "none"
            ls = "-" if m == 1 else (0, (5, 2))  # solid: one node; dashed: several
            ax.plot(q["bytes"], q["time_s"] * 1e3, ls="none", marker=mk, color=c, ms=3, mfc=fill)
            xs = np.geomspace(q["bytes"].min(), q["bytes"].max(), 50)
            ax.plot(xs, sync_time(model, p, m, xs) * 1e3, color=c, ls=ls, lw=1)
            ax.annotate(f"p={p}, m={m}", (xs[-1], q["time_s"].iloc[-1] * 1e3), fontsize=5)
    ax.axvline(cm["model_bytes"], color="0.5", lw=0.7, ls=":")
    ax.set_xscale("log")
    log_y(ax)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("allreduce time (ms)")
    ax.set_title(f"(a) per node count m, model {how}", fontsize=7)


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
    """(b) sync time per step: predicted (lines) vs measured (markers: runs; x: the
    sweeps' allreduce of the gradients)."""
    model_bytes = cm["model_bytes"]
    meas = _measured_sync(cm, summary)
    all_w = [w for d in meas.values() for w in d]
    wgrid = [w for w in worker_grid(all_w, cm.get("max_workers", 64)) if w > 1]
    for f in fits:
        m = meas.get((f["partition"], f["backend"]), {})
        ws = sorted(m)
        nodes = [nodes_for_workers(f, w) for w in wgrid]
        line = (wgrid, sync_time(f, wgrid, nodes, model_bytes) * 1e3)
        points = (ws, [np.median(m[w]) * 1e3 for w in ws])
        _model_and_measured(ax, line, points, pcol[f["partition"]], f["backend"])
        sweep = [
            r
            for r in (cm.get("error_table") or {}).get("rows", [])
            if (r["partition"], r["backend"]) == (f["partition"], f["backend"]) and r["sync_s_meas"]
        ]
        ax.plot(
            [r["workers"] for r in sweep],
            [r["sync_s_meas"] * 1e3 for r in sweep],
            ls="none",
            marker="x",
            ms=3,
            color=pcol[f["partition"]],
        )
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


def fig_costmodel(runs, summary, epochs, cm, refs, headline=None):
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
    _panel_fit(axes[0], fits, pcol, cm)
    _panel_sync(axes[1], fits, pcol, cm, summary)
    _panel_speedup(axes[2], pcol, cm, summary)
    handles = [
        Line2D(
            [],
            [],
            color=pcol[p],
            ls=backend_style(be)["ls"],
            marker=backend_style(be)["marker"],
            label=f"{p}, {be}",
        )
        for p, be in fkeys
    ]
    handles += [
        Line2D([], [], color="0.3", ls="-", label="line: model"),
        Line2D([], [], color="0.3", ls="none", marker="o", label="marker: measured"),
        Line2D([], [], color="0.3", ls="none", marker="x", label="x: sweep at n"),
    ]
    rows = legend_below(fig, handles, [h.get_label() for h in handles], ncol=5)
    layout(fig, rows, wspace=0.5)
    return fig
