"""Several clusters, one study (issue 29): two independent SLURM instances (two
slurmctld with their own ports, state, munge and partition) as two clusters, one
Snakemake run per cluster (``--config only_cluster=NAME``, each with that cluster's
SLURM_CONF, as on its login node), then one merged report (``hvdscale merge``) naming
both partitions, each with its own 1-worker baseline. Real SLURM, real training runs.

The instances use their own directories and ports (6931/6932, 6935/6936), not those of
the default test cluster (6917/6918), and are torn down at the end."""

from __future__ import annotations

import contextlib
import csv
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from required_layers import require_layer
from slurm_support import horovod_skip_reason, own_cluster, slurm_skip_reason

from hvdscale.errors import UserError
from hvdscale.study.merge import merge

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.horovod]

# two clusters: (name, partition, node, port, directory)
CLUSTERS = {
    "clustera": ("apart", "anode", 6931, "/tmp/hvd-multicluster-a"),
    "clusterb": ("bpart", "bnode", 6935, "/tmp/hvd-multicluster-b"),
}


def _partition(cluster: str) -> dict:
    return {
        "cores_per_node": 2,
        "mem_mb_per_node": 1500,
        "workers_per_node": 1,
        "runtime_min": 10,
        "cluster": cluster,
    }


# one study, one training run per cluster: 1 worker, absolute target (no calibration run)
STUDY = {
    "data": {"n_samples": 3000, "n_shards": 1, "split_shards": {"train": 1, "val": 1, "test": 1}},
    "training": {
        "launcher": "srun",
        "max_epochs": 2,
        "warmup_epochs": 1,
        "repeats": 1,
        "target": {"mode": "absolute", "value": 10},
    },
    "scaling": {
        "partitions": {part: _partition(name) for name, (part, *_rest) in CLUSTERS.items()},
        "sweeps": [
            {
                "name": "twoclusters",
                "partitions": ["apart", "bpart"],
                "workers": [1],
                "backends": ["gloo"],
                "batch_sizes": [75],
                "lr_rules": ["none"],
            }
        ],
        "tune": None,
    },
}
RUN = "{}_gloo_n1_w1_b75_lrnone_r0"


def squeue_partitions(env: dict[str, str]) -> set[str]:
    out = subprocess.run(
        ["squeue", "--states=all", "-h", "-o", "%P"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


@pytest.fixture
def two_clusters():
    require_layer("slurm", slurm_skip_reason(1))
    require_layer("horovod", horovod_skip_reason())
    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(own_cluster(name, *spec)) for name, spec in CLUSTERS.items()
        }


def test_two_slurm_instances_one_study_per_cluster_one_merged_report(two_clusters, tmp_path):
    envs = two_clusters
    # neither instance sees the other: its own partition, node and cluster name
    for name, (part, node, _port, _dir) in CLUSTERS.items():
        sinfo = subprocess.run(
            ["sinfo", "-h", "-o", "%P %N"], env=envs[name], capture_output=True, text=True
        )
        assert sinfo.stdout.split() == [f"{part}*", node], sinfo.stdout + sinfo.stderr
    # one study per cluster, each in its own working directory (as on its own login node),
    # both at once; the cluster reached through its SLURM_CONF alone
    procs = {}
    for name, (part, *_rest) in CLUSTERS.items():
        work = tmp_path / name
        (work / "config").mkdir(parents=True)
        shutil.copy(ROOT / "config" / "config.yaml", work / "config" / "config.yaml")
        (work / "study.yaml").write_text(yaml.safe_dump(STUDY))
        args = [
            *SNAKEMAKE,
            *("--snakefile", str(ROOT / "Snakefile"), "--directory", str(work)),
            *("--profile", str(ROOT / "profiles" / "test-slurm")),
            *("--default-resources", f"slurm_partition={part}", "mem_mb=1000", "runtime=30"),
            *("--configfile", "config/config.yaml", "study.yaml"),
            *("--config", f"only_cluster={name}"),
            # the run and the validated config (what a merge reads; no per-cluster report)
            *("--", f"results/runs/{RUN.format(part)}/metrics.json", "results/config/full.json"),
        ]
        log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 (closed below)
        procs[name] = (
            subprocess.Popen(args, cwd=work, env=envs[name], stdout=log, stderr=subprocess.STDOUT),
            log,
        )
    deadline = time.monotonic() + 600  # a hang guard, not a tolerance
    for proc, log in procs.values():
        try:
            proc.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    for name, (proc, _log) in procs.items():
        text = (tmp_path / f"{name}.log").read_text()
        assert proc.returncode == 0, f"{name}:\n{text[-5000:]}"
        assert "--clusters" not in text, f"{name}: sbatch got --clusters:\n{text[-3000:]}"
    # each cluster ran its own partition's jobs only, and sees none of the other's
    assert squeue_partitions(envs["clustera"]) == {"apart"}
    assert squeue_partitions(envs["clusterb"]) == {"bpart"}
    results = {name: tmp_path / name / "results" for name in CLUSTERS}
    for name, (part, *_rest) in CLUSTERS.items():
        runs = sorted(p.name for p in (results[name] / "runs").iterdir())
        assert runs == [RUN.format(part)], (name, runs)
        rec = json.loads((results[name] / "runs" / runs[0] / "metrics.json").read_text())
        assert rec["environment"]["slurm_job_id"], rec["environment"]
        full = json.loads((results[name] / "config" / "full.json").read_text())
        assert full["only_cluster"] == name

    # one merged report (what `make report FROM="a b"` runs)
    out = tmp_path / "merged"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hvdscale.cli",
            "merge",
            str(results["clustera"]),
            str(results["clusterb"]),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out / "results" / "scaling" / "summary.csv", newline="") as fh:
        summary = list(csv.DictReader(fh))
    # both partitions, each against its own 1-worker baseline
    assert sorted(r["partition"] for r in summary) == ["apart", "bpart"], summary
    for row in summary:
        assert row["has_baseline"].lower() in ("true", "1"), row
        assert float(row["speedup"]) == 1.0, row
    with open(out / "results" / "scaling" / "status.csv", newline="") as fh:
        status = {r["run_id"]: r["status"] for r in csv.DictReader(fh)}
    assert status == {RUN.format("apart"): "completed", RUN.format("bpart"): "completed"}
    text = subprocess.run(
        ["pdftotext", "-layout", str(out / "results" / "report.pdf"), "-"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "apart" in text and "bpart" in text
    # the provenance names each part: its partitions, cluster and results directory
    for i, (name, (part, *_rest)) in enumerate(CLUSTERS.items(), 1):
        assert re.search(rf"part {i}\.partitions\s+{part}\n", text), text[:3000]
        assert re.search(rf"part {i}\.cluster\s+{name}\n", text), text[:3000]
    merged_from = json.loads((out / "results" / "config" / "merged_from.json").read_text())
    assert [v["source"] for v in merged_from.values()] == [
        f"{results[name]} (results directory)" for name in CLUSTERS
    ]

    # refused: a part twice (overlapping partitions), configs that differ beyond partitions
    with pytest.raises(UserError, match="partition 'apart' is in both"):
        merge([results["clustera"], results["clustera"]], tmp_path / "m2")
    other = tmp_path / "other"
    shutil.copytree(results["clusterb"], other)
    full = json.loads((other / "config" / "full.json").read_text())
    full["training"]["max_epochs"] = 3
    (other / "config" / "full.json").write_text(json.dumps(full))
    with pytest.raises(UserError, match="config key training.max_epochs"):
        merge([results["clustera"], other], tmp_path / "m3")
