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
                  issue 19); a column of every table (after partition; epochs.csv: after
                  run_id) and a group key, so every baseline is of the same framework
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

from __future__ import annotations

import sys
from pathlib import Path

from hvdscale.analysis.aggregate import aggregate
from hvdscale.analysis.columns import (
    STATUSES,
)
from hvdscale.analysis.headline import headline
from hvdscale.analysis.tables import (
    default_epochs_path,
    write_csv,
)
from hvdscale.analysis.tuning import select_tuned
from hvdscale.config.load import load_config
from hvdscale.errors import UserError


def add_arguments(p):
    p.add_argument(
        "--runs-dir",
        default="results/runs",
        help="directory of run directories (default: %(default)s)",
    )
    p.add_argument(
        "--config",
        help="validated config JSON (results/config/full.json); without it status.csv "
        "lists only the runs found",
    )
    p.add_argument("--out-runs", default="results/scaling/runs.csv", help="(default: %(default)s)")
    p.add_argument(
        "--out-summary", default="results/scaling/summary.csv", help="(default: %(default)s)"
    )
    p.add_argument(
        "--out-status", default="results/scaling/status.csv", help="(default: %(default)s)"
    )
    p.add_argument("--out-epochs", help="per-epoch table (default: epochs.csv next to --out-runs)")
    p.add_argument(
        "--out-headline",
        help="headline.csv: time-to-target speedup split into its two factors "
        "(analysis/headline.py); not written without it",
    )
    p.add_argument(
        "--out-tuned",
        help="tuned.csv: the selected tuning candidates with their re-runs' figures "
        "(analysis/tuning.py); not written without it",
    )
    p.add_argument("--quiet", action="store_true", help="no summary line on stdout")


def run(args) -> int:
    cfg = load_config(args.config) if args.config else None
    runs_dir = Path(args.runs_dir)
    if not runs_dir.is_dir() and runs_dir.exists():
        raise UserError(f"--runs-dir {runs_dir}: not a directory")

    def warn(msg):
        print(f"hvdscale aggregate: warning: {msg}", file=sys.stderr)

    agg = aggregate(runs_dir, cfg, warn=warn)
    write_csv(agg.runs, args.out_runs)
    write_csv(agg.summary, args.out_summary)
    write_csv(agg.status, args.out_status)
    write_csv(agg.epochs, args.out_epochs or default_epochs_path(args.out_runs))
    tuned = select_tuned(agg.runs, agg.status)
    if args.out_tuned:
        write_csv(tuned, args.out_tuned)
    if args.out_headline:
        write_csv(headline(agg.runs, tuned, agg.epochs), args.out_headline)
    if not args.quiet:
        counts = agg.status["status"].value_counts()
        parts = ", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES)
        print(
            f"aggregate: {len(agg.status)} runs ({parts}); {len(agg.summary)} configurations; "
            f"wrote {args.out_runs}, {args.out_summary}, {args.out_status}"
        )
    return 0
