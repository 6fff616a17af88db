"""Provenance for the report: git commit, config file and hash, package versions of
the workflow env (importlib.metadata) and of the train env (run records, optional
provenance JSON), hosts and hardware, dates (from the inputs, never the clock)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path

import pandas as pd

from hvdscale.analysis.columns import ENV_VERSIONS
from hvdscale.config.load import config_hash
from hvdscale.errors import UserError
from hvdscale.matrix.backends import is_gpu_partition
from hvdscale.project import git_commit

WORKFLOW_PACKAGES = [
    "hvdscale",
    "snakemake",
    "snakemake-executor-plugin-slurm",
    "pandas",
    "pandera",
    "numpy",
    "matplotlib",
    "reportlab",
    "jsonschema",
    "h5py",
    "PyYAML",
]
TRAIN_COLUMNS = ENV_VERSIONS


def file_sha256(path: str | Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def workflow_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in WORKFLOW_PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _counted(values: pd.Series) -> str:
    vc = values.dropna().astype(str).value_counts()
    if vc.empty:
        return "-"
    if len(vc) == 1:
        return vc.index[0]
    return "; ".join(f"{v} ({n} runs)" for v, n in vc.items())


def train_versions(runs: pd.DataFrame) -> dict[str, str]:
    if runs is None or runs.empty:
        return {}
    return {c: _counted(runs[c]) for c in TRAIN_COLUMNS if c in runs}


def flatten(d, prefix: str = "", depth: int = 3) -> dict[str, str]:
    """Nested provenance JSON -> {'a.b': 'value'} for a two-column table."""
    out: dict[str, str] = {}
    if isinstance(d, dict) and depth > 0:
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}.", depth - 1))
        return out
    key = prefix.rstrip(".") or "value"
    if isinstance(d, (dict, list)):
        text = json.dumps(d, sort_keys=True)
    else:
        text = str(d)
    out[key] = text if len(text) <= 300 else text[:297] + "..."
    return out


def load_provenance(path) -> dict | None:
    if not path:
        return None
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise UserError(
            f"provenance {path}: not valid JSON ({exc.msg}, line {exc.lineno})"
        ) from None


def report_date(started: list[str]) -> str:
    """The date the report states, taken from its inputs so that the same inputs give
    the same bytes: SOURCE_DATE_EPOCH (the reproducible-builds convention) where set,
    else the start of the latest run; never the clock."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch.isdigit():
        when = _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc)
        return when.strftime("%Y-%m-%d %H:%M UTC") + " (SOURCE_DATE_EPOCH)"
    if started:
        return f"{max(started)} (start of the latest run)"
    return "no run records"


def compress_hosts(hosts: list[str], limit: int = 24) -> str:
    hosts = sorted(set(hosts))
    if len(hosts) <= limit:
        return ", ".join(hosts)
    return ", ".join(hosts[:limit]) + f", ... ({len(hosts)} hosts)"


def config_match(runs: pd.DataFrame | None) -> tuple[int, int, list[str]] | None:
    """(runs whose record's config hash is that of their slice of this config, runs
    checked, the run ids of the others), from runs.csv's config_hash_match; None when
    nothing was checked (no config at aggregation)."""
    if runs is None or runs.empty or "config_hash_match" not in runs:
        return None
    col = runs["config_hash_match"].map(
        lambda v: None if pd.isna(v) else str(v).strip().lower() in ("true", "1")
    )
    checked = col.notna()
    if not checked.any():
        return None
    bad = sorted(runs.loc[checked & (col == False), "run_id"].astype(str))  # noqa: E712
    return int(checked.sum()) - len(bad), int(checked.sum()), bad


def collect(
    *, config_file, cfg: dict | None, runs: pd.DataFrame | None, provenance: dict | None
) -> dict:
    """Everything the provenance section shows."""
    files = [config_file] if isinstance(config_file, (str, Path)) else list(config_file or [])
    # Snakemake lists a config file given both as `configfile:` and `--configfile` twice
    files = list(dict.fromkeys(str(f) for f in files))
    hosts, devices, cpus, commits, started = [], [], [], [], []
    if runs is not None and not runs.empty:
        for h in runs["hosts"].dropna():
            hosts.extend(str(h).split(","))
        for d in runs["devices"].dropna():
            devices.extend(str(d).split(";"))
        cpus = sorted(set(runs["cpu_model"].dropna().astype(str)))
        commits = sorted(set(runs["git_commit"].dropna().astype(str)))
        started = sorted(runs["started_utc"].dropna().astype(str))
    hardware = []
    if cfg is not None:
        for name, p in cfg["scaling"]["partitions"].items():
            gpus = (
                f"{p['gpus_per_node']} x {p.get('gpu_model') or 'GPU'}"
                if is_gpu_partition(p)
                else "no GPU"
            )
            if is_gpu_partition(p) and p.get("emulated_gpus", False):
                # scaling.partitions.<name>.emulated_gpus: a test cluster's; trained on CPUs
                gpus += " (emulated GPUs (CPU))"
            mem_gb = p["mem_mb_per_node"] // 1000
            hardware.append(f"{name}: {gpus}, {p['cores_per_node']} cores, {mem_gb} GB per node")
    return {
        "report_date": report_date(started),
        # a rebuild from an archive (hvdscale rebuild) states the study's commit
        "git_commit": os.environ.get("HVDSCALE_REPORT_COMMIT") or git_commit(),
        "config_file": " + ".join(map(str, files)) if files else "-",
        "config_file_sha256": "; ".join(
            f"{Path(f).name}: {file_sha256(f) or 'not found'}" for f in files
        )
        or None,
        "config_hash": config_hash(cfg) if cfg is not None else None,
        "run_git_commits": commits,
        "run_config_match": config_match(runs),
        "workflow_env": workflow_versions(),
        "train_env": train_versions(runs),
        "provenance_json": flatten(provenance) if provenance else {},
        "hosts": compress_hosts(hosts) if hosts else "-",
        "n_hosts": len(set(hosts)),
        "devices": ", ".join(sorted(set(devices))) or "-",
        "cpu_models": ", ".join(cpus) or "-",
        "hardware": hardware,
        "runs_started": f"{started[0]} to {started[-1]}" if started else "-",
    }
