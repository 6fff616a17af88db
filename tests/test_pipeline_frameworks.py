"""Both frameworks through the local pipeline (issue 19): the tiny test config with the
overlay .test/config/frameworks.yaml trains Horovod-TF and torch-ddp runs (Gloo, 1 and 2
workers) through the same rules, JobSpec and profile, to valid run records and the
aggregated tables; and a 2-rank torch-ddp run through the SLURM executor plugin on the
local test cluster (scripts/slurm-cluster.sh). Real Snakemake, horovodrun, torchrun,
sbatch and srun."""

from __future__ import annotations

import csv
import os
import subprocess

import pytest
import yaml
from required_layers import require_layer
from slurm_support import horovod_skip_reason, slurm_cluster  # noqa: F401  (fixture)
from test_pipeline import ROOT, read_status, records, results_dir, snakemake  # noqa: F401
from test_torch_ddp import needs_torch

from hvdscale.record.build import validate_record

pytestmark = [pytest.mark.slow, pytest.mark.horovod, needs_torch]

OVERLAY = ".test/config/frameworks.yaml"
HOROVOD_IDS = ["local_gloo_n1_w1_b75_lrnone_r0", "local_gloo_n1_w2_b75_lrnone_r0"]
TORCH_IDS = ["local_torch-ddp_gloo_n1_w1_b75_lrnone_r0", "local_torch-ddp_gloo_n1_w2_b75_lrnone_r0"]


@pytest.fixture(autouse=True)
def _needs_horovod():
    require_layer("horovod", horovod_skip_reason())


def test_local_pipeline_trains_both_frameworks_to_records_and_summary(results_dir):
    summary = f"{results_dir}/scaling/summary.csv"
    args = ["--profile", "profiles/local", "--configfile", ".test/config/config.yaml", OVERLAY]
    out = snakemake([*args, "--config", f"results_dir={results_dir}", "--", summary])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    recs = records(results_dir)
    assert sorted(recs) == sorted(HOROVOD_IDS + TORCH_IDS)
    for rid, rec in recs.items():
        validate_record(rec)  # the run schema
        torch = rid in TORCH_IDS
        cfg = rec["config"]
        assert rec["status"] == "completed" and rec["label_proof"]["ok"], rid
        assert cfg["framework"] == ("torch-ddp" if torch else "horovod-tf"), rid
        assert cfg["launcher"] == ("torchrun" if torch else "horovodrun"), rid
        assert cfg["backend"] == "gloo" == cfg["controller"]
        assert cfg["gloo_epoll_yield"] is True, rid  # both frameworks' Gloo ranks had it
        assert (
            rec["environment"]["hostnames"]
            and len(rec["environment"]["hostnames"]) == (cfg["workers"])
        )
        if torch:
            assert rec["label_proof"]["process_group_backend"] == "gloo"
            assert rec["environment"]["tensorflow"] == "none"
    # both frameworks share the seeds of a repeat (a paired design)
    seeds = {rec["config"]["seed"] for rec in recs.values()}
    assert len(seeds) == 1
    # the same rules: every run went through train_run with its log and benchmark
    for rid in HOROVOD_IDS + TORCH_IDS:
        assert (ROOT / results_dir / "logs" / "train_run" / f"{rid}.log").is_file()
        assert (ROOT / results_dir / "benchmarks" / "train_run" / f"{rid}.tsv").is_file()
    assert set(read_status(results_dir).values()) == {"completed"}
    with open(ROOT / summary) as fh:
        rows = list(csv.DictReader(fh))
    assert rows and {r["backend"] for r in rows} == {"gloo"}
    if "framework" in rows[0]:  # the tables' framework column (aggregation, issue 19)
        assert {r["framework"] for r in rows} == {"horovod-tf", "torch-ddp"}
        two = [r for r in rows if r["workers"] == "2"]
        assert len(two) == 2 and all(float(r["speedup"]) > 0 for r in two)


# --------------------------------------------------------------------------- real SLURM

# the partition's site sbatch flags (issue 29) reach the training job: scontrol shows them
SITE_FLAGS = "--mail-type=FAIL --mail-user=hvdscale-site-flag@example.invalid"

TORCH_ONLY = {
    "training": {"launcher": "srun"},
    "scaling": {
        "partitions": {"local": {"sbatch_flags": SITE_FLAGS}},
        "sweeps": [
            {
                "name": "torch",
                "frameworks": ["torch-ddp"],
                "partitions": ["local"],
                "workers": [1, 2],
                "backends": ["gloo"],
                "batch_sizes": [75],
                "lr_rules": ["none"],
            }
        ],
    },
}


@pytest.mark.slurm
def test_torch_runs_of_1_and_2_ranks_through_the_slurm_plugin(slurm_cluster, results_dir, tmp_path):  # noqa: F811
    """The executor plugin submits the run as one 2-task job (the same JobSpec as a
    Horovod run); inside it `hvdscale launch` starts one srun task per rank, which join
    torch.distributed's rendezvous on the job's first host. The 1-rank run is a plain
    job whose rank runs in the plugin's own job step (issue 29)."""
    rid = TORCH_IDS[1]
    override = tmp_path / "torch.yaml"
    override.write_text(yaml.safe_dump(TORCH_ONLY))
    args = ["--profile", "profiles/test-slurm", "--configfile", ".test/config/config.yaml"]
    args += [OVERLAY, str(override), "--config", f"results_dir={results_dir}"]
    targets = [f"{results_dir}/runs/{r}/metrics.json" for r in TORCH_IDS]
    out = snakemake([*args, "--", *targets], env=dict(slurm_cluster))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # the 1-rank run (issue 29): no srun, the rank in the plugin's job step (its one task)
    one = records(results_dir)[TORCH_IDS[0]]
    validate_record(one)
    assert one["status"] == "completed" and one["config"]["launcher"] == "srun"
    assert one["label_proof"]["ok"] and one["label_proof"]["process_group_world_size"] == 1
    log = (ROOT / results_dir / "logs" / "train_run" / f"{TORCH_IDS[0]}.log").read_text()
    step = f"{one['environment']['slurm_job_id']}.0"
    assert f"rank 0 runs as a child of this launcher in SLURM job step {step}" in log, log
    assert "srun --mpi" not in log and "exec --framework torch-ddp --rank 0" in log
    rec = records(results_dir)[rid]
    validate_record(rec)
    cfg, env = rec["config"], rec["environment"]
    assert rec["status"] == "completed" and cfg["framework"] == "torch-ddp"
    assert cfg["launcher"] == "srun" and cfg["workers"] == 2
    proof = rec["label_proof"]
    assert proof["ok"] and proof["process_group_backend"] == "gloo", proof
    assert proof["process_group_world_size"] == 2 == len(env["hostnames"])
    assert cfg["gloo_epoll_yield"] is True  # srun passed LD_PRELOAD to the ranks
    assert env["slurm_job_id"] and env["slurm_nodelist"]
    show = subprocess.run(
        ["scontrol", "show", "job", env["slurm_job_id"]],
        capture_output=True,
        text=True,
        env={**os.environ, **slurm_cluster},
    ).stdout
    assert "JobState=COMPLETED" in show and "NumTasks=2" in show and rid in show
    assert "MailUser=hvdscale-site-flag@example.invalid" in show, show
    assert "MailType=FAIL" in show, show
    log = (ROOT / results_dir / "logs" / "train_run" / f"{rid}.log").read_text()
    assert "srun --mpi=none" in log and "exec --framework torch-ddp" in log
    assert "torch.distributed.run" not in log and "MASTER_PORT=" in log
