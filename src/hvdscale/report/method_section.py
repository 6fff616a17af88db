"""The report's method section ("How the times were measured"): how epoch time,
throughput, the phase split, the baseline and time to target are measured, and, for the
speedup at equal accuracy, the bootstrap method, the paired seeds, the validation split,
the target, the censoring rule, the tuned re-runs, the instrumentation sampling and its
measured overhead. Wording is neutral between the
backends (Horovod, PyTorch DDP): they share the records, the statistics and this text."""

from __future__ import annotations

from xml.sax.saxutils import escape

import pandas as pd

from hvdscale.analysis.columns import with_framework
from hvdscale.analysis.stats import CI_METHOD
from hvdscale.report import fmt
from hvdscale.report.context import ReportData, report_target
from hvdscale.report.doc import Doc
from hvdscale.report.frameworks_section import GPU_NOTE
from hvdscale.target import at_target_words, describe, target_metric, target_spec
from hvdscale.workload.base import VAL_LOSS, is_default, workload_for

OVERHEAD_COLUMN = "instrumentation_overhead"  # runs.csv: timing.instrumentation.overhead


def _target(cfg: dict | None, target: dict | None) -> str:
    if target is not None:
        return describe(target) + "; the target was fixed before the scaling runs"
    if not (cfg or {}).get("training", {}).get("target"):
        return "as configured (training.target)"
    return describe(target_spec(cfg)) + " (results/scaling/target.json not given to the report)"


def _workload_bullet(cfg: dict | None) -> list[str]:
    """The workload in words (its data, parameter count, loss and target metric), for
    every workload but the default stress-strain one."""
    if cfg is None or is_default(cfg):
        return []
    return [f"<b>Workload</b>: {escape(workload_for(cfg).describe(cfg))}."]


def _overhead(runs: pd.DataFrame | None) -> str:
    """The measured instrumentation overhead over the runs, where runs.csv has it."""
    if runs is None or OVERHEAD_COLUMN not in runs:
        return (
            "Its overhead is measured in every run (run record field "
            "timing.instrumentation.overhead: median time of an instrumented call / of an "
            "uninstrumented call - 1); this runs table does not carry it."
        )
    x = pd.to_numeric(runs[OVERHEAD_COLUMN], errors="coerce").dropna()
    if x.empty:
        return "Its overhead (timing.instrumentation.overhead) was not recorded by any run."
    return (
        "Its overhead, measured in every run (timing.instrumentation.overhead: median time of "
        "an instrumented call / of an uninstrumented call - 1), is "
        f"{fmt.percent(x.median())} (median over {len(x)} runs; range "
        f"{fmt.percent(x.min())} to {fmt.percent(x.max())}); the headline times do not carry it."
    )


def equal_accuracy_bullets(
    cfg: dict | None, target: dict | None, ci_method: str, runs: pd.DataFrame | None
) -> list[str]:
    """The method bullets (escaped markup) for intervals, seeds, split, target, censoring,
    tuning and instrumentation."""
    tr = (cfg or {}).get("training", {})
    data = (cfg or {}).get("data", {})
    tune = (cfg or {}).get("scaling", {}).get("tune") or {}
    k = tr.get("instrument_every", "k")
    val = data.get("val_fraction")
    val_text = f"{fmt.percent(val, 0)} of the train share" if fmt.isnum(val) else "a share"
    budget = f"training.max_epochs = {tr.get('max_epochs', tr.get('epochs', '?'))}"
    if fmt.isnum(tr.get("max_train_s")):
        budget += f", training.max_train_s = {fmt.seconds(tr['max_train_s'])} s"
    reruns = tune.get("rerun_repeats")
    metric = target_metric(target if target is not None else target_spec(cfg))
    reads = (
        "the validation loss only"
        if metric is VAL_LOSS
        else f"the validation split only (the {metric.name}; tuning ties: the validation loss)"
    )
    items = [
        f"<b>Intervals</b>: 95 % bootstrap confidence intervals ({escape(ci_method)}) "
        "of every speedup over repeats, resampling the 1-worker "
        "baseline's repeats too (Hoefler & Belli); fewer than 3 repeats on either side: no "
        "interval, and the text says so.",
        "<b>Seeds</b>: repeat r of every configuration draws its initial weights and its "
        "shuffle from a seed derived from (config seed, r); the 1-worker and n-worker runs of "
        "the same repeat share it (paired design), different repeats differ, so the intervals "
        "include training variability. The dataset never depends on it.",
        f"<b>Validation split</b>: {val_text}, decided per sample from (seed, sample id). "
        "The target, the time to target, the tuning selection and the early stop read "
        f"{reads}; the test loss is evaluated once, at the end of each run, "
        "reported and never used to choose anything.",
        f"<b>Target</b>: {escape(_target(cfg, target))}.",
        *_workload_bullet(cfg),
        f"<b>Censoring</b>: a run that reaches its budget ({escape(budget)}) before the "
        "target is censored: '&gt; budget', counted as +infinity, never dropped. A run whose "
        "loss diverges (non-finite) before the target is counted the same way, as not "
        "reached, and named as diverged; for such runs this median is not Kaplan-Meier's "
        "(which would let them reach the target later) but the larger one of a "
        "configuration that can diverge. A median time to target exists while fewer than "
        "half of the repeats did not reach it; every time to target comes with "
        "reached/total over every run that ended for a reason of training.",
        "<b>Start-up</b>: time to target is training time, start-up excluded: the "
        "interpreter and framework import, the framework's initialisation, reading the rank's "
        "data, building the model and the first compilation happen before the first epoch. "
        "The launch-to-target time includes it: rank 0 records each attempt's start-up from "
        "the launcher's start (hvdscale launch stamps it, HVDSCALE_LAUNCH_START) to the start "
        "of its epoch loop, and the launch-to-target time is that start-up plus the training "
        "time to the end of the target epoch; queue wait and the SLURM allocation are not "
        "included. Its speedup ('with start-up') is computed like the time-to-target speedup "
        "(censored medians, the same paired interval); a run without the launcher's stamp has "
        "no such figure.",
        "<b>Tuned figures</b>: the candidates of each tuning group are selected on validation "
        "time to target (ties: best validation loss); the winner is re-run with fresh seeds"
        + (f" ({reruns} re-runs, scaling.tune.rerun_repeats)" if reruns else "")
        + " and only these re-runs enter the tuned figures, never the selection runs.",
        "<b>Instrumentation</b>: headline times (epoch time, throughput, time to target) "
        "come from uninstrumented step calls; the phase split from every "
        f"{escape(str(k))}-th call (training.instrument_every). " + escape(_overhead(runs)),
        "<b>Mislabelled runs</b>: a run whose label proof fails (world size or collective "
        "not what its run id says) is excluded from every statistic and listed in the last "
        "section with the proof's reasons.",
    ]
    return items


def timing_bullets(warm, target: dict | None = None) -> list[str]:
    """The timing bullets; ``target`` (target.json) for the rule that a run reached it."""
    return [
        "<b>Epoch time</b>: rank 0's wall-clock time (time.perf_counter) of one epoch: the "
        "training step loop, the validation evaluation and the reduction of the epoch's metrics, "
        f"as recorded in each run's metrics.json. The first {warm} epoch(s) of every run are "
        "warm-up (graph tracing, caches, learning-rate warm-up) and are excluded from every "
        "timing statistic.",
        "<b>Throughput</b>: samples of all ranks per second of the step loop (evaluation "
        "excluded).",
        "<b>Phase split</b>: data loading, compute (forward and backward pass), gradient "
        "synchronisation (the backend's allreduce: Horovod or PyTorch DDP) and optimizer "
        "update, timed inside the compiled training step on instrumented steps, scaled to all "
        "steps and averaged over ranks. The "
        "<b>shares</b> (sync, data) are each phase's sum over the timed epochs divided by the "
        "sum of the four phases, i.e. shares of the training-step time; the rest of the epoch "
        "wall time (evaluation, launch overhead) is 'other'.",
        "<b>Per run</b>: the median over the run's timed epochs of the epoch time, the "
        "throughput and the per-step phase times.",
        "<b>Repeats</b>: every configuration is run several times; tables show the median over "
        "completed repeats and the min-max range in parentheses.",
        "<b>Baseline</b>: speedup S(n) = T(1)/T(n) divides the median epoch time of the 1-worker "
        "run of the same partition, framework, backend, per-worker batch size and learning-rate "
        "rule by "
        "that of n workers; efficiency E(n) = S(n)/n. A group without a completed 1-worker run "
        "has no speedup (flagged, not dropped). <b>Speedup per GPU</b> is the slope of a "
        "least-squares line through (n, S(n)), n = 1 included, as in the reference study.",
        "<b>Time to target</b>: training wall time from the start of training (warm-up "
        "epochs and validation evaluation included, start-up excluded: the launch-to-target "
        "time, 'with start-up', adds it) until the end of the "
        f"first epoch whose {at_target_words(target)}; its speedup S_ttt(n) "
        "uses the same baseline and splits into epoch-time speedup x ratio of epochs to "
        "target; a target met in the warm-up epoch is flagged (target too loose), not shown "
        "as a speedup (in no table and on no page). Epoch times come from completed runs; the "
        "time to target counts every run that ended for a reason of training: a run whose "
        "loss diverged (nan_loss) is counted as not reached, never dropped. Failed and "
        "mislabelled runs are excluded from the statistics and listed.",
    ]


def method_section(d: Doc, r: ReportData) -> None:
    d.section("How the times were measured")

    warm = r.cfg["training"]["warmup_epochs"] if r.cfg else "the configured"
    d.bullets(timing_bullets(warm, report_target(r)))
    d.bullets(equal_accuracy_bullets(r.cfg, getattr(r, "target", None), CI_METHOD, r.runs))
    runs = r.runs
    if runs is not None and len(runs) and (with_framework(runs)["framework"] == "torch-ddp").any():
        d.p(escape(GPU_NOTE))
    methods = sorted(set(runs["timing_method"].dropna())) if runs is not None and len(runs) else []
    for m in methods[:3]:
        d.p(f"<i>Timing method recorded by the runs:</i> {escape(m)}", "note")
