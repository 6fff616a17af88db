"""The report's section on the reference study (the thesis this project reproduces): its
speedup per GPU per partition, sync and data shares and batch-size effect next to ours,
each with the configuration and the test loss it reached; then, where references.csv is
given, the measured values with their intervals and verdicts against the references with
tolerances (hvdscale.analysis.references). Every reference value comes from the config's
``references`` (the schema's defaults are the reference study's figures)."""

from __future__ import annotations

import pandas as pd

from hvdscale.analysis.columns import reference_framework
from hvdscale.analysis.references import batch_pair, references_of
from hvdscale.analysis.view import preferred_group, summary_batch
from hvdscale.matrix.runid import GROUP_KEYS
from hvdscale.report import fmt
from hvdscale.report.context import ReportData
from hvdscale.report.doc import Doc

# the reference study's partitions by name (others: the partition's name)
PARTITION_LABEL = {
    "alpha": "Alpha (A100)",
    "hpdlf": "HPDLF (RTX 2080 Ti)",
    "gpu2": "GPU2 (K80)",
}
LABELS = {
    "speedup_per_gpu": "Speedup per GPU",
    "sync_share": "Sync share of step time",
    "data_share": "Data share of step time",
    "batch_epoch_speedup": "Epoch speedup from larger batch",
}
NOTE = (
    "The reference study's results next to ours where measured. Our speedup per GPU is that "
    "of the preferred group of each partition (NCCL, batch 75, no LR scaling where measured)."
)


def _row(quantity: str, reference: str) -> dict:
    return {
        "quantity": quantity,
        "reference": reference,
        "ours": "not measured",
        "config": "-",
        "loss": "-",
    }


def _speedup_row(s: pd.DataFrame, part: str, value: float, b_main) -> dict:
    row = _row(f"Speedup per GPU, {PARTITION_LABEL.get(part, part)}", fmt.slope(value))
    if not len(s):
        return row
    g = s[(s["partition"].astype(str).str.lower() == part) & s["speedup_per_gpu"].notna()]
    pick = preferred_group(g, b_main) if len(g) else None
    if pick is None:
        return row
    grp = g[(g[GROUP_KEYS] == pick[GROUP_KEYS]).all(axis=1)].sort_values("workers")
    top = grp[grp["speedup"].notna()].iloc[-1]
    row.update(
        ours=fmt.slope(pick["speedup_per_gpu"]),
        config=f"{pick['partition']}, {pick['backend']}, "
        f"batch {int(pick['batch_per_worker'])}, LR {pick['lr_rule']}, "
        f"n = {', '.join(str(int(w)) for w in grp['workers'])}",
        loss=f"{fmt.loss(top['final_test_loss'])} at {int(top['workers'])} workers",
    )
    return row


def _share_row(s: pd.DataFrame, quantity: str, column: str, what: str, value: float) -> dict:
    """Median (min-max) of a time share over the configurations ``s`` (may be empty)."""
    row = _row(quantity, fmt.percent(value, 0))
    v = s[column].dropna() if len(s) else s
    if len(v):
        row.update(
            ours=fmt.spread(fmt.percent(v.median()), fmt.percent(v.min()), fmt.percent(v.max())),
            config=f"median (min{fmt.EN_DASH}max) over {len(v)} {what}",
        )
    return row


def _batch_row(s: pd.DataFrame, ref: dict) -> dict:
    b0, b1 = ref["batch_from"], ref["batch_to"]
    row = _row(f"Epoch speedup from batch {b0} to {b1}", f"{ref['value']:.0f}x")
    if not len(s):
        return row
    pair = batch_pair(s, b0, b1)
    if pair is not None:
        (part, be, lr, w), bt = pair
        row.update(
            ours=f"{bt.at[b0, 'epoch_time_s'] / bt.at[b1, 'epoch_time_s']:.1f}x",
            config=f"{part}, {be}, LR {lr}, {w} worker{'s' if w > 1 else ''}",
            loss=f"{fmt.loss(bt.at[b0, 'final_test_loss'])} (batch {b0}) / "
            f"{fmt.loss(bt.at[b1, 'final_test_loss'])} (batch {b1})",
        )
    return row


def reference_rows(summary: pd.DataFrame | None, refs: dict) -> list[dict]:
    """The reference values ``refs`` (the config's ``references``) next to ours (or 'not
    measured'); a quantity set to null in the config has no row."""
    summary = reference_framework(summary)  # the reference study measured Horovod
    s = summary if summary is not None else pd.DataFrame(columns=GROUP_KEYS + ["workers"])
    b_main = summary_batch(summary)
    rows = [
        _speedup_row(s, part, ref["value"], b_main)
        for part, ref in (refs.get("speedup_per_gpu") or {}).items()
    ]
    multi = s[s["workers"] > 1] if len(s) else s
    shares = (
        (
            "sync_share",
            multi,
            "Share of epoch time in gradient synchronisation",
            "multi-worker configurations; share of the training-step time",
        ),
        ("data_share", s, "Share of epoch time in data loading", "configurations"),
    )
    for column, sel, quantity, what in shares:
        if refs.get(column):
            rows.append(_share_row(sel, quantity, column, what, refs[column]["value"]))
    if refs.get("batch_epoch_speedup"):
        rows.append(_batch_row(s, refs["batch_epoch_speedup"]))
    return rows


def reference_section(d: Doc, r: ReportData) -> None:
    """The reference study next to ours; then the verdicts (references.csv, when given).
    No section where the config compares with no reference (another workload's study)."""
    found = reference_rows(r.summary, references_of(r.cfg))
    verdicts = getattr(r, "references", None)
    if not found and (verdicts is None or verdicts.empty):
        return
    d.section("Comparison with the reference study")
    rows = [
        [
            d.cell(x["quantity"]),
            x["reference"],
            d.cell(x["ours"]),
            d.cell(x["config"]),
            d.cell(x["loss"]),
        ]
        for x in found
    ]
    header = [
        "Quantity",
        "Reference",
        "This study",
        "Our configuration",
        "Test loss reached (ours)",
    ]
    d.table(NOTE, header, rows, [44, 17, 27, 56, 36], align_right_from=1, keep=True)
    verdicts_table(d, getattr(r, "references", None))


VERDICT_NOTE = (
    "Measured values against the config's references (key references; results/scaling/"
    "references.csv). 95 % interval: percentile bootstrap over the repeats (baseline "
    "included) where every group has 3 or more; '-' otherwise. Verdict better or worse "
    "only when the whole interval (or, without one, the value) lies outside reference "
    "\u00b1 tolerance; speedups higher, shares lower are better."
)


def verdicts_table(d: Doc, df: pd.DataFrame | None) -> None:
    """The references table (references.csv): measured, interval, reference, verdict."""
    if df is None:
        return
    d.h2("Against the references")
    rows = []
    for x in df.itertuples():
        label = LABELS.get(x.quantity, x.quantity)
        if isinstance(x.partition, str) and x.partition and x.quantity == "speedup_per_gpu":
            label += f", {x.partition}"
        m = "not measured" if pd.isna(x.measured) else f"{x.measured:.3g}"
        ci = "-" if pd.isna(x.ci_low) else f"{x.ci_low:.3g} to {x.ci_high:.3g}"
        rows.append(
            [
                d.cell(label),
                m,
                ci,
                f"{x.reference:g} \u00b1 {x.tolerance:g}",
                d.cell(x.verdict),
                d.cell(x.configuration if isinstance(x.configuration, str) else ""),
            ]
        )
    header = ["Quantity", "Measured", "95 % interval", "Reference", "Verdict", "Configuration"]
    d.table(VERDICT_NOTE, header, rows, [40, 17, 25, 22, 18, 58], align_right_from=1, keep=True)
