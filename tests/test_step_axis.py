"""Issue 32: the step's precision and compile mode as axes of the scaling matrix (sweep keys
precisions / compile_modes), in run ids, config slices, the config check, scaling groups
(each setting against the 1-worker runs of its own setting) and the tuning candidates."""

from __future__ import annotations

import copy

import fixtures_runs as F
import pytest
import yaml

from hvdscale.analysis.aggregate import aggregate
from hvdscale.config.load import validate_config
from hvdscale.errors import ConfigError
from hvdscale.matrix.runid import parse_run_id
from hvdscale.matrix.runkinds import rerun_runs, target_config
from hvdscale.matrix.runtable import run_config, run_table
from hvdscale.project import PROJECT_ROOT

HVD_ID, DDP_ID = "", "_torch-ddp"  # the framework token of a run id


def raw_config() -> dict:
    raw = yaml.safe_load((PROJECT_ROOT / "config" / "config.yaml").read_text())
    raw["scaling"].pop("tune", None)
    raw["scaling"]["sweeps"] = [
        {
            "name": "steps",
            "partitions": ["local"],
            "workers": [1, 2],
            "backends": ["gloo"],
            "frameworks": ["horovod-tf", "torch-ddp"],
            "batch_sizes": [75],
            "lr_rules": ["none"],
        }
    ]
    raw["training"]["repeats"] = 2
    return raw


def with_axes(raw: dict, precisions=None, compile_modes=None) -> dict:
    raw = copy.deepcopy(raw)
    sweep = raw["scaling"]["sweeps"][0]
    if precisions:
        sweep["precisions"] = precisions
    if compile_modes:
        sweep["compile_modes"] = compile_modes
    return raw


def test_precisions_and_compile_modes_expand_the_matrix_and_name_the_run():
    plain = validate_config(raw_config())
    cfg = validate_config(with_axes(raw_config(), ["fp32", "bf16"], ["off", "max"]))
    before = {r.run_id for r in run_table(plain) if not r.kind}
    runs = {r.run_id: r for r in run_table(cfg) if not r.kind}
    # 2 frameworks x 2 worker counts x 2 repeats, times 4 step settings
    assert len(before) == 8 and len(runs) == 32
    # fp32/off keeps the ids (and so the results) of a study without the axes
    assert before <= set(runs)
    assert "local_torch-ddp_gloo_n1_w2_b75_lrnone_bf16_cmax_r1" in runs
    assert "local_gloo_n1_w1_b75_lrnone_cmax_r0" in runs
    assert "local_gloo_n1_w1_b75_lrnone_bf16_r0" in runs
    for rid, run in runs.items():
        d = parse_run_id(rid)
        assert (d["precision"], d["compile"]) == (run.precision, run.compile)
    # paired repeats: the seed depends on neither axis
    seeds = {r.seed for r in runs.values() if r.repeat == 1}
    assert len(seeds) == 1


def test_a_runs_slice_carries_its_step_setting_and_finds_the_run_again():
    raw = raw_config()
    plain = validate_config(raw)
    cfg = validate_config(with_axes(raw, ["fp32", "bf16"], ["off", "default"]))
    rid = "local_torch-ddp_gloo_n1_w2_b75_lrnone_bf16_cdefault_r1"
    sub = validate_config(run_config(cfg, rid))
    assert sub["training"]["precision"] == "bf16" and sub["training"]["compile"] == "default"
    assert rid in {r.run_id for r in run_table(sub)}
    # a fp32/off run's slice is the slice it had without the axes: nothing retrains
    base = "local_gloo_n1_w2_b75_lrnone_r0"
    assert run_config(cfg, base) == run_config(plain, base)


def test_a_gpu_precision_in_a_cpu_sweep_is_refused_naming_the_sweep_key():
    with pytest.raises(ConfigError) as e:
        validate_config(with_axes(raw_config(), ["fp32", "fp16"]))
    msg = str(e.value)
    assert "scaling.sweeps.0.precisions" in msg and "'fp16'" in msg and "'local'" in msg
    assert "fp32 or bf16" in msg
    with pytest.raises(ConfigError, match="compile_modes"):
        validate_config(with_axes(raw_config(), compile_modes=["off", "fast"]))


def test_each_step_setting_is_a_scaling_group_against_its_own_baseline(tmp_path):
    """fp32 epoch 10 s on 1 worker, 6 s on 2; bf16 5 s and 4 s. Own baselines give 1.67
    and 1.25; a baseline of the other setting would give 2.5 or 0.83."""
    times = {("", 1): 10.0, ("", 2): 6.0, ("_bf16", 1): 5.0, ("_bf16", 2): 4.0}
    for (tag, w), t in times.items():
        for r in range(3):
            rid = f"local_gloo_n1_w{w}_b75_lrnone{tag}_r{r}"
            F.write_record(tmp_path, F.record_from_epochs(rid, [t * 1.3] + [t] * 3))
    agg = aggregate(tmp_path)
    assert not agg.problems
    s = agg.summary.set_index(["precision", "workers"])
    assert s.loc[("fp32", 2), "speedup"] == pytest.approx(10 / 6)
    assert s.loc[("bf16", 2), "speedup"] == pytest.approx(5 / 4)
    assert set(agg.runs.loc[agg.runs["run_id"].str.contains("_bf16_"), "precision"]) == {"bf16"}


def test_a_setting_without_its_own_1_worker_runs_has_no_baseline(tmp_path):
    for tag, w in (("", 1), ("", 2), ("_cmax", 2)):
        for r in range(2):
            rid = f"local_gloo_n1_w{w}_b75_lrnone{tag}_r{r}"
            F.write_record(tmp_path, F.record_from_epochs(rid, [13.0, 10.0, 10.0]))
    s = aggregate(tmp_path).summary.set_index(["compile", "workers"])
    assert bool(s.loc[("off", 2), "has_baseline"])
    assert not bool(s.loc[("max", 2), "has_baseline"])  # never the eager 1-worker runs


def test_a_record_whose_setting_differs_from_its_id_is_malformed(tmp_path):
    rid = "local_gloo_n1_w1_b75_lrnone_r0"
    rec = F.record_from_epochs(rid, [13.0, 10.0, 10.0])
    rec["config"]["precision"] = "bf16"
    F.write_record(tmp_path, rec)
    agg = aggregate(tmp_path)
    assert agg.status.set_index("run_id").loc[rid, "status"] == "malformed"
    assert any("run_id matches the record's config" in p for p in agg.problems)


def test_tuning_candidates_and_their_reruns_keep_the_step_setting():
    raw = raw_config()
    raw["scaling"]["tune"] = {
        "partitions": ["local"],
        "workers": [2],
        "backends": ["gloo"],
        "batch_sizes": [75],
        "lr_multipliers": [1, 2],
        "warmup_epochs": [0],
        "precisions": ["fp32", "bf16"],
        "repeats": 1,
        "rerun_repeats": 2,
    }
    cfg = validate_config(raw)
    cand = "local_gloo_n1_w2_b75_lrlinear_bf16_m2_wu0_r0"
    assert cand in {r.run_id for r in run_table(cfg)}
    # a tuned.csv row without the id: its precision picks the bf16 candidate, not fp32's
    row = {"partition": "local", "backend": "gloo", "workers": 2, "batch_per_worker": 75,
           "lr_rule": "linear", "lr_mult": 2.0, "tune_warmup": 0, "precision": "bf16"}  # fmt: skip
    ids = [r.run_id for r in rerun_runs(cfg, [row])]
    assert ids == [
        "local_gloo_n1_w2_b75_lrlinear_bf16_m2_wu0_rerun_r0",
        "local_gloo_n1_w2_b75_lrlinear_bf16_m2_wu0_rerun_r1",
    ]
    assert [r.run_id for r in rerun_runs(cfg, [cand])] == ids


def test_calibration_runs_take_the_training_step_setting_and_the_target_slice_names_it():
    raw = raw_config()
    raw["training"]["target"] = {"mode": "calibrated"}
    plain = validate_config(raw)
    assert "precision" not in target_config(plain)["training"]  # as before issue 32
    raw["training"]["precision"] = "bf16"
    cfg = validate_config(raw)
    cal = [r.run_id for r in run_table(cfg) if r.kind == "cal"]
    assert cal and all("_bf16_cal_r" in rid for rid in cal)
    sub = validate_config(target_config(cfg))
    assert [r.run_id for r in run_table(sub) if r.kind == "cal"] == cal


def test_the_frameworks_comparison_takes_each_framework_at_its_best_setting(tmp_path):
    """Horovod-TF ran fp32/off (1 worker 10 s, 2 workers 6 s) and fp32 with XLA (8 s,
    5 s); DDP only eager (20 s, 8 s). Horovod's side is its XLA runs (the shorter
    1-worker epoch): speedup 8/5, epoch-time ratio 5/8 at 2 workers; the eager Horovod
    runs would give 10/6 and 6/8."""
    from hvdscale.analysis.frameworks import best_settings, speedup_rows, sync_rows

    times = {(HVD_ID, "", 1): 10.0, (HVD_ID, "", 2): 6.0, (HVD_ID, "_cdefault", 1): 8.0,
             (HVD_ID, "_cdefault", 2): 5.0, (DDP_ID, "", 1): 20.0,
             (DDP_ID, "", 2): 8.0}  # fmt: skip
    for (fw, tag, w), t in times.items():
        for r in range(3):
            rid = f"local{fw}_gloo_n1_w{w}_b75_lrnone{tag}_r{r}"
            F.write_record(tmp_path, F.record_from_epochs(rid, [t * 1.3] + [t] * 3))
    agg = aggregate(tmp_path)
    best = best_settings(agg.runs).set_index("framework")
    assert tuple(best.loc["horovod-tf", ["precision", "compile", "n_settings"]]) == (
        "fp32",
        "default",
        2,
    )
    assert best.loc["torch-ddp", "compile"] == "off"
    (row,) = [x for x in speedup_rows(agg.summary, agg.runs, ("horovod-tf", F.TORCH))
              if x["workers"] == 2]  # fmt: skip
    assert row["sides"][0]["speedup"] == pytest.approx(8 / 5)
    assert row["sides"][1]["speedup"] == pytest.approx(20 / 8)
    assert row["ratio"] == pytest.approx(5 / 8)
    sync = sync_rows(agg.runs)
    assert len(sync) == 2  # one row per framework: Horovod's XLA runs only
    assert sync.loc[sync["framework"] == "horovod-tf", "n"].item() == 3
