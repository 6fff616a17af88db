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
