"""The report's "speedup at equal accuracy" section: the target (target.json or the
config) and how time to target is measured, the budget, every time to target with
reached/total ("> budget" for censored runs), the two factors of every time-to-target
speedup with the noise-scale prediction and the conclusions that follow from them
(report/equal_accuracy.py, from headline.csv; without it the speedups of summary.csv and
tuned.csv), the answer to the reference study's batch 75 -> 1000 question in one
generated sentence, and the figures of the registry's "accuracy" section."""

from __future__ import annotations

import re
from xml.sax.saxutils import escape

import pandas as pd

from hvdscale.analysis.columns import (
    names_framework,
    reference_framework,
    ttt_runs,
    with_framework,
)
from hvdscale.analysis.headline import TUNED_GAP
from hvdscale.analysis.like import DEFAULT_SETTING, LIKE_KEYS, TUNE_KEYS, plain, seed_ids
from hvdscale.analysis.references import references_of
from hvdscale.analysis.stats import censored_median, speedup_interval
from hvdscale.analysis.tuning import CANDIDATE_KEYS, candidate_runs, reruns_of
from hvdscale.analysis.view import pref_lr
from hvdscale.figures.registry import in_section
from hvdscale.report import fmt
from hvdscale.report.context import ReportData, report_target
from hvdscale.report.doc import Doc
from hvdscale.report.equal_accuracy import factors_part, framework_backend, ttt_table
from hvdscale.report.headline_text import with_interval
from hvdscale.target import (
    TOO_LOOSE,
    at_target_words,
    describe,
    target_metric,
    target_spec,
    target_words,
)
from hvdscale.workload.base import VAL_LOSS, Metric

TTT_NOTE = (
    "Time to target counts the training wall time from the start of training until the end "
    "of the first epoch whose {at_target}: warm-up epochs and "
    "the validation evaluation after every epoch are included, the start-up (launch, "
    "framework initialisation, data loading, graph compilation) is not. The launch-to-target "
    "time ('with start-up' on the first page) adds it: each attempt's start-up, from the "
    "launcher's start (hvdscale launch) to its first epoch, plus the training time to the end "
    "of the target epoch; queue wait and the SLURM allocation are not included. A run that "
    "reaches "
    "its budget first is censored: shown as '> budget'; one whose loss diverges "
    "(non-finite) first is shown as 'diverged'; both count as +infinity (not reached), "
    "never dropped."
)
TABLE_NOTE = (
    "Speedup at equal accuracy. Epoch S: speedup of the median epoch time; TTT S: speedup "
    "of the time to {target}; untuned: the LR rule as configured "
    "(against the 1-worker runs of its group); tuned: the re-runs of the best candidate of "
    "the re-tuning sweep at this worker count against the re-runs of the best 1-worker "
    "candidate (tuned against tuned). Brackets: 95 % bootstrap interval over repeats, "
    "resampling the baseline's repeats too; an open end ('inf)') where a resampled median "
    "was censored; n: completed repeats (untuned/tuned). No interval with fewer than 3 "
    "repeats."
)
HEADER = [
    "Partition",
    "Backend",
    "Batch",
    "Workers",
    "Epoch S [95 % CI]",
    "TTT S untuned [95 % CI]",
    "TTT S tuned [95 % CI]",
    "Tuned candidate",
    "n",
    "Note",
]


def short_note(note: str) -> str:
    """A ci_note, shortened for a table cell."""
    m = re.search(
        r"fewer than (\d+) (.+?) \(this configuration (\d+), 1-worker baseline (\d+)\)", note
    )
    if m:
        what = "runs reaching target" if "target" in m.group(2) else "repeats"
        return f"no CI: {m.group(3)} {what}, baseline {m.group(4)} (< {m.group(1)})"
    return note.replace("no interval: ", "no CI: ")


def with_ci(x, lo, hi) -> str:
    """'1.85 [1.71-1.98]', '1.85 [0.80, inf)' with an open end; just the value without
    an interval (fmt.interval)."""
    if not fmt.isnum(x):
        return fmt.MISSING
    ci = fmt.interval(lo, hi)
    return f"{fmt.speedup(x)} {ci}" if ci else fmt.speedup(x)


def tuned_table(r: ReportData) -> pd.DataFrame:
    """tuned.csv (written by aggregate_runs after the winners' re-runs); empty without it."""
    if getattr(r, "tuned", None) is not None:
        return r.tuned
    return pd.DataFrame(columns=TUNE_KEYS)


def _untuned(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (partition, backend, batch) the preferred LR rule's rows."""
    if summary is None or summary.empty:
        return pd.DataFrame(columns=list(summary.columns) if summary is not None else [])
    keep = []
    summary = with_framework(summary)
    for _, g in summary.groupby([*LIKE_KEYS, "batch_per_worker"]):
        keep.append(g[g["lr_rule"] == pref_lr(g["lr_rule"])])
    return pd.concat(keep, ignore_index=True)


def equal_accuracy_rows(summary: pd.DataFrame, tuned: pd.DataFrame) -> list[dict]:
    """One row per (partition, backend, batch, workers) of the untuned study or the sweep."""
    u = _untuned(summary)
    u_by = {tuple(x[k] for k in TUNE_KEYS): x for _, x in u.iterrows()}
    t_by = {tuple(x[k] for k in TUNE_KEYS): x for _, x in tuned.iterrows()} if len(tuned) else {}
    rows = []
    for key in sorted(set(u_by) | set(t_by)):
        x, t = u_by.get(key), t_by.get(key)
        notes = []
        row = dict(zip(TUNE_KEYS, key))
        if x is not None:
            row["lr_rule"] = x["lr_rule"]
            row["epoch"] = with_ci(x["speedup"], x["speedup_lo"], x["speedup_hi"])
            row["untuned"] = with_ci(x["speedup_ttt"], x["speedup_ttt_lo"], x["speedup_ttt_hi"])
            row["n_untuned"] = int(x["n_completed"])
            if x["target_too_loose"]:
                notes.append(TOO_LOOSE)
            elif int(x["n_completed"]) and not int(x["n_reached_target"]):
                why = fmt.not_reached(0, x["n_ttt_total"], x.get("n_nan_loss", 0))
                notes.append(f"untuned: target not reached ({why or 'no run'})")
            elif x["ci_note"]:
                notes.append("untuned: " + short_note(x["ci_note"]))
        else:
            row.update(lr_rule="", epoch=fmt.MISSING, untuned=fmt.MISSING, n_untuned=0)
        if t is not None:
            row["tuned"] = with_ci(t["speedup_ttt"], t["speedup_ttt_lo"], t["speedup_ttt_hi"])
            row["candidate"] = (
                f"{t['lr_rule']} x{t['lr_multiplier']:g}, warm-up {int(t['warmup_epochs'])}"
                if t["status"] != "all_failed"
                else "all failed"
            )
            row["n_tuned"] = int(t["n_repeats"]) if fmt.isnum(t["n_repeats"]) else 0
            if t["status"] == "none_reached":
                notes.append("tuned: no candidate reached the target within the budget")
            elif t["ci_note"] and t["ci_note"] != TOO_LOOSE:
                notes.append("tuned: " + short_note(t["ci_note"]))
            elif t["ci_note"] == TOO_LOOSE:
                notes.append("tuned: " + TOO_LOOSE)
        else:
            row.update(tuned=fmt.MISSING, candidate="not in the sweep", n_tuned=0)
        row["note"] = "; ".join(dict.fromkeys(notes))
        rows.append(row)
    return rows


def _pick_pair(summary: pd.DataFrame, b0: int, b1: int):
    """(partition, backend, workers, rows by batch) of the untuned fp32/eager configurations
    holding both batches: the most workers at which batch b0 reached its target (else the
    most workers); None where no such pair exists."""
    u = _untuned(summary)
    u = u[(u["precision"] == DEFAULT_SETTING[0]) & (u["compile"] == DEFAULT_SETTING[1])]
    u = u[u["epoch_time_s"].notna()]
    best = None
    for (part, be, w), g in u.groupby(["partition", "backend", "workers"]):
        bt = g.set_index("batch_per_worker")
        if b0 in bt.index and b1 in bt.index:
            k = (not fmt.isnum(bt.at[b0, "time_to_target_s"]), -int(w), part, be)
            if best is None or k < best[0]:
                best = (k, part, be, int(w), bt)
    return None if best is None else best[1:]


def _side_runs(runs: pd.DataFrame | None, where: dict, tuned_row=None) -> pd.DataFrame:
    """The runs of one side of the batch question: the untuned scaling runs of ``where``
    (partition, backend, workers, batch_per_worker, lr_rule; fp32, eager, the default
    framework) or, with ``tuned_row`` (a row of tuned.csv), its re-runs; every run that
    ended for a reason of training (a diverged one not reached)."""
    if runs is None or runs.empty:
        return pd.DataFrame(columns=["time_to_target_s", "epoch_time_s", "repeat", "kind"])
    if tuned_row is not None:
        row = with_framework(pd.DataFrame([tuned_row]))
        if any(k not in row for k in CANDIDATE_KEYS):
            return pd.DataFrame(columns=["time_to_target_s", "epoch_time_s", "repeat", "kind"])
        return reruns_of(ttt_runs(candidate_runs(runs, "rerun")), next(row.itertuples(index=False)))
    r = ttt_runs(reference_framework(plain(runs)))
    keep = (r["precision"] == DEFAULT_SETTING[0]) & (r["compile"] == DEFAULT_SETTING[1])
    for k, v in where.items():
        keep &= r[k] == v
    return r[keep]


def _ratio(base: pd.DataFrame, other: pd.DataFrame, column: str, name: str, medians) -> str:
    """'2.29x [2.20-2.38], faster': median(base)/median(other) of ``column`` with its 95 %
    interval over the runs (paired where both share seeds) and only the word the
    interval supports ('the interval holds 1', 'no interval: ...'). Without the runs
    (no runs table): the ratio of ``medians`` (base, other), no interval, no word."""
    if base.empty or other.empty:
        ratio = float(medians[0]) / float(medians[1])
        return f"{fmt.speedup(ratio)}x, no interval (no runs table)"
    ratio = censored_median(base[column].tolist())[0] / censored_median(other[column].tolist())[0]
    if not fmt.isnum(ratio):
        return "no ratio (no median on a side)"
    lo, hi, note = speedup_interval(
        base[column], other[column], name,
        base_repeats=seed_ids(base), repeats=seed_ids(other),
    )  # fmt: skip
    word = fmt.direction(lo, hi)
    if not word:
        word = "the interval holds 1" if fmt.has_interval(lo, hi) else (note or "no interval")
    return f"{with_interval(ratio, lo, hi)}, {word}"


def _tuned_answer(x, b0: int, b1: int, base: pd.DataFrame, runs, ttt0: float) -> str:
    """The time-to-target clause of the batch question against tuned batch ``b1`` (``x``:
    its row of tuned.csv), untuned batch ``b0`` (``base``: its runs) on the other side."""
    if x["status"] == "none_reached":
        return (
            f", no re-tuning candidate at batch {b1} reached it within the budget: "
            "those runs are censored (see the factors below for which factor stops them)."
        )
    if x["status"] != "selected":
        return f", batch {b1} after re-tuning: {TUNED_GAP.get(str(x['status']), x['status'])}."
    n = int(x["n_repeats"]) if fmt.isnum(x["n_repeats"]) else 0
    head = (
        f", tuned batch {b1} (LR {x['lr_rule']} x{float(x['lr_multiplier']):g}, warm-up "
        f"{int(x['warmup_epochs'])}; median of its {n} re-run{'s' if n != 1 else ''} with "
        "fresh seeds)"
    )
    if not fmt.isnum(x["time_to_target_s"]):
        return head + ": half or more of them did not reach it (no median)."
    mine = _side_runs(runs, {}, x)
    ratio = _ratio(
        base, mine, "time_to_target_s", f"batch-question/{b0}/{b1}/tuned",
        (ttt0, x["time_to_target_s"]),
    )  # fmt: skip
    return (
        f"{head} {fmt.seconds(x['time_to_target_s'])} s: time-to-target speedup of tuned "
        f"batch {b1} over untuned batch {b0} {ratio}."
    )


def batch_question(
    summary: pd.DataFrame,
    tuned: pd.DataFrame | None,
    ref: dict | None,
    runs: pd.DataFrame | None = None,
    target_json: dict | None = None,
) -> str | None:
    """One sentence answering the reference study's question, from the tables: the
    epoch-time speedup from batch b0 to b1 per worker (same partition, backend, workers,
    LR rule as configured, fp32 and eager; both untuned) and, at the study's target, the
    time-to-target speedup of batch b1 after re-tuning (the selected candidate's re-runs,
    tuned.csv; never the selection runs) over untuned batch b0, else of untuned b1. Each
    ratio with its 95 % interval over the runs of ``runs`` (runs.csv) and a direction word
    only where the interval supports it. ``ref``: the config's
    references.batch_epoch_speedup (value, batch_from, batch_to); None: no question.
    ``target_json``: the study's target (target.json), for its metric's name."""
    summary, tuned = reference_framework(summary), reference_framework(tuned)  # Horovod's
    if summary is None or summary.empty or not ref:
        return None
    b0, b1 = ref["batch_from"], ref["batch_to"]
    pick = _pick_pair(summary, b0, b1)
    if pick is None:
        return None
    part, be, w, bt = pick
    x0, x1 = bt.loc[b0], bt.loc[b1]
    where = dict(partition=part, backend=be, workers=w)
    r0 = _side_runs(runs, {**where, "batch_per_worker": b0, "lr_rule": x0["lr_rule"]})
    r1 = _side_runs(runs, {**where, "batch_per_worker": b1, "lr_rule": x1["lr_rule"]})
    ws = f"{w} worker{'s' if w > 1 else ''}"
    epoch = _ratio(
        r0, r1, "epoch_time_s", f"batch-question/{b0}/{b1}/epoch",
        (x0["epoch_time_s"], x1["epoch_time_s"]),
    )  # fmt: skip
    text = (
        f"Batch {b0} -> {b1} per worker ({part}, {be}, {ws}, both untuned, LR "
        f"{x0['lr_rule']}): epoch-time speedup {epoch} (reference study: {ref['value']:.0f}x)"
    )
    target, ttt0 = x0["target_test_loss"], x0["time_to_target_s"]
    if not (fmt.isnum(target) and fmt.isnum(ttt0)):
        return text + f"; untuned batch {b0} did not reach the target, so no time-to-target answer."
    text += (
        f"; to the target {target_metric(target_json).name} {fmt.loss(target)}, untuned "
        f"batch {b0} takes {fmt.seconds(ttt0)} s (median)"
    )
    sel = pd.DataFrame()
    if tuned is not None and len(tuned):
        t = with_framework(tuned)
        sel = t[
            (t["partition"] == part) & (t["backend"] == be) & (t["workers"] == w)
            & (t["batch_per_worker"] == b1) & (t["precision"] == DEFAULT_SETTING[0])
            & (t["compile"] == DEFAULT_SETTING[1])
        ]  # fmt: skip
    if len(sel):
        return text + _tuned_answer(sel.iloc[0], b0, b1, r0, runs, ttt0)
    if fmt.isnum(x1["time_to_target_s"]):
        ratio = _ratio(
            r0, r1, "time_to_target_s", f"batch-question/{b0}/{b1}/untuned",
            (ttt0, x1["time_to_target_s"]),
        )  # fmt: skip
        return text + (
            f", untuned batch {b1} (no re-tuning sweep there) {fmt.seconds(x1['time_to_target_s'])}"
            f" s: time-to-target speedup of batch {b1} over batch {b0}, both untuned, {ratio}."
        )
    why = fmt.counts(x1["n_reached_target"], x1["n_ttt_total"], x1.get("n_nan_loss", 0))
    return text + f", untuned batch {b1} has no median time to target ({why})."


def other_target_runs(runs: pd.DataFrame | None, target: dict | None) -> list[str]:
    """Run ids whose record trained against another target value than target.json (a
    run of an earlier calibration, kept by Snakemake): listed, never silently mixed."""
    if runs is None or runs.empty or not target or "target_val_loss" not in runs:
        return []
    value = float(target["value"])
    v = pd.to_numeric(runs["target_val_loss"], errors="coerce")
    other = v.notna() & ((v - value).abs() > 1e-9 * max(abs(value), 1e-12))
    if "kind" in runs:
        other &= runs["kind"].fillna("").astype(str) != "cal"  # calibration runs set it
    return sorted(runs.loc[other, "run_id"].astype(str))


def _target_text(r: ReportData) -> str:
    target = getattr(r, "target", None)
    if target is not None:
        text = f"Target: {describe(target)} (results/scaling/target.json). "
        other = other_target_runs(r.runs, target)
        if other:
            text += (
                f"{len(other)} run(s) trained against another target value than this one "
                f"(an earlier target.json): {', '.join(other[:6])}"
                f"{', ...' if len(other) > 6 else ''}; retrain them (delete their records). "
            )
        return text
    return f"Target: {describe(target_spec(r.cfg))} (from the config). "


def _budget_text(cfg: dict, metric: Metric = VAL_LOSS) -> str:
    tr, data = cfg["training"], cfg["data"]
    epochs = tr.get("max_epochs", tr.get("epochs"))
    n_train = int(data["n_samples"] * data["train_fraction"])
    cap = tr.get("max_train_s")
    text = (
        f"Budget: every run, tuning candidates included, trains until its {metric.name} "
        f"reaches the target or at most {epochs} epochs over the same train split (about "
        f"{n_train:,} samples)"
        + (f" or {fmt.seconds(cap)} s of training" if fmt.isnum(cap) else "")
        + ", whatever its batch size."
    )
    tune = cfg["scaling"].get("tune")
    if tune:
        n = len(tune["lr_rules"]) * len(tune["lr_multipliers"]) * len(tune["warmup_epochs"])
        reruns = tune.get("rerun_repeats")
        text += (
            f" Re-tuning sweep: {n} candidates per worker count and batch (LR rules "
            f"{', '.join(tune['lr_rules'])}; LR multipliers "
            f"{', '.join(f'{m:g}' for m in tune['lr_multipliers'])}; warm-up epochs "
            f"{', '.join(str(w) for w in tune['warmup_epochs'])}), {tune['repeats']} "
            f"selection run{'s' if tune['repeats'] > 1 else ''} each"
            + (f"; the winner re-run with {reruns} fresh seeds." if reruns else ".")
        )
    return text


def accuracy_section(d: Doc, r: ReportData) -> None:
    d.section("Speedup at equal accuracy")
    target = report_target(r)
    d.p(escape(_target_text(r) + TTT_NOTE.format(at_target=at_target_words(target))))
    summary = r.summary
    if r.cfg is not None:
        d.p(escape(_budget_text(r.cfg, target_metric(target))))
    if summary is not None and not summary.empty and summary["target_too_loose"].any():
        n = int(summary["target_too_loose"].sum())
        d.p(
            escape(
                f"{n} configuration{'s' if n > 1 else ''} met the target in the warm-up "
                f"epoch (or the baseline did): {TOO_LOOSE}; no time-to-target speedup is "
                "shown for them."
            )
        )
    ttt_table(d, r.runs, r.status, target)
    headline = getattr(r, "headline", None)
    if headline is not None:
        factors_part(d, headline)
    else:
        _summary_table(d, r)
    ref = references_of(r.cfg)["batch_epoch_speedup"]
    sentence = batch_question(summary, tuned_table(r), ref, r.runs, target)
    if sentence:
        d.p(escape(sentence))
    for fig in in_section("accuracy", r.cfg):
        r.figure(d, fig.name)


def _summary_table(d: Doc, r: ReportData) -> None:
    """Without headline.csv: the speedups of summary.csv and tuned.csv."""
    rows = equal_accuracy_rows(r.summary, tuned_table(r))
    if not rows:
        return
    multi = names_framework(x["framework"] for x in rows)
    cells = [
        [
            x["partition"],
            framework_backend([x["framework"]], [x["backend"]])[0] if multi else x["backend"],
            str(int(x["batch_per_worker"])),
            str(int(x["workers"])),
            x["epoch"],
            x["untuned"],
            x["tuned"],
            d.cell(x["candidate"]),
            f"{x['n_untuned']}/{x['n_tuned']}",
            d.cell(x["note"]),
        ]
        for x in rows
    ]
    widths = [13, 13, 10, 12, 23, 24, 24, 24, 7, 30]
    note = TABLE_NOTE.format(target=escape(target_words(report_target(r))))
    d.table(note, HEADER, cells, widths, align_right_from=2)
    if not (r.cfg and r.cfg["scaling"].get("tune")):
        d.p(
            escape(
                "This study has no learning-rate re-tuning sweep (config scaling.tune): the "
                "tuned columns are empty."
            )
        )
