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

from __future__ import annotations

from hvdscale.analysis.aggregate import aggregate
from hvdscale.analysis.tables import read_runs, read_status, write_csv
from hvdscale.analysis.tuning import selection
from hvdscale.config.load import load_config
from hvdscale.errors import UserError


def add_arguments(p):
    p.add_argument("--runs", default="results/scaling/runs.csv", help="(default: %(default)s)")
    p.add_argument(
        "--runs-dir",
        help="aggregate the run records here instead of reading --runs/--status (checkpoint "
        "select_tuned: the re-runs it requests cannot wait for runs.csv); needs --config",
    )
    p.add_argument("--config", help="with --runs-dir: the validated config (full.json)")
    p.add_argument("--target", help="the study's target.json (rule calibrate_target)")
    p.add_argument(
        "--status",
        help="status.csv (lists missing and failed candidates; default: next to --runs)",
    )
    p.add_argument("--out", default="results/scaling/selection.csv", help="(default: %(default)s)")


def run(args) -> int:
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
