"""The report's headline: one generated sentence per per-worker batch (and worker count),
untuned and tuned, from results/scaling/headline.csv, on the first page; and the readers
of headline.csv and target.json with errors that name the file.

A sentence follows from the numbers alone: a time-to-target speedup with its interval and
reached/total, the epoch-time speedup, and the share of the epoch-time gain that survives
at equal accuracy; or plainly that the runs do not reach the target within the budget,
and which factor stops them.

Example
  "2 workers reach the target validation loss 1.40x [1.20-1.70] faster than 1 worker
  (5/5 reached; 1 worker 5/5); epoch time 1.80x [1.70-1.90]; 78 % of the epoch-time gain
  survives at equal accuracy"
"""

from __future__ import annotations

from collections.abc import Mapping
from xml.sax.saxutils import escape

import pandas as pd

from hvdscale.analysis.columns import (
    FRAMEWORK_DEFAULT,
    framework_label,
    names_framework,
    with_framework,
)
from hvdscale.analysis.like import DEFAULT_SETTING, LIKE_KEYS, setting_label
from hvdscale.analysis.noise_scale import predicted_epochs_interval
from hvdscale.analysis.stats import COVERAGE_FEW, FEW_REPEATS
from hvdscale.report import fmt
from hvdscale.report.context import report_target
from hvdscale.target import target_words

MIN_REPEATS = 3  # fewer repeats on either side: no interval (analysis.stats)
NO_INTERVAL = f"no interval: fewer than {MIN_REPEATS} repeats"


# ----------------------------------------------------------------------------- readers


# ----------------------------------------------------------------------------- sentences


def _x(v) -> str:
    return f"{fmt.speedup(v)}x"


def with_interval(v, lo, hi) -> str:
    """'1.40x [1.20-1.70]' (en dash), '1.40x [0.80, inf)' with an open end; '1.40x'
    without an interval."""
    ci = fmt.interval(lo, hi)
    return f"{_x(v)} {ci}" if ci else _x(v)


def predicted_ratio_text(p, b_1, b_n, b_lo, b_hi) -> str:
    """The noise scale's predicted epochs ratio ``p`` with its 95 % interval, the ratios
    over B_simple's interval [b_lo, b_hi] (analysis.noise_scale.predicted_epochs_interval):
    '0.62 [0.55-0.70]'; '0.62 (point estimate)' where B_simple has no interval."""
    ci = fmt.interval(*predicted_epochs_interval(float(b_1), float(b_n), b_lo, b_hi))
    return f"{fmt.speedup(p)} {ci}" if ci else f"{fmt.speedup(p)} (point estimate)"


def workers_text(n: int) -> str:
    return f"{int(n)} worker{'s' if int(n) != 1 else ''}"


def no_median(reached: int, total: int) -> bool:
    """No median time to target: half or more of the runs censored (or none at all)."""
    return total == 0 or 2 * (total - reached) >= total


def _interval_gap(row: Mapping) -> str:
    """Why a finite speedup has no interval ('' where it has one)."""
    if fmt.has_interval(row["speedup_ttt_lo"], row["speedup_ttt_hi"]):
        return ""
    if min(int(row["total"]), int(row["base_total"])) < MIN_REPEATS:
        return NO_INTERVAL
    note = str(row.get("note") or "")
    return note if note.startswith("no interval") else "no interval"


def _epoch_clause(row: Mapping) -> str:
    if not fmt.isnum(row["epoch_speedup"]):
        return "no epoch-time speedup"
    return "epoch time " + with_interval(row["epoch_speedup"], row["epoch_lo"], row["epoch_hi"])


def _side(reached, total, diverged, word: str = " reached") -> str:
    """'5/5 reached'; '3/5 reached, 1 diverged (non-finite loss), 1 hit the budget'."""
    why = fmt.not_reached(reached, total, diverged)
    return f"{int(reached)}/{int(total)}{word}" + (f", {why}" if why else "")


def _counts(row: Mapping) -> str:
    """Both sides' reached/total with the reasons of the runs not reached."""
    mine = _side(row["reached"], row["total"], row.get("diverged", 0))
    base = _side(row["base_reached"], row["base_total"], row.get("base_diverged", 0), "")
    return f"{mine}; 1 worker {base}"


def _stopped_by(row: Mapping) -> str:
    """Which factor stops a censored n-worker configuration, from the numbers: a
    direction word only where the epoch-time interval lies on one side of 1."""
    e, lo, hi = row["epoch_speedup"], row.get("epoch_lo"), row.get("epoch_hi")
    t, r = int(row["total"]), int(row["reached"])
    div = int(row.get("diverged", 0)) if fmt.isnum(row.get("diverged", 0)) else 0
    if not fmt.isnum(e):
        return "no epoch-time speedup to say which factor stops it"
    ep = with_interval(e, lo, hi)
    way = fmt.direction(lo, hi)
    if way == "slower":
        return f"the epoch itself is slower ({ep}: hardware, see the phase split)"
    if way != "faster":
        held = "its interval holds 1" if fmt.has_interval(lo, hi) else "it has no interval"
        return f"the epoch-time speedup {ep}: {held}, so no factor is shown to stop it"
    if div >= t - r:  # every run not reached diverged: the loss, not the epochs
        return f"the epoch is faster ({ep}), but the runs that did not reach it diverged"
    text = (
        f"the epoch is faster ({ep}), so the larger global batch needs more epochs to the "
        "target (statistics)"
    )
    p = row.get("predicted_epochs_ratio")
    if fmt.isnum(p):
        b_1, b_n = row["batch_per_worker"], row["global_batch"]
        b_lo, b_hi = row.get("b_simple_lo"), row.get("b_simple_hi")
        text += "; the noise scale predicts an epochs ratio of " + predicted_ratio_text(
            p, b_1, b_n, b_lo, b_hi
        )
    return text


def _censored_clause(row: Mapping) -> str:
    w, r, t = int(row["workers"]), int(row["reached"]), int(row["total"])
    br, bt = int(row["base_reached"]), int(row["base_total"])
    ws = workers_text(w)
    if t == 0:
        return f"{ws}: {row.get('note') or 'no completed run'}"
    mine = _side(r, t, row.get("diverged", 0))
    base = _side(br, bt, row.get("base_diverged", 0))
    if bt == 0:
        why = str(row.get("note") or "no completed 1-worker run, so no baseline")
        return f"{why} ({ws} {mine})"
    if no_median(r, t):
        head = (
            f"{ws} do not reach the target ({mine})"
            if r == 0
            else f"{ws} reach the target in only {r}/{t} runs ({mine}): no median time to "
            f"target (1 worker {base})"
        )
        return f"{head}; {_epoch_clause(row)}; {_stopped_by(row)}"
    if no_median(br, bt):
        return (
            f"1 worker reaches the target in only {br}/{bt} runs ({base}): no baseline time "
            f"to target ({ws} {mine}); {_epoch_clause(row)}"
        )
    note = str(row.get("note") or "no time-to-target speedup")
    return f"{ws}: {note} ({_counts(row)}); {_epoch_clause(row)}"


def headline_sentence(row: Mapping, target: Mapping | None = None) -> str:
    """The headline of one row of headline.csv (a configuration with n > 1 workers);
    ``target`` (target.json) names the target in its metric's units."""
    s = row["speedup_ttt"]
    if not fmt.isnum(s):
        return _censored_clause(row)
    w = int(row["workers"])
    counts = _counts(row)
    gap = _interval_gap(row)
    if gap:
        counts += f"; {gap}"
    lo, hi = row["speedup_ttt_lo"], row["speedup_ttt_hi"]
    speed = with_interval(s, lo, hi)
    ws = workers_text(w)
    goal = target_words(target)
    way = fmt.direction(lo, hi)  # a direction only where the whole interval supports it
    if way == "faster":
        text = f"{ws} reach {goal} {speed} faster than 1 worker ({counts})"
    elif way == "slower":
        text = f"{ws} reach {goal} more slowly than 1 worker: speedup {speed} ({counts})"
    elif fmt.has_interval(lo, hi):
        text = (
            f"{ws} reach {goal} neither clearly faster nor slower than "
            f"1 worker: speedup {speed}, the interval holds 1 ({counts})"
        )
    else:
        text = (
            f"{ws} reach {goal} at a speedup of {speed} over 1 worker, "
            f"too few runs to say faster or slower ({counts})"
        )
    text += f"; {_epoch_clause(row)}"
    loose = [n for n in str(row.get("note") or "").split("; ") if n.startswith("target loose")]
    if loose:
        text += f"; {loose[0]}: the time to target says little about convergence"
    rf = row["retained_fraction"]
    if fmt.isnum(rf):
        text += f"; {survival_clause(rf, row['epoch_speedup'], row['epoch_lo'], row['epoch_hi'])}"
    return text


def survival_clause(retained_fraction, epoch_speedup, epoch_lo=None, epoch_hi=None) -> str:
    """The time-to-target speedup as a fraction of the epoch-time speedup (a ratio of
    speedups, of the two medians: the epochs ratio and the warm-up make up the rest),
    where the epoch-time interval shows a faster epoch; otherwise what that interval
    shows, with it (no direction from a point estimate)."""
    ep = with_interval(epoch_speedup, epoch_lo, epoch_hi)
    way = fmt.direction(epoch_lo, epoch_hi)
    if way == "faster":
        return (
            f"the time-to-target speedup is {float(retained_fraction):.2f}x the epoch-time "
            "speedup (ratio of the medians; the epochs ratio and the warm-up make up the rest)"
        )
    if way == "slower":
        return f"no epoch-time gain to keep: the epoch itself is slower ({ep}: hardware)"
    if fmt.has_interval(epoch_lo, epoch_hi):
        return f"no epoch-time gain shown: the epoch-time interval {ep} holds 1"
    return f"no epoch-time gain shown: the epoch-time speedup {ep} has no interval"


#: what the first page's time to target counts, and what the launch-to-target figure adds
CLOCKS_NOTE = (
    "Time to target is training time: the start-up of every job (launch, framework import "
    "and initialisation, reading the data, building the model) is not in it. 'With start-up' "
    "is the same speedup of the launch-to-target time: each job's start-up, from the "
    "launcher's start to its first epoch, plus its training time to the end of the target "
    "epoch (queue wait and the SLURM allocation are not included)."
)


def launch_clause(row: Mapping) -> str:
    """'; with start-up: 1.05x [0.91-1.20], the interval holds 1' (headline.csv
    speedup_launch_ttt: launch to target, the launcher's start to the target epoch's end;
    a direction word only where the whole interval lies on one side of 1); '' where the
    row has no such figure (older records, ranks started without the launcher's stamp)."""
    s = row.get("speedup_launch_ttt")
    if not fmt.isnum(s):
        return ""
    lo, hi = row.get("speedup_launch_ttt_lo"), row.get("speedup_launch_ttt_hi")
    word = fmt.direction(lo, hi) or (
        "the interval holds 1" if fmt.has_interval(lo, hi) else "no interval"
    )
    return f"; with start-up: {with_interval(s, lo, hi)}, {word}"


def startup_note(runs: pd.DataFrame | None) -> str:
    """CLOCKS_NOTE, with the measured median start-up and time to target of the runs
    (runs.csv startup_s, time_to_target_s) where the runs table has them."""
    if runs is None or "startup_s" not in runs or runs.empty:
        return CLOCKS_NOTE
    s = pd.to_numeric(runs["startup_s"], errors="coerce").dropna()
    t = pd.to_numeric(runs["time_to_target_s"], errors="coerce")
    t = t[t.map(fmt.isnum)]
    if s.empty:
        return CLOCKS_NOTE
    told = f"Median start-up {fmt.seconds(s.median())} s per run ({len(s)} runs)"
    if not t.empty:
        told += f", median time to target {fmt.seconds(t.median())} s (runs that reached it)"
    return f"{CLOCKS_NOTE} {told}."


def best1_clause(row: Mapping) -> str:
    """'; against the fastest 1-worker configuration (batch 1000, LR none): 0.85x
    [0.60-1.10], the interval holds 1' ('' where the row has none)."""
    label = str(row.get("best1_baseline") or "")
    s = row.get("speedup_ttt_best1")
    if not label or not fmt.isnum(s):
        return ""
    lo, hi = row.get("speedup_ttt_best1_lo"), row.get("speedup_ttt_best1_hi")
    way = fmt.direction(lo, hi)
    if way == "faster":
        word = "faster"
    elif way == "slower":
        word = "slower"
    elif fmt.has_interval(lo, hi):
        word = "the interval holds 1"
    else:
        word = "no interval"
    return (
        f"; against the fastest 1-worker configuration of this setting ({label}; chosen "
        f"on these runs, the interval resamples the choice): {with_interval(s, lo, hi)}, {word}"
    )


def batch_sentence(
    untuned: Mapping | None,
    tuned: Mapping | None,
    name_framework: bool = False,
    name_setting: bool = False,
    target: Mapping | None = None,
) -> str:
    """The first page's sentence for one (partition, [framework,] backend, [setting,]
    batch, workers): untuned and tuned; a missing side says so. ``name_framework``: name
    the framework (a study with more than one); ``name_setting``: the step setting
    (a study with another than fp32, eager); ``target``: target.json, for its metric."""
    row = untuned if untuned is not None else tuned
    if row is None:
        raise ValueError("batch_sentence needs at least one row")
    parts = []
    if untuned is not None:
        parts.append(
            "untuned (baseline: the 1-worker runs of this batch and LR rule), "
            + headline_sentence(untuned, target)
            + launch_clause(untuned)
            + best1_clause(untuned)
        )
    else:
        parts.append("untuned: no configuration in the sweep")
    if tuned is not None:
        parts.append(
            "tuned (winners re-run with fresh seeds; baseline: the tuned 1-worker re-runs), "
            + headline_sentence(tuned, target)
            + launch_clause(tuned)
            + best1_clause(tuned)
        )
    else:
        parts.append("tuned: no re-runs of a tuned configuration (not in the tuning sweep)")
    where = [row["partition"], row["backend"]]
    if name_framework:
        where.insert(1, framework_label(row.get("framework", FRAMEWORK_DEFAULT)))
    if name_setting:
        where.append(setting_label(row.get("precision", "fp32"), row.get("compile", "off")))
    head = f"Batch {int(row['batch_per_worker'])} per worker ({', '.join(map(str, where))})"
    return (
        f"{head}: " + ". ".join(p[0].upper() + p[1:] if i else p for i, p in enumerate(parts)) + "."
    )


def headline_sentences(headline: pd.DataFrame | None, target: Mapping | None = None) -> list[str]:
    """One sentence per (partition, framework, backend, batch, workers > 1), in that
    order; the framework is named where the study has more than one; the target in the
    units of ``target``'s metric (target.json)."""
    if headline is None or headline.empty:
        return []
    headline = with_framework(headline)
    multi = names_framework(headline["framework"])
    settings = set(zip(headline["precision"], headline["compile"]))
    named = settings != {DEFAULT_SETTING}
    keys = [*LIKE_KEYS, "batch_per_worker", "workers"]
    rows = headline[headline["workers"] > 1]
    out = []
    for _, g in rows.groupby(keys, sort=True):
        u = g[~g["tuned"]]
        t = g[g["tuned"]]
        out.append(
            batch_sentence(
                u.iloc[0].to_dict() if len(u) else None,
                t.iloc[0].to_dict() if len(t) else None,
                name_framework=multi,
                name_setting=named,
                target=target,
            )
        )
    return out


def coverage_note(headline: pd.DataFrame) -> str:
    """Where a headline interval comes from fewer than FEW_REPEATS repeats on a side: how
    often such intervals cover (analysis/stats.COVERAGE_FEW, from the project's simulation);
    '' where every interval has enough repeats."""
    rows = headline[headline["workers"] > 1]
    has = [
        fmt.has_interval(lo, hi) for lo, hi in zip(rows["speedup_ttt_lo"], rows["speedup_ttt_hi"])
    ]
    rows = rows[has]
    if rows.empty:
        return ""
    fewest = int(min(rows["total"].min(), rows["base_total"].min()))
    if fewest >= FEW_REPEATS:
        return ""
    return (
        f"Coverage: some intervals here rest on {fewest} repeats per side; "
        f"{COVERAGE_FEW}. Read them as wider than printed."
    )


def headline_section(d, r) -> None:
    """The headline on the first page (no section number)."""
    headline = getattr(r, "headline", None)
    if headline is None:
        d.p(
            "<b>Headline.</b> No headline table (results/scaling/headline.csv) was given: "
            "the speedup at equal accuracy is in its section below."
        )
        return
    sentences = headline_sentences(headline, report_target(r))
    if not sentences:
        d.p(
            "<b>Headline.</b> No configuration with more than one worker has a result yet "
            "(headline.csv has no such row)."
        )
        return
    d.p("<b>Headline: speedup at equal accuracy</b> (medians over repeats, 95 % intervals)")
    d.p(escape(startup_note(getattr(r, "runs", None))))
    few = coverage_note(headline)
    if few:
        d.p(escape(few))
    bold = []
    for s in sentences:
        head, _, rest = s.partition(": ")
        bold.append(f"<b>{escape(head)}</b>: {escape(rest)}")
    d.bullets(bold)
