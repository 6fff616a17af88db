"""The smoke study (config key smoke, config/smoke.yaml, `make smoke`): what it runs,
where, and its budget from `hvdscale plan`. The run through the SLURM plugin on the
emulated cluster: tests/test_slurm_multinode.py (test_smoke_study_of_the_thesis_...)."""

from __future__ import annotations

import subprocess

import pytest

from hvdscale.config import smoke
from hvdscale.config.load import validate_config
from hvdscale.matrix.allreduce_sweeps import allreduce_jobs
from hvdscale.matrix.runtable import run_table
from hvdscale.project import PROJECT_ROOT
from hvdscale.slurm.preflight import preflights
from hvdscale.study.plan import format_plan, merged_config, plan

THESIS = "config/thesis.yaml"
SMOKE = "config/smoke.yaml"


def swept(cfg: dict) -> dict[str, set]:
    """partition -> {(framework, backend)} of the config's sweeps."""
    out: dict[str, set] = {}
    for sweep in cfg["scaling"]["sweeps"]:
        for p in sweep["partitions"]:
            out.setdefault(p, set()).update(
                (fw, be) for fw in sweep["frameworks"] for be in sweep["backends"]
            )
    return out


def test_thesis_smoke_runs_every_partition_backend_at_1_and_2_workers_in_its_own_folder():
    full = merged_config([PROJECT_ROOT / THESIS])
    cfg = merged_config([PROJECT_ROOT / THESIS, PROJECT_ROOT / SMOKE])
    runs = [r for r in run_table(cfg) if not r.kind]
    want = swept(full)
    assert set(want) == {"alpha", "hpdlf"}  # gpu2 is in no sweep of the thesis
    assert {(r.partition, r.framework, r.backend) for r in runs} == {
        (p, fw, be) for p, pairs in want.items() for fw, be in pairs
    }
    assert sorted({r.workers for r in runs}) == [1, 2]
    assert {r.repeat for r in runs} == {0} and {(r.batch, r.lr_rule) for r in runs} == {
        (75, "none")
    }
    assert len(runs) == 2 * sum(len(pairs) for pairs in want.values())  # 12
    # the target: one short calibration run on the first sweep's reference point
    cal = [r for r in run_table(cfg) if r.kind == "cal"]
    assert [(r.partition, r.backend, r.workers) for r in cal] == [("alpha", "nccl", 1)]
    tr = cfg["training"]
    assert tr["max_epochs"] == tr["target"]["calibration"]["max_epochs"] == smoke.EPOCHS
    assert tr["warmup_epochs"] < tr["max_epochs"] and tr["repeats"] == 1
    assert cfg["data"]["n_samples"] == smoke.SAMPLES < full["data"]["n_samples"]
    assert cfg["scaling"]["tune"] is None and cfg["strict"] is False
    # its own results folder, inside the study's, and a report that says what it is
    assert cfg["results_dir"] == f"{full['results_dir']}/smoke"
    assert cfg["report"]["title"].startswith("Smoke study: ")
    # the preflight per partition runs in the smoke study too, one per partition
    assert sorted(preflights(cfg)) == ["alpha", "hpdlf"]
    # the same partitions, environment and launcher as the real study
    for key in ("environment", "model"):
        assert cfg[key] == full[key]
    assert cfg["training"]["launcher"] == full["training"]["launcher"]
    assert cfg["scaling"]["partitions"]["alpha"]["gpus_per_node"] == 8


def test_thesis_smoke_plan_stays_under_one_node_hour_per_partition():
    """The bound from the plan's own numbers: training, calibration, preflight and
    allreduce sweeps of each partition, every job to its time limit."""
    cfg = merged_config([PROJECT_ROOT / THESIS, PROJECT_ROOT / SMOKE])
    p = plan(cfg, PROJECT_ROOT / "nonexistent-results")
    rows = {r["partition"]: r for r in p["partitions"]}
    assert set(rows) == {"alpha", "hpdlf"}
    parts = cfg["scaling"]["partitions"]
    for name, row in rows.items():
        assert row["nodes_per_job"] == "1"
        assert row["preflight_node_hours_worst"] > 0 and row["allreduce_node_hours_worst"] > 0
        assert row["node_hours_worst_all"] == pytest.approx(
            row["node_hours_worst"]
            + row["preflight_node_hours_worst"]
            + row["allreduce_node_hours_worst"],
            abs=0.002,
        )
        assert row["node_hours_worst_all"] < 1.0, row
        assert parts[name]["runtime_min"] == smoke.RUNTIME_MIN
    # the per-partition figures add up to the plan's totals
    assert sum(r["allreduce_node_hours_worst"] for r in rows.values()) == pytest.approx(
        p["allreduce"]["node_hours_worst"], abs=0.002
    )
    assert sum(r["preflight_node_hours_worst"] for r in rows.values()) == pytest.approx(
        p["preflight"]["node_hours_worst"], abs=0.002
    )
    assert p["allreduce"]["jobs"] == len(allreduce_jobs(cfg)) == 6  # 2 workers, 3 backends
    text = format_plan(p)
    assert "smoke study (config key smoke) in results/smoke" in text
    assert "alpha: 7 jobs x 1 nodes, worst 0.6 node-h" in text
    assert "with its preflight and allreduce sweeps 0.9 node-h" in text


def test_smoke_is_the_same_through_the_overlay_and_the_command_line_and_stays_itself():
    files = [PROJECT_ROOT / THESIS]
    via_file = merged_config([*files, PROJECT_ROOT / SMOKE])
    assert merged_config(files, overrides=["smoke=True"]) == via_file
    # a validated smoke config (the one Snakemake writes, a run reads) validates to itself
    assert validate_config(via_file) == via_file
    # an explicit results_dir of the smoke study stays where it is given
    elsewhere = merged_config(files, overrides=["smoke=True", "results_dir=/tmp/ws/smoke"])
    assert elsewhere["results_dir"] == "/tmp/ws/smoke"


def test_smoke_keeps_each_framework_with_its_own_backends():
    raw = {
        "scaling": {
            "partitions": {"cpu": {"cores_per_node": 4, "mem_mb_per_node": 8000}},
            "sweeps": [
                {
                    "name": "hvd",
                    "partitions": ["cpu"],
                    "workers": [1, 4, 8],
                    "backends": ["mpi", "gloo"],
                    "batch_sizes": [250, 75],
                    "lr_rules": ["sqrt", "linear"],
                    "precisions": ["fp32", "bf16"],
                },
                {
                    "name": "torch",
                    "partitions": ["cpu"],
                    "workers": [4],
                    "frameworks": ["torch-ddp"],
                    "backends": ["gloo"],
                    "batch_sizes": [1000],
                    "lr_rules": ["none"],
                },
            ],
        },
        "training": {"max_epochs": 2, "warmup_epochs": 1, "target": {"mode": "absolute"}},
        "smoke": True,
    }
    cfg = validate_config(raw)
    runs = run_table(cfg)
    assert {(r.framework, r.backend, r.workers) for r in runs} == {
        (fw, be, w)
        for fw, be in [("horovod-tf", "mpi"), ("horovod-tf", "gloo"), ("torch-ddp", "gloo")]
        for w in (1, 2)
    }
    # one batch and LR rule (the first sweep's first), the config's own step setting
    assert {(r.batch, r.lr_rule, r.precision) for r in runs} == {(250, "sqrt", "fp32")}
    assert cfg["training"]["max_epochs"] == 2  # fewer epochs than the smoke's stay
    assert not [r for r in runs if r.kind == "cal"]  # absolute target: no calibration


def test_make_smoke_runs_the_study_with_the_smoke_overlay_and_the_profile():
    out = subprocess.run(
        [
            "make",
            "-n",
            "smoke",
            f"CONFIG={THESIS}",
            "PROFILE=profiles/slurm",
            "SNAKEMAKE=echo snakemake",  # -n still runs the line that calls make again
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"snakemake --profile profiles/slurm --configfile {THESIS} {SMOKE}" in out.stdout, (
        out.stdout
    )
