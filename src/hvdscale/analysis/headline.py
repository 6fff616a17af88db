"""results/scaling/headline.csv: the time-to-target speedup and why (issue 16, item 7).

One row per (partition, framework, backend, batch_per_worker, workers > 1, tuned
False/True); the baseline is always of the same framework:

  speedup_ttt     measured: median time to target of the 1-worker runs / of the n-worker
                  runs (censored runs count as +inf, a median exists while fewer than
                  half are censored), the same ratio as summary.csv's speedup_ttt, with
                  its 95 % bootstrap interval (speedup_ttt_lo, speedup_ttt_hi)
  epoch_speedup   median epoch time of the 1-worker runs / of the n-worker runs
                  (hardware: the phase split says where it goes), epoch_lo/epoch_hi
  epochs_ratio    median epochs to target of the 1-worker runs / of the n-worker runs
                  (statistics: a larger global batch usually needs more epochs)
  fixed_factor    speedup_ttt / (epoch_speedup x epochs_ratio): what the two factors
                  leave out, the time to target that is no steady-state epoch (the
                  warm-up epoch's tracing and first collectives, the validation passes)
                  and the gap between a median of products and a product of medians
  retained_fraction  speedup_ttt / epoch_speedup: how much of the parallel gain
                  survives at equal accuracy
  reached/total, base_reached/base_total   runs that reached the target, per side
  b_simple, critical_batch   McCandlish et al.'s simple noise scale of the n-worker
                  runs (hvdscale.analysis.noise_scale: local against allreduced gradient norms)
  predicted_epochs_ratio     (1 + B_1/B_crit) / (1 + B_n/B_crit), B = global batch
  note            why a value is missing; ci_method: analysis/stats.CI_METHOD

speedup_ttt = epoch_speedup x epochs_ratio x fixed_factor holds by construction. The
headline is the measured ratio, never the product of the two factors alone: on short
runs the warm-up epoch is a large part of the time to target, and a worker count whose
first epoch costs more keeps less of its epoch-time gain than the factors suggest.

Untuned rows use each group's preferred LR rule (analysis/select.pref_lr: 'none' where
measured); tuned rows the selected candidates' re-runs only (analysis/tuning.py),
against the selected 1-worker candidate's re-runs.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from hvdscale.analysis.columns import FRAMEWORK_DEFAULT, HEADLINE_COLUMNS, with_framework
from hvdscale.analysis.noise_scale import estimate, predicted_epochs_ratio
from hvdscale.analysis.stats import (
    CI_METHOD,
    censor_note,
    censored_median,
    speedup_interval,
)
from hvdscale.analysis.tuning import CANDIDATE_KEYS, candidate_runs, select_tuned, stream_key
from hvdscale.analysis.view import pref_lr
from hvdscale.matrix.runtable import SEED_KINDS


def noise_scale_of(runs: pd.DataFrame) -> float:
    """B_simple from the runs' noise-scale sums: step-weighted means of the squared
    norms over runs (a ratio of means), then hvdscale.analysis.noise_scale.estimate."""
    cols = ["ns_b_local", "ns_b_global", "ns_steps", "ns_g_local_sq", "ns_g_global_sq"]
    if runs.empty or any(c not in runs for c in cols):
        return math.nan
    ns = runs[cols].apply(pd.to_numeric, errors="coerce").dropna()
    ns = ns[ns["ns_steps"] > 0]
    if ns.empty or ns["ns_b_local"].nunique() != 1 or ns["ns_b_global"].nunique() != 1:
        return math.nan
    w = ns["ns_steps"].to_numpy(float)
    gl = float(np.average(ns["ns_g_local_sq"], weights=w))
    gg = float(np.average(ns["ns_g_global_sq"], weights=w))
    return estimate(ns["ns_b_local"].iloc[0], ns["ns_b_global"].iloc[0], gl, gg)[2]


def _median_ratio(b: pd.Series, g: pd.Series) -> tuple[float, str]:
    mb, rb, tb = censored_median(b.tolist())
    mg, rg, tg = censored_median(g.tolist())
    notes = [
        f"{side}: {n}"
        for side, n in (("1 worker", censor_note(rb, tb)), ("n workers", censor_note(rg, tg)))
        if n
    ]
    return mb / mg, "; ".join(notes)


def _seed_ids(runs: pd.DataFrame) -> list[int]:
    """One id per run's seed (kind, repeat): the bootstrap pairs two runs only where they
    share a seed (a paired design), never a re-run with a scaling run of the same index."""
    kinds = runs["kind"].fillna("").astype(str) if "kind" in runs else [""] * len(runs)
    return [SEED_KINDS.get(k, 9) * 1_000_000 + int(r) for k, r in zip(kinds, runs["repeat"])]


def factors(base: pd.DataFrame, runs: pd.DataFrame, name: str) -> dict:
    """The headline figures of completed n-worker ``runs`` against completed 1-worker
    ``base`` runs (same partition, backend, per-worker batch)."""
    out = {
        "reached": int(runs["reached_target"].astype(bool).sum()),
        "total": int(runs["epochs_to_target"].notna().sum()),
        "base_reached": int(base["reached_target"].astype(bool).sum()),
        "base_total": int(base["epochs_to_target"].notna().sum()),
    }
    reps = dict(base_repeats=_seed_ids(base), repeats=_seed_ids(runs))
    out["epoch_speedup"] = float(base["epoch_time_s"].median() / runs["epoch_time_s"].median())
    out["epoch_lo"], out["epoch_hi"], enote = speedup_interval(
        base["epoch_time_s"], runs["epoch_time_s"], name + "/epoch", **reps
    )
    out["epochs_ratio"], _ = _median_ratio(base["epochs_to_target"], runs["epochs_to_target"])
    ttt, cnote = _median_ratio(base["time_to_target_s"], runs["time_to_target_s"])
    out["speedup_ttt"] = ttt
    out["fixed_factor"] = ttt / (out["epoch_speedup"] * out["epochs_ratio"])
    out["retained_fraction"] = ttt / out["epoch_speedup"]
    tlo = thi = math.nan
    tnote = cnote
    if not cnote:
        tlo, thi, tnote = speedup_interval(
            base["time_to_target_s"], runs["time_to_target_s"], name + "/ttt", **reps
        )
    out["speedup_ttt_lo"], out["speedup_ttt_hi"] = tlo, thi
    bc = noise_scale_of(runs)
    out["b_simple"] = out["critical_batch"] = bc
    # the epoch-time interval's note only where it says something else
    notes = [n for n in (tnote, "epoch time: " + enote if enote and enote != tnote else "") if n]
    if not math.isfinite(bc):
        notes.append("no noise scale (no multi-worker noise-scale record)")
    out["note"] = "; ".join(dict.fromkeys(notes))
    return out


def _untuned(runs: pd.DataFrame) -> list[dict]:
    plain = runs[(runs["candidate"].fillna("") == "") & (runs["kind"].fillna("") == "")]
    done = plain[plain["status"] == "completed"]
    rows = []
    keys = ["partition", "framework", "backend", "batch_per_worker"]
    for (part, fw, be, bs), grp in done.groupby(keys):
        lr = pref_lr(grp["lr_rule"])
        grp = grp[grp["lr_rule"] == lr]
        base = grp[grp["workers"] == 1]
        for w, g in grp[grp["workers"] > 1].groupby("workers"):
            row = dict(partition=part, framework=fw, backend=be, batch_per_worker=int(bs))
            row.update(workers=int(w), tuned=False, global_batch=int(w * bs))
            if base.empty:  # said, with the counts of the n-worker side (never dropped)
                row["note"] = "no completed 1-worker baseline"
                row.update(reached=int(g["reached_target"].astype(bool).sum()), base_reached=0)
                row.update(total=int(g["epochs_to_target"].notna().sum()), base_total=0)
            else:
                tag = f"{part}/{fw}" if fw != FRAMEWORK_DEFAULT else part
                row.update(factors(base, g, f"headline/{tag}/{be}/{bs}/{lr}/{w}"))
            rows.append(row)
    return rows


#: why a tuned row has no figures, by the tuning group's status (tuned.csv)
TUNED_GAP = {
    "none_reached": "no tuning candidate reached the target within the budget, so nothing "
    "was re-run",
    "awaiting_reruns": "the selected candidate's re-runs are not complete yet",
    "all_failed": "every tuning candidate failed",
}


def _tuned(runs: pd.DataFrame, tuned: pd.DataFrame | None) -> list[dict]:
    if tuned is None or tuned.empty:
        return []
    re_ = candidate_runs(runs, "rerun")
    re_ = re_[re_["status"] == "completed"]
    base = {
        (r.partition, r.framework, r.backend, r.batch_per_worker): r
        for r in tuned[tuned["workers"] == 1].itertuples(index=False)
    }
    plain = runs[(runs["candidate"].fillna("") == "") & (runs["kind"].fillna("") == "")]
    plain1 = plain[(plain["status"] == "completed") & (plain["workers"] == 1)]
    rows = []
    for r in tuned[tuned["workers"] > 1].itertuples(index=False):
        row = dict(partition=r.partition, framework=r.framework, backend=r.backend)
        row.update(batch_per_worker=r.batch_per_worker, workers=r.workers, tuned=True)
        row["global_batch"] = r.global_batch
        b = base.get((r.partition, r.framework, r.backend, r.batch_per_worker))
        name = "/".join(map(str, ["headline/tuned", *stream_key(r)]))
        same = plain1[
            (plain1["partition"] == r.partition)
            & (plain1["framework"] == r.framework)
            & (plain1["backend"] == r.backend)
            & (plain1["batch_per_worker"] == r.batch_per_worker)
        ]
        if b is None and r.status == "selected" and not same.empty:
            # no 1-worker group in the tuning sweep: the baseline is the 1-worker scaling
            # runs at the base learning rate (one LR rule: with 1 worker they all agree)
            same = same[same["lr_rule"] == pref_lr(same["lr_rule"])]
            pick = re_[(re_[CANDIDATE_KEYS] == [getattr(r, k) for k in CANDIDATE_KEYS]).all(axis=1)]
            row.update(factors(same, pick, name))
            note = "baseline: the untuned 1-worker runs (base learning rate)"
            row["note"] = "; ".join(n for n in (note, row.get("note", "")) if n)
        elif b is None or b.status != "selected" or r.status != "selected":
            worst = r.status if b is None or r.status != "selected" else b.status
            side = "" if r.status != "selected" else "1 worker: "
            row["note"] = side + TUNED_GAP.get(str(worst), f"tuned: {worst}")
            row.update(reached=0, total=0, base_reached=0, base_total=0)
        else:
            pick = [
                re_[(re_[CANDIDATE_KEYS] == [getattr(x, k) for k in CANDIDATE_KEYS]).all(axis=1)]
                for x in (b, r)
            ]
            row.update(factors(pick[0], pick[1], name))
        rows.append(row)
    return rows


def headline(runs: pd.DataFrame, tuned: pd.DataFrame | None = None) -> pd.DataFrame:
    """headline.csv from runs.csv and the tuned table of the same runs (tuned.csv;
    None: analysis.tuning.select_tuned of ``runs``). aggregate writes both from one
    tuned table, so they agree by construction."""
    if runs.empty:
        return pd.DataFrame(columns=HEADLINE_COLUMNS)
    if "kind" not in runs:
        runs = runs.assign(kind="")
    runs = with_framework(runs)
    if tuned is None:
        tuned = select_tuned(runs)
    rows = _untuned(runs) + _tuned(runs, tuned)
    out = pd.DataFrame(rows, columns=HEADLINE_COLUMNS)
    bn = out["global_batch"].astype(float)
    b1 = out["batch_per_worker"].astype(float)
    out["predicted_epochs_ratio"] = [
        predicted_epochs_ratio(x1, xn, bc) for x1, xn, bc in zip(b1, bn, out["critical_batch"])
    ]
    for c in ("reached", "total", "base_reached", "base_total"):
        out[c] = out[c].astype("Int64")
    out["note"] = out["note"].fillna("")
    out["ci_method"] = CI_METHOD
    return out.sort_values(
        ["partition", "framework", "backend", "batch_per_worker", "workers", "tuned"],
        kind="stable",
    ).reset_index(drop=True)
