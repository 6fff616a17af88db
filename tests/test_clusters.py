"""Several clusters, one study (issue 29), without SLURM: the config key only_cluster
(hvdscale.slurm.clusters) and the checks and merged config of hvdscale merge
(hvdscale.study.merge). The run on two real SLURM instances is tests/test_multicluster.py.
"""

from __future__ import annotations

import copy

import pytest

from hvdscale.config.load import validate_config
from hvdscale.errors import ConfigError, UserError
from hvdscale.matrix.allreduce_sweeps import allreduce_jobs
from hvdscale.matrix.runtable import run_table
from hvdscale.slurm.jobspec import JobSpec
from hvdscale.study.merge import Part, check_parts, merged_config

PART = {"cores_per_node": 4, "mem_mb_per_node": 8000, "workers_per_node": 2}


def study(**top) -> dict:
    """Three partitions on three clusters, one sweep over all of them, absolute target."""
    cfg = {
        "training": {"target": {"mode": "absolute", "value": 0.1}},
        "scaling": {
            "partitions": {p: {**PART, "cluster": f"c{p}"} for p in ("pa", "pb", "pc")},
            "sweeps": [
                {
                    "partitions": ["pa", "pb", "pc"],
                    "workers": [1, 2],
                    "backends": ["gloo"],
                    "batch_sizes": [75],
                    "lr_rules": ["none"],
                }
            ],
        },
        "allreduce": {
            "sweeps": [
                {"partitions": ["pa", "pc"], "backends": ["gloo"], "workers": [2], "nodes": [1]}
            ]
        },
    }
    cfg.update(top)
    return validate_config(cfg)


def part(cfg: dict, name: str) -> Part:
    from hvdscale.study.merge import _used_partitions

    p = Part(name, "results directory", cfg, {"runs/x/metrics.json": b"{}"})
    p.partitions = _used_partitions(cfg)
    return p


def test_only_cluster_keeps_that_clusters_runs_and_passes_no_clusters_flag():
    everything = study()
    assert {r.partition for r in run_table(everything)} == {"pa", "pb", "pc"}
    run = next(r for r in run_table(everything) if r.partition == "pb")
    # without only_cluster the partition's cluster goes to sbatch --clusters (federation)
    assert JobSpec.for_run(everything, run).slurm_resources()["slurm_cluster"] == "cpb"
    only_b = study(only_cluster="cpb")
    assert {r.partition for r in run_table(only_b)} == {"pb"}
    assert len(run_table(only_b)) == 2
    # reached through its own login node / SLURM_CONF: no --clusters
    run = run_table(only_b)[0]
    assert JobSpec.for_run(only_b, run).slurm_resources()["slurm_cluster"] is None
    # the allreduce sweeps of other clusters' partitions are left out too
    assert {j["partition"] for j in allreduce_jobs(study(only_cluster="cpc"))} == {"pc"}
    assert allreduce_jobs(only_b) == [j for j in allreduce_jobs(only_b) if j["partition"] == "pb"]


def test_only_cluster_refuses_unknown_clusters_and_calibration_elsewhere():
    with pytest.raises(ConfigError, match=r"only_cluster: got 'nope'.*'cpa', 'cpb', 'cpc'"):
        study(only_cluster="nope")
    calibrated = {"target": {"mode": "calibrated", "value": 5.0}}
    with pytest.raises(ConfigError, match=r"training.target.calibration.partition.*'pa'"):
        study(only_cluster="cpb", training=calibrated)
    # the calibration runs' own cluster is fine
    cfg = study(only_cluster="cpa", training=calibrated)
    assert any(r.kind == "cal" and r.partition == "pa" for r in run_table(cfg))


def test_merge_refuses_configs_that_differ_beyond_partitions_and_overlaps():
    a, b = study(only_cluster="cpa"), study(only_cluster="cpb")
    check_parts([part(a, "A"), part(b, "B")])  # one study, two clusters
    other = copy.deepcopy(b)
    other["training"]["max_epochs"] = a["training"]["max_epochs"] + 1
    with pytest.raises(UserError, match=r"A and B are not parts of one study.*training.max_epochs"):
        check_parts([part(a, "A"), part(other, "B")])
    # where a part's files lived is no part of its runs' configuration
    moved = copy.deepcopy(b)
    moved["results_dir"] = "/scratch/ws/study-b"
    check_parts([part(a, "A"), part(moved, "B")])
    with pytest.raises(UserError, match=r"partition 'pa' is in both A and A2"):
        check_parts([part(a, "A"), part(a, "A2")])


def test_merged_config_has_the_parts_partitions_only():
    a, c = study(only_cluster="cpa"), study(only_cluster="cpc")
    cfg = merged_config([part(a, "A"), part(c, "C")])
    assert cfg["only_cluster"] == ""
    assert cfg["select"] == "partition=pa,pc"  # pb (never run) stays out of the run table
    assert {r.partition for r in run_table(cfg)} == {"pa", "pc"}
    assert cfg["results_dir"] == a["results_dir"] == "results"
    # the first part on scratch: the merged study lives in its own directory
    a_scratch = {**copy.deepcopy(a), "results_dir": "/scratch/ws/study-a"}
    assert merged_config([part(a_scratch, "A"), part(c, "C")])["results_dir"] == "results"
    # every cluster merged: no selection needed
    parts = [part(study(only_cluster=f"c{p}"), p) for p in ("pa", "pb", "pc")]
    cfg = merged_config(parts)
    assert cfg["select"] is None
    assert len(run_table(cfg)) == 6
