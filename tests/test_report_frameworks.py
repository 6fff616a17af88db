"""Framework as a dimension of the analysis and the report (issue 19, item 4): the tables
carry a framework column, every baseline is of the same framework, the figures give each
framework its own panels, and the "Horovod vs DDP" section appears with both frameworks
and only then. Simulated records carry config.framework and timing.sync (the shared
contract of issue 19)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import fixtures_runs as F
import pandas as pd
import pytest
import yaml
from required_layers import layer_skipif

from hvdscale.analysis.aggregate import aggregate
from hvdscale.analysis.columns import (
    EPOCH_COLUMNS,
    HEADLINE_COLUMNS,
    RUNS_COLUMNS,
    STATUS_COLUMNS,
    SUMMARY_COLUMNS,
)
from hvdscale.analysis.headline import headline
from hvdscale.analysis.tables import read_epochs, read_runs, write_csv
from hvdscale.analysis.tuning import TUNED_COLUMNS, select_tuned
from hvdscale.cli import main
from hvdscale.config.load import validate_config
from hvdscale.project import PROJECT_ROOT

TORCH = F.TORCH
HVD = "horovod-tf"
needs_poppler = layer_skipif(
    "poppler", "poppler-utils not installed" if shutil.which("pdftotext") is None else None
)


def small_config(repeats: int = 3) -> dict:
    """config.yaml without the tuning sweep: mpi and gloo, 1 and 2 workers, batch 75."""
    raw = yaml.safe_load((PROJECT_ROOT / "config" / "config.yaml").read_text())
    raw["scaling"].pop("tune", None)
    for sweep in raw["scaling"]["sweeps"]:
        sweep.pop("repeats", None)
        sweep["batch_sizes"] = [75]
    raw["training"]["repeats"] = repeats
    return validate_config(raw)


def hand_study(runs_dir: Path, torch_baseline: bool = True) -> None:
    """Exact epoch times: Horovod 1 worker 10 s, 2 workers 6 s; DDP 1 worker 20 s,
    2 workers 8 s (3 repeats each): a baseline of the wrong framework gives 10/8 or 20/6."""
    times = {(HVD, 1): 10.0, (HVD, 2): 6.0, (TORCH, 1): 20.0, (TORCH, 2): 8.0}
    for (fw, w), t in times.items():
        if fw == TORCH and w == 1 and not torch_baseline:
            continue
        for r in range(3):
            rid = f"local_gloo_n1_w{w}_b75_lrnone_r{r}"
            rid = F.torch_twin(rid) if fw == TORCH else rid
            F.write_record(runs_dir, F.record_from_epochs(rid, [t * 1.3] + [t + 0.01 * r] * 3))


def test_tables_carry_the_framework_after_the_partition(tmp_path):
    hand_study(tmp_path)
    agg = aggregate(tmp_path)
    for cols in (RUNS_COLUMNS, SUMMARY_COLUMNS, STATUS_COLUMNS, HEADLINE_COLUMNS, TUNED_COLUMNS):
        assert cols[cols.index("partition") + 1] == "framework"
    assert EPOCH_COLUMNS[:2] == ["run_id", "framework"]
    assert set(agg.runs["framework"]) == {HVD, TORCH}
    torch_ids = set(agg.runs.loc[agg.runs["framework"] == TORCH, "run_id"])
    ids = {f"local_torch-ddp_gloo_n1_w{w}_b75_lrnone_r{r}" for w in (1, 2) for r in range(3)}
    assert torch_ids == ids
    assert set(agg.status["framework"]) == {HVD, TORCH}
    by_run = agg.epochs.drop_duplicates("run_id").set_index("run_id")["framework"]
    assert all(by_run[rid] == TORCH for rid in torch_ids)
    # hand-made records have no timing.sync: the sync columns are NaN, not an error
    assert agg.runs["sync_exposed_s"].isna().all()


def test_baselines_never_mix_frameworks(tmp_path):
    hand_study(tmp_path)
    s = aggregate(tmp_path).summary.set_index(["framework", "workers"])
    assert s.loc[(HVD, 2), "baseline_epoch_time_s"] == pytest.approx(10.01)
    assert s.loc[(TORCH, 2), "baseline_epoch_time_s"] == pytest.approx(20.01)
    assert s.loc[(HVD, 2), "speedup"] == pytest.approx(10.01 / 6.01)
    assert s.loc[(TORCH, 2), "speedup"] == pytest.approx(20.01 / 8.01)
    assert s.loc[(TORCH, 2), "speedup_lo"] <= 2.5 <= s.loc[(TORCH, 2), "speedup_hi"]
    h = headline(aggregate(tmp_path).runs).set_index("framework")
    assert h.loc[TORCH, "epoch_speedup"] == pytest.approx(20.01 / 8.01)
    assert h.loc[HVD, "epoch_speedup"] == pytest.approx(10.01 / 6.01)


def test_a_framework_without_baseline_is_flagged_not_dropped(tmp_path):
    hand_study(tmp_path, torch_baseline=False)
    s = aggregate(tmp_path).summary.set_index(["framework", "workers"])
    assert not s.loc[(TORCH, 2), "has_baseline"]
    assert pd.isna(s.loc[(TORCH, 2), "speedup"])
    assert s.loc[(HVD, 2), "speedup"] == pytest.approx(10.01 / 6.01)


def test_horovod_only_intervals_unchanged_by_the_framework_key(tmp_path):
    """The bootstrap stream of a Horovod configuration is named as before issue 19."""
    from hvdscale.analysis.stats import speedup_interval

    hand_study(tmp_path)
    runs = aggregate(tmp_path).runs
    hv = runs[runs["framework"] == HVD]
    b, g = (hv[hv["workers"] == w] for w in (1, 2))
    expect = speedup_interval(
        b["epoch_time_s"],
        g["epoch_time_s"],
        "local/gloo/75/none/2",
        base_repeats=b["repeat"].tolist(),
        repeats=g["repeat"].tolist(),
    )
    s = aggregate(tmp_path).summary.set_index(["framework", "workers"])
    assert (s.loc[(HVD, 2), "speedup_lo"], s.loc[(HVD, 2), "speedup_hi"]) == expect[:2]


def test_tables_written_before_issue_19_read_as_horovod(tmp_path):
    hand_study(tmp_path)
    agg = aggregate(tmp_path)
    old = agg.runs[agg.runs["framework"] == HVD].drop(
        columns=["framework", "sync_allreduce_s", "sync_comm_hook_s", "sync_exposed_s"]
    )
    write_csv(old.drop(columns="sync_no_comm_step_s"), tmp_path / "runs.csv")
    runs = read_runs(tmp_path / "runs.csv")
    assert list(runs.columns[:3]) == ["run_id", "partition", "framework"]
    assert set(runs["framework"]) == {HVD}
    write_csv(agg.epochs.drop(columns="framework"), tmp_path / "epochs.csv")
    assert set(read_epochs(tmp_path / "epochs.csv")["framework"]) == {HVD}


def test_runs_carry_the_step_settings_and_old_tables_read_as_fp32_eager(tmp_path):
    """Issue 32: runs.csv has each run's precision, compile setting and warm-up; a record
    or a table from before them reads as fp32, off, no warm-up figure."""
    hand_study(tmp_path)
    old_id = F.torch_twin("local_gloo_n1_w2_b75_lrnone_r0")
    # the run id names a step setting other than fp32/off (_bf16_cdefault after the LR rule)
    rid = old_id.replace("_lrnone_r0", "_lrnone_bf16_cdefault_r0")
    (tmp_path / old_id).rename(tmp_path / rid)
    path = tmp_path / rid / "metrics.json"
    rec = json.loads(path.read_text())
    rec["run_id"] = rid
    rec["config"].update(precision="bf16", compile="default")
    rec.setdefault("timing", {})["warm_up_s"] = 12.5
    path.write_text(json.dumps(rec))
    runs = aggregate(tmp_path).runs.set_index("run_id")
    assert tuple(runs.loc[rid, ["precision", "compile", "warm_up_s"]]) == ("bf16", "default", 12.5)
    other = runs.drop(index=rid)
    assert set(other["precision"]) == {"fp32"} and set(other["compile"]) == {"off"}
    assert other["warm_up_s"].isna().all()
    write_csv(runs.reset_index().drop(columns=["precision", "compile", "warm_up_s"]),
              tmp_path / "runs.csv")  # fmt: skip
    old = read_runs(tmp_path / "runs.csv")
    assert set(old["precision"]) == {"fp32"} and set(old["compile"]) == {"off"}


def test_the_settings_sentence_names_each_framework_and_warns_on_mixed_precision():
    from hvdscale.report.frameworks_section import settings_text

    runs = pd.DataFrame({"framework": [HVD, HVD, TORCH], "precision": ["fp32", "fp32", "bf16"],
                         "compile": ["off", "off", "default"]})  # fmt: skip
    text = settings_text(runs, (HVD, TORCH))
    assert "Horovod-TF: fp32, tf.function steps, XLA off" in text
    assert "PyTorch DDP: bf16, torch.compile (default mode)" in text
    assert "different precisions" in text
    runs["precision"] = "fp32"
    assert "different precisions" not in settings_text(runs, (HVD, TORCH))


def test_sync_columns_from_timing_sync(tmp_path):
    cfg = small_config(repeats=1)
    F.write_two_framework_study(tmp_path, cfg, epochs=4)
    runs = aggregate(tmp_path).runs.set_index("run_id")
    t = runs.loc["local_torch-ddp_gloo_n1_w2_b75_lrlinear_r0"]
    h = runs.loc["local_gloo_n1_w2_b75_lrlinear_r0"]
    assert t["sync_comm_hook_s"] > t["sync_allreduce_s"] > t["sync_exposed_s"] > 0
    assert h["sync_exposed_s"] == h["sync_allreduce_s"] and pd.isna(h["sync_comm_hook_s"])
    assert runs.loc["local_torch-ddp_gloo_n1_w1_b75_lrlinear_r0", ["sync_exposed_s"]].isna().all()


# ----------------------------------------------------------------------------- figures


def _titles(fig) -> list[str]:
    return [ax.get_title() for ax in fig.axes if ax.get_visible()]


def test_figures_give_each_framework_its_panels(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from hvdscale.analysis.view import framework_panels
    from hvdscale.figures.scaling import fig_speedup_efficiency, fig_sync_time

    hand_study(tmp_path)
    agg = aggregate(tmp_path)
    both = (framework_panels(agg.runs), framework_panels(agg.summary), agg.epochs, {}, {})
    titles = _titles(fig_speedup_efficiency(*both))
    assert "local, Horovod-TF (batch 75/worker)" in titles
    assert "local, PyTorch DDP (batch 75/worker)" in titles
    assert any("PyTorch DDP" in t for t in _titles(fig_sync_time(*both)))
    hv = agg.summary[agg.summary["framework"] == HVD]
    one = (agg.runs, framework_panels(hv), agg.epochs, {}, {})
    assert [t for t in _titles(fig_speedup_efficiency(*one)) if t] == ["local (batch 75/worker)"]
    ddp = agg.summary[agg.summary["framework"] == TORCH]
    one = (agg.runs, framework_panels(ddp), agg.epochs, {}, {})
    titles = [t for t in _titles(fig_speedup_efficiency(*one)) if t]
    assert titles == ["local, PyTorch DDP (batch 75/worker)"]


# ----------------------------------------------------------------------------- report


def _pdf_text(path: Path) -> str:
    res = subprocess.run(["pdftotext", str(path), "-"], capture_output=True, text=True)
    return " ".join(res.stdout.split())


def report_of(root: Path, cfg: dict, runs_dir: Path) -> Path:
    """aggregate (every record: the config's run table does not list torch-ddp runs
    before the frameworks axis lands) -> plot -> headline -> report."""
    full = root / "full.json"
    full.write_text(json.dumps(cfg))
    s = root / "scaling"
    t = {k: str(s / f"{k}.csv") for k in ("runs", "summary", "status", "headline")}
    args = ["aggregate", "--runs-dir", str(runs_dir), "--out-runs", t["runs"]]
    args += ["--out-summary", t["summary"], "--out-status", t["status"]]
    assert main(args + ["--out-headline", t["headline"], "--quiet"]) == 0
    tables = ["--runs", t["runs"], "--summary", t["summary"]]
    assert main(["plot", *tables, "--outdir", str(root / "plots")]) == 0
    out = root / "report.pdf"
    args = ["report", "--config-file", str(PROJECT_ROOT / "config" / "config.yaml")]
    args += ["--config", str(full), *tables, "--status", t["status"]]
    args += ["--headline", t["headline"], "--plots-dir", str(root / "plots"), "--out", str(out)]
    assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def two_framework_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("frameworks")
    cfg = small_config(repeats=3)
    F.write_two_framework_study(root / "runs", cfg, epochs=6)
    return report_of(root, cfg, root / "runs")


@needs_poppler
def test_report_has_the_horovod_vs_ddp_section(two_framework_report):
    text = _pdf_text(two_framework_report)
    assert "Horovod vs DDP" in text
    for needle in (
        "Epoch S Horovod",
        "Epoch S DDP",
        "TTT S DDP",
        "Horovod/DDP epoch time",
        "Horovod: Horovod-TF; DDP: PyTorch DDP",
        "Gradient synchronisation per framework",
        "comm_hook_s",
        "exposed_s = allreduce_s",
        "no_sync",
        "not measured in multi-GPU form",
        "never Horovod against DDP",
        "local, PyTorch DDP, gloo",  # the first page's sentence names the framework
        "Step settings of the runs",  # issue 32: which settings each framework had
        "tf.function steps, XLA off",
    ):
        assert needle in text, needle
    # mpi was measured by Horovod alone: its row says so
    assert "not measured" in text.split("Horovod vs DDP", 1)[1]


@needs_poppler
def test_report_without_ddp_has_no_such_section(tmp_path):
    cfg = small_config(repeats=1)
    F.write_study(tmp_path / "runs", cfg, epochs=4)
    text = _pdf_text(report_of(tmp_path, cfg, tmp_path / "runs"))
    assert "Horovod vs DDP" not in text
    assert "multi-GPU form" not in text
    assert "Horovod-TF" not in text  # one framework: named nowhere, as before


@needs_poppler
def test_report_says_which_framework_lacks_a_baseline(tmp_path):
    cfg = small_config(repeats=3)
    skip = {f"local_gloo_n1_w1_b75_lrlinear_r{r}" for r in range(3)}
    F.write_two_framework_study(tmp_path / "runs", cfg, epochs=4, skip_torch=skip)
    text = _pdf_text(report_of(tmp_path, cfg, tmp_path / "runs"))
    section = text.split("Horovod vs DDP", 1)[1]
    assert "no baseline" in section
    assert "No completed 1-worker baseline" in section
    assert "PyTorch DDP local/gloo, batch 75, LR linear (baseline not_in_sweep)" in section


def test_framework_panels_compare_the_same_backend(tmp_path):
    """Horovod-TF has mpi (more runs) and gloo, DDP gloo only: both panels show gloo."""
    import matplotlib

    matplotlib.use("Agg")
    from hvdscale.analysis.view import framework_panels
    from hvdscale.figures.time_to_target import fig_speedup_ttt
    from hvdscale.figures.training import fig_loss_vs_time

    F.write_two_framework_study(tmp_path, small_config(repeats=1), epochs=6)
    agg = aggregate(tmp_path)
    data = (framework_panels(agg.runs), framework_panels(agg.summary), agg.epochs, {}, {})
    titles = [t for t in _titles(fig_loss_vs_time(*data)) if t]
    assert titles == ["local, Horovod-TF, gloo, LR linear", "local, PyTorch DDP, gloo, LR linear"]
    titles = [t for t in _titles(fig_speedup_ttt(*data)) if t]
    assert titles == ["local, Horovod-TF, gloo", "local, PyTorch DDP, gloo"]


def test_tuning_heat_map_has_a_panel_per_framework(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from hvdscale.analysis.view import framework_panels
    from hvdscale.figures.time_to_target import fig_tune_heatmap

    raw = yaml.safe_load((PROJECT_ROOT / "config" / "config.yaml").read_text())
    raw["scaling"]["sweeps"] = [raw["scaling"]["sweeps"][1]]  # gloo only
    raw["scaling"]["tune"].update(backends=["gloo"], repeats=1)
    raw["training"]["repeats"] = 1
    F.write_two_framework_study(tmp_path, validate_config(raw), epochs=4)
    own = aggregate(tmp_path).runs
    tuned = select_tuned(own)  # one tuning group per framework, never mixed
    counts = tuned["framework"].value_counts()
    assert set(counts.index) == {HVD, TORCH} and counts[HVD] == counts[TORCH]
    cand = own[own["candidate"] != ""]
    keys = ["framework", "batch_per_worker", "workers"]
    for _, x in tuned.iterrows():
        mine = cand[(cand[keys] == x[keys]).all(axis=1)]
        assert x["n_candidates"] == mine["candidate"].nunique() > 0
    runs = framework_panels(own)
    titles = [t for t in _titles(fig_tune_heatmap(runs, None, None, {}, {})) if t]
    assert titles == ["local, Horovod-TF, gloo, LR linear", "local, PyTorch DDP, gloo, LR linear"]
