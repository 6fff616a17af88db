"""Fit the ring-allreduce cost model and predict synchronisation time and speedup.

The command line, with what it reads and writes in full, is ``hvdscale fit-costmodel``
(``add_arguments``/``run`` at the end of this module).
"""

from __future__ import annotations

import glob
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from hvdscale.analysis.columns import (
    FRAMEWORK_DEFAULT,
    step_settings_of,
    with_framework,
    with_step_setting,
)
from hvdscale.analysis.costmodel_links import (
    BETWEEN,
    FORMULA_LINKS,
    INSIDE,
    LINK_MODEL,
    error_table,
    fit_links,
    fit_ring,
    link_of,
    nodes_for_workers,
    ring_time,
    sync_time,
)
from hvdscale.analysis.schemas import (
    ALLREDUCE_ALIASES,
    ALLREDUCE_COLUMNS,
    ALLREDUCE_SCHEMA,
    describe_failures,
)
from hvdscale.analysis.tables import read_runs, read_summary
from hvdscale.cliargs import add_options, defaulted
from hvdscale.errors import UserError
from hvdscale.io import write_json_atomic
from hvdscale.matrix.runid import GROUP_KEYS

DEFAULT_MODEL_BYTES = 153441 * 4
FORMULA = "T_sync(p, n) = 2(p-1)*alpha + 2(p-1)/p * n/beta"  # one link class


# ----------------------------------------------------------------------------- inputs


def expand_inputs(patterns: list[str]) -> list[Path]:
    """Paths from arguments (globs allowed: a pattern that matches nothing is no error,
    a plain path that does not exist is)."""
    paths: list[Path] = []
    for pat in patterns or []:
        if any(ch in pat for ch in "*?["):
            paths.extend(Path(p) for p in sorted(glob.glob(pat)))
        else:
            if not Path(pat).exists():
                raise UserError(f"allreduce file {pat}: not found")
            paths.append(Path(pat))
    return list(dict.fromkeys(paths))


def read_allreduce(paths: list[Path]) -> pd.DataFrame:
    """Concatenate and validate allreduce sweep CSVs (pandera)."""
    import pandera.pandas as pa

    frames = []
    for path in paths:
        try:
            df = pd.read_csv(path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise UserError(f"allreduce file {path}: not a readable CSV file ({exc})") from None
        df = df.rename(
            columns={k: v for k, v in ALLREDUCE_ALIASES.items() if k in df and v not in df}
        )
        missing = [c for c in ALLREDUCE_COLUMNS if c not in df.columns]
        if missing:
            raise UserError(
                f"allreduce file {path}: missing column(s) {', '.join(missing)}; expected "
                f"{', '.join(ALLREDUCE_COLUMNS)}"
            )
        try:
            df = ALLREDUCE_SCHEMA.validate(df, lazy=True)
        except pa.errors.SchemaErrors as err:
            fails = describe_failures(err)
            first = next(iter(fails.items()))
            where = f"row {first[0] + 2}" if first[0] is not None else "file"
            raise UserError(f"allreduce file {path}: {where}: {first[1][0]}") from None
        df["source"] = str(path)
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=ALLREDUCE_COLUMNS + ["source"])
    return pd.concat(frames, ignore_index=True)


# ----------------------------------------------------------------------------- fit + predict


def _clean(x):
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, (np.bool_,)):
        return bool(x)
    if x is pd.NA:
        return None
    return x


def worker_grid(measured, max_workers: int) -> list[int]:
    grid = {1}
    p = 2
    while p <= max_workers:
        grid.add(p)
        p *= 2
    grid.update(int(w) for w in measured)
    return sorted(grid)


def _rel(pred, meas):
    if pred is None or meas is None or not np.isfinite(meas) or meas <= 0 or not np.isfinite(pred):
        return None
    return (pred - meas) / meas


ERROR_KEYS = ("sync_rel_error", "speedup_rel_error", "epoch_time_rel_error")


def _fits(allreduce: pd.DataFrame) -> list[dict]:
    """One fit per partition and backend (inside- and between-node terms, see
    ``costmodel_links``), with its points and fitted times. The top-level alpha/beta
    are the inside-node terms (the between-node ones where no sweep ran on one node)."""
    fits = []
    for (part, be), g in allreduce.groupby(["partition", "backend"], sort=True):
        lf = fit_links(g["workers"], g["nodes"], g["bytes"], g["time_s"])
        primary = lf["links"][INSIDE]
        if not lf["inside_node_known"] and lf["between_node_known"]:
            primary = lf["links"][BETWEEN]
        primary = primary or fit_ring([], [], [])
        fitted = np.atleast_1d(sync_time(lf, g["workers"], g["nodes"], g["bytes"]))
        pts = [
            {
                "workers": int(w),
                "nodes": int(m),
                "bytes": float(b),
                "time_s": float(t),
                "fitted_s": float(ft) if np.isfinite(ft) and w > 1 else None,
            }
            for w, m, b, t, ft in zip(g["workers"], g["nodes"], g["bytes"], g["time_s"], fitted)
        ]
        rel = [(q["fitted_s"] - q["time_s"]) / q["time_s"] for q in pts if q["fitted_s"]]
        f = {**primary, **{k: v for k, v in lf.items()}}
        f.update(
            n_points=sum(1 for q in pts if q["workers"] > 1),
            workers=sorted({q["workers"] for q in pts if q["workers"] > 1}),
            median_abs_rel_error=float(np.median(np.abs(rel))) if rel else None,
            max_abs_rel_error=float(np.max(np.abs(rel))) if rel else None,
            note="; ".join(x for x in (primary["note"], lf["link_note"]) if x),
        )
        fits.append({"partition": part, "backend": be, **f, "points": pts})
    return fits


def _baseline(b: pd.Series) -> dict:
    """The 1-worker run's local (non-sync) time per step and steps per epoch."""
    local = {
        k: float(b[k]) if pd.notna(b[k]) else 0.0
        for k in ("data_step_s", "compute_step_s", "update_step_s", "other_step_s")
    }
    local["other_step_s"] = max(local["other_step_s"], 0.0)
    return {
        **local,
        "local_step_s": sum(local.values()),
        "steps_per_epoch": float(b["steps_per_epoch"]),
        "epoch_time_s_measured": float(b["epoch_time_s"]),
    }


def _point(p: int, f: dict, base: dict, model_bytes: int, measured: pd.DataFrame) -> dict:
    """Predicted (and, where measured, measured) sync time, epoch time and speedup at p."""
    t_local, steps1 = base["local_step_s"], base["steps_per_epoch"]
    t_epoch1 = steps1 * t_local
    nodes_meas = measured["nodes"].dropna().to_dict() if "nodes" in measured else {}
    nodes = nodes_for_workers(f, p, nodes_meas)
    t_sync = float(sync_time(f, p, nodes, model_bytes)) if p > 1 else 0.0
    if not np.isfinite(t_sync):  # no terms for this node count: the inside-node ones
        t_sync = float(ring_time(p, model_bytes, f["alpha_s"], f["beta_Bps"]))
    t_step = t_local + t_sync
    t_epoch = steps1 / p * t_step
    pt = {
        "workers": p,
        "nodes": nodes,
        "link": link_of(nodes),
        "sync_step_s_pred": t_sync,
        "step_time_s_pred": t_step,
        "epoch_time_s_pred": t_epoch,
        "speedup_pred": t_epoch1 / t_epoch,
        "efficiency_pred": t_epoch1 / t_epoch / p,
        "sync_share_pred": t_sync / t_step,
        "sync_step_s_meas": None,
        "epoch_time_s_meas": None,
        "speedup_meas": None,
        "sync_rel_error": None,
        "epoch_time_rel_error": None,
        "speedup_rel_error": None,
    }
    if p in measured.index and pd.notna(measured.at[p, "epoch_time_s"]):
        m = measured.loc[p]
        pt.update(
            sync_step_s_meas=m["sync_step_s"],
            epoch_time_s_meas=m["epoch_time_s"],
            speedup_meas=m["speedup"],
        )
        if p > 1:
            pt["sync_rel_error"] = _rel(t_sync, m["sync_step_s"])
            pt["speedup_rel_error"] = _rel(pt["speedup_pred"], m["speedup"])
            pt["epoch_time_rel_error"] = _rel(t_epoch, m["epoch_time_s"])
    return pt


def _one_step_setting(summary: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The summary rows of one step setting (issue 32: precision and compile mode are
    scaling-group keys): fp32/off where the rows have it, else the first in the run ids'
    order; with the setting's name where the rows hold more than one, else ''."""
    s = with_step_setting(summary)
    settings = step_settings_of(s)
    if len(settings) <= 1:
        return s, ""
    prec, comp = settings[0]
    return s[(s["precision"] == prec) & (s["compile"] == comp)], f"{prec}/{comp}"


def _prediction(key, g: pd.DataFrame, f: dict | None, model_bytes: int, max_workers: int):
    """The prediction entry of one configuration group (a note where there is none)."""
    part, be, batch, lr = key
    entry = {
        "partition": part,
        "backend": be,
        "batch_per_worker": int(batch),
        "lr_rule": lr,
        "fit": None,
        "baseline": None,
        "points": [],
        "note": "",
    }
    base = g[(g["workers"] == 1) & g["epoch_time_s"].notna()]
    if f is None:
        entry["note"] = "no allreduce fit for this partition/backend"
    elif base.empty:
        entry["note"] = "no completed 1-worker baseline run"
    if f is None or base.empty:
        return entry
    entry["fit"] = {
        "alpha_s": f["alpha_s"],
        "beta_Bps": f["beta_Bps"],
        **{k: f.get(k) for k in ("links", "between_node_known", "slots_per_node")},
    }
    entry["baseline"] = _baseline(base.iloc[0])
    measured = g.set_index("workers")
    entry["points"] = [
        _point(p, f, entry["baseline"], model_bytes, measured)
        for p in worker_grid(g["workers"], max_workers)
    ]
    entry["median_abs_rel_error"] = {
        k: (float(np.median(np.abs(v))) if v else None) for k, v in _errors([entry]).items()
    }
    return entry


def _errors(predictions: list[dict]) -> dict[str, list[float]]:
    """Every non-null relative error of the predictions' points, per kind."""
    return {
        k: [pt[k] for e in predictions for pt in e["points"] if pt[k] is not None]
        for k in ERROR_KEYS
    }


def _error_stats(v: list[float]) -> dict:
    return {
        "n": len(v),
        "median_abs_rel_error": float(np.median(np.abs(v))) if v else None,
        "median_rel_error": float(np.median(v)) if v else None,
        "max_abs_rel_error": float(np.max(np.abs(v))) if v else None,
    }


def fit_costmodel(
    allreduce: pd.DataFrame,
    summary: pd.DataFrame | None,
    model_bytes: int,
    max_workers: int = 64,
    sources: list[str] | None = None,
    fit_max_workers: int | None = None,
) -> dict:
    """Fits per partition/backend, predictions per configuration group, errors, and the
    error table per rank and node count (fitted from <= fit_max_workers ranks, if given)."""
    fits = _fits(allreduce)
    fit_by = {
        (f["partition"], f["backend"]): f
        for f in fits
        if f["alpha_s"] is not None and f["beta_Bps"]
    }
    predictions, notes = [], []
    if summary is not None and not summary.empty:
        summary = with_framework(summary)
        # the allreduce sweep is Horovod's: predictions for the default framework only
        own = summary["framework"] == FRAMEWORK_DEFAULT
        if not own.all():
            others = ", ".join(sorted(set(summary.loc[~own, "framework"])))
            notes.append(f"no predictions for {others}: the allreduce sweep measures Horovod")
        mine, setting = _one_step_setting(summary[own])
        if setting:
            notes.append(
                f"predictions for the step setting {setting} only (the other precisions and "
                "compile modes of the runs have none)"
            )
        keys = [k for k in GROUP_KEYS if k not in ("framework", "precision", "compile")]
        for key, g in mine.groupby(keys, sort=True):
            f = fit_by.get((key[0], key[1]))
            predictions.append(_prediction(key, g, f, model_bytes, max_workers))
    else:
        notes.append("no summary table: no predictions")
    if not fits:
        notes.append("no allreduce measurements: no fit and no predictions")
    one_node = [f"{f['partition']}/{f['backend']}" for f in fits if not f["between_node_known"]]
    if one_node:
        notes.append(f"between-node terms unknown for {', '.join(one_node)} (one node count only)")
    errs = _errors(predictions)
    return _clean(
        {
            "model": f"ring allreduce, {LINK_MODEL}",
            "formula": FORMULA_LINKS,
            "step_time": "T_step(p) = T_data + T_compute + T_update + T_other (1-worker run)"
            " + T_sync(p, model_bytes)",
            "epoch_time": "T_epoch(p) = steps_per_epoch(1)/p * T_step(p);"
            " S(p) = T_epoch(1)/T_epoch(p)",
            "model_bytes": int(model_bytes),
            "max_workers": int(max_workers),
            "inputs": sources or [],
            "fits": fits,
            "predictions": predictions,
            "errors": {
                "sync_time": _error_stats(errs["sync_rel_error"]),
                "speedup": _error_stats(errs["speedup_rel_error"]),
                "epoch_time": _error_stats(errs["epoch_time_rel_error"]),
            },
            "error_table": error_table(allreduce, model_bytes, fit_max_workers),
            "notes": notes,
        }
    )


# -------------------------------------------------- the command: hvdscale fit-costmodel


def add_arguments(p):
    add_options(
        p,
        (
            "--allreduce",
            "allreduce sweep CSV files (globs allowed), e.g. results/allreduce/*.csv",
            {"nargs": "*", "default": [], "metavar": "CSV"},
        ),
        ("--summary", {"help": "summary.csv from 'hvdscale aggregate'"}),
        (
            "--runs",
            "runs.csv from 'hvdscale aggregate' (for the model size if --model-bytes is not given)",
            {},  # no default: not the shared --runs
        ),
        (
            "--model-bytes",
            "bytes allreduced per step (parameters x 4); default: "
            "model_bytes of the run records, else 153441*4",
            {"type": int},
        ),
        (
            "--max-workers",
            "extrapolate up to this many workers (default: %(default)s)",
            {"type": int, "default": 64},
        ),
        (
            "--fit-max-workers",
            "validation: fit from the sweeps with at most this many ranks and report the "
            "error on the larger ones (0: no hold-out; default: %(default)s)",
            {"type": int, "default": 0},
        ),
        ("--out", defaulted("results/scaling/costmodel.json")),
    )


def run(args) -> int:
    """Fit the ring-allreduce cost model and predict synchronisation time and speedup.

    Model (one allreduce of n bytes over p ranks on m nodes, ring over the slowest link;
    ``hvdscale.analysis.costmodel_links``):

        T(p, m, n) = 2(p-1) * alpha_c + 2(p-1)/p * n / beta_c

    with c the inside-node link (m = 1) or the between-node link (m > 1). alpha_c (latency,
    s) and beta_c (bandwidth, B/s) are fitted per partition, backend and link class by
    weighted least squares over every message size and worker count of the allreduce
    sweep (results/allreduce/*.csv as written by `hvdscale measure-allreduce`: columns
    partition, backend, workers, nodes, bytes, time_s; p10/p90/algbw/busbw, also named
    p10_s/p90_s/algbw_Bps/busbw_Bps, are optional; rows with one worker carry no
    communication and are left out). The weights are 1/time, so the fit minimises relative
    residuals and small (latency-bound) and large (bandwidth-bound) messages count alike.
    A sweep with one node count fits the inside-node terms only (the between-node terms are
    unknown, and said so). With --fit-max-workers K the error table (costmodel.json
    "error_table") compares a fit from the sweeps with <= K ranks with the larger ones.

    Prediction per configuration group (partition, backend, batch_per_worker, lr_rule)
    with a measured 1-worker baseline (summary.csv): per-step time

        T_step(p) = T_data + T_compute + T_update + T_other + T_sync(p)

    with the first four measured on the 1-worker run (T_other = step wall time not in a
    phase, usually small) and T_sync(p) = T(p, m(p), model_bytes) with m(p) the measured
    node count or the sequential fill of the one-node sweeps' largest rank count; epoch time
    T_epoch(p) = steps(1)/p * T_step(p); predicted speedup S(p) = T_epoch(1)/T_epoch(p).
    Where runs exist, the prediction is compared with the measured sync time per step and
    speedup: relative error (predicted - measured)/measured per point and its median.

    Example
      hvdscale fit-costmodel --allreduce results/allreduce/*.csv \
      --summary results/scaling/summary.csv --runs results/scaling/runs.csv \
      --model-bytes 613764 --out results/scaling/costmodel.json
    """
    if args.max_workers < 1:
        raise UserError(f"--max-workers {args.max_workers}: expected a positive integer")
    if args.model_bytes is not None and args.model_bytes < 1:
        raise UserError(f"--model-bytes {args.model_bytes}: expected a positive integer")
    paths = expand_inputs(args.allreduce)
    allreduce = read_allreduce(paths)
    summary = read_summary(args.summary) if args.summary else None
    model_bytes = args.model_bytes
    if model_bytes is None and args.runs:
        mb = read_runs(args.runs)["model_bytes"].dropna()
        model_bytes = int(mb.mode().iloc[0]) if not mb.empty else None
    model_bytes = model_bytes or DEFAULT_MODEL_BYTES
    if args.fit_max_workers < 0:
        raise UserError(f"--fit-max-workers {args.fit_max_workers}: expected 0 or more")
    result = fit_costmodel(
        allreduce,
        summary,
        model_bytes,
        args.max_workers,
        [str(p) for p in paths],
        fit_max_workers=args.fit_max_workers or None,
    )
    write_json_atomic(args.out, result)
    print_fit(result)
    return 0


def print_fit(result: dict) -> None:
    """What fit-costmodel says: each fit, the held-out and speedup errors, the notes."""
    for f in result["fits"]:
        if f["alpha_s"] is not None and f["beta_Bps"]:
            print(
                f"fit-costmodel: {f['partition']}/{f['backend']}: "
                f"alpha {f['alpha_s'] * 1e6:.2f} us, "
                f"beta {f['beta_Bps'] / 1e9:.3f} GB/s ({f['n_points']} points, median |rel. error| "
                f"{100 * f['median_abs_rel_error']:.1f} %)"
            )
        else:
            print(
                f"fit-costmodel: {f['partition']}/{f['backend']}: no fit ({f['note']})",
                file=sys.stderr,
            )
    v = result["error_table"]["validated"]
    if v["n"]:
        print(
            f"fit-costmodel: fitted from <= {result['error_table']['fit_max_workers']} ranks, "
            f"sync-time error on {v['n']} held-out sweeps ({v['workers']} ranks): median "
            f"|rel. error| {100 * v['median_abs_rel_error_sync']:.1f} %"
            if v["median_abs_rel_error_sync"] is not None
            else f"fit-costmodel: {v['n']} held-out sweeps, no sync-time error"
        )
    e = result["errors"]["speedup"]
    if e["n"]:
        print(
            "fit-costmodel: speedup prediction median |rel. error| "
            f"{100 * e['median_abs_rel_error']:.1f} % "
            f"over {e['n']} measured points"
        )
    for n in result["notes"]:
        print(f"hvdscale fit-costmodel: warning: {n}", file=sys.stderr)
