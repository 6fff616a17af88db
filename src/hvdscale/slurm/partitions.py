"""Partitions of the study that the SLURM cluster does not know, found before any job is
queued (issue 29: the default config names a partition ``local``; under ``--profile
slurm`` on a real cluster every training job would be refused by sbatch, one by one).

``unknown_partitions_problem`` is pure (the partitions the run table uses against the
names ``sinfo`` printed); ``slurm_partition_problem`` asks ``sinfo`` and is what the
workflow calls (Snakefile, ``onstart``: the executor is known only once the workflow is
parsed; the per-job re-runs inside SLURM jobs are not checked). Snakemake runs no
``onstart`` in a dry run, so a dry run is checked while the workflow is parsed, when its
command line (``dry_run_executor``: profile included) names the slurm executor. Without
a working ``sinfo`` (a laptop) the check says so in one line and lets the run go on.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable

SINFO_FORMAT = "%P"  # partition name, the default partition with a trailing '*'


def parse_sinfo_partitions(text: str) -> tuple[list[str], str | None]:
    """The partition names of ``sinfo -h -o %P`` output, in order and each once, and the
    default partition (the one sinfo marks with '*'; None when none is marked). Lines of
    ``-M`` output naming the cluster (``CLUSTER: name``) are skipped."""
    names: list[str] = []
    default = None
    for line in text.splitlines():
        name = line.strip()
        if not name or name.startswith("CLUSTER:"):
            continue
        if name.endswith("*"):
            name = name.rstrip("*")
            default = default or name
        if name and name not in names:
            names.append(name)
    return names, default


def unknown_partitions_problem(
    used: Iterable[str],
    known: Iterable[str],
    default: str | None = None,
    config_files: str = "",
    cluster: str = "",
) -> str | None:
    """The problem text when partitions the study uses are not among those sinfo knows
    (naming them, the config key and files, and the partitions sinfo lists); None when
    every one is known."""
    known = list(known)
    unknown = sorted(set(used) - set(known))
    if not unknown:
        return None
    where = f" of cluster {cluster!r}" if cluster else ""
    listed = ", ".join(f"{p!r}" + (" (default)" if p == default else "") for p in known)
    files = f" (config files: {config_files})" if config_files else ""
    names = ", ".join(map(repr, unknown))
    return (
        f"config key scaling.partitions{files}: the study submits to partition(s) {names}, "
        f"which SLURM{where} does not know; `sinfo` lists {listed or 'no partition'}. "
        "Name the partitions of this cluster under scaling.partitions and in the sweeps "
        "(a site config, e.g. --configfile config/thesis.yaml for Taurus). "
        "No job was submitted."
    )


Runner = Callable[..., subprocess.CompletedProcess]


def dry_run_executor(argv: list[str] | None = None) -> str | None:
    """The executor of a ``snakemake --dry-run`` command line (``argv``: sys.argv[1:] of
    the Snakemake process), its profiles included, as Snakemake's own parser reads it;
    None when it is no dry run or cannot be read (Snakemake called through its API)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        from snakemake.cli import parse_args  # reason: the workflow env only, when asked

        quiet = io.StringIO()  # it prints "Using profile ..." once more
        with contextlib.redirect_stderr(quiet), contextlib.redirect_stdout(quiet):
            _parser, args = parse_args(argv)
    except (Exception, SystemExit):
        return None
    if not getattr(args, "dryrun", False):
        return None
    return getattr(args, "executor", None) or "local"


def default_cluster_name(runner: Runner = subprocess.run) -> str:
    """ClusterName of the SLURM cluster the client commands reach (``scontrol show
    config``), "" when it cannot be read."""
    try:
        out = runner(["scontrol", "show", "config"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    m = re.search(r"^ClusterName\s*=\s*(\S+)", out.stdout or "", re.M)
    return m.group(1) if out.returncode == 0 and m else ""


def slurm_partition_problem(
    partitions: Iterable[tuple[str, str]],
    config_files: str = "",
    runner: Runner = subprocess.run,
    which: Callable[[str], str | None] = shutil.which,
    note: Callable[[str], None] = lambda text: print(text, file=sys.stderr),
) -> str | None:
    """Ask ``sinfo`` (once per SLURM cluster) whether it knows the (partition, cluster)
    pairs of the study's jobs (cluster "" for the default one). Without sinfo, or when
    it fails, a one-line note and no problem: sbatch would say the same per job."""
    by_cluster: dict[str, set[str]] = {}
    for partition, cluster in partitions:
        by_cluster.setdefault(cluster or "", set()).add(partition)
    if not by_cluster:
        return None
    if which("sinfo") is None:
        note("hvdscale: no sinfo on PATH, so the study's partitions were not checked")
        return None
    problems = []
    for cluster, used in sorted(by_cluster.items()):
        argv = ["sinfo", "-h", "-o", SINFO_FORMAT] + (["-M", cluster] if cluster else [])
        try:
            out = runner(argv, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            note(f"hvdscale: {' '.join(argv)} failed ({exc}); partitions not checked")
            continue
        if out.returncode != 0:
            why = (out.stderr or out.stdout).strip().splitlines()
            note(
                f"hvdscale: {' '.join(argv)} failed (exit {out.returncode}"
                f"{': ' + why[-1] if why else ''}); partitions not checked"
            )
            continue
        known, default = parse_sinfo_partitions(out.stdout)
        problem = unknown_partitions_problem(used, known, default, config_files, cluster)
        if problem and not cluster:  # name the cluster sinfo asked (its ClusterName)
            name = default_cluster_name(runner)
            if name:
                problem = unknown_partitions_problem(used, known, default, config_files, name)
        if problem:
            problems.append(problem)
    return "\n".join(problems) or None
