"""Compare two studies (before/after a change): ``hvdscale compare A B --out DIR``.

A and B are results directories (with scaling/runs.csv and config/full.json) or
archives written by ``hvdscale export``. Writes DIR/comparison.csv and a short
DIR/comparison.pdf:

- per configuration (partition, backend, batch per worker, LR rule, workers) measured
  in both: epoch time, throughput, time to target and efficiency of A and of B
  (medians over completed repeats) with 95 % bootstrap intervals where both have 3 or
  more repeats (efficiency resamples the 1-worker baseline too), the relative change
  B/A - 1, and a flag: ``differs`` when the two intervals do not overlap, ``overlap``
  when they do, ``no interval`` when one is missing;
- what differs in provenance: git commits, config hashes, package versions of the
  train env (run records) and, for archives, of the workflow env, hardware (CPU model,
  devices, hosts; system.json of an archive).

Example
  hvdscale compare results-before/ results/study.tar.gz --out comparison
"""

from __future__ import annotations

from hvdscale.matrix.runid import CONFIG_KEYS
from hvdscale.study.compare import compare, format_value


def add_arguments(p):
    p.add_argument("study_a", help="results directory or archive (A, e.g. before)")
    p.add_argument("study_b", help="results directory or archive (B, e.g. after)")
    p.add_argument("--out", default="comparison", help="output directory (default: %(default)s)")


def run(args) -> int:
    table = compare(args.study_a, args.study_b, args.out)
    diff = table[table["flag"] == "differs"]
    print(
        f"compare: {table[CONFIG_KEYS].drop_duplicates().shape[0]} configurations in both, "
        f"{len(diff)} metric(s) differ (intervals do not overlap); wrote {args.out}/"
        "comparison.csv, provenance.csv, comparison.pdf"
    )
    for r in diff.itertuples():
        print(
            f"  {r.partition} {r.backend} b{r.batch_per_worker} {r.lr_rule} w{r.workers} "
            f"{r.metric}: {format_value(r.a, r.metric)} -> {format_value(r.b, r.metric)}"
        )
    return 0
