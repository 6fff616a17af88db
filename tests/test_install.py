"""hvdscale from a regular (non-editable) install: the package finds the project (its
schemas, captions and train env) through HVDSCALE_ROOT or the current directory, as
Snakemake's jobs run it; and the resolution order of the project root (unit tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvdscale.project import ROOT_ENV, find_project_root

ROOT = Path(__file__).resolve().parents[1]


def test_project_root_resolution_order(tmp_path, monkeypatch):
    other = tmp_path / "other"
    (other / "workflow" / "schemas").mkdir(parents=True)
    (other / "workflow" / "schemas" / "config.schema.yaml").write_text("{}")
    # the environment variable wins
    assert find_project_root(env={ROOT_ENV: str(other)}, cwd=ROOT) == other.resolve()
    # then the source tree the package was imported from (here: src/ of this checkout)
    assert find_project_root(env={}, cwd=other) == ROOT
    # then the current directory or one of its parents (a regular install)
    sub = other / "config"
    sub.mkdir()
    assert find_project_root(env={}, cwd=sub, source=tmp_path / "site") == other.resolve()
    # nothing found: the source-tree guess (errors then name the missing schema file)
    assert find_project_root(env={}, cwd=tmp_path, source=tmp_path / "site") == tmp_path / "site"


@pytest.mark.slow
def test_regular_install_finds_the_project(tmp_path):
    # build a wheel from a copy (an in-tree build would leave build/ and egg-info here)
    proj = tmp_path / "proj"
    proj.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, proj / name)
    shutil.copytree(ROOT / "src", proj / "src", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", tmp_path / "whl", proj], check=True)
    wheel = next((tmp_path / "whl").glob("hvdscale-*.whl"))
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", site, wheel], check=True)

    env = {k: v for k, v in os.environ.items() if k not in (ROOT_ENV, "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    probe = (
        "import hvdscale, hvdscale.config.load as c; print(hvdscale.__file__); "
        "print(c.PROJECT_ROOT)"
    )

    def where(cwd, **extra):
        out = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=cwd,
            env={**env, **extra},
            capture_output=True,
            text=True,
            check=True,
        )
        module, root = out.stdout.split()
        assert Path(module).is_relative_to(site)  # the installed copy, not src/
        return Path(root)

    assert where(ROOT / "config") == ROOT  # Snakemake runs jobs in the project directory
    assert where(tmp_path, HVDSCALE_ROOT=str(ROOT)) == ROOT  # anywhere else: the variable
    # the CLI validates against the project's schema from outside the project
    out = subprocess.run(
        [sys.executable, "-m", "hvdscale.cli", "check-config", ROOT / "config" / "config.yaml"],
        cwd=tmp_path,
        env={**env, ROOT_ENV: str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
