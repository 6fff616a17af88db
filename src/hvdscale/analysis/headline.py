"""results/scaling/headline.csv: the time-to-target speedup and why (issue 16, item 7).

One row per (partition, framework, backend, batch_per_worker, workers > 1, tuned
False/True); the baseline is always of the same framework:

  speedup_ttt     measured: median time to target of the 1-worker runs / of the n-worker
                  runs (censored runs count as +inf, a median exists while fewer than
                  half are censored), the same ratio as summary.csv's speedup_ttt, with
                  its 95 % bootstrap interval (speedup_ttt_lo, speedup_ttt_hi); time
                  to target is training time, start-up excluded
  speedup_launch_ttt  the same ratio of launch-to-target times (runs.csv
                  launch_to_target_s: start-up + time to target, from the launcher's
                  start), with speedup_launch_ttt_lo/_hi; NaN without start-up figures
  epoch_speedup   median epoch time of the 1-worker runs / of the n-worker runs
                  (hardware: the phase split says where it goes), epoch_lo/epoch_hi
  epochs_ratio    median epochs to target of the 1-worker runs / of the n-worker runs
                  (statistics: a larger global batch usually needs more epochs)
  fixed_factor    speedup_ttt / (epoch_speedup x epochs_ratio): what the two factors
                  leave out: the warm-up epochs' time beyond a steady-state epoch
                  (tracing, first collectives) and the gap between a median of products
                  and a product of medians (the validation pass after every epoch is
                  inside the epoch time, so inside epoch_speedup)
  retained_fraction  speedup_ttt / epoch_speedup: how much of the parallel gain
                  survives at equal accuracy
  reached/total, base_reached/base_total   runs that reached the target, per side, of
                  the runs that ended for a reason of training (completed or diverged)
  diverged, base_diverged   of those, the runs whose loss diverged (non-finite) before
                  the target; the rest of the runs not reached hit the budget
  b_simple, critical_batch   McCandlish et al.'s simple noise scale of the completed
                  n-worker runs near the target (the last 3 non-warm-up epochs up to the
                  target epoch), with the finite-shard correction
                  (hvdscale.analysis.noise_scale: local against allreduced gradient norms)
  b_simple_lo, b_simple_hi   its 95 % bootstrap interval over the runs (NaN with fewer
                  than 3 runs: note says so)
  predicted_epochs_ratio     (1 + B_1/B_crit) / (1 + B_n/B_crit), B = global batch
  best1_baseline, speedup_ttt_best1 (_lo, _hi)   the speedup against the fastest
                  1-worker configuration to the target of the partition, framework and
                  backend, whatever its batch and learning rate (untuned configurations
                  and tuned winners' re-runs; ``fastest_1_worker``), named
  note            why a value is missing, and a loose target (reached fewer than
                  LOOSE_EPOCHS epochs after the warm-up); ci_method: analysis/stats.CI_METHOD

Runs that diverged (nan_loss) count as not reached (censored), like runs out of budget
(analysis.columns.ttt_runs); failed or mislabelled runs are excluded and listed.

speedup_ttt = epoch_speedup x epochs_ratio x fixed_factor holds by construction. The
headline is the measured ratio, never the product of the two factors alone: on short
runs the warm-up epoch is a large part of the time to target, and a worker count whose
first epoch costs more keeps less of its epoch-time gain than the factors suggest.

Untuned rows use each group's preferred LR rule (analysis/view.pref_lr: 'none' where
measured) against the 1-worker runs of the same batch and rule; tuned rows the selected
candidates' re-runs only (analysis/tuning.py) against the selected 1-worker candidate's
re-runs: tuned against tuned, never against untuned runs (a sweep that tunes n workers
only gets no tuned speedup, and the note says so: NO_TUNED_BASELINE).
"""

from __future__ import annotations

import math

import pandas as pd

from hvdscale.analysis.columns import HEADLINE_COLUMNS, ttt_runs, with_framework
from hvdscale.analysis.like import LIKE_KEYS, like_key, plain, seed_ids, stream_tag
from hvdscale.analysis.noise_scale import (
    WINDOW_COLUMNS,
    configuration_estimate,
    predicted_epochs_ratio,
    window_sums,
)
from hvdscale.analysis.stats import (
    CI_METHOD,
    best_of_interval,
    censor_note,
    censored_median,
    speedup_interval,
)
from hvdscale.analysis.tuning import candidate_runs, reruns_of, select_tuned, stream_key
from hvdscale.analysis.view import pref_lr
from hvdscale.target import TOO_LOOSE


def noise_scale_of(runs: pd.DataFrame, name: str) -> tuple[float, float, float, str]:
    """(B_simple, lo, hi, note) of one configuration's runs near the target: their
    window sums (``with_window_sums``) pooled as a ratio of means with the finite-shard
    correction, and the bootstrap interval over the runs
    (analysis/noise_scale.configuration_estimate)."""
    nan = math.nan
    none = "no noise scale (no per-epoch noise-scale sums near the target)"
    if runs.empty or any(c not in runs for c in WINDOW_COLUMNS):
        return nan, nan, nan, none
    b_small = pd.to_numeric(runs["batch_per_worker"], errors="coerce").dropna().unique()
    b_big = pd.to_numeric(runs["global_batch"], errors="coerce").dropna().unique()
    if len(b_small) != 1 or len(b_big) != 1:
        return nan, nan, nan, "no noise scale (more than one batch size)"
    b, lo, hi, note = configuration_estimate(b_small[0], b_big[0], runs[WINDOW_COLUMNS], name)
    if not math.isfinite(b) and note.startswith("no noise-scale sums"):
        note = none
    elif not math.isfinite(b):
        note = "; ".join(x for x in ("no noise scale (|G|^2 or S not positive)", note) if x)
    return b, lo, hi, note


def with_window_sums(runs: pd.DataFrame, epochs: pd.DataFrame | None) -> pd.DataFrame:
    """``runs`` with every completed run's noise-scale sums over its near-target window
    (analysis/noise_scale.window_sums, NaN where it has none; all NaN without epochs)."""
    sums = window_sums(runs, epochs).set_index("run_id")
    return runs.assign(**{c: runs["run_id"].map(sums[c]).astype(float) for c in WINDOW_COLUMNS})


def _median_ratio(b: pd.Series, g: pd.Series) -> tuple[float, str]:
    mb, rb, tb = censored_median(b.tolist())
    mg, rg, tg = censored_median(g.tolist())
    notes = [
        f"{side}: {n}"
        for side, n in (("1 worker", censor_note(rb, tb)), ("n workers", censor_note(rg, tg)))
        if n
    ]
    return mb / mg, "; ".join(notes)


#: a target reached within fewer epochs after the warm-up than this is loose: the time
#: to target then measures start and warm-up, not convergence (issue 30, item 6)
LOOSE_EPOCHS = 3


def loose_count(runs: pd.DataFrame) -> int:
    """Runs that reached the target fewer than LOOSE_EPOCHS epochs after their warm-up."""
    if runs.empty or "target_epoch" not in runs:
        return 0
    warm = runs["warmup_epochs"] if "warmup_epochs" in runs else 0
    after = pd.to_numeric(runs["target_epoch"], errors="coerce") + 1 - warm
    return int((runs["reached_target"].astype(bool) & (after < LOOSE_EPOCHS)).sum())


def counts(runs: pd.DataFrame, prefix: str = "") -> dict:
    """reached, total (every run that ended for a reason of training: completed or
    diverged) and diverged (non-finite loss before the target) of one side's runs."""
    reached = runs["reached_target"].astype(bool)
    diverged = (runs["status"] == "nan_loss") & ~reached if "status" in runs else reached & False
    return {
        f"{prefix}reached": int(reached.sum()),
        f"{prefix}total": int(runs["epochs_to_target"].notna().sum()),
        f"{prefix}diverged": int(diverged.sum()),
    }


def in_warmup(runs: pd.DataFrame) -> bool:
    """Whether a run met the target in its warm-up (the target is too loose there:
    target.TOO_LOOSE; summary.csv and tuned.csv show no time-to-target speedup then)."""
    return "target_in_warmup" in runs and bool(runs["target_in_warmup"].fillna(False).any())


def factors(base: pd.DataFrame, runs: pd.DataFrame, name: str) -> dict:
    """The headline figures of completed n-worker ``runs`` against completed 1-worker
    ``base`` runs (same partition, backend, per-worker batch)."""
    out = {**counts(runs), **counts(base, "base_")}
    reps = dict(base_repeats=seed_ids(base), repeats=seed_ids(runs))
    out["epoch_speedup"] = float(base["epoch_time_s"].median() / runs["epoch_time_s"].median())
    out["epoch_lo"], out["epoch_hi"], enote = speedup_interval(
        base["epoch_time_s"], runs["epoch_time_s"], name + "/epoch", **reps
    )
    out["epochs_ratio"], _ = _median_ratio(base["epochs_to_target"], runs["epochs_to_target"])
    ttt, cnote = _median_ratio(base["time_to_target_s"], runs["time_to_target_s"])
    tlo = thi = math.nan
    tnote = cnote
    if in_warmup(base) or in_warmup(runs):  # as summary.csv and tuned.csv: no speedup
        ttt, tnote, cnote = math.nan, TOO_LOOSE, TOO_LOOSE
    out["speedup_ttt"] = ttt
    out["fixed_factor"] = ttt / (out["epoch_speedup"] * out["epochs_ratio"])
    out["retained_fraction"] = ttt / out["epoch_speedup"]
    if not cnote:
        tlo, thi, tnote = speedup_interval(
            base["time_to_target_s"], runs["time_to_target_s"], name + "/ttt", **reps
        )
    out["speedup_ttt_lo"], out["speedup_ttt_hi"] = tlo, thi
    if tnote != TOO_LOOSE:
        out.update(launch_speedup(base, runs, name, reps))
    bc, out["b_simple_lo"], out["b_simple_hi"], nnote = noise_scale_of(runs, name + "/noise")
    out["b_simple"] = out["critical_batch"] = bc
    # the epoch-time interval's note only where it says something else
    notes = [n for n in (tnote, "epoch time: " + enote if enote and enote != tnote else "") if n]
    if nnote:
        notes.append(nnote)
    nl, bl = loose_count(runs), loose_count(base)
    if nl or bl:
        notes.append(
            f"target loose: reached fewer than {LOOSE_EPOCHS} epochs after the warm-up in "
            f"{nl}/{out['total']} runs (1 worker {bl}/{out['base_total']})"
        )
    out["note"] = "; ".join(dict.fromkeys(notes))
    return out


def launch_speedup(base: pd.DataFrame, runs: pd.DataFrame, name: str, reps: dict) -> dict:
    """Issue 30 item 7: the time-to-target speedup with the start-up counted
    (runs.csv launch_to_target_s: the launcher's start to the target epoch's end),
    computed exactly like speedup_ttt (censored median, the interval paired by seed);
    NaN where a run of either side has no start-up figure (older records, ranks started
    without the launcher's stamp): a part of the runs would be a different sample."""
    col = "launch_to_target_s"
    keys = ("speedup_launch_ttt", "speedup_launch_ttt_lo", "speedup_launch_ttt_hi")
    out = dict.fromkeys(keys, math.nan)
    if col not in base or col not in runs or base.empty or runs.empty:
        return out
    b, g = base[col].astype(float), runs[col].astype(float)
    if b.isna().any() or g.isna().any():
        return out
    ratio, note = _median_ratio(b, g)
    out["speedup_launch_ttt"] = ratio
    if not note:
        lo, hi, _ = speedup_interval(b, g, name + "/launch_ttt", **reps)
        out["speedup_launch_ttt_lo"], out["speedup_launch_ttt_hi"] = lo, hi
    return out


def fastest_1_worker(runs: pd.DataFrame, tuned: pd.DataFrame | None) -> dict:
    """{like key (partition, framework, backend, precision, compile): (label, ranked)}:
    the 1-worker configurations of one system and step setting (analysis/like.py),
    whatever their per-worker batch and learning rate: the untuned configurations
    (scaling runs per batch and LR rule) and the selected tuning candidates' re-runs
    (fresh seeds, never the selection runs). ``ranked``: [(label, runs)], the fastest
    first (smallest median time to target; censored runs +inf; no median: not a
    candidate). Hoefler & Belli's baseline: the best 1-worker version. The fastest is
    chosen on the same runs it is compared with, so its interval resamples every
    candidate and takes the fastest in each replicate (``_against_best``)."""
    if "kind" not in runs:
        runs = runs.assign(kind="")
    done = ttt_runs(plain(runs))
    one = done[done["workers"] == 1]
    options: dict[tuple, list] = {}
    for key, g in one.groupby([*LIKE_KEYS, "batch_per_worker", "lr_rule"]):
        bs, lr = key[-2:]
        options.setdefault(key[:-2], []).append((f"batch {int(bs)}, LR {lr}, untuned", g))
    if tuned is not None and not tuned.empty:
        re_ = ttt_runs(candidate_runs(runs, "rerun"))
        for r in tuned[(tuned["workers"] == 1) & (tuned["status"] == "selected")].itertuples(
            index=False
        ):
            g = reruns_of(re_, r)
            label = (
                f"batch {int(r.batch_per_worker)}, tuned (LR {r.lr_rule} "
                f"x{float(r.lr_multiplier):g}, warm-up {int(r.warmup_epochs)})"
            )
            options.setdefault(like_key(r), []).append((label, g))
    best = {}
    for key, opts in options.items():
        ranked = [
            (censored_median(g["time_to_target_s"].tolist())[0], label, g)
            for label, g in opts
            if not g.empty
        ]
        ranked = sorted((x for x in ranked if math.isfinite(x[0])), key=lambda x: (x[0], x[1]))
        if ranked:
            best[key] = [(label, g) for _, label, g in ranked]
    return best


def _against_best(best: dict, key: tuple, g: pd.DataFrame, name: str) -> dict:
    """The time-to-target speedup of n-worker runs ``g`` against the fastest 1-worker
    configuration of their system and step setting, with an interval that includes the
    choice: each bootstrap replicate resamples every candidate configuration and takes
    the fastest of that replicate (analysis/stats.best_of_interval)."""
    out = dict(best1_baseline="", speedup_ttt_best1=math.nan)
    out.update(speedup_ttt_best1_lo=math.nan, speedup_ttt_best1_hi=math.nan)
    if key not in best or g.empty:
        return out
    label, b = best[key][0]
    if in_warmup(b) or in_warmup(g):  # the target too loose: no time-to-target speedup
        return out
    ratio, note = _median_ratio(b["time_to_target_s"], g["time_to_target_s"])
    out.update(best1_baseline=label, speedup_ttt_best1=ratio)
    if not note:
        lo, hi, _ = best_of_interval(
            [x["time_to_target_s"] for _, x in best[key]], g["time_to_target_s"], name + "/best1"
        )
        out.update(speedup_ttt_best1_lo=lo, speedup_ttt_best1_hi=hi)
    return out


def _untuned(runs: pd.DataFrame, best: dict) -> list[dict]:
    done = ttt_runs(plain(runs))  # completed and diverged (censored)
    rows = []
    for key, grp in done.groupby([*LIKE_KEYS, "batch_per_worker"]):
        like, bs = key[:-1], int(key[-1])
        lr = pref_lr(grp["lr_rule"])
        grp = grp[grp["lr_rule"] == lr]
        base = grp[grp["workers"] == 1]
        tag = f"{stream_tag(*like[:2], *like[3:])}/{like[2]}/{bs}"
        for w, g in grp[grp["workers"] > 1].groupby("workers"):
            row = dict(zip(LIKE_KEYS, like), batch_per_worker=bs)
            row.update(workers=int(w), tuned=False, global_batch=int(w * bs))
            if base.empty:  # said, with the counts of the n-worker side (never dropped)
                row["note"] = "no completed 1-worker baseline"
                row.update(counts(g), base_reached=0, base_total=0, base_diverged=0)
            else:
                row.update(factors(base, g, f"headline/{tag}/{lr}/{w}"))
            row.update(_against_best(best, like, g, f"headline/{tag}/{w}"))
            rows.append(row)
    return rows


#: a tuned row of a sweep that tunes n workers only (issue 30: like against like)
NO_TUNED_BASELINE = (
    "no tuned 1-worker baseline: the tuning sweep has no 1-worker group, and tuned n "
    "workers are compared only with tuned 1 worker (add 1 to scaling.tune.workers)"
)

#: why a tuned row has no figures, by the tuning group's status (tuned.csv)
TUNED_GAP = {
    "none_reached": "no tuning candidate reached the target within the budget, so nothing "
    "was re-run",
    "awaiting_reruns": "the selected candidate's re-runs are not complete yet",
    "all_failed": "every tuning candidate failed",
}


def _tuned(runs: pd.DataFrame, tuned: pd.DataFrame | None, best: dict) -> list[dict]:
    if tuned is None or tuned.empty:
        return []
    re_ = ttt_runs(candidate_runs(runs, "rerun"))
    tuned = with_framework(tuned)  # a tuned table of before the step settings: fp32/off
    base = {
        (*like_key(r), r.batch_per_worker): r
        for r in tuned[tuned["workers"] == 1].itertuples(index=False)
    }
    rows = []
    for r in tuned[tuned["workers"] > 1].itertuples(index=False):
        row = dict(zip(LIKE_KEYS, like_key(r)))
        row.update(batch_per_worker=r.batch_per_worker, workers=r.workers, tuned=True)
        row["global_batch"] = r.global_batch
        b = base.get((*like_key(r), r.batch_per_worker))
        name = "/".join(map(str, ["headline/tuned", *stream_key(r)]))
        mine = reruns_of(re_, r)
        if b is None:
            # like against like: a tuned n-worker result is never compared with untuned
            # 1-worker runs (the 1-worker side would get none of the n-worker side's tuning)
            row["note"] = NO_TUNED_BASELINE
            row.update(counts(mine), base_reached=0, base_total=0, base_diverged=0)
        elif b.status != "selected" or r.status != "selected":
            worst = r.status if r.status != "selected" else b.status
            side = "" if r.status != "selected" else "1 worker: "
            row["note"] = side + TUNED_GAP.get(str(worst), f"tuned: {worst}")
            row.update(reached=0, total=0, diverged=0)
            row.update(base_reached=0, base_total=0, base_diverged=0)
        else:
            row.update(factors(reruns_of(re_, b), mine, name))
        if r.status == "selected":
            row.update(_against_best(best, like_key(r), mine, name))
        rows.append(row)
    return rows


def headline(
    runs: pd.DataFrame, tuned: pd.DataFrame | None = None, epochs: pd.DataFrame | None = None
) -> pd.DataFrame:
    """headline.csv from runs.csv and the tuned table of the same runs (tuned.csv;
    None: analysis.tuning.select_tuned of ``runs``). aggregate writes both from one
    tuned table, so they agree by construction. ``epochs`` (epochs.csv of the same runs)
    gives the noise scale near the target; without it there is none (said in ``note``)."""
    if runs.empty:
        return pd.DataFrame(columns=HEADLINE_COLUMNS)
    if "kind" not in runs:
        runs = runs.assign(kind="")
    runs = with_window_sums(with_framework(runs), epochs)
    if tuned is None:
        tuned = select_tuned(runs)
    best = fastest_1_worker(runs, tuned)
    rows = _untuned(runs, best) + _tuned(runs, tuned, best)
    out = pd.DataFrame(rows, columns=HEADLINE_COLUMNS)
    bn = out["global_batch"].astype(float)
    b1 = out["batch_per_worker"].astype(float)
    out["predicted_epochs_ratio"] = [
        predicted_epochs_ratio(x1, xn, bc) for x1, xn, bc in zip(b1, bn, out["critical_batch"])
    ]
    for c in ("reached", "total", "diverged", "base_reached", "base_total", "base_diverged"):
        out[c] = out[c].astype("Int64")
    out["note"] = out["note"].fillna("")
    out["best1_baseline"] = (
        out["best1_baseline"].astype(object).where(out["best1_baseline"].notna(), "")
    )
    out["ci_method"] = CI_METHOD
    return out.sort_values(
        [*LIKE_KEYS, "batch_per_worker", "workers", "tuned"],
        kind="stable",
    ).reset_index(drop=True)
