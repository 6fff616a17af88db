"""The project: its root (the checkout with the Snakefile and the schemas) and its git
commit, for every stage that names a project file or records where a result came from.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

# The project checkout (Snakefile, workflow/schemas, workflow/report, the venvs).
ROOT_ENV = "HVDSCALE_ROOT"
_ROOT_MARKER = Path("workflow") / "schemas" / "config.schema.yaml"
_SOURCE_ROOT = Path(__file__).resolve().parents[2]  # src/hvdscale/project.py -> checkout


def find_project_root(
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    source: str | Path | None = None,
) -> Path:
    """The project root, for an editable and a regular (wheel) install alike:

    1. ``$HVDSCALE_ROOT`` (the workflow sets it to the Snakefile's directory for its jobs);
    2. the source tree the package was imported from (editable install, PYTHONPATH=src);
    3. the current directory or one of its parents (Snakemake runs jobs in the
       Snakefile's directory);

    each recognised by ``workflow/schemas/config.schema.yaml``. When none has it, the
    source-tree guess is returned, and opening a schema names the missing file.
    """
    env = os.environ if env is None else env
    if env.get(ROOT_ENV):
        return Path(env[ROOT_ENV]).expanduser().resolve()
    source = _SOURCE_ROOT if source is None else Path(source)
    if (source / _ROOT_MARKER).is_file():
        return source
    start = Path.cwd() if cwd is None else Path(cwd).resolve()
    for d in (start, *start.parents):
        if (d / _ROOT_MARKER).is_file():
            return d
    return source


PROJECT_ROOT = find_project_root()


def git_commit(root: str | Path | None = None, ignore: tuple[str, ...] = ()) -> str:
    """HEAD commit of the project, '+dirty' if tracked files differ (except the paths in
    ``ignore``: a benchmark's own results); 'unknown' without git."""
    if root is None:
        root = PROJECT_ROOT
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "."]
            + [f":(exclude){p}" for p in ignore],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+dirty" if dirty else "")) if head else "unknown"
