"""Aggregate run records (results/runs/*/metrics.json) into the scaling tables.

The command line, with what it reads and writes in full, is ``hvdscale aggregate``
(``add_arguments``/``run`` at the end of this module).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from hvdscale.analysis.columns import (
    EPOCH_COLUMNS,
    METRIC_EPOCH_COLUMNS,
    METRIC_RUN_COLUMNS,
    RUNS_COLUMNS,
    STATUSES,
    with_optional,
)
from hvdscale.analysis.headline import headline
from hvdscale.analysis.records import (
    RecordValidator,
    read_run_dir,
    record_row,
    status_frame,
    validate_runs,
)
from hvdscale.analysis.schemas import SUMMARY_SCHEMA
from hvdscale.analysis.summary import summarise
from hvdscale.analysis.tables import (
    default_epochs_path,
    read_runs,
    read_status,
    write_csv,
)
from hvdscale.analysis.tuning import select_tuned, selection
from hvdscale.cliargs import SHARED, add_options, defaulted
from hvdscale.config.load import config_hash, load_config, run_config_hash, validate_config
from hvdscale.errors import ConfigError, UserError
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
                row["config_hash_match"] = slice_hash.matches(d.name, row["config_hash"], d)
            rows.append(row)
            epoch_rows.extend(eps)
        if not st["in_config"]:
            warn(
                f"{d}: run {d.name!r} is not in the config's run table; "
                "listed in status.csv, not aggregated"
            )
        status[d.name] = st

    run_cols = with_optional(RUNS_COLUMNS, METRIC_RUN_COLUMNS, rows)
    runs, bad = validate_runs(pd.DataFrame(rows, columns=run_cols))
    for rid, msg in bad.items():
        status[rid].update(status="malformed", detail=msg)
        problem(status[rid]["path"], msg)
    epoch_cols = with_optional(EPOCH_COLUMNS, METRIC_EPOCH_COLUMNS, epoch_rows)
    epochs = pd.DataFrame(epoch_rows, columns=epoch_cols)
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
    """The config hash a run of ``cfg`` records: that of its validated slice of the config
    (runtable.run_config, the snapshot hvdscale train reads) with results_dir at its
    default (config.load.run_config_hash), so a run record whose hash differs was trained
    under another config, wherever the study's files live now. Runs that share a slice
    (the repeats of a configuration) share the validation."""

    def __init__(self, cfg: dict, table: dict):
        self.cfg, self.table, self._by_slice = cfg, table, {}

    def _validated(self, run_id: str) -> dict | None:
        try:
            sub = run_config(self.cfg, run_id, self.table)
        except ConfigError:
            return None
        key = json.dumps(sub, sort_keys=True)
        if key not in self._by_slice:
            self._by_slice[key] = validate_config(sub)
        return self._by_slice[key]

    def __call__(self, run_id: str) -> str | None:
        sub = self._validated(run_id)
        return None if sub is None else run_config_hash(sub)

    def matches(self, run_id: str, recorded, run_dir: Path | None = None) -> bool:
        """Whether ``recorded`` is the run's hash; also the hash runs recorded while
        results_dir was part of it: with the results_dir the run's config.json was written
        for (in ``run_dir``), or this config's."""
        sub = self._validated(run_id)
        if sub is None or not isinstance(recorded, str):
            return False
        if recorded == run_config_hash(sub):
            return True
        dirs = {self.cfg["results_dir"], _written_results_dir(run_dir)} - {None}
        return any(recorded == config_hash({**sub, "results_dir": d}) for d in dirs)


def _written_results_dir(run_dir: Path | None) -> str | None:
    """results_dir of the run's config.json (rule write_run_config), None if unreadable."""
    try:
        value = json.loads((run_dir / "config.json").read_text()).get("results_dir")
    except (TypeError, OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _is_rerun(cfg: dict, run_id: str, table: dict) -> bool:
    """Whether ``run_id`` is a re-run (kind rerun) of a tuning candidate of the config."""
    if run_kind(run_id) != "rerun":
        return False
    try:
        return find_run(cfg, run_id, table).kind == "rerun"
    except ConfigError:
        return False


# -------------------------------------------------- the command: hvdscale aggregate


def add_arguments(p):
    add_options(
        p,
        (
            "--runs-dir",
            {
                "default": "results/runs",
                "help": "directory of run directories (default: %(default)s)",
            },
        ),
        (
            "--config",
            "validated config JSON (results/config/full.json); without it status.csv "
            "lists only the runs found",
        ),
        ("--out-runs", SHARED["--runs"]),
        ("--out-summary", SHARED["--summary"]),
        ("--out-status", SHARED["--status"]),
        ("--out-epochs", "per-epoch table (default: epochs.csv next to --out-runs)"),
        (
            "--out-headline",
            "headline.csv: time-to-target speedup split into its two factors "
            "(analysis/headline.py); not written without it",
        ),
        (
            "--out-tuned",
            "tuned.csv: the selected tuning candidates with their re-runs' figures "
            "(analysis/tuning.py); not written without it",
        ),
        ("--quiet", "no summary line on stdout"),
    )


def run(args) -> int:
    """Aggregate run records (results/runs/*/metrics.json) into the scaling tables.

    Every metrics.json is validated against workflow/schemas/run.schema.json, then the
    derived rows of all records are checked at once with a pandera schema. A malformed
    record is reported by path and field (a warning on stderr and a row in status.csv)
    and the other records still aggregate; partial results are normal.

    Outputs
      runs.csv     one row per valid run record of the config's run table
      summary.csv  one row per configuration (partition, framework, backend,
                   batch_per_worker, lr_rule, workers): medians and min/max over repeats,
                   speedup and efficiency against the 1-worker run of the same group (the
                   same framework too: never Horovod against DDP), speedup per GPU
      status.csv   every run of the config's run table (plus any other run directory):
                   completed, nan_loss, failed, missing, malformed or mislabelled
      epochs.csv   one row per epoch of every run in runs.csv (loss curves)
      headline.csv (--out-headline) the time-to-target speedup of every multi-worker
                   configuration, untuned and tuned, split into epoch-time speedup x
                   epochs-to-target ratio, with the noise scale (analysis/headline.py)

    Definitions
      framework       the record's config.framework (horovod-tf where absent: records before
                      the framework axis); a column of every table (after partition;
                      epochs.csv: after run_id) and a group key, so every baseline is of the
                      same framework
      sync columns    runs.csv sync_allreduce_s, sync_comm_hook_s, sync_exposed_s,
                      sync_no_comm_step_s: the record's timing.sync (per-step seconds; NaN
                      where not measured); report/frameworks_section.py says which is which
      epoch time      median wall time of the non-warm-up epochs of a run (rank 0)
      throughput      median samples/s (all ranks) of the non-warm-up epochs
      phase shares    sum of each phase (data, compute, sync, update) over the non-warm-up
                      epochs divided by the sum of all four: shares of the training-step
                      time, adding up to 1 (as the run record's own summary); other_share is
                      the part of the epoch wall time outside the four phases (test
                      evaluation, launch overhead)
      time to target  from each record's target block (hvdscale/target.py): training
                      wall time (warm-up and validation included, start-up excluded) at the
                      end of the first epoch whose validation loss is at or below the
                      study-wide target fixed before training (results/scaling/target.json);
                      a censored run (budget reached first) counts as +inf, a median exists
                      while fewer than half the repeats are censored, and n_reached_target /
                      n_ttt_total go with every median; a run that meets the target in its
                      first (warm-up) epoch is flagged target_in_warmup, and its configuration
                      target_too_loose (no TTT speedup)
      mislabelled     a record whose label_proof.ok is false: status mislabelled in
                      status.csv and runs.csv with the proof's reasons, excluded from every
                      statistic
      S(n) = T(1)/T(n) with T the median over completed repeats; E(n) = S(n)/n;
      95 % bootstrap intervals resampling both sides' repeats (analysis/stats.py);
      speedup per GPU = slope of an ordinary least-squares line through (n, S(n)) of a
      group (n = 1 included). A group without a completed 1-worker run keeps its rows,
      with has_baseline false and NaN speedups.

    Example
      hvdscale aggregate --runs-dir results/runs --config results/config/full.json \
      --out-runs results/scaling/runs.csv --out-summary results/scaling/summary.csv \
      --out-status results/scaling/status.csv
    """
    cfg = load_config(args.config) if args.config else None
    runs_dir = Path(args.runs_dir)
    if not runs_dir.is_dir() and runs_dir.exists():
        raise UserError(f"--runs-dir {runs_dir}: not a directory")

    def warn(msg):
        print(f"hvdscale aggregate: warning: {msg}", file=sys.stderr)

    agg = aggregate(runs_dir, cfg, warn=warn)
    write_tables(agg, args)
    if not args.quiet:
        counts = agg.status["status"].value_counts()
        parts = ", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES)
        print(
            f"aggregate: {len(agg.status)} runs ({parts}); {len(agg.summary)} configurations; "
            f"wrote {args.out_runs}, {args.out_summary}, {args.out_status}"
        )
    return 0


def write_tables(agg: Aggregation, args) -> None:
    """runs.csv, summary.csv, status.csv, epochs.csv and, where asked, tuned.csv and
    headline.csv of hvdscale aggregate."""
    write_csv(agg.runs, args.out_runs)
    write_csv(agg.summary, args.out_summary)
    write_csv(agg.status, args.out_status)
    write_csv(agg.epochs, args.out_epochs or default_epochs_path(args.out_runs))
    tuned = select_tuned(agg.runs, agg.status)
    if args.out_tuned:
        write_csv(tuned, args.out_tuned)
    if args.out_headline:
        write_csv(headline(agg.runs, tuned, agg.epochs), args.out_headline)


# -------------------------------------------------- the command: hvdscale select-tuned


def add_select_tuned_arguments(p):
    add_options(
        p,
        "--runs",
        (
            "--runs-dir",
            "aggregate the run records here instead of reading --runs/--status (checkpoint "
            "select_tuned: the re-runs it requests cannot wait for runs.csv); needs --config",
        ),
        ("--config", "with --runs-dir: the validated config (full.json)"),
        ("--target", "the study's target.json (rule calibrate_target)"),
        (
            "--status",
            {
                "help": "status.csv (lists missing and failed candidates; default: next to --runs)",
            },
        ),
        ("--out", defaulted("results/scaling/selection.csv")),
    )


def run_select_tuned(args) -> int:
    """The learning-rate re-tuning sweep (scaling.tune): selection on validation, re-runs.

    Every candidate (LR rule x LR multiplier x warm-up epochs) of a tuning group (partition,
    backend, per-worker batch, workers) is its own run (run_id component
    ``_m{mult}_wu{warmup}``), trained to the study-wide target validation loss or its budget
    (the record's target block: hvdscale/target.py).

    Selection (checkpoint select_tuned -> results/scaling/selection.csv), from the candidate
    runs only (kind ''): per tuning group the candidate with the smallest validation time to
    target (censored repeats +inf; median over its repeats: analysis/stats.censored_median);
    ties, and candidates without a median, by their median best validation loss. The test
    loss chooses nothing. A group none of whose candidates reached the target is still
    listed (status none_reached), one whose candidates all failed or are missing too
    (all_failed); none is dropped.

    The winner of each group is re-run with fresh seeds (run ids ``..._rerun_r{k}``, kind
    ``rerun``): the tuned columns (times, losses, n_repeats, reached/total) and the tuned
    speedup come ONLY from those re-runs, never from the selection runs (winner's curse).
    This command writes the selection (selection.csv, no re-run figures); the tuned table
    with the re-runs' figures (tuned.csv) is written by ``hvdscale aggregate --out-tuned``. The
    tuned time-to-target speedup of a group is TTT(re-runs of the selected 1-worker
    candidate) / TTT(re-runs of the selected candidate), with a 95 % bootstrap interval
    (analysis/stats.py; re-runs of the same index share seeds: paired) from 3 re-runs on.
    ``selection_*`` columns keep what the selection runs showed, for transparency only.

    Example
      hvdscale select-tuned --runs-dir results/runs --config results/config/full.json \
      --out results/scaling/selection.csv
    """
    from pathlib import Path

    if args.runs_dir:
        if not args.config:
            raise UserError("select-tuned: --runs-dir needs --config")
        agg = aggregate(Path(args.runs_dir), load_config(args.config))
        runs, status = agg.runs, agg.status
    else:
        runs = read_runs(args.runs)
        status_path = Path(args.status) if args.status else Path(args.runs).with_name("status.csv")
        status = read_status(status_path) if status_path.exists() else None
    chosen = selection(runs, status)
    write_csv(chosen, args.out)
    counts = chosen["status"].value_counts() if not chosen.empty else {}
    parts = ", ".join(f"{counts.get(k, 0)} {k}" for k in ("selected", "none_reached", "all_failed"))
    print(f"select-tuned: {len(chosen)} tuning groups ({parts})")
    return 0
