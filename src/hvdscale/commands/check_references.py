"""Reference values with tolerances: measured value (95 % bootstrap interval where
every group has 3 or more completed repeats), reference, verdict.

The references come from the config (key ``references``; the defaults are the reference
study's figures). Quantities and what counts as better:

  speedup_per_gpu      per partition, the preferred group (analysis.view.preferred_group)
                       slope of S(n) over n                                 higher is better
  sync_share           median over multi-worker configurations of the
                       gradient-synchronisation share of the step time     lower is better
  data_share           the same for data loading, over all configurations  lower is better
  batch_epoch_speedup  epoch time at batch_from / at batch_to               higher is better

Verdict: the band is reference +- tolerance. With an interval (analysis/stats.CI_METHOD),
the verdict is better or worse only when the whole interval lies outside the band (the
deviation is not noise), within only when it lies inside, and inconclusive when it
straddles an edge of the band; without one, the measured value decides. not measured:
nothing to compare.

Outputs results/scaling/references.csv. ``--strict`` exits 1 when a verdict is worse
(after writing the table); ``--check CSV`` only checks an existing table: rule
enforce_references does that when the config key strict is true, so the table and the
report are kept and the workflow still fails.

Example
  hvdscale check-references --config results/config/full.json \
      --runs results/scaling/runs.csv --summary results/scaling/summary.csv \
      --out results/scaling/references.csv [--strict]
"""

from __future__ import annotations

import sys
from pathlib import Path

from hvdscale.analysis.references import (
    check_references,
    format_table,
    read_references,
    worse,
    write_references,
)
from hvdscale.analysis.tables import read_runs, read_summary
from hvdscale.config.load import load_config


def add_arguments(p):
    p.add_argument("--config", help="the validated config JSON (results/config/full.json)")
    p.add_argument("--runs", default="results/scaling/runs.csv", help="(default: %(default)s)")
    p.add_argument(
        "--summary", default="results/scaling/summary.csv", help="(default: %(default)s)"
    )
    p.add_argument("--out", default="results/scaling/references.csv", help="(default: %(default)s)")
    p.add_argument(
        "--strict", action="store_true", help="exit 1 when a value is worse than its reference"
    )
    p.add_argument(
        "--check",
        metavar="CSV",
        help="only check an existing references.csv (exit 1 on a 'worse' verdict)",
    )
    p.add_argument("--ok", help="with --check: write this marker file when nothing is worse")


def run(args) -> int:
    if args.check:
        df = read_references(args.check)
        if df is None:
            raise FileNotFoundError(args.check)
        bad = worse(df)
        if len(bad):
            print(
                f"check-references: {len(bad)} value(s) worse than the reference beyond the "
                f"tolerance (strict):\n{format_table(bad)}",
                file=sys.stderr,
            )
            return 1
        if args.ok:
            Path(args.ok).write_text("no value worse than its reference\n")
        print(f"check-references: {len(df)} reference(s), none worse")
        return 0
    if not args.config:
        raise SystemExit("hvdscale check-references: --config (or --check) is required")
    cfg = load_config(args.config)
    runs = read_runs(args.runs) if Path(args.runs).exists() else None
    summary = read_summary(args.summary) if Path(args.summary).exists() else None
    df = check_references(cfg["references"], summary, runs)
    write_references(df, args.out)
    print(f"check-references: wrote {args.out}\n{format_table(df)}")
    # the config key strict is the workflow's (rule enforce_references, after the table
    # is kept); by hand, --strict
    if args.strict and len(worse(df)):
        print("check-references: worse than the reference beyond the tolerance", file=sys.stderr)
        return 1
    return 0
