"""Partitions SLURM does not know are refused before any job is queued (issue 29):
hvdscale.slurm.partitions (unit tests, sinfo faked), and the workflow under the SLURM
executor on the local test cluster (scripts/slurm-cluster.sh) stopping a study whose
partition the cluster lacks, with nothing submitted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from slurm_support import slurm_cluster  # noqa: F401  (fixture)

from hvdscale.slurm.partitions import (
    default_cluster_name,
    dry_run_executor,
    parse_sinfo_partitions,
    slurm_partition_problem,
    unknown_partitions_problem,
)

ROOT = Path(__file__).resolve().parents[1]


def test_sinfo_output_the_default_partition_star_and_cluster_lines():
    text = "haswell*\nalpha\nhaswell*\n\nCLUSTER: taurus\nromeo\n"
    assert parse_sinfo_partitions(text) == (["haswell", "alpha", "romeo"], "haswell")
    assert parse_sinfo_partitions("") == ([], None)


def test_known_partitions_are_no_problem():
    assert unknown_partitions_problem(["alpha", "haswell"], ["haswell", "alpha", "ml"]) is None
    assert unknown_partitions_problem([], []) is None


def test_unknown_partitions_are_named_with_key_files_and_what_sinfo_lists():
    problem = unknown_partitions_problem(
        ["local", "alpha", "gpu9"], ["haswell", "alpha"], "haswell", "config/config.yaml"
    )
    assert problem.startswith("config key scaling.partitions (config files: config/config.yaml)")
    assert "partition(s) 'gpu9', 'local', which SLURM does not know" in problem
    assert "`sinfo` lists 'haswell' (default), 'alpha'" in problem
    assert "No job was submitted." in problem and "'alpha'," not in problem.split("lists")[0]


def _sinfo(stdout: str = "", returncode: int = 0, stderr: str = ""):
    calls = []

    def runner(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, returncode, stdout, stderr)

    return runner, calls


def test_sinfo_is_asked_once_per_cluster():
    runner, calls = _sinfo("local*\n")
    problem = slurm_partition_problem(
        [("local", ""), ("local", ""), ("alpha", "taurus")],
        runner=runner,
        which=lambda name: "/usr/bin/sinfo",
    )
    assert calls == [["sinfo", "-h", "-o", "%P"], ["sinfo", "-h", "-o", "%P", "-M", "taurus"]]
    assert "'alpha', which SLURM of cluster 'taurus' does not know" in problem
    assert "'local', which" not in problem


def test_a_default_partition_with_its_star_is_known():
    runner, _ = _sinfo("local*\nalpha\n")
    assert slurm_partition_problem([("local", "")], runner=runner, which=lambda n: "x") is None


@pytest.mark.parametrize("available", [False, True])
def test_without_a_working_sinfo_a_note_and_no_problem(available):
    notes = []
    runner, calls = _sinfo(returncode=1, stderr="sinfo: error: Unable to contact slurm controller")
    problem = slurm_partition_problem(
        [("local", "")],
        runner=runner,
        which=lambda name: "/usr/bin/sinfo" if available else None,
        note=notes.append,
    )
    assert problem is None and len(notes) == 1 and "\n" not in notes[0]
    if available:
        assert "failed (exit 1: sinfo: error: Unable to contact slurm controller)" in notes[0]
    else:
        assert notes == ["hvdscale: no sinfo on PATH, so the study's partitions were not checked"]
        assert not calls


@pytest.mark.slow
@pytest.mark.slurm
def test_an_unknown_partition_stops_the_slurm_run_before_any_job(slurm_cluster, tmp_path):  # noqa: F811
    """The test cluster has partition local (and alpha when emulated), not 'nosuch': the
    run stops before any job, and so does its dry run (checked while the workflow is
    parsed: no onstart hook runs in a dry run)."""
    results_dir = "results-test-slurmsite-unknown"
    override = _nosuch_override(tmp_path)
    env = {**os.environ, **slurm_cluster}
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=env)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "snakemake", "--profile", "profiles/test-slurm"]
            + ["--configfile", ".test/config/config.yaml", str(override)]
            + ["--config", f"results_dir={results_dir}"],
            cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
    finally:
        shutil.rmtree(ROOT / results_dir, ignore_errors=True)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    assert (
        "the study submits to partition(s) 'nosuch', which SLURM of cluster 'hvdlocal' "
        "does not know" in text
    )
    assert "`sinfo` lists 'local' (default)" in text
    assert "has been submitted with SLURM jobid" not in text and "SLURM sbatch failed" not in text
    after = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=env)
    assert after.stdout.split() == before.stdout.split()
    # a dry run runs no onstart hook: it is checked while the workflow is parsed
    dry = _dry_run(override, results_dir, env)
    text = dry.stdout + dry.stderr
    assert dry.returncode != 0, text[-3000:]
    assert "partition(s) 'nosuch', which SLURM of cluster 'hvdlocal' does not know" in text
    assert "rule train_run" not in text and "Job stats" not in text
    # the same dry run with the local executor submits nothing: not checked
    dry = _dry_run(override, results_dir, env, profile="profiles/local")
    shutil.rmtree(ROOT / results_dir, ignore_errors=True)
    assert dry.returncode == 0, (dry.stdout + dry.stderr)[-3000:]
    assert "which SLURM" not in dry.stdout + dry.stderr


def _dry_run(override: Path, results_dir: str, env: dict, profile: str = "profiles/test-slurm"):
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--profile", profile]
        + ["--configfile", ".test/config/config.yaml", str(override)]
        + ["--config", f"results_dir={results_dir}"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip


def _nosuch_override(tmp_path: Path) -> Path:
    override = tmp_path / "override.yaml"
    part = {"cores_per_node": 2, "mem_mb_per_node": 1000, "workers_per_node": 2}
    sweep = {"name": "s", "partitions": ["nosuch"], "workers": [1], "backends": ["gloo"],
             "batch_sizes": [75], "lr_rules": ["none"]}  # fmt: skip
    cfg = {"scaling": {"partitions": {"nosuch": part}, "sweeps": [sweep]}}
    override.write_text(yaml.safe_dump(cfg))
    return override


def test_a_dry_run_without_sinfo_works_and_says_the_partitions_were_not_checked(tmp_path):
    """A laptop: no sinfo on PATH (every other command of PATH is), the slurm profile's
    dry run plans the study and says in one line that nothing was checked."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAKEMAKE_PROFILE")}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for d in env["PATH"].split(os.pathsep):
        for cmd in Path(d).glob("*") if Path(d).is_dir() else []:
            if cmd.name != "sinfo" and not (bin_dir / cmd.name).exists():
                (bin_dir / cmd.name).symlink_to(cmd)
    env["PATH"] = str(bin_dir)
    assert shutil.which("sinfo", path=env["PATH"]) is None
    results_dir = "results-test-slurmsite-nosinfo"
    try:
        out = _dry_run(_nosuch_override(tmp_path), results_dir, env)
    finally:
        shutil.rmtree(ROOT / results_dir, ignore_errors=True)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "hvdscale: no sinfo on PATH, so the study's partitions were not checked" in text
    assert "rule train_run" in text and "nosuch_gloo_n1_w1" in text


@pytest.mark.parametrize(
    "argv,executor",
    [
        (["--profile", "profiles/slurm", "-n"], "slurm"),
        (["--profile", "profiles/test-slurm", "--dry-run", "--", "x"], "slurm"),
        (["-n", "--executor", "slurm", "--jobs", "1"], "slurm"),
        (["--profile", "profiles/local", "-n"], "local"),
        (["-n"], "local"),
        (["--profile", "profiles/slurm"], None),  # a real run: the onstart hook checks
        (["--no-such-option"], None),
    ],
)
def test_the_dry_run_executor_is_read_from_the_command_line_and_profile(argv, executor):
    cwd = os.getcwd()
    os.chdir(ROOT)  # profiles/ as typed from the project root
    try:
        assert dry_run_executor(argv) == executor
    finally:
        os.chdir(cwd)


def test_an_unknown_partition_of_the_default_cluster_names_the_cluster():
    calls = []

    def runner(argv, **kwargs):
        calls.append(argv)
        text = "local*\n" if argv[0] == "sinfo" else "ClusterName             = taurus\n"
        return subprocess.CompletedProcess(argv, 0, text, "")

    problem = slurm_partition_problem([("alpha", "")], runner=runner, which=lambda n: "x")
    assert calls == [["sinfo", "-h", "-o", "%P"], ["scontrol", "show", "config"]]
    assert "'alpha', which SLURM of cluster 'taurus' does not know" in problem
    assert default_cluster_name(lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "")) == ""
