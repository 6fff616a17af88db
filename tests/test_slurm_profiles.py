"""`snakemake --profile slurm` and `--profile local` work as typed from the project root.

Snakemake looks for a named profile in the current working directory before
$XDG_CONFIG_HOME/snakemake and /etc/xdg/snakemake (`snakemake --help`, --profile), so the
project root carries the links slurm -> profiles/slurm and local -> profiles/local. These
tests run the real Snakemake CLI (a dry run plans the whole default workflow) and ask
Snakemake's own profile lookup which file it picked. No SLURM cluster needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAKEMAKE_PROFILE")}
    env["PYTHONPATH"] = str(ROOT / "src")
    # no SLURM cluster for sinfo, whether the local test cluster is up or not: the dry
    # runs' partition check says "not checked" (tests/test_slurmsite.py checks it)
    env["SLURM_CONF"] = os.devnull
    return env


@pytest.mark.parametrize("name", ["slurm", "local"])
def test_root_link_points_at_the_profile_and_is_tracked(name):
    link = ROOT / name
    assert link.is_symlink() and os.readlink(link) == f"profiles/{name}"
    assert (link / "config.yaml").is_file()
    tracked = subprocess.run(
        ["git", "ls-files", "-s", "--", name], cwd=ROOT, capture_output=True, text=True
    )
    if tracked.returncode == 0 and tracked.stdout:  # a git checkout: a committed symlink
        assert tracked.stdout.startswith("120000 "), tracked.stdout


@pytest.mark.parametrize("name", ["slurm", "local"])
def test_snakemake_resolves_the_profile_name_from_the_root(name):
    code = (
        "import os, sys; from snakemake.cli import get_profile_dir; "
        f"d, f = get_profile_dir({name!r}); print(os.path.realpath(f))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=_env()
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str((ROOT / "profiles" / name / "config.yaml").resolve())


@pytest.mark.parametrize("name", ["slurm", "local"])
def test_dry_run_with_profile_as_typed(name):
    out = subprocess.run(
        [*SNAKEMAKE, "--profile", name, "--dry-run", "--quiet", "rules"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert f"Using profile {name} for setting default command line arguments" in text
    assert "no profile.yaml (or config.yaml) found" not in text
    assert "train_run" in text


def test_job_shapes_of_the_thesis_and_one_array_command_per_shape():
    """Issue 20: the plugin gives an array the first job's resources, so arrays are
    submitted per job shape (hvdscale plan --arrays)."""
    from hvdscale.matrix.runtable import run_table
    from hvdscale.slurm.jobspec import JobSpec
    from hvdscale.study.plan import array_commands, job_shapes, merged_config

    cfg = merged_config([ROOT / "config" / "thesis.yaml"])
    shapes = job_shapes(cfg)
    runs = {r.run_id: r for r in run_table(cfg)}
    scaling = [r for r in runs.values() if not r.kind]
    assert len(runs) - len(scaling) == 3  # the target's calibration runs: single jobs
    assert sum(len(s["runs"]) for s in shapes) == len(scaling) == 690  # 5 repeats
    seen = set()
    for s in shapes:
        res = {str(JobSpec.for_run(cfg, runs[r]).slurm_resources(1)) for r in s["runs"]}
        assert len(res) == 1, s  # one allocation fits every run of the shape
        seen |= res
    assert len(seen) == len(shapes) == 12  # alpha 1-16, hpdlf 1-32 (3 per node)
    commands = array_commands(cfg, ["config/thesis.yaml"])
    assert len(commands) == 12
    assert 'select="partition=alpha workers=16"' in " ".join(commands)
    assert all("--slurm-array-jobs=train_run" in c for c in commands)


def test_thesis_dry_run_through_the_profile_shows_the_arrays():
    out = subprocess.run(
        [*SNAKEMAKE, "--profile", "slurm", "--configfile", "config/thesis.yaml", "-n", "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "arrays: 690 train_run jobs in 12 job shape(s)" in text, text[:3000]
    assert "gpu2" not in text  # K80: out of the sweeps (the pinned TensorFlow cannot run it)
    # one shape, as `hvdscale plan --arrays` prints it: the plugin takes the setting
    out = subprocess.run(
        [
            *SNAKEMAKE,
            "--profile",
            "slurm",
            "--configfile",
            "config/thesis.yaml",
            "--slurm-array-jobs=train_run",
            "--config",
            "select=partition=alpha workers=16",
            "-n",
            "--quiet",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "in 1 job shape(s): one SLURM array per shape is 1 sbatch call(s)" in text, text[:3000]


def test_array_commands_keep_the_rest_of_the_selection():
    from hvdscale.study.plan import array_commands, merged_config

    cfg = merged_config([ROOT / "config" / "thesis.yaml"], "partition=alpha repeat=0 workers=8-")
    commands = array_commands(cfg, ["config/thesis.yaml"])
    assert [c.split("select=")[1].split("  #")[0] for c in commands] == [
        f'"repeat=0 partition=alpha workers={w}"' for w in (8, 16, 32)
    ]
