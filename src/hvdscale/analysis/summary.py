"""summary.csv: one row per configuration with run counts, medians and min/max over
completed repeats, and speedup, efficiency and speedup per GPU against the group's
1-worker baseline with 95 % bootstrap intervals (definitions in the aggregate module's
doc). Tuning candidates (scaling.tune) are not configurations of the summary: see
analysis/tuning.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from hvdscale.analysis.columns import (
    FRAMEWORK_DEFAULT,
    STATUSES,
    SUMMARY_COLUMNS,
    SUMMARY_MEDIANS,
    ttt_runs,
    with_framework,
)
from hvdscale.analysis.stats import censor_note, censored_median, speedup_interval
from hvdscale.matrix.runid import CONFIG_KEYS, GROUP_KEYS, run_candidate, run_kind
from hvdscale.target import TOO_LOOSE


def _configurations(runs: pd.DataFrame, status: pd.DataFrame) -> pd.DataFrame:
    """Every configuration of the run table (and of records without one) with its
    expected run count and its run counts by status."""
    st = status[status["in_config"]].dropna(subset=["workers"])
    st = st[st["partition"].notna()]
    configs = (
        st.groupby(CONFIG_KEYS, dropna=False)
        .agg(nodes=("nodes", "max"), n_expected=("in_config", "sum"))
        .reset_index()
    )
    counts = pd.crosstab([st[k] for k in CONFIG_KEYS], st["status"])
    for s in STATUSES:
        if s not in counts:
            counts[s] = 0
    counts = counts.rename(columns={s: f"n_{s}" for s in counts.columns}).reset_index()
    configs = configs.merge(counts, on=CONFIG_KEYS, how="left")
    # configurations that only exist as valid records (no config given)
    if not runs.empty:
        extra = runs[CONFIG_KEYS + ["nodes"]].drop_duplicates(CONFIG_KEYS)
        configs = pd.concat(
            [
                configs,
                extra.merge(configs[CONFIG_KEYS], how="left", indicator=True)
                .query("_merge == 'left_only'")
                .drop(columns="_merge"),
            ],
            ignore_index=True,
        )
    for k in ("batch_per_worker", "workers", "nodes"):
        configs[k] = configs[k].astype("int64")
    configs["global_batch"] = configs["workers"] * configs["batch_per_worker"]
    return configs


def _censored(col: str):
    def med(x: pd.Series) -> float:
        return censored_median(x.tolist())[0]

    return (col, med)


def _ttt_note(x: pd.Series) -> str:
    reached, total = int(np.isfinite(x).sum()), int(x.notna().sum())
    note = censor_note(reached, total)
    return f"time to target: {note}" if note and total else ""


def _repeat_statistics(runs: pd.DataFrame) -> pd.DataFrame:
    """Medians (and min/max of the headline times) over the completed repeats; times and
    epochs to target count censored repeats as +inf (analysis/stats.censored_median)."""
    done = ttt_runs(runs)  # completed and diverged: a diverged run is censored
    agg = {c: (c, "median") for c in SUMMARY_MEDIANS}
    for col, out, suffix in (
        ("epoch_time_s", "epoch_time", "_s"),
        ("throughput", "throughput", ""),
        ("final_test_loss", "final_test_loss", ""),
        ("time_to_target_s", "time_to_target", "_s"),
    ):
        agg[f"{out}{suffix}"] = (col, "median")
        agg[f"{out}_min{suffix}"] = (col, "min")
        agg[f"{out}_max{suffix}"] = (col, "max")
    agg.update(
        time_to_target_s=_censored("time_to_target_s"),
        epochs_to_target=_censored("epochs_to_target"),
        ttt_note=("time_to_target_s", _ttt_note),
        n_reached_target=("reached_target", "sum"),
        n_ttt_total=("time_to_target_s", "count"),
        n_target_in_warmup=("target_in_warmup", "sum"),
        target_test_loss=("target_val_loss", "median"),
        target_val_loss=("target_val_loss", "median"),
        best_val_loss=("best_val_loss", "median"),
        final_val_loss=("final_val_loss", "median"),
        n_completed_rec=("status", lambda s: int((s == "completed").sum())),
    )
    stats = (
        done.groupby(CONFIG_KEYS).agg(**agg).reset_index()
        if not done.empty
        else pd.DataFrame(columns=CONFIG_KEYS + list(agg))
    )
    for k in ("batch_per_worker", "workers"):
        stats[k] = stats[k].astype("int64")
    return stats


def _with_baseline(out: pd.DataFrame) -> pd.DataFrame:
    """Join the 1-worker configuration of each group; speedups and efficiencies."""
    base = out[out["workers"] == 1][
        GROUP_KEYS
        + [
            "epoch_time_s",
            "time_to_target_s",
            "epochs_to_target",
            "n_nan_loss",
            "n_failed",
            "n_malformed",
            "n_target_in_warmup",
        ]
    ]
    base = base.rename(
        columns={
            "epoch_time_s": "baseline_epoch_time_s",
            "time_to_target_s": "baseline_time_to_target_s",
            "epochs_to_target": "baseline_epochs_to_target",
            "n_nan_loss": "_b_nan",
            "n_failed": "_b_failed",
            "n_malformed": "_b_bad",
            "n_target_in_warmup": "_b_loose",
        }
    )
    base["_b_exists"] = True
    out = out.merge(base, on=GROUP_KEYS, how="left")
    out["has_baseline"] = out["baseline_epoch_time_s"].notna()
    out["baseline_status"] = np.select(
        [
            out["has_baseline"],
            out["_b_exists"].isna(),
            (out["_b_nan"] + out["_b_failed"] + out["_b_bad"]) > 0,
        ],
        ["ok", "not_in_sweep", "failed"],
        default="missing",
    )
    out["speedup"] = out["baseline_epoch_time_s"] / out["epoch_time_s"]
    out["speedup_min"] = out["baseline_epoch_time_s"] / out["epoch_time_max_s"]
    out["speedup_max"] = out["baseline_epoch_time_s"] / out["epoch_time_min_s"]
    out["efficiency"] = out["speedup"] / out["workers"]
    loose = (out["n_target_in_warmup"].fillna(0) > 0) | (out["_b_loose"].fillna(0) > 0)
    out["target_too_loose"] = loose.astype(bool)
    out["speedup_ttt"] = (out["baseline_time_to_target_s"] / out["time_to_target_s"]).where(
        ~out["target_too_loose"]
    )
    out["efficiency_ttt"] = out["speedup_ttt"] / out["workers"]
    out["epochs_ratio"] = (out["baseline_epochs_to_target"] / out["epochs_to_target"]).where(
        ~out["target_too_loose"]
    )
    return out


def _intervals(out: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """95 % bootstrap intervals of speedup, efficiency and TTT speedup (analysis/stats.py):
    epoch time over the completed runs, time to target over the completed and the
    diverged ones (censored)."""
    done = ttt_runs(runs)
    per = {k: g for k, g in done.groupby(CONFIG_KEYS, sort=False)}
    cols = {c: [] for c in ("n_repeats", "speedup_lo", "speedup_hi", "ttt_lo", "ttt_hi", "note")}
    for row in out.itertuples(index=False):
        key = tuple(getattr(row, k) for k in CONFIG_KEYS)
        bkey = key[:-1] + (1,)
        empty = done.iloc[0:0]
        g, b = per.get(key, empty), per.get(bkey, empty)
        name = "/".join(map(str, interval_key(dict(zip(CONFIG_KEYS, key)))))
        reps = dict(base_repeats=b["repeat"].tolist(), repeats=g["repeat"].tolist())
        bt, gt = b[b["status"] == "completed"], g[g["status"] == "completed"]
        lo, hi, note = speedup_interval(
            bt["epoch_time_s"],
            gt["epoch_time_s"],
            name,
            base_repeats=bt["repeat"].tolist(),
            repeats=gt["repeat"].tolist(),
        )
        if not row.has_baseline:
            note = "no interval: no completed 1-worker baseline"
        tlo, thi, tnote = speedup_interval(
            b["time_to_target_s"],
            g["time_to_target_s"],
            name + "/ttt",
            **reps,
        )
        if row.target_too_loose:
            tlo, thi, tnote = math.nan, math.nan, TOO_LOOSE
        notes = [note] if note else []
        if tnote and tnote != note:
            notes.append(tnote if tnote == TOO_LOOSE else "time to target: " + tnote)
        n_done = int((g["status"] == "completed").sum())
        for c, v in zip(cols, (n_done, lo, hi, tlo, thi, "; ".join(notes))):
            cols[c].append(v)
    out = out.copy()
    out["n_repeats"] = pd.Series(cols["n_repeats"], index=out.index, dtype="int64")
    out["speedup_lo"], out["speedup_hi"] = cols["speedup_lo"], cols["speedup_hi"]
    out["efficiency_lo"] = out["speedup_lo"] / out["workers"]
    out["efficiency_hi"] = out["speedup_hi"] / out["workers"]
    out["speedup_ttt_lo"], out["speedup_ttt_hi"] = cols["ttt_lo"], cols["ttt_hi"]
    out["ci_note"] = cols["note"]
    return out


def interval_key(key: dict) -> list:
    """The configuration's values that name its bootstrap stream (stats.rng_for): the
    framework only where it is not the default, so a Horovod study's intervals are those
    it had before issue 19."""
    return [v for k, v in key.items() if k != "framework" or v != FRAMEWORK_DEFAULT]


def _fit_slope(n: np.ndarray, s: np.ndarray) -> tuple[float, float, int]:
    ok = np.isfinite(s)
    n, s = n[ok].astype(float), s[ok]
    if len(np.unique(n)) < 2:
        return math.nan, math.nan, int(ok.sum())
    slope, intercept = np.polyfit(n, s, 1)
    return float(slope), float(intercept), len(n)


def _speedup_fits(out: pd.DataFrame) -> pd.DataFrame:
    """Speedup per GPU: the slope of S(n) over n per group (epoch time and time to target)."""
    fits = []
    for key, g in out.groupby(GROUP_KEYS, sort=False):
        n = g["workers"].to_numpy()
        slope, icpt, npts = _fit_slope(n, g["speedup"].to_numpy(dtype=float))
        slope_t, _, _ = _fit_slope(n, g["speedup_ttt"].to_numpy(dtype=float))
        fits.append((*key, slope, icpt, slope_t, npts))
    columns = ["speedup_per_gpu", "speedup_fit_intercept", "speedup_per_gpu_ttt", "fit_points"]
    return pd.DataFrame(fits, columns=GROUP_KEYS + columns)


def summarise(runs: pd.DataFrame, status: pd.DataFrame) -> pd.DataFrame:
    """summary.csv from runs.csv and status.csv (the definitions: hvdscale aggregate --help)."""
    runs, status = with_framework(runs), with_framework(status)
    if "candidate" in runs:
        runs = runs[runs["candidate"].fillna("").astype(str) == ""]
    if "kind" in runs:  # calibration runs and tuning re-runs are not scaling configurations
        runs = runs[runs["kind"].fillna("").astype(str) == ""]
    runs = runs[runs["run_id"].map(run_kind) == ""]
    status = status[
        (status["run_id"].map(run_kind) == "") & (status["run_id"].map(run_candidate) == "")
    ]
    out = _configurations(runs, status).merge(_repeat_statistics(runs), on=CONFIG_KEYS, how="left")
    for s in STATUSES:
        col = f"n_{s}"
        out[col] = out[col].fillna(0).astype("int64") if col in out else 0
    # records present without a config: count them as completed from the runs table
    n_rec = out["n_completed_rec"].fillna(0)
    out["n_completed"] = np.maximum(out["n_completed"], n_rec).astype("int64")
    out["n_reached_target"] = out["n_reached_target"].fillna(0).astype("int64")
    out["n_ttt_total"] = out["n_ttt_total"].fillna(0).astype("int64")
    out["ttt_note"] = out["ttt_note"].fillna("")
    out["n_target_in_warmup"] = out["n_target_in_warmup"].fillna(0).astype("int64")
    out["n_expected"] = out["n_expected"].fillna(0).astype("int64")
    out = _with_baseline(out)
    out = out.merge(_speedup_fits(out), on=GROUP_KEYS, how="left")
    out = _intervals(out, runs)
    out = out.sort_values(CONFIG_KEYS, kind="stable").reset_index(drop=True)
    return out[SUMMARY_COLUMNS]
