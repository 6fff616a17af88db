"""The side-by-side with the reference study (the thesis this project reproduces): its
speedup per GPU per partition, sync and data shares and batch-size effect next to ours,
each with the configuration and the test loss it reached."""

from __future__ import annotations

import pandas as pd

from hvdscale.analysis.select import config_order, preferred_group, summary_batch
from hvdscale.common import GROUP_KEYS
from hvdscale.report import fmt
from hvdscale.report.context import ReportData
from hvdscale.report.doc import Doc

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
    ref = fmt.REFERENCE
    row = _row(f"Speedup per GPU, {ref['partition_label'][part]}", fmt.slope(value))
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


def _share_row(s: pd.DataFrame, quantity: str, column: str, what: str) -> dict:
    """Median (min-max) of a time share over the configurations ``s`` (may be empty)."""
    row = _row(quantity, fmt.percent(fmt.REFERENCE[column], 0))
    v = s[column].dropna() if len(s) else s
    if len(v):
        row.update(
            ours=fmt.spread(fmt.percent(v.median()), fmt.percent(v.min()), fmt.percent(v.max())),
            config=f"median (min{fmt.EN_DASH}max) over {len(v)} {what}",
        )
    return row


def _batch_row(s: pd.DataFrame) -> dict:
    ref = fmt.REFERENCE
    b0, b1 = ref["batch_from"], ref["batch_to"]
    row = _row(f"Epoch speedup from batch {b0} to {b1}", f"{ref['batch_epoch_speedup']:.0f}x")
    if not len(s):
        return row
    e = s[s["epoch_time_s"].notna() & s["batch_per_worker"].isin([b0, b1])]
    cands = []
    for key, g in e.groupby(["partition", "backend", "lr_rule", "workers"]):
        bt = g.set_index("batch_per_worker")
        if b0 in bt.index and b1 in bt.index:
            cands.append(((key[3], *config_order(key[1], key[2])), key, bt))
    if cands:
        _, (part, be, lr, w), bt = min(cands, key=lambda c: c[0])
        row.update(
            ours=f"{bt.at[b0, 'epoch_time_s'] / bt.at[b1, 'epoch_time_s']:.1f}x",
            config=f"{part}, {be}, LR {lr}, {w} worker{'s' if w > 1 else ''}",
            loss=f"{fmt.loss(bt.at[b0, 'final_test_loss'])} (batch {b0}) / "
            f"{fmt.loss(bt.at[b1, 'final_test_loss'])} (batch {b1})",
        )
    return row


def reference_rows(summary: pd.DataFrame | None) -> list[dict]:
    """The reference study's numbers next to ours (or 'not measured')."""
    s = summary if summary is not None else pd.DataFrame(columns=GROUP_KEYS + ["workers"])
    b_main = summary_batch(summary)
    rows = [
        _speedup_row(s, part, value, b_main)
        for part, value in fmt.REFERENCE["speedup_per_gpu"].items()
    ]
    multi = s[s["workers"] > 1] if len(s) else s
    rows.append(
        _share_row(
            multi,
            "Share of epoch time in gradient synchronisation",
            "sync_share",
            "multi-worker configurations; share of the training-step time",
        )
    )
    rows.append(
        _share_row(s, "Share of epoch time in data loading", "data_share", "configurations")
    )
    rows.append(_batch_row(s))
    return rows


def reference_section(d: Doc, r: ReportData) -> None:
    d.section("Comparison with the reference study")
    rows = [
        [
            d.cell(x["quantity"]),
            x["reference"],
            d.cell(x["ours"]),
            d.cell(x["config"]),
            d.cell(x["loss"]),
        ]
        for x in reference_rows(r.summary)
    ]
    header = [
        "Quantity",
        "Reference",
        "This study",
        "Our configuration",
        "Test loss reached (ours)",
    ]
    d.table(NOTE, header, rows, [44, 17, 27, 56, 36], align_right_from=1, keep=True)
