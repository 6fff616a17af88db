"""The Snakemake workflow: lint clean, dry runs plan the expected jobs, bad configs
stop Snakemake with a readable message."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def snakemake(*args, cwd=ROOT):
    # SLURM_CONF: no SLURM cluster for sinfo, whether the local test cluster is up or not:
    # a dry run with the slurm profile then says its partitions were not checked
    # (tests/test_slurmsite.py checks them against the test cluster)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SLURM_CONF": os.devnull}
    return subprocess.run(
        [*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300
    )


def test_lint_is_clean():
    out = snakemake("--lint")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Congratulations" in out.stdout + out.stderr


def _job_count(text: str, rule: str) -> int | None:
    for line in text.splitlines():
        if line.split()[:1] == [rule] and len(line.split()) == 2 and line.split()[1].isdigit():
            return int(line.split()[1])
    return None


CAL_IDS = [f"local_mpi_n1_w1_b75_lrlinear_cal_r{k}" for k in range(3)]


def test_dry_run_default_config(tmp_path):
    out = snakemake("-n", "-p", "--config", "results_dir=results-dryrun-test")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    for rule, count in [
        ("generate_shard", 2),
        ("validate_shard", 2),
        ("split_dataset", 1),
        ("write_target_config", 1),
        ("calibrate_target", 1),
        # 3 calibration runs, 22 scaling runs, 6 tuning candidates; the 10 re-runs of
        # the selected candidates join after the checkpoint
        ("train_run", 31),
        ("select_tuned", 1),
        ("write_allreduce_config", 2),  # mpi and gloo, 2 workers
        ("measure_allreduce", 2),
        ("aggregate_runs", 1),
        ("tabulate_systems", 1),
        ("build_report", 1),
    ]:
        assert _job_count(text, rule) == count, (rule, text[-3000:])
    assert "checkpoint" in text.lower()
    assert "results-dryrun-test/data/val/shard-0001.h5" in text
    launches = [line for line in text.splitlines() if "hvdscale.cli launch " in line]
    launches = [line for line in launches if "--run-id " in line]  # not measure_allreduce
    assert len(launches) == 31
    for line in launches:
        # every run but a calibration run trains to the target calibrate_target writes
        is_cal = any(f"--run-id {rid} " in line for rid in CAL_IDS)
        assert ("--target results-dryrun-test/scaling/target.json" in line) != is_cal, line
    cal = [line for line in text.splitlines() if "calibrate-target " in line]
    assert len(cal) == 1 and all(f"runs/{rid}/metrics.json" in cal[0] for rid in CAL_IDS)
    assert "results-dryrun-test/config/target.json" in cal[0]


def test_dry_run_of_a_rerun_plans_its_training_job():
    """A re-run of a selected candidate (what the checkpoint requests) is an ordinary
    train_run job: its config slice, its target, its job layout."""
    rid = "local_mpi_n1_w2_b1000_lrlinear_m2_wu1_rerun_r4"
    out = snakemake(
        "-n",
        "-p",
        "--config",
        "results_dir=results-dryrun-test",
        "--",
        f"results-dryrun-test/runs/{rid}/metrics.json",
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    launch = [
        line
        for line in text.splitlines()
        if f"launch --config results-dryrun-test/runs/{rid}/" in line
    ]
    assert len(launch) == 1 and "--target results-dryrun-test/scaling/target.json" in launch[0]
    # the target comes first: the calibration runs and calibrate_target are planned
    assert _job_count(text, "calibrate_target") == 1 and _job_count(text, "train_run") == 4


def test_dry_run_test_config_plans_calibration():
    out = snakemake(
        "-n",
        "-p",
        "--configfile",
        ".test/config/config.yaml",
        "--config",
        "results_dir=results-dryrun-test",
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    # 4 scaling runs and 1 calibration run, no tuning sweep
    assert _job_count(text, "train_run") == 5
    assert _job_count(text, "calibrate_target") == 1
    # no tuning sweep: no selection to make (tuned.csv, empty, comes from aggregate_runs)
    assert _job_count(text, "select_tuned") is None
    assert _job_count(text, "aggregate_runs") == 1
    runs = [
        line for line in text.splitlines() if "hvdscale.cli launch" in line and "--run-id" in line
    ]
    assert len(runs) == 5 and not any("_wu" in line for line in runs)
    assert "local_gloo_n1_w1_b75_lrnone_cal_r0" in text


def test_dry_run_thesis_config_plans_every_run_and_none_on_gpu2():
    out = snakemake("-n", "--profile", "profiles/slurm", "--configfile", "config/thesis.yaml")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert _job_count(text, "train_run") == 693  # 690 scaling runs + 3 calibration runs
    assert _job_count(text, "generate_shard") == 16
    # gpu2 (K80) is out of the sweeps: the pinned TensorFlow cannot run it
    assert "gpu2_" not in text and "gpu2:" not in text


def test_a_sweep_over_a_k80_partition_is_refused_before_any_job(tmp_path):
    overlay = tmp_path / "gpu2.yaml"
    overlay.write_text(
        "scaling:\n  sweeps:\n    - name: workers\n      partitions: [alpha, gpu2]\n"
        "      workers: [1, 2]\n      backends: [nccl]\n      batch_sizes: [75]\n"
        "      lr_rules: [none]\n"
    )
    out = snakemake("-n", "--configfile", "config/thesis.yaml", str(overlay))
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    assert "config key scaling.partitions.gpu2.gpu_model: K80 has compute capability 3.7" in text
    assert "TensorFlow 2.15.1 (CUDA 12) needs >= 5.0" in text
    assert "CUDA-11 TensorFlow" in text and "env-modules" in text
    assert _job_count(text, "train_run") is None  # nothing planned


FAKE_CONDA = """#!/bin/sh
# stands in for conda in a dry run: Snakemake only asks these three questions
case "$*" in
  "info --json") echo '{"conda_prefix": "/nonexistent/conda", "platform": "linux-64"}' ;;
  "--version") echo "conda 24.9.2" ;;
  "config --get channel_priority --json") echo '{"get": {"channel_priority": "strict"}}' ;;
  *) exit 1 ;;
esac
"""


def test_sdm_conda_runs_the_cli_of_the_rules_conda_env(tmp_path):
    """With --sdm conda the workflow-env rules run `python` of their conda env (the
    `conda:` directive is real); `hvdscale launch` stays in Snakemake's env, its ranks
    get the train env."""
    (tmp_path / "conda").write_text(FAKE_CONDA)
    (tmp_path / "conda").chmod(0o755)
    conda_cfg = tmp_path / "conda.yaml"  # --sdm conda needs deployment conda (issue 29)
    conda_cfg.write_text("environment:\n  deployment: conda\n")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
    out = subprocess.run(
        [*SNAKEMAKE, "-n", "-p", "--sdm", "conda", "--configfile", str(conda_cfg)]
        + ["--config", "results_dir=results-dryrun-test"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    commands = [line for line in text.splitlines() if "-m hvdscale.cli" in line]
    # the env does not install hvdscale (no relative -e in a copied env file): the rules
    # put this checkout's src on PYTHONPATH
    src = f"PYTHONPATH={ROOT / 'src'}${{PYTHONPATH:+:$PYTHONPATH}}"
    for command in ("write-config", "generate-shard", "split-dataset", "aggregate", "report"):
        assert f"Shell command: {src} python -m hvdscale.cli {command} " in text, command
    launches = [c for c in commands if "hvdscale.cli launch " in c]
    assert launches and all(c.startswith("Shell command: /") for c in launches)


def test_bad_config_stops_snakemake_with_readable_message(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  launcher: ssh\n")
    out = snakemake("-n", "--configfile", str(bad))
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "training.launcher" in text and "'ssh'" in text


def test_deployment_that_disagrees_with_sdm_stops_the_dry_run(tmp_path):
    """environment.deployment env-modules without --sdm env-modules: Snakemake would
    ignore the envmodules directive and the ranks would run the login shell's python.
    Refused at parse time, naming the key, its value and the flags."""
    cfg = tmp_path / "modules.yaml"
    cfg.write_text("environment:\n  deployment: env-modules\n  modules: [OpenMPI/4.1.4]\n")
    out = snakemake("-n", "--configfile", str(cfg), "--config", "results_dir=results-dryrun-test")
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "environment.deployment is 'env-modules' but Snakemake runs with no --sdm" in text
    assert "Add `--sdm env-modules`" in text
    assert "Job stats" not in text and "rule train_run" not in text
    ok = snakemake(
        "-n", "--sdm", "env-modules", "--configfile", str(cfg),
        "--config", "results_dir=results-dryrun-test",
    )  # fmt: skip
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]


@pytest.mark.parametrize(
    "override",
    [
        "scaling:\n  partitions:\n    'x;touch PWNED':\n"
        "      cores_per_node: 2\n      mem_mb_per_node: 100\n",
        "scaling:\n  partitions:\n    local:\n"
        '      cores_per_node: 2\n      mem_mb_per_node: 100\n      account: "$(touch PWNED)"\n',
        "environment:\n  deployment: env-modules\n"
        '  modules: ["TensorFlow/2.15.1 && touch PWNED"]\n',
    ],
)
def test_crafted_values_are_refused_at_validation(tmp_path, override):
    """A crafted partition, account or module name stops the workflow at validation,
    before any job (sbatch, srun, module load) is planned: no job, no file written."""
    bad = tmp_path / "crafted.yaml"
    bad.write_text(override)
    out = snakemake("-n", "--profile", "profiles/slurm", "--configfile", str(bad), cwd=ROOT)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "pattern" in text or "matching" in text
    assert "Job stats" not in text and "rule train_run" not in text
    assert not (ROOT / "PWNED").exists() and not (tmp_path / "PWNED").exists()


def test_site_values_that_pass_validation_reach_the_planned_sbatch_resources(tmp_path):
    """The other side of the check above: a partition and an account the schema accepts
    reach every planned training job's SLURM resources (the plugin's sbatch flags)
    unchanged, and the run ids carry the partition."""
    ok = tmp_path / "site.yaml"
    ok.write_text(
        "scaling:\n  partitions:\n    alpha-2:\n      cores_per_node: 2\n"
        "      mem_mb_per_node: 100\n      account: p-123_x\n"
        "  sweeps:\n  - {name: s, partitions: [alpha-2], workers: [1, 2], backends: [mpi],\n"
        "     batch_sizes: [75], lr_rules: [none]}\n  tune: null\n"
    )
    out = snakemake("-n", "--profile", "profiles/slurm", "--configfile", str(ok), cwd=ROOT)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    jobs = text.split("rule train_run:")[1:]
    assert jobs, text[-3000:]
    for job in jobs:
        resources = next(ln for ln in job.splitlines() if ln.strip().startswith("resources:"))
        assert "slurm_partition=alpha-2," in resources and "slurm_account=p-123_x," in resources
        assert "run_id=alpha-2_mpi_n" in job
