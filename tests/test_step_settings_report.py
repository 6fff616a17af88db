"""Precisions and compile modes in the report (issue 32, "The report"): the rows of
analysis/step_settings.py from synthetic runs.csv / summary.csv frames (the columns the
aggregation writes), and the "Precision and compilation" section built from them."""

from __future__ import annotations

import io
import math

import pandas as pd
import pytest
from report_fixtures import story_text

from hvdscale.analysis.step_settings import missing_baselines, setting_rows
from hvdscale.report.context import ReportData
from hvdscale.report.doc import Doc, a4_document
from hvdscale.report.step_settings_section import step_settings_section

HVD, TORCH = "horovod-tf", "torch-ddp"
INF = math.inf
PLACE = dict(partition="local", backend="gloo", batch_per_worker=75)

#: (framework, lr_rule, workers, precision, compile) -> per repeat (epoch time, epochs to
#: target); +inf: completed without reaching the target
HAND = {
    (HVD, "none", 1, "fp32", "off"): [(10.0, 10), (10.2, 10), (10.1, 11)],
    (HVD, "none", 1, "bf16", "off"): [(5.0, 12), (5.1, INF), (5.05, 12)],
    (HVD, "none", 2, "fp32", "off"): [(6.0, 10), (6.2, 10), (6.1, 10)],
    (HVD, "none", 2, "bf16", "off"): [(4.0, 15), (4.2, 15), (4.1, 15)],
    (HVD, "none", 2, "bf16", "default"): [(3.0, 15), (3.3, 15), (3.05, 15)],
}


def run_row(fw, lr, w, prec, comp, r, t, ep, **over) -> dict:
    row = dict(
        run_id=f"{fw}_{lr}_w{w}_{prec}_{comp}_r{r}",
        **PLACE,
        framework=fw,
        lr_rule=lr,
        workers=w,
        repeat=r,
        precision=prec,
        compile=comp,
        status="completed",
        candidate="",
        kind="",
        epoch_time_s=t,
        epochs_to_target=float(ep),
        reached_target=math.isfinite(ep),
        compute_share=0.6 if comp == "off" else 0.5,
        sync_share=0.3,
        data_share=0.1 if comp == "off" else 0.2,
        warm_up_s=2.0 if comp == "off" else 30.0 + r,
    )
    row.update(over)
    return row


def hand_runs(table=HAND) -> pd.DataFrame:
    rows = [
        run_row(*key, r, t, ep) for key, reps in table.items() for r, (t, ep) in enumerate(reps)
    ]
    return pd.DataFrame(rows)


def summary_row(fw, lr, w, prec, comp, **over) -> dict:
    row = dict(
        **PLACE,
        framework=fw,
        lr_rule=lr,
        workers=w,
        precision=prec,
        compile=comp,
        has_baseline=True,
        baseline_status="completed",
        speedup=1.5,
        speedup_lo=1.4,
        speedup_hi=1.6,
        speedup_ttt=1.2,
        speedup_ttt_lo=1.1,
        speedup_ttt_hi=1.3,
        target_too_loose=False,
    )
    row.update(over)
    return row


def hand_summary(**per_key) -> pd.DataFrame:
    """One row per configuration of HAND; ``per_key``: 'w2_bf16_default' -> overrides."""
    rows = []
    for fw, lr, w, prec, comp in HAND:
        over = per_key.get(f"w{w}_{prec}_{comp}", {})
        rows.append(summary_row(fw, lr, w, prec, comp, **over))
    return pd.DataFrame(rows)


def by_setting(row: dict) -> dict:
    return {f"{s['precision']}/{s['compile']}": s for s in row["settings"]}


def test_rows_and_ratios_by_hand():
    rows = setting_rows(hand_summary(), hand_runs())
    assert [(x["workers"], x["reference"]) for x in rows] == [(1, "fp32/off"), (2, "fp32/off")]
    one = by_setting(rows[0])
    assert list(one) == ["fp32/off", "bf16/off"]
    ref, bf = one["fp32/off"], one["bf16/off"]
    assert ref["reference"] and "time_ratio" not in ref
    assert (ref["n"], ref["epoch_time_s"], ref["epochs_to_target"]) == (3, 10.1, 10)
    # bf16: median 5.05 s against 10.1 s; epochs 12 (one run did not reach: 2/3) against 10
    assert bf["time_ratio"] == pytest.approx(0.5)
    assert bf["time_ratio_lo"] <= 0.5 <= bf["time_ratio_hi"] < 1
    assert bf["epochs_ratio"] == pytest.approx(1.2)
    assert (bf["n_reached"], bf["n_ttt"]) == (2, 3)
    assert bf["epochs_ratio_lo"] <= 1.2 <= bf["epochs_ratio_hi"]
    assert bf["speedup"] == 1.5 and bf["has_baseline"]  # summary.csv's, of its own setting
    two = by_setting(rows[1])
    assert list(two) == ["fp32/off", "bf16/off", "bf16/default"]
    comp = two["bf16/default"]
    assert comp["time_ratio"] == pytest.approx(3.05 / 6.1)
    assert comp["epochs_ratio"] == pytest.approx(1.5)
    assert comp["warm_up_s"] == 31.0  # median of 30, 31, 32
    assert (comp["compute_share"], comp["sync_share"], comp["data_share"]) == (0.5, 0.3, 0.2)


def test_a_configuration_with_one_setting_has_no_row_and_no_section(tmp_path):
    one = {k: v for k, v in HAND.items() if k[3:] == ("fp32", "off")}
    one[(TORCH, "none", 2, "bf16", "off")] = HAND[(HVD, "none", 2, "bf16", "off")]
    runs = hand_runs(one)  # each (framework, workers) has one setting
    assert setting_rows(hand_summary(), runs) == []
    d = Doc()
    step_settings_section(d, _data(runs, hand_summary(), tmp_path))
    assert d.story == [] and d.n_section == 0


def test_candidates_calibration_and_failed_runs_do_not_make_a_setting():
    runs = hand_runs({k: v for k, v in HAND.items() if k[3:] == ("fp32", "off")})
    extra = [
        run_row(HVD, "none", 2, "bf16", "off", 0, 4.0, 15, candidate="x2"),
        run_row(HVD, "none", 2, "bf16", "off", 1, 4.0, 15, kind="cal"),
        run_row(HVD, "none", 2, "bf16", "off", 2, 4.0, 15, status="failed"),
    ]
    assert setting_rows(hand_summary(), pd.concat([runs, pd.DataFrame(extra)])) == []


def test_lr_rule_none_preferred_else_the_rule_with_settings():
    linear = {(fw, "linear", *rest): v for (fw, _, *rest), v in HAND.items()}
    both = pd.concat([hand_runs(), hand_runs(linear)])
    assert {x["lr_rule"] for x in setting_rows(None, both)} == {"none"}
    flat = {k: v for k, v in HAND.items() if k[3:] == ("fp32", "off")}
    runs = pd.concat([hand_runs(flat), hand_runs(linear)])
    assert {x["lr_rule"] for x in setting_rows(None, runs)} == {"linear"}


def test_reference_is_the_first_setting_without_fp32_off():
    no_fp32 = {k: v for k, v in HAND.items() if k[2] == 2 and k[3] == "bf16"}
    (row,) = setting_rows(None, hand_runs(no_fp32))
    assert row["reference"] == "bf16/off"
    assert by_setting(row)["bf16/default"]["time_ratio"] == pytest.approx(3.05 / 4.1)


def test_missing_baseline_is_said(tmp_path):
    gap = {"has_baseline": False, "baseline_status": "failed"}
    gap.update(speedup=math.nan, speedup_lo=math.nan, speedup_hi=math.nan)
    summary = hand_summary(w2_bf16_default=gap)
    rows = setting_rows(summary, hand_runs())
    assert not by_setting(rows[1])["bf16/default"]["has_baseline"]
    gaps = missing_baselines(rows)
    assert [(g["precision"], g["compile"], g["status"]) for g in gaps] == [
        ("bf16", "default", "failed")
    ]
    text = _section_text(summary, hand_runs(), tmp_path)
    assert "no baseline" in text
    assert "PyTorch" not in text  # only the framework measured is explained
    assert "Horovod-TF local/gloo, batch 75, LR none, bf16/default (baseline failed)" in text


def test_summary_without_setting_columns_reads_as_fp32_off():
    old = hand_summary().drop(columns=["precision", "compile"])
    old = old.drop_duplicates(["framework", "workers"])  # the fp32/off rows come first
    rows = setting_rows(old, hand_runs())
    two = by_setting(rows[1])
    assert two["fp32/off"]["in_summary"] and two["fp32/off"]["speedup"] == 1.5
    assert not two["bf16/off"]["in_summary"]
    assert missing_baselines(rows)[0]["status"] == "no summary row"


# ----------------------------------------------------------------------------- report


def _data(runs, summary, tmp_path) -> ReportData:
    return ReportData({}, None, runs, summary, pd.DataFrame(), None, tmp_path)


def _section_text(summary, runs, tmp_path) -> str:
    d = Doc()
    step_settings_section(d, _data(runs, summary, tmp_path))
    return story_text(d.story)


def test_section_renders_the_table_and_the_notes(tmp_path):
    runs = pd.concat([hand_runs(), hand_runs({(TORCH, *k[1:]): v for k, v in HAND.items()})])
    summary = pd.concat([hand_summary(), hand_summary().assign(framework=TORCH)])
    d = Doc()
    step_settings_section(d, _data(runs, summary, tmp_path))
    text = story_text(d.story)
    assert "1 Precision and compilation" in text
    assert "against the 1-worker runs of its own setting" in text
    assert "need more epochs" in text
    assert "local, Horovod-TF, gloo, batch 75, LR none, 2 workers (reference fp32/off)" in text
    assert "local, PyTorch DDP, gloo, batch 75, LR none, 1 worker (reference fp32/off)" in text
    lines = text.splitlines()
    ref = next(x for x in lines if x.startswith("fp32/off | 3 | 10.1 |"))
    assert "| reference | reference | 60/30/10 | 2 " in ref + " "
    bf = next(x for x in lines if x.startswith("bf16/off | 3 | 5.05 |"))
    assert "| 1.50 [1.40\u20131.60] | 1.20 [1.10\u20131.30] | 12 (2/3) | 0.50 [" in bf
    comp = next(x for x in lines if x.startswith("bf16/default | 3 | 3.05 |"))
    assert comp.endswith("| 50/30/20 | 31")
    for needle in (
        "jit_compile",
        "max-autotune-no-cudagraphs",
        "reduce-overhead",
        "float32 master weights",
    ):
        assert needle in text, needle
    assert "GradScaler" not in text  # no fp16 run: fp16 not explained
    # the story typesets on A4, and the table fits its text width
    table = next(f for f in _flat(d.story) if hasattr(f, "_cellvalues"))
    assert sum(table._colWidths) <= a4_document(io.BytesIO()).width
    a4_document(io.BytesIO()).build(d.story)


def _flat(flowables):
    for f in flowables:
        yield f
        if hasattr(f, "_content"):
            yield from _flat(f._content)
