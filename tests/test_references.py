"""The reference values come from the config's ``references`` only (issue 18): the report's
reference section, the batch question, the figure captions and the epoch-time figure
follow a config that changes them; without a config, the schema's defaults (the
reference study's figures)."""

from __future__ import annotations

import re

import fixtures_runs as F
import pandas as pd

from hvdscale.analysis.aggregate import aggregate
from hvdscale.analysis.references import references_of
from hvdscale.config.load import validate_config
from hvdscale.figures.registry import caption_values
from hvdscale.report import fmt
from hvdscale.report.accuracy_section import batch_question
from hvdscale.report.reference_section import reference_rows

OWN = {
    "speedup_per_gpu": {"local": {"value": 0.9, "tolerance": 0.1}},
    "sync_share": None,
    "data_share": {"value": 0.1, "tolerance": 0.05},
    "batch_epoch_speedup": {"value": 3.0, "tolerance": 1.0, "batch_to": 150},
}


def own_config() -> dict:
    return validate_config(
        {
            "training": {"max_epochs": 4, "warmup_epochs": 1, "repeats": 1},
            "scaling": {
                "sweeps": [
                    {
                        "partitions": ["local"],
                        "workers": [1, 2],
                        "backends": ["gloo"],
                        "batch_sizes": [75, 150],
                        "lr_rules": ["none"],
                    }
                ],
                "tune": None,
            },
            "references": OWN,
        }
    )


def test_without_a_config_the_schema_defaults_are_the_reference_study():
    refs = references_of(None)
    assert refs["speedup_per_gpu"]["alpha"]["value"] == 0.53
    assert refs["batch_epoch_speedup"] == {
        "value": 7.0,
        "tolerance": 1.0,
        "batch_from": 75,
        "batch_to": 1000,
    }
    quantities = [r["quantity"] for r in reference_rows(None, refs)]
    assert quantities[0] == "Speedup per GPU, Alpha (A100)"
    assert "Epoch speedup from batch 75 to 1000" in quantities


def test_report_and_captions_follow_the_config(tmp_path):
    cfg = own_config()
    refs = cfg["references"]
    assert refs["batch_epoch_speedup"]["batch_from"] == 75  # the schema's default filled in
    F.write_study(tmp_path / "runs", cfg, train_samples=75_000)
    agg = aggregate(tmp_path / "runs", cfg)
    summary = agg.summary
    rows = {r["quantity"]: r for r in reference_rows(summary, refs)}
    assert list(rows)[0] == "Speedup per GPU, local"  # a partition of its own: its name
    assert rows["Speedup per GPU, local"]["reference"] == "0.90"
    assert rows["Speedup per GPU, local"]["ours"] != "not measured"
    assert not any("Alpha" in q or "synchronisation" in q for q in rows)  # null: no row
    assert rows["Share of epoch time in data loading"]["reference"] == "10 %"
    batch = rows["Epoch speedup from batch 75 to 150"]
    assert batch["reference"] == "3x" and batch["ours"].endswith("x")
    sentence = batch_question(summary, None, refs["batch_epoch_speedup"])
    assert sentence.startswith("Batch 75 -> 150 per worker") and "(reference study: 3x)" in sentence
    assert batch_question(summary, None, None) is None
    # with the runs (one repeat each here): the ratios from them, no interval and so no
    # direction word
    s = batch_question(summary, None, refs["batch_epoch_speedup"], agg.runs)
    assert re.search(r"epoch-time speedup \d\.\d\dx, no interval: fewer than 3 repeats", s), s
    assert "faster" not in s and "slower" not in s
    assert "no runs table" not in s
    # after re-tuning: the selected candidate's re-runs (tuned.csv), never the selection runs
    x0 = summary[(summary.batch_per_worker == 75) & summary.time_to_target_s.notna()]
    x0 = x0.sort_values("workers").iloc[-1]
    row = {
        "partition": x0.partition, "framework": "horovod-tf", "backend": x0.backend,
        "batch_per_worker": 150, "workers": x0.workers, "lr_rule": "linear",
        "lr_multiplier": 2.0, "warmup_epochs": 1, "n_repeats": 5,
    }  # fmt: skip
    ttt0 = x0.time_to_target_s
    selected = pd.DataFrame([{**row, "status": "selected", "time_to_target_s": ttt0 / 2}])
    s = batch_question(summary, selected, refs["batch_epoch_speedup"])
    # both sides' conditions named; without the runs no interval and no direction word
    assert "(local, gloo, " in s and "both untuned, LR " in s
    assert "untuned batch 75 takes" in s
    assert "tuned batch 150 (LR linear x2, warm-up 1; median of its 5 re-runs" in s
    assert s.endswith(
        f"{fmt.seconds(ttt0 / 2)} s: time-to-target speedup of tuned batch 150 over "
        "untuned batch 75 2.00x, no interval (no runs table)."
    )
    assert "faster" not in s and "slower" not in s
    censored = selected.assign(time_to_target_s=float("nan"))
    assert "half or more of them did not reach it (no median)" in batch_question(
        summary, censored, refs["batch_epoch_speedup"]
    )
    missed = selected.assign(status="none_reached")
    assert "no re-tuning candidate at batch 150 reached it" in batch_question(
        summary, missed, refs["batch_epoch_speedup"]
    )
    values = caption_values(cfg)
    assert (values["ref_batch_from"], values["ref_batch_to"]) == (75, 150)
    assert values["ref_batch_speedup"] == "3"


def test_epoch_time_figure_labels_the_configured_batches(tmp_path):
    import matplotlib

    matplotlib.use("Agg", force=True)
    from hvdscale.figures.scaling import fig_epoch_time_batch

    cfg = own_config()
    F.write_study(tmp_path / "runs", cfg, train_samples=75_000)
    agg = aggregate(tmp_path / "runs", cfg)
    fig = fig_epoch_time_batch(agg.runs, agg.summary, agg.epochs, None, cfg["references"])
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels and all("(b75->150: " in label for label in labels)
    fig = fig_epoch_time_batch(agg.runs, agg.summary, agg.epochs, None, references_of(None))
    assert not any("->" in label for label in fig.axes[0].get_legend_handles_labels()[1])


def test_batch_question_carries_intervals_and_only_the_words_they_support(tmp_path):
    """Five paired repeats per batch: the epoch and time-to-target ratios of untuned batch
    150 over untuned batch 75 with their intervals over the runs, 'faster' only where the
    whole interval lies above 1."""
    loss = [0.5, 0.3, 0.2, 0.15, 0.10, 0.09]
    for r in range(5):
        for b, t in ((75, 1.0), (150, 0.6)):
            rid = f"local_gloo_n1_w1_b{b}_lrnone_r{r}"
            F.write_record(
                tmp_path, F.record_from_epochs(rid, [t * (1 + 0.01 * r)] * 6, test_loss=loss,
                                               target_test_loss=0.105)
            )  # fmt: skip
    agg = aggregate(tmp_path)
    ref = {"value": 3.0, "batch_from": 75, "batch_to": 150}
    s = batch_question(agg.summary, None, ref, agg.runs)
    d = fmt.EN_DASH
    m = re.search(rf"epoch-time speedup 1\.67x \[(\S+){d}(\S+)\], faster", s)
    assert m and float(m.group(1)) > 1, s
    assert "time-to-target speedup of batch 150 over batch 75, both untuned, 1.67x [" in s
    assert s.rstrip(".").endswith("faster")
    # without the runs: the same ratios, no interval, no word
    bare = batch_question(agg.summary, None, ref)
    assert "1.67x, no interval (no runs table)" in bare and "faster" not in bare


def test_a_study_without_references_has_no_reference_section_or_sentence(tmp_path):
    """A study of another workload sets every reference to none (config/digits.yaml): its
    report has no comparison section and the batch figure's caption no reference ratio."""
    from hvdscale.analysis.references import check_references
    from hvdscale.figures.registry import caption_rst
    from hvdscale.report.context import ReportData
    from hvdscale.report.doc import Doc
    from hvdscale.report.reference_section import reference_section

    none = {"speedup_per_gpu": {}, "sync_share": None, "data_share": None}
    cfg = own_config()
    cfg["references"] = {**none, "batch_epoch_speedup": None}
    F.write_study(tmp_path / "runs", cfg, train_samples=75_000)
    agg = aggregate(tmp_path / "runs", cfg)
    verdicts = check_references(cfg["references"], agg.summary, agg.runs)
    assert verdicts.empty and reference_rows(agg.summary, cfg["references"]) == []

    def sections(cfg, verdicts) -> int:
        d = Doc()
        r = ReportData({}, cfg, agg.runs, agg.summary, None, None, tmp_path, references=verdicts)
        reference_section(d, r)
        return d.n_section

    assert sections(cfg, verdicts) == 0
    assert sections(own_config(), None) == 1  # with references: the section
    caption = caption_rst("epoch_time_batch", caption_values(cfg))
    assert "reference study" not in caption and "legend gives" not in caption
    with_refs = caption_rst("epoch_time_batch", caption_values(own_config()))
    assert "between batch 75 and batch 150" in with_refs
