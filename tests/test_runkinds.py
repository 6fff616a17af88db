"""Run kinds of issue 16: seeds per (seed, repeat, kind), calibration runs and their
config slice, re-runs of the selected tuning candidates, the target's config slice."""

import copy
from pathlib import Path

import numpy as np
import pytest
import yaml

from hvdscale.config.load import load_config, validate_config
from hvdscale.errors import ConfigError
from hvdscale.matrix.runid import parse_run_id
from hvdscale.matrix.runkinds import rerun_runs, target_config
from hvdscale.matrix.runtable import calibration_runs, find_run, run_config, run_seed, run_table

ROOT = Path(__file__).resolve().parents[1]


def test_run_seed_differs_between_repeats_and_is_shared_across_worker_counts():
    cfg = load_config(ROOT / "config/config.yaml")
    runs = {r.run_id: r for r in run_table(cfg)}
    w1 = [runs[f"local_mpi_n1_w1_b75_lrlinear_r{k}"] for k in range(5)]
    w2 = [runs[f"local_mpi_n1_w2_b75_lrlinear_r{k}"] for k in range(5)]
    assert len({r.seed for r in w1}) == 5  # every repeat its own weights and shuffle
    assert [r.seed for r in w1] == [r.seed for r in w2]  # paired: same seed per repeat
    assert all(r.seed == run_seed(cfg["seed"], r.repeat, "") for r in w1)
    # kinds differ from each other at the same repeat index; the config seed matters
    cal = runs["local_mpi_n1_w1_b75_lrlinear_cal_r0"]
    assert cal.kind == "cal" and cal.seed != w1[0].seed
    assert run_seed(cfg["seed"], 0, "rerun") not in (cal.seed, w1[0].seed)
    assert run_seed(cfg["seed"] + 1, 0) != w1[0].seed
    # the documented derivation (the contract of issue 16)
    expected = np.random.SeedSequence([cfg["seed"], 3, 2]).generate_state(1)[0]
    assert run_seed(cfg["seed"], 3, "rerun") == int(expected)
    with pytest.raises(ConfigError, match="kind"):
        run_seed(1, 0, "bogus")


def test_run_ids_with_kind_roundtrip():
    cfg = load_config(ROOT / "config/config.yaml")
    for rid in (
        "local_mpi_n1_w1_b75_lrlinear_cal_r2",
        "local_mpi_n1_w2_b1000_lrlinear_m0p5_wu1_rerun_r4",
        "local_mpi_n1_w1_b1000_lrlinear_m2_wu1_r0",
    ):
        d = parse_run_id(rid)
        assert find_run(cfg, rid).run_id == rid
        assert d["kind"] == ("cal" if "_cal_" in rid else "rerun" if "_rerun_" in rid else "")
    # a re-run only of a candidate of the sweep, within rerun_repeats
    for bad in (
        "local_mpi_n1_w2_b1000_lrlinear_m3_wu1_rerun_r0",
        "local_mpi_n1_w2_b1000_lrlinear_m2_wu1_rerun_r5",
        "local_mpi_n1_w2_b75_lrlinear_m2_wu1_rerun_r0",  # batch 75 is not re-tuned
        "local_mpi_n1_w2_b75_lrlinear_rerun_r0",
        "local_mpi_n1_w2_b75_lrlinear_cal_r0",
    ):
        with pytest.raises(ConfigError, match="not in the scaling matrix"):
            find_run(cfg, bad)


def test_calibration_runs_only_in_calibrated_mode():
    cfg = load_config(ROOT / "config/config.yaml")
    assert calibration_runs(cfg)
    raw = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    raw["training"]["target"] = {"mode": "absolute", "value": 0.05}
    absolute = validate_config(raw)
    assert calibration_runs(absolute) == []
    assert not [r for r in run_table(absolute) if r.kind]


def test_calibration_run_slice_has_the_long_budget_and_no_stop():
    cfg = load_config(ROOT / "config/config.yaml")
    rid = "local_mpi_n1_w1_b75_lrlinear_cal_r1"
    sub = validate_config(run_config(cfg, rid))
    run = find_run(sub, rid)
    assert (run.kind, run.workers, run.seed) == ("cal", 1, find_run(cfg, rid).seed)
    cal = cfg["training"]["target"]["calibration"]
    assert sub["training"]["max_epochs"] == cal["max_epochs"] != cfg["training"]["max_epochs"]
    assert sub["training"]["stop_at_target"] is False
    assert sub["training"]["max_train_s"] is None
    # a scaling run keeps the study's budget and stops at the target
    sub = validate_config(run_config(cfg, "local_mpi_n1_w2_b75_lrlinear_r1"))
    assert sub["training"]["max_epochs"] == cfg["training"]["max_epochs"]
    assert sub["training"]["stop_at_target"] is True
    # the percent is not in a calibration run's slice: editing it retrains nothing
    other = copy.deepcopy(cfg)
    other["training"]["target"]["value"] = 25
    assert run_config(other, rid) == run_config(cfg, rid)


def test_rerun_runs_follow_the_selected_candidates():
    cfg = load_config(ROOT / "config/config.yaml")
    cand = find_run(cfg, "local_mpi_n1_w2_b1000_lrlinear_m2_wu1_r0")
    rows = [
        cand,
        {
            "partition": "local",
            "backend": "mpi",
            "batch_per_worker": "1000",
            "workers": "1",
            "lr_rule": "linear",
            "candidate": "m0p5_wu1",
        },
    ]
    reruns = rerun_runs(cfg, rows)
    assert len(reruns) == 2 * cfg["scaling"]["tune"]["rerun_repeats"]
    assert {r.kind for r in reruns} == {"rerun"}
    by_workers = {w: [r for r in reruns if r.workers == w] for w in (1, 2)}
    assert [r.repeat for r in by_workers[2]] == list(range(5))
    assert {(r.lr_mult, r.tune_warmup, r.batch) for r in by_workers[2]} == {(2.0, 1, 1000)}
    assert {r.lr_mult for r in by_workers[1]} == {0.5}
    by_batch = {1000: by_workers[2]}
    # fresh seeds: not the candidate's, not the scaling runs'
    assert by_batch[1000][0].seed != cand.seed
    assert by_batch[1000][0].run_id == "local_mpi_n1_w2_b1000_lrlinear_m2_wu1_rerun_r0"
    # its slice trains like the candidate (learning rate, warm-up) with the rerun seed
    sub = validate_config(run_config(cfg, by_batch[1000][0].run_id))
    assert sub["training"]["learning_rate"] == pytest.approx(2 * cfg["training"]["learning_rate"])
    assert find_run(sub, by_batch[1000][0].run_id).seed == by_batch[1000][0].seed
    with pytest.raises(ConfigError, match="not a candidate"):
        rerun_runs(cfg, [{**rows[1], "candidate": "m9_wu1"}])


def test_target_config_depends_only_on_the_target():
    cfg = load_config(ROOT / "config/config.yaml")
    sub = validate_config(target_config(cfg))
    assert [r.run_id for r in calibration_runs(sub)] == [r.run_id for r in calibration_runs(cfg)]
    other = copy.deepcopy(cfg)
    other["training"]["max_epochs"] = 99
    other["scaling"]["sweeps"][0]["batch_sizes"].append(500)
    other["report"]["title"] = "another"
    other["scaling"]["partitions"]["local"]["runtime_min"] = 5
    assert target_config(other) == target_config(cfg)
    other["training"]["target"]["value"] = 7
    assert target_config(other) != target_config(cfg)
