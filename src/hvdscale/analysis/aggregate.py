"""Aggregate run records (results/runs/*/metrics.json) into the scaling tables.

The command line, with what it reads and writes in full, is ``hvdscale aggregate``
(hvdscale.commands.aggregate).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from hvdscale.analysis.columns import (
    EPOCH_COLUMNS,
    RUNS_COLUMNS,
)
from hvdscale.analysis.records import (
    RecordValidator,
    read_run_dir,
    record_row,
    status_frame,
    validate_runs,
)
from hvdscale.analysis.schemas import SUMMARY_SCHEMA
from hvdscale.analysis.summary import summarise
from hvdscale.config.load import config_hash, validate_config
from hvdscale.errors import ConfigError
from hvdscale.matrix.runid import run_kind
from hvdscale.matrix.runtable import find_run, run_config, run_table


@dataclass
class Aggregation:
    runs: pd.DataFrame
    summary: pd.DataFrame
    status: pd.DataFrame
    epochs: pd.DataFrame
    problems: list[str] = field(default_factory=list)  # 'path: field ...' lines


def _run_dirs(runs_dir: Path) -> list[Path]:
    """Run directories holding a metrics.json or a failure.json (others count as missing,
    e.g. one with only a checkpoint)."""
    if not runs_dir.is_dir():
        return []
    return [
        d
        for d in sorted(runs_dir.iterdir())
        if d.is_dir()
        and not d.name.startswith(".")
        and ((d / "metrics.json").exists() or (d / "failure.json").exists())
    ]


def aggregate(runs_dir: str | Path, cfg: dict | None = None, warn=None) -> Aggregation:
    """Read, validate and aggregate every run under ``runs_dir`` (the tables:
    hvdscale aggregate --help)."""
    warn = warn or (lambda msg: None)
    table = {r.run_id: r for r in run_table(cfg)} if cfg is not None else None
    slice_hash = SliceHash(cfg, table) if cfg is not None else None
    validator = RecordValidator()
    problems: list[str] = []

    def problem(path, msg):
        problems.append(f"{path}: {msg}")
        warn(f"{path}: {msg}")

    status: dict[str, dict] = {}
    rows, epoch_rows = [], []
    for d in _run_dirs(Path(runs_dir)):
        st, rec, err = read_run_dir(d, validator)
        # a re-run of a selected tuning candidate is not in the table (issue 16)
        st["in_config"] = table is None or d.name in table or _is_rerun(cfg, d.name, table)
        if err is not None:
            problem(st["path"], err)
        if rec is not None and st["in_config"]:
            row, eps = record_row(rec, st["path"])
            if slice_hash is not None:
                row["config_hash_match"] = row["config_hash"] == slice_hash(d.name)
            rows.append(row)
            epoch_rows.extend(eps)
        if not st["in_config"]:
            warn(
                f"{d}: run {d.name!r} is not in the config's run table; "
                "listed in status.csv, not aggregated"
            )
        status[d.name] = st

    runs, bad = validate_runs(pd.DataFrame(rows, columns=RUNS_COLUMNS))
    for rid, msg in bad.items():
        status[rid].update(status="malformed", detail=msg)
        problem(status[rid]["path"], msg)
    epochs = pd.DataFrame(epoch_rows, columns=EPOCH_COLUMNS)
    epochs = epochs[~epochs["run_id"].isin(list(bad))].reset_index(drop=True)
    status_df = status_frame(status, table)
    runs = runs.sort_values(
        [
            "partition",
            "framework",
            "backend",
            "batch_per_worker",
            "lr_rule",
            "candidate",
            "workers",
            "repeat",
        ],
        kind="stable",
    ).reset_index(drop=True)
    summary = summarise(runs, status_df)
    if not summary.empty:
        SUMMARY_SCHEMA.validate(summary)
    return Aggregation(runs, summary, status_df, epochs, problems)


class SliceHash:
    """The config hash a run of ``cfg`` records: that of its validated slice of the
    config (runtable.run_config, the snapshot hvdscale train reads), so a run record
    whose hash differs was trained under another config. Runs that share a slice (the
    repeats of a configuration) share the validation."""

    def __init__(self, cfg: dict, table: dict):
        self.cfg, self.table, self._by_slice = cfg, table, {}

    def __call__(self, run_id: str) -> str | None:
        try:
            sub = run_config(self.cfg, run_id, self.table)
        except ConfigError:
            return None
        key = json.dumps(sub, sort_keys=True)
        if key not in self._by_slice:
            self._by_slice[key] = config_hash(validate_config(sub))
        return self._by_slice[key]


def _is_rerun(cfg: dict, run_id: str, table: dict) -> bool:
    """Whether ``run_id`` is a re-run (kind rerun) of a tuning candidate of the config."""
    if run_kind(run_id) != "rerun":
        return False
    try:
        return find_run(cfg, run_id, table).kind == "rerun"
    except ConfigError:
        return False
