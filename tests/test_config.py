"""Config schema: defaults, rejection of malformed configs with readable messages,
shell-injection patterns, the run table and the per-run config subset."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hvdscale.config.load import count_parameters, load_config, validate_config
from hvdscale.errors import ConfigError, UserError
from hvdscale.matrix.allreduce_sweeps import allreduce_config, allreduce_jobs
from hvdscale.matrix.runid import parse_run_id
from hvdscale.matrix.runtable import find_run, learning_rate_for, run_config, run_table

ROOT = Path(__file__).resolve().parents[1]


def test_default_config_fills_every_default():
    cfg = load_config(ROOT / "config/config.yaml")
    assert cfg["data"]["physics"]["youngs_modulus"] == 210000.0
    assert cfg["training"]["horovod"]["compression"] == "none"
    assert cfg["scaling"]["partitions"]["local"]["gpus_per_node"] == 0
    assert cfg["report"]["allow_partial"] is False


def test_empty_config_is_valid_and_complete():
    cfg = validate_config({})
    assert cfg["data"]["n_samples"] == 40000
    # calibrated target by default: 3 calibration runs at the first sweep's first point
    assert [r.run_id for r in run_table(cfg)] == [
        "local_gloo_n1_w1_b75_lrnone_r0",
        "local_gloo_n1_w2_b75_lrnone_r0",
        "local_gloo_n1_w1_b75_lrnone_cal_r0",
        "local_gloo_n1_w1_b75_lrnone_cal_r1",
        "local_gloo_n1_w1_b75_lrnone_cal_r2",
        "local_mpi_n1_w1_b75_lrnone_r0",
        "local_mpi_n1_w2_b75_lrnone_r0",
    ]
    assert cfg["training"]["instrument_every"] == 10
    assert cfg["training"]["timeline_steps"] == 20
    assert cfg["training"]["stop_at_target"] is True and cfg["training"]["max_train_s"] is None
    assert cfg["data"]["val_fraction"] == 0.1 and cfg["data"]["split_shards"]["val"] == 1
    cal = cfg["training"]["target"]["calibration"]
    assert cal == {
        "framework": "horovod-tf",
        "partition": "local",
        "backend": "gloo",
        "batch": 75,
        "lr_rule": "none",
        "seeds": 3,
        "max_epochs": 2 * cfg["training"]["max_epochs"],
        "until_flat": True,  # stop once flat, after min_epochs (issue 30)
        "min_epochs": 32,
    }
    assert validate_config(cfg) == cfg  # a validated config validates to itself


def test_default_config_is_the_equal_accuracy_study():
    """config/config.yaml: 1 and 2 workers x batch 75 and 1000, mpi, 5 repeats, a
    calibrated target, a 1-repeat gloo sweep and a small tuning sweep (issue 16)."""
    cfg = load_config(ROOT / "config/config.yaml")
    runs = run_table(cfg)
    scaling = [r for r in runs if not r.kind and not r.candidate]
    mpi = [r for r in scaling if r.backend == "mpi"]
    assert {(r.workers, r.batch) for r in mpi} == {(1, 75), (2, 75), (1, 1000), (2, 1000)}
    assert {r.repeat for r in mpi} == set(range(5)) and len(mpi) == 20
    gloo = [r for r in scaling if r.backend == "gloo"]
    assert {r.repeat for r in gloo} == {0} and {r.workers for r in gloo} == {1, 2}
    cal = [r for r in runs if r.kind == "cal"]
    assert [r.run_id for r in cal] == [f"local_mpi_n1_w1_b75_lrlinear_cal_r{k}" for k in range(3)]
    candidates = [r for r in runs if r.candidate]
    assert 0 < len(candidates) <= 8
    assert cfg["scaling"]["tune"]["rerun_repeats"] == 5
    groups = {(r.partition, r.backend, r.workers, r.batch, r.lr_rule) for r in candidates}
    reruns = len(groups) * cfg["scaling"]["tune"]["rerun_repeats"]
    # the budget of the default pipeline: at most ~40 train_run jobs on a 2-core machine
    assert len(runs) + reruns <= 41
    for split, n in cfg["data"]["split_shards"].items():
        assert n % 2 == 0, split  # whole shards for 1 and 2 workers


def test_thesis_config_matches_reference_study():
    cfg = load_config(ROOT / "config/thesis.yaml")
    assert cfg["data"]["n_samples"] == 1_000_000
    assert cfg["data"]["train_fraction"] == 0.75
    assert cfg["training"]["learning_rate"] == pytest.approx(4.7331e-4)
    assert count_parameters(cfg) == 153441
    assert count_parameters(cfg) * 4 / 1e6 == pytest.approx(0.61, abs=0.005)
    parts = cfg["scaling"]["partitions"]
    assert parts["alpha"]["gpus_per_node"] == 8 and parts["gpu2"]["gpus_per_node"] == 4
    runs = run_table(cfg)
    batches = {r.batch for r in runs}
    assert min(batches) == 75 and max(batches) == 5000
    assert {r.lr_rule for r in runs} == {"none", "linear", "sqrt"}
    assert {r.backend for r in runs} == {"nccl", "mpi", "gloo"}
    # sequential distribution: 16 workers on 8-GPU nodes -> 2 full nodes
    r = find_run(cfg, "alpha_nccl_n2_w16_b75_lrnone_r0")
    assert (r.nodes, r.workers_per_node) == (2, 8)
    r = find_run(cfg, "hpdlf_mpi_n3_w8_b75_lrnone_r1")
    assert (r.nodes, r.workers_per_node) == (3, 3)
    # gpu2 (K80) is kept as a partition but swept nowhere: the pinned TensorFlow cannot run it
    assert not [r for r in runs if r.partition == "gpu2"]
    assert find_run(cfg, "hpdlf_gloo_n11_w32_b75_lrsqrt_r2").nodes == 11


BAD_CONFIGS = [
    ({"bogus": 1}, ["unknown key", "'bogus'", "allowed"]),
    ({"data": {"n_samples": "many"}}, ["data.n_samples", "'many'", "type integer"]),
    ({"data": {"n_samples": 5}}, ["data.n_samples", "5", ">= 16"]),
    ({"data": {"train_fraction": 1.5}}, ["data.train_fraction", "1.5", "< 1"]),
    ({"training": {"launcher": "ssh"}}, ["training.launcher", "'ssh'", "'horovodrun'", "'srun'"]),
    (
        {"training": {"max_epochs": 2, "warmup_epochs": 2}},
        ["training.warmup_epochs", "fewer than training.max_epochs"],
    ),
    (
        {"training": {"epochs": 4}},
        ["training.epochs", "renamed to training.max_epochs", "max_epochs: 4"],
    ),
    (
        {"training": {"target": {"mode": "relative", "value": 5}}},
        ["training.target.mode", "'relative'", "removed", "calibrated", "absolute"],
    ),
    (
        {"training": {"target": {"mode": "calibrated", "calibration": {"partition": "nope"}}}},
        ["training.target.calibration.partition", "'nope'", "scaling.partitions"],
    ),
    (
        {"training": {"warmup_epochs": 3, "target": {"calibration": {"max_epochs": 2}}}},
        ["training.target.calibration.max_epochs", "more than training.warmup_epochs"],
    ),
    ({"training": {"max_train_s": 0}}, ["training.max_train_s", "> 0"]),
    ({"data": {"val_fraction": 1.0}}, ["data.val_fraction", "< 1"]),
    (
        {
            "scaling": {
                "tune": {
                    "partitions": ["local"],
                    "workers": [2],
                    "backends": ["mpi"],
                    "batch_sizes": [75],
                    "lr_multipliers": [1],
                    "rerun_repeats": 0,
                }
            }
        },
        ["scaling.tune.rerun_repeats", ">= 1"],
    ),
    (
        {"data": {"labels": {"yield_stress": {"min": 700, "max": 600}}}},
        ["data.labels.yield_stress", "below max"],
    ),
    ({"model": {"hidden_units": []}}, ["model.hidden_units"]),
    ({"results_dir": "/scratch/ws/$USER"}, ["results_dir", "'/scratch/ws/$USER'", "no shell"]),
    ({"results_dir": "../outside"}, ["results_dir", "without '..'", "or absolute"]),
    (
        {
            "scaling": {
                "sweeps": [
                    {
                        "partitions": ["nowhere"],
                        "workers": [1],
                        "backends": ["mpi"],
                        "batch_sizes": [75],
                        "lr_rules": ["none"],
                    }
                ]
            }
        },
        ["scaling.sweeps.0.partitions", "'nowhere'", "'local'"],
    ),
    (
        {
            "scaling": {
                "sweeps": [
                    {
                        "partitions": ["local"],
                        "workers": [1],
                        "backends": ["nccl"],
                        "batch_sizes": [75],
                        "lr_rules": ["none"],
                    }
                ]
            }
        },
        ["nccl", "gpus_per_node 0"],
    ),
    (
        {"scaling": {"sweeps": [{"partitions": ["local"]}]}},
        ["scaling.sweeps.0", "'workers' is a required property"],
    ),
]


@pytest.mark.parametrize("bad,expected", BAD_CONFIGS, ids=[str(i) for i in range(len(BAD_CONFIGS))])
def test_malformed_configs_rejected_with_readable_message(bad, expected):
    with pytest.raises(ConfigError) as info:
        validate_config(bad)
    msg = str(info.value)
    for fragment in expected:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"


INJECTIONS = [
    (
        "scaling.partitions",
        {"scaling": {"partitions": {"gpu;rm -rf /": {"cores_per_node": 1, "mem_mb_per_node": 1}}}},
    ),
    (
        "account",
        {
            "scaling": {
                "partitions": {
                    "local": {"cores_per_node": 2, "mem_mb_per_node": 1, "account": "p$(id)"}
                }
            }
        },
    ),
    (
        "constraint",
        {
            "scaling": {
                "partitions": {
                    "local": {"cores_per_node": 2, "mem_mb_per_node": 1, "constraint": "a`b`"}
                }
            }
        },
    ),
    ("environment.modules", {"environment": {"modules": ["TensorFlow/2.15; curl x"]}}),
    ("environment.venv", {"environment": {"venv": ".venv train && ls"}}),
    ("environment.conda_env", {"environment": {"conda_env": "envs/x.yaml|sh"}}),
    (
        "sweeps.0.partitions",
        {
            "scaling": {
                "sweeps": [
                    {
                        "partitions": ["local && x"],
                        "workers": [1],
                        "backends": ["mpi"],
                        "batch_sizes": [75],
                        "lr_rules": ["none"],
                    }
                ]
            }
        },
    ),
]


@pytest.mark.parametrize("key,bad", INJECTIONS, ids=[k for k, _ in INJECTIONS])
def test_values_reaching_a_shell_are_pattern_constrained(key, bad):
    with pytest.raises(ConfigError) as info:
        validate_config(bad)
    assert "pattern" in str(info.value) or "matching" in str(info.value)


def test_load_config_names_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("training:\n  max_epochs: zero\n")
    with pytest.raises(ConfigError, match=str(path)):
        load_config(path)
    path.write_text("training: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_run_id_roundtrip_and_errors():
    cfg = load_config(ROOT / "config/thesis.yaml")
    for run in run_table(cfg)[:50]:
        d = parse_run_id(run.run_id)
        assert (d["partition"], d["workers"], d["batch"], d["repeat"]) == (
            run.partition,
            run.workers,
            run.batch,
            run.repeat,
        )
    with pytest.raises(ConfigError, match="expected"):
        parse_run_id("alpha-w8")
    with pytest.raises(ConfigError, match="not in the scaling matrix"):
        find_run(cfg, "alpha_nccl_n1_w3_b75_lrnone_r0")


def test_run_config_is_a_valid_subset_that_ignores_other_sweeps():
    cfg = load_config(ROOT / "config/thesis.yaml")
    run_id = "hpdlf_gloo_n3_w8_b75_lrlinear_r1"
    sub = run_config(cfg, run_id)
    assert find_run(validate_config(sub), run_id).workers == 8
    other = copy.deepcopy(cfg)
    other["scaling"]["sweeps"][1]["batch_sizes"].append(10000)
    other["report"]["title"] = "another title"
    assert run_config(other, run_id) == sub
    # the target value reaches a run through target.json, not through its slice
    other["training"]["target"]["value"] = 50
    assert run_config(other, run_id) == sub
    other["training"]["max_epochs"] = 99
    assert run_config(other, run_id) != sub


def test_keys_added_later_stay_out_of_the_validated_config_at_their_default():
    """smoke, a partition's emulated_gpus and the workload came after studies were run: at
    their default they stay out of the validated config and of every run's validated
    slice (what full.json and a run's config.json hold, and what the hashes are taken of),
    written out or left out alike, so those studies keep their hashes and nothing
    retrains; set, they stay."""
    raw = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    cfg = validate_config(raw)
    explicit = copy.deepcopy(raw)
    explicit.update(smoke=False, workload="stress-strain")
    for part in explicit["scaling"]["partitions"].values():
        part["emulated_gpus"] = False
    assert validate_config(explicit) == cfg
    for c in [cfg] + [validate_config(run_config(cfg, r.run_id)) for r in run_table(cfg)]:
        assert not {"smoke", "workload"} & set(c)
        assert all("emulated_gpus" not in p for p in c["scaling"]["partitions"].values())
    assert validate_config(cfg) == cfg
    gpu = copy.deepcopy(raw)
    gpu["scaling"]["partitions"]["local"].update(gpus_per_node=2, emulated_gpus=True)
    assert validate_config(gpu)["scaling"]["partitions"]["local"]["emulated_gpus"] is True
    assert validate_config({**raw, "smoke": True})["smoke"] is True


def test_allreduce_config_is_a_valid_slice_that_ignores_report_and_training_edits():
    from hvdscale.slurm.jobspec import JobSpec

    cfg = load_config(ROOT / "config/thesis.yaml")
    ids = [job["id"] for job in allreduce_jobs(cfg)]
    assert len(ids) == 30
    for job_id in ids[::4]:
        sub = validate_config(allreduce_config(cfg, job_id))
        # the launcher sees the same job and the same launch settings
        assert JobSpec.for_allreduce_id(sub, job_id) == JobSpec.for_allreduce_id(cfg, job_id)
        assert sub["environment"] == cfg["environment"]
        for key in ("launcher", "threads_per_worker", "horovod"):
            assert sub["training"][key] == cfg["training"][key]
    job_id = "hpdlf_mpi_n3_w8"
    sub = allreduce_config(cfg, job_id)
    other = copy.deepcopy(cfg)
    other["report"]["title"] = "another title"
    other["scaling"]["sweeps"][1]["batch_sizes"].append(10000)
    other["training"]["max_epochs"] = 99
    other["data"]["n_samples"] = 1000
    other["scaling"]["partitions"]["alpha"]["runtime_min"] = 1
    assert allreduce_config(other, job_id) == sub
    other["training"]["horovod"]["cycle_time_ms"] = 5.0
    assert allreduce_config(other, job_id) != sub
    with pytest.raises(UserError, match="allreduce-id"):
        allreduce_config(cfg, "hpdlf_mpi_n1_w8")


@pytest.mark.parametrize(
    "rule,workers,expected", [("none", 8, 1.0), ("linear", 8, 8.0), ("sqrt", 16, 4.0)]
)
def test_learning_rate_rules(rule, workers, expected):
    assert learning_rate_for(1.0, rule, workers) == pytest.approx(expected)


def test_check_config_cli(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hvdscale.cli",
            "check-config",
            "--quiet",
            str(ROOT / "config/thesis.yaml"),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and "693 training runs" in out.stdout  # 3 calibration runs
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"training": {"launcher": "ssh"}}))
    out = subprocess.run(
        [sys.executable, "-m", "hvdscale.cli", "check-config", str(bad)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "training.launcher" in out.stderr and "Traceback" not in out.stderr


def test_config_readme_documents_every_key():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gen_config_docs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    text = (ROOT / "config/README.md").read_text()
    for key in (
        "data.physics.noise_std",
        "training.horovod.cycle_time_ms",
        "scaling.partitions.<name>.gpus_per_node",
        "environment.modules",
        "report.allow_partial",
    ):
        assert f"`{key}`" in text


def _torch_sweep(partition: str, backend: str) -> dict:
    return {"partitions": [partition], "workers": [1], "backends": [backend],
            "frameworks": ["torch-ddp"], "batch_sizes": [75], "lr_rules": ["none"]}  # fmt: skip


GPU_PART = {"gpus_per_node": 1, "cores_per_node": 8, "mem_mb_per_node": 8000}


def test_precision_and_compile_are_checked_against_the_runs_of_the_matrix():
    """Issue 32: fp16/tf32 need a GPU partition; precision and compile other than fp32/off
    only for torch-ddp (the default config's horovod-tf runs refuse them)."""
    ok = validate_config({"training": {"precision": "bf16", "compile": "max"},
                          "scaling": {"sweeps": [_torch_sweep("local", "gloo")]}})  # fmt: skip
    assert (ok["training"]["precision"], ok["training"]["compile"]) == ("bf16", "max")
    assert validate_config({})["training"]["precision"] == "fp32"
    assert validate_config({})["training"]["compile"] == "off"
    gpu = {"partitions": {"gpu": GPU_PART}, "sweeps": [_torch_sweep("gpu", "nccl")]}
    cfg = validate_config({"training": {"precision": "tf32"}, "scaling": gpu})
    assert cfg["training"]["precision"] == "tf32"
    with pytest.raises(ConfigError) as e:
        validate_config({"training": {"precision": "fp16"},
                         "scaling": {"sweeps": [_torch_sweep("local", "gloo")]}})  # fmt: skip
    assert "training.precision: got 'fp16', which needs a GPU" in str(e.value)
    assert "partition 'local' has gpus_per_node 0; on a CPU use fp32 or bf16" in str(e.value)
    # horovod-tf has bf16, XLA (compile default/max) and fp16 with loss scaling (on a GPU)
    cfg = validate_config({"training": {"compile": "default", "precision": "bf16"}})
    assert cfg["training"]["compile"] == "default"
    hvd_sweep = {**_torch_sweep("gpu", "nccl"), "frameworks": ["horovod-tf"]}
    hvd_gpu = {"partitions": {"gpu": GPU_PART}, "sweeps": [hvd_sweep]}
    ok = validate_config({"training": {"precision": "fp16"}, "scaling": hvd_gpu})
    assert ok["training"]["precision"] == "fp16"
    with pytest.raises(ConfigError, match="'fp16', which needs a GPU"):
        validate_config({"training": {"precision": "fp16"}})  # horovod-tf on the CPU
    ok = validate_config({"training": {"precision": "tf32"}, "scaling": hvd_gpu})
    assert ok["training"]["precision"] == "tf32"
    with pytest.raises(ConfigError, match="training.precision.*one of|fp8"):
        validate_config({"training": {"precision": "fp8"}})
