"""Precisions and compile modes side by side (issue 32): the rows of the report's
"Precision and compilation" section.

``setting_rows``: one row per (partition, framework, backend, per-worker batch, LR rule,
workers) whose completed scaling runs (no tuning candidates, calibration runs or
re-runs) hold more than one step setting (training.precision, training.compile), at the
LR rule 'none' where such a rule has it (else the first by name, analysis.view.pref_lr).
Per setting:

- n completed, median epoch time, median warm-up (timing.warm_up_s: the compilation,
  kept out of the epoch times) and the phase split's compute, sync and data shares;
- the epoch-time and time-to-target speedups with their 95 % intervals from summary.csv,
  each against the 1-worker runs of ITS OWN setting ('no baseline' where it has none);
- median epochs to the target over the runs that ended for a reason of training
  (analysis.columns.ttt_runs: a run that did not reach it counts as +inf) and how many
  reached it;
- against the reference setting of the row (fp32/off where measured, else the first in
  matrix.runid's order): the ratio of the median epoch times (this setting / reference,
  below 1: this setting is faster) and of the median epochs to the target (above 1: this
  setting needs more epochs), each with a 95 % bootstrap interval over repeats
  (analysis/stats.speedup_interval; the seeds do not depend on the setting, so repeat r
  of both is a pair).

A summary table written before the settings were a group key has no precision/compile
columns: its rows read as fp32/off (analysis.columns.with_framework).
"""

from __future__ import annotations

import math

import pandas as pd

from hvdscale.analysis.columns import step_settings_of, ttt_runs, with_framework
from hvdscale.analysis.like import DEFAULT_SETTING, SETTING_KEYS, plain
from hvdscale.analysis.stats import censored_median, speedup_interval
from hvdscale.analysis.view import pref_lr

PLACE = ["partition", "framework", "backend", "batch_per_worker"]
SETTING = SETTING_KEYS
REFERENCE = DEFAULT_SETTING
SHARES = ["compute_share", "sync_share", "data_share"]


def setting_name(setting: tuple[str, str]) -> str:
    """'bf16/default': the report's name of a step setting."""
    return "/".join(setting)


def reference_of(settings: list[tuple[str, str]]) -> tuple[str, str]:
    """fp32/off where among ``settings`` (columns.step_settings_of's order), else the first."""
    return REFERENCE if REFERENCE in settings else settings[0]


def _select(df: pd.DataFrame, key: dict) -> pd.DataFrame:
    for k, v in key.items():
        df = df[df[k] == v]
    return df


def _summary_side(summary: pd.DataFrame, key: dict) -> dict:
    """The summary.csv figures of one configuration and setting ({} without a row)."""
    if any(k not in summary for k in key):
        return {"in_summary": False}
    s = _select(summary, key)
    if s.empty:
        return {"in_summary": False}
    x = s.iloc[0]
    return {
        "in_summary": True,
        "has_baseline": bool(x["has_baseline"]),
        "baseline_status": str(x["baseline_status"]),
        **{k: x[k] for k in ("speedup", "speedup_lo", "speedup_hi")},
        **{k: x[k] for k in ("speedup_ttt", "speedup_ttt_lo", "speedup_ttt_hi")},
        "target_too_loose": bool(x["target_too_loose"]),
    }


def _ratio(mine: pd.DataFrame, ref: pd.DataFrame, col: str, name: str) -> tuple:
    """(median of ``col`` in ``mine`` / in ``ref``, lo, hi, note); +inf (censored) counts
    in the medians (stats.censored_median: none where half or more are censored)."""
    a, _, _ = censored_median(mine[col])
    b, _, _ = censored_median(ref[col])
    ratio = a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else math.nan
    lo, hi, note = speedup_interval(
        mine[col],
        ref[col],
        name,
        base_repeats=mine["repeat"].tolist(),
        repeats=ref["repeat"].tolist(),
    )
    return ratio, lo, hi, note


def _median(df: pd.DataFrame, col: str) -> float:
    if col not in df:
        return math.nan
    v = pd.to_numeric(df[col], errors="coerce").dropna()
    return float(v.median()) if not v.empty else math.nan


def _setting(
    key: dict, setting: tuple, ref: tuple, done: pd.DataFrame, ended: pd.DataFrame, summary
) -> dict:
    """One setting's figures of one configuration."""
    own = dict(zip(SETTING, setting))
    mine = _select(done, own)
    mine_t = _select(ended, own)
    ep, reached, total = censored_median(mine_t["epochs_to_target"])
    out = {
        "precision": setting[0],
        "compile": setting[1],
        "reference": setting == ref,
        "n": int(len(mine)),
        "epoch_time_s": _median(mine, "epoch_time_s"),
        "warm_up_s": _median(mine, "warm_up_s"),
        **{c: _median(mine, c) for c in SHARES},
        "epochs_to_target": ep,
        "n_reached": reached,
        "n_ttt": total,
        **_summary_side(summary, {**key, **own}),
    }
    if setting == ref:
        return out
    base = dict(zip(SETTING, ref))
    name = "step_settings/" + "/".join(map(str, [*key.values(), *setting, *ref]))
    r = _ratio(mine, _select(done, base), "epoch_time_s", name + "/epoch")
    out["time_ratio"], out["time_ratio_lo"], out["time_ratio_hi"], out["time_ratio_note"] = r
    r = _ratio(mine_t, _select(ended, base), "epochs_to_target", name + "/epochs")
    out["epochs_ratio"], out["epochs_ratio_lo"], out["epochs_ratio_hi"] = r[:3]
    out["epochs_ratio_note"] = r[3]
    return out


def setting_rows(summary: pd.DataFrame | None, runs: pd.DataFrame | None) -> list[dict]:
    """One row per configuration whose completed scaling runs hold more than one step
    setting: its keys, ``reference`` (the reference setting's name) and ``settings`` (one
    dict per setting, in step_settings_of's order, the reference's without ratios)."""
    if runs is None or runs.empty:
        return []
    scaling = plain(runs)
    done = scaling[scaling["status"] == "completed"]
    ended = ttt_runs(scaling)
    s = with_framework(summary) if summary is not None else pd.DataFrame()
    rows = []
    for place, g in done.groupby(PLACE, sort=True):
        many = [lr for lr, gl in g.groupby("lr_rule") if len(step_settings_of(gl)) > 1]
        if not many:
            continue
        lr = pref_lr(many)
        for w, gw in g[g["lr_rule"] == lr].groupby("workers", sort=True):
            settings = step_settings_of(gw)
            if len(settings) < 2:
                continue
            key = dict(zip(PLACE, place), lr_rule=lr, workers=int(w))
            ref = reference_of(settings)
            ended_here = _select(ended, key)
            rows.append(
                {
                    **key,
                    "reference": setting_name(ref),
                    "settings": [_setting(key, st, ref, gw, ended_here, s) for st in settings],
                }
            )
    return rows


def missing_baselines(rows: list[dict]) -> list[dict]:
    """Every (configuration's group, setting) of ``rows`` without a 1-worker baseline of
    its own setting in summary.csv (or without a summary row), once per group."""
    keys = [*PLACE, "lr_rule"]
    seen, out = set(), []
    for x in rows:
        for st in x["settings"]:
            if st.get("in_summary") and st["has_baseline"]:
                continue
            k = tuple(x[c] for c in keys) + (st["precision"], st["compile"])
            if k in seen:
                continue
            seen.add(k)
            status = st["baseline_status"] if st.get("in_summary") else "no summary row"
            out.append({**dict(zip(keys, k[:-2])), **dict(zip(SETTING, k[-2:])), "status": status})
    return out
