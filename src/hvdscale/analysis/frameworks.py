"""Horovod-TF against PyTorch DDP (issue 19): the rows of the report's comparison.

- ``speedup_rows``: per (partition, backend, per-worker batch, workers) the epoch-time and
  time-to-target speedups of each framework side by side, each against the 1-worker runs
  of ITS OWN framework (summary.csv, with its 95 % bootstrap intervals), and the ratio of
  the two frameworks' epoch times at the same configuration (median Horovod epoch time /
  median DDP epoch time, > 1: DDP faster) with a 95 % bootstrap interval over repeats
  (analysis/stats.speedup_interval; the seeds do not depend on the framework, so repeat r
  of both is a pair);
- ``sync_rows``: per configuration and framework the medians over completed repeats of the
  sync phase of the phase split and of the record's timing.sync (separate allreduce, DDP
  comm hook, exposed synchronisation, step without communication);
- ``missing_baselines``: every group of a framework without a completed 1-worker run
  (said, never dropped).

The default framework (Horovod-TF) is compared with the first other one in the data, each
at its best step setting (issue 32, ``at_best``): where a framework's runs of a (partition,
backend, per-worker batch) hold several precisions or compile modes, the one whose
completed 1-worker runs have the shortest median epoch time (without 1-worker runs: the
first in the run ids' order, fp32/off first). The step-settings section compares the
settings themselves.
"""

from __future__ import annotations

import math

import pandas as pd

from hvdscale.analysis.columns import (
    FRAMEWORK_DEFAULT,
    SYNC_COLUMNS,
    step_settings_of,
    with_framework,
)
from hvdscale.analysis.like import SETTING_KEYS, plain
from hvdscale.analysis.stats import speedup_interval
from hvdscale.analysis.view import pref_lr
from hvdscale.matrix.runid import step_setting_order

PLACE = ["partition", "backend", "batch_per_worker"]
STEP = SETTING_KEYS
SYNC_STATS = ["step_time_s", "sync_step_s", *SYNC_COLUMNS]


def frameworks_of(runs: pd.DataFrame | None) -> list[str]:
    """The frameworks with a completed run, the default first."""
    if runs is None or runs.empty:
        return []
    done = with_framework(runs)
    done = done[done["status"] == "completed"]
    names = set(done["framework"])
    return sorted(names, key=lambda f: (f != FRAMEWORK_DEFAULT, f))


def compared(runs: pd.DataFrame | None) -> tuple[str, str] | None:
    """(default framework, the other one) where the runs hold both, else None."""
    fws = frameworks_of(runs)
    if len(fws) < 2 or fws[0] != FRAMEWORK_DEFAULT:
        return None
    return fws[0], fws[1]


def _plain_done(runs: pd.DataFrame) -> pd.DataFrame:
    """Completed scaling runs (no tuning candidates, calibration runs or re-runs)."""
    r = plain(runs)
    return r[r["status"] == "completed"]


def best_settings(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (partition, framework, backend, per-worker batch) of the completed plain runs:
    the step setting (precision, compile) each framework is compared at. The one with the
    shortest median 1-worker epoch time; where no setting has 1-worker runs, the first in
    the run ids' order. Columns PLACE + framework + STEP + n_settings."""
    keys = [*PLACE, "framework"]
    done = _plain_done(runs)
    if done.empty:
        return pd.DataFrame(columns=[*keys, *STEP, "n_settings"])
    out = []
    for key, g in done.groupby(keys, sort=True):
        one = g[g["workers"] == 1].groupby(STEP)["epoch_time_s"].median().dropna()
        settings = step_settings_of(g)
        if len(one):
            best = min(one.index, key=lambda x: (one[x], step_setting_order(*x)))
        else:
            best = settings[0]
        out.append({**dict(zip(keys, key)), "precision": best[0], "compile": best[1],
                    "n_settings": len(settings)})  # fmt: skip
    return pd.DataFrame(out)


def at_best(df: pd.DataFrame, best: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``df`` (runs or summary) at their framework's best step setting
    (``best_settings``); rows of a place without completed runs are kept."""
    df = with_framework(df)
    keys = [*PLACE, "framework"]
    if best.empty:
        return df
    pick = best[[*keys, *STEP]].rename(columns={"precision": "_prec", "compile": "_comp"})
    m = df.merge(pick, on=keys, how="left")  # one best per place: the rows stay as they were
    keep = m["_prec"].isna() | ((m["_prec"] == m["precision"]) & (m["_comp"] == m["compile"]))
    return df[keep.to_numpy()]


def _side(x: pd.Series | None) -> dict:
    """One framework's figures of one configuration (summary.csv row or None)."""
    if x is None:
        return {"measured": False}
    return {
        "measured": int(x["n_completed"]) > 0,
        "has_baseline": bool(x["has_baseline"]),
        "baseline_status": str(x["baseline_status"]),
        "epoch_time_s": x["epoch_time_s"],
        **{k: x[k] for k in ("speedup", "speedup_lo", "speedup_hi")},
        **{k: x[k] for k in ("speedup_ttt", "speedup_ttt_lo", "speedup_ttt_hi")},
        "target_too_loose": bool(x["target_too_loose"]),
        "n": int(x["n_completed"]),
    }


def _time_ratio(done: pd.DataFrame, key: dict, pair: tuple[str, str]) -> tuple:
    """(median epoch time of pair[0] / of pair[1], lo, hi, note) at one configuration."""
    sel = done
    for k, v in key.items():
        sel = sel[sel[k] == v]
    a, b = (sel[sel["framework"] == f] for f in pair)
    if a.empty or b.empty:
        return math.nan, math.nan, math.nan, "not measured in both frameworks"
    ratio = float(a["epoch_time_s"].median() / b["epoch_time_s"].median())
    name = "frameworks/" + "/".join(map(str, [*pair, *key.values()]))
    lo, hi, note = speedup_interval(
        a["epoch_time_s"],
        b["epoch_time_s"],
        name,
        base_repeats=a["repeat"].tolist(),
        repeats=b["repeat"].tolist(),
    )
    return ratio, lo, hi, note


def speedup_rows(summary: pd.DataFrame, runs: pd.DataFrame, pair: tuple[str, str]) -> list[dict]:
    """One row per (partition, backend, batch, workers) measured in either framework of
    ``pair``, at the LR rule both measured ('none' where both have it)."""
    best = best_settings(runs)
    s = at_best(summary, best)
    s = s[s["framework"].isin(pair)]
    done = at_best(_plain_done(runs), best)
    rows = []
    for place, g in s.groupby(PLACE, sort=True):
        rules = [set(g.loc[g["framework"] == f, "lr_rule"]) for f in pair]
        common = rules[0] & rules[1]
        lr = pref_lr(common or rules[0] | rules[1])
        g = g[g["lr_rule"] == lr]
        for w, gw in g.groupby("workers", sort=True):
            key = dict(zip(PLACE, place), lr_rule=lr, workers=int(w))
            by = {x["framework"]: x for _, x in gw.iterrows()}
            row = {**key, "sides": [_side(by.get(f)) for f in pair]}
            row["ratio"], row["ratio_lo"], row["ratio_hi"], row["ratio_note"] = _time_ratio(
                done, key, pair
            )
            rows.append(row)
    return rows


def sync_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """Medians over the completed repeats (all LR rules: the synchronisation does not
    depend on it) of the per-step sync figures of every multi-worker configuration, each
    framework at its best step setting."""
    done = at_best(_plain_done(runs), best_settings(runs))
    done = done[done["workers"] > 1]
    keys = ["partition", "backend", "batch_per_worker", "workers", "framework"]
    cols = [c for c in SYNC_STATS if c in done]
    if done.empty:
        return pd.DataFrame(columns=keys + cols + ["n"])
    out = done.groupby(keys, sort=True)[cols].median()
    out["n"] = done.groupby(keys, sort=True)["run_id"].count()
    out = out.reset_index()
    order = {f: i for i, f in enumerate(frameworks_of(done))}
    return out.sort_values(
        keys[:-1] + ["framework"], key=lambda c: c.map(order) if c.name == "framework" else c
    ).reset_index(drop=True)


def missing_baselines(summary: pd.DataFrame) -> list[dict]:
    """Every (partition, framework, backend, batch, LR rule) group with multi-worker runs
    and no completed 1-worker run, with its baseline status."""
    s = with_framework(summary)
    multi = s[(s["workers"] > 1) & (s["n_completed"] > 0) & ~s["has_baseline"].astype(bool)]
    keys = ["partition", "framework", "backend", "batch_per_worker", "lr_rule"]
    out = multi.drop_duplicates(keys)[keys + ["baseline_status"]]
    return out.to_dict("records")
