"""One home for the constants and small helpers every stage shares.

Group keys of a scaling group, the exit status of a run that diverged, the pattern of
an allreduce-sweep id, and the project's git commit live here, so aggregation, report,
launcher and training agree by construction.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

# A scaling group: runs that differ only in the number of workers (and the repeat).
GROUP_KEYS = ["partition", "backend", "batch_per_worker", "lr_rule"]
CONFIG_KEYS = GROUP_KEYS + ["workers"]

# Exit status of a training run whose loss became NaN/inf (a result, not a crash).
EXIT_NAN = 3

# allreduce sweep id: {partition}_{backend}_n{nodes}_w{workers}
ALLREDUCE_ID_PATTERN = (
    r"(?P<partition>[a-z][a-z0-9-]{0,31})_(?P<backend>nccl|mpi|gloo)_n(?P<nodes>[0-9]+)"
    r"_w(?P<workers>[0-9]+)"
)
ALLREDUCE_ID = re.compile(ALLREDUCE_ID_PATTERN)
# the same without named groups (Snakemake wildcard constraints)
ALLREDUCE_ID_WILDCARD = re.sub(r"\(\?P<\w+>", "(?:", ALLREDUCE_ID_PATTERN)


def git_commit(root: str | Path | None = None) -> str:
    """HEAD commit of the project, '+dirty' if tracked files differ; 'unknown' without git."""
    if root is None:
        from hvdscale.config import PROJECT_ROOT

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
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + ("+dirty" if dirty else "")) if head else "unknown"
