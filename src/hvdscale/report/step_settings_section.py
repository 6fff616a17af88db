"""The report's "Precision and compilation" section (issue 32), only where some
configuration was measured in more than one step setting (training.precision,
training.compile): per setting its speedups against the 1-worker runs of its own setting,
its epoch time and epochs to the target against the reference setting's (with 95 %
bootstrap intervals), the phase split and the warm-up that compiled the step; what each
setting means per framework; the settings without a 1-worker baseline (said, not
dropped). The rows: analysis/step_settings.py."""

from __future__ import annotations

from xml.sax.saxutils import escape

from hvdscale.analysis.columns import framework_label
from hvdscale.analysis.step_settings import (
    SHARES,
    missing_baselines,
    setting_name,
    setting_rows,
)
from hvdscale.report import fmt
from hvdscale.report.accuracy_section import with_ci
from hvdscale.report.context import ReportData
from hvdscale.report.doc import Doc

INTRO = (
    "The step settings (training.precision, training.compile) are axes of the scaling "
    "matrix like backends and frameworks. Each setting is measured against the 1-worker "
    "runs of its own setting (same partition, framework, backend, per-worker batch and LR "
    "rule), never against another setting's. Between the settings of one configuration the "
    "table compares epoch time and epochs to the target with the reference setting "
    "(fp32/off where measured): a lower precision may run an epoch faster and need more "
    "epochs to reach the target, so the time to the target decides."
)
TABLE_NOTE = (
    "Step settings side by side (precision/compile), per configuration (partition, "
    "framework, backend, per-worker batch, LR rule, workers) measured in more than one "
    "setting; medians over completed repeats (n). Epoch S and TTT S: the speedups of "
    "summary.csv against the 1-worker runs of the same setting with 95 % bootstrap "
    "intervals [lo-hi] ('no baseline': that setting has no completed 1-worker run; 'too "
    "loose': the target is met in the first epoch or an LR warm-up epoch). Epochs: median "
    "epochs to the target (a run that did not reach it counts as not reached) with "
    "reached/runs. Time "
    "ratio: this setting's median epoch time / the reference's (below 1: faster); epochs "
    "ratio: its median epochs to the target / the reference's (above 1: more epochs); "
    "both with 95 % intervals over repeats (paired: the seeds do not depend on the "
    "setting). C/S/D: the phase split's compute, sync and data shares of a step in %. "
    "Warm-up: median seconds before the first epoch that trace and compile the step "
    "(timing.warm_up_s; not in the epoch times; '-': not recorded)."
)
#: what training.compile means per framework (the trainers: horovod_tf/step.py,
#: torch_ddp/speed.py)
COMPILE_NOTES = {
    "horovod-tf": (
        "<b>Horovod-TF</b>: the steps run in a tf.function (training.steps_per_execution "
        "steps per call); compile <i>off</i>: without XLA; <i>default</i> and <i>max</i>: "
        "the forward and backward pass XLA-compiled (jit_compile), the same for both."
    ),
    "torch-ddp": (
        "<b>PyTorch DDP</b>: compile <i>off</i>: eager; <i>default</i>: torch.compile in "
        "its default mode; <i>max</i>: torch.compile mode max-autotune-no-cudagraphs on a "
        "CPU, reduce-overhead (CUDA graphs) on a GPU. DDP wraps the compiled network."
    ),
}
PRECISION_NOTES = {
    "fp32": "<i>fp32</i>: float32 throughout (TF32 matrix multiplies off on a GPU)",
    "tf32": "<i>tf32</i>: float32 tensors with TF32 matrix multiplies (GPUs of compute "
    "capability 8.0 and later)",
    "bf16": "<i>bf16</i>: mixed precision, the network computes in bfloat16 (Keras policy "
    "mixed_bfloat16; torch.autocast) with float32 master weights and optimizer state, no "
    "loss scaling",
    "fp16": "<i>fp16</i>: mixed precision in float16 with float32 master weights and "
    "dynamic loss scaling (Keras LossScaleOptimizer; torch.amp.GradScaler); GPUs only",
}


def _speedup_cell(st: dict, what: str) -> str:
    if not st.get("in_summary"):
        return fmt.MISSING
    if not st["has_baseline"]:
        return "no baseline"
    if what == "speedup_ttt" and st["target_too_loose"]:
        return "too loose"
    return with_ci(st[what], st[f"{what}_lo"], st[f"{what}_hi"])


def _ratio_cell(st: dict, what: str) -> str:
    if st["reference"]:
        return "reference"
    return with_ci(st[what], st[f"{what}_lo"], st[f"{what}_hi"])


def _epochs_cell(st: dict) -> str:
    return f"{fmt.seconds(st['epochs_to_target'])} ({st['n_reached']}/{st['n_ttt']})"


def _shares_cell(st: dict) -> str:
    parts = [f"{100 * st[c]:.0f}" if fmt.isnum(st[c]) else fmt.MISSING for c in SHARES]
    return "/".join(parts)


def group_title(x: dict) -> str:
    """'local, Horovod-TF, gloo, batch 75, LR none, 2 workers (reference fp32/off)'."""
    workers = f"{x['workers']} worker" + ("s" if x["workers"] != 1 else "")
    return (
        f"{x['partition']}, {framework_label(x['framework'])}, {x['backend']}, batch "
        f"{int(x['batch_per_worker'])}, LR {x['lr_rule']}, {workers} "
        f"(reference {x['reference']})"
    )


def _table(d: Doc, rows: list[dict]) -> None:
    cells, spans = [], []
    for x in rows:
        spans.append(len(cells))
        cells.append([d.cell(group_title(x))] + [""] * 9)
        for st in x["settings"]:
            cells.append(
                [
                    setting_name((st["precision"], st["compile"])),
                    str(st["n"]),
                    fmt.seconds(st["epoch_time_s"]),
                    d.cell(_speedup_cell(st, "speedup")),
                    d.cell(_speedup_cell(st, "speedup_ttt")),
                    d.cell(_epochs_cell(st)),
                    d.cell(_ratio_cell(st, "time_ratio")),
                    d.cell(_ratio_cell(st, "epochs_ratio")),
                    _shares_cell(st),
                    fmt.seconds(st["warm_up_s"]),
                ]
            )
    header = ["Setting", "n", "Epoch (s)", "Epoch S", "TTT S", "Epochs", "Time ratio"]
    header += ["Epochs ratio", "C/S/D %", "Warm-up (s)"]
    widths = [20, 6, 12, 23, 23, 16, 23, 23, 16, 15]  # 177 mm of A4's 180
    d.table(escape(TABLE_NOTE), header, cells, widths, spans=spans, align_right_from=1)


def _notes(rows: list[dict]) -> list[str]:
    fws = sorted({x["framework"] for x in rows})
    precisions = {st["precision"] for x in rows for st in x["settings"]}
    out = [COMPILE_NOTES[f] for f in fws if f in COMPILE_NOTES]
    words = [PRECISION_NOTES[p] for p in PRECISION_NOTES if p in precisions]
    if words:
        out.append("Precision (both frameworks): " + "; ".join(words) + ".")
    return out


def _baseline_text(rows: list[dict]) -> str | None:
    gaps = missing_baselines(rows)
    if not gaps:
        return None
    items = [
        f"{framework_label(g['framework'])} {g['partition']}/{g['backend']}, batch "
        f"{int(g['batch_per_worker'])}, LR {g['lr_rule']}, {g['precision']}/{g['compile']} "
        f"(baseline {g['status']})"
        for g in gaps
    ]
    return (
        "No completed 1-worker baseline of its own setting, so no speedup (the runs are "
        "kept in the table): " + "; ".join(items) + "."
    )


def step_settings_section(d: Doc, r: ReportData) -> None:
    """The section, where some configuration has more than one step setting; else none."""
    rows = setting_rows(r.summary, r.runs)
    if not rows:
        return
    d.section("Precision and compilation")
    d.p(escape(INTRO))
    _table(d, rows)
    text = _baseline_text(rows)
    if text:
        d.p(escape(text))
    d.h2("What the settings mean")
    d.bullets(_notes(rows))
