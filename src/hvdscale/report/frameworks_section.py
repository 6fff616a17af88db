"""The report's "Horovod vs DDP" section (issue 19), only where the run records hold both
frameworks: their epoch-time and time-to-target speedups side by side (each against the
1-worker runs of its own framework, with 95 % bootstrap intervals), the ratio of their
epoch times, the groups without a 1-worker baseline (said, not dropped), and the
synchronisation per framework with the definitions that tell its measures apart."""

from __future__ import annotations

from xml.sax.saxutils import escape

import pandas as pd

from hvdscale.analysis.columns import framework_label, framework_short
from hvdscale.analysis.frameworks import (
    at_best,
    best_settings,
    compared,
    missing_baselines,
    speedup_rows,
    sync_rows,
)
from hvdscale.report import fmt
from hvdscale.report.accuracy_section import with_ci
from hvdscale.report.context import ReportData, report_target
from hvdscale.report.doc import Doc
from hvdscale.target import target_words

GPU_NOTE = (
    "The GPU (NCCL) path of PyTorch DDP is not measured in multi-GPU form here: NCCL "
    "cannot put two ranks on one GPU and the GPU machine at hand has one GPU, so every "
    "DDP speedup in this report is a CPU (Gloo) speedup."
)
INTRO = (
    "Both frameworks train the same network on the same shards, rows per rank, seeds per "
    "repeat, learning-rate rules and target, and their records go through the same "
    "statistics. Every speedup is against the 1-worker runs of its own framework (same "
    "partition, backend, per-worker batch and LR rule): never Horovod against DDP."
)
BEST_NOTE = (
    "Where a framework ran several step settings (precisions, compile modes) at a "
    "partition, backend and batch, this section compares it at its best: the setting "
    "whose 1-worker runs have the shortest median epoch time. The section 'Precision and "
    "compilation' compares the settings themselves."
)
SPEEDUP_NOTE = (
    "Speedups side by side: epoch S and TTT S (time to {target}) of each "
    "framework against its own 1-worker baseline, medians over completed repeats with 95 % "
    "bootstrap intervals over repeats [lo-hi] that resample the baseline's repeats too; "
    "'no baseline': the framework has no completed 1-worker run in this group; 'not "
    "measured': no run of the framework here. {a}/{b} epoch time: the median epoch time of "
    "{a} divided by that of {b} at the same configuration (above 1: {b} is faster), with "
    "its 95 % interval (repeats paired: the seeds do not depend on the framework). "
    "{a}: {la}; {b}: {lb}."
)
SYNC_NOTE = (
    "Gradient synchronisation per step (ms), medians over completed repeats of every "
    "multi-worker configuration (all LR rules): step, the step time; sync phase, the phase "
    "split's sync phase; allreduce, hook, exposed and no-comm step from the run record's "
    "timing.sync (definitions above); '-': not measured by these records."
)


def _definitions(a: str, b: str) -> list[str]:
    return [
        f"<b>{a}</b>: the gradient allreduce runs after the backward pass and is not "
        "overlapped with it. The sync phase of the phase split is this allreduce; the "
        "record's <i>allreduce</i> (timing.sync.allreduce_s) is the same time, and all of it "
        "is <i>exposed</i> (exposed_s = allreduce_s).",
        f"<b>{b}</b>: DDP allreduces gradient buckets while the backward pass still runs "
        "(overlap). <i>Hook</i> (comm_hook_s) is the time per step spent inside DDP's "
        "communication hook, summed over buckets: it overlaps the backward pass, so it is not "
        "a part of the step time. <i>Exposed</i> (exposed_s) is what the step pays for "
        "synchronisation: the median step time minus the median time of the same step "
        "without communication (<i>no-comm step</i>, DDP's no_sync). <i>Allreduce</i> "
        "(allreduce_s) is a separate allreduce of the gradients in instrumented steps (the "
        "Horovod definition), a like-for-like measure of the collective, not what a DDP "
        "step pays.",
        "Compare the frameworks' cost of synchronisation by <i>exposed</i>; compare their "
        "collectives by <i>allreduce</i>.",
    ]


def _side_cells(x: dict, speedup: str) -> str:
    if not x.get("measured"):
        return "not measured"
    if not x["has_baseline"]:
        return "no baseline"
    if speedup == "speedup_ttt" and x["target_too_loose"]:
        return "too loose"
    return with_ci(x[speedup], x[f"{speedup}_lo"], x[f"{speedup}_hi"])


def _speedup_table(d: Doc, r: ReportData, pair: tuple[str, str]) -> None:
    a, b = (framework_short(f) for f in pair)
    rows = speedup_rows(r.summary, r.runs, pair)
    if not rows:
        d.p("No configuration of either framework has a completed run.")
        return
    cells = []
    for x in rows:
        ha, hb = x["sides"]
        cells.append(
            [
                x["partition"],
                x["backend"],
                str(int(x["batch_per_worker"])),
                x["lr_rule"],
                str(x["workers"]),
                d.cell(_side_cells(ha, "speedup")),
                d.cell(_side_cells(hb, "speedup")),
                d.cell(_side_cells(ha, "speedup_ttt")),
                d.cell(_side_cells(hb, "speedup_ttt")),
                d.cell(with_ci(x["ratio"], x["ratio_lo"], x["ratio_hi"])),
            ]
        )
    header = ["Partition", "Backend", "Batch", "LR", "Workers"]
    header += [f"Epoch S {a}", f"Epoch S {b}", f"TTT S {a}", f"TTT S {b}"]
    header += [f"{a}/{b} epoch time"]
    widths = [15, 13, 10, 10, 12, 24, 24, 24, 24, 24]
    la, lb = (framework_label(f) for f in pair)
    goal = escape(target_words(report_target(r)))
    note = SPEEDUP_NOTE.format(a=a, b=b, la=la, lb=lb, target=goal)
    d.table(note, header, cells, widths, align_right_from=2)


def _baseline_text(summary: pd.DataFrame) -> str | None:
    gaps = missing_baselines(summary)
    if not gaps:
        return None
    items = [
        f"{framework_label(g['framework'])} {g['partition']}/{g['backend']}, batch "
        f"{int(g['batch_per_worker'])}, LR {g['lr_rule']} (baseline {g['baseline_status']})"
        for g in gaps
    ]
    return (
        "No completed 1-worker baseline, so no speedup (the runs are kept in every table): "
        + "; ".join(items)
        + "."
    )


def _sync_table(d: Doc, runs: pd.DataFrame) -> None:
    s = sync_rows(runs)
    if s.empty:
        d.p("No multi-worker run of either framework has completed: no synchronisation.")
        return
    cols = ["step_time_s", "sync_step_s", "sync_allreduce_s", "sync_comm_hook_s"]
    cols += ["sync_exposed_s", "sync_no_comm_step_s"]
    cells = [
        [
            f"{x['partition']}/{x['backend']}",
            str(int(x["batch_per_worker"])),
            str(int(x["workers"])),
            framework_label(x["framework"]),
            *(fmt.millis(x.get(c)) for c in cols),
            str(int(x["n"])),
        ]
        for _, x in s.iterrows()
    ]
    header = ["Partition/backend", "Batch", "Workers", "Framework", "Step", "Sync phase"]
    header += ["Allreduce", "Hook", "Exposed", "No-comm step", "n"]
    widths = [24, 11, 13, 22, 15, 17, 17, 14, 16, 20, 8]
    d.table(SYNC_NOTE, header, cells, widths, align_right_from=4)


#: how each framework's step runs for training.compile (issue 32)
COMPILE_WORDS = {
    ("horovod-tf", "off"): "tf.function steps, XLA off",
    ("horovod-tf", "default"): "tf.function steps, XLA for the forward and backward pass",
    ("horovod-tf", "max"): "tf.function steps, XLA for the forward and backward pass",
    ("torch-ddp", "off"): "eager PyTorch",
    ("torch-ddp", "default"): "torch.compile (default mode)",
    ("torch-ddp", "max"): "torch.compile (max-autotune-no-cudagraphs on a CPU, "
    "reduce-overhead on a GPU)",
}


def settings_text(runs: pd.DataFrame, pair: tuple[str, str]) -> str:
    """Which step settings (training.precision, training.compile) each framework's runs
    had, and a warning when the two differ (issue 32: each framework at its best, and the
    reader told which best)."""
    parts, kinds = [], []
    for fw in pair:
        mine = runs[runs["framework"] == fw]
        pairs = sorted(
            set(zip(mine["precision"].fillna("fp32"), mine["compile"].fillna("off"), strict=True))
        )
        kinds.append(pairs)
        words = "; ".join(f"{p}, {COMPILE_WORDS.get((fw, c), 'compile ' + c)}" for p, c in pairs)
        parts.append(f"{framework_label(fw)}: {words or 'no runs'}")
    text = "Step settings of the runs (training.precision, training.compile): " + "; ".join(parts)
    if {p for p, _ in kinds[0]} != {p for p, _ in kinds[1]}:
        text += (
            ". The frameworks ran in different precisions: their epoch times compare the "
            "settings as much as the frameworks"
        )
    return text + "."


def frameworks_section(d: Doc, r: ReportData) -> None:
    """The section, where the records hold Horovod-TF and another framework; else none."""
    pair = compared(r.runs)
    if pair is None:
        return
    a, b = (framework_label(f) for f in pair)
    d.section("Horovod vs DDP" if pair[1] == "torch-ddp" else f"{a} vs {b}")
    d.p(escape(INTRO))
    best = best_settings(r.runs)
    d.p(escape(settings_text(at_best(r.runs, best), pair)))
    if (best["n_settings"] > 1).any():
        d.p(escape(BEST_NOTE))
    _speedup_table(d, r, pair)
    text = _baseline_text(r.summary)
    if text:
        d.p(escape(text))
    d.h2("Gradient synchronisation per framework")
    d.bullets(_definitions(a, b))
    _sync_table(d, r.runs)
    d.p(escape(GPU_NOTE))
