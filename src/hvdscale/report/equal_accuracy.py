"""The tables and generated sentences of the report's "speedup at equal accuracy" section:
every time to target with reached/total ("> budget" for a censored run, never dropped);
the two factors of every time-to-target speedup (epoch-time speedup: hardware, x ratio of
epochs to target: statistics) with the share of the epoch-time gain that survives; the
gradient noise scale and the critical batch size it predicts (McCandlish et al. 2018);
and the conclusions that follow from these numbers (none is written unconditionally)."""

from __future__ import annotations

import math
from xml.sax.saxutils import escape

import pandas as pd

from hvdscale.analysis.columns import (
    TRAINING_ENDS,
    framework_short,
    names_framework,
    ttt_runs,
    with_framework,
)
from hvdscale.analysis.like import DEFAULT_SETTING, setting_label
from hvdscale.analysis.noise_scale import NEAR_TARGET_EPOCHS, agrees, implied_critical_batch
from hvdscale.analysis.stats import censored_median
from hvdscale.matrix.runid import config_id, run_kind
from hvdscale.report import fmt
from hvdscale.report.headline_text import (
    no_median,
    predicted_ratio_text,
    survival_clause,
    with_interval,
    workers_text,
)
from hvdscale.target import target_words

CENSORED = "> budget"
DIVERGED = "diverged"


def _reached(reached, total, diverged) -> str:
    """'4/5', '3/5 (1 diverged)': reached/total with the diverged runs named."""
    div = int(diverged) if fmt.isnum(diverged) else 0
    return f"{int(reached)}/{int(total)}" + (f" ({div} diverged)" if div else "")


TTT_TABLE_NOTE = (
    "Time to {target} of every run that ended for a reason of training, "
    "per configuration (run id without its repeat): median over repeats with a censored run "
    "counted as +infinity (a median exists while fewer than half are censored), "
    "reached/total, and each repeat's time in repeat order; "
    f"'{CENSORED}': the run hit its budget first; 'diverged': its loss became non-finite "
    "first (both not reached, counted as +infinity, kept). "
    "Tuned configurations (kind rerun) are the winners of the tuning sweep re-run with fresh "
    "seeds; tuning selection runs and calibration runs are not listed. Failed and "
    "mislabelled runs are excluded and listed in the last section."
)
FACTOR_NOTE = (
    "The factors of every time-to-target (TTT) speedup against 1 worker: TTT S = epoch S "
    "x epochs ratio x fixed. TTT S: the measured ratio of median times to target (as in "
    "the Results table). Epoch S: speedup of the epoch time (hardware; where it goes: the "
    "phase split, sync and data shares in the Results tables and the time-per-step figure). "
    "Epochs ratio: median epochs to target of 1 worker / of n workers (statistics: a larger "
    "global batch needs more epochs). Fixed: the rest, the warm-up epochs' time beyond a "
    "steady-state epoch (tracing, first collectives) and the gap between a median of "
    "products and a product of medians; the validation pass after every epoch is part of "
    "the epoch time, so of epoch S. TTT S / epoch S: the ratio of the two speedups "
    "(point estimates: the epochs ratio x fixed). Reached: n-worker runs / 1-worker runs "
    "that reached the target, of those that ended for a reason of training, with the "
    "diverged ones (non-finite loss) counted. Brackets: 95 % bootstrap intervals."
)
FACTOR_HEADER = [
    "Partition / backend",
    "Batch",
    "Workers",
    "Global",
    "Tuned",
    "TTT S [95 % CI]",
    "Epoch S [95 % CI]",
    "Epochs ratio",
    "Fixed",
    "TTT S / epoch S",
    "Reached",
    "Note",
]


def framework_backend(frameworks, backends_) -> list[str]:
    """'DDP gloo', 'Horovod gloo': a backend named with its framework (the tables of a
    study with more than one framework)."""
    return [f"{framework_short(f)} {b}" for f, b in zip(frameworks, backends_)]


def ttt_rows(runs: pd.DataFrame | None, status: pd.DataFrame | None) -> list[dict]:
    """One row per configuration (untuned runs and tuned re-runs) of the runs that ended
    for a reason of training: a diverged run is listed as not reached (censored), never
    dropped (analysis.columns.ttt_runs); the median is the analysis' censored median."""
    if runs is None or runs.empty:
        return []
    ok = runs
    if status is not None and len(status):
        done = set(status.loc[status["status"].isin(TRAINING_ENDS), "run_id"])
        ok = runs[runs["run_id"].isin(done)]
    ok = ttt_runs(ok).copy()
    ok["kind"] = ok["run_id"].map(run_kind)
    cand = ok["candidate"].fillna("").astype(str) if "candidate" in ok else ""
    ok = ok[(ok["kind"] == "rerun") | ((ok["kind"] == "") & (cand == ""))]
    if ok.empty:
        return []
    ok["config"] = ok["run_id"].map(config_id)
    rows = []
    order = ["partition", "backend", "batch_per_worker", "kind", "workers", "config"]
    for cfg_id, g in ok.sort_values(order + ["repeat"]).groupby("config", sort=False):
        reached = g["reached_target"].astype(bool) & g["time_to_target_s"].notna()
        times = [t if ok_ else math.inf for t, ok_ in zip(g["time_to_target_s"], reached)]
        lost = (g["status"] == "nan_loss") & ~reached
        each = [
            fmt.seconds(t) if math.isfinite(t) else (DIVERGED if d else CENSORED)
            for t, d in zip(times, lost)
        ]
        rows.append(
            {
                "config": cfg_id,
                "workers": int(g["workers"].iloc[0]),
                "global_batch": int(g["global_batch"].iloc[0]),
                "tuned": g["kind"].iloc[0] == "rerun",
                "reached": int(reached.sum()),
                "total": len(g),
                "diverged": int(lost.sum()),
                "median": censored_median(times)[0],
                "each": ", ".join(each),
            }
        )
    return rows


def ttt_table(d, runs, status, target: dict | None = None) -> None:
    """Every time to target per configuration; ``target`` (target.json) names the target."""
    rows = ttt_rows(runs, status)
    if not rows:
        d.p("No completed run has a time to target yet.")
        return
    cells = [
        [
            d.cell(x["config"]),
            str(x["workers"]),
            str(x["global_batch"]),
            _reached(x["reached"], x["total"], x["diverged"]),
            fmt.seconds(x["median"])
            if fmt.isnum(x["median"])
            else f"{'not reached' if x['diverged'] else CENSORED} (no median)",
            d.cell(x["each"]),
        ]
        for x in rows
    ]
    header = ["Configuration", "Workers", "Global", "Reached", "Median TTT (s)", "Each repeat (s)"]
    note = TTT_TABLE_NOTE.format(target=escape(target_words(target)))
    d.table(note, header, cells, [62, 13, 13, 14, 24, 54], align_right_from=1)


def factor_cells(x) -> list[str]:
    """A headline.csv row as a row of the factors table."""
    ttt = (
        with_interval(x.speedup_ttt, x.speedup_ttt_lo, x.speedup_ttt_hi)
        if fmt.isnum(x.speedup_ttt)
        else ("no median" if no_median(int(x.reached), int(x.total)) else fmt.MISSING)
    )
    epoch = (
        with_interval(x.epoch_speedup, x.epoch_lo, x.epoch_hi)
        if fmt.isnum(x.epoch_speedup)
        else fmt.MISSING
    )
    return [
        f"{x.partition} / {x.backend}",
        str(int(x.batch_per_worker)),
        str(int(x.workers)),
        str(int(x.global_batch)) if fmt.isnum(x.global_batch) else fmt.MISSING,
        "yes" if x.tuned else "no",
        ttt,
        epoch,
        fmt.speedup(x.epochs_ratio),
        fmt.speedup(x.fixed_factor),
        fmt.speedup(x.retained_fraction),
        f"{_reached(x.reached, x.total, getattr(x, 'diverged', 0))} | "
        f"{_reached(x.base_reached, x.base_total, getattr(x, 'base_diverged', 0))}",
        str(x.note or ""),
    ]


def batch_interval(lo, hi) -> str:
    """A B_simple interval: '[900–1,500]'; an open end as such: '[900–inf)' (a
    resample whose |G|^2 was not positive), '[0–1,500]'; '' without one."""
    try:
        lo, hi = float(lo), float(hi)
    except (TypeError, ValueError):
        return ""
    if math.isnan(lo) or math.isnan(hi):
        return ""
    right = "inf)" if math.isinf(hi) else f"{fmt.rate(hi)}]"
    return f"[{fmt.rate(lo) if lo > 0 else '0'}{fmt.EN_DASH}{right}"


def noise_sentence(x) -> str | None:
    """The critical batch size a configuration's gradient noise scale near the target
    predicts, with its 95 % interval over runs, against the measured epochs ratio and
    the critical batch that ratio implies under the same model; a global-batch limit is
    stated only where that implied critical batch lies inside the B_simple interval
    (analysis/noise_scale.agrees). None without an estimate."""
    if not fmt.isnum(x.b_simple) and not fmt.isnum(x.critical_batch):
        return None
    crit = float(x.critical_batch if fmt.isnum(x.critical_batch) else x.b_simple)
    b_1, b_n = int(x.batch_per_worker), int(x.global_batch)
    lo, hi = getattr(x, "b_simple_lo", math.nan), getattr(x, "b_simple_hi", math.nan)
    ci = batch_interval(lo, hi)
    head = (
        f"Batch {b_1} per worker, {workers_text(x.workers)} "
        f"({x.partition}, {x.backend}{', tuned' if x.tuned else ''}; global batch "
        f"{b_n}): B_simple = {fmt.rate(x.b_simple)}"
        + (f" {ci}" if ci else " (no interval; the note says why)")
    )
    p, m = x.predicted_epochs_ratio, x.epochs_ratio
    pred = (
        f"predicted epochs ratio {predicted_ratio_text(p, b_1, b_n, lo, hi)}"
        if fmt.isnum(p)
        else "no prediction"
    )
    if not fmt.isnum(m):
        return head + f"; {pred}, not measured (no median epochs to target)."
    implied = implied_critical_batch(b_1, b_n, float(m))
    if math.isinf(implied):
        at = "no critical batch below the global batch (no epoch cost)"
    elif implied == 0:
        at = "no critical batch at all (more epochs than a noise-free gradient needs)"
    else:
        at = f"a critical batch of about {fmt.rate(implied)}"
    text = f"{head}; {pred}, measured {fmt.speedup(m)}, which the same model gives for {at}"
    if agrees(lo, hi, implied):
        return text + (
            f", inside the interval: adding workers still pays at equal accuracy up to a "
            f"global batch of about {fmt.rate(crit)}."
        )
    if not ci:
        why = "with no interval to compare"
    elif not (lo > 0 and math.isfinite(hi)):
        why = "and the interval has an open end (it bounds the critical batch on one side only)"
    else:
        why = "outside the interval"
    return text + (
        f", {why}: the noise-scale estimate does not predict the epochs to target here, "
        "and no global-batch limit is read from it."
    )


def conclusion(x) -> str:
    """What follows from one row's numbers, in words (never more)."""
    ws = workers_text(x.workers)
    label = f"Batch {int(x.batch_per_worker)}, {ws} ({row_conditions(x)})"
    e, m = x.epoch_speedup, x.epochs_ratio
    if fmt.isnum(x.speedup_ttt):
        text = f"{label}: time to target {fmt.speedup(x.speedup_ttt)}x"
        if fmt.isnum(e) and fmt.isnum(m):
            text += f" = epoch time {fmt.speedup(e)}x (hardware) x epochs ratio {fmt.speedup(m)}"
            text += (
                f" (statistics: the larger global batch needs {1 / m:.2f}x the epochs of 1 worker)"
                if m < 1
                else " (statistics: no more epochs than 1 worker)"
            )
            f = x.fixed_factor
            if fmt.isnum(f):
                text += (
                    f" x {fmt.speedup(f)} (the rest: the warm-up epochs beyond a "
                    "steady-state epoch)"
                )
        if fmt.isnum(x.retained_fraction):
            text += f"; {survival_clause(x.retained_fraction, e, x.epoch_lo, x.epoch_hi)}"
        return text + "."
    if int(x.base_total) == 0 or int(x.total) == 0:  # no runs to compare: the note says why
        return f"{label}: {str(x.note or 'no runs on a side')}."
    base = fmt.counts(x.base_reached, x.base_total, getattr(x, "base_diverged", 0))
    if no_median(int(x.base_reached), int(x.base_total)):
        return (
            f"{label}: the 1-worker baseline has no median time to target ({base}), so no "
            "speedup at equal accuracy can be measured."
        )
    mine = fmt.counts(x.reached, x.total, getattr(x, "diverged", 0))
    if not fmt.isnum(e):
        return f"{label}: no median time to target ({mine})."
    lo, hi = getattr(x, "epoch_lo", math.nan), getattr(x, "epoch_hi", math.nan)
    ep = with_interval(e, lo, hi)
    way = fmt.direction(lo, hi)
    if way == "slower":
        return (
            f"{label}: no median time to target ({mine}), and the epoch is slower "
            f"({ep}): the hardware factor stops it."
        )
    div = int(getattr(x, "diverged", 0)) if fmt.isnum(getattr(x, "diverged", 0)) else 0
    if way == "faster" and div >= int(x.total) - int(x.reached):
        return (
            f"{label}: no median time to target ({mine}) although the epoch is faster "
            f"({ep}): the runs that did not reach it diverged (non-finite loss)."
        )
    if way == "faster":
        return (
            f"{label}: no median time to target ({mine}) although the epoch is faster "
            f"({ep}): the epochs-to-target factor (statistics) stops it."
        )
    return (
        f"{label}: no median time to target ({mine}); epoch time {ep}: the numbers do not "
        "say which factor stops it."
    )


def row_conditions(x) -> str:
    """'local, mpi, untuned' and the step setting where it is not fp32, eager: the
    conditions of a headline row, both sides (the baseline shares them)."""
    parts = [str(x.partition), str(x.backend)]
    setting = (getattr(x, "precision", "fp32"), getattr(x, "compile", "off"))
    if setting != DEFAULT_SETTING:
        parts.append(setting_label(*setting))
    parts.append("tuned" if x.tuned else "untuned")
    return ", ".join(parts)


def factors_part(d, headline: pd.DataFrame | None) -> None:
    """The factors table, the noise-scale sentences and the conclusions."""
    if headline is None:
        d.p("No headline table was given: the factors of the speedups are not shown.")
        return
    rows = with_framework(headline[headline["workers"] > 1]).sort_values(
        ["partition", "framework", "backend", "batch_per_worker", "workers", "tuned"]
    )
    if names_framework(rows["framework"]):  # name the framework with the backend
        rows = rows.assign(backend=framework_backend(rows["framework"], rows["backend"]))
    if rows.empty:
        d.p("No configuration with more than one worker in the headline table.")
        return
    cells = [factor_cells(x) for x in rows.itertuples()]
    notes: dict[str, int] = {}  # a row's note -> its number (a long note in a cell: a tall row)
    cells = [
        c[:-1] + [f"[{notes.setdefault(c[-1], len(notes) + 1)}]" if c[-1] else ""] for c in cells
    ]
    widths = [30, 9, 13, 11, 10, 24, 24, 12, 10, 14, 15, 10]
    caption = FACTOR_NOTE + (" Note [k]: the notes below the table." if notes else "")
    d.table(caption, FACTOR_HEADER, cells, widths, align_right_from=2)
    if notes:
        listed = "; ".join(f"[{k}] {text}" for text, k in notes.items())
        d.p(escape(f"Notes: {listed}."), "note")
    d.h2("Gradient noise scale and critical batch size")
    noise = [s for s in (noise_sentence(x) for x in rows.itertuples()) if s]
    if noise:
        d.p(
            escape(
                "The simple gradient noise scale B_simple = tr(Sigma)/|G|^2 (McCandlish et "
                "al. 2018, Appendix A), estimated during multi-worker training from the "
                "squared norms of each worker's local gradient and of the allreduced "
                "gradient, approximates the critical batch size: below it a larger batch "
                "needs hardly more epochs, above it the epochs to target grow with the batch "
                "(epochs proportional to 1 + B/B_crit). It is estimated near the target: "
                f"over each completed run's last {NEAR_TARGET_EPOCHS} non-warm-up epochs up "
                "to and including the epoch that reached the target (a run that never "
                f"reached it: its last {NEAR_TARGET_EPOCHS} non-warm-up epochs), pooling the "
                "runs' sums (a ratio of means). Batches are drawn without replacement from "
                "the N samples of an epoch, so both batch sizes' noise terms carry the "
                "finite-population factor (1 - B/N). Brackets: 95 % percentile bootstrap "
                "interval over the runs (the runs resampled, B_simple recomputed from "
                "their sums; none with fewer than 3 runs; inf: an open end). A limit on the "
                "global batch is stated only where the critical batch that the measured "
                "epochs ratio implies under the same model lies inside that interval."
            )
        )
        d.bullets([escape(s) for s in noise])
    else:
        d.p("No run recorded a gradient noise scale: no critical batch size is predicted.")
    d.h2("What follows from these numbers")
    d.bullets([escape(conclusion(x)) for x in rows.itertuples()])
