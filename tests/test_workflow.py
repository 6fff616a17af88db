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
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300
    )


def test_lint_is_clean():
    out = snakemake("--lint")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Congratulations" in out.stdout + out.stderr


def test_dry_run_default_config(tmp_path):
    out = snakemake("-n", "--config", "results_dir=results-dryrun-test")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    for rule, count in [
        ("generate_shard", 4),
        ("validate_shard", 4),
        ("split_dataset", 1),
        ("train_run", 4),
        ("write_allreduce_config", 2),
        ("measure_allreduce", 2),
        ("aggregate_runs", 1),
        ("tabulate_systems", 1),
        ("build_report", 1),
    ]:
        assert any(line.split()[:2] == [rule, str(count)] for line in text.splitlines()), (
            rule,
            text,
        )


def test_dry_run_thesis_config_plans_every_run():
    out = snakemake("-n", "--configfile", "config/thesis.yaml")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert any(line.split()[:2] == ["train_run", "576"] for line in text.splitlines())
    assert any(line.split()[:2] == ["generate_shard", "16"] for line in text.splitlines())


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
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
    out = subprocess.run(
        [*SNAKEMAKE, "-n", "-p", "--sdm", "conda", "--config", "results_dir=results-dryrun-test"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    commands = [line for line in text.splitlines() if "-m hvdscale.cli" in line]
    for command in ("write-config", "generate-shard", "split-dataset", "aggregate", "report"):
        assert f"Shell command: python -m hvdscale.cli {command} " in text, command
    launches = [c for c in commands if "hvdscale.cli launch " in c]
    assert launches and all(c.startswith("Shell command: /") for c in launches)


def test_bad_config_stops_snakemake_with_readable_message(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  launcher: ssh\n")
    out = snakemake("-n", "--configfile", str(bad))
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "training.launcher" in text and "'ssh'" in text


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
def test_crafted_values_never_reach_sbatch_or_srun(tmp_path, override):
    """A crafted partition, account or module name stops the workflow at validation,
    before any job (sbatch, srun, module load) could see it."""
    bad = tmp_path / "crafted.yaml"
    bad.write_text(override)
    out = snakemake("-n", "--profile", "profiles/slurm", "--configfile", str(bad), cwd=ROOT)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "pattern" in text or "matching" in text
    assert "sbatch" not in text.lower() or "Job stats" not in text
    assert not (ROOT / "PWNED").exists() and not (tmp_path / "PWNED").exists()
