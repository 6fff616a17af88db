"""The cost model across nodes: a ring allreduce over the slowest link, with latency and
bandwidth per link class, and its validation on rank counts it was not fitted from.

Model (one allreduce of n bytes over p ranks on m nodes; Horovod's Gloo and Open MPI's
large-message allreduce are flat rings, and every one of the ring's 2(p-1) steps waits
for its slowest link):

    T(p, m, n) = 2(p-1) * alpha_c + 2(p-1)/p * n / beta_c

with link class c = inside-node (m = 1: every ring link stays inside the node) or
between-node (m > 1: the ring crosses the node boundary, so the between-node link sets
the pace). alpha_c and beta_c are fitted per partition and backend by the weighted least
squares of ``costmodel.fit_ring``, the inside-node terms from the one-node sweeps and
the between-node terms from the sweeps over several nodes. A sweep with one node count
only fits the inside-node terms; the between-node terms are then unknown (said in
``note``) and predictions for more nodes fall back to the inside-node terms (the model
of a single node, as before this module).

Validation (``fit_max_workers`` K): the model is fitted from the sweeps with at most K
ranks and predicts the larger ones. The error table has one row per partition, backend,
rank count and node count: the measured allreduce time of the model's gradient size
(log-log interpolation between the two nearest measured sizes), the predicted one, the
relative error (predicted - measured)/measured, and the median |relative error| over
every measured size.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

LINK_MODEL = "ring over the slowest link"
FORMULA_LINKS = (
    "T_sync(p, m, n) = 2(p-1)*alpha_c + 2(p-1)/p * n/beta_c; "
    "c = inside-node if m = 1, between-node if m > 1"
)
INSIDE, BETWEEN = "inside_node", "between_node"
UNKNOWN_BETWEEN = (
    "between-node terms unknown (sweeps on one node only): fitted inside-node terms only; "
    "predictions for more nodes use them (a one-node model)"
)


def ring_time(p, nbytes, alpha: float, beta: float):
    """Ring allreduce time (s) of ``nbytes`` over ``p`` ranks (0 for one rank)."""
    p = np.asarray(p, dtype=float)
    t = (
        2 * (p - 1) * alpha
        + 2 * (p - 1) / np.maximum(p, 1) * np.asarray(nbytes, dtype=float) / beta
    )
    return np.where(p > 1, t, 0.0)


def fit_ring(workers, nbytes, time_s, weights: str = "relative") -> dict:
    """Fit alpha and beta of the ring model; returns a dict (see ``fit_costmodel``).

    Non-negative: if the free fit gives a negative latency or bandwidth term, that term
    is set to zero and the other refitted (a warning goes into ``note``).
    """
    p = np.asarray(workers, dtype=float)
    n = np.asarray(nbytes, dtype=float)
    y = np.asarray(time_s, dtype=float)
    keep = (p > 1) & np.isfinite(y) & (y > 0) & np.isfinite(n)
    p, n, y = p[keep], n[keep], y[keep]
    out = {
        "n_points": int(len(y)),
        "workers": sorted({int(v) for v in p}),
        "bytes_min": float(n.min()) if len(n) else None,
        "bytes_max": float(n.max()) if len(n) else None,
        "weighting": "1/time (relative residuals)" if weights == "relative" else "none",
        "alpha_s": None,
        "beta_Bps": None,
        "alpha_se_s": None,
        "beta_se_Bps": None,
        "median_abs_rel_error": None,
        "max_abs_rel_error": None,
        "note": "",
    }
    if len(y) < 2:
        out["note"] = "too few allreduce measurements with more than one worker"
        return out
    X = np.column_stack([2 * (p - 1), 2 * (p - 1) / p * n])
    w = 1.0 / y if weights == "relative" else np.ones_like(y)
    Xw, yw = X * w[:, None], y * w
    if np.linalg.matrix_rank(Xw) < 2:
        out["note"] = "latency and bandwidth cannot be separated (need several message sizes)"
        return out
    coef, *_ = np.linalg.lstsq(Xw, yw, rcond=None)
    notes = []
    if coef[0] < 0 or coef[1] <= 0:
        if coef[1] <= 0:  # bandwidth term unusable: latency only
            coef = np.array([max(np.sum(Xw[:, 0] * yw) / np.sum(Xw[:, 0] ** 2), 0.0), 0.0])
            notes.append("bandwidth term fitted non-positive; latency-only model")
        else:
            coef = np.array([0.0, np.sum(Xw[:, 1] * yw) / np.sum(Xw[:, 1] ** 2)])
            notes.append("latency term fitted negative; set to 0")
    resid_w = yw - Xw @ coef
    dof = max(len(y) - 2, 1)
    try:
        cov = np.linalg.inv(Xw.T @ Xw) * float(resid_w @ resid_w) / dof
        se = np.sqrt(np.clip(np.diag(cov), 0, None))
    except np.linalg.LinAlgError:
        se = np.array([np.nan, np.nan])
    alpha, inv_beta = float(coef[0]), float(coef[1])
    pred = X @ coef
    rel = (pred - y) / y
    out.update(
        alpha_s=alpha,
        beta_Bps=(1.0 / inv_beta) if inv_beta > 0 else None,
        alpha_se_s=float(se[0]),
        beta_se_Bps=float(se[1] / inv_beta**2) if inv_beta > 0 else None,
        median_abs_rel_error=float(np.median(np.abs(rel))),
        max_abs_rel_error=float(np.max(np.abs(rel))),
        note="; ".join(notes),
    )
    return out


def link_of(nodes: int) -> str:
    return INSIDE if int(nodes) <= 1 else BETWEEN


def fit_links(workers, nodes, nbytes, time_s) -> dict:
    """Ring fits per link class: {inside_node: fit, between_node: fit, ...}."""
    w = np.asarray(workers, dtype=float)
    m = np.asarray(nodes, dtype=float)
    n = np.asarray(nbytes, dtype=float)
    t = np.asarray(time_s, dtype=float)
    links = {}
    for name, sel in ((INSIDE, m <= 1), (BETWEEN, m > 1)):
        links[name] = fit_ring(w[sel], n[sel], t[sel]) if sel.any() else None
    one_node = w[(m <= 1) & (w > 1)]
    notes = []
    known = {k: bool(f and f["alpha_s"] is not None and f["beta_Bps"]) for k, f in links.items()}
    if not known[BETWEEN]:
        notes.append(UNKNOWN_BETWEEN if links[BETWEEN] is None else "between-node fit failed")
    if not known[INSIDE] and links[INSIDE] is not None:
        notes.append("inside-node fit failed")
    return {
        "model": LINK_MODEL,
        "links": links,
        "inside_node_known": known[INSIDE],
        "between_node_known": known[BETWEEN],
        "node_counts": sorted({int(v) for v in m[w > 1]}),
        "slots_per_node": int(one_node.max()) if len(one_node) else None,
        "link_note": "; ".join(notes),
    }


def link_params(fit: dict, nodes: int) -> tuple[float | None, float | None]:
    """(alpha, beta) of the link class that ``nodes`` nodes use (fallbacks: see module)."""
    links = fit.get("links") or {}
    order = (BETWEEN, INSIDE) if int(nodes) > 1 else (INSIDE,)
    if int(nodes) <= 1 and not fit.get("inside_node_known") and fit.get("between_node_known"):
        order = ()  # nothing measured on one node: no prediction for it
    for name in order:
        f = links.get(name)
        if f and f.get("alpha_s") is not None and f.get("beta_Bps"):
            return f["alpha_s"], f["beta_Bps"]
    return None, None


def sync_time(fit: dict, p, nodes, nbytes):
    """Predicted allreduce time (s); NaN where the needed terms are unknown."""
    p_arr, m_arr, n_arr = np.broadcast_arrays(
        *(np.asarray(v, dtype=float) for v in (p, nodes, nbytes))
    )
    out = np.full(p_arr.shape, np.nan)
    for idx in np.ndindex(p_arr.shape):
        a, b = link_params(fit, int(m_arr[idx]))
        if a is not None:
            out[idx] = ring_time(p_arr[idx], n_arr[idx], a, b)
    return out if out.shape else float(out)


def nodes_for_workers(fit: dict, p: int, measured: dict | None = None) -> int:
    """Node count of ``p`` ranks: as measured, else the sequential fill of the one-node
    sweep's largest rank count (1 where that is unknown)."""
    if measured and p in measured:
        return int(measured[p])
    slots = fit.get("slots_per_node")
    return int(-(-p // slots)) if slots else 1


def at_size(nbytes, times, target: float) -> float | None:
    """The time at ``target`` bytes by log-log interpolation (None outside the sweep)."""
    order = np.argsort(nbytes)
    x, y = np.log(np.asarray(nbytes, float)[order]), np.log(np.asarray(times, float)[order])
    lt = np.log(float(target))
    if len(x) == 0 or lt < x[0] - 1e-9 or lt > x[-1] + 1e-9:
        return None
    return float(np.exp(np.interp(lt, x, y)))


def _table_row(part, be, w, m, g, fit, model_bytes, fit_max) -> dict:
    pred = sync_time(fit, g["workers"].to_numpy(), g["nodes"].to_numpy(), g["bytes"].to_numpy())
    meas = g["time_s"].to_numpy(float)
    ok = np.isfinite(pred) & (meas > 0)
    rel = (pred[ok] - meas[ok]) / meas[ok]
    t_meas = at_size(g["bytes"], g["time_s"], model_bytes)
    t_pred = sync_time(fit, w, m, model_bytes)
    t_pred = None if not np.isfinite(t_pred) else float(t_pred)
    return {
        "partition": part,
        "backend": be,
        "workers": int(w),
        "nodes": int(m),
        "workers_per_node": int(-(-w // m)),
        "link": link_of(m),
        "role": "fit" if fit_max is None or w <= fit_max else "validate",
        "sync_s_meas": t_meas,
        "sync_s_pred": t_pred,
        "sync_rel_error": (t_pred - t_meas) / t_meas if t_meas and t_pred is not None else None,
        "sizes": int(len(g)),
        "median_abs_rel_error_sizes": float(np.median(np.abs(rel))) if len(rel) else None,
        "max_abs_rel_error_sizes": float(np.max(np.abs(rel))) if len(rel) else None,
    }


def error_table(allreduce: pd.DataFrame, model_bytes: int, fit_max: int | None) -> dict:
    """Fit per partition/backend from the sweeps with <= fit_max ranks (all when None) and
    compare with every sweep; summary over the held-out ('validate') rows."""
    rows, fits = [], []
    multi = allreduce[allreduce["workers"] > 1]
    for (part, be), g in multi.groupby(["partition", "backend"], sort=True):
        train = g if fit_max is None else g[g["workers"] <= fit_max]
        fit = fit_links(train["workers"], train["nodes"], train["bytes"], train["time_s"])
        fits.append({"partition": part, "backend": be, **_compact(fit)})
        for (w, m), gm in g.groupby(["workers", "nodes"], sort=True):
            rows.append(_table_row(part, be, w, m, gm, fit, model_bytes, fit_max))
    held = [r for r in rows if r["role"] == "validate"]
    sync = [abs(r["sync_rel_error"]) for r in held if r["sync_rel_error"] is not None]
    sizes = [r["median_abs_rel_error_sizes"] for r in held]
    sizes = [v for v in sizes if v is not None]
    return {
        "fit_max_workers": fit_max,
        "model_bytes": int(model_bytes),
        "fits": fits,
        "rows": rows,
        "validated": {
            "n": len(held),
            "workers": sorted({r["workers"] for r in held}),
            "median_abs_rel_error_sync": float(np.median(sync)) if sync else None,
            "max_abs_rel_error_sync": float(np.max(sync)) if sync else None,
            "median_abs_rel_error_sizes": float(np.median(sizes)) if sizes else None,
        },
    }


def _compact(fit: dict) -> dict:
    """The fitted terms per link class (without the point lists)."""
    out = {k: v for k, v in fit.items() if k != "links"}
    for name, f in fit["links"].items():
        keep = ("alpha_s", "beta_Bps", "alpha_se_s", "beta_se_Bps", "n_points", "workers")
        out[name] = {k: f[k] for k in keep} if f else None
    return out
